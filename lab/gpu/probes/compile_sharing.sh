#!/usr/bin/env bash
# Does the same build, served twice with torch.compile and CUDA graphs, re-round against itself because each server
# compiles its own kernels? On the H200 panel of 2026-12-02 (results/e2e-promises-h200.md) the same 0.33.0 build
# against itself FAILED `identical` on the trained model: 17 of 64 prompts' log-probabilities moved from the first
# generated token on (0.00038 nats/token at decode, up to 0.055), where each server's own repeat moved 0.00001.
# Two same-build pairs of the trained model, `--promise identical`, `--reference none`, experts UVA-offloaded:
#
#   shared    the servers start one after the other (no fixed KV cache, so moegate's start_together serves them in
#             turn) and share one compile cache: the second loads the graph the first compiled
#   separate  started 80 s later, side by side, each server with a compile cache of its own (VLLM_CACHE_ROOT): both
#             compile, as the panel's pairs did
#
#   determ    as `separate`, with TORCHINDUCTOR_DETERMINISTIC=1 on both servers: Inductor then picks its reduction
#             kernels' configs without timing them on the device (the suspected cause: two compiles time the
#             candidates apart, pick differently, and sum in another order); the other two arms set it to 0
#
# If compiling apart is the cause, `shared` PASSes and `separate` FAILs; if timing-based choices are, `determ` PASSes
# too, and e2e_plan.sh's default (TORCHINDUCTOR_DETERMINISTIC=1 for every server) is the remedy. From the checkout root on the device after
# the 0.33.0 and lm-eval installs (lab/gpu/README.md), with the prompts' texts (`python -m moegate.e2e prompts
# --export`) copied to $HOME/data/prompts.jsonl in an install call: a carry is gone from the checkout in every call
# that does not name it (2026-12-02: this probe's first call found none and both pairs stopped at once, exit 2).
# Then a second phase, `mixed` and `load` (below). About 400 s in all (the first phase took 237 s on 2026-12-03).
# Writes $OUT/walls.txt and $OUT/compile-sharing.tar (every arm's log and NAME.tar.xz: a call returns at most 8 files;
# a run cut short leaves them loose).
set -u
: "${OUT:?run on the device: \$OUT is where results go}"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
PROMPTS_FILE=${PROMPTS_FILE:-$HOME/data/prompts.jsonl} LIMIT_S=${LIMIT_S:-560}
B=$HOME/b033
[ -x "$B/bin/python" ] || python3 -m moegate.builds.planted "$B" --python python3 --site "$HOME/vllm-site" \
  --site "$HOME/eval-site" >/dev/null || exit 1
UVA=$(python3 -c "from tooling.serving import UVA_EXPERTS; print(UVA_EXPERTS)")
BASE_ARGS=$(python3 -m tooling.serving --base-only --graphs)
t0=$(date +%s)
pair() {  # NAME SERVER-ARGS [EXTRA...]
  local name=$1 args=$2 s rc
  shift 2
  s=$(date +%s)
  timeout -k 10 $((t0 + LIMIT_S - s)) "$B/bin/python" -m moegate.e2e run --base="$B" --pr="$B" --base-label=base \
    --pr-label=pr --base-args="$UVA" --pr-args="$UVA" --model=models/e2e-trained --gates=greedy --promise=identical \
    --reference none --prompts-file "$PROMPTS_FILE" --prompts=64 --max-tokens=128 --in-flight=1,4 \
    --server-args="$args" --out="$HOME/probe/$name/run" --report="$HOME/probe/$name/e2e.md" \
    --golden-dir="$HOME/probe/$name/golden" --startup-timeout 200 "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc wall_s $(($(date +%s) - s))" | tee -a "$OUT/walls.txt"
  tar -C "$HOME/probe" --exclude=golden -cJf "$OUT/$name.tar.xz" "$name"
}
D0=TORCHINDUCTOR_DETERMINISTIC=0 D1=TORCHINDUCTOR_DETERMINISTIC=1
FIXED="$BASE_ARGS --gpu-memory-utilization 0.04 --kv-cache-memory-bytes 1073741824"  # a fixed KV cache: no profiling
for c in shared base pr dbase dpr mixed; do rm -rf "$HOME/cache-$c"; done  # a run again on a warm machine compiles again
pair shared "$BASE_ARGS --gpu-memory-utilization 0.1" --base-env="VLLM_CACHE_ROOT=$HOME/cache-shared" \
  --pr-env="VLLM_CACHE_ROOT=$HOME/cache-shared" --base-env=$D0 --pr-env=$D0 &
sleep 80
pair separate "$FIXED" \
  --base-env="VLLM_CACHE_ROOT=$HOME/cache-base" --pr-env="VLLM_CACHE_ROOT=$HOME/cache-pr" --base-env=$D0 --pr-env=$D0 &
sleep 5
pair determ "$FIXED" \
  --base-env="VLLM_CACHE_ROOT=$HOME/cache-dbase" --pr-env="VLLM_CACHE_ROOT=$HOME/cache-dpr" --base-env=$D1 --pr-env=$D1 &
wait
# The second phase (added after the run of 2026-12-03, where `shared` failed and differed from `separate` in two ways:
# one server loaded what the other compiled, and the KV caches had different sizes): fixed KV caches throughout, the
# compiled graph `separate`'s base left in its cache, copied so that no server writes where another reads
#   mixed   the base compiles into an empty cache, the PR loads that graph (a copy): compile against load alone
#   load    both load that graph, each from a copy of its own
# If `mixed` FAILs and `load` PASSes, compiling against loading is the cause (whatever the KV sizes); if both PASS,
# the KV sizes (or serving in turn) were.
if [ -d "$HOME/cache-base/torch_compile_cache" ] && [ "${PHASE2:-1}" = 1 ]; then
  for c in load-a load-b load-c; do rm -rf "$HOME/cache-$c"; cp -a "$HOME/cache-base" "$HOME/cache-$c"; done
  pair mixed "$FIXED" --base-env="VLLM_CACHE_ROOT=$HOME/cache-mixed" --pr-env="VLLM_CACHE_ROOT=$HOME/cache-load-a" \
    --base-env=$D0 --pr-env=$D0 &
  pair load "$FIXED" --base-env="VLLM_CACHE_ROOT=$HOME/cache-load-b" --pr-env="VLLM_CACHE_ROOT=$HOME/cache-load-c" \
    --base-env=$D0 --pr-env=$D0 &
  wait
fi
(cd "$OUT" && tar -cf compile-sharing.tar ./*.log ./*.tar.xz 2>/dev/null && rm -f ./*.log ./*.tar.xz)
for a in shared separate determ mixed load; do
  tar -xOf "$OUT/compile-sharing.tar" "./$a.log" 2>/dev/null | grep -E "^(PASS|FAIL)  (scored|decode)" | sed "s/^/$a: /" | cut -c1-260
done
