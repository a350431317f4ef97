#!/usr/bin/env bash
# The H200 A/B runs of issue 19 (results/ab-h200.md, docs/ab.md), from the project root on the device, after
# the nine installs of .gpu/g20/all (0.33.0 in $HOME/vllm-site, lm-eval in $HOME/eval-site, 0.32.0 in
# $HOME/vllm032). Carry .gpu/g20/text (sharegpt.json, gsm8k/train.jsonl) in every call. Each step writes to $OUT.
#   models [WHICH]      both builds (interpreters), then WHICH models (default both): skewed ($HOME/wide)
#                       and/or text ($HOME/wide-text, with its fit check and routing samples); sha256 of every
#                       file; all in $OUT/models.tgz
#   skewed [STARTS]     resume the 2026-11-29 run (results/raw/ab-h200.tar.xz) in $HOME/ab, growing it to
#                       STARTS rounds (default 5), 2 new starts a call
#   text [STARTS]       resume the 2026-12-01 text-routed run (results/raw/ab-text-h200.tar.xz) in $HOME/ab-text,
#                       growing it to STARTS rounds (default 3), 2 new starts a call
# AB_TIMEOUT_S bounds the driver (default 540; a timed-out driver stops its server). The data goes where the
# 2026-11-29 run read it (.gpu/data/...), so the resumed run's workload line is the same.
set -uo pipefail
: "${OUT:?}"
step=$1
shift
export VLLM_USE_FLASHINFER_SAMPLER=0
mkdir -p .gpu/data/gsm8k
[ -f .gpu/data/sharegpt.json ] || cp .gpu/g20/text/sharegpt.json .gpu/data/sharegpt.json
[ -f .gpu/data/gsm8k/train.jsonl ] || cp .gpu/g20/text/gsm8k/train.jsonl .gpu/data/gsm8k/train.jsonl
sha256sum .gpu/data/sharegpt.json .gpu/data/gsm8k/train.jsonl >"$OUT/data-sha256.txt"
S="--max-model-len 4096 --enforce-eager --dtype bfloat16 --offload-backend uva --cpu-offload-gb 64 \
--cpu-offload-params experts --no-enable-prefix-caching --gpu-memory-utilization 0.5 --max-num-seqs 16"
ab() {  # ab MODEL OUTDIR STARTS
    timeout -k 10 "${AB_TIMEOUT_S:-540}" python3 -m moegate.ab --base-python "$HOME/b032/bin/python" \
        --base-label 0.32.0 --base-env VLLM_USE_FLASHINFER_SAMPLER=0 --pr-python "$HOME/b033/bin/python" \
        --pr-label 0.33.0 --pr-env VLLM_USE_FLASHINFER_SAMPLER=0 --model "$1" --server-args "$S" --starts "$3" \
        --concurrency 1,2,3,4,8 --dataset-path .gpu/data/sharegpt.json --output-len 128 --target-seconds 10 \
        --min-rounds 3 --warmup-rounds 2 --out "$2" --resume --max-new-starts 2 --uva-peak-gbps 51
    echo "ab $(basename "$2"): exit $?"
    tar czf "$OUT/$(basename "$2").tgz" -C "$(dirname "$2")" "$(basename "$2")"
}
case $step in
models)
    for v in 032:vllm032 033:vllm-site; do
        python3 -m moegate.vllm.planted "$HOME/b${v%%:*}" --python python3 --site "$HOME/${v#*:}" \
            --site "$HOME/eval-site" >/dev/null || exit 2
    done
    py=$HOME/b033/bin/python
    M=$HOME/models-out  # one archive comes back ($OUT returns only a few files a call)
    mkdir -p "$M"
    which=${1:-both}
    [ "$which" = text ] || (
        t0=$SECONDS
        "$py" -m moegate.model.tiny_model "$HOME/wide" --preset wide --hot-experts 32 --router-skew 1.0 \
            --tokenizer-data .gpu/data/gsm8k/train.jsonl >"$M/wide-build.log" 2>&1
        echo "wide: exit $? in $((SECONDS - t0)) s"
        (cd "$HOME/wide" && sha256sum ./*) >"$M/wide-sha256.txt"
    ) &
    [ "$which" = skewed ] && { wait; tar czf "$OUT/models.tgz" -C "$HOME" models-out; exit 0; }
    t0=$SECONDS
    "$py" -m moegate.model.tiny_model "$HOME/wide-text" --preset wide --tokenizer-data .gpu/data/gsm8k/train.jsonl \
        --device cuda --routing-from results/ab-text-routing/target-e2e-trained.json \
        --routing-text .gpu/data/sharegpt.json >"$M/wide-text-build.log" 2>&1
    echo "wide-text: exit $? in $((SECONDS - t0)) s"
    cp "$HOME/wide-text/moegate_tiny_model.json" "$M/wide-text-build.json"
    (cd "$HOME/wide-text" && sha256sum ./*) >"$M/wide-text-sha256.txt"
    for g in "" --greedy; do
        "$py" -m bench.bench_routing --model "$HOME/wide-text" --text .gpu/data/sharegpt.json --device cuda \
            --routing-json "$M/routing-wide-text${g:+-greedy}.json" --steps 200 \
            ${g:+--sequences 64 --greedy} >"$M/routing-wide-text${g:+-greedy}.log" 2>&1
        echo "routing${g:+ greedy}: exit $?"
    done
    wait
    tar czf "$OUT/models.tgz" -C "$HOME" models-out ;;
skewed)
    [ -d "$HOME/ab" ] || { tar xJf results/raw/ab-h200.tar.xz -C "$HOME" && mv "$HOME/ab-h200" "$HOME/ab"; } || exit 2
    ab "$HOME/wide" "$HOME/ab" "${1:-5}" ;;
text)
    [ -d "$HOME/ab-text" ] || { tar xJf results/raw/ab-text-h200.tar.xz -C "$HOME" && mv "$HOME/ab-text-h200" "$HOME/ab-text"; } \
        || exit 2
    ab "$HOME/wide-text" "$HOME/ab-text" "${1:-3}" ;;
*)
    echo "ab_runs.sh: unknown step $step" >&2; exit 2 ;;
esac
