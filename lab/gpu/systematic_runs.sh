#!/usr/bin/env bash
# The aggregate check's H200 runs (results/kernels-systematic.md), from the project root on the device,
# after the three vLLM 0.33.0 bundle installs into $HOME/agg-vllm-site (own names: other sessions share the machine). Each step writes its log and JSON to $OUT.
#   probe                 lab/gpu/probes/tf32_operands.py: how tl.dot reads float32 operands
#   sweep NAME [ARGS]     moegate.kernels.sweep, 5,000 cases from seed 0, 8 workers (ARGS replace the defaults)
#   tier NAME             the kernel tier under the ci profile (pytest tests/kernels), junit and log
#   plant                 a copy of vLLM at $HOME/vllm-plant whose moe_sum scales by 1 + $MOEGATE_PLANT_EPS
#   planted-tier EPS      the kernel tier (ci) on the planted copy
#   planted-sweep EPS N   moegate.kernels.sweep, N cases from seed 0, on the planted copy
# STEP_TIMEOUT_S replaces a step's timeout and STEP_BUDGET_S a sweep's --budget-s, so several steps fit one
# call (the call's limit is 600 s); MOEGATE_PROFILE (default ci) picks the tier's profile, e.g. nightly.
# A tier cut by its timeout gets SIGINT (then SIGKILL 10 s later), so pytest still writes its JUnit, its
# per-test durations and where it was interrupted (the step still prints exit 124).
# The script exits with its step's status. The summaries keep the first lines with sed, not head: under
# pipefail a head that stops reading turns grep's SIGPIPE into exit 141 (a clean sweep reported 141 so).
set -uo pipefail
rc=0
: "${OUT:?}"
export VLLM_USE_FLASHINFER_SAMPLER=0 TRITON_CACHE_DIR=$HOME/triton-agg MOEGATE_PROFILE=${MOEGATE_PROFILE:-ci}
site=${AGG_SITE:-$HOME/agg-vllm-site}
plant=$HOME/agg-vllm-plant
# builds are interpreters (python -m moegate.builds.planted): the site's, and the planted copy's ahead of the site
build() { python3 -m moegate.builds.planted "$1" --python python3 "${@:2}" >/dev/null || exit 2; echo "$1/bin/python"; }
step=$1
shift
case $step in
probe)
    py=$(build "$HOME/agg-build" --site "$site")
    "$py" -m lab.gpu.probes.tf32_operands --json "$OUT/tf32.json" 2>&1 | tee "$OUT/tf32.log"; rc=$? ;;
sweep)
    n=$1; shift
    args=("$@"); [ ${#args[@]} -eq 0 ] && args=(--cases 5000 --workers 8 --budget-s "${STEP_BUDGET_S:-400}")
    py=$(build "$HOME/agg-build" --site "$site")
    timeout "${STEP_TIMEOUT_S:-540}" "$py" -m moegate.kernels.sweep "${args[@]}" --json "$OUT/$n.json" >"$OUT/$n.log" 2>&1
    rc=$?; echo "$n: exit $rc"; grep -E "^(bench_kernels|worst|systematic|  )" "$OUT/$n.log" | sed -n 1,70p ;;
tier)
    n=$1
    py=$(build "$HOME/agg-build" --site "$site")
    timeout -s INT -k 10 "${STEP_TIMEOUT_S:-500}" "$py" -m pytest tests/kernels -q -rfEs -s --durations=0 \
        --junitxml="$OUT/$n.xml" >"$OUT/$n.log" 2>&1
    rc=$?; echo "$n: exit $rc"; grep -E "systematic|DETECTED|passed|failed|skipped|error" "$OUT/$n.log" | tail -40 ;;
plant)
    python3 -m lab.gpu.plant_moe_scale --site "$site" --dest "$plant"; rc=$? ;;
planted-tier)
    eps=$1
    py=$(build "$HOME/agg-plant-build" --site "$plant" --site "$site")
    MOEGATE_PLANT_EPS=$eps timeout -s INT -k 10 "${STEP_TIMEOUT_S:-400}" "$py" -m pytest tests/kernels -q -rfEs -s \
        --junitxml="$OUT/planted-tier-$eps.xml" >"$OUT/planted-tier-$eps.log" 2>&1
    rc=$?; echo "planted-tier $eps: exit $rc"; grep -E "systematic|DETECTED|passed|failed|skipped|error" "$OUT/planted-tier-$eps.log" | tail -60 ;;
planted-sweep)
    eps=$1 n=$2
    py=$(build "$HOME/agg-plant-build" --site "$plant" --site "$site")
    MOEGATE_PLANT_EPS=$eps timeout "${STEP_TIMEOUT_S:-300}" "$py" -m moegate.kernels.sweep --cases "$n" --workers 8 \
        --budget-s "${STEP_BUDGET_S:-200}" --json "$OUT/planted-sweep-$eps.json" >"$OUT/planted-sweep-$eps.log" 2>&1
    rc=$?; echo "planted-sweep $eps: exit $rc"; grep -E "^(systematic|  )" "$OUT/planted-sweep-$eps.log" | sed -n 1,50p ;;
*)
    echo "systematic_runs.sh: unknown step $step" >&2; exit 2 ;;
esac
exit "$rc"
