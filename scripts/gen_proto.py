#!/usr/bin/env python3
"""Generate the Python gRPC code for proto/ into specwire/v1/ (the only way it is made).

    python scripts/gen_proto.py          # regenerate
    python scripts/gen_proto.py --check  # exit 1 if the checked-in code is stale

The proto path mirrors the Python package (proto/specwire/v1/draft.proto ->
specwire.v1.draft_pb2), so the generated modules import each other by their
full package names.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
PROTOS = sorted(p.relative_to(PROTO_ROOT) for p in PROTO_ROOT.rglob("*.proto"))
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out: Path) -> None:
    """Run protoc for every proto file, writing Python modules under ``out``."""
    for proto in PROTOS:
        (out / proto.parent).mkdir(parents=True, exist_ok=True)
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(PROTO_ROOT / proto),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")


def generated_files(base: Path) -> list[Path]:
    """Paths (relative to ``base``) of the modules generated for every proto file."""
    return [proto.with_suffix("").parent / (proto.stem + s) for proto in PROTOS for s in SUFFIXES]


def stale_files() -> list[str]:
    """Generated files that differ from a fresh generation (or are missing)."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [
            str(rel)
            for rel in generated_files(ROOT)
            if not (ROOT / rel).exists() or not filecmp.cmp(Path(tmp) / rel, ROOT / rel, shallow=False)
        ]


def main() -> int:
    """Regenerate, or with --check report stale files."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only check that the generated code is fresh")
    args = parser.parse_args()
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: {name} (run scripts/gen_proto.py)", file=sys.stderr)
        return 1 if stale else 0
    generate(ROOT)
    for proto in PROTOS:
        init = ROOT / proto.parent / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated gRPC code for the specwire protocol (see proto/)."""\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
