"""The driver's advantage glue: rankings → factors/hacks/usable, modes, token broadcast and shaping."""

from __future__ import annotations

import pytest
import torch

from gagar.driver.advantages import Rollout, group_advantages, token_advantages
from gagar.rollout.agent import Observation, ToolCall, Trajectory, Turn
from gagar.spec import AlgorithmSpec
from gagar.wire import Finding, Hack, Ranking, TiedGroup


def traj(turns: int, tokens_per_turn: int = 4, redundant_turn: int | None = None) -> Trajectory:
    ids, mask, out = [0, 0, 0], [0, 0, 0], []
    for k in range(turns):
        start = len(ids)
        ids += [1] * tokens_per_turn + [2, 2]
        mask += [1] * tokens_per_turn + [0, 0]
        t = Turn(
            start, start + tokens_per_turn, "", ToolCall("view", {"path": "a"}), Observation("x")
        )
        if k == redundant_turn:
            t.flags.add("redundant")
        out.append(t)
    return Trajectory(ids, [0.0] * len(ids), mask, 3, [], out, "submitted")


def group() -> list[Rollout]:
    return [
        Rollout(traj(2), passed=True, valid=True),  # clean
        Rollout(traj(3, redundant_turn=1), passed=True, valid=True),  # bloated
        Rollout(traj(2), passed=False, valid=True),
        Rollout(traj(2), passed=False, valid=True),
    ]


RANKING = Ranking(
    tied_groups=[TiedGroup(tier="T1", members=[0]), TiedGroup(tier="T2", members=[1])],
    grader="heuristic",
)
NO_LP = AlgorithmSpec.model_validate({"lengthPenalty": {"enabled": False}})


def test_redistribution_moves_credit_to_the_better_pass_and_keeps_the_sum() -> None:
    batch = group_advantages([group()], [RANKING], NO_LP)
    adv = batch.adv[0]
    assert adv[0] > adv[1] > 0 > adv[2]
    assert torch.isclose(adv[:2].sum(), batch.result.adv_before[0, :2].sum())
    assert torch.isclose(adv.sum(), torch.tensor(0.0, dtype=adv.dtype), atol=1e-9)
    assert batch.usable.tolist() == [True] and batch.result.fallback.tolist() == [0]


def test_grpo_mode_ignores_the_grader() -> None:
    alg = AlgorithmSpec(mode="grpo")
    batch = group_advantages([group()], [RANKING], alg)
    assert batch.adv[0].tolist() == pytest.approx([0.5, 0.5, -0.5, -0.5])
    per_token = token_advantages([group()], batch.adv, alg)
    assert {round(v, 6) for v in per_token[1] if v} == {0.5}


@pytest.mark.parametrize(
    "ranking",
    [
        None,
        Ranking(tied_groups=[TiedGroup(tier="T1", members=[0])], grader="agentic"),  # misses pass 1
        Ranking(
            tied_groups=[TiedGroup(tier="T1", members=[0, 2])], grader="agentic"
        ),  # ranks a failure
        Ranking(grader="none", fallback="timeout"),  # the grader gave up
    ],
)
def test_unusable_rankings_fall_back_to_grpo(ranking: Ranking | None) -> None:
    batch = group_advantages([group()], [ranking], NO_LP)
    assert batch.usable.tolist() == [False]
    assert batch.adv[0].tolist() == pytest.approx([0.5, 0.5, -0.5, -0.5])


def test_heuristic_fallback_ranking_is_usable() -> None:
    ranking = RANKING.model_copy(update={"fallback": "timeout"})
    assert group_advantages([group()], [ranking], NO_LP).usable.tolist() == [True]


def test_confirmed_hack_is_zeroed() -> None:
    ranking = Ranking(
        tied_groups=[TiedGroup(tier="T1", members=[0])],
        hacks=[
            Hack(
                member=1, evidence=[Finding(member=1, kind="test_tampering", reason="edited tests")]
            )
        ],
        grader="heuristic",
    )
    batch = group_advantages([group()], [ranking], NO_LP)
    assert batch.hacks[0].tolist() == [False, True, False, False]
    assert batch.adv[0, 1] < 0 and batch.adv[0, 0] > 0


def test_segment_shaping_zeroes_flagged_positive_tokens_and_conserves_mass() -> None:
    groups = [group()]
    batch = group_advantages(groups, [RANKING], NO_LP)
    per_token = token_advantages(groups, batch.adv, NO_LP)
    bloated = groups[0][1].trajectory
    flagged = bloated.flagged_mask()
    assert all(per_token[1][i] == 0 for i, f in enumerate(flagged) if f)
    positive_before = sum(
        float(batch.adv[0, j]) * groups[0][j].trajectory.response_tokens
        for j in range(4)
        if batch.adv[0, j] > 0
    )
    positive_after = sum(v for row in per_token for v in row if v > 0)
    assert positive_after == pytest.approx(positive_before)
    assert all(
        v == 0
        for row, r in zip(per_token, groups[0], strict=True)
        for v, m in zip(row, r.trajectory.loss_mask, strict=True)
        if not m
    )


