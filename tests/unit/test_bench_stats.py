"""The bench's exact tests and intervals against values computed by hand (scipy agrees)."""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_stats", ROOT / "bench" / "stats.py")
stats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stats)


def test_sign_test_is_the_exact_binomial() -> None:
    assert stats.sign_test([1] * 9 + [-1]) == {"statistic": 9, "p_value": 22 / 1024, "n": 10}
    assert stats.sign_test([1, 1, 1])["p_value"] == 0.25  # 3 seeds can never reach 0.05
    assert stats.sign_test([1, -1, 0, 0])["n"] == 2  # zeros dropped
    assert stats.sign_test([])["p_value"] == 1.0
    assert stats.sign_test([2.0, -1.0, 3.0, -4.0])["p_value"] == 1.0


def test_wilcoxon_exact_small_samples() -> None:
    assert stats.wilcoxon([1, 2, 3, 4, 5]) == {"statistic": 15.0, "p_value": 0.0625, "n": 5}
    # W- = 1: the subsets of {1..8} summing to <= 1 are {} and {1}: p = 2 * 2/256
    assert stats.wilcoxon([-1, 2, 3, 4, 5, 6, 7, 8])["p_value"] == pytest.approx(4 / 256)
    assert stats.wilcoxon([-1, 1])["p_value"] == 1.0
    assert stats.wilcoxon([0.0, 0.0])["n"] == 0


def test_wilcoxon_with_ties_matches_brute_force_enumeration() -> None:
    diffs = [0.5, -0.5, 1.0, 1.0, -2.0, 3.0, 3.0, 3.0]
    ranks = stats._midranks([abs(d) for d in diffs])
    observed = sum(r for r, d in zip(ranks, diffs, strict=True) if d > 0)
    sums = [sum(r for r, s in zip(ranks, signs, strict=True) if s) for signs in
            itertools.product([0, 1], repeat=len(diffs))]  # fmt: skip
    low = sum(s <= observed + 1e-9 for s in sums) / len(sums)
    high = sum(s >= observed - 1e-9 for s in sums) / len(sums)
    out = stats.wilcoxon(diffs)
    assert out["statistic"] == observed
    assert out["p_value"] == pytest.approx(min(1.0, 2 * min(low, high)))


def test_mean_ci95_uses_student_t_over_seeds() -> None:
    out = stats.mean_ci95([1.0, 2.0, 3.0])
    half = 4.303 * 1.0 / math.sqrt(3)
    assert out["mean"] == 2.0 and out["n"] == 3
    assert (out["low"], out["high"]) == (pytest.approx(2 - half), pytest.approx(2 + half))
    assert math.isnan(stats.mean_ci95([1.0])["low"])
    assert stats.mean_ci95([float("nan"), 1.0, 3.0])["n"] == 2
    assert stats.t975(1000) == 1.96
    with pytest.raises(ValueError):
        stats.t975(0)


def test_paired_drops_undefined_pairs() -> None:
    out = stats.paired([1.0, 2.0, float("nan"), 4.0], [0.0, 0.0, 1.0, 0.0])
    assert out["pairs"] == 3 and out["mean_difference"] == pytest.approx(7 / 3)
    assert out["p_value"] == 0.25 and out["sign_p_value"] == 0.25
