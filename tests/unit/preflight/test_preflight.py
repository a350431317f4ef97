"""Runner preflight (moegate/preflight/): each check one line, a failure names its cause, the JSON whole; a GPU it
cannot see is one line and exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from moegate.preflight import checks, cli, host, needs, pcie
from moegate.preflight.report import Report
from tests.support import ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the no-GPU failure; this machine has a CUDA GPU")
def test_a_runner_whose_gpu_torch_cannot_see_is_one_line_and_exit_2_with_nothing_written(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "preflight.json"
    assert cli.main(["--json", str(out), "--disk-path", str(tmp_path), "--need-disk-gib", "0"]) == 2
    said = capsys.readouterr()
    assert said.out == ""
    (line,) = said.err.splitlines()
    assert line.startswith("moegate preflight: no GPU this runner can see: torch.cuda.is_available() is False")
    assert list(tmp_path.iterdir()) == []


def test_too_little_disk_fails_and_enough_passes(tmp_path: Path) -> None:
    lines: list[str] = []
    report = Report()
    checks.check_disk(report, tmp_path / "envs" / "not-yet", 1e9, lines.append)
    checks.check_disk(report, tmp_path, 0.0, lines.append)
    assert lines[0].startswith("FAIL disk:") and "the environments need 1e+09 GiB" in lines[0]
    assert lines[1].startswith("ok   disk:")
    assert not report.ok


@pytest.mark.parametrize(
    ("speed", "gen"),
    [
        ("32.0 GT/s PCIe", 5),
        ("16.0 GT/s PCIe\n", 4),
        ("8.0 GT/s PCIe", 3),
        ("2.5 GT/s", 1),
        ("Unknown", None),
        ("", None),
    ],
)
def test_a_sysfs_link_speed_names_its_pcie_generation(speed: str, gen: int | None) -> None:
    assert pcie.gen_from_speed(speed) == gen


def test_nvidia_smi_link_output_is_read_for_the_first_gpu() -> None:
    assert pcie.parse_nvidia_smi("4, 5, 16, 16\n1, 5, 16, 16\n") == {
        "gen": 4,
        "gen_max": 5,
        "width": 16,
        "width_max": 16,
    }
    with pytest.raises(ValueError, match="unexpected nvidia-smi output"):
        pcie.parse_nvidia_smi("[N/A], 5, 16, 16")


def test_host_memory_available_is_read_from_this_machine() -> None:
    available = host.mem_available_gib()
    assert available is not None and available > 0


@pytest.mark.parametrize("args", [["--uva-gib", "0"], ["--need-pinned-gib", "-1"], ["--repeats", "0"]])
def test_bad_input_gets_one_line_and_exit_2_and_writes_nothing(tmp_path: Path, capsys, args: list[str]) -> None:
    out = tmp_path / "p.json"
    assert cli.main([*args, "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moegate preflight: --")
    assert not out.exists()


def test_the_pinned_need_follows_the_models_the_legs_serve() -> None:
    """Twice each model's experts (a pair's two servers at once): the committed trained model holds 2 layers x 64
    experts x 3 x 64 x 256 bf16 = 12.6 MB of experts, so its pair needs 0.0234 GiB; a given figure adds to it."""
    trained = ROOT / "models" / "e2e-trained"
    need, why = needs.pinned_need([trained], None)
    assert need == pytest.approx(2 * 2 * 64 * 3 * 64 * 256 * 2 / 2**30)
    assert why == f"2 x e2e-trained's experts ({need:.3f})"
    both, _ = needs.pinned_need([trained, trained], 5.0)
    assert both == pytest.approx(2 * need + 5.0)
    assert needs.pinned_need([], None)[0] == needs.DEFAULT_PINNED_GIB
    assert needs.pinned_need([], 3.0) == (3.0, "given")


def test_a_model_without_an_moe_config_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.json"
    assert cli.main(["--model", str(tmp_path), "--checks", "disk", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"moegate preflight: --model {tmp_path}: no MoE config.json")
    assert not out.exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="shows the no-driver failure; this machine has one")
def test_a_runner_without_the_nvidia_driver_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    """The check a GPU leg runs before building its environments, with the runner's Python and no torch."""
    args = [
        "--checks",
        "driver,disk",
        "--need-disk-gib",
        "0",
        "--disk-path",
        str(tmp_path),
        "--json",
        str(tmp_path / "p.json"),
    ]
    assert cli.main(args) == 2
    said = capsys.readouterr()
    assert said.out == "" and not (tmp_path / "p.json").exists()
    assert said.err.splitlines() == [
        "moegate preflight: no GPU this runner can see: nvidia-smi is not on PATH (no NVIDIA driver)"
    ]


