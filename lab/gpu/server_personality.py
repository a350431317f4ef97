"""Where two greedy passes part, per prompt: within one server (its repeat) and between a pair's two servers.

    python -m lab.gpu.server_personality DIR...            # each DIR holds a pair's compact.npz (compact_run.py)
    python -m lab.gpu.server_personality --classes DIR...  # and its wall.txt (lab/gpu/e2e_plan.sh)
    python -m lab.gpu.server_personality --cut DIR...      # writes DIR/greedy.npz from DIR/compact.npz

``greedy.npz`` stands in for ``compact.npz`` where a committed archive keeps only the greedy passes' tokens and
log-probabilities (the base's and the PR's; what this reads, 40 kB a pair compressed against 0.8 MB).

Per pair, for each comparison of two greedy passes over the same 64 prompts, the prompts whose per-token
log-probabilities differ anywhere along the common prefix (or whose tokens part), and where the first difference
lies. The comparisons:

- ``base 4 / repeat``, ``pr 4 / repeat``: one server against itself at 4 in flight. Its only freedom is the batch
  composition, which on these runs moves the first decode steps alone (first difference at step 1);
- ``base / pr at 1``, ``base / pr at 4``: the pair's two servers, at 1 and at 4 in flight;
- ``same at 1 and 4``: of the prompts that differ between the servers at 1 in flight, those whose first difference
  lies at the same step at 4 in flight too. A difference the batch does not decide (``at 1``: no batch at all)
  that recurs at the same step under another batch belongs to the servers, not to the traffic.

A same-build pair whose servers part on many prompts, at steps past the first and at the same step at 1 and 4 in
flight, while each server repeats itself, has two servers that compute differently: a difference of the start (its
compile), which a server's repeat, the ``within`` of the ``identical`` rule, never sees (results/e2e-promises-h200.md,
the panel of 2026-12-03 (2)).

``--classes`` groups the servers of every pair given, by model, into classes of bit-identical greedy passes at 1
in flight (the same prompts, the same tokens and log-probabilities all along), and says per class how many servers
of each build token of the plan (``033``, ``033@res``, ``032``, ...) fell in it. A build started N times that falls
into several classes computes differently from start to start; a server of another build that lands in one of them
computes what that build computes. Pairs are named by their folder (by its parent too where two folders share a
name: two sessions' ``s-trained``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from lab.gpu.compact_run import per_item

PASSES = (("base 4 / repeat", "base/4", "base/repeat-4"), ("pr 4 / repeat", "pr/4", "pr/repeat-4"),
          ("base / pr at 1", "base/1", "pr/1"), ("base / pr at 4", "base/4", "pr/4"))  # fmt: skip


def _pass(z: np.lib.npyio.NpzFile, key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    tok, lp = per_item(z, f"greedy/{key}", "token"), per_item(z, f"greedy/{key}", "logprob")
    return {p: (tok[p], lp[p]) for p in tok}


def first_differences(a: dict[str, tuple[np.ndarray, np.ndarray]],
                      b: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, int]:  # fmt: skip
    """Prompt -> the first step where the two passes' tokens or log-probabilities differ (prompts in both)."""
    out = {}
    for pid in a.keys() & b.keys():
        (ta, la), (tb, lb) = a[pid], b[pid]
        n = min(ta.size, tb.size)
        differ = (ta[:n] != tb[:n]) | ~((la[:n] == lb[:n]) | (np.isnan(la[:n]) & np.isnan(lb[:n])))
        steps = np.nonzero(differ)[0]
        if steps.size:
            out[pid] = int(steps[0])
        elif ta.size != tb.size:
            out[pid] = n
    return out


def pair_row(path: Path) -> dict[str, object]:
    """The comparisons of one pair's compact.npz: per comparison the prompts compared and the first differences."""
    z = np.load(path, allow_pickle=False)
    row: dict[str, object] = {}
    for name, x, y in PASSES:
        a, b = _pass(z, x), _pass(z, y)
        row[name] = (len(a.keys() & b.keys()), first_differences(a, b))
    at1, at4 = row["base / pr at 1"][1], row["base / pr at 4"][1]  # type: ignore[index]
    row["same at 1 and 4"] = sum(1 for p, s in at1.items() if at4.get(p) == s)
    return row


def npz(d: Path) -> Path:
    """A pair folder's per-token numbers: compact.npz, or the greedy.npz cut from it for a committed archive."""
    return d / "compact.npz" if (d / "compact.npz").is_file() or not (d / "greedy.npz").is_file() else d / "greedy.npz"


