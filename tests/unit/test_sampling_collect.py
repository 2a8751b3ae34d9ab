"""Dynamic sampling streams its refills: a replacement for an ineligible group starts as soon as
that group is done, while slower groups of its round still run, and the step draws the same
tasks (with the same seeds) as when it waited for whole rounds."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import pytest

from gagar.driver.sampling import SamplingPlan, TaskSampler, collect
from gagar.wire import Ranking


@dataclass
class Group:
    task: Any
    eligible: bool
    draw: int


def _tasks(n: int) -> list[Any]:
    return [f"task-{i}" for i in range(n)]


async def _collect(
    plan: SamplingPlan, eligible: dict[str, bool], delay: dict[str, float]
) -> tuple[Any, list[tuple[str, float, float]]]:
    sampler = TaskSampler(_tasks(12), seed=3)
    spans: list[tuple[str, float, float]] = []

    async def rollout(task: Any, draw: int) -> Group:
        start = time.perf_counter()
        await asyncio.sleep(delay.get(task, 0.01))
        spans.append((task, start, time.perf_counter()))
        return Group(task, eligible.get(task, False), draw)

    async def grade(group: Any) -> Ranking:
        return Ranking(grader="heuristic")

    return await collect(sampler, plan, rollout, grade), spans


def _round_based(quota: int, rounds: int, eligible: dict[str, bool]) -> list[tuple[int, Any]]:
    """Today's draws: whole rounds, each drawing what the step still misses."""
    sampler, drawn, have = TaskSampler(_tasks(12), seed=3), [], 0
    for _ in range(rounds):
        need = quota - have
        if need <= 0:
            break
        got = sampler.draw(need)
        drawn += got
        have += sum(eligible.get(t, False) for _, t in got)
    return drawn


def test_a_refill_starts_while_its_round_still_runs() -> None:
    order = [t for _, t in TaskSampler(_tasks(12), seed=3).draw(12)]
    first, second, refill = order[0], order[1], order[2]
    eligible = {second: True, refill: True}
    delay = {first: 0.01, second: 0.6}  # the first is quick and ineligible, the second is slow
    plan = SamplingPlan(quota=2, max_extra_rounds=2, dynamic=True, grade=True)
    got, spans = asyncio.run(_collect(plan, eligible, delay))
    when = {task: (start, end) for task, start, end in spans}
    assert when[refill][0] < when[second][1]  # the refill ran alongside the slow group
    assert [g.task for g in got.groups] == [refill, second]
    assert (got.sampled, got.rounds, got.shortfall) == (3, 2, 0)
    assert all(r is not None for r in got.rankings)


@pytest.mark.parametrize("max_extra_rounds", [0, 1, 3])
def test_the_draws_are_those_of_whole_rounds(max_extra_rounds: int) -> None:
    order = [t for _, t in TaskSampler(_tasks(12), seed=3).draw(12)]
    eligible = {t: i % 3 == 2 for i, t in enumerate(order)}  # every third task is informative
    plan = SamplingPlan(quota=3, max_extra_rounds=max_extra_rounds, dynamic=True, grade=False)
    got, _ = asyncio.run(_collect(plan, eligible, {}))
    expected = _round_based(3, 1 + max_extra_rounds, eligible)
    assert sorted((g.draw, g.task) for g in got.all_groups) == sorted(expected)
    assert got.shortfall == 3 - sum(eligible[t] for _, t in expected)
    assert got.rankings == [None] * len(got.groups)


def test_without_dynamic_sampling_every_group_counts_and_none_is_refilled() -> None:
    plan = SamplingPlan(quota=4, max_extra_rounds=2, dynamic=False, grade=True)
    got, _ = asyncio.run(_collect(plan, {}, {}))
    assert (got.sampled, got.rounds, len(got.groups), got.shortfall) == (4, 1, 4, 0)


def test_a_failed_rollout_cancels_the_others() -> None:
    sampler = TaskSampler(_tasks(4), seed=0)
    cancelled = []

    async def rollout(task: Any, draw: int) -> Group:
        if draw == 0:
            raise RuntimeError("sandbox factory broke")
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(task)
            raise
        return Group(task, True, draw)

    async def grade(group: Any) -> Ranking:
        return Ranking(grader="heuristic")

    plan = SamplingPlan(quota=3, max_extra_rounds=0, dynamic=True, grade=True)
    with pytest.raises(RuntimeError, match="sandbox factory broke"):
        asyncio.run(collect(sampler, plan, rollout, grade))
    assert len(cancelled) == 2
