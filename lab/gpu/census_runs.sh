#!/usr/bin/env bash
# Issue 30's GPU steps for the census work (docs/design/census.md, docs/design/kernels.md), from the project root on the
# device, after the three vLLM 0.33.0 bundle installs into $HOME/census-vllm-site (own names: other sessions
# share the machine). Each step writes its log and JUnit to $OUT.
#   census-tests          the new kernel tests alone (tests/kernels/test_kernel_census.py), cold Triton cache
#   tier NAME             the whole kernel tier under the ci profile on a cold Triton cache (issue 30: < 6 min)
#   dispatch              the dispatch tier on the GPU (census, dispatch sites, index width; decision-only)
# STEP_TIMEOUT_S replaces a step's timeout (a call's limit is 600 s). A tier cut by its timeout gets SIGINT,
# so pytest still writes its JUnit and per-test durations (the step prints exit 124). The summaries keep the
# first lines with sed, not head (see systematic_runs.sh: a head under pipefail turned a clean run into 141).
set -uo pipefail
rc=0
: "${OUT:?}"
export VLLM_USE_FLASHINFER_SAMPLER=0 MOEGATE_PROFILE=${MOEGATE_PROFILE:-ci} MOEGATE_REQUIRE_VLLM=1
site=${CENSUS_SITE:-$HOME/census-vllm-site}
build() { python3 -m moegate.builds.planted "$1" --python python3 "${@:2}" >/dev/null || exit 2; echo "$1/bin/python"; }
summary() { grep -E "passed|failed|skipped|error|exit" "$1" | sed -n 1,60p; }
step=$1
shift
case $step in
census-tests)
    export TRITON_CACHE_DIR=$HOME/triton-census-new && rm -rf "$TRITON_CACHE_DIR"
    py=$(build "$HOME/census-build" --site "$site")
    start=$(date +%s)
    timeout -s INT -k 10 "${STEP_TIMEOUT_S:-540}" "$py" -m pytest tests/kernels/test_kernel_census.py -q -rfEs \
        --durations=0 --junitxml="$OUT/census-tests.xml" >"$OUT/census-tests.log" 2>&1
    rc=$?; echo "census-tests: exit $rc in $(( $(date +%s) - start )) s"; summary "$OUT/census-tests.log" ;;
tier)
    n=$1
    export TRITON_CACHE_DIR=$HOME/triton-census-$n && rm -rf "$TRITON_CACHE_DIR"
    py=$(build "$HOME/census-build" --site "$site")
    start=$(date +%s)
    timeout -s INT -k 10 "${STEP_TIMEOUT_S:-570}" "$py" -m pytest tests/kernels -q -rfEs -s --durations=0 \
        --junitxml="$OUT/$n.xml" >"$OUT/$n.log" 2>&1
    rc=$?; echo "$n: exit $rc in $(( $(date +%s) - start )) s (cold Triton cache)"; summary "$OUT/$n.log" ;;
dispatch)
    py=$(build "$HOME/census-build" --site "$site")
    timeout -s INT -k 10 "${STEP_TIMEOUT_S:-400}" "$py" -m pytest tests/dispatch -q -rfEs --durations=15 \
        --junitxml="$OUT/dispatch.xml" >"$OUT/dispatch.log" 2>&1
    rc=$?; echo "dispatch: exit $rc"; summary "$OUT/dispatch.log" ;;
*)
    echo "census_runs.sh: unknown step $step" >&2; exit 2 ;;
esac
exit "$rc"
