"""The mechanism bench's pieces: grader accuracy, rankings, exact outcomes, the arms' advantages
(the project's own code), the tests over seeds with Holm, and a tiny grid end to end."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import mechanism as m  # noqa: E402
from bench import stats  # noqa: E402


@pytest.mark.parametrize("q", [0.6, 0.8])
def test_grader_ranks_clean_above_bloated_with_probability_q(q: float) -> None:
    """q is the grader's score accuracy; what moves the advantages is the quality factor, and a
    tie there (one tier) moves nothing: the realised factor accuracy is below q when q < 1 (issue
    50: a T1 tie used to count as right)."""
    rng, task = np.random.default_rng(0), m.Task()
    sigma = m.grader_sigma(q)
    styles, passed, hacked = [m.CLEAN, m.BLOATED], [True, True], [False, False]
    groups = [m.Group(styles, [], hacked, False) for _ in range(3000)]
    rankings = [m.grade(styles, passed, hacked, sigma, task, rng) for _ in groups]
    pairs = [0, 0, 0]
    m._count_pairs(groups, rankings, pairs)
    assert pairs[0] == 3000
    if q == 1.0:
        assert pairs[1] == 3000 and pairs[2] == 0
    else:
        assert pairs[2] > 0 and stats.proportion_ci(pairs[1], pairs[0])[1] < q
        # by score the grader is right with probability q: right plus the ties it broke right
        right_by_score = sum(
            s[0] < s[1] or s[0] == s[1]
            for s in (
                [next(k for k, t in enumerate(r.tied_groups) if i in t.members) for i in (0, 1)]
                for r in rankings
            )
        )
        assert pairs[1] <= right_by_score


def test_perfect_grader_and_bad_accuracy() -> None:
    assert m.grader_sigma(1.0) == 0.0
    for bad in (0.5, 0.3, 1.2):
        with pytest.raises(ValueError, match="accuracy"):
            m.grader_sigma(bad)


def test_ranking_covers_every_pass_once_and_confirms_only_gamed_passes() -> None:
    rng, task = np.random.default_rng(1), m.Task()
    styles = [m.CLEAN, m.BLOATED, m.REDUNDANT, m.WRONG, m.WRONG, m.CLEAN]
    passed = [True, True, True, True, False, False]
    hacked = [False, False, False, True, False, False]
    seen_hack = False
    for _ in range(50):
        r = m.grade(styles, passed, hacked, m.grader_sigma(0.8), task, rng)
        assert r.check_complete([0, 1, 2, 3]) is None
        assert {h.member for h in r.hacks} <= {3}
        seen_hack |= bool(r.hacks)
    assert seen_hack
    perfect = m.grade(styles, passed, [False] * 6, 0.0, task, rng)
    assert [(t.tier, t.members) for t in perfect.tied_groups] == [
        ("T1", [0]), ("T2", [2]), ("T2", [1]), ("T3", [3]),
    ]  # fmt: skip


def test_outcomes_are_exact_expectations() -> None:
    task = m.Task()
    uniform = np.full((2, 4), 0.25)
    out = m.outcomes(uniform, task)
    correct = 0.25 * 0.5 * (0.7 + 0.7 + 0.65 + 0.3 + 0.3 + 0.25)  # 0.725 / 2 / 4 ... by hand
    assert out["pass_rate"] == pytest.approx(correct)
    assert out["bloated_share"] == pytest.approx(1.0 / 2.9)
    gamed = 0.25 * 0.3
    assert out["hack_share"] == pytest.approx(gamed / (gamed + correct))
    only_bloated = np.array([[0, 1, 0, 0], [0, 1, 0, 0]], dtype=float)
    assert m.outcomes(only_bloated, task.with_bonus(0.1))["pass_rate"] == pytest.approx(0.6)


def _group(styles: list[int], passed: list[bool]) -> m.Group:
    task = m.Task()
    rollouts = [
        m.Rollout(trajectory=m._trajectory(int(task.length[s]), task.tool_calls[s], task.redundant_calls[s]), passed=p, valid=True)
        for s, p in zip(styles, passed, strict=True)
    ]  # fmt: skip
    return m.Group(styles, rollouts, [False] * len(styles), False)


def test_arms_run_the_projects_advantages() -> None:
    g = _group([m.CLEAN, m.BLOATED, m.WRONG, m.WRONG], [True, True, False, False])
    ranking = m.grade(
        g.styles, [True, True, False, False], g.hacked, 0.0, m.Task(), np.random.default_rng(0)
    )
    adv = {arm: fn([g], [ranking]) for arm, fn in m.ARM_FNS.items()}
    # GRPO: the test reward minus the group mean, on every token
    assert [a[0] for a in adv["grpo"]] == [0.5, 0.5, -0.5, -0.5]
    assert all(len(set(a)) == 1 for a in adv["grpo"])
    # redistribution moves credit from the bloated pass to the clean one, sum preserved
    red = [a[0] for a in adv["gagar-redistribution"]]
    assert red[0] > 0.5 > red[1] > 0 and sum(red) == pytest.approx(0)
    # the length penalty needs a pass rate above 0.5: none here, so the control is GRPO
    assert adv["grpo-length-penalty"] == adv["grpo"]
    g3 = _group([m.CLEAN, m.BLOATED, m.REDUNDANT, m.WRONG], [True, True, True, False])
    shaped = m.ARM_FNS["gagar-shaping"]([g3], [None])
    lp = [a[0] for a in m.ARM_FNS["grpo-length-penalty"]([g3], [None])]
    assert lp[1] < lp[0]  # the long pass is penalised
    assert shaped[2][-1] == 0.0 < shaped[2][0]  # redundant calls lose their positive credit


def test_tiny_grid_writes_protocol_cells_and_holm_tests(tmp_path: Path) -> None:
    torch.manual_seed(0)
    out = tmp_path / "mech.json"
    assert m.main(["--quick", "--workers", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["protocol"]["seeds"] == [0, 1, 2]
    assert data["protocol"]["primary_outcomes"] == ["pass_rate", "bloated_share"]
    (cell,) = data["cells"]
    assert set(cell["arms"]) == set(m.ARMS)
    n_tests = len(m.COMPARISONS) * 2 + len(m.SECONDARY_COMPARISONS) * 3
    assert len(data["tests"]) == n_tests
    for t in data["tests"]:
        assert t["n"] == 3 and t["p_holm"] >= t["p_value"]
    assert all((tmp_path / "mech" / f"{k}.png").exists() for k in m.PRIMARY)
    # issue 50: per-seed finals and curves, recomputable tests, the horizon
    runs = cell["runs"]["gagar"]
    assert [r["seed"] for r in runs] == [0, 1, 2] and len(runs[0]["curve"]) == 5
    test = next(
        t
        for t in data["tests"]
        if (t["arm"], t["baseline"], t["outcome"]) == ("gagar", "grpo", "bloated_share")
    )
    again = stats.paired_t(
        [r["final"]["bloated_share"] for r in runs],
        [r["final"]["bloated_share"] for r in cell["runs"]["grpo"]],
    )
    assert again["mean_difference"] == pytest.approx(test["mean_difference"], abs=1e-4)
    steps = {h["step"] for h in data["horizon"]}
    assert steps == {5}  # --quick runs 5 steps: only the end (HORIZON starts at 10)
    assert cell["grader_accuracy"]["pairs"] >= cell["grader_accuracy"]["clean_factor_above_bloated"]


def test_the_assumption_arms() -> None:
    # hack zeroing alone: every quality factor 1, no shaping; the control's weight swept
    factors = m._HACKS.redistribution.quality_factors.model_dump()
    assert set(factors.values()) == {1.0}
    assert not m._HACKS.length_penalty.enabled and not m._HACKS.segment_penalty.enabled
    assert m._HACKS.hack_zeroing
    assert {"gagar-hack-zeroing", "grpo-length-penalty-x2", "grpo-length-penalty-x4"} <= set(m.ARMS)
    assert set(m.ARM_FNS) == set(m.ARMS)


def test_noise_scale_bench_measures_both_arms_on_the_same_batches(tmp_path: Path) -> None:
    from bench import mechanism_noise as mn

    row = mn.measure("uniform", 1.0, 0.0, batches=6)
    assert set(row["arms"]) == {"grpo", "gagar"}
    for arm in row["arms"].values():
        assert arm["trace_sigma"] > 0
        assert arm["noise_scale_tokens"] == arm["trace_sigma"] / arm["grad_sq_norm"]
    low, high = row["ratio_ci95"]
    assert low <= row["ratio_gagar_over_grpo"] <= high or math.isnan(low)
    # the paired permutation test over batches; none when B is undefined (a pooled ‖G‖² ≤ 0)
    defined = all(a["grad_sq_norm"] > 0 for a in row["arms"].values())
    assert (0 < row["p_value"] <= 1) if defined else row["p_value"] is None
