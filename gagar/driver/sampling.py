"""Dynamic sampling with bounded refill and asynchronous grading (DESIGN §1.2, §1.4).

A step needs ``quota`` eligible groups (≥ 2 valid, ≥ 1 pass, ≥ 1 fail, by the raw test outcome).
Round after round, tasks are drawn for the groups still missing and rolled out concurrently (a
replacement starts as soon as the group it replaces is done, while the rest of its round runs);
every eligible group is handed to the grader *as soon as it is complete*, so grading overlaps the
rollouts of later rounds. After ``1 + max_extra_rounds`` rounds the step trains on what it has
and says so (``shortfall``). Each grading has a deadline; a late or failed grading falls back as the
spec says (the heuristic grader, or "unusable" = plain GRPO for that group), counted by reason.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gagar.driver.rollouts import GroupResult
from gagar.rollout.envs.task import Task
from gagar.wire import GradingGroup, Ranking

RolloutFn = Callable[[Task, int], Awaitable[GroupResult]]
GradeFn = Callable[[GroupResult], Awaitable[Ranking]]


class TaskSampler:
    """Draws training tasks without replacement in epochs, reproducibly; its position is state."""

    def __init__(self, tasks: list[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("no training tasks")
        self.tasks, self.seed, self.epoch, self.pos = tasks, seed, 0, 0
        self._order = self._shuffled()

    def _shuffled(self) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def draw(self, k: int) -> list[tuple[int, Task]]:
        """``k`` tasks with a unique draw index each (used to seed their rollouts)."""
        out = []
        for _ in range(k):
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffled()
            draw_index = self.epoch * len(self.tasks) + self.pos
            out.append((draw_index, self.tasks[self._order[self.pos]]))
            self.pos += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._shuffled()


@dataclass
class Collected:
    groups: list[GroupResult] = field(default_factory=list)
    rankings: list[Ranking | None] = field(default_factory=list)
    sampled: int = 0
    rounds: int = 0
    shortfall: int = 0
    all_groups: list[GroupResult] = field(default_factory=list)
    rollout_seconds: float = 0.0
    version: int | None = None  # the policy version that sampled every trajectory
    grading_wait_seconds: float = 0.0


@dataclass(frozen=True)
class SamplingPlan:
    quota: int
    max_extra_rounds: int
    dynamic: bool
    grade: bool


async def collect(
    sampler: TaskSampler, plan: SamplingPlan, rollout: RolloutFn, grade: GradeFn
) -> Collected:
    """Roll out ``quota`` groups, refilling ineligible ones up to ``max_extra_rounds`` deep.

    Refills are streamed: an ineligible group's replacement is drawn the moment it completes
    (while the rest of its round still runs), so every round's groups are in flight together,
    bounded only by the agent's concurrency. The draws are today's: one replacement per
    ineligible group while the step can still use it, each seeded by its draw index, so the
    same tasks with the same seeds are rolled out as by waiting for whole rounds."""
    out = Collected()
    pending: list[asyncio.Task[Ranking]] = []
    max_depth = 1 + (plan.max_extra_rounds if plan.dynamic else 0)
    running: dict[asyncio.Future[GroupResult], int] = {}  # group rollout -> its round

    def launch(k: int, depth: int) -> None:
        out.rounds = max(out.rounds, depth)
        for idx, task in sampler.draw(k):
            running[asyncio.ensure_future(rollout(task, idx))] = depth

    start = time.perf_counter()
    if plan.quota > 0:
        launch(plan.quota, 1)
    try:
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: running[f]):
                depth = running.pop(fut)
                group = fut.result()
                out.sampled += 1
                out.all_groups.append(group)
                if (group.eligible or not plan.dynamic) and len(out.groups) < plan.quota:
                    out.groups.append(group)
                    if plan.grade and group.eligible:
                        pending.append(asyncio.ensure_future(grade(group)))
                need = plan.quota - len(out.groups) - len(running)
                if need > 0 and depth < max_depth:
                    launch(need, depth + 1)
    except BaseException:
        for fut in [*running, *pending]:
            fut.cancel()
        raise
    out.rollout_seconds = time.perf_counter() - start
    out.shortfall = max(0, plan.quota - len(out.groups))
    waited = time.perf_counter()
    ranked = iter(await asyncio.gather(*pending))
    out.rankings = [next(ranked) if plan.grade and g.eligible else None for g in out.groups]
    out.grading_wait_seconds = time.perf_counter() - waited
    return out


async def grade_with_deadline(
    grade: Callable[[GradingGroup], Awaitable[Ranking]],
    group: GradingGroup,
    deadline: float,
    fallback: Callable[[GradingGroup, str], Awaitable[Ranking]],
) -> Ranking:
    """Grade within ``deadline`` seconds; on timeout or error, the configured fallback."""
    try:
        return await asyncio.wait_for(grade(group), timeout=deadline)
    except TimeoutError:
        return await fallback(group, "timeout")
    except Exception as err:  # a grader bug or outage must not stop training
        return await fallback(group, f"grader_error: {type(err).__name__}: {err}")
