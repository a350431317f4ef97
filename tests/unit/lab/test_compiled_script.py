"""lab/gpu/compiled.sh, the device rehearsal of a compiled MoE change, run here with a ``python3`` that records its
arguments and stands in for the GPU's work (the build, the planted builds, the probe); ``moegate builds hashes`` and
every ``gpu_leg kernels`` command line are the real ones (the leg with ``--dry-run``). And
``lab/gpu/compiled_carry.py``, which makes the carry the script builds from. The script's CPU rehearsal (a real
configure of 0.33.0's MoE target and its alignment kernel compiled for sm_90 with nvcc, clean and planted) needs nvcc,
CMake 3.26+ and a CUDA torch: its figures are in the branch's report, not a test here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from lab.gpu.compiled_carry import main as carry_main
from tests.support import ROOT
from tests.support.vllm_tree import FILES, real_vllm_tree

SCRIPT = ROOT / "lab" / "gpu" / "compiled.sh"
MOE = "_moe_C_stable_libtorch"
ALIGN = "csrc/moe/moe_align_sum_kernels.cu"
ALIGN_TEXT = (
    "void a(int* s, int numel) {\n  for (;;) {\n    s[0] = numel;\n  }\n}\n"
    "void b(int* sorted_token_ids, int numel) {\n  sorted_token_ids[0] = numel;\n}\n"
)

SHIM = """#!{python}
import json, os, pathlib, shutil, sys
sys.path.insert(0, {root!r})
args = sys.argv[1:]
state = pathlib.Path(os.environ["STATE"])
with open(os.environ["SHIM_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\\n")
if args[:4] == ["-m", "moegate", "builds", "rebuild-moe"]:
    out = pathlib.Path(args[args.index("--json") + 1])
    align = (state / "src" / "vllm" / {align!r}).read_text()
    out.write_text(json.dumps({{"built": [{{"target": {moe!r}, "build_s": 1.0, "planted": "numel - 1" in align}}]}}))
    if "--into" in args:
        lib = pathlib.Path(args[args.index("--into") + 1]) / "vllm" / "{moe}.abi3.so"
        tmp = lib.with_name(".new")
        tmp.write_text("rebuilt, planted" if "numel - 1" in align else "rebuilt")
        os.replace(tmp, lib)  # as moegate.builds.moe_build.install puts it in: a rename
    print("{moe}: configure 1.0 s, build 1.0 s -> lib")
elif args[:4] == ["-m", "moegate", "builds", "hashes"]:
    from moegate.cli.builds import main
    sys.exit(main(args[3:]))
elif args[:2] == ["-m", "moegate.builds.planted"]:
    dest = pathlib.Path(args[2]); (dest / "bin").mkdir(parents=True)
    (dest / "bin" / "python").symlink_to(os.environ["SHIM"])
elif args[:2] == ["-m", "tooling.ci.gpu_leg"]:
    from tooling.ci import gpu_leg
    rest = args[2:]
    cut = rest.index("--") if "--" in rest else len(rest)
    status = gpu_leg.main([*rest[:cut], "--dry-run", *rest[cut:]])
    builds = json.loads(pathlib.Path(rest[rest.index("--builds") + 1]).read_text())
    print("FAIL: planted" if "bug" in builds["pr"] else "PASS")
    sys.exit(status or (1 if "bug" in builds["pr"] else 0))
elif args[:1] == ["-"]:  # a script on stdin (results.json): the real interpreter
    os.execv(sys.executable, [sys.executable, *args])
elif args[:1] == ["-c"]:
    print("9.0" if "get_device_capability" in args[1] else "library /x/{moe}.abi3.so\\nsorted_token_ids [0, 6]")
else:
    sys.exit("shim: unexpected " + " ".join(args))
"""


def _tool(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _carry(tmp_path: Path) -> Path:
    sdist_dir = tmp_path / "sdist" / "vllm-0.33.0"
    for rel, text in {**FILES, ALIGN: ALIGN_TEXT}.items():
        (sdist_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (sdist_dir / rel).write_text(text)
    sdist = tmp_path / "vllm-0.33.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(sdist_dir, arcname="vllm-0.33.0")
    cutlass = tmp_path / "cutlass"
    (cutlass / "include" / "cutlass").mkdir(parents=True)
    (cutlass / "include" / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 7\n#define CUTLASS_PATCH 1\n"
    )
    (cutlass / "include" / "cutlass" / "array.h").write_text("#pragma once\n")
    assert carry_main([str(sdist), str(cutlass), str(tmp_path / "carry.tar.xz")]) == 0
    return tmp_path / "carry.tar.xz"


def _run(
    tmp_path: Path, budget: int = 600, script: Path = SCRIPT, **env: str
) -> tuple[list[list[str]], subprocess.CompletedProcess[str]]:
    home, shim, cuda = tmp_path / "home", tmp_path / "bin", tmp_path / "cuda"
    if not shim.exists():
        (home / "vllm-site" / "vllm").mkdir(parents=True)
        (home / "vllm-site" / "vllm" / "__init__.py").write_text("")
        (home / "vllm-site" / "vllm" / f"{MOE}.abi3.so").write_text("precompiled")
        shim.mkdir()
        (shim / "python3").write_text(SHIM.format(python=sys.executable, root=str(ROOT), moe=MOE, align=ALIGN))
        (shim / "python3").chmod(0o755)
        _tool(shim / "nvcc", 'echo "nvcc"; echo "Cuda compilation tools, release 13.0, V13.0.88"; echo build')
        _tool(shim / "cmake", 'echo "cmake version 4.4.3"')
        _tool(shim / "ninja", "echo 1.13.2")
        _tool(shim / "nvidia-smi", 'echo "9.0"')  # --query-gpu=compute_cap: no CUDA context
        for d in ("bin", "include", "lib64/stubs"):
            (cuda / d).mkdir(parents=True)
        for f in ("include/cuda_runtime.h", "include/cublas_v2.h", "include/cublas_api.h", "include/cublas.h",
                  "include/cublasLt.h", "lib64/stubs/libcuda.so", "lib64/libnvrtc.so.13"):  # fmt: skip
            (cuda / f).write_text("")
        _tool(cuda / "bin" / "nvcc", "exit 0")
    log = tmp_path / "calls.jsonl"
    log.unlink(missing_ok=True)
    full = {
        **os.environ, "HOME": str(home), "STATE": str(home / "compiled"), "SHIM_LOG": str(log),
        "SHIM": str(shim / "python3"), "PATH": f"{shim}:{os.environ['PATH']}", "CUDA_HOME": str(cuda),
        "CARRY": str(tmp_path / "carry.tar.xz"), "BUDGET_S": str(budget), "JOBS": "16", **env,
    }  # fmt: skip
    proc = subprocess.run(["bash", str(script), str(tmp_path / "result")], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return calls, proc


def test_the_rehearsal_builds_clean_then_planted_in_one_folder_and_runs_the_kernels_leg_on_each(tmp_path):
    _carry(tmp_path)
    calls, proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "home" / "compiled"
    rebuilds = [c for c in calls if c[:4] == ["-m", "moegate", "builds", "rebuild-moe"]]
    assert [c[c.index("--into") + 1] for c in rebuilds] == [str(state / "site-clean"), str(state / "site-bug")]
    for c in rebuilds:
        assert c[c.index("--arch") + 1] == "9.0" and c[c.index("--build-dir") + 1] == str(state / "build")
        assert c[c.index("--cutlass") + 1] == str(state / "src" / "cutlass") and c[c.index("--jobs") + 1] == "16"
    result = tmp_path / "result"
    built = [json.loads((result / f"build-{b}.json").read_text())["built"][0]["planted"] for b in ("clean", "bug")]
    assert built == [False, True]  # the bug was planted for the second build only
    assert (state / "site-bug" / "vllm" / f"{MOE}.abi3.so").read_text() == "rebuilt, planted"
    assert (tmp_path / "home" / "vllm-site" / "vllm" / f"{MOE}.abi3.so").read_text() == "precompiled"  # untouched
    planted = {Path(c[2]).name: c for c in calls if c[:2] == ["-m", "moegate.builds.planted"]}
    assert planted["b-bug"][-4:] == ["--site", str(state / "site-bug"), "--site", str(tmp_path / "home" / "vllm-site")]
    legs = [c for c in calls if c[:2] == ["-m", "tooling.ci.gpu_leg"]]
    assert [Path(c[c.index("--builds") + 1]).name for c in legs] == ["builds-clean.json", "builds-bug.json"]
    assert all(c[c.index("--min-kernel-tests") + 1] == "40" for c in legs)
    summary = (result / "summary.txt").read_text()
    assert "kernels-clean: exit 0" in summary and "kernels-bug: exit 1" in summary
    assert summary.count("as expected") == 2 and "NOT as expected" not in summary
    assert "build-bug (cached: the build folder reused, csrc/moe/moe_align_sum_kernels.cu changed): exit 0" in summary
    assert summary.splitlines()[-1].startswith("all phases done")
    gate = next(line for line in (result / "kernels-bug.log").read_text().splitlines() if ": $ " in line)
    assert f"{state / 'b-bug' / 'bin' / 'python'} -m moegate gate" in gate and "--tiers=dispatch,kernels" in gate
    phases = json.loads((result / "results.json").read_text())["phases"]
    assert phases["kernels-bug"]["exit"] == 1 and phases["build-clean"]["built"][0]["target"] == MOE
    extensions = json.loads((result / "extensions-bug.json").read_text())["extensions"]
    assert set(extensions) == {f"vllm/{MOE}.abi3.so"}


def test_a_call_short_of_budget_stops_before_a_phase_and_the_next_call_goes_on_from_it(tmp_path):
    _carry(tmp_path)
    calls, proc = _run(tmp_path, budget=200)
    summary = (tmp_path / "result" / "summary.txt").read_text()
    assert (
        proc.returncode == 0 and "build-clean: not started" in summary and "call again with the same STATE" in summary
    )
    assert not [c for c in calls if "rebuild-moe" in c]
    calls, proc = _run(tmp_path, budget=600, KERNELS_K="test_output_matches_reference", MIN_KERNEL_TESTS="1")
    assert proc.returncode == 0, proc.stderr
    legs = [c for c in calls if c[:2] == ["-m", "tooling.ci.gpu_leg"]]
    assert all(c[-4:] == ["--", "--", "-k", "test_output_matches_reference"] for c in legs) and len(legs) == 2
    calls, proc = _run(tmp_path, budget=600)  # everything done: nothing is built or run again
    assert not [c for c in calls if "rebuild-moe" in c or "tooling.ci.gpu_leg" in c]


def test_the_builds_alone_touch_no_gpu_and_a_later_call_runs_the_probe_and_legs_on_them(tmp_path):
    """compiled_build.sh builds beside faults.sh, which needs the GPU to itself: the architecture from nvidia-smi, no
    torch, no probe, no leg; compiled.sh with the same STATE then runs the probe and both legs without building."""
    _carry(tmp_path)
    calls, proc = _run(tmp_path, script=SCRIPT.with_name("compiled_build.sh"))
    assert proc.returncode == 0, proc.stderr
    assert len([c for c in calls if "rebuild-moe" in c]) == 2
    cuda = [c for c in calls if c[:1] == ["-c"] and "cuda" in c[1]]  # the architecture from torch, the probe
    assert not cuda and not [c for c in calls if c[:2] == ["-m", "tooling.ci.gpu_leg"]]
    assert "stopped after the builds (STOP_AFTER=build)" in (tmp_path / "result" / "summary.txt").read_text()
    calls, proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not [c for c in calls if "rebuild-moe" in c] and len([c for c in calls if "tooling.ci.gpu_leg" in c]) == 2


def test_what_the_script_needs_and_lacks_is_one_line_and_exit_2(tmp_path):
    _, proc = _run(tmp_path)
    carry = tmp_path / "carry.tar.xz"
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"compiled.sh: no carry at {carry} (python3 -m lab.gpu.compiled_carry SDIST CUTLASS_DIR {carry}, then carry it)"
    ]
    _carry(tmp_path)
    _, proc = _run(tmp_path, SITE=str(tmp_path / "nowhere"))
    assert (
        proc.returncode == 2
        and proc.stderr.strip() == f"compiled.sh: no vLLM in SITE={tmp_path / 'nowhere'} (lab/gpu/README.md's bring-up)"
    )


def test_the_carry_holds_the_build_inputs_and_cutlass_headers_only(tmp_path):
    carry = _carry(tmp_path)
    with tarfile.open(carry) as tar:
        names = set(tar.getnames())
        member = tar.extractfile("cutlass/VERSION")
        assert member is not None
        version = member.read().decode()
    assert {"vllm/CMakeLists.txt", "vllm/setup.py", f"vllm/{ALIGN}", "vllm/requirements/cuda.txt",
            "cutlass/include/cutlass/array.h"} <= names  # fmt: skip
    assert not [n for n in names if n.startswith(("vllm/vllm/", "vllm/docs/"))] and version == "4.7.1\n"


def test_the_carry_refuses_what_is_not_an_sdist_or_a_cutlass_tree_in_one_line(tmp_path, capsys):
    (tmp_path / "c" / "include" / "cutlass").mkdir(parents=True)
    (tmp_path / "c" / "include" / "cutlass" / "version.h").write_text("")
    (tmp_path / "junk.tar.gz").write_text("no")
    assert carry_main([str(tmp_path / "junk.tar.gz"), str(tmp_path / "c"), str(tmp_path / "o.tar.xz")]) == 2
    assert carry_main([str(tmp_path / "junk.tar.gz"), str(tmp_path), str(tmp_path / "o.tar.xz")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"compiled_carry: {tmp_path / 'junk.tar.gz'}: not a readable sdist")
    assert err[1] == f"compiled_carry: {tmp_path}: not a CUTLASS tree (no include/cutlass/version.h)"
    assert not list(tmp_path.glob("*o.tar.xz*"))


def test_the_bug_plants_in_vllm_0_33_0s_alignment_kernel_exactly_twice(tmp_path):
    tree = real_vllm_tree(tmp_path)
    if tree is None:
        pytest.skip(
            "no vLLM source tree here: set MOEGATE_VLLM_SRC to a folder or sdist (or put vllm-0.33.0.tar.gz in /tmp/sdist)"
        )
    script = SCRIPT.read_text()
    assert "BUG_FROM='] = numel;'" in script and "BUG_COUNT=2" in script
    text = (tree / ALIGN).read_text()
    assert text.count("] = numel;") == 2
    assert [line.strip() for line in text.splitlines() if "] = numel;" in line] == [
        "sorted_token_ids[sorted_token_ids_offset + it] = numel;"
    ] * 2  # the padding of both alignment kernels (the large-batch one and the small-batch-expert one)
