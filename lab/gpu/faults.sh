#!/usr/bin/env bash
# Runner faults told apart from the build's failures, on the GPU (issue 44 item 5): three runs of
# `moegate gate --tiers kernels` on a subset of the kernel tier (profile ci), each with its page (reports/gate.md's
# form) in RESULT_DIR:
#
#   bug      a build with a planted kernel bug (BUG, default expert=0:1: on the sorted path with host-resident
#            experts, expert 0's blocks read expert 1's weights; the kernel tier saw it on the H200 rehearsal,
#            results/gate-rehearsal-h200.md). Expected: FAIL (exit 1), not retried; the page gives each failing case
#            the reference's value, the kernel's and the tolerance at the worst element, and `moegate repro --kernels`.
#            (scale=F acts on the Qwen3-MoE model block, which the kernel tier never calls: the kernel tier's reach
#            is the fused-MoE op, hence a bug there.)
#   oom      the build's own out-of-memory error: `--bug workspace=4096`, the fused-MoE experts allocate 4 TiB on
#            every call, more than any GPU. Expected: FAIL (exit 1), not retried, whether or not other processes
#            share the GPU (4 TiB is more than the free memory and all the others' together).
#   hog      a process of this script's own fills the GPU's free memory but HOG_LEAVE_GIB (1) while the clean
#            build's gate runs; it leaves once the gate's log says "runner fault:". Expected: the first attempt
#            RUNNER FAULT (out of memory while 1 other process held N GiB, naming the hog's pid), the retry (the hog
#            gone) PASS: exit 0, with "## Runner faults" on the page. It fills the GPU, so it runs only when nothing
#            else holds memory there (memory.used under ALONE_MIB, waited for ALONE_WAIT_S): beside another job it is
#            skipped with a line, since it would make the other job's allocations fail.
#
# From the checkout's root on the device, after vLLM 0.33.0 is installed into $SITE (lab/gpu/README.md):
#
#   bash lab/gpu/faults.sh RESULT_DIR
#
# About 4-6 minutes on an H100 or H200 (BUDGET_S, default 360, bounds it: a run still going then is stopped and the
# summary says so): three gate runs of the two kernel-tier properties below (-k SUBSET, 25 examples each entrypoint),
# the first on a cold Triton cache ($HOME/triton-faults, kept for the next). GPU memory: the bug and oom runs a few
# GB (the weight bank); the hog run ALL of the GPU's free memory but 1 GiB for about a minute (run it alone).
# Writes RESULT_DIR/{bug,oom,hog}/ (gate.log, gate.md, gate.xml), nvml-view.txt (what NVML listed while the hog
# held its memory: the verdict needs NVML to show the hog, by pid or as memory in use before the gate started),
# peak-memory.txt (the bug run's GPU memory, sampled), summary.txt. Exits 0 when it ran, whatever the verdicts;
# 2 with one line when it cannot run (no nvidia-smi, no vLLM site).
#
# On a CPU (rehearsal of the mechanics): TIERS=dispatch HOG=0 BASE_PY=~/.cache/moegate/envs/_vllm-0.33.0/bin/python
# SITE= bash lab/gpu/faults.sh /tmp/faults-cpu
set -uo pipefail
RD=${1:?usage: faults.sh RESULT_DIR}
BUDGET_S=${BUDGET_S:-360} TIERS=${TIERS:-kernels} HOG=${HOG:-1} BUG=${BUG:-expert=0:1}
SITE=${SITE-$HOME/vllm-site} BASE_PY=${BASE_PY:-python3} B=${FAULTS_BUILDS:-$HOME/faults-builds}
HOG_LEAVE_GIB=${HOG_LEAVE_GIB:-1} ALONE_MIB=${ALONE_MIB:-2048} ALONE_WAIT_S=${ALONE_WAIT_S:-60}
SUBSET=${SUBSET:-test_output_matches_reference or test_host_resident_weights_take_sorted_path_on_gpu}
export MOEGATE_PROFILE=ci PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/triton-faults}
t0=$(date +%s)
if [ "$TIERS" = kernels ] && ! command -v nvidia-smi >/dev/null; then
  echo "faults.sh: no nvidia-smi here: the kernels tier needs a GPU (TIERS=dispatch HOG=0 rehearses on a CPU)" >&2
  exit 2
fi
sites=()
if [ -n "$SITE" ]; then
  [ -d "$SITE" ] || { echo "faults.sh: no vLLM site at $SITE (install 0.33.0 there first: lab/gpu/README.md)" >&2; exit 2; }
  sites=(--site "$SITE")
fi
mkdir -p "$RD" "$B" || exit 2
summary=$RD/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
left() { echo $((BUDGET_S - ($(date +%s) - t0))); }
build() {  # NAME [BUG]: an interpreter that sees the site first (moegate.builds.planted), made once
  [ -x "$B/$1/bin/python" ] && return 0
  python3 -m moegate.builds.planted "$B/$1" --python "$BASE_PY" "${sites[@]}" ${2:+--bug "$2"} >/dev/null
}
if ! { build clean && build bug "$BUG" && build oom workspace=4096; }; then
  echo "faults.sh: a build could not be made" >&2
  exit 2
fi

