#!/usr/bin/env bash
# The device rehearsal of a compiled MoE change (issue 44, "On the GPU machine"): vLLM 0.33.0's MoE extension built on
# the device from its own sources, twice, and the kernels leg run against each build: green as built, red with a bug
# planted in one csrc/moe kernel. From the checkout root:
#
#   bash lab/gpu/compiled.sh RESULT_DIR
#
# Needs: the carry made here by `python3 -m lab.gpu.compiled_carry SDIST CUTLASS_DIR .gpu/compiled/moe-src.tar.xz`
# (vLLM's csrc/cmake/CMakeLists.txt/setup.py/requirements and CUTLASS's headers, about 2 MB; $CARRY), and vLLM 0.33.0 in
# $SITE (default $HOME/vllm-site, lab/gpu/README.md's bring-up). The machine's python3 (torch 2.11+cu130), nvcc,
# cmake, ninja; nothing else is assumed: where the CUDA toolkit lacks what the build links (libcuda.so, libnvrtc, the
# cuBLAS headers torch_utils.h includes), they are taken from the driver and from torch's nvidia packages (logged).
#
# Phases, each once (done markers under $STATE, default $HOME/compiled; a call cut by BUDGET_S resumes at the phase it
# was in, a phase cut halfway starts over):
#   build-clean  `python3 -m moegate builds rebuild-moe` (vLLM's own CMake text, its MoE target, the GPU's arch, all
#                cores, ccache when the machine has it) into a copy of $SITE's vllm package (hard links: only the
#                library is new); the COLD build. Expected 3-6 min on 16 cores (24 objects, 13 of them Marlin MoE GEMM
#                instantiations of about 110 CPU-s each; the longest file bounds it).
#   build-bug    the bug planted in the same tree ($BUG_FILE: the alignment kernel pads sorted_token_ids with
#                numel - 1, a real token, instead of numel, as vLLM once shipped), rebuilt in the same build folder:
#                the CACHED build (one object and the link; about 30-60 s); with ccache also a cold-folder build
#                against the warm cache (build-warm).
#   probe        each build's alignment op on a tiny input: which library is loaded, what it pads with.
#   kernels-clean, kernels-bug   `python -m tooling.ci.gpu_leg kernels` (the gpu job's own leg: dispatch and kernel
#                tiers, ci profile, at least $MIN_KERNEL_TESTS kernel tests) against each build, one after the
#                other; about 5-7 min each on an H200 (results/gate-rehearsal-h200.md), a few GB of GPU memory.
#                KERNELS_K="expr" narrows both to pytest -k expr (then MIN_KERNEL_TESTS=1). Expected: clean exit 0,
#                bug exit 1.
# Longer than one call in all (about 15-20 min): run it through lab/gpu/background.sh (start, then wait calls; its
# copy of the checkout leaves .gpu/ out, so give CARRY as an absolute path; lab/gpu/README.md), or call it again
# with the same $STATE until summary.txt says "all phases done". BUDGET_S (default 570) is this call's
# wall budget: no phase starts that cannot finish, a running one is stopped (timeout) before it runs out.
# STOP_AFTER=build on the device: the two builds only, then exit (with ARCH given nothing touches the GPU, so it can
# run beside a script that needs the GPU to itself); KERNELS_NEED_S (default 300): a leg starts only with that left.
# REHEARSE=1 (the CPU rehearsal): ARCH given, no GPU, STOP_AFTER=configure|object (configure, then compile the
# planted file's object alone, clean then with the bug).
#
# Writes into RESULT_DIR: summary.txt (one line a phase: what it did, its time, its exit), results.json, each phase's
# log. Exit 0 when it ran (whatever the legs say); 2 for what it needs and lacks (one line).
set -uo pipefail
out=${1:?usage: lab/gpu/compiled.sh RESULT_DIR}
CARRY=${CARRY:-.gpu/compiled/moe-src.tar.xz} SITE=${SITE:-$HOME/vllm-site} STATE=${STATE:-$HOME/compiled}
BUDGET_S=${BUDGET_S:-570} MIN_KERNEL_TESTS=${MIN_KERNEL_TESTS:-40} KERNELS_K=${KERNELS_K:-} JOBS=${JOBS:-$(nproc)}
BUG_FILE=csrc/moe/moe_align_sum_kernels.cu BUG_FROM='] = numel;' BUG_TO='] = numel - 1;' BUG_COUNT=2
MARGIN_S=15 t0=$SECONDS
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 MOEGATE_PROFILE=${MOEGATE_PROFILE:-ci} MOEGATE_REQUIRE_CUDA=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$STATE/triton} CCACHE_DIR=${CCACHE_DIR:-$STATE/ccache}
mkdir -p "$out" "$STATE/done" "$STATE/results"
R=$STATE/results
summary=$R/summary.txt

