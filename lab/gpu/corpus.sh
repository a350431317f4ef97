#!/usr/bin/env bash
# Issue 45 item 4 on the GPU: the real-bug corpus (power/real-bugs.toml, 10 fused-MoE bugs vLLM shipped and fixed,
# re-planted into 0.33.0's Python) through `moegate gate --tiers dispatch,kernels` with the ci profile, as the kernels
# leg runs it; then, if the budget still holds it, the GPU power report's re-run (the kernel and offload groups:
# lab/gpu/offload_runs.sh power-all, results/power-gpu-h200.md).
#
#   bash lab/gpu/corpus.sh RESULT_DIR        from the checkout's root, after the vLLM 0.33.0 bundle install
#
# It assumes python3 (torch, Triton, pytest, hypothesis: the image's) and vLLM 0.33.0 unpacked in VLLM_SITE, nothing
# else. Each bug gets a build (python3 -m moegate.builds.planted's venv) that sees a mirror of VLLM_SITE's vllm package
# with the bug's edit, and one `moegate gate` run (moegate.power.corpus_run); the unedited mirror's gate, the baseline,
# runs first and must PASS. A gate ends at its first failing behaviour test (a kill needs one; survivors, and the
# baseline, run the whole gate): its tests run cheapest kill first (moegate.power.corpus_stop.run_order: the kernel
# tests that start no engine, the dispatch tier, then the engine-starting files), and its diff tier runs only where
# the pytest tiers killed nothing (moegate.power.corpus_run.gate_steps).
#
# Environment:
#   BUDGET_S     wall seconds for all of it (default 2400); the script stops its gates before and exits 0
#   JOBS         gates side by side (default 3, at most 4: 10 gates at once ran an 80 GB H100 out of memory)
#   VLLM_SITE    vLLM 0.33.0's unpacked site (default $HOME/vllm-site)
#   POWER        1 (default): the power re-run after the corpus if at least POWER_MIN_S (default 900) is left; 0: not
#   POWER_SITE   cosmic-ray's site (default $HOME/power-site; without it the power re-run is skipped, and says how to
#                get it: ../shared/tools/gpu-wheelhouse.sh .gpu/power "cosmic-ray>=8.7,<9" here, its install there)
#   TRITON_CACHE_DIR  shared by every gate (default $HOME/triton-corpus): an unedited kernel compiles once
#   CORPUS_JOBS, CORPUS_TIERS  JOBS and TIERS for this script alone, where a wave's other scripts read those names
#                (compiled.sh's JOBS is nvcc's, reach.sh's TIERS its own): e.g. CORPUS_TIERS=kernels,diff beside the CPU
#                run, which holds the dispatch tier's kills
#   ONLY         bug ids to run (space-separated; default every bug); PYTHON (python3) and TIERS (dispatch,kernels,diff: the leg's differential tier against the baseline build):
#                for a rehearsal on a CPU (PYTHON=a vLLM env's python, VLLM_SITE=its site-packages, TIERS=dispatch)
#
# Time on an H200, expected (not yet measured): the corpus about 20-25 minutes at JOBS=3 (11 gates; the ci kernel
# tier alone took 481 s from a cold Triton cache, results/census.md; a survivor runs all of it, a killed bug stops in
# test_kernel_census.py or test_kernel_properties.py, 3-5 minutes in); the power re-run about 13 minutes (758 s on
# 2026-12-02). GPU memory: a gate peaks at about 10-12 GiB (the 32-bit index boundary calls of test_kernel_census.py,
# which skip below 16 GiB free, and then the bug can survive for it: a survivor's skips are in the page), plus the
# kernel tier's engines (fixed KV cache); JOBS=3 about 35 GiB.
#
# Writes RESULT_DIR/corpus/ (summary.json, summary.md, and per bug ID/gate.log, gate.xml, result.json),
# RESULT_DIR/corpus.log, RESULT_DIR/power/ (offload_runs.sh power-all's shards and joined reports) and
# RESULT_DIR/summary.txt. Here, afterwards (the CPU run's summary is committed beside the page):
#   python -m moegate power corpus report RESULT_DIR/corpus results/power-real-bugs-cpu.json --out results/power-real-bugs.md
# Exit status: 0 when it ran, whatever the gates said; 2 when it could not start (no vLLM site, bad input).
set -uo pipefail
out=${1:-${OUT:-}}
[ -n "$out" ] || { echo "corpus.sh: usage: bash lab/gpu/corpus.sh RESULT_DIR" >&2; exit 2; }
[ -f lab/gpu/corpus.sh ] || { echo "corpus.sh: run it from the checkout's root" >&2; exit 2; }
budget=${BUDGET_S:-2400}
jobs=${CORPUS_JOBS:-${JOBS:-3}}
site=${VLLM_SITE:-$HOME/vllm-site}
[[ $budget =~ ^[0-9]+$ && $jobs =~ ^[1-4]$ ]] || { echo "corpus.sh: BUDGET_S is whole seconds, JOBS 1 to 4" >&2; exit 2; }
[ -d "$site/vllm" ] || { echo "corpus.sh: no vllm package in VLLM_SITE=$site (install the 0.33.0 bundle there)" >&2; exit 2; }
mkdir -p "$out"
t0=$SECONDS
left() { echo $((budget - (SECONDS - t0))); }
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/triton-corpus}
export VLLM_USE_FLASHINFER_SAMPLER=0 MOEGATE_REQUIRE_CUDA=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
power_min=${POWER_MIN_S:-900}
reserve=0
[ "${POWER:-1}" = 1 ] && reserve=$power_min
corpus_budget=$(($(left) - 60 - reserve))
[ "$corpus_budget" -ge 300 ] || corpus_budget=$(($(left) - 60))  # too small for both: the corpus first

