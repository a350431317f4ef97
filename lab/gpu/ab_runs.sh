#!/usr/bin/env bash
# The H200 A/B runs (docs/design/ab.md; issues 19 and 31), from the project root on the device, after the bring-up of
# lab/gpu/README.md (0.33.0 in $HOME/vllm-site, lm-eval in $HOME/eval-site, 0.32.0 in $HOME/vllm032; `models` and
# `aa` need only the first two). The data (sharegpt.json, gsm8k/train.jsonl) is read from .gpu/data: the
# bring-up's data pack, linked there (`ln -sfn "$HOME/data" .gpu/data`), or .gpu/g20/text carried. Each step is one
# call (or a background job, lab/gpu/background.sh) and writes one archive to $OUT (a call returns only a few
# files).
#   models [skewed|text|both] [nosamples]
#                   both builds (interpreters), then the models (default both): skewed ($HOME/wide) and/or text
#                   ($HOME/wide-text, with its fit check, and its two routing samples unless `nosamples`: they are
#                   deterministic; kept at git show 37892ec:results/ab-text-routing/routing-wide-text-greedy.json.xz); sha256 of every file;
#                   $OUT/models.tgz. `models text nosamples`: about 220 s.
#   aa [eager]      the A/A of issue 31: 0.33.0 against itself on $HOME/wide-text, served as the change description
#                   served (CUDA graphs on), the plan `text` judges by (a first look at 2 starts a build, up to 3:
#                   the completed A/A of 2026-12-03, capped at 2, resolved 1 in flight only), --expect-same; with
#                   `eager`, the same with --enforce-eager. Prints the start-to-start spread of the decode time
#                   (moegate.ab.spread, both labels one build: 3 degrees of freedom) and the rule's false-verdict and
#                   power figures on runs drawn like it (moegate.ab.simulate); $OUT/aa[-eager].tgz. About 540 s, then
#                   300 s resumed (eager: longer; the committed eager runs already give its spread: run it last if at all).
#   warm            both builds' compile caches for `text`, filled while other GPU work runs: one server start each
#                   (side by side) on $HOME/wide-text with `text`'s flags and a small GPU memory share
#                   (lab/gpu/warm_server.py; not part of vLLM's cache key). The runs then start as a runner that
#                   keeps VLLM_CACHE_ROOT would (results/ab-text-graphs-h200.md, "The second attempt"). Nothing
#                   measured.
#   text            the A/B of issue 31: 0.32.0 against 0.33.0 on $HOME/wide-text, graphs on, a first look at 2
#                   starts a build and up to 3 (AB_MIN_STARTS / AB_STARTS change them; the A/A's spread resolves
#                   +-5 % at 1 and 8 in flight by 2 and the rest by 3: results/ab-aa-h200.md), 4 new starts a call
#                   (AB_NEW); call it again to resume until the run is over; $OUT/ab-text-graphs.tgz. About 540 s,
#                   then 300 s. Builds $HOME/b032 itself where `models` ran before 0.32.0 was installed.
# `aa` and `text` measure the runner first (moegate preflight, once a run folder): the report's evidence columns
# take its UVA read bandwidth (issue 31 item 6), and the run folder keeps the file. Their expert bytes a step come
# from the model's greedy routing sample (--routing): `models text`'s own where it made one, else the committed one
# (git show 37892ec:results/ab-text-routing/routing-wide-text-greedy.json.xz: the sample is deterministic for the model's sha256, results/ab-text-routing.md).
# AB_TIMEOUT_S bounds the driver (default 520: with the 45 s of `timeout -k` it stays inside a 600-s call; a
# timed-out driver stops its server within seconds and keeps every finished start).
# The data goes where the earlier runs read it (.gpu/data/...), so their workload line is the same.
set -uo pipefail
: "${OUT:?}"
step=$1
shift
export VLLM_USE_FLASHINFER_SAMPLER=0
mkdir -p .gpu/data/gsm8k
[ -f .gpu/data/sharegpt.json ] || cp .gpu/g20/text/sharegpt.json .gpu/data/sharegpt.json
[ -f .gpu/data/gsm8k/train.jsonl ] || cp .gpu/g20/text/gsm8k/train.jsonl .gpu/data/gsm8k/train.jsonl
sha256sum .gpu/data/sharegpt.json .gpu/data/gsm8k/train.jsonl >"$OUT/data-sha256.txt"
# the change description's serving flags: CUDA graphs on (no --enforce-eager), every expert UVA-offloaded
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
S="$(PYTHONPATH=$ROOT python3 -m tooling.serving --base-only --graphs --uva --concurrency 16) --gpu-memory-utilization 0.5"
SHAPE=experts=128,top_k=8,hidden=2048,intermediate=768,layers=4,dtype=bf16
ab() {  # ab OUTDIR BASE_PY BASE_LABEL PR_PY PR_LABEL SERVER_ARGS STARTS MIN_STARTS NEW [more moegate.ab options]
    local out=$1 bpy=$2 blab=$3 ppy=$4 plab=$5 args=$6 starts=$7 first=$8 new=$9
    shift 9
    # -k 45: the driver's stop of its server ends before timeout's KILL (a normal stop's 30 s grace would fit too)
    timeout -k 45 "${AB_TIMEOUT_S:-520}" python3 -m moegate.ab --base-python "$bpy" --base-label "$blab" \
        --base-env VLLM_USE_FLASHINFER_SAMPLER=0 --pr-python "$ppy" --pr-label "$plab" \
        --pr-env VLLM_USE_FLASHINFER_SAMPLER=0 --model "$HOME/wide-text" --server-args "$args" \
        --starts "$starts" --min-starts "$first" --concurrency 1,2,3,4,8 --dataset-path .gpu/data/sharegpt.json \
        --output-len 128 --target-seconds 5 --min-rounds 3 --warmup-rounds 1 --out "$out" --resume \
        --max-new-starts "$new" --moe-shape "$SHAPE" "$@" >"$out.stdout" 2>"$out.stderr"
    echo "ab $(basename "$out"): exit $?"
    grep -h "^\[ab\] look\|over at\|moegate.ab:" "$out.stderr" | tail -8
}
# shellcheck source=lab/gpu/sites.sh
. "$(dirname "$0")/sites.sh"  # site_ready, wait_site
b032() {  # $HOME/b032 from a complete 0.32.0 site, waiting SITE_WAIT_S (300) for one: started during the bring-up,
    # `warm` and `text` must not build it from a site still arriving
    [ -x "$HOME/b032/bin/python" ] && return 0
    wait_site "$HOME/vllm032" ab_runs.sh || return 1
    python3 -m moegate.builds.planted "$HOME/b032" --python python3 --site "$HOME/vllm032" --site "$HOME/eval-site" >/dev/null
}
ROUTE=()
routing() {  # the greedy routing sample of $HOME/wide-text for the evidence columns (a missing one is said, not fatal)
    local f=$HOME/models-out/routing-wide-text-greedy.json
    if [ ! -f "$f" ]; then
        f=$HOME/routing-wide-text-greedy.json
        [ -s "$f" ] || { git -C "$ROOT" show 37892ec:results/ab-text-routing/routing-wide-text-greedy.json.xz | xz -dc >"$f"; } 2>/dev/null || rm -f "$f"
    fi
    if [ -s "$f" ]; then ROUTE=(--routing "$f"); else echo "ab_runs.sh: no routing sample: expert bytes from the uniform model"; fi
}
PRE=()
preflight() {  # preflight DIR: the runner's UVA read bandwidth for the report, measured once a run folder; a failed
    # check is printed and the A/B still runs (its report then says which figure it used instead)
    [ -f "$1.preflight.json" ] || "$HOME/b033/bin/python" -m moegate preflight --json "$1.preflight.json" \
        --model "$HOME/wide-text" >"$1.preflight.log" 2>&1 || tail -5 "$1.preflight.log"
    grep -hi "uva\|^preflight" "$1.preflight.log" | head -3
    [ -f "$1.preflight.json" ] && PRE=(--preflight "$1.preflight.json")
}
pack() {  # pack DIR: the run folder, its driver output and the tables beside it, one archive
    local d b
    d=$(dirname "$1") b=$(basename "$1")
    (cd "$d" && tar czf "$OUT/$b.tgz" "$b" "$b".stdout "$b".stderr $(ls "$b".*.md "$b".preflight.* 2>/dev/null))
}
case $step in
models)
    for v in 032:vllm032 033:vllm-site; do
        # 0.32.0 only where its install is complete: `aa` needs 0.33.0 alone, `text` both and builds b032 itself
        site_ready "$HOME/${v#*:}" ||
            { echo "models: no complete \$HOME/${v#*:}, b${v%%:*} not built"; continue; }
        python3 -m moegate.builds.planted "$HOME/b${v%%:*}" --python python3 --site "$HOME/${v#*:}" \
            --site "$HOME/eval-site" >/dev/null || exit 2
    done
    py=$HOME/b033/bin/python
    M=$HOME/models-out  # one archive comes back ($OUT returns only a few files a call)
    mkdir -p "$M"
    which=${1:-both}
    samples=${2:-samples}
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
    grep -h "model.safetensors" "$M/wide-text-sha256.txt"  # 258510b8... on 2026-12-01 (results/ab-text-routing.md)
    if [ "$samples" != nosamples ]; then
        for g in "" --greedy; do
            "$py" -m bench.bench_routing --model "$HOME/wide-text" --text .gpu/data/sharegpt.json --device cuda \
                --routing-json "$M/routing-wide-text${g:+-greedy}.json" --steps 200 \
                ${g:+--sequences 64 --greedy} >"$M/routing-wide-text${g:+-greedy}.log" 2>&1
            echo "routing${g:+ greedy}: exit $?"
        done
    fi
    wait
    tar czf "$OUT/models.tgz" -C "$HOME" models-out ;;