say() { echo "$*" | tee -a "$summary"; }
left() { echo $((BUDGET_S - (SECONDS - t0) - MARGIN_S)); }
fail() { echo "compiled.sh: $*" >&2; echo "compiled.sh: $*" >>"$summary"; finish 2; }
finish() {
  cp -r "$R/." "$out/" 2>/dev/null
  exit "${1:-0}"
}
done_() { [ -f "$STATE/done/$1" ]; }
mark() { echo "$2" >"$STATE/done/$1"; }
# PHASE NEED_S CMD...: runs CMD when NEED_S seconds are left (stopped by timeout before the budget); its exit, time
phase() {
  local name=$1 need=$2 s=$SECONDS rc
  shift 2
  if [ "$(left)" -lt "$need" ]; then
    say "$name: not started, $(left) s left of BUDGET_S=$BUDGET_S (needs about $need s): call again with the same STATE"
    finish 0
  fi
  timeout --signal=TERM --kill-after=10 "$(left)" "$@" >"$R/$name.log" 2>&1
  rc=$?
  echo "$rc $((SECONDS - s))" >"$R/$name.exit"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    say "$name: stopped by the budget after $((SECONDS - s)) s (log $name.log); call again to run it anew"
    finish 0
  fi
  return "$rc"
}

[ -f "$CARRY" ] || fail "no carry at $CARRY (python3 -m lab.gpu.compiled_carry SDIST CUTLASS_DIR $CARRY, then carry it)"
for tool in python3 cmake ninja nvcc; do command -v "$tool" >/dev/null || fail "no $tool on PATH"; done
[ -n "${REHEARSE:-}" ] || [ -f "$SITE/vllm/__init__.py" ] || fail "no vLLM in SITE=$SITE (lab/gpu/README.md's bring-up)"
if [ -z "${ARCH:-}" ]; then
  ARCH=$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null) \
    || fail "torch sees no CUDA GPU to read the architecture from (set ARCH, e.g. 9.0)"
fi
nvcc_bin=$(readlink -f "$(command -v nvcc)")
if [ -z "${CUDA_HOME:-}" ]; then  # the toolkit nvcc belongs to (a wrapper script on PATH: /usr/local/cuda)
  CUDA_HOME=$(dirname "$(dirname "$nvcc_bin")")
  [ -f "$CUDA_HOME/include/cuda_runtime.h" ] || CUDA_HOME=/usr/local/cuda
  [ -x "$CUDA_HOME/bin/nvcc" ] || fail "no CUDA toolkit found for $nvcc_bin (set CUDA_HOME)"
fi
export CUDA_HOME
PY=$(command -v python3)
launcher=()
command -v ccache >/dev/null && launcher=(--launcher ccache)
{
  echo "== $(date -u +%FT%TZ) ARCH=$ARCH JOBS=$JOBS BUDGET_S=$BUDGET_S STATE=$STATE"
  echo "nvcc: $nvcc_bin ($(nvcc --version | tail -2 | head -1)); CUDA_HOME=$CUDA_HOME"
  echo "cmake: $(cmake --version | head -1); ninja $(ninja --version); $(gcc --version 2>/dev/null | head -1)"
  echo "python3: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1)"
  echo "ccache: $(command -v ccache >/dev/null && ccache --version | head -1 || echo 'none on this machine: the cached build is the build folder reused')"
} >>"$R/environment.txt"

