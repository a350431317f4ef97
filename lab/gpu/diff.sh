#!/usr/bin/env bash
# The differential kernel tier's false-FAIL rate and power on the GPU (issue 45 item 2), from the checkout's root:
#
#     bash lab/gpu/diff.sh RESULT_DIR
#
# Needs python3 with torch (the device image) and vLLM 0.33.0 installed as a site at VLLM_SITE (default
# $HOME/vllm-site: lab/gpu/README.md's bring-up); nothing else. Makes its builds (moegate.builds.planted) under
# DIFF_HOME (default $HOME/diff-builds): base, and as PRs twin (another interpreter of the same build), the harmless
# topk-order=reverse (each token's experts summed in reverse order) and act-fp32=silu (silu-and-mul in float32),
# and moe-reround=3 (one more rounding of every output element in the epilogue). Each pair is one
# `moegate diff --runs R` (the gate's 300 cases a run, seeds 1000, 1001, ..., every run judged under both
# promises), in its share of BUDGET_S (default 1200): same first, then the power pair (at most 10 runs), then the
# harmless ones. Its own Triton cache (DIFF_HOME/triton): the first pair's first run compiles.
#
# Writes RESULT_DIR/PAIR.json (moegate diff's report; a stub naming the reason where the tier judged nothing) and
# PAIR.log for each pair, then RESULT_DIR/diff.json and diff.md (python3 -m lab.gpu.diff_table): a row a pair,
# FAILs under each promise, the false-FAIL rate's 95 % upper bound, the smallest p-value, the median error ratio.
# Takes BUDGET_S plus about a minute (builds; start-ups are inside each pair's share). GPU memory: two kernel
# workers at a time (one a build), each a CUDA context and a weight bank of a few GB (a sweep worker held 5.3 GB
# at 5,000 cases, results/kernels-0.33.0.md; 300 cases meet fewer shapes): under about 10 GB, and as much pinned
# host memory. Exits 0 when it ran, whatever the verdicts; 2 when it cannot start (no site, no RESULT_DIR).
set -uo pipefail
out=${1:?usage: bash lab/gpu/diff.sh RESULT_DIR}
mkdir -p "$out" || exit 2
py3=${PYTHON3:-python3}
site=${VLLM_SITE:-$HOME/vllm-site}
home=${DIFF_HOME:-$HOME/diff-builds}
budget=${BUDGET_S:-1200}
cases=${CASES:-300}
start=$(date +%s)
[ -d "$site/vllm" ] || { echo "diff.sh: no vLLM site at $site (VLLM_SITE)" >&2; exit 2; }
export TRITON_CACHE_DIR=$home/triton VLLM_USE_FLASHINFER_SAMPLER=0
mkdir -p "$TRITON_CACHE_DIR"

build() {  # build NAME [--bug SPEC]: the build's interpreter on stdout
    "$py3" -m moegate.builds.planted "$home/$1" --python "$py3" --site "$site" "${@:2}" >"$out/build-$1.log" 2>&1 \
        && echo "$home/$1/bin/python"
}
base=$(build base) || { echo "diff.sh: the base build failed: $(tail -1 "$out/build-base.log")" >&2; exit 2; }

pairs=(same moe-reround topk-order act-fp32)
declare -A bug=([same]="" [moe-reround]=moe-reround=3 [topk-order]=topk-order=reverse [act-fp32]=act-fp32=silu)
declare -A most=([same]=200 [moe-reround]=10 [topk-order]=200 [act-fp32]=200)
left=${#pairs[@]}
for pair in "${pairs[@]}"; do
    now=$(date +%s)
    share=$(( (budget - (now - start) - 30) / left ))
    left=$((left - 1))
    if [ "$share" -lt 120 ]; then
        echo "diff.sh: $pair: skipped, ${share} s left of BUDGET_S for it" | tee -a "$out/diff.log"
        continue
    fi
    if [ -n "${bug[$pair]}" ]; then
        pr=$(build "$pair" --bug "${bug[$pair]}") || { echo "diff.sh: $pair: build failed" | tee -a "$out/diff.log"; continue; }
    else
        pr=$(build twin) || { echo "diff.sh: $pair: build failed" | tee -a "$out/diff.log"; continue; }
    fi
    # the tier's budget counts from the workers' release: start-up (two vLLM imports, CUDA) is outside it
    timeout -k 20 "$share" "$pr" -m moegate diff --base-python="$base" --pr-python="$pr" --promise=equivalent \
        --cases="$cases" --seed=1000 --runs="${most[$pair]}" --budget-s=$((share - 90)) \
        --json="$out/$pair.json" >"$out/$pair.log" 2>&1
    rc=$?
    echo "diff.sh: $pair: exit $rc in $(( $(date +%s) - now )) s" | tee -a "$out/diff.log"
    if [ ! -s "$out/$pair.json" ]; then  # judged nothing (exit 2, or cut by the timeout): a stub with the reason
        why=$(grep -E "not judged|FAIL|Error" "$out/$pair.log" | tail -1 | sed 's/^moegate diff: //')
        "$py3" -c 'import json, sys; print(json.dumps({"runs": [], "cases": int(sys.argv[2]), "not_judged": sys.argv[1]}))' \
            "${why:-exit $rc, no report}" "$cases" >"$out/$pair.json"
    fi
done
reports=()
for pair in "${pairs[@]}"; do [ -f "$out/$pair.json" ] && reports+=("$out/$pair.json"); done
[ ${#reports[@]} -gt 0 ] && "$py3" -m lab.gpu.diff_table "${reports[@]}" --out "$out/diff" | tee -a "$out/diff.log"
echo "diff.sh: done in $(( $(date +%s) - start )) s" | tee -a "$out/diff.log"
exit 0
