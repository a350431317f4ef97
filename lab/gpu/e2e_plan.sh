#!/usr/bin/env bash
# The e2e tier's H200 measurements: server pairs side by side on the one GPU, each one `python -m moegate.e2e run`
# (the orchestrator, moegate/e2e/pair.py: greedy at 1 and 4 in flight, the scored comparison, the decode path,
# GSM8K where asked; both promises of docs/design/e2e-rules.md judged from the pair's one run). From the checkout root on
# the device, after the installs of lab/gpu/README.md ($HOME/vllm-site, $HOME/eval-site, optionally $HOME/vllm032):
#
#   bash lab/gpu/e2e_plan.sh PLANFILE...     # e.g. lab/gpu/plans/promises-a.plan
#
# Several plans are one list, in the order given, named after them joined by "_" (promises-a_promises-b).
# A plan line: LABEL MODEL BASE PR GATES [PROMISE]
#   MODEL  random (the e2e preset, built here once with GSM8K's tokenizer) | trained (models/e2e-trained)
#          | random-fp8 (the block-FP8 variant of issue 29 item 6: `python -m moegate.model.quantize SRC DEST
#          --scheme fp8-block` on the random model, whose e2e preset tiles into [128, 128] blocks, hidden 256 and
#          expert width 128, and keeps 1-4 decode tokens naive, 4 x 8 x 4 <= 128; docs/design/offload.md. The trained
#          model's expert width 64 does not tile: the writer refuses it with one line and the line is skipped)
#   BASE, PR  a build: VERSION[+BUG][@VARIANT]: 033 or 032 (the site); +BUG a planted change
#          (`python -m moegate.builds.planted --bug`: bugs scale=F, weights=F, expert=SRC:DST, renorm=off,
#          naive-top1=F, naive-host-top1=F; harmless reround=K, reround-attn=K); @VARIANT one of
#          res (experts resident; otherwise UVA-offloaded: --offload-backend uva ... experts),
#          eager (--enforce-eager: no CUDA graphs, no torch.compile), triton-attn (--attention-backend TRITON_ATTN),
#          tuned (a retuned fused-MoE config: BLOCK_SIZE_K 32 for every M, VLLM_TUNED_CONFIG_FOLDER),
#          batchinv (VLLM_BATCH_INVARIANT=1: vLLM's batch-invariant kernels, another reduction order),
#          cublasws (CUBLAS_WORKSPACE_CONFIG=:4096:8, PyTorch's setting for cuBLAS's reproducibility),
#          nocompile (no torch.compile, CUDA graphs for decode: mode 0, cudagraph_mode FULL_DECODE_ONLY),
#          nographs (torch.compile, no CUDA graphs), rmsnorm-op (torch.compile, but vLLM's own RMSNorm kernel in
#          place of the one Inductor writes): the last four are plans/personality.plan's arms, which ask what makes
#          two starts of one build compute differently (results/e2e-promises-h200.md)
#   GATES  greedy | greedy,gsm8k
#   PROMISE  what the pair's run is judged by (default identical); the other promise is judged from the same
#          raw folder after the pairs (`python -m moegate.e2e compare --promise ...`), both land in the archive
# Every build is an interpreter made by `python -m moegate.builds.planted` under $HOME/builds (no search-path
# variable anywhere); the driver and lm-eval run on the plain 0.33.0 build.
#
# Servers serve as users serve: CUDA graphs and torch.compile on (no --enforce-eager but in @eager), a fixed KV
# cache each (--kv-cache-memory-bytes, 1 GiB; these sizes need 16 MiB), so vLLM skips the memory profiling that
# counted other engines' allocations as its own (2026-12-01), and a pair's servers start side by side.
# One reference server per model and base (that base's version re-rounded, `--bug reround=3`, served where the base's
# experts live, lab/gpu/e2e_serve.py) is shared by every pair of that model and base (--reference-url): it is the yardstick of `equivalent`, a size, which other
# pairs' requests batched beside its own do not move measurably; the compared servers are never shared.
#
# GSM8K: 250 questions once per build (GSM8K_ARGS; the cap at 250 keeps a pair inside one call: where the size
# rule asks for more, the verdict says what 250 resolve). SERVER_ARGS and UVA_ARGS replace those flags (a CPU
# rehearsal: UVA_ARGS= SERVER_ARGS="..."). E2E_ARGS goes to every `moegate.e2e run` as well (`--strict`: the
# byte-identity verdicts, plans/byte-identity.plan).
#
# Resumable per pair: a pair whose wall.txt says exit 0 or 1 (a verdict) is not run again; run the same plan
# again in the next call to finish the rest (the machine keeps $HOME only while warm: issue the plan's calls in one
# batch, back to back). Launches are STAGGER_S apart, at most MAX_PAIRS running at once (a pair waits for one to
# end), none started with less than MIN_PAIR_S of the budget left; every pair is stopped by BUDGET_S after the
# first (the call's limit is 600 s; a plan longer than a call runs through lab/gpu/background.sh). Each pair, as
# it ends, prints its line and writes $OUT/PLAN/LABEL.tar.xz (its folder: driver log, e2e.md, scores.json, gate
# JSONs, server logs, wall.txt, both promises' pages, and compact.npz, the per-token numbers small enough to commit:
# lab/gpu/compact_run.py); at the end $OUT/PLAN-references.tar.xz (the reference servers' logs) and each pair's
# verdicts.
#
# Every server gets TORCHINDUCTOR_DETERMINISTIC=1 unless the caller sets it (0 to serve exactly as a user's default
# does), and a compile cache of its own (VLLM_CACHE_ROOT under $HOME/e2e-cache/PLAN/LABEL/SIDE, emptied when the pair
# starts), so both servers of a pair reach their graph the same way: by compiling it. With torch.compile on, Inductor
# times candidate configs of its reduction kernels on the device and keeps the fastest, so two compiles under load
# can sum in different orders; the variable makes that choice without timing. On the panel of 2026-12-02 (without
# either) a same-build pair re-rounded against itself. The probe of 2026-12-03 (lab/gpu/probes/compile_sharing.sh,
# one pair an arm): two servers compiling into caches of their own agreed bit for bit at 1 in flight, with the
# variable (`determ`) or without (`separate`); one server loading the graph the other had compiled (`shared`) moved
# 15-17 of 64 prompts (results/e2e-promises-h200.md, finding 1). A planted bug's build keeps a cache of its own
# either way (moegate/builds/planted).
set -u
: "${OUT:?run on the device: \$OUT is where results go}"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_DETERMINISTIC=${TORCHINDUCTOR_DETERMINISTIC:-1}
[ $# -gt 0 ] || { echo "usage: e2e_plan.sh PLANFILE..." >&2; exit 2; }
for p in "$@"; do [ -f "$p" ] || { echo "e2e_plan.sh: no plan file $p" >&2; exit 2; }; done
name=$(for p in "$@"; do basename "$p" .plan; done | paste -sd_)
mkdir -p "$HOME/e2e"
plan=$HOME/e2e/$name.plan  # several plans are one list, in the order given
cat "$@" >"$plan"
ROOT=$PWD DATA=${DATA:-$PWD/.gpu/g18/data}
PROMPTS=${PROMPTS:-64} TOKENS=${TOKENS:-128} UTIL=${UTIL:-0.04} KV=${KV:-1073741824}
STAGGER_S=${STAGGER_S:-3} BUDGET_S=${BUDGET_S:-540} MAX_PAIRS=${MAX_PAIRS:-99} MIN_PAIR_S=${MIN_PAIR_S:-60} GSM8K_ARGS=${GSM8K_ARGS:-"--gsm8k-limit 250 --gsm8k-cap 250 --no-gsm8k-repeat"}
t0=$(date +%s)
# A call cut by its limit leaves its servers running (each in its own process group, out of `timeout`'s reach):
# on 2026-12-02 call B of the panel started beside call A's 17 GB of orphans. A pair not finished is run again from
# scratch, so nothing of theirs is wanted. Only this script's processes: every one runs an interpreter under
# $HOME/builds (drivers, references, servers and their engines), so a CPU rehearsal leaves other servers alone.
pkill -TERM -f "^$HOME/builds/" 2>/dev/null && sleep 5
pkill -KILL -f "^$HOME/builds/" 2>/dev/null
mkdir -p "$OUT/$name"
mkdir -p "$HOME/builds" "$HOME/e2e/$name" "$HOME/e2e-models"

bug_of() { case $1 in *+*) local b=${1#*+}; echo "${b%%@*}" ;; esac; }  # build token -> its planted bug, if any
interpreter() {  # build token -> where its interpreter is (or will be)
  echo "$HOME/builds/$(echo "${1%%[+@]*}+$(bug_of "$1")" | tr -c 'A-Za-z0-9.\n' '_')/bin/python"
}
# the panel starts during the bring-up: a build waits for a complete site (site_ready, wait_site)
# shellcheck source=lab/gpu/sites.sh
. "$(dirname "$0")/sites.sh"
build() {  # build token -> its interpreter (made once per machine, from a complete site: waits SITE_WAIT_S for one)
  local tok=$1 py site=$HOME/vllm-site bug
  py=$(interpreter "$tok") bug=$(bug_of "$tok")
  if [ ! -x "$py" ]; then
    [ "${tok%%[+@]*}" = 032 ] && site=$HOME/vllm032
    wait_site "$site" "build $tok" || return 1
    # one maker a build (the references are built side by side in the background, two of them can share one)
    ( flock 9 && { [ -x "$py" ] || python3 -m moegate.builds.planted "${py%/bin/python}" --python python3 \
      --site "$site" --site "$HOME/eval-site" ${bug:+--bug "$bug"} >/dev/null; } ) 9>"${py%/bin/python}.lock" || return 1
  fi
  echo "$py"
}

UVA_ARGS=${UVA_ARGS-"--offload-backend uva --cpu-offload-gb 64 --cpu-offload-params experts"}
TUNED=$HOME/e2e-models/tuned-config
flags() {  # build token -> its own server flags
  local tok=$1 out="$UVA_ARGS"
  case $tok in *@res*) out="" ;; esac
  case $tok in *@eager*) out="$out --enforce-eager" ;; esac
  case $tok in *@triton-attn*) out="$out --attention-backend TRITON_ATTN" ;; esac
  case $tok in *@nocompile*) out="$out --compilation-config '{\"mode\":0,\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}'" ;; esac
  case $tok in *@nographs*) out="$out --compilation-config '{\"cudagraph_mode\":\"NONE\"}'" ;; esac
  case $tok in *@rmsnorm-op*) out="$out --compilation-config '{\"custom_ops\":[\"+rms_norm\"]}'" ;; esac
  echo "$out"
}
envs() {  # build token -> its own --SIDE-env words
  case $1 in
    *@tuned*) echo "VLLM_TUNED_CONFIG_FOLDER=$TUNED" ;;
    *@batchinv*) echo "VLLM_BATCH_INVARIANT=1" ;;
    *@cublasws*) echo "CUBLAS_WORKSPACE_CONFIG=:4096:8" ;;
  esac
}

