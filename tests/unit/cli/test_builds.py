"""``moegate builds``, run as the caller's wheels job runs it: a real process, real git repositories, real wheels."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile

import pytest

from tests.support import ROOT
from tests.support.vllm_tree import FILES, branch, commit, make_repo

MOE = "_moe_C_stable_libtorch"
LINE = "compiled MoE sources changed (csrc/moe/moe_align_sum_kernels.cu): this runner cannot build them"


def builds(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "moegate", "builds", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
    )


@pytest.fixture
def repo(tmp_path):
    r, base = make_repo(tmp_path / "vllm")
    branch(r, "pr", base)
    return r, base


def test_a_moe_change_with_no_rebuild_prints_the_list_and_exits_1_with_the_one_line(repo, tmp_path):
    r, base = repo
    head = commit(r, {"csrc/moe/moe_align_sum_kernels.cu": "// bug\n", "docs/index.md": "# x\n"})
    out = builds("changes", "--vllm-src", r, "--base", base, "--head", head, "--json", tmp_path / "ch.json")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [LINE]
    assert f"MoE  csrc/moe/moe_align_sum_kernels.cu: a source of {MOE} [{MOE}]" in out.stdout
    record = json.loads((tmp_path / "ch.json").read_text())
    assert (
        record["base"] == base
        and record["head"] == head
        and record["changed"]
        == [
            "csrc/moe/moe_align_sum_kernels.cu",
            "docs/index.md",
        ]
    )


def test_a_moe_change_the_runner_rebuilt_passes(repo):
    r, base = repo
    head = commit(r, {"csrc/moe/moe_align_sum_kernels.cu": "// bug\n"})
    out = builds("changes", "--vllm-src", r, "--base", base, "--head", head, "--rebuilt", MOE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == f"compiled MoE sources changed (1 files): rebuilt from the PR's tree ({MOE})"


@pytest.mark.parametrize(
    ("changes", "last"),
    [
        ({"csrc/attention/paged.cu": "// faster\n"}, "no compiled source of the fused-MoE ops changed"),
        ({"docs/index.md": "# docs\n"}, "no compiled source changed"),
    ],
)
def test_attention_alone_or_docs_pass(repo, changes, last):
    r, base = repo
    head = commit(r, changes)
    out = builds("changes", "--vllm-src", r, "--base", base, "--head", head)
    assert (out.returncode, out.stderr, out.stdout.splitlines()[-1]) == (0, "", last)


def test_bad_input_is_one_line_and_exit_2(repo, tmp_path):
    r, base = repo
    (tmp_path / "plain").mkdir()
    for args, says in [
        (("changes", "--vllm-src", tmp_path / "plain", "--base", base, "--head", base), "not a git repository"),
        (("changes", "--vllm-src", r, "--base", "f" * 40, "--head", base), f"no commit {'f' * 40}"),
        (("hashes", tmp_path / "plain", "--json", tmp_path / "h.json"), "no vllm package"),
        (("compare", "--base", tmp_path / "no.json", "--pr", tmp_path / "no.json", "--changes", tmp_path / "no.json"),
         "cannot read the base build's record"),
    ]:  # fmt: skip
        out = builds(*args)
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and says in out.stderr, out.stderr
    assert not (tmp_path / "h.json").exists()


def _wheel(path, moe: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr(f"vllm/{MOE}.abi3.so", moe)
        z.writestr("vllm/_C_stable_libtorch.abi3.so", b"c")
    return path


def test_hashes_and_compare_of_a_moe_change_fail_on_the_bases_binaries_and_pass_on_a_rebuilt_one(repo, tmp_path):
    r, base = repo
    head = commit(r, {"csrc/moe/moe_align_sum_kernels.cu": "// bug\n"})
    builds("changes", "--vllm-src", r, "--base", base, "--head", head, "--json", tmp_path / "ch.json")
    (tmp_path / "base").mkdir()
    (tmp_path / "pr").mkdir()
    for name, moe in (("base", b"moe"), ("pr", b"moe"), ("rebuilt", b"moe, rebuilt")):
        wheel = _wheel(tmp_path / ("base" if name == "base" else "pr") / f"{name}.whl", moe)
        out = builds("hashes", wheel, "--json", tmp_path / f"{name}.json")
        assert out.returncode == 0, out.stderr
    rec = json.loads((tmp_path / "base.json").read_text())
    assert rec["extensions"][f"vllm/{MOE}.abi3.so"] == hashlib.sha256(b"moe").hexdigest()
    same = builds("compare", "--base", tmp_path / "base.json", "--pr", tmp_path / "pr.json",
                  "--changes", tmp_path / "ch.json", "--json", tmp_path / "verdict.json")  # fmt: skip
    assert same.returncode == 1 and same.stdout.splitlines()[-1] == f"FAIL: {LINE}"
    assert json.loads((tmp_path / "verdict.json").read_text())["verdict"] == f"FAIL: {LINE}"
    own = builds("compare", "--base", tmp_path / "base.json", "--pr", tmp_path / "rebuilt.json",
                 "--changes", tmp_path / "ch.json")  # fmt: skip
    assert own.returncode == 0 and own.stdout.splitlines()[-1].startswith(
        "PASS: compiled MoE sources changed (1 files)"
    )


def test_compare_of_a_docs_change_needs_identical_extensions(repo, tmp_path):
    r, base = repo
    head = commit(r, {"docs/index.md": "# docs\n"})
    builds("changes", "--vllm-src", r, "--base", base, "--head", head, "--json", tmp_path / "ch.json")
    for name, moe in (("base", b"moe"), ("pr", b"moe"), ("other", b"moe from elsewhere")):
        builds("hashes", _wheel(tmp_path / f"{name}.whl", moe), "--json", tmp_path / f"{name}.json")
    ok = builds(
        "compare", "--base", tmp_path / "base.json", "--pr", tmp_path / "pr.json", "--changes", tmp_path / "ch.json"
    )
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == (
        "PASS: no compiled source changed; the 2 extensions are identical in both builds"
    )
    bad = builds(
        "compare", "--base", tmp_path / "base.json", "--pr", tmp_path / "other.json", "--changes", tmp_path / "ch.json"
    )
    assert (
        bad.returncode == 1
        and "FAIL: the MoE extension differs though no source it compiles from changed" in bad.stdout
    )
    assert f"{hashlib.sha256(b'moe').hexdigest()}  vllm/{MOE}.abi3.so" in bad.stdout  # both records in the report


def test_pin_prints_the_env_lines_and_a_commit_with_no_wheel_is_one_line(repo, tmp_path):
    r, base = repo
    index = tmp_path / "index"
    meta = index / base / "cu130" / "vllm" / "metadata.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps([{"package_name": "vllm", "platform_tag": "manylinux1_x86_64", "path": "../v.whl"}]))
    env = tmp_path / "github_env"
    out = builds("pin", "--vllm-src", r, "--commit", base, "--variant", "cu130", "--index", index.as_uri(),
                 "--arch", "x86_64", "--env", env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    want = [
        f"VLLM_PRECOMPILED_WHEEL_LOCATION={index.as_uri()}/{base}/cu130/v.whl",
        f"VLLM_PRECOMPILED_WHEEL_COMMIT={base}",
        "VLLM_PRECOMPILED_WHEEL_VARIANT=cu130",
    ]
    assert out.stdout.splitlines() == want and env.read_text().splitlines() == want
    head = commit(r, {"docs/index.md": "# y\n"})
    missing = builds("pin", "--vllm-src", r, "--commit", head, "--variant", "cu130", "--index", index.as_uri())
    assert missing.returncode == 1 and missing.stderr.splitlines() == [
        (
            f"precompiled build cannot be pinned: no precompiled wheel published for {head} (cu130):"
            f" {index.as_uri()}/{head}/cu130/vllm/metadata.json: [Errno 2] No such file or directory:"
            f" '{index}/{head}/cu130/vllm/metadata.json'"
        )
    ]


def test_a_vllm_whose_setup_py_cannot_be_pinned_is_one_line(tmp_path):
    files = dict(FILES, **{"setup.py": "import os\nos.getenv('VLLM_USE_PRECOMPILED')\n"})
    r, base = make_repo(tmp_path / "old", files)
    out = builds("pin", "--vllm-src", r, "--commit", base, "--variant", "cu130", "--index", tmp_path.as_uri())
    assert out.returncode == 1 and out.stderr.splitlines() == [
        (
            f"precompiled build cannot be pinned: {r / 'setup.py'}: does not read VLLM_PRECOMPILED_WHEEL_LOCATION:"
            " this vLLM's precompiled build cannot be pinned"
        )
    ]


def _publish(index, sha):
    meta = index / sha / "cu130" / "vllm" / "metadata.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps([{"package_name": "vllm", "platform_tag": "manylinux1_x86_64", "path": "../v.whl"}]))


def test_pin_search_takes_an_older_wheel_only_where_no_compiled_source_changed_since(repo, tmp_path):
    r, published = repo
    index = tmp_path / "index"
    _publish(index, published)
    docs = commit(r, {"docs/index.md": "# docs\n"})  # main moved on by a docs change: not yet published
    args = ("pin", "--vllm-src", r, "--variant", "cu130", "--index", index.as_uri(), "--arch", "x86_64")
    out = builds(*args, "--commit", docs, "--search", "20")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == f"VLLM_PRECOMPILED_WHEEL_COMMIT={published}"
    assert f"{published}, 1 commits older, has one" in out.stderr
    assert builds(*args, "--commit", docs).returncode == 1  # no search: the merge base's own wheel or nothing
    kernel = commit(r, {"csrc/attention/paged.cu": "// faster\n"})
    out = builds(*args, "--commit", kernel, "--search", "20")
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1
    assert out.stderr.rstrip().endswith(
        f"the nearest published wheel ({published}, 2 commits older) was built from other compiled sources"
        " (csrc/attention/paged.cu)"
    )
