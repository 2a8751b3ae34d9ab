"""The benches' tests and intervals (scipy.stats underneath) against values computed by hand."""

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
    ranks = [1.5, 1.5, 3.5, 3.5, 5, 7, 7, 7]  # mid-ranks of |d|
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
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t(0.975, df = 2)
    assert out["mean"] == 2.0 and out["n"] == 3
    assert (out["low"], out["high"]) == (pytest.approx(2 - half), pytest.approx(2 + half))
    assert math.isnan(stats.mean_ci95([1.0])["low"])
    assert stats.mean_ci95([float("nan"), 1.0, 3.0])["n"] == 2
    assert stats.mean_ci95([2.0, 2.0])["low"] == 2.0  # no spread: a zero-width interval


def test_paired_drops_undefined_pairs() -> None:
    out = stats.paired([1.0, 2.0, float("nan"), 4.0], [0.0, 0.0, 1.0, 0.0])
    assert out["pairs"] == 3 and out["mean_difference"] == pytest.approx(7 / 3)
    assert out["p_value"] == 0.25 and out["sign_p_value"] == 0.25


def test_run_mean_summarises_a_step_series_per_run() -> None:
    assert stats.run_mean([0.25, None, 0.75, float("nan")]) == 0.5
    assert math.isnan(stats.run_mean([None]))


def test_holm_adjusts_over_the_whole_family() -> None:
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert stats.holm([0.9, 0.8]) == [1.0, 1.0]  # 2 × 0.8 capped at 1, then monotone
    assert stats.holm([]) == []


def test_paired_t_by_hand() -> None:
    a, b = [1.0, 2.0, 3.0, 4.5], [0.0, 1.5, 2.0, 3.0]
    d = [1.0, 0.5, 1.0, 1.5]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    out = stats.paired_t(a, b)
    assert out["n"] == 4 and out["mean_difference"] == pytest.approx(mean)
    assert out["statistic"] == pytest.approx(mean / (sd / 2))
    half = 3.182446305284263 * sd / 2  # t(0.975, df = 3)
    assert (out["low"], out["high"]) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert out["effect_size"] == pytest.approx(mean / sd)
    assert stats.paired_t([1.0], [0.0])["p_value"] == 1.0  # one unit: nothing to test


def test_proportion_ci_is_clopper_pearson() -> None:
    low, high = stats.proportion_ci(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 10))
    low, high = stats.proportion_ci(10, 10)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 10))
    assert stats.proportion_ci(0, 0) == (0.0, 1.0)
