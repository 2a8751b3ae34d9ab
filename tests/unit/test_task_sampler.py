"""The task sampler: ``spec.dataset.sources[].weight`` weights the draws, reproducibly, and the
sampler's state survives a checkpoint (a resumed sampler draws what the uninterrupted one does)."""

from __future__ import annotations

import math

import pytest

from gagar.driver import components as comp
from gagar.driver.sampling import TaskSampler
from gagar.rollout.envs.task import Task
from gagar.spec import DatasetSpec


def _tasks(prefix: str, n: int) -> list[Task]:
    return [
        Task(instance_id=f"{prefix}-{i}", problem_statement="p", files={}, fail_to_pass=["t"])
        for i in range(n)
    ]


def _source_counts(sampler: TaskSampler, draws: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, task in sampler.draw(draws):
        prefix = task.instance_id.split("-")[0]
        counts[prefix] = counts.get(prefix, 0) + 1
    return counts


def test_weights_set_the_share_of_each_source() -> None:
    """Weights 3:1 over a small and a large source: the draws follow the weights (not the
    sources' sizes, 10 vs 200), within 4 binomial standard deviations, for a fixed seed."""
    tasks = _tasks("a", 10) + _tasks("b", 200)
    draws = 4000
    counts = _source_counts(TaskSampler(tasks, seed=5, sources=[(10, 3.0), (200, 1.0)]), draws)
    p = 0.75
    assert abs(counts["a"] - p * draws) <= 4 * math.sqrt(draws * p * (1 - p)), counts
    # the same sources weighted equally: half each, whatever their sizes
    even = _source_counts(TaskSampler(tasks, seed=5, sources=[(10, 1.0), (200, 1.0)]), draws)
    assert abs(even["a"] - 0.5 * draws) <= 4 * math.sqrt(draws * 0.25), even


def test_within_a_source_tasks_come_without_replacement() -> None:
    tasks = _tasks("a", 7) + _tasks("b", 50)
    sampler = TaskSampler(tasks, seed=1, sources=[(7, 1.0), (50, 1.0)])
    from_a = [t.instance_id for _, t in sampler.draw(400) if t.instance_id.startswith("a-")]
    for epoch in range(len(from_a) // 7):  # every full pass over source a holds each task once
        assert sorted(from_a[epoch * 7 : (epoch + 1) * 7]) == sorted(
            t.instance_id for t in tasks[:7]
        )


def test_draw_indices_are_unique_and_reproducible() -> None:
    tasks = _tasks("a", 5) + _tasks("b", 5)
    first = TaskSampler(tasks, seed=3, sources=[(5, 2.0), (5, 1.0)]).draw(30)
    again = TaskSampler(tasks, seed=3, sources=[(5, 2.0), (5, 1.0)]).draw(30)
    assert [i for i, _ in first] == list(range(30))
    assert [(i, t.instance_id) for i, t in first] == [(i, t.instance_id) for i, t in again]
    other = TaskSampler(tasks, seed=4, sources=[(5, 2.0), (5, 1.0)]).draw(30)
    assert [t.instance_id for _, t in other] != [t.instance_id for _, t in first]


@pytest.mark.parametrize("sources", [None, [(6, 1.0), (9, 4.0)]], ids=["one-source", "weighted"])
def test_state_survives_a_checkpoint(sources: list[tuple[int, float]] | None) -> None:
    tasks = _tasks("a", 6) + _tasks("b", 9)
    uninterrupted = TaskSampler(tasks, seed=11, sources=sources)
    head = uninterrupted.draw(23)
    tail = uninterrupted.draw(40)
    first = TaskSampler(tasks, seed=11, sources=sources)
    assert first.draw(23) == head
    state = first.state()
    resumed = TaskSampler(tasks, seed=11, sources=sources)
    resumed.load_state(state)
    assert resumed.draw(40) == tail


def test_one_source_draws_as_the_unweighted_sampler_did() -> None:
    """Checkpoints of the one-source sampler ({epoch, pos}) still load, and draw the same tasks:
    a per-epoch shuffle seeded by seed × 100003 + epoch."""
    import random

    tasks = _tasks("a", 8)
    sampler = TaskSampler(tasks, seed=2)
    order = list(range(8))
    random.Random(2 * 100_003 + 1).shuffle(order)  # epoch 1
    sampler.load_state({"epoch": 1, "pos": 3})
    assert [(i, t.instance_id) for i, t in sampler.draw(5)] == [
        (8 + 3 + k, tasks[order[3 + k]].instance_id) for k in range(5)
    ]


def test_a_checkpoint_of_other_sources_is_refused() -> None:
    tasks = _tasks("a", 4) + _tasks("b", 4)
    sampler = TaskSampler(tasks, seed=0, sources=[(4, 1.0), (4, 1.0)])
    with pytest.raises(ValueError, match="the checkpoint's task sampler has 1 dataset sources"):
        sampler.load_state({"epoch": 0, "pos": 2})


def test_the_spec_weights_reach_the_sampler() -> None:
    """``spec.dataset.sources[].weight`` through ``task_sampler``: a 4:1 weighting of two
    synthetic sources of equal size draws about four times as many of the first."""
    spec = DatasetSpec.model_validate(
        {
            "sources": [
                {"kind": "synthetic", "size": 20, "seed": 0, "weight": 4},
                {"kind": "synthetic", "size": 20, "seed": 100, "weight": 1},
            ],
            "heldOutFraction": 0.0,
        }
    )
    sampler, held = comp.task_sampler(spec, seed=9)
    first = {t.instance_id for t in sampler.tasks[:20]}
    draws = 2000
    hits = sum(t.instance_id in first for _, t in sampler.draw(draws))
    assert held == [] and abs(hits - 0.8 * draws) <= 4 * math.sqrt(draws * 0.16), hits