aa)
    [ -d "$HOME/wide-text" ] || { echo "ab_runs.sh aa: no \$HOME/wide-text (run 'models text nosamples' first)" >&2; exit 2; }
    py=$HOME/b033/bin/python
    if [ "${1:-}" = eager ]; then
        dir=$HOME/aa-eager args="--enforce-eager $S"
    else
        dir=$HOME/aa args=$S
    fi
    preflight "$dir"
    routing
    ab "$dir" "$py" 0.33.0-a "$py" 0.33.0-b "$args" "${AB_STARTS:-3}" "${AB_MIN_STARTS:-2}" "${AB_NEW:-4}" \
        --host-sorted both --expect-same \
        "${PRE[@]}" "${ROUTE[@]}"
    python3 -m moegate ab-spread "$dir" --same-build | tee "$dir.spread.md"
    # SIM_RUNS=0 leaves the simulation to the machine the archive comes back to (the call's 600 s are the A/A's)
    sim=${SIM_RUNS:-20000}
    [ "$sim" -gt 0 ] && python3 -m moegate ab-simulate "$dir" --same-build --runs "$sim" --seed 0 | tee "$dir.simulate.md"
    pack "$dir" ;;
warm)
    [ -d "$HOME/wide-text" ] || { echo "ab_runs.sh warm: no \$HOME/wide-text (run 'models text nosamples' first)" >&2; exit 2; }
    b032 || exit 2
    for b in 032 033; do  # side by side: nothing is measured
        ( python3 -m lab.gpu.warm_server "$HOME/b$b/bin/python" "$HOME/wide-text" "$OUT/warm-$b.log" "$S" \
            --env VLLM_USE_FLASHINFER_SAMPLER=0 --util "${WARM_UTIL:-0.15}"
          echo "warm $b: exit $?" ) &
    done
    wait ;;
text)
    [ -d "$HOME/wide-text" ] || { echo "ab_runs.sh text: no \$HOME/wide-text (run 'models text nosamples' first)" >&2; exit 2; }
    b032 || exit 2
    dir=$HOME/ab-text-graphs
    preflight "$dir"
    routing
    ab "$dir" "$HOME/b032/bin/python" 0.32.0 "$HOME/b033/bin/python" 0.33.0 "$S" "${AB_STARTS:-3}" \
        "${AB_MIN_STARTS:-2}" "${AB_NEW:-4}" "${PRE[@]}" "${ROUTE[@]}"
    python3 -m moegate ab-spread "$dir" | tee "$dir.spread.md"
    pack "$dir" ;;
*)
    echo "ab_runs.sh: unknown step $step (models, aa, warm, text)" >&2; exit 2 ;;
esac
