#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu/check.sh --install-only: run the test suite as four groups in
# parallel, each in its own network namespace (Linux, root), so that one group's workers and Bonjour
# announcements never meet another's. Logs and JUnit reports go to $GPU_OUT (or $OUT).
#
#   scripts/gpu/suite.sh                  # all four groups
#   scripts/gpu/suite.sh worker rest      # only these groups
#
# Each group is cut off after $GPU_GROUP_TIMEOUT seconds (default 540), so that a call of a
# time-limited runner still brings its logs back.
set -uo pipefail
cd "$(dirname "$0")/../.."
LOG_DIR=${GPU_OUT:-${OUT:-/tmp/specwire-gpu-check}}
LIMIT=${GPU_GROUP_TIMEOUT:-540}
mkdir -p "$LOG_DIR"
export PYTHONPATH="${GPU_SITE:-/tmp/specwire-site}:$PWD" PYTHONUNBUFFERED=1

group_paths() {
  case "$1" in
    worker) echo tests/worker ;;
    drafting) echo tests/coordinator/decoding tests/coordinator/drafting ;;
    commands) echo tests/coordinator/commands tests/coordinator/serving tests/coordinator/bench ;;
    rest) echo tests/specwire tests/scripts tests/coordinator/planning tests/coordinator/workers \
      tests/coordinator/test_*.py ;;
    *) echo "unknown group: $1 (worker, drafting, commands, rest)" >&2; return 1 ;;
  esac
}

groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(worker drafting commands rest)
git rev-parse HEAD > "$LOG_DIR/commit.txt" 2>/dev/null || true
pids=()
for g in "${groups[@]}"; do
  paths=$(group_paths "$g") || exit 2
  timeout "$LIMIT" unshare -n sh -c "python3 -m tests.support.isolation && exec python3 -m pytest \
    -p no:cacheprovider -rfEs --tb=short -q --durations=10 --junitxml='$LOG_DIR/gpu-$g.xml' $paths" \
    > "$LOG_DIR/gpu-$g.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; rc=$?
  echo "${groups[$i]}: exit $rc; $(tail -n 1 "$LOG_DIR/gpu-${groups[$i]}.log")"
  [ $rc -eq 0 ] || status=1
done
exit $status
