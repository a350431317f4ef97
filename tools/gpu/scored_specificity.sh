#!/usr/bin/env bash
# The scored comparison's specificity on the H200 (issue 18 item 6, first part): the same build,
# vLLM 0.33.0 with experts UVA-offloaded, against itself, PAIRS independent server pairs per model,
# every pair's servers started side by side on the one GPU (small --gpu-memory-utilization each).
# Each pair is one `python -m moegate.e2e run --gates=greedy` (greedy at 1 and 4 in flight, the
# scoring phase, the verdicts of docs/e2e-rules.md); all pairs of both models run at once.
#
# One device call, after the vLLM 0.33.0 bundle and the server wheelhouse are installed
# (tools/gpu/README.md); carries .gpu/scored (code/: this checkout's moegate package and tools/, data/:
# prompts.jsonl from `python -m moegate.e2e prompts --export`, GSM8K's train.jsonl); the trained model is
# the checkout's models/e2e-trained:
#
#   bash .gpu/scored/code/tools/gpu/scored_specificity.sh      # PAIRS=3 PROMPTS=64 TOKENS=128 by default
#
# Writes $OUT/spec.tgz (every pair's out folder: scores.json, gate JSONs, e2e.md, server logs) and
# prints one line per pair and gate.
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
ROOT=$PWD G=$PWD/.gpu/scored
PAIRS=${PAIRS:-3} PROMPTS=${PROMPTS:-64} TOKENS=${TOKENS:-128} UTIL=${UTIL:-0.07} LIMIT_S=${LIMIT_S:-480}
MODELS=${MODELS:-"random trained"} STAGGER_S=${STAGGER_S:-20}
# STAGGER_S between launches: an engine sizes its KV cache from the device memory in use while it
# profiles; twelve started at once on 2026-12-01 and five failed ("Available KV cache memory: -7.12 GiB").
SITE=$HOME/vllm-site:$HOME/eval-site
export PYTHONPATH=$G/code
ln -sfn "$ROOT/golden" "$G/code/golden"  # moegate.paths looks for the data beside the package
cd "$G/code"
python3 -c "import sys; sys.path[:0] = '$SITE'.split(':'); import vllm; print('vllm', vllm.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
t0=$(date +%s)
timeout 120 python3 -m moegate.model.tiny_model "$HOME/tiny-e2e" --preset e2e --overwrite --tokenizer-data "$G/data/train.jsonl" \
  >"$OUT/tiny-model.log" 2>&1 || { tail -20 "$OUT/tiny-model.log"; exit 1; }
echo "random model built in $(( $(date +%s) - t0 )) s"
ARGS="--max-model-len 4096 --enforce-eager --dtype bfloat16 --max-num-seqs 4 --no-enable-prefix-caching \
--gpu-memory-utilization $UTIL --offload-backend uva --cpu-offload-gb 64 --cpu-offload-params experts"
PY=$(command -v python3)
pids=()
for model in $MODELS; do
  dir=$HOME/tiny-e2e; [ "$model" = trained ] && dir=$ROOT/models/e2e-trained
  for n in $(seq 1 "$PAIRS"); do
    out=$HOME/spec/$model-pair$n; rm -rf "$out"
    mkdir -p "$out"
    timeout "$LIMIT_S" python3 -m moegate.e2e run --base="$PY" --pr="$PY" --base-label=base --pr-label=pr \
      --base-env PYTHONPATH="$SITE" --pr-env PYTHONPATH="$SITE" --model="$dir" --gates=greedy \
      --prompts-file "$G/data/prompts.jsonl" --prompts="$PROMPTS" --max-tokens="$TOKENS" --in-flight=1,4 \
      --server-args="$ARGS" --out="$out/run" --report="$out/e2e.md" --golden-dir="$out/golden" --bless \
      --startup-timeout 400 >"$out/driver.log" 2>&1 &
    pids+=($!)
    sleep "$STAGGER_S"
  done
done
for p in "${pids[@]}"; do wait "$p"; done
echo "all pairs done in $(( $(date +%s) - t0 )) s"
for f in "$HOME"/spec/*/driver.log; do
  pair=$(basename "$(dirname "$f")")
  grep -E "^(PASS|FAIL)  (scored|greedy, [0-9]|greedy, (base|pr) twice)" "$f" | sed "s/^/$pair: /" | cut -c1-400
  grep -E "^moegate.e2e: " "$f" | grep -v "measured in" | sed "s/^/$pair: /" | cut -c1-300
done
tar czf "$OUT/spec.tgz" -C "$HOME" spec
ls -la "$OUT"