# --- the sources, and what the toolkit lacks -----------------------------------------------------------------------
if ! done_ unpack; then
  rm -rf "$STATE/src" && mkdir -p "$STATE/src"
  tar -xJf "$CARRY" -C "$STATE/src" || fail "$CARRY: cannot unpack"
  [ -f "$STATE/src/vllm/CMakeLists.txt" ] && [ -d "$STATE/src/cutlass/include/cutlass" ] || fail "$CARRY: no vllm/CMakeLists.txt or cutlass/include"
  mark unpack "$(cat "$STATE/src/cutlass/VERSION" 2>/dev/null)"
fi
src=$STATE/src/vllm
fill=$STATE/cuda-fill
cmake_args=()
if ! done_ fill; then
  rm -rf "$fill" && mkdir -p "$fill/include" "$fill/lib"
  # the nvidia packages torch runs with: headers and libraries the toolkit may lack (a pip-installed nvcc has neither)
  nv=$(python3 -c 'import nvidia, os; print(" ".join(p for p in nvidia.__path__))' 2>/dev/null)
  inc="$CUDA_HOME/include"
  for h in cublas_v2.h cublas_api.h cublas.h cublasLt.h; do
    [ -e "$inc/$h" ] || [ -e "$CUDA_HOME/targets/x86_64-linux/include/$h" ] && continue
    # shellcheck disable=SC2086  # $nv: the nvidia packages' folders, one word each
    found=$(find $nv -name "$h" -path '*include*' 2>/dev/null | head -1)
    [ -n "$found" ] && ln -sf "$found" "$fill/include/$h" && echo "fill: $h from $found" >>"$R/environment.txt"
  done
  mark fill ok
fi
[ -n "$(ls "$fill/include")" ] && cmake_args+=("--cmake-arg=-DCMAKE_CUDA_FLAGS=-I$fill/include" "--cmake-arg=-DCMAKE_CXX_FLAGS=-I$fill/include")
if ! ls "$CUDA_HOME"/lib64/stubs/libcuda.so "$CUDA_HOME"/lib64/libcuda.so >/dev/null 2>&1; then
  driver=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so(\.1)? /{print $NF; exit}')
  driver=${driver:-$(find /usr/lib /usr/lib64 /usr/local -name 'libcuda.so*' 2>/dev/null | head -1)}
  [ -z "$driver" ] && [ -n "${REHEARSE:-}" ] && driver=$STATE/libcuda-stub.so && echo | gcc -shared -x c -o "$driver" -
  [ -n "$driver" ] && ln -sf "$driver" "$fill/lib/libcuda.so" && cmake_args+=("--cmake-arg=-DCUDA_cuda_driver_LIBRARY=$fill/lib/libcuda.so")
fi
if ! ls "$CUDA_HOME"/lib64/libnvrtc.so* >/dev/null 2>&1; then
  nvrtc=$(python3 -c 'import nvidia, glob; print(next(iter(sorted(g for p in nvidia.__path__ for g in glob.glob(p + "/*/lib/libnvrtc.so*"))), ""))' 2>/dev/null)
  [ -n "$nvrtc" ] && cmake_args+=("--cmake-arg=-DCUDA_nvrtc_LIBRARY=$nvrtc")
fi
echo "cmake fill-ins: ${cmake_args[*]:-none}" >>"$R/environment.txt"

# vLLM's MoE target from $src, in the one build folder (add --json FILE [--into SITE])
rebuild=(python3 -m moegate builds rebuild-moe --vllm-src "$src" --arch "$ARCH" --build-dir "$STATE/build" --python "$PY"
  --cutlass "$STATE/src/cutlass" --jobs "$JOBS" "${launcher[@]}" "${cmake_args[@]}")
