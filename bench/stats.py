"""Statistics for the benches, on ``scipy.stats``: paired tests over independent units, intervals
and Holm's correction.

The unit of every test is an independent run (a seed, or a warm start when a claim generalises
over warm starts): a step-level series is summarised per run first (``run_mean``), never paired
step by step (steps within a run are autocorrelated, so such pairs are not independent).

- ``sign_test(diffs)``: exact two-sided sign test (zeros dropped), ``scipy.stats.binomtest``.
- ``wilcoxon(diffs)``: two-sided Wilcoxon signed-rank test (zeros dropped; exact, ties included,
  up to 13 pairs; scipy's normal approximation with ties above that).
- ``paired_t(a, b)``: paired t-test with the mean difference's 95 % interval (``ttest_rel``).
- ``mean_ci95(values)``: the mean and its Student-t 95 % interval.
- ``proportion_ci(x, n)``: Clopper-Pearson 95 % interval of x successes in n.
- ``holm(p_values)``: Holm-Bonferroni adjusted p-values (family-wise error over all of them).

Every test returns ``{"statistic", "p_value", "n", ...}``: the shape the benches' JSON stores.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from scipy import stats as st


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _pairs(a: Sequence[float | None], b: Sequence[float | None]) -> list[tuple[float, float]]:
    return [
        (float(x), float(y))
        for x, y in zip(a, b, strict=True)
        if x is not None and y is not None and math.isfinite(float(x)) and math.isfinite(float(y))
    ]


def run_mean(series: Sequence[float | None]) -> float:
    """One number per run from a step-level series (its finite values' mean; NaN if none)."""
    xs = _finite(series)
    return statistics.fmean(xs) if xs else math.nan


def mean_ci95(values: Sequence[float | None]) -> dict[str, Any]:
    """``{"mean", "low", "high", "n"}`` over the finite values (NaN bounds with fewer than 2)."""
    xs = _finite(values)
    if not xs:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    mean = statistics.fmean(xs)
    if len(xs) < 2 or statistics.stdev(xs) == 0:
        half = math.nan if len(xs) < 2 else 0.0
        return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(xs)}
    low, high = st.t.interval(0.95, len(xs) - 1, loc=mean, scale=st.sem(xs))
    return {"mean": mean, "low": float(low), "high": float(high), "n": len(xs)}


def sign_test(diffs: Sequence[float | None]) -> dict[str, Any]:
    """Exact two-sided sign test; ``statistic`` is the number of positive differences."""
    xs = [d for d in _finite(diffs) if d != 0]
    k = sum(d > 0 for d in xs)
    if not xs:
        return {"statistic": 0, "p_value": 1.0, "n": 0}
    return {"statistic": k, "p_value": float(st.binomtest(k, len(xs)).pvalue), "n": len(xs)}


def wilcoxon(diffs: Sequence[float | None]) -> dict[str, Any]:
    """Two-sided Wilcoxon signed-rank test; ``statistic`` is W+ (sum of positive ranks)."""
    xs = [d for d in _finite(diffs) if d != 0]
    if not xs:
        return {"statistic": 0.0, "p_value": 1.0, "n": 0}
    # With tied |d| scipy's exact null does not apply; enumerating all 2^n sign flips does (the
    # permutation method is exact while 2^n ≤ its resamples, n ≤ 13); above that, normal approx.
    ties = len(set(map(abs, xs))) < len(xs)
    method: Any = st.PermutationMethod() if ties and len(xs) <= 13 else "auto"
    res = st.wilcoxon(xs, alternative="two-sided", zero_method="wilcox", method=method)
    ranks = st.rankdata([abs(d) for d in xs])
    w_plus = float(sum(r for r, d in zip(ranks, xs, strict=True) if d > 0))
    return {"statistic": w_plus, "p_value": float(res.pvalue), "n": len(xs)}


def paired_t(a: Sequence[float | None], b: Sequence[float | None]) -> dict[str, Any]:
    """Paired t-test of ``a - b`` over the units where both are defined, with the mean difference,
    its 95 % interval and the standardised effect (mean / sd of the differences)."""
    pairs = _pairs(a, b)
    diffs = [x - y for x, y in pairs]
    out: dict[str, Any] = {"n": len(diffs), "mean_difference": math.nan, "low": math.nan}
    out |= {"high": math.nan, "statistic": math.nan, "p_value": 1.0, "effect_size": math.nan}
    if len(diffs) < 2:
        return out
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    out |= {"mean_difference": mean}
    if sd == 0:  # every unit moved by the same amount: no variance to test against
        return out | {"low": mean, "high": mean, "p_value": 1.0 if mean == 0 else 0.0}
    res = st.ttest_rel([x for x, _ in pairs], [y for _, y in pairs])
    ci = res.confidence_interval(0.95)
    return out | {
        "low": float(ci.low),
        "high": float(ci.high),
        "statistic": float(res.statistic),
        "p_value": float(res.pvalue),
        "effect_size": mean / sd,
    }


def paired(a: Sequence[float | None], b: Sequence[float | None]) -> dict[str, Any]:
    """Wilcoxon on the per-unit differences ``a - b`` (units where either is undefined dropped),
    with the sign test's p-value and the mean difference beside it."""
    pairs = _pairs(a, b)
    diffs = [x - y for x, y in pairs]
    out = wilcoxon(diffs)
    out["sign_p_value"] = sign_test(diffs)["p_value"]
    out["mean_difference"] = statistics.fmean(diffs) if diffs else math.nan
    out["pairs"] = len(pairs)
    return out


def proportion_ci(x: int, n: int) -> tuple[float, float]:
    """Clopper-Pearson (exact) 95 % interval of a proportion x / n; (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    ci = st.binomtest(x, n).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input's order: sort ascending, multiply the k-th
    smallest by (m − k), make the sequence non-decreasing, cap at 1."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p_values[i]))
        adjusted[i] = running
    return adjusted
