"""``scripts/demo.py --help`` prints the demo's own help and exits, starting nothing; a bench flag that
begins like one of the demo's own (``--pace``, ``--paced``) still goes to the bench."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import demo  # noqa: E402  (scripts/ is no package)

BANNER = "=" * 100  # what the demo prints before it starts its first worker


def test_help_prints_the_demos_own_options_and_starts_nothing() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,  # the demo itself takes minutes: a run that got past --help ends here
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: demo.py")
    for flag in ("--paced", "--fast", "--family", "--machines", "--device"):
        assert flag in done.stdout
    assert "about 6 minutes" in done.stdout  # how long the demo takes
    assert "coordinator bench --help" in done.stdout  # where the other arguments go
    assert BANNER not in done.stdout and "demo: " not in done.stdout + done.stderr


def test_a_bench_flag_that_begins_like_a_demo_flag_goes_to_the_bench() -> None:
    args, rest = demo.build_parser().parse_known_args(["--pace", "paper:m1-max", "--k", "2"])
    assert not args.paced
    assert rest == ["--pace", "paper:m1-max", "--k", "2"]


def test_the_demos_own_flags_are_taken() -> None:
    args, rest = demo.build_parser().parse_known_args(["--paced", "--family", "hybrid", "--max-tokens", "9"])
    assert args.paced and args.family == "hybrid"
    assert rest == ["--max-tokens", "9"]