site_copy() {  # NAME: $STATE/site-NAME/vllm, hard links to $SITE's package (the new library is renamed in: $SITE stays)
  rm -rf "$STATE/site-$1" && mkdir -p "$STATE/site-$1"
  cp -al "$SITE/vllm" "$STATE/site-$1/vllm" 2>/dev/null || cp -a "$SITE/vllm" "$STATE/site-$1/vllm"
}
sed_literal() { printf '%s' "$1" | sed 's/[]\[\.*^$/]/\\&/g'; }  # TEXT as a sed pattern matching itself
plant() {
  local n
  n=$(grep -cF "$BUG_FROM" "$src/$BUG_FILE")
  [ "$n" = "$BUG_COUNT" ] || fail "$BUG_FILE: '$BUG_FROM' found $n times, want $BUG_COUNT: the bug cannot be planted as written"
  sed -i "s/$(sed_literal "$BUG_FROM")/$BUG_TO/" "$src/$BUG_FILE"
  grep -nF "$BUG_TO" "$src/$BUG_FILE" >"$R/bug.txt"
}
unplant() { sed -i "s/$(sed_literal "$BUG_TO")/$BUG_FROM/" "$src/$BUG_FILE"; }

# --- the CPU rehearsal: configure, then the planted file's object alone --------------------------------------------
if [ -n "${REHEARSE:-}" ]; then
  unplant
  if ! phase configure 60 "${rebuild[@]}" --configure-only --json "$R/configure.json"; then
    say "configure: exit $(cut -d' ' -f1 "$R/configure.exit") ($(tail -1 "$R/configure.log"))"
    finish 0
  fi
  say "configure: exit 0 in $(cut -d' ' -f2 "$R/configure.exit") s: $(tail -1 "$R/configure.log")"
  [ "${STOP_AFTER:-object}" = configure ] && finish 0
  obj="CMakeFiles/_moe_C_stable_libtorch.dir/$BUG_FILE.o"
  for which in clean bug; do
    [ "$which" = bug ] && plant
    rm -f "$STATE/build/cmake/$obj"
    phase "object-$which" 120 env TORCH_CUDA_ARCH_LIST="$ARCH" ninja -C "$STATE/build/cmake" "$obj"
    say "object-$which: $obj, exit $(cut -d' ' -f1 "$R/object-$which.exit") in $(cut -d' ' -f2 "$R/object-$which.exit") s"
  done
  unplant
  finish 0
fi

# --- on the device ----------------------------------------------------------------------------------------------------
if ! done_ build-clean; then
  unplant && site_copy clean
  phase build-clean 240 "${rebuild[@]}" --json "$R/build-clean.json" --into "$STATE/site-clean"
  rc=$?
  say "build-clean (cold): exit $rc in $(cut -d' ' -f2 "$R/build-clean.exit") s; $(grep -h 'configure' "$R/build-clean.log" | tail -1)"
  [ "$rc" = 0 ] || finish 0
  mark build-clean ok