tuned_config() {  # E=<experts>,N=<intermediate> for the H200: BLOCK_SIZE_K 32 for every M (the default is 64-128)
  mkdir -p "$TUNED"
  python3 - "$TUNED" <<'PY'
import json, sys
for e, n in ((128, 128), (64, 64)):  # random e2e preset, trained e2e preset: experts, w2's last dim
    cfg = {str(m): {"BLOCK_SIZE_M": 16 if m <= 64 else 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
                    "num_warps": 4, "num_stages": 3} for m in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024,
                                                                1536, 2048, 3072, 4096)}
    with open(f"{sys.argv[1]}/E={e},N={n},device_name=NVIDIA_H200.json", "w") as fh:
        json.dump(cfg, fh, indent=1)
PY
}

model_dir() {  # model token -> its directory (built once per machine); empty and a reason on stderr if not here
  case $1 in
    random) echo "$HOME/tiny-e2e" ;;
    trained) echo "$ROOT/models/e2e-trained" ;;
    *-fp8)
      local src dst=$HOME/e2e-models/$1
      src=$(model_dir "${1%-fp8}") || return 1
      if [ ! -f "$dst/config.json" ]; then
        "$DRIVER" -m moegate.model.quantize "$src" "$dst" --scheme fp8-block >"$HOME/e2e-models/$1.log" 2>&1 \
          || { echo "model $1: the block-FP8 writer failed: $(tail -1 "$HOME/e2e-models/$1.log")" >&2; return 1; }
      fi
      echo "$dst" ;;
    *) echo "unknown model $1" >&2; return 1 ;;
  esac
}

