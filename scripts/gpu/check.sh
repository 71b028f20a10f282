#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: install specwire with MLX's CUDA backend from the staged wheels, then run
# the test suite (or the command given after --) with MLX on the GPU.
#
#   scripts/gpu/check.sh                       # the whole suite; the log and a JUnit report go to $GPU_OUT
#   scripts/gpu/check.sh -- pytest tests/coordinator/decoding -q
#   scripts/gpu/check.sh --install-only
#
# The parts made by scripts/gpu/stage.sh arrive in .gpu/pN (one per call of a size-limited transfer);
# each is copied to $GPU_STAGE as it arrives (`scripts/gpu/check.sh --collect`), and the call that brings
# the last one installs into $GPU_SITE and runs. Nothing is installed into the machine's own Python.
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=${GPU_STAGE:-/tmp/specwire-stage}
SITE=${GPU_SITE:-/tmp/specwire-site}
LOG_DIR=${GPU_OUT:-${OUT:-/tmp/specwire-gpu-check}}
mkdir -p "$STAGE" "$LOG_DIR"

collect() {
  for d in .gpu/p[0-9]; do
    [ -d "$d" ] || continue
    cp "$d"/part* "$STAGE"/ 2>/dev/null || true
    [ -f "$d/big.sha" ] && cp "$d/big.sha" "$STAGE"/
    [ -d "$d/small" ] && mkdir -p "$STAGE/small" && cp "$d"/small/*.whl "$STAGE/small"/
  done
  true
}

install() {
  if [ ! -f "$SITE/.installed" ]; then
    (cd "$STAGE" && cat part* > big.tar && sha256sum -c big.sha && mkdir -p big && tar xf big.tar -C big)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$STAGE"/big/*.whl "$STAGE"/small/*.whl
    touch "$SITE/.installed"
  fi
  export PYTHONPATH="$SITE:$PWD"
  python3 -c "import sys, mlx.core as mx; d = mx.default_device(); print('mlx', mx.__version__, d, file=sys.stderr); \
assert d == mx.gpu, 'MLX does not run on the GPU here'"
}

case "${1:-}" in
  --collect) collect; exit 0 ;;
  --install-only) collect; install; exit 0 ;;
esac
collect
install
if [ "${1:-}" = "--" ]; then
  shift
  exec "$@"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
set -o pipefail
python3 -m pytest -p no:cacheprovider --durations=20 --junitxml="$LOG_DIR/gpu-junit.xml" "$@" 2>&1 \
  | tee "$LOG_DIR/gpu-pytest.log"
