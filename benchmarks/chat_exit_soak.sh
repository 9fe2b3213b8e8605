#!/usr/bin/env bash
# Soak test for the quickstart's last step: runs the piped chat turn N times beside a CPU load and
# counts the exit codes. Every run must exit 0; a 134 is the `terminate called without an active
# exception` abort at interpreter shutdown (cause and fix: llamafactory_zebra/integration/chat_exit.py;
# results: docs/benchmarks.md).
#
# Usage (from the repository root, after `bash scripts/quickstart.sh` or its train step):
#   bash benchmarks/chat_exit_soak.sh [RUNS] [CHAT_YAML]        # defaults: 20 examples/quickstart_chat.yaml
# Environment: LOAD_PROCS (busy-loop processes started beside the runs; default: the number of cores),
#   CLI (default: llamafactory-cli on PATH), LOG_DIR (each run's output; default: a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-20}
CHAT_YAML=${2:-examples/quickstart_chat.yaml}
LOAD_PROCS=${LOAD_PROCS:-$(getconf _NPROCESSORS_ONLN)}  # not nproc: it honours OMP_NUM_THREADS
CLI=${CLI:-llamafactory-cli}
LOG_DIR=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$LOG_DIR"

load_pids=()
stop_load() {
  for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null; done
}
trap stop_load EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$LOAD_PROCS"); do
  python3 -c 'while True: pass' &
  load_pids+=("$!")
done

declare -A codes=()
started=$(date +%s)
for run in $(seq "$RUNS"); do
  log="$LOG_DIR/run_$run.log"
  # faulthandler prints every thread's Python stack if a run aborts, so a failure explains itself.
  printf 'Write 47 in words.\nexit\n' | PYTHONFAULTHANDLER=1 "$CLI" chat "$CHAT_YAML" >"$log" 2>&1
  code=$?
  codes[$code]=$((${codes[$code]:-0} + 1))
  answer=$(grep -o 'Assistant: .*' "$log" | head -1)
  printf 'run %3d  exit %3d  %s\n' "$run" "$code" "${answer:-<no answer>}"
done
stop_load

echo
echo "chat: $CLI chat $CHAT_YAML, $RUNS runs beside $LOAD_PROCS busy-loop processes, $(($(date +%s) - started)) s"
echo "logs: $LOG_DIR"
failed=0
for code in "${!codes[@]}"; do
  printf 'exit %3d: %d runs\n' "$code" "${codes[$code]}"
  [ "$code" = 0 ] || failed=1
done
exit "$failed"