DRIVER=$(build 033) || exit 1
"$DRIVER" -c "import vllm; print('vllm', vllm.__version__, 'from', vllm.__file__)" 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
if grep -qE '^[^#]* random' "$plan" && [ ! -f "$HOME/tiny-e2e/config.json" ]; then
  timeout 120 "$DRIVER" -m moegate.model.tiny_model "$HOME/tiny-e2e" --preset e2e --overwrite \
    --tokenizer-data "$DATA/gsm8k/train.jsonl" >"$OUT/tiny-model.log" 2>&1 || { tail -20 "$OUT/tiny-model.log"; exit 1; }
  echo "random model built in $(( $(date +%s) - t0 )) s"
fi
grep -q '@tuned' "$plan" && tuned_config
ARGS=${SERVER_ARGS:-"$(PYTHONPATH=$ROOT python3 -m tooling.serving --base-only --graphs) --gpu-memory-utilization $UTIL --kv-cache-memory-bytes $KV"}

# One reference re-rounding per model and base that a pending pair uses: the base's own version re-rounded
# (VERSION+reround=3), served as the base serves (its experts' place, eager or compiled, its attention backend:
# the base token's own flags and environment, as `moegate.e2e run --reference auto` does). (2026-12-02: one 0.33.0
# UVA reference per model served every pair, so for a 0.32.0 or a resident base the yardstick was the PR's build,
# not the base re-rounded. 2026-12-03 (3): the reference served compiled beside `@eager` bases, so the yardstick
# held the eager-against-compiled difference and two decode-only bugs passed `equivalent`:
# results/e2e-promises-h200.md, "The eager run".)
declare -A refurl refpid refpy
pending() { local w=$HOME/e2e/$name/$1/wall.txt; ! grep -qE '^exit (0|1) ' "$w" 2>/dev/null; }
refkey() {  # MODEL BASE -> its key: the model, the base's version and its serving variants (033@res@eager: 033-res-eager)
  local mode=
  case $2 in *@*) mode=-$(echo "${2#*@}" | tr '@' '-') ;; esac
  echo "$1-${2%%[+@]*}$mode"
}
while read -r label model base _; do
  case $label in ''|'#'*) continue ;; esac
  pending "$label" || continue
  key=$(refkey "$model" "$base")
  [ -n "${refurl[$key]:-}" ] && continue
  dir=$(model_dir "$model" </dev/null) || continue
  py=$(interpreter "${base%%[+@]*}+reround=3")
  rflags=$(flags "$base") renv=()
  for e in $(envs "$base"); do renv+=(--env "$e"); done
  f=$HOME/e2e/$name/reference-$key.url; rm -f "$f"
  # built in the background: its site may still be arriving (build waits for it), and the other references go on
  ( build "${base%%[+@]*}+reround=3" >/dev/null || exit 1
    exec "$DRIVER" -m lab.gpu.e2e_serve --python "$py" --model "$dir" --args "$ARGS --max-num-seqs 32 $rflags" \
      "${renv[@]}" --url-file "$f" --log "$HOME/e2e/$name/reference-$key.log" ) >"$HOME/e2e/$name/reference-$key.out" 2>&1 </dev/null &
  refpid[$key]=$!
  refurl[$key]=$f
  refpy[$key]=$py
