"""One vLLM server of a build, kept running until this process is stopped: a server several e2e pairs attach to.

    python3 -m lab.gpu.e2e_serve --python PY --model DIR --args "FLAGS" --url-file FILE [--log FILE]

Starts ``PY -m vllm.entrypoints.openai.api_server`` through ``moegate.serve.server.Server`` (its own process
group, ``/health`` polled, the whole log kept), writes the server's URL into ``--url-file`` once it is healthy,
then waits; SIGTERM, SIGHUP or SIGINT stop the server and its group (``teardown_on_termination``), and the
URL file is removed. ``lab/gpu/e2e_plan.sh`` runs the reference re-rounding of each model's base this way:
its log-probabilities are a yardstick of size (``--promise equivalent``), which another pair's requests
batched beside them do not move measurably, so one reference serves every pair of a model.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from moegate.serve.build import Build, env_pairs
from moegate.serve.server import Server, ServerError, teardown_on_termination


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lab.gpu.e2e_serve", description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--args", default="")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    ap.add_argument("--url-file", required=True, type=Path)
    ap.add_argument("--log", type=Path, default=None)
    ap.add_argument("--label", default="reference")
    ap.add_argument("--startup-timeout", type=float, default=600)
    args = ap.parse_args(argv)
    build = Build(args.label, args.python, env_pairs(args.env))
    log = args.log or args.url_file.with_suffix(".log")
    try:
        with teardown_on_termination():
            srv = Server(
                build, args.model, shlex.split(args.args), log_path=log, startup_timeout_s=args.startup_timeout
            )
            with srv:
                args.url_file.write_text(srv.url + "\n")
                print(f"{args.label}: {srv.url} healthy after {srv.started_s:.0f} s", flush=True)
                try:
                    while True:
                        srv.check_alive()
                        time.sleep(2)
                finally:
                    args.url_file.unlink(missing_ok=True)
    except ServerError as exc:
        print(f"e2e_serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
