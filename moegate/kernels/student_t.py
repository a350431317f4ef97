"""Student's t, exact for whole degrees of freedom: the kernel tier's environment has no scipy.

Used by ``moegate.kernels.systematic`` for its per-group intervals; checked against scipy in
``tests/unit/kernels/test_systematic.py``.
"""

from __future__ import annotations

import math
from functools import lru_cache


def t_two_sided(t: float, df: int) -> float:
    """P(|T| > t) for Student's t with ``df`` degrees of freedom (Abramowitz and Stegun 26.7.3-4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    t = abs(t)
    theta = math.atan(t / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for j in range(1, df // 2):
            term *= c * c * (2 * j - 1) / (2 * j)
            total += term
        inside = s * total
    else:
        total = 0.0
        if df > 1:
            term = c
            total = c
            for j in range(1, (df - 1) // 2):
                term *= c * c * (2 * j) / (2 * j + 1)
                total += term
        inside = (2 / math.pi) * (theta + s * total)
    return max(0.0, 1.0 - inside)


@lru_cache(maxsize=256)
def t_critical(p: float, df: int) -> float:
    """The ``t`` with P(|T| > t) = ``p`` (bisection on ``t_two_sided``)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    lo, hi = 0.0, 1.0
    while t_two_sided(hi, df) > p:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided(mid, df) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi
