#!/usr/bin/env bash
# The e2e tier's H200 measurements (issue 18 item 6): server pairs side by side on the one GPU, each
# one `python -m moegate.e2e run` (greedy at 1 and 4 in flight, the scored comparison, GSM8K where
# asked; the rules of docs/e2e-rules.md). From the checkout root on the device, after the installs of
# tools/gpu/README.md ($HOME/vllm-site, $HOME/eval-site, optionally $HOME/vllm032):
#
#   bash tools/gpu/e2e_plan.sh PLANFILE        # e.g. tools/gpu/plans/specificity.plan
#
# A plan line: LABEL MODEL BASE PR GATES
#   MODEL  random (the e2e preset, built here once with GSM8K's tokenizer) | trained (models/e2e-trained)
#   BASE, PR  a build: VERSION[+BUG][@res]: 033 or 032 (the site), +BUG a planted bug
#          (`python -m moegate.vllm.planted --bug`: scale=F, weights=F, expert=SRC:DST, renorm=off),
#          @res experts resident (otherwise UVA-offloaded: --offload-backend uva ... experts)
#   GATES  greedy | greedy,gsm8k
# Every build is an interpreter made by `python -m moegate.vllm.planted` under $HOME/builds (no
# search-path variable anywhere); the driver and lm-eval run on the plain 0.33.0 build.
#
# The servers get a fixed KV cache (--kv-cache-memory-bytes, 1 GiB; these sizes need 16 MiB): with it
# vLLM skips the memory profiling that, with 12 engines starting at once on 2026-12-01, counted the
# others' allocations as its own (5 of 12 failed: "Available KV cache memory: -7.12 GiB").
# GSM8K: 250 questions once per build (GSM8K_ARGS; the cap at 250 keeps a pair inside one call: where
# the size rule asks for more, the verdict says what 250 resolve). SERVER_ARGS and UVA_ARGS replace those flags (a CPU rehearsal: UVA_ARGS= SERVER_ARGS="...").
# E2E_ARGS goes to every `moegate.e2e run` as well (`--strict`: the byte-identity verdicts, plans/byte-identity.plan).
# Launches are STAGGER_S apart; every pair is stopped by BUDGET_S after the first (the call's limit
# is 600 s). Writes $OUT/PLAN.tar.xz (each pair's folder: driver log, e2e.md, scores.json, gate JSONs,
# server logs, wall.txt) and prints each pair's verdict lines and wall time.
set -u
: "${OUT:?run on the device: \$OUT is where results go}"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
plan=${1:?usage: e2e_plan.sh PLANFILE}
name=$(basename "$plan" .plan)
ROOT=$PWD DATA=${DATA:-$PWD/.gpu/g18/data}
PROMPTS=${PROMPTS:-64} TOKENS=${TOKENS:-128} UTIL=${UTIL:-0.05} KV=${KV:-1073741824}
STAGGER_S=${STAGGER_S:-5} BUDGET_S=${BUDGET_S:-540} GSM8K_ARGS=${GSM8K_ARGS:-"--gsm8k-limit 250 --gsm8k-cap 250 --no-gsm8k-repeat"}
t0=$(date +%s)
mkdir -p "$HOME/builds" "$HOME/e2e"

build() {  # build token -> its interpreter (made once per machine)
  local tok=$1 ver bug="" dir
  ver=${tok%%[+@]*}
  case $tok in *+*) bug=${tok#*+}; bug=${bug%@res} ;; esac
  dir=$HOME/builds/$(echo "${ver}+${bug}" | tr -c 'A-Za-z0-9.\n' '_')
  if [ ! -x "$dir/bin/python" ]; then
    local site=$HOME/vllm-site
    [ "$ver" = 032 ] && site=$HOME/vllm032
    python3 -m moegate.vllm.planted "$dir" --python python3 --site "$site" --site "$HOME/eval-site" \
      ${bug:+--bug "$bug"} >/dev/null || return 1
  fi
  echo "$dir/bin/python"
}

UVA_ARGS=${UVA_ARGS-"--offload-backend uva --cpu-offload-gb 64 --cpu-offload-params experts"}
uva() { case $1 in *@res) ;; *) echo "$UVA_ARGS" ;; esac; }

DRIVER=$(build 033) || exit 1
"$DRIVER" -c "import vllm; print('vllm', vllm.__version__, 'from', vllm.__file__)" 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
if grep -qE '^[^#]* random ' "$plan" && [ ! -f "$HOME/tiny-e2e/config.json" ]; then
  timeout 120 "$DRIVER" -m moegate.model.tiny_model "$HOME/tiny-e2e" --preset e2e --overwrite \
    --tokenizer-data "$DATA/gsm8k/train.jsonl" >"$OUT/tiny-model.log" 2>&1 || { tail -20 "$OUT/tiny-model.log"; exit 1; }
  echo "random model built in $(( $(date +%s) - t0 )) s"
fi
ARGS=${SERVER_ARGS:-"--max-model-len 4096 --enforce-eager --dtype bfloat16 --max-num-seqs 4 --no-enable-prefix-caching \
--gpu-memory-utilization $UTIL --kv-cache-memory-bytes $KV"}

labels=()
while read -r label model base pr gates; do
  case $label in ''|'#'*) continue ;; esac
  bpy=$(build "$base") && ppy=$(build "$pr") || { echo "$label: build failed"; continue; }
  dir=$HOME/tiny-e2e; [ "$model" = trained ] && dir=$ROOT/models/e2e-trained
  out=$HOME/e2e/$name/$label; rm -rf "$out"; mkdir -p "$out"
  extra=(); [[ $gates == *gsm8k* ]] && extra=(--gsm8k-dir "$DATA/gsm8k" --eval-python "$DRIVER" $GSM8K_ARGS)
  left=$(( t0 + BUDGET_S - $(date +%s) ))
  (
    s=$(date +%s%N)
    timeout -k 20 "$left" "$DRIVER" -m moegate.e2e run --base="$bpy" --pr="$ppy" --base-label=base --pr-label=pr \
      --base-args="$(uva "$base")" --pr-args="$(uva "$pr")" --model="$dir" --gates="$gates" \
      --prompts-file "$DATA/prompts.jsonl" --prompts="$PROMPTS" --max-tokens="$TOKENS" --in-flight=1,4 \
      --server-args="$ARGS" --out="$out/run" --report="$out/e2e.md" --golden-dir="$out/golden" --bless \
      --startup-timeout 400 "${extra[@]}" ${E2E_ARGS:-} >"$out/driver.log" 2>&1
    rc=$?
    echo "exit $rc wall_ms $(( ($(date +%s%N) - s) / 1000000 )) base $base pr $pr model $model gates $gates" >"$out/wall.txt"
  ) &
  labels+=("$label")
  sleep "$STAGGER_S"
done <"$plan"
wait
echo "plan $name: ${#labels[@]} pairs done in $(( $(date +%s) - t0 )) s"
for label in "${labels[@]}"; do
  f=$HOME/e2e/$name/$label/driver.log
  echo "== $label: $(cat "$HOME/e2e/$name/$label/wall.txt" 2>/dev/null)"
  grep -E "^(PASS|FAIL)  " "$f" | cut -c1-330
  grep -E "^moegate.e2e: |Error|error:" "$f" | grep -v "measured in" | tail -3 | cut -c1-300
done
tar -I "xz -T0" -cf "$OUT/$name.tar.xz" --exclude=hf_datasets_cache -C "$HOME/e2e" "$name"
ls -la "$OUT"
