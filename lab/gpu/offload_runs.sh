#!/usr/bin/env bash
# Offload truth and the GPU power runs (issue 30 items 4 and 5; results/offload-truth.md, results/power-gpu.md),
# from the project root on the device, after the three vLLM 0.33.0 bundle installs into $VLLM_SITE
# (default $HOME/vllm-site). One step per `run` call; each writes its files under $OUT.
#   truth                 every run of moegate.offload.plan side by side: bf16 (no offload, all experts, a
#                         budget of one w13), fp8-block, w8a8-int8, w4a16 on Triton, w4a16 and fp8-block on Marlin
#                         (measured), the planted uva=noop / uva=back builds (must FAIL): about 3-5 min
#   tests                 the GPU tests: tests/kernels/test_offload_layer_truth.py (18 cases, seconds) and
#                         tests/kernels/test_offload_truth.py (the plan's gated runs again, as a test): about 4 min
#   power GROUP K/N       moegate.power on the GPU: GROUP offload (killed by the layer truth test and the marker
#                         lifecycle) or kernel (killed by the kernel properties and the census's kernel tests: the
#                         biases and clamp limits are drawn there only), shard K of N of the group's
#                         mutants, unreached ones pruned by one traced run. offload: 94 mutants, 0/5 is ~19 of
#                         them, ~15-20 s each plus ~2 min of baseline and trace; kernel: 65 mutants, 0/6 is ~11, ~25 s
#                         each plus ~3 min: each about 7-9 min (needs cosmic-ray in POWER_SITE, default
#                         $HOME/power-site: ../shared/tools/gpu-wheelhouse.sh .gpu/power "cosmic-ray>=8.7,<9" here,
#                         then bash .gpu/power/part1/install.sh $HOME/power-site there)
#   power-all             every shard of both groups side by side on the one GPU (offload 0..4/5, kernel 0..5/6,
#                         STAGGER_S apart), each bounded by POWER_SHARD_TIMEOUT_S (default 1500: longer than a call,
#                         so run it through lab/gpu/background.sh) with POWER_MUTANT_TIMEOUT_S per mutant (default
#                         240: a mutant's tests run beside ten others, and a mutant cut by its timeout would count as
#                         killed), then each group's shards joined into $OUT/power-offload and $OUT/power-kernel
#                         (python -m moegate.power join). The builds are made once, before the shards start.
#                         POWER_GROUPS (default "offload kernel") names the groups whose shards run.
# The script exits with its step's status.
set -uo pipefail
: "${OUT:?}"
export VLLM_USE_FLASHINFER_SAMPLER=0 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/triton-offload}
site=${VLLM_SITE:-$HOME/vllm-site}
build() {  # DEST SITE...: made once (shards side by side must not remake a build another shard runs from)
    [ -x "$1/bin/python" ] || python3 -m moegate.builds.planted "$1" --python python3 "${@:2}" >/dev/null || exit 2
    echo "$1/bin/python"
}
step=$1
shift
case $step in
truth)
    py=$(build "$HOME/offload-b033" --site "$site")
    timeout 560 "$py" -m moegate offload-truth --python python3 --site "$site" --out "$OUT/offload-truth" \
        --work "$HOME/offload-work" --timeout 480 >"$OUT/offload-truth.log" 2>&1
    rc=$?
    sed -n '1,40p' "$OUT/offload-truth/offload-truth.md" 2>/dev/null
    echo "truth: exit $rc" ;;
tests)
    py=$(build "$HOME/offload-b033" --site "$site")
    MOEGATE_ENGINE_TIMEOUT=420 timeout 560 "$py" -m pytest tests/kernels/test_offload_layer_truth.py \
        tests/kernels/test_offload_truth.py -q -p no:cacheprovider --junitxml="$OUT/offload-tests.xml" \
        >"$OUT/offload-tests.log" 2>&1
    rc=$?
    tail -n 25 "$OUT/offload-tests.log"
    echo "tests: exit $rc" ;;