echo "corpus.sh: $(date -u '+%F %T') UTC, budget ${budget} s (corpus ${corpus_budget} s), JOBS=$jobs, site $site" |
    tee "$out/summary.txt"
only=()
for id in ${ONLY:-}; do only+=(--only "$id"); done
tiers=${CORPUS_TIERS:-${TIERS:-dispatch,kernels,diff}}
MOEGATE_CORPUS_COMMAND="bash lab/gpu/corpus.sh RESULT_DIR (JOBS=$jobs, TIERS=$tiers, BUDGET_S=$budget${ONLY:+, ONLY=$ONLY})" \
    timeout --signal=TERM --kill-after=30 $((corpus_budget + 60)) \
    "${PYTHON:-python3}" -m moegate power corpus run --vllm-python "${PYTHON:-python3}" --site "$site" \
    --tiers "$tiers" --jobs "$jobs" --budget-s "$corpus_budget" --timeout-s 1500 \
    --min-start-s 240 "${only[@]}" --out "$out/corpus" >"$out/corpus.log" 2>&1
rc=$?
echo "corpus: exit $rc (0: every baseline passed and every survivor is explained; 1: not; 2: bad input)" |
    tee -a "$out/summary.txt"
grep '^corpus: ' "$out/corpus.log" | tee -a "$out/summary.txt" >/dev/null
sed -n '/^## /,/^## The corpus/p' "$out/corpus/summary.md" 2>/dev/null | head -n 40 | tee -a "$out/summary.txt"

if [ "${POWER:-1}" != 1 ]; then
    echo "power: not run (POWER=${POWER:-})" | tee -a "$out/summary.txt"
elif [ "$(left)" -lt "$power_min" ]; then
    echo "power: not run, $(left) s of the budget left (it needs POWER_MIN_S=$power_min)" | tee -a "$out/summary.txt"
elif ! ls -d "${POWER_SITE:-$HOME/power-site}"/cosmic_ray >/dev/null 2>&1; then
    echo "power: not run, no cosmic-ray in POWER_SITE=${POWER_SITE:-$HOME/power-site} (here: ../shared/tools/gpu-wheelhouse.sh .gpu/power \"cosmic-ray>=8.7,<9\"; there: bash .gpu/power/part1/install.sh \$HOME/power-site)" |
        tee -a "$out/summary.txt"
else
    shard_s=$(($(left) - 180))
    echo "power: power-all, each shard cut at ${shard_s} s" | tee -a "$out/summary.txt"
    mkdir -p "$out/power"
    OUT=$out/power POWER_SHARD_TIMEOUT_S=$shard_s timeout --signal=TERM --kill-after=30 $(($(left) - 60)) \
        bash lab/gpu/offload_runs.sh power-all >"$out/power.log" 2>&1
    echo "power: exit $? in all" | tee -a "$out/summary.txt"
    grep -E '^power ' "$out/power.log" | tee -a "$out/summary.txt" >/dev/null
fi
echo "corpus.sh: done in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
exit 0
