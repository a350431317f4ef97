#!/usr/bin/env bash
# Several device scripts side by side on the one GPU, each with a wall budget of its own:
#
#   bash lab/gpu/wave.sh NAME:BUDGET_S [NAME:BUDGET_S...] [-- NAME:BUDGET_S...]...
#
# runs lab/gpu/NAME.sh $OUT/NAME with BUDGET_S set, the scripts of one phase side by side, the phases (split by
# `--`) one after the other: a script that must have the GPU to itself (runner faults: a process of its own fills
# the GPU's memory) goes in a phase of its own, or beside scripts that only compile.
#
# Meant to run under lab/gpu/background.sh (a wave outlives one call): each script writes into its own folder of
# $OUT, its output into $OUT/NAME/script.log, and `timeout` stops it 30 s after its budget (a script is asked to stop
# cleanly before: BUDGET_S). Prints one line per script as it ends (exit status, wall seconds) and, at the end, the
# GPU's peak memory seen by a 5-s nvidia-smi poll, into $OUT/wave.txt too.
set -uo pipefail
: "${OUT:?run on the device: \$OUT is where results go}"
[ $# -gt 0 ] || { echo "wave.sh: usage: wave.sh NAME:BUDGET_S..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
for spec in "$@"; do
  [ "$spec" = -- ] && continue
  name=${spec%%:*} budget=${spec#*:}
  [[ $name =~ ^[a-z0-9_-]+$ && $budget =~ ^[0-9]+$ && -f $here/$name.sh ]] ||
    { echo "wave.sh: '$spec' is not NAME:SECONDS with lab/gpu/NAME.sh present" >&2; exit 2; }
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/wave.txt"
( while sleep 5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done ) >"$OUT/gpu-mem.txt" 2>/dev/null &
poll=$!
t0=$SECONDS
pids=()
phase() { for p in "${pids[@]}"; do wait "$p"; done; pids=(); echo "wave: phase ended at $((SECONDS - t0)) s" | tee -a "$OUT/wave.txt"; }
for spec in "$@"; do
  if [ "$spec" = -- ]; then phase; continue; fi
  name=${spec%%:*} budget=${spec#*:}
  mkdir -p "$OUT/$name"
  ( s=$SECONDS
    BUDGET_S=$budget timeout -k 10 $((budget + 30)) bash "$here/$name.sh" "$OUT/$name" >"$OUT/$name/script.log" 2>&1
    echo "$name: exit $? after $((SECONDS - s)) s (budget $budget s)" | tee -a "$OUT/wave.txt" ) &
  pids+=($!)
done
phase
kill "$poll" 2>/dev/null
peak=$(sort -n "$OUT/gpu-mem.txt" | tail -1)
n=0; for s in "$@"; do [ "$s" = -- ] || n=$((n + 1)); done
echo "wave: $n scripts in $((SECONDS - t0)) s; GPU memory peak ${peak:-?} MiB (5-s poll)" | tee -a "$OUT/wave.txt"