fi
if ! done_ build-bug; then
  unplant && plant && site_copy bug
  phase build-bug 120 "${rebuild[@]}" --json "$R/build-bug.json" --into "$STATE/site-bug"
  rc=$?
  say "build-bug (cached: the build folder reused, $BUG_FILE changed): exit $rc in $(cut -d' ' -f2 "$R/build-bug.exit") s"
  [ "$rc" = 0 ] || finish 0
  mark build-bug ok
  if [ ${#launcher[@]} -gt 0 ]; then  # the compiler cache's own figure: the bug tree again, in a new build folder
    mv "$STATE/build" "$STATE/build-kept"
    phase build-warm 240 "${rebuild[@]}" --json "$R/build-warm.json"
    say "build-warm (ccache warm, empty build folder): exit $? in $(cut -d' ' -f2 "$R/build-warm.exit") s; $(ccache -s 2>/dev/null | grep -iE 'hits|misses' | tr '\n' ' ')"
    rm -rf "$STATE/build" && mv "$STATE/build-kept" "$STATE/build"
  fi
fi
if [ "${STOP_AFTER:-}" = build ]; then  # the builds only (no GPU touched: ARCH given), e.g. beside faults.sh
  say "stopped after the builds (STOP_AFTER=build); this call $((SECONDS - t0)) s: call again with the same STATE"
  finish 0
fi
for b in clean bug; do
  [ -x "$STATE/b-$b/bin/python" ] || python3 -m moegate.builds.planted "$STATE/b-$b" --python python3 \
    --site "$STATE/site-$b" --site "$SITE" >"$R/planted-$b.log" 2>&1 || fail "build b-$b: see planted-$b.log"
  printf '{"pr": "%s", "pr_label": "0.33.0 (MoE extension rebuilt: %s)"}\n' "$STATE/b-$b/bin/python" "$b" >"$STATE/builds-$b.json"
done
python3 -m moegate builds hashes "$SITE" --json "$R/extensions-site.json" >/dev/null
for b in clean bug; do python3 -m moegate builds hashes "$STATE/site-$b" --json "$R/extensions-$b.json" >/dev/null; done
if ! done_ probe; then
  for b in clean bug; do
    phase "probe-$b" 60 "$STATE/b-$b/bin/python" -c '
import torch
from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
topk = torch.tensor([[0, 1], [0, 2], [1, 2]], dtype=torch.int32, device="cuda")  # 6 (token, expert) pairs, 3 experts
ids, _, n = moe_align_block_size(topk, 4, 3)
ids = ids[: int(n)].tolist()
lib = sorted({line.split()[-1] for line in open("/proc/self/maps") if "_moe_C" in line})
print("library", *lib)
print("sorted_token_ids", ids, "| slots holding 6 (numel, the padding):", ids.count(6), "| holding 5 (the last pair):", ids.count(5))
'
    say "probe-$b: $(tr '\n' ' ' <"$R/probe-$b.log" | cut -c1-400)"
  done
  mark probe ok
fi
k_args=()
if [ -n "$KERNELS_K" ]; then k_args=(-- -- -k "$KERNELS_K"); fi
for b in clean bug; do
  done_ "kernels-$b" && continue
  phase "kernels-$b" "${KERNELS_NEED_S:-300}" python3 -m tooling.ci.gpu_leg kernels --builds "$STATE/builds-$b.json" --reports "$R/kernels-$b" \
    --min-kernel-tests "$MIN_KERNEL_TESTS" "${k_args[@]}"
  rc=$?
  want=0
  [ "$b" = bug ] && want=1
  verdict="as expected"
  [ "$rc" = "$want" ] || verdict="NOT as expected (want exit $want)"
  say "kernels-$b: exit $rc in $(cut -d' ' -f2 "$R/kernels-$b.exit") s, $verdict; $(grep -E '^(PASS|FAIL)' "$R/kernels-$b.log" | tail -1)"
  mark "kernels-$b" "$rc"
done
python3 - "$R" "$ARCH" <<'PY' >"$R/results.json"
import json, pathlib, sys
r = pathlib.Path(sys.argv[1])
out = {"arch": sys.argv[2], "phases": {}}
for f in sorted(r.glob("*.exit")):
    rc, s = f.read_text().split()
    out["phases"][f.stem] = {"exit": int(rc), "seconds": int(s)}
for name in ("build-clean", "build-bug", "build-warm"):
    if (r / f"{name}.json").is_file():
        out["phases"].setdefault(name, {})["built"] = json.loads((r / f"{name}.json").read_text())["built"]
print(json.dumps(out, indent=2))
PY
say "all phases done in this STATE ($STATE); this call $((SECONDS - t0)) s"
finish 0
