#!/usr/bin/env bash
# The e2e noise is the base's alone (issue 45 item 3), on the GPU: a planted bug that depends on the batch's
# composition, judged by `moegate e2e run` under `identical`, beside a same-build pair. From the checkout's root on
# the device, after the lead's bring-up (vLLM 0.33.0 in $HOME/vllm-site, lab/gpu/README.md):
#
#   PROMPTS_FILE=$DATA/prompts.jsonl bash lab/gpu/noise.sh RESULT_DIR
#
# Two pairs side by side, each one `python -m moegate.e2e run` (greedy at 1 and 4 in flight, each build twice at 4,
# the scored comparison; no GSM8K, no reference), the committed trained tiny model, eager servers as the gate's e2e
# leg serves, experts resident:
#   same  0.33.0 against itself: every row PASSes, the new repeat row among them;
#   swap  0.33.0 against 0.33.0 + `--bug swap-top1=2-4` (moegate/builds/planted: on router-gate calls of 2-4 tokens,
#         tokens 0 and 1 exchange their top-1 experts): `identical` must FAIL, on the repeat row where the PR's
#         repeat parts from its pass more often than the base's (rules/repeats.py), and the decode and greedy rows
#         must read their noise from the base alone (within and tie bound as in the same pair), not from the PR's
#         unstable repeat (results/e2e-noise-cpu.md: the same bug on the CPU).
# The judge needs scipy, which vLLM does not bring: the bring-up's lm-eval site carries it ($HOME/eval-site, EVAL_SITE),
# added to both builds where it is there (as lab/gpu/e2e_plan.sh does).
# About 3-4 minutes (server starts 60-120 s eager, then 64 prompts x 32 tokens); 4 servers of the tiny model with a
# fixed 1 GiB KV cache each: about 8 GB of GPU memory in all. BUDGET_S (default 540) bounds it: each run is stopped
# (its servers with it) 30 s before. Writes RESULT_DIR/summary.md, and per pair its e2e.md, gate JSONs, greedy
# passes and scores (xz), the driver's and servers' logs. Exit 0 when it ran, whatever the verdicts; 2 when it could
# not (no vLLM site, no prompts file).
set -u
RES=${1:?usage: bash lab/gpu/noise.sh RESULT_DIR}
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
SITE=${VLLM_SITE:-$HOME/vllm-site} EVAL_SITE=${EVAL_SITE:-$HOME/eval-site}
PY=${PYTHON:-python3}
PROMPTS_FILE=${PROMPTS_FILE:-${DATA:-$PWD/.gpu/g18/data}/prompts.jsonl}
PROMPTS=${PROMPTS:-64} TOKENS=${TOKENS:-32}
WORK=${NOISE_WORK:-$HOME/noise}
ARGS=${SERVER_ARGS:-"$(PYTHONPATH=$PWD $PY -m tooling.serving --base-only) --gpu-memory-utilization 0.05 --kv-cache-memory-bytes 1073741824"}
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false

mkdir -p "$RES" "$WORK"
[ -d "$SITE" ] || [ -n "${NOISE_NO_SITE:-}" ] || { echo "noise.sh: no vLLM site at $SITE (VLLM_SITE)" >&2; exit 2; }
[ -f "$PROMPTS_FILE" ] || { echo "noise.sh: no prompts file $PROMPTS_FILE (python -m moegate.e2e prompts --export)" >&2; exit 2; }
sites=(); [ -d "$SITE" ] && sites+=(--site "$SITE"); [ -d "$EVAL_SITE" ] && sites+=(--site "$EVAL_SITE")
"$PY" -m moegate.builds.planted "$WORK/builds/base" --python "$PY" "${sites[@]}" >/dev/null || exit 2
"$PY" -m moegate.builds.planted "$WORK/builds/swap" --python "$PY" "${sites[@]}" --bug swap-top1=2-4 \
  --version 0.33.1.dev45+g0000045 >/dev/null || exit 2
BASE=$WORK/builds/base/bin/python
"$BASE" -c "import vllm; print('vllm', vllm.__version__)" >"$RES/vllm.txt" 2>&1 || { cat "$RES/vllm.txt" >&2; exit 2; }
"$BASE" -c "import scipy" 2>/dev/null || { echo "noise.sh: no scipy for the judge (EVAL_SITE=$EVAL_SITE)" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader >>"$RES/vllm.txt" 2>/dev/null \
  || echo "no nvidia-smi" >>"$RES/vllm.txt"

left=$(( BUDGET_S - ($(date +%s) - T0) - 30 ))
[ "$left" -gt 60 ] || { echo "noise.sh: BUDGET_S=$BUDGET_S leaves no time for a run" >"$RES/summary.md"; exit 0; }
declare -A pid
for pair in same swap; do
  pr=$BASE; [ $pair = swap ] && pr=$WORK/builds/swap/bin/python
  out=$WORK/runs/$pair; rm -rf "$out"; mkdir -p "$out"
  timeout --kill-after=20 "$left" "$BASE" -m moegate e2e run --base="$BASE" --pr="$pr" --model=models/e2e-trained \
    --reference=none --gates=greedy --server-args="$ARGS" --prompts-file="$PROMPTS_FILE" --prompts="$PROMPTS" \
    --max-tokens="$TOKENS" --in-flight=1,4 --out="$out/run" --report="$out/e2e.md" --golden-dir="$out/golden" \
    >"$out/driver.log" 2>&1 &
  pid[$pair]=$!
  sleep 5  # the second pair's servers start once the first's are under way
done
{
  echo "# lab/gpu/noise.sh: the e2e noise is the base's alone"
  echo
  echo "$(head -1 "$RES/vllm.txt"); $(sed -n 2p "$RES/vllm.txt"); $PROMPTS prompts x $TOKENS tokens; budget ${BUDGET_S} s"
} >"$RES/summary.md"
for pair in same swap; do
  wait "${pid[$pair]}"; code=$?
  out=$WORK/runs/$pair dest=$RES/$pair
  mkdir -p "$dest"
  cp "$out/driver.log" "$dest/" 2>/dev/null
  [ -f "$out/e2e.md" ] && cp "$out/e2e.md" "$dest/"
  cp "$out"/run/gate-*.json "$dest/" 2>/dev/null
  for f in "$out"/run/greedy-*.json "$out"/run/scores.json; do [ -f "$f" ] && xz -c "$f" >"$dest/$(basename "$f").xz"; done
  for f in "$out"/run/server-*.log; do [ -f "$f" ] && tail -c 200000 "$f" >"$dest/$(basename "$f")"; done
  {
    echo
    echo "## $pair: exit $code ($( [ $code = 0 ] && echo PASS || { [ $code = 1 ] && echo FAIL; } || echo 'no verdict'))"
    echo
    if [ -f "$out/e2e.md" ]; then
      grep -E '^\| (scored|decode|repeat|greedy \(|greedy, ).*\| (PASS|FAIL) \|' "$out/e2e.md" | cut -c1-600
    else
      tail -5 "$out/driver.log"
    fi
  } >>"$RES/summary.md"
done
echo >>"$RES/summary.md"
echo "wall $(( $(date +%s) - T0 )) s" >>"$RES/summary.md"
cat "$RES/summary.md"
exit 0