gate() {  # CASE LABEL BUILD: moegate gate on the subset, bounded by what is left of the budget
  local case=$1 label=$2 py=$B/$3/bin/python budget
  budget=$(($(left) - 10))
  mkdir -p "$RD/$case"
  if [ "$budget" -lt 30 ]; then
    say "$case: not run, the budget is spent ($BUDGET_S s)"
    return 1
  fi
  local s=$SECONDS
  timeout -k 10 "$budget" "$py" -m moegate gate --vllm-python "$py" --tiers "$TIERS" --label "$label" \
    --junit "$RD/$case/gate.xml" --page "$RD/$case/gate.md" --fault-wait-s 60 -- -p no:cacheprovider -k "$SUBSET" \
    >"$RD/$case/gate.log" 2>&1
  local status=$?
  [ "$status" = 124 ] && echo "faults.sh: stopped by the budget after $budget s" >>"$RD/$case/gate.log"
  echo "$status" >"$RD/$case/exit"
  say "$case: exit $status in $((SECONDS - s)) s; $(head -1 "$RD/$case/gate.md" 2>/dev/null || echo 'no page')"
  grep -E "^moegate gate: (PASS|FAIL|RUNNER FAULT|.*runner fault|.*retrying)" "$RD/$case/gate.log" | cut -c1-400 | sed 's/^/    /' | tee -a "$summary"
}
expect() {  # CASE STATUS WORDS: did the case read as it must?
  local got
  got=$(cat "$RD/$1/exit" 2>/dev/null || echo none)
  if [ "$got" = "$2" ]; then say "  $1: as expected ($3)"; else say "  $1: NOT as expected: exit $got, expected $2 ($3)"; fi
}

# 1. the planted bug (warms the Triton cache for the runs after it); its GPU memory sampled
mkdir -p "$RD/bug"
if [ "$TIERS" = kernels ]; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >"$RD/bug/memory.csv" 2>/dev/null &
  sampler=$!
fi
gate bug "0.33.0 + $BUG" bug
expect bug 1 "FAIL: the planted bug"
if [ -n "${sampler:-}" ]; then
  kill "$sampler" 2>/dev/null
  sort -n "$RD/bug/memory.csv" | awk 'NR==1{lo=$1} {hi=$1} END{printf "GPU memory used during the bug run: %s to %s MiB (the subset of the kernel tier; the whole GPU, other jobs included)\n", lo, hi}' | tee "$RD/peak-memory.txt" >>"$summary"
fi

# 2. the build's own out-of-memory error
gate oom "0.33.0 + workspace=4096" oom
expect oom 1 "FAIL: the build's own out-of-memory error"
grep -m1 -o "out of memory[^|]*" "$RD/oom/gate.md" 2>/dev/null | cut -c1-300 | sed 's/^/    page: /' | tee -a "$summary"

# 3. another process's memory on the GPU: a runner fault, retried once
if [ "$HOG" != 1 ] || [ "$TIERS" != kernels ]; then
  say "hog: not run (HOG=$HOG, TIERS=$TIERS: it needs a GPU)"
else
  used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  waited=0
  while [ "${used:-0}" -gt "$ALONE_MIB" ] && [ "$waited" -lt "$ALONE_WAIT_S" ]; do
    sleep 5; waited=$((waited + 5))
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  done
  if [ "${used:-0}" -gt "$ALONE_MIB" ]; then
    say "hog: not run: $used MiB of GPU memory held by other work after ${waited} s; filling the GPU would fail it"
  else
    mkdir -p "$RD/hog"
    : >"$RD/hog/gate.log"
    "$B/clean/bin/python" - "$RD/hog/gate.log" "$HOG_LEAVE_GIB" "$(left)" >"$RD/hog/hog.log" 2>&1 <<'EOF' &
import os, sys, time
import torch

log, leave, max_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
free, total = torch.cuda.mem_get_info()
chunks, held, want = [], 0, free - int(leave * 2**30)
while held < want:
    n = min(1 << 30, want - held)
    try:
        chunks.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        break
    held += n
print(f"hog: pid {os.getpid()} holds {held / 2**30:.1f} GiB of {total / 2**30:.1f}; {leave:g} GiB left free", flush=True)
open(log + ".ready", "w").close()
end = time.time() + max_s
while time.time() < end and "runner fault:" not in open(log).read():
    time.sleep(0.5)
print(f"hog: leaving ({'the gate saw a runner fault' if time.time() < end else 'out of time'})", flush=True)
EOF
    hog=$!
    trap 'kill $hog 2>/dev/null' EXIT
    for _ in $(seq 120); do [ -f "$RD/hog/gate.log.ready" ] && break; sleep 0.5; done
    cat "$RD/hog/hog.log" | tee -a "$summary"
    {
      echo "hog pid: $hog"
      echo "nvidia-smi --query-compute-apps=pid,used_memory:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
      echo "nvidia-smi --query-gpu=memory.used,memory.total:"; nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
      echo "moegate.preflight.gpu_processes (the gate's own question):"
      "$B/clean/bin/python" -c "from moegate.preflight.gpu_processes import gpu_processes, unlisted_mib; print('listed:', gpu_processes()); print('unlisted MiB:', unlisted_mib())"
    } >"$RD/nvml-view.txt" 2>&1
    if nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' ' | grep -qx "$hog"; then
      say "  NVML lists the hog (pid $hog)"
    else
      say "  NVML does not list the hog by pid: the gate sees it as memory in use before it started (nvml-view.txt)"
    fi
    gate hog "0.33.0 beside a hog" clean
    kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null
    tail -1 "$RD/hog/hog.log" | tee -a "$summary"
    expect hog 0 "RUNNER FAULT on the first attempt, PASS on the retry"
    if grep -q "runner fault: out of memory while" "$RD/hog/gate.log"; then
      say "  hog: the first attempt was a runner fault, its cause named"
    else
      say "  hog: NO runner fault in the log"
    fi
  fi
fi
rm -f "$RD"/*/gate.log.ready
say "faults.sh: done in $(($(date +%s) - t0)) s (budget $BUDGET_S)"
exit 0
