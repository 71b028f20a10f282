#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu/check.sh --install-only: run the test suite as four groups in
# parallel, each in its own network namespace (Linux, root), so that one group's workers and Bonjour
# announcements never meet another's. Logs and JUnit reports go to $GPU_OUT (or $OUT).
#
#   scripts/gpu/suite.sh                  # all four groups
#   scripts/gpu/suite.sh worker rest      # only these groups
#   scripts/gpu/suite.sh --resume         # in a later call on the same machine: what the last left undone
#
# Each group is cut off after $GPU_GROUP_TIMEOUT seconds (default 540), so that a call of a
# time-limited runner still brings its logs back. Each test's outcome is kept as it ends
# (scripts/gpu/gpu_progress.py, in $GPU_STATE); --resume runs each group that was cut off again
# without the tests it finished, and skips those that ran to the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
LOG_DIR=${GPU_OUT:-${OUT:-/tmp/specwire-gpu-check}}
LIMIT=${GPU_GROUP_TIMEOUT:-540}
STATE=${GPU_STATE:-/tmp/specwire-gpu-state}
resume=0
if [ "${1:-}" = "--resume" ]; then resume=1; shift; fi
[ $resume -eq 1 ] || rm -rf "$STATE"
mkdir -p "$LOG_DIR" "$STATE"
export PYTHONPATH="${GPU_SITE:-/tmp/specwire-site}:$PWD:$PWD/scripts/gpu" PYTHONUNBUFFERED=1

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
# $GPU_COMMIT names the commit where the tree has no .git (an export of it)
echo "${GPU_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}" > "$LOG_DIR/commit.txt"
pids=()
ran=()
status=0
for g in "${groups[@]}"; do
  paths=$(group_paths "$g") || exit 2
  if [ -f "$STATE/$g.complete" ]; then
    echo "$g: ran to the end in an earlier call"
    continue
  fi
  SPECWIRE_GPU_DONE="$STATE/$g.done" timeout "$LIMIT" unshare -n sh -c "python3 -m tests.support.processes.isolation \
    && exec python3 -m pytest -p no:cacheprovider -p gpu_progress -rfEs --tb=short -q --durations=10 \
    --junitxml='$LOG_DIR/gpu-$g.xml' $paths" > "$LOG_DIR/gpu-$g.log" 2>&1 &
  pids+=($!)
  ran+=("$g")
done
for i in "${!pids[@]}"; do
  g=${ran[$i]}
  wait "${pids[$i]}"; rc=$?
  # 124: cut off by the time limit (--resume goes on); 5: nothing left to run
  [ $rc -eq 124 ] || touch "$STATE/$g.complete"
  [ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1
  echo "$g: exit $rc; $(tail -n 1 "$LOG_DIR/gpu-$g.log")"
done
for g in "${groups[@]}"; do
  [ -f "$STATE/$g.done" ] || continue
  cp "$STATE/$g.done" "$LOG_DIR/gpu-$g.done"
  echo "$g, every call so far: $(python3 scripts/gpu/gpu_progress.py "$STATE/$g.done")"
  if grep -v '^passed \|^skipped ' "$STATE/$g.done" | sed "s/^/  $g: /" | grep .; then status=1; fi
done
exit $status
