"""One e2e run's per-token numbers, compact enough to commit: what the scored and decode rules read, without text.

The panel's archives came back with each pair's ``scores.json`` and greedy records (up to 11 MB a pair), which the
committed raw left out; so the `equivalent` rule's next design step, telling a re-rounding from a bug by kind rather
than by size (issue 29; results/e2e-promises-h200.md, finding 4), had no per-token data to work from. This keeps,
as float32 and int32 arrays in one ``.npz`` (no pickle, no prompt text, no GSM8K question):

- ``scored/LABEL/K/{logprob,best,second,rank}``: per scored token of every sequence build LABEL scored in composition
  K, its log-probability, the best and second-best candidates' log-probabilities, and its rank (-1: not given);
  ``scored/LABEL/K/offsets`` and ``.../seq_ids`` cut them into sequences (the reference scores the base's only);
- ``greedy/LABEL/PASS/{token,logprob,best,second}`` and ``.../offsets``, ``.../prompt_ids``: each greedy pass
  (``1``, ``4``: in flight; ``repeat-4``), per generated token its id, its log-probability as decoded, the best and
  second-best candidates'.

    python -m lab.gpu.compact_run RUN_DIR OUT.npz      # RUN_DIR: a pair's ``run/`` folder (greedy-*.json, scores.json)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from moegate.e2e.greedy_passes import Completion
from moegate.e2e.run_data import read_raw, read_scores

NAN = float("nan")


def _top2(top: Sequence[tuple[int, float]]) -> tuple[float, float]:
    lps = sorted((lp for _, lp in top), reverse=True)
    return (lps[0] if lps else NAN, lps[1] if len(lps) > 1 else NAN)


def _greedy(prefix: str, passes: list[Completion], out: dict[str, np.ndarray]) -> None:
    tokens, logprobs, best, second, offsets = [], [], [], [], [0]
    for c in passes:
        for i, tok in enumerate(c.token_ids):
            top = c.top[i] if i < len(c.top) else []
            tokens.append(tok)
            logprobs.append(dict(top).get(tok, NAN))
            b, s = _top2(top)
            best.append(b)
            second.append(s)
        offsets.append(len(tokens))
    out[f"{prefix}/token"] = np.asarray(tokens, dtype=np.int32)
    for name, values in (("logprob", logprobs), ("best", best), ("second", second)):
        out[f"{prefix}/{name}"] = np.asarray(values, dtype=np.float32)
    out[f"{prefix}/offsets"] = np.asarray(offsets, dtype=np.int64)
    out[f"{prefix}/prompt_ids"] = np.asarray([c.prompt_id for c in passes], dtype=str)


def compact(run_dir: Path) -> dict[str, np.ndarray]:
    """The arrays of the module docstring, from a run's raw folder; ValueError naming what is missing."""
    out: dict[str, np.ndarray] = {}
    labels = sorted(p.name[len("greedy-") : -len(".json")] for p in run_dir.glob("greedy-*.json"))
    data = read_scores(run_dir)
    if not labels and data is None:
        raise ValueError(f"{run_dir}: no greedy-*.json and no scores.json: not an e2e run's raw folder")
    for label in labels:
        run = read_raw(run_dir, label, gsm8k_runs=False)
        for c, passes in run.greedy.items():
            _greedy(f"greedy/{label}/{c}", passes, out)
        for c, passes in run.repeat.items():
            _greedy(f"greedy/{label}/repeat-{c}", passes, out)
    if data is not None:
        seqs = data.sequences
        for label, per in data.scores.items():
            for k, by_id in enumerate(per):
                rows = [by_id[s.seq_id] for s in seqs if s.seq_id in by_id]  # the reference scores the base's only
                key = f"scored/{label}/{k}"
                tops = [_top2(t) for r in rows for t in (r.top or [[]] * len(r.logprobs))]
                out[f"{key}/seq_ids"] = np.asarray([r.seq_id for r in rows], dtype=str)
                out[f"{key}/offsets"] = np.concatenate([[0], np.cumsum([len(r.logprobs) for r in rows])]).astype(
                    np.int64
                )
                out[f"{key}/logprob"] = np.asarray([v for r in rows for v in r.logprobs], dtype=np.float32)
                out[f"{key}/best"] = np.asarray([b for b, _ in tops], dtype=np.float32)
                out[f"{key}/second"] = np.asarray([s for _, s in tops], dtype=np.float32)
                out[f"{key}/rank"] = np.asarray(
                    [-1 if v is None else int(v) for r in rows for v in r.ranks], dtype=np.int32
                )
    return out


def per_item(z: np.lib.npyio.NpzFile, key: str, field: str, ids: str = "prompt_ids") -> dict[str, np.ndarray]:
    """One field of a pass read back, cut per prompt (or per sequence, ``ids="seq_ids"``): ``per_item(z,
    "greedy/base/1", "logprob")`` -> {prompt id: that prompt's log-probabilities}."""
    off, names, vals = z[f"{key}/offsets"], z[f"{key}/{ids}"], z[f"{key}/{field}"]
    return {str(n): vals[off[i] : off[i + 1]] for i, n in enumerate(names)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.gpu.compact_run", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    try:
        arrays = compact(args.run_dir)
    except (ValueError, OSError, KeyError) as exc:
        print(f"compact_run: {exc}", file=sys.stderr)
        return 2
    tmp = args.out.with_name(args.out.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)  # type: ignore[arg-type]  # numpy types the keywords as its allow_pickle flag
    tmp.replace(args.out)
    print(f"compact_run: {len(arrays)} arrays, {args.out.stat().st_size} bytes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
