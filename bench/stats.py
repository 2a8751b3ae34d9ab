"""Small exact statistics for the GAGAR-vs-GRPO bench (no scipy): paired tests and intervals.

- ``sign_test(diffs)``: the exact two-sided sign test (zeros dropped), binomial(n, 1/2).
- ``wilcoxon(diffs)``: the exact two-sided Wilcoxon signed-rank test (zeros dropped, ties get
  their mid-rank; the null distribution is enumerated over the actual ranks, so ties are exact).
- ``mean_ci95(values)``: the mean and its Student-t 95 % interval over independent runs (seeds).

Every test returns ``{"statistic", "p_value", "n"}``: the shape the bench's JSON stores.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

# two-sided 95 % quantiles of Student's t, by degrees of freedom (1..30); above: the normal's
T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1: {df}")
    if df <= len(T975):
        return T975[df - 1]
    return 2.021 if df <= 40 else 2.000 if df <= 60 else 1.980 if df <= 120 else 1.960


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mean_ci95(values: Sequence[float]) -> dict[str, Any]:
    """``{"mean", "low", "high", "n"}`` over the finite values (NaN bounds with fewer than 2)."""
    xs = _finite(values)
    if not xs:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "n": 1}
    half = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(xs)}


def sign_test(diffs: Sequence[float]) -> dict[str, Any]:
    """Exact two-sided sign test; ``statistic`` is the number of positive differences."""
    xs = [d for d in _finite(diffs) if d != 0]
    n, k = len(xs), sum(d > 0 for d in xs)
    if n == 0:
        return {"statistic": 0, "p_value": 1.0, "n": 0}
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n
    return {"statistic": k, "p_value": min(1.0, 2 * tail), "n": n}


def _midranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def wilcoxon(diffs: Sequence[float]) -> dict[str, Any]:
    """Exact two-sided Wilcoxon signed-rank test; ``statistic`` is W+ (sum of positive ranks).

    Under the null every sign is a fair coin: the distribution of W+ is enumerated by dynamic
    programming over the doubled (integer) mid-ranks, O(n · Σ ranks)."""
    xs = [d for d in _finite(diffs) if d != 0]
    n = len(xs)
    if n == 0:
        return {"statistic": 0.0, "p_value": 1.0, "n": 0}
    ranks = [round(2 * r) for r in _midranks([abs(d) for d in xs])]
    w_plus = sum(r for r, d in zip(ranks, xs, strict=True) if d > 0)
    counts = [0] * (sum(ranks) + 1)
    counts[0] = 1
    top = 0
    for r in ranks:
        for s in range(top, -1, -1):
            if counts[s]:
                counts[s + r] += counts[s]
        top += r
    total = 2**n
    low = sum(counts[: w_plus + 1]) / total
    high = sum(counts[w_plus:]) / total
    return {"statistic": w_plus / 2, "p_value": min(1.0, 2 * min(low, high)), "n": n}


def paired(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Wilcoxon on the pairwise differences ``a - b`` (pairs where either is undefined dropped),
    with the sign test's p-value and the mean difference beside it."""
    pairs = [
        (float(x), float(y))
        for x, y in zip(a, b, strict=True)
        if x is not None and y is not None and math.isfinite(float(x)) and math.isfinite(float(y))
    ]
    diffs = [x - y for x, y in pairs]
    out = wilcoxon(diffs)
    out["sign_p_value"] = sign_test(diffs)["p_value"]
    out["mean_difference"] = statistics.fmean(diffs) if diffs else math.nan
    out["pairs"] = len(pairs)
    return out