def test_an_nvidia_smi_that_lists_no_gpu_is_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    """A real ``nvidia-smi`` on PATH whose driver has lost its GPU (the message NVIDIA's tool prints, its exit 6)."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    assert cli.main(["--checks", "driver", "--json", str(tmp_path / "p.json")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("moegate preflight: no GPU this runner can see: nvidia-smi lists no usable GPU (")
    assert not (tmp_path / "p.json").exists()


def test_nvidia_smis_name_and_memory_are_read_for_the_first_gpu() -> None:
    name, gib = checks.parse_smi_gpu("NVIDIA GeForce RTX 4090, 24564\nNVIDIA H200, 143771\n")
    assert name == "NVIDIA GeForce RTX 4090" and gib == pytest.approx(23.99, abs=0.01)
    with pytest.raises(ValueError, match="unexpected nvidia-smi output"):
        checks.parse_smi_gpu("No devices were found")


def test_an_unknown_check_is_refused(capsys) -> None:
    assert cli.main(["--checks", "gpu,vibes"]) == 2
    assert "--checks 'gpu,vibes': choose from driver, gpu, disk" in capsys.readouterr().err


class _HostThatPins:
    """Stands in for torch where pinning needs a CUDA host (this machine has none): pins up to ``limit`` GiB, then
    raises as cudaHostAlloc's refusal does. The decision and its line are what is under test, not the driver."""

    uint8 = "uint8"

    def __init__(self, limit: float) -> None:
        self.limit, self.pinned = limit, 0.0

    def empty(self, n: int, dtype: str, pin_memory: bool) -> bytes:
        assert pin_memory
        if self.pinned + n / 2**30 > self.limit + 1e-9:
            raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        self.pinned += n / 2**30
        return b""


def test_too_little_pinnable_memory_fails_in_one_line_naming_the_need_and_why() -> None:
    lines: list[str] = []
    report = Report()
    host.check_pinned(report, _HostThatPins(1e9), 64.0, "given", lines.append, available=12.5)
    assert lines == ["FAIL pinned: 12.5 GiB of host memory available, the offload needs 64 (given)"]
    host.check_pinned(report, _HostThatPins(2.0), 3.5, "2 x wide's experts (3.500)", lines.append, available=100.0)
    assert lines[1] == (
        "FAIL pinned: could pin only 2 of the 3.5 GiB the offloading tiers need (2 x wide's experts (3.500)): "
        "cudaHostAlloc refused"
    )
    host.check_pinned(report, _HostThatPins(8.0), 3.5, "given", lines.append, available=100.0)
    assert lines[2].startswith("ok   pinned: pinned 3.5 GiB in ")
    assert report.facts["pinnable_gib"] == 3.5 and not report.ok


def test_other_processes_on_the_gpu_are_named_as_information_since_they_share_the_bus(monkeypatch) -> None:
    from moegate.core.faults import GpuProcess

    lines: list[str] = []
    held = [GpuProcess(4242, 900.0), GpuProcess(77, 1024.0), GpuProcess(78, 2048.0)]
    monkeypatch.setattr(checks.processes, "gpu_processes", lambda: held)
    report = Report()
    checks.check_shared(report, lines.append, own=4242)
    said = "info shared: 2 other process(es) hold 3.0 GiB of GPU memory (pids 77, 78): work beside the read shares"
    assert lines == [said + " the bus, so the uva figure may be low"]
    assert report.ok and report.facts["gpu_other_processes"] == 2
    lines.clear()
    monkeypatch.setattr(checks.processes, "gpu_processes", lambda: [GpuProcess(4242, 900.0)])
    checks.check_shared(report := Report(), lines.append, own=4242)
    assert lines == [] and report.facts["gpu_other_processes"] == 0
    monkeypatch.setattr(checks.processes, "gpu_processes", lambda: None)  # no NVML: nothing said, nothing claimed
    checks.check_shared(report := Report(), lines.append, own=4242)
    assert lines == [] and "gpu_other_processes" not in report.facts


@pytest.mark.parametrize(
    ("total", "kernels", "e2e", "ab"),
    [(79.2, 19.88, 22.8, 21.3), (140.4, 29.06, 38.1, 36.6), (24.0, 16.0, 9.0, 7.5)],
    ids=["H100", "H200", "RTX 4090"],
)
def test_each_legs_gpu_need_is_vllms_start_check_plus_what_its_own_processes_hold(total, kernels, e2e, ab) -> None:
    """needs.py's figures: kernels max(16, 0.15 T + 8), e2e 0.25 T + 2 x 1.5, ab 0.25 T + 1.5 (GiB)."""
    assert needs.gpu_need("kernels", total) == pytest.approx(kernels)
    assert needs.gpu_need("e2e", total) == pytest.approx(e2e)
    assert needs.gpu_need("ab", total) == pytest.approx(ab)
    both, why = needs.gpu_needs(["kernels", "e2e", "e2e"], total)
    assert both == pytest.approx(kernels + 2 * e2e)
    assert why == f"kernels {kernels:.1f} + e2e {e2e:.1f} + e2e {e2e:.1f}"


def test_free_gpu_memory_below_the_legs_need_fails_naming_the_need_and_the_legs() -> None:
    lines: list[str] = []
    report = Report()
    checks.check_gpu_memory(report, 12.0, 79.2, ["kernels"], lines.append)
    checks.check_gpu_memory(report, 60.0, 79.2, ["kernels", "e2e"], lines.append)
    checks.check_gpu_memory(report, 60.0, 79.2, [], lines.append)
    assert lines == [
        "FAIL gpu-memory: 12.0 of 79.2 GiB free, the legs need 19.9 (kernels 19.9): other work holds the rest",
        "ok   gpu-memory: 60.0 of 79.2 GiB free (the legs need 42.7: kernels 19.9 + e2e 22.8)",
        "info gpu-memory: 60.0 of 79.2 GiB free (no --leg: no need checked)",
    ]
    assert not report.ok and report.facts["gpu_need_gib"] == 42.7


def test_an_unknown_leg_is_refused_in_one_line(capsys) -> None:
    assert cli.main(["--checks", "disk", "--leg", "bench"]) == 2
    assert capsys.readouterr().err.strip() == "moegate preflight: --leg 'bench': choose from kernels, e2e, ab"