done <"$plan"

labels=() pairs=()
running() { local n=0 p; for p in "${pairs[@]}"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done; echo "$n"; }
while read -r label model base pr gates promise; do
  case $label in ''|'#'*) continue ;; esac
  out=$HOME/e2e/$name/$label
  while [ "$(running)" -ge "$MAX_PAIRS" ]; do sleep 2; done
  if ! pending "$label"; then echo "$label: done in an earlier call ($(cat "$out/wall.txt"))"; labels+=("$label"); continue; fi
  dir=$(model_dir "$model") || { echo "$label: skipped (model $model)"; continue; }
  bpy=$(build "$base") && ppy=$(build "$pr") || { echo "$label: build failed"; continue; }
  rm -rf "$out"; mkdir -p "$out"
  extra=(); [[ $gates == *gsm8k* ]] && extra=(--gsm8k-dir "$DATA/gsm8k" --eval-python "$DRIVER" $GSM8K_ARGS)
  for side in base pr; do tok=$base; [ $side = pr ] && tok=$pr; e=$(envs "$tok"); [ -n "$e" ] && extra+=("--$side-env=$e"); done
  # each server compiles into a cache of its own (the probe's `determ` arm, which agreed bit for bit; one server
  # loading what the other compiled did not: results/e2e-promises-h200.md, finding 1), outside the archived folder
  for side in base pr; do rm -rf "$HOME/e2e-cache/$name/$label/$side"; extra+=("--$side-env=VLLM_CACHE_ROOT=$HOME/e2e-cache/$name/$label/$side"); done
  (
    s=$(date +%s%N)
    key=$(refkey "$model" "$base"); f=${refurl[$key]:-}; w=0
    # a reference that is gone (its build or its server failed) is not waited for: the pair starts its own (auto)
    while [ -n "$f" ] && [ ! -s "$f" ] && [ $w -lt 400 ] && kill -0 "${refpid[$key]}" 2>/dev/null; do
      sleep 2; w=$((w + 2))
    done
    # the budget left once the reference is up (2026-12-02: counted before this wait, it let pairs run up to
    # 400 s past BUDGET_S, and the call was cut before it printed or archived anything)
    left=$(( t0 + BUDGET_S - $(date +%s) ))
    if [ "$left" -lt "$MIN_PAIR_S" ]; then
      echo "exit 124 wall_ms 0 not started: ${left} s of the budget left after the reference (${w} s)" >"$out/wall.txt"
      exit 0
    fi
    ref=(--reference "${refpy[$key]:-auto}"); [ -n "$f" ] && [ -s "$f" ] && ref+=(--reference-url "$(cat "$f")")
    timeout -k 20 "$left" "$DRIVER" -m moegate.e2e run --base="$bpy" --pr="$ppy" --base-label=base --pr-label=pr \
      --base-args="$(flags "$base")" --pr-args="$(flags "$pr")" --model="$dir" --gates="$gates" \
      --promise="${promise:-identical}" "${ref[@]}" \
      --prompts-file "$DATA/prompts.jsonl" --prompts="$PROMPTS" --max-tokens="$TOKENS" --in-flight=1,4 \
      --server-args="$ARGS" --out="$out/run" --report="$out/e2e.md" --golden-dir="$out/golden" \
      --startup-timeout 400 "${extra[@]}" ${E2E_ARGS:-} >"$out/driver.log" 2>&1
    rc=$?
    echo "exit $rc wall_ms $(( ($(date +%s%N) - s) / 1000000 )) base $base pr $pr model $model gates $gates promise ${promise:-identical}" >"$out/wall.txt"
    if [ $rc -le 1 ]; then  # the other promise, from the same raw folder
      other=equivalent; [ "${promise:-identical}" = equivalent ] && other=identical
      timeout -k 5 $(( t0 + BUDGET_S + 20 - $(date +%s) )) "$DRIVER" -m moegate.e2e compare --raw "$out/run" --base base --pr pr --model "$dir" --gates "$gates" \
        --promise "$other" --server-args "$ARGS" --max-tokens "$TOKENS" --golden-dir "$out/golden" \
        --report "$out/e2e-$other.md" >"$out/compare-$other.log" 2>&1
      echo "$other exit $?" >>"$out/wall.txt"
      # the per-token numbers, small enough to commit (scores.json and the greedy records are up to 11 MB a pair)
      "$DRIVER" -m lab.gpu.compact_run "$out/run" "$out/compact.npz" >>"$out/compare-$other.log" 2>&1
    fi
    # what a cut call still brings back: the pair's line now, its small files (no server weights, no goldens)
    echo "pair $label: $(tr '\n' ' ' <"$out/wall.txt")"
    tar -C "$HOME/e2e/$name" --exclude=hf_datasets_cache --exclude=reference-build --exclude=golden \
      -cJf "$OUT/$name/$label.tar.xz" "$label" 2>/dev/null
  ) &
  pairs+=($!)
  labels+=("$label")
  sleep "$STAGGER_S"