def test_groups_must_have_one_size() -> None:
    with pytest.raises(ValueError, match="same size"):
        group_advantages([group(), group()[:3]], [None, None], NO_LP)


@pytest.mark.parametrize(("mode", "expected"), [("gagar", {"unusable": 1}), ("grpo", {})])
def test_fallbacks_are_counted_only_where_gagar_meant_to_redistribute(mode, expected) -> None:
    """An eligible group without a usable ranking is a GAGAR fallback; plain GRPO has none."""
    from gagar.driver.loop import _group_facts
    from gagar.driver.rollouts import GroupResult
    from gagar.rollout.envs.synthetic import generate

    alg = AlgorithmSpec(mode=mode)
    batch = group_advantages([group()], [None], alg)
    facts = _group_facts([GroupResult(generate(0), group(), [])], [None], batch, alg)
    assert facts.grading.fallbacks == expected


@pytest.mark.parametrize("mode", ["gagar", "grpo"])
def test_both_modes_measure_the_bloated_share_from_the_ranking(mode) -> None:
    """GRPO's groups are graded for measurement: the bloated share and the factors come from the
    ranking in both modes, while GRPO's advantages stay plain (equal for the two passes)."""
    from gagar.driver.loop import _group_facts
    from gagar.driver.rollouts import GroupResult
    from gagar.rollout.envs.synthetic import generate

    alg = AlgorithmSpec.model_validate({"mode": mode, "lengthPenalty": {"enabled": False}})
    batch = group_advantages([group()], [RANKING], alg)
    facts = _group_facts([GroupResult(generate(0), group(), [])], [RANKING], batch, alg)
    assert facts.grading.bloated_passes_ratio == 0.5 and facts.factors == pytest.approx([1, 0.85])
    same = bool(torch.isclose(batch.adv[0, 0], batch.adv[0, 1]))
    assert same == (mode == "grpo")


def test_the_bloated_share_reads_the_tiers_not_the_factors() -> None:
    """The shaping-only ablation sets every quality factor to 1: its passes below T1 are still
    bloated. A second T1 group (factor 0.9) is not; a pass the ranking does not place is left out."""
    from gagar.driver.loop import _group_facts
    from gagar.driver.rollouts import GroupResult
    from gagar.rollout.envs.synthetic import generate

    ones = {k: 1.0 for k in ("t1First", "t1Other", "t2High", "t2Low", "t3")}
    alg = AlgorithmSpec.model_validate({"redistribution": {"qualityFactors": ones}})
    batch = group_advantages([group()], [RANKING], alg)
    facts = _group_facts([GroupResult(generate(0), group(), [])], [RANKING], batch, alg)
    assert facts.factors == pytest.approx([1, 1]) and facts.grading.bloated_passes_ratio == 0.5
    two_t1 = Ranking(
        tied_groups=[TiedGroup(tier="T1", members=[0]), TiedGroup(tier="T1", members=[1])],
        grader="heuristic",
    )
    facts = _group_facts([GroupResult(generate(0), group(), [])], [two_t1], batch, NO_LP)
    assert facts.grading.bloated_passes_ratio == 0.0
    only_one = Ranking(tied_groups=[TiedGroup(tier="T2", members=[1])], grader="heuristic")
    facts = _group_facts([GroupResult(generate(0), group(), [])], [only_one], batch, NO_LP)
    assert facts.grading.bloated_passes_ratio == 1.0


def test_what_the_graders_left_out_reaches_the_step_record() -> None:
    from gagar.driver.loop import _group_facts
    from gagar.driver.rollouts import GroupResult
    from gagar.rollout.envs.synthetic import generate
    from gagar.wire import Skipped

    skipped = [
        Skipped(member=1, path="..evil.py", reason="unsafe_path"),
        Skipped(member=1, path="big.py", reason="file_too_large"),
        Skipped(member=2, path="b.py", reason="unsafe_path"),
    ]
    ranking = RANKING.model_copy(update={"skipped": skipped})
    batch = group_advantages([group()], [ranking], NO_LP)
    facts = _group_facts([GroupResult(generate(0), group(), [])], [ranking], batch, NO_LP)
    assert facts.grading.grader_skipped == {"unsafe_path": 2, "file_too_large": 1}
