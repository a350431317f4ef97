#!/usr/bin/env bash
# Issue 45 item 1 on the GPU: what the dispatch and kernel tiers exercise of vLLM 0.33.0's fused MoE (docs/design/reach.md).
#
#   bash lab/gpu/reach.sh RESULT_DIR          from the checkout's root on the device machine
#
# Runs both tiers under the ci profile, in one pytest session under coverage.py (branch coverage of vLLM's
# fused-MoE package and the helpers it calls), with the reach plugin recording every Triton kernel variant the
# session compiles (its behaviour flags and divisibility) and which of the reference's conditions each checked
# case made matter: `python -m moegate.reach run --tiers dispatch,kernels`. Then it renders the report from that
# record and the committed CPU record (a preview; the lead regenerates the committed page here, see below).
#
# Needs: vLLM 0.33.0 installed into $VLLM_SITE (default $HOME/vllm-site, from ../shared/tools/vllm-offline-bundle.sh),
# and coverage.py in the image's Python (7.16.2 there: shared/tools/gpu-image-packages.txt); nothing else. The
# build is an interpreter (moegate.builds.planted) that sees the image's packages and the site. REACH_PYTHON names an
# interpreter with vLLM and coverage.py to use instead (a rehearsal on a CPU: TIERS=dispatch). TIERS overrides the
# tiers (default dispatch,kernels). BUDGET_S (default 560) bounds the wall time: the tiers get what is left after
# the build and a 45 s reserve for the reduction and the report, and are interrupted (still recorded, marked
# stopped_by_budget) when it is spent.
#
# Takes about 5-7 minutes on an H100/H200: the ci kernel tier took 189 s alone on an H200 with an empty Triton
# cache; coverage.py slows the Python around the kernels (the engine starts of the layer tests most), not the
# kernels; the dispatch tier adds about a minute. The Triton cache is $HOME/triton-reach (kept: a variant loaded
# from the disk cache is still recorded, Triton's hook runs before its cache lookup). GPU memory: the kernel
# tier's weight bank (a few GB) and, for the two calls at the 32-bit index boundary, about 10 GiB more (that test
# skips below 16 GiB free, and then the report shows the 64-bit row index condition as not exercised).
#
# RESULT_DIR gets: reach-*.json (the record, about 0.5 MB), reach.log (pytest's output), junit.xml, session.json,
# coverage.json.xz (coverage.py's own report of the measured files), report/reach.md and report/reach.json (the
# preview), summary.txt. Exit 0 when it ran, whatever the tiers' verdict (the record carries pytest's status);
# 2 when it could not run (no vLLM site, no coverage.py, a layout the report does not know): summary.txt says why.
#
# Then, on the lead's machine: xz -9 -c RESULT_DIR/reach-*.json > results/reach/NAME.json.xz && python -m moegate.reach
# report (it rewrites results/reach.md and results/reach.json.xz from every record in results/reach/), review, commit.
set -uo pipefail
out=${1:?usage: bash lab/gpu/reach.sh RESULT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
budget=${BUDGET_S:-560}
tiers=${TIERS:-dispatch,kernels}
site=${VLLM_SITE:-$HOME/vllm-site}
summary="$out/summary.txt"
say() { echo "$*" | tee -a "$summary"; }
: >"$summary"
export VLLM_USE_FLASHINFER_SAMPLER=0 MOEGATE_PROFILE=${MOEGATE_PROFILE:-ci} MOEGATE_REQUIRE_VLLM=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/triton-reach}

if [ -n "${REACH_PYTHON:-}" ]; then
    py=$REACH_PYTHON
else
    if [ ! -d "$site/vllm" ]; then
        say "reach: no vLLM in $site (install ../shared/tools/vllm-offline-bundle.sh's parts there, or set VLLM_SITE)"
        exit 2
    fi
    python3 -m moegate.builds.planted "$HOME/reach-build" --python python3 --site "$site" >"$out/build.log" 2>&1 || {
        say "reach: the build failed: $(tail -n 1 "$out/build.log")"; exit 2; }
    py=$HOME/reach-build/bin/python
fi
"$py" -c "import coverage, vllm" >"$out/probe.log" 2>&1 || { say "reach: $py lacks coverage.py or vLLM: $(tail -n 1 "$out/probe.log")"; exit 2; }

left=$(( budget - ($(date +%s) - start) - 45 ))
if [ "$left" -lt 60 ]; then
    say "reach: BUDGET_S=$budget leaves $left s for the tiers: not run"
    exit 2
fi
say "reach: tiers $tiers with $py, $left s for them (BUDGET_S=$budget), Triton cache $TRITON_CACHE_DIR"
"$py" -m moegate.reach run --tiers "$tiers" --out "$out" --budget-s "$left" -- -q -rfEs --durations=25 \
    >"$out/reach.log" 2>&1
rc=$?
say "reach: run exit $rc after $(( $(date +%s) - start )) s: $(grep -E '^(=+ .*(passed|failed|error).* =+|reach: )' "$out/reach.log" | tail -n 3 | tr '\n' ' ')"
if [ "$rc" -eq 2 ]; then
    say "reach: could not run: $(tail -n 1 "$out/reach.log")"
    exit 2
fi
mv -f "$out/work/junit.xml" "$out/work/session.json" "$out/" 2>/dev/null
xz -T0 -c "$out/work/coverage.json" >"$out/coverage.json.xz" 2>/dev/null
rm -rf "$out/work"

record=$(ls "$out"/reach-*.json 2>/dev/null | head -n 1)
cpu_records=$(ls results/reach/*.json 2>/dev/null | grep -v -e "$(basename "${record:-none}")" || true)
# shellcheck disable=SC2086  # the CPU records are separate words
"$py" -m moegate.reach report "$record" $cpu_records --out "$out/report" >>"$summary" 2>&1 || say "reach: no preview report"
"$py" - "$record" >>"$summary" 2>&1 <<'PY'
import json, sys
rec = json.load(open(sys.argv[1]))
specs = rec.get("specialisations") or []
conds = rec.get("conditions") or {}
reached = sum(1 for f in rec["functions"].values() if f["executed"])
taken = sum(a[2] for f in rec["functions"].values() for a in f["arcs"])
arcs = sum(len(f["arcs"]) for f in rec["functions"].values())
print(f"record: {sys.argv[1]}: pytest exit {rec['pytest_exit']}, stopped by budget {rec.get('stopped_by_budget')}, "
      f"{rec['seconds']} s, {rec['device']}, Triton {rec.get('triton')}")
print(f"branches: {taken} of {arcs} taken; {reached} of {len(rec['functions'])} functions reached")
print(f"Triton variants compiled: {len(specs)} ({len({s['kernel'] for s in specs})} kernels)")
for name, c in conds.items():
    print(f"condition {name}: mattered in {c['mattered']} of {c['applied']} cases")
if rec.get("errors"):
    print(f"recording errors: {rec['errors'][:5]}")
PY
say "reach: done in $(( $(date +%s) - start )) s"
exit 0
