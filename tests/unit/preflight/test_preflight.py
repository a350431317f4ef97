"""Runner preflight (moegate/preflight.py): each check one line, a failure names its cause, the JSON whole."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from moegate import preflight
from tests.support import ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the no-GPU failure; this machine has a CUDA GPU")
def test_a_runner_without_a_gpu_fails_with_the_cause_and_a_whole_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "preflight.json"
    assert preflight.main(["--json", str(out), "--disk-path", str(tmp_path), "--need-disk-gib", "0"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("FAIL gpu: no CUDA GPU")
    assert lines[-1] == "preflight: FAIL (gpu, uva, pinned)"
    report = json.loads(out.read_text())
    assert report["ok"] is False and report["uva_read_gbps"] is None and report["gpu"] is None
    assert [c["name"] for c in report["checks"]] == ["gpu", "uva", "pinned", "disk"]
    assert not list(tmp_path.glob("*.tmp"))


def test_too_little_disk_fails_and_enough_passes(tmp_path: Path) -> None:
    lines: list[str] = []
    report = preflight.Report()
    preflight.check_disk(report, tmp_path / "envs" / "not-yet", 1e9, lines.append)
    preflight.check_disk(report, tmp_path, 0.0, lines.append)
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
    assert preflight.gen_from_speed(speed) == gen


def test_nvidia_smi_link_output_is_read_for_the_first_gpu() -> None:
    assert preflight.parse_nvidia_smi("4, 5, 16, 16\n1, 5, 16, 16\n") == {
        "gen": 4,
        "gen_max": 5,
        "width": 16,
        "width_max": 16,
    }
    with pytest.raises(ValueError, match="unexpected nvidia-smi output"):
        preflight.parse_nvidia_smi("[N/A], 5, 16, 16")


def test_host_memory_available_is_read_from_this_machine() -> None:
    available = preflight.mem_available_gib()
    assert available is not None and available > 0


@pytest.mark.parametrize("args", [["--uva-gib", "0"], ["--need-pinned-gib", "-1"], ["--repeats", "0"]])
def test_bad_input_gets_one_line_and_exit_2_and_writes_nothing(tmp_path: Path, capsys, args: list[str]) -> None:
    out = tmp_path / "p.json"
    assert preflight.main([*args, "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moegate preflight: --")
    assert not out.exists()


def test_the_pinned_need_follows_the_models_the_legs_serve() -> None:
    """Twice each model's experts (a pair's two servers at once): the committed trained model holds 2 layers x 64
    experts x 3 x 64 x 256 bf16 = 12.6 MB of experts, so its pair needs 0.0234 GiB; a given figure adds to it."""
    trained = ROOT / "models" / "e2e-trained"
    need, why = preflight.pinned_need([trained], None)
    assert need == pytest.approx(2 * 2 * 64 * 3 * 64 * 256 * 2 / 2**30)
    assert why == f"2 x e2e-trained's experts ({need:.3f})"
    both, _ = preflight.pinned_need([trained, trained], 5.0)
    assert both == pytest.approx(2 * need + 5.0)
    assert preflight.pinned_need([], None)[0] == preflight.DEFAULT_PINNED_GIB
    assert preflight.pinned_need([], 3.0) == (3.0, "given")


def test_a_model_without_an_moe_config_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.json"
    assert preflight.main(["--model", str(tmp_path), "--checks", "disk", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"moegate preflight: --model {tmp_path}: no MoE config.json")
    assert not out.exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="shows the no-driver failure; this machine has one")
def test_a_runner_without_the_nvidia_driver_fails_the_driver_check_in_one_line(tmp_path: Path, capsys) -> None:
    """The check a GPU leg runs before building its environments, with the runner's Python and no torch."""
    args = ["--checks", "driver,disk", "--need-disk-gib", "0", "--disk-path", str(tmp_path)]
    assert preflight.main(args) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "FAIL driver: no NVIDIA driver here: nvidia-smi is not on PATH, so no GPU tier can run"
    assert lines[1].startswith("ok   disk:") and lines[-1] == "preflight: FAIL (driver)"


def test_nvidia_smis_name_and_memory_are_read_for_the_first_gpu() -> None:
    name, gib = preflight.parse_smi_gpu("NVIDIA GeForce RTX 4090, 24564\nNVIDIA H200, 143771\n")
    assert name == "NVIDIA GeForce RTX 4090" and gib == pytest.approx(23.99, abs=0.01)
    with pytest.raises(ValueError, match="unexpected nvidia-smi output"):
        preflight.parse_smi_gpu("No devices were found")


def test_an_unknown_check_is_refused(capsys) -> None:
    assert preflight.main(["--checks", "gpu,vibes"]) == 2
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
    report = preflight.Report()
    preflight.check_pinned(report, _HostThatPins(1e9), 64.0, "given", lines.append, available=12.5)
    assert lines == ["FAIL pinned: 12.5 GiB of host memory available, the offload needs 64 (given)"]
    preflight.check_pinned(report, _HostThatPins(2.0), 3.5, "2 x wide's experts (3.500)", lines.append, available=100.0)
    assert lines[1] == (
        "FAIL pinned: could pin only 2 of the 3.5 GiB the offloading tiers need (2 x wide's experts (3.500)): "
        "cudaHostAlloc refused"
    )
    preflight.check_pinned(report, _HostThatPins(8.0), 3.5, "given", lines.append, available=100.0)
    assert lines[2].startswith("ok   pinned: pinned 3.5 GiB in ")
    assert report.facts["pinnable_gib"] == 3.5 and not report.ok


def test_other_processes_on_the_gpu_are_named_as_information_since_they_share_the_bus(monkeypatch) -> None:
    from moegate import preflight

    lines: list[str] = []
    monkeypatch.setattr(preflight, "gpu_pids", lambda: {4242, 77, 78})
    report = preflight.Report()
    preflight.check_shared(report, lines.append, own=4242)
    said = "info shared: 2 other process(es) hold GPU memory (pids 77, 78): work beside the read shares the bus"
    assert lines == [said + ", so the uva figure may be low"]
    assert report.ok and report.facts["gpu_other_processes"] == 2
    lines.clear()
    monkeypatch.setattr(preflight, "gpu_pids", lambda: {4242})
    preflight.check_shared(report := preflight.Report(), lines.append, own=4242)
    assert lines == [] and report.facts["gpu_other_processes"] == 0
    monkeypatch.setattr(preflight, "gpu_pids", lambda: None)  # no nvidia-smi: nothing said, nothing claimed
    preflight.check_shared(report := preflight.Report(), lines.append, own=4242)
    assert lines == [] and "gpu_other_processes" not in report.facts
