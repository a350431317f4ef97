"""The e2e gates for the H200's two pairs in one go: three servers, each started once (byte identity, ``compare_builds``).

    python3 -m tools.gpu.e2e_pairs --python033 PY --python032 PY --model DIR \\
        --prompts-file FILE --gsm8k-dir DIR --out DIR [--gsm8k-limit 250] [--bless]

Each ``PY`` is a build's interpreter, made with ``python3 -m moegate.vllm.planted DEST --python python3
--site $HOME/vllm-site --site $HOME/eval-site`` (no search-path variable); lm-eval runs on the 0.33.0 one.
The batch-robust gates of docs/e2e-rules.md, one pair per ``moegate.e2e run``: ``tools/gpu/e2e_plan.sh``.

Builds: vLLM 0.33.0 with experts resident, 0.33.0 with experts UVA-offloaded, 0.32.0
with experts UVA-offloaded. Pairs: (0.33.0 resident, 0.33.0 UVA) and (0.32.0 UVA,
0.33.0 UVA); the UVA 0.33.0 server serves both pairs. The gates check outputs, not
speed, so the three servers share the GPU: started one after another (vLLM's memory
profiling must not see another server start or stop), each running its gates as soon
as it is healthy, and no server stops before all three have started.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from moegate.e2e import greedy, prompts, report
from moegate.e2e import run as e2e
from moegate.serve.build import Build
from moegate.serve.server import Server

UVA = ("--offload-backend", "uva", "--cpu-offload-gb", "64", "--cpu-offload-params", "experts")
COMMON = (
    "--max-model-len", "4096", "--enforce-eager", "--dtype", "bfloat16", "--max-num-seqs", "4",
    "--no-enable-prefix-caching", "--gpu-memory-utilization", "0.25",
)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    for a in ("--python033", "--model", "--prompts-file", "--gsm8k-dir", "--out"):
        ap.add_argument(a, required=True)
    ap.add_argument("--python032", default="")
    ap.add_argument("--gsm8k-limit", type=int, default=250)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--bless", action="store_true")
    ap.add_argument("--builds", default="0.33.0-resident,0.33.0-uva,0.32.0-uva", help="a subset of the three")
    ap.add_argument("--gates", default="greedy,gsm8k")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py = args.python033  # lm-eval's too
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    builds = {
        "0.33.0-resident": Build("0.33.0-resident", py, env),
        "0.33.0-uva": Build("0.33.0-uva", py, env, UVA),
        "0.32.0-uva": Build("0.32.0-uva", args.python032, env, UVA),
    }
    builds = {k: v for k, v in builds.items() if k in args.builds.split(",")}
    gates = tuple(args.gates.split(","))
    opts = e2e.Options(
        model=args.model, server_args=COMMON, eval_python=py, gsm8k_limit=args.gsm8k_limit, gates=gates,
        gsm8k_dir=args.gsm8k_dir, bless=args.bless,
    )  # fmt: skip
    chosen = prompts.load(args.prompts, prompts_file=Path(args.prompts_file))
    start_lock = threading.Lock()
    runs: dict[str, e2e.BuildRun] = {}
    errors: dict[str, str] = {}

    class _Arrive:
        """A barrier that threads pass at once but that stops must wait for: all servers started."""

        def __init__(self, n: int) -> None:
            self.n, self.cond = n, threading.Condition()

        def arrive(self) -> None:
            with self.cond:
                self.n -= 1
                self.cond.notify_all()

        def all_in(self, timeout: float) -> None:
            with self.cond:
                self.cond.wait_for(lambda: self.n <= 0, timeout=timeout)

        def abort(self) -> None:
            with self.cond:
                self.n = 0
                self.cond.notify_all()

    all_started = _Arrive(len(builds))

    def one(b: Build) -> None:
        run = e2e.BuildRun(b)
        try:
            run.info = b.describe()
            t0 = time.monotonic()
            srv = Server(b, args.model, COMMON, log_path=out / f"server-{b.label}.log", gpu_release_timeout_s=0)
            with start_lock:
                srv.start()
            run.start_s = srv.started_s
            print(f"{b.label}: healthy after {srv.started_s:.0f} s", flush=True)
            try:
                all_started.arrive()  # passes at once; only the stops wait for every start
                if "greedy" in gates:
                    e2e.measure(srv, run, chosen, e2e.Options(**{**opts.__dict__, "gates": ("greedy",)}), out)
                    e2e.write_raw(run, out)
                    print(f"{b.label}: greedy done {run.seconds}", flush=True)
                if "gsm8k" in gates:
                    e2e.measure(srv, run, chosen, e2e.Options(**{**opts.__dict__, "gates": ("gsm8k",)}), out)
            finally:
                all_started.all_in(timeout=1200)
                srv.stop()
            run.seconds["total"] = time.monotonic() - t0
            e2e.write_raw(run, out)
            runs[b.label] = run
            print(f"{b.label}: done {run.seconds}", flush=True)
        except BaseException as exc:  # noqa: BLE001 - reported per build, the others go on
            errors[b.label] = f"{type(exc).__name__}: {exc}"
            print(f"{b.label}: FAILED {errors[b.label][:3000]}", flush=True)
            all_started.abort()

    threads = [threading.Thread(target=one, args=(b,)) for b in builds.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        (out / "errors.json").write_text(json.dumps(errors, indent=1))
        return 2
    decode = greedy.tokenizer_decoder(args.model)
    pages = []
    verdicts = {}
    for a, b in (("0.33.0-resident", "0.33.0-uva"), ("0.32.0-uva", "0.33.0-uva")):
        if a not in runs or b not in runs:
            continue
        results = e2e.compare_builds(runs[a], runs[b], opts, decode)
        for r in results:
            r.write_json(out / f"gate-{a}-vs-{b}-{''.join(c if c.isalnum() else '-' for c in r.gate)}.json")
        verdicts[f"{a} vs {b}"] = {r.gate: r.verdict for r in results}
        pages.append(
            report.render(f"moegate e2e on the H200: {a} vs {b}", [runs[a], runs[b]], results,
                          commands=["python " + " ".join(sys.argv)])
        )  # fmt: skip
    (out / "e2e-h200.md").write_text("\n\n".join(pages))
    (out / "verdicts.json").write_text(json.dumps(verdicts, indent=1))
    print(json.dumps(verdicts, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
