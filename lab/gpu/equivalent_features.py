"""The statistics the ``equivalent`` rule judges, per pair, from the committed per-token numbers (``compact.npz``).

    python -m lab.gpu.equivalent_features DIR...     # each DIR holds a pair's compact.npz (lab/gpu/compact_run.py)

Per pair and in-flight count, on the base's sequences (scored in prefill, composition 0) and the common prefix of
the two builds' greedy passes: the PR's mean |change| per token in prefill and on the decode path, each over the
reference re-rounding's (with the rule's bootstrap upper bound), the path balance (decode over prefill on the same
tokens, and its bound), the bias (mean signed change per prompt, with its t interval), and the largest change of
one token. These are the figures docs/design/e2e-rules.md derives ``KAPPA``, ``KAPPA_MODEL``, ``RHO``, ``BIAS_FACTOR`` and
``TOKEN_FLOOR`` from; the verdicts themselves come from ``python -m moegate.e2e compare`` on the run's raw folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from lab.gpu.compact_run import per_item
from moegate.e2e.rules.equivalent import ratio, tost


def _split(z: np.lib.npyio.NpzFile, key: str, ids: str) -> dict[str, np.ndarray]:
    return {k: v.astype(float) for k, v in per_item(z, key, "logprob", ids).items()}


def _tokens(z: np.lib.npyio.NpzFile, key: str) -> dict[str, np.ndarray]:
    return per_item(z, key, "token")


def _prefix(x: np.ndarray, y: np.ndarray, *lps: np.ndarray) -> int:
    """The common prefix of two token passes, cut where a log-probability was not reported (NaN)."""
    n = min(x.size, y.size, *(v.size for v in lps))
    bad = (x[:n] != y[:n]) | np.any([np.isnan(v[:n]) for v in lps], axis=0) if lps else x[:n] != y[:n]
    diff = np.nonzero(bad)[0]
    return int(diff[0]) if diff.size else n


def features(path: Path, c: int) -> dict[str, float]:
    z = np.load(path)
    pre = {lab: _split(z, f"scored/{lab}/0", "seq_ids") for lab in ("base", "pr", "reference")}
    dec = {lab: _split(z, f"greedy/{lab}/{c}", "prompt_ids") for lab in ("base", "pr", "reference")}
    tok = {lab: _tokens(z, f"greedy/{lab}/{c}") for lab in ("base", "pr", "reference")}
    scored_tok = _tokens(z, "greedy/base/1")  # the scored sequences are the base's continuations at 1 in flight
    sums: dict[str, dict[str, tuple[float, int]]] = {
        k: {} for k in ("pre", "pre_ref", "dec", "dec_ref", "bal_d", "bal_p")
    }
    deltas, largest = [], 0.0
    for sid, a in pre["base"].items():
        if sid not in pre["reference"]:  # the PR's continuations (+pr): the reference scores the base's only
            continue
        b, r = pre["pr"][sid], pre["reference"][sid]
        sums["pre"][sid] = (float(np.abs(b - a).sum()), a.size)
        sums["pre_ref"][sid] = (float(np.abs(r - a).sum()), a.size)
        deltas.append(float((b - a).mean()))
        largest = max(largest, float(np.abs(b - a).max()))
        n = _prefix(tok["base"][sid], tok["pr"][sid], dec["base"][sid], dec["pr"][sid])
        sums["dec"][sid] = (float(np.abs(dec["pr"][sid][:n] - dec["base"][sid][:n]).sum()), n)
        nr = _prefix(tok["base"][sid], tok["reference"][sid], dec["base"][sid], dec["reference"][sid])
        sums["dec_ref"][sid] = (float(np.abs(dec["reference"][sid][:nr] - dec["base"][sid][:nr]).sum()), nr)
        m = min(n, _prefix(tok["base"][sid], scored_tok[sid]))
        if m:
            sums["bal_d"][sid] = (float(np.abs(dec["pr"][sid][:m] - dec["base"][sid][:m]).sum()), m)
            sums["bal_p"][sid] = (float(np.abs(b[:m] - a[:m]).sum()), m)
        if n:
            largest = max(largest, float(np.abs(dec["pr"][sid][:n] - dec["base"][sid][:n]).max()))
    p, d, bal = (
        ratio(sums["pre"], sums["pre_ref"]),
        ratio(sums["dec"], sums["dec_ref"]),
        ratio(sums["bal_d"], sums["bal_p"]),
    )
    t = tost(np.array(deltas), p.reference)
    return {"prefill": p.value, "prefill_up": p.upper, "decode": d.value, "decode_up": d.upper, "balance": bal.value,
            "balance_up": bal.upper, "bias": t.mean, "bias_lo": t.low, "bias_hi": t.high, "ref": p.reference,
            "largest": largest, "tokens": bal.tokens}  # fmt: skip


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    print(
        "| pair | in flight | prefill / reference (upper) | decode / reference (upper) | decode / prefill, same tokens "
        "(upper) | bias, nats/token [99 % interval] / reference's mean \\|change\\| | largest token change, nats |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in argv:
        path = Path(d) / "compact.npz"
        if not path.is_file():
            print(f"equivalent_features: no {path}", file=sys.stderr)
            return 2
        for c in (1, 4):
            f = features(path, c)
            print(
                f"| {Path(d).name} | {c} | {f['prefill']:.2f} ({f['prefill_up']:.2f}) | {f['decode']:.2f} "
                f"({f['decode_up']:.2f}) | {f['balance']:.2f} ({f['balance_up']:.2f}) | {f['bias']:+.6f} "
                f"[{f['bias_lo']:+.6f}, {f['bias_hi']:+.6f}] / {f['ref']:.5f} | {f['largest']:.3f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
