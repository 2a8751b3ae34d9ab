"""Dynamic sampling with bounded refill and asynchronous grading (docs/design.md §1.2, §1.4).

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
import bisect
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gagar.driver.rollouts import GroupResult
from gagar.grader.quality import QualityCounts
from gagar.rollout.envs.task import Task
from gagar.wire import GradingGroup, Ranking

RolloutFn = Callable[[Task, int], Awaitable[GroupResult]]
GradeFn = Callable[[GroupResult], Awaitable[Ranking]]


class TaskSampler:
    """Draws training tasks reproducibly; its position is state (checkpointed, restored on resume).

    ``tasks`` may come from several dataset sources: ``sources`` gives (task count, weight) of
    each, in the order of ``tasks``. Draw ``d`` picks source ``i`` with probability
    ``weight_i / Σ weight`` by a generator seeded by (seed, d) alone, so the choice needs no state
    beyond the number of draws; within a source, tasks come without replacement in epochs (a fresh
    shuffle per epoch). One source draws exactly as an unweighted sampler of its tasks does. Each
    draw's index ``d`` is unique and seeds its rollouts."""

    def __init__(
        self, tasks: list[Task], seed: int, sources: Sequence[tuple[int, float]] | None = None
    ) -> None:
        if not tasks:
            raise ValueError("no training tasks")
        sources = list(sources) if sources is not None else [(len(tasks), 1.0)]
        if sum(n for n, _ in sources) != len(tasks) or any(n < 0 or w <= 0 for n, w in sources):
            raise ValueError(f"sources {sources} do not partition {len(tasks)} tasks")
        self.tasks, self.seed = tasks, seed
        starts = [sum(n for n, _ in sources[:i]) for i in range(len(sources))]
        # sources without training tasks (all held out) are never drawn
        self._sources = [(start, n) for start, (n, _) in zip(starts, sources, strict=True) if n]
        weights = [w for n, w in sources if n]
        total = sum(weights)
        self._cumulative = list(itertools.accumulate(w / total for w in weights))
        self.drawn = 0
        self._epochs = [0] * len(self._sources)
        self._pos = [0] * len(self._sources)
        self._orders = [self._shuffled(i) for i in range(len(self._sources))]

    def _shuffled(self, source: int) -> list[int]:
        start, n = self._sources[source]
        order = list(range(start, start + n))
        random.Random(self.seed * 100_003 + self._epochs[source] + 7_919 * source).shuffle(order)
        return order

    def _source(self, draw_index: int) -> int:
        if len(self._sources) == 1:
            return 0
        u = random.Random(f"gagar-source:{self.seed}:{draw_index}").random()
        return min(bisect.bisect_right(self._cumulative, u), len(self._sources) - 1)

    def draw(self, k: int) -> list[tuple[int, Task]]:
        """``k`` tasks with a unique draw index each (used to seed their rollouts)."""
        out = []
        for _ in range(k):
            i = self._source(self.drawn)
            if self._pos[i] == len(self._orders[i]):
                self._epochs[i], self._pos[i] = self._epochs[i] + 1, 0
                self._orders[i] = self._shuffled(i)
            out.append((self.drawn, self.tasks[self._orders[i][self._pos[i]]]))
            self._pos[i] += 1
            self.drawn += 1
        return out

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self._epochs[0], "pos": self._pos[0]}
        if len(self._sources) > 1:
            out.update(drawn=self.drawn, epochs=list(self._epochs), positions=list(self._pos))
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        if len(self._sources) == 1:
            self._epochs, self._pos = [int(state["epoch"])], [int(state["pos"])]
            self.drawn = self._epochs[0] * self._sources[0][1] + self._pos[0]
        else:
            epochs, positions = state.get("epochs"), state.get("positions")
            if epochs is None or positions is None or len(epochs) != len(self._sources):
                raise ValueError(
                    f"the checkpoint's task sampler has {len(epochs or [0])} dataset sources with "
                    f"training tasks, spec.dataset.sources has {len(self._sources)}"
                )
            self._epochs, self._pos = [int(e) for e in epochs], [int(p) for p in positions]
            self.drawn = int(state["drawn"])
        sizes = [n for _, n in self._sources]
        if (
            any(not 0 <= p <= n for p, n in zip(self._pos, sizes, strict=True))
            or min(self._epochs) < 0
        ):  # a later draw would index past its order: refuse the checkpoint now
            raise ValueError(f"the checkpoint's sampler position {self._pos} is outside {sizes}")
        self._orders = [self._shuffled(i) for i in range(len(self._sources))]


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
    quality: QualityCounts = field(default_factory=QualityCounts)  # the grader's, on these groups


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
        futures: list[asyncio.Future[Any]] = [*running, *pending]
        for fut in futures:
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
