"""The replay mechanism test's parts: best and worst passes, one update per arm from the same
weights (a small real learner), the paired summary."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import yaml

from gagar.driver.rollouts import GroupResult
from gagar.rollout.agent import Trajectory
from gagar.rollout.envs import synthetic
from gagar.spec import GagarRun
from gagar.trainer.learner import Learner, LearnerConfig
from gagar.wire import Ranking, TiedGroup
from tests.unit.test_learner import TinyLM

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gagar_replay", ROOT / "bench" / "gagar_replay.py")
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)
BASE = yaml.safe_load((ROOT / "examples" / "gagar-vs-grpo.yaml").read_text())


def _traj(ids: list[int]) -> Trajectory:
    mask = [0, 0] + [1] * (len(ids) - 2)
    return Trajectory(ids, [0.0] * len(ids), mask, 2, [], exit_reason="submitted")


def _group() -> tuple[GroupResult, Ranking]:
    from gagar.driver.advantages import Rollout

    seqs = [[1, 2, 3, 4, 5], [1, 2, 7, 8, 9, 10, 11], [1, 2, 3, 4, 6], [1, 2, 12, 12]]
    passed = [True, True, True, False]
    rollouts = [Rollout(_traj(s), p, True) for s, p in zip(seqs, passed, strict=True)]
    ranking = Ranking(
        grader="heuristic",
        tied_groups=[TiedGroup(tier="T1", members=[0, 2]), TiedGroup(tier="T3", members=[1])],
    )
    return GroupResult(synthetic.generate(0), rollouts, [{}] * 4), ranking


def test_best_and_worst_need_two_tied_groups() -> None:
    _, ranking = _group()
    assert replay.best_and_worst(ranking) == (0, 1)
    tied = Ranking(grader="heuristic", tied_groups=[TiedGroup(tier="T1", members=[0, 1])])
    assert replay.best_and_worst(tied) is None


def test_gagar_widens_the_gap_more_than_grpo_from_the_same_weights() -> None:
    """One SGD update per arm from identical weights: GRPO pushes every pass up alike, GAGAR's
    redistribution gives the T1 pass more than the T3 one, so the gap grows more under GAGAR."""
    group, ranking = _group()
    torch.manual_seed(0)
    model = TinyLM(vocab=13)
    start = [p.detach().clone() for p in model.parameters()]
    out = {}
    for arm in ("grpo", "gagar-redistribution"):
        alg = GagarRun.model_validate(replay.arm_spec(BASE, arm)).spec.algorithm

        def learner_for() -> Learner:
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            return Learner(model, opt, LearnerConfig(micro_batch_size=1, grad_clip=1e9))

        out[arm] = replay.replay_group(learner_for, model, start, group, ranking, alg)
    red, grpo = out["gagar-redistribution"], out["grpo"]
    assert red["best_advantage"] > red["worst_advantage"]
    assert grpo["best_advantage"] == pytest.approx(grpo["worst_advantage"])
    assert red["gap_change"] > grpo["gap_change"]
    for row in out.values():  # one group is one unit of the learner's variance (issue 50)
        assert math.isnan(row["gradient_variance"]) and math.isnan(row["scale_free_variance"])
    # the weights were restored before each arm: replaying GRPO again gives the same numbers
    alg = GagarRun.model_validate(replay.arm_spec(BASE, "grpo")).spec.algorithm
    again = replay.replay_group(learner_for, model, start, group, ranking, alg)
    assert again["gap_change"] == pytest.approx(grpo["gap_change"])


def test_summary_pairs_every_arm_with_grpo() -> None:
    per_arm = {
        "grpo": {"gap_change": [0.0] * 6, "gradient_variance": [1.0] * 6, "scale_free_variance": [2.0] * 6},
        "gagar": {"gap_change": [0.1] * 6, "gradient_variance": [2.0] * 6, "scale_free_variance": [2.0] * 6},
    }  # fmt: skip
    s = replay.summarize(per_arm)
    test = s["tests"]["gagar vs grpo"]
    assert test["gap_change"]["p_value"] == pytest.approx(2 / 64) and test["gap_change"]["n"] == 6
    assert test["scale_free_variance"]["n"] == 0 and test["scale_free_variance"]["p_value"] == 1.0
    assert s["means"]["gagar"]["gap_change"]["mean"] == pytest.approx(0.1)
    # Holm over the 3 tests: the smallest p times 3
    assert test["gap_change"]["p_holm"] == pytest.approx(3 * 2 / 64)