done <"$plan"
[ ${#pairs[@]} -gt 0 ] && wait "${pairs[@]}"
for pid in "${refpid[@]}"; do kill -TERM "$pid" 2>/dev/null; done
for _ in $(seq 15); do  # the references stop their servers on TERM; a bounded wait, then KILL
  alive=0; for pid in "${refpid[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break; sleep 1
done
for pid in "${refpid[@]}"; do kill -KILL "$pid" 2>/dev/null; done
echo "plan $name: ${#labels[@]} pairs in $(( $(date +%s) - t0 )) s"
for label in "${labels[@]}"; do
  d=$HOME/e2e/$name/$label
  echo "== $label: $(head -1 "$d/wall.txt" 2>/dev/null) | $(sed -n 2p "$d/wall.txt" 2>/dev/null)"
  grep -E "^(PASS|FAIL)  " "$d/driver.log" 2>/dev/null | grep -v golden | cut -c1-300
  grep -E "^(PASS|FAIL)  " "$d/compare-"*.log 2>/dev/null | grep -v golden | cut -c1-300
  grep -E "^moegate.e2e: |Error|error:" "$d/driver.log" 2>/dev/null | grep -v "measured in" | tail -3 | cut -c1-300
done
# each pair's folder went back as it ended; the plan's own files (the references' logs and addresses) once more
(cd "$HOME/e2e/$name" && find . -maxdepth 1 -type f -print0 | tar -cJf "$OUT/$name-references.tar.xz" --null -T -)
ls -la "$OUT"