def cut(compact: Path, out: Path) -> None:
    """Write the greedy passes' tokens and log-probabilities of the base and the PR alone (what this module reads)."""
    z = np.load(compact, allow_pickle=False)
    keep = ("/token", "/logprob", "/offsets", "/prompt_ids")
    np.savez(out, **{k: z[k] for k in z.files if k.startswith(("greedy/base/", "greedy/pr/")) and k.endswith(keep)})


def _wall(d: Path) -> dict[str, str]:
    """A pair's wall.txt first line (``exit 1 wall_ms ... base 033 pr 033@res model trained gates ...``) as a dict."""
    words = (d / "wall.txt").read_text().split("\n", 1)[0].split()
    return dict(zip(words[::2], words[1::2], strict=False))


def _names(dirs: list[Path]) -> list[str]:
    """Each pair folder's name, with its parent's where two share one."""
    dup = {d.name for d in dirs if sum(e.name == d.name for e in dirs) > 1}
    return [f"{d.parent.name}/{d.name}" if d.name in dup else d.name for d in dirs]


def classes(dirs: list[Path]) -> dict[str, list[list[str]]]:
    """Model -> classes of servers (``PAIR:SIDE``) whose greedy passes at 1 in flight are bit-identical, largest first."""
    by_model: dict[str, list[tuple[str, dict[str, tuple[np.ndarray, np.ndarray]]]]] = {}
    for d, name in zip(dirs, _names(dirs), strict=True):
        z, model = np.load(npz(d), allow_pickle=False), _wall(d).get("model", "?")
        for side in ("base", "pr"):
            by_model.setdefault(model, []).append((f"{name}:{side}", _pass(z, f"{side}/1")))
    out = {}
    for model, servers in by_model.items():
        groups: list[list[tuple[str, dict[str, tuple[np.ndarray, np.ndarray]]]]] = []
        for name, passes in servers:
            for g in groups:
                if set(g[0][1]) == set(passes) and not first_differences(g[0][1], passes):
                    g.append((name, passes))
                    break
            else:
                groups.append([(name, passes)])
        out[model] = [[n for n, _ in g] for g in sorted(groups, key=len, reverse=True)]
    return out


def _print_classes(dirs: list[Path]) -> None:
    build = {}
    for d, name in zip(dirs, _names(dirs), strict=True):
        w = _wall(d)
        build[f"{name}:base"], build[f"{name}:pr"] = w.get("base", "?"), w.get("pr", "?")
    for model, groups in classes(dirs).items():
        print(
            f"\n{model}: {sum(map(len, groups))} servers, {len(groups)} classes of bit-identical greedy at 1 in flight\n"
        )
        print("| class | servers | builds |")
        print("| ---: | ---: | --- |")
        for i, g in enumerate(groups, 1):
            counts: dict[str, int] = {}
            for n in g:
                counts[build[n]] = counts.get(build[n], 0) + 1
            print(f"| {i} | {len(g)} | " + ", ".join(f"{b} x{k}" for b, k in sorted(counts.items())) + " |")


def _cell(n: int, diffs: dict[str, int]) -> str:
    if not diffs:
        return f"0 of {n}"
    late = sum(1 for s in diffs.values() if s > 1)
    return f"{len(diffs)} of {n} ({late} past step 1)"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    by_class, cutting = "--classes" in args, "--cut" in args
    unknown = [a for a in args if a.startswith("-") and a not in ("--classes", "--cut")]
    if unknown or (by_class and cutting):
        print(f"server_personality: {unknown[0] if unknown else '--classes and --cut'}: not an option here "
              "(--classes or --cut, then pair folders)", file=sys.stderr)  # fmt: skip
        return 2
    dirs = [Path(a) for a in args if a not in ("--classes", "--cut")]
    if not dirs:
        print("usage: python -m lab.gpu.server_personality [--classes] DIR...  (each holds compact.npz or greedy.npz)",
              file=sys.stderr)  # fmt: skip
        return 2
    need = ("wall.txt",) if by_class else ()
    first = "compact.npz" if cutting else None
    missing = [(d, f) for d in dirs for f in (first or npz(d).name, *need) if not (d / f).is_file()]
    if missing:
        print(f"server_personality: no {missing[0][1]} in {missing[0][0]}", file=sys.stderr)
        return 2
    if cutting:
        for d in dirs:
            cut(d / "compact.npz", d / "greedy.npz")
        return 0
    if by_class:
        _print_classes(dirs)
        return 0
    print("| pair | " + " | ".join(name for name, _, _ in PASSES) + " | same step at 1 and 4 |")
    print("| --- |" + " ---: |" * (len(PASSES) + 1))
    for d in dirs:
        row = pair_row(npz(d))
        cells = [_cell(*row[name]) for name, _, _ in PASSES]  # type: ignore[misc]
        print(f"| {d.name} | " + " | ".join(cells) + f" | {row['same at 1 and 4']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