power)
    group=${1:?power GROUP K/N}
    shard=${2:?power GROUP K/N}
    py=$(build "$HOME/offload-b033" --site "$site")
    tool=$(build "$HOME/offload-power-tool" --site "${POWER_SITE:-$HOME/power-site}")
    # the tests that reach each group's code; -k's expression stays one argument through the harness's shlex split
    case $group in
    offload) cmd="{python} -m pytest tests/kernels/test_offload_layer_truth.py tests/kernels/test_marker_lifecycle.py -x -q -p moegate.power.plugin -p no:cacheprovider" ;;
    kernel) cmd="{python} -m pytest tests/kernels/test_kernel_properties.py tests/kernels/test_kernel_census.py tests/kernels/test_kernel_fp8_paths.py -k 'test_output_matches_reference or test_fp8_weights or test_census_activations or test_biases or test_naive_and_sorted_agree_bitwise_with_biases or test_block_fp8 or test_static_0d_fp8' -x -q -p moegate.power.plugin -p no:cacheprovider" ;;
    *) echo "power: GROUP is offload or kernel" >&2; exit 2 ;;
    esac
    out="$OUT/power-$group-${shard/\//of}"
    MOEGATE_POWER_COMMAND="lab/gpu/offload_runs.sh power $group $shard" \
        timeout "${POWER_SHARD_TIMEOUT_S:-580}" "$tool" -m moegate.power --vllm-python "$py" --regions "$group" \
        --prune-unreached --shard "$shard" --timeout "${POWER_MUTANT_TIMEOUT_S:-90}" --test-command "$cmd" \
        --out "$out" >"$out.log" 2>&1
    rc=$?
    sed -n '1,12p' "$out/power.md" 2>/dev/null
    echo "power $group $shard: exit $rc" ;;
power-all)
    build "$HOME/offload-b033" --site "$site" >/dev/null
    tool=$(build "$HOME/offload-power-tool" --site "${POWER_SITE:-$HOME/power-site}")
    export POWER_SHARD_TIMEOUT_S=${POWER_SHARD_TIMEOUT_S:-1500} POWER_MUTANT_TIMEOUT_S=${POWER_MUTANT_TIMEOUT_S:-240}
    t0=$SECONDS
    groups=${POWER_GROUPS:-offload kernel}
    for s in offload:0/5 offload:1/5 offload:2/5 offload:3/5 offload:4/5 \
        kernel:0/6 kernel:1/6 kernel:2/6 kernel:3/6 kernel:4/6 kernel:5/6; do
        [[ " $groups " == *" ${s%%:*} "* ]] || continue
        k=${s#*:}
        bash "$0" power "${s%%:*}" "$k" >"$OUT/step-${s%%:*}-${k/\//of}.txt" 2>&1 &
        sleep "${STAGGER_S:-5}"
    done
    wait
    echo "power-all: shards ended in $((SECONDS - t0)) s"
    cat "$OUT"/step-*.txt | grep "^power "
    rc=0
    for g in $groups; do
        done_shards=$(ls -d "$OUT/power-$g"-*of[0-9]/power.json 2>/dev/null | xargs -r -n1 dirname)  # a cut one: MISSING
        [ -n "$done_shards" ] || { echo "power $g: no shard finished"; rc=1; continue; }
        "$tool" -m moegate.power join $done_shards --out "$OUT/power-$g" \
            --command "lab/gpu/offload_runs.sh power-all (shard timeout ${POWER_SHARD_TIMEOUT_S} s, mutant timeout ${POWER_MUTANT_TIMEOUT_S} s)" \
            >"$OUT/power-$g.join.log" 2>&1
        r=$?
        echo "power $g joined: exit $r"
        sed -n '3p' "$OUT/power-$g/power.md" 2>/dev/null || tail -n 1 "$OUT/power-$g.join.log"
        [ $r -eq 0 ] || rc=$r
    done ;;
*)
    echo "usage: lab/gpu/offload_runs.sh truth | tests | power offload|kernel K/N | power-all" >&2
    rc=2 ;;
esac
exit $rc
