"""Roll out a group: n agent trajectories on one task, each in its own sandbox, then verified.

Sandbox calls are blocking (subprocesses), so they run in worker threads (a pool sized to the
concurrency: asyncio's default pool has cpu + 4 threads, which would queue sandbox calls of
32 trajectories behind each other); the engine calls are async HTTP. Conversations are bounded by
one semaphore (``AgentSpec.concurrency``): a trajectory holds its slot from its first turn to its
last and gives it back before its verification, which needs no engine (verifications in flight
are bounded by a semaphore of the same size). A trajectory's sandbox session is made ahead, while
it waits for a slot (at most ``concurrency`` sessions ahead), and closed after it is verified, so
neither is on the critical path. A sandbox or engine failure makes that trajectory *invalid*
(dropped from statistics and loss, counted), never a failed test.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from gagar.driver.advantages import Rollout
from gagar.grader.bounds import admit, admit_read
from gagar.rollout import agent
from gagar.rollout.envs import tools as envtools
from gagar.rollout.envs.task import Task
from gagar.rollout.envs.verify import SharedVerdicts, open_session, verify
from gagar.sandbox import SandboxInfraError, SessionFactory
from gagar.trainer import gar
from gagar.wire import Action, Candidate, GradingGroup, Skipped, ToolStats

SYSTEM_PROMPT = (
    "You are a careful software engineer. Fix the bug described by the user in the repository. "
    "Change as little as needed, run the tests, then submit. Call exactly one tool per message as "
    '<tool_call>{"name": ..., "arguments": {...}}</tool_call>. Tools: view(path), '
    "search(pattern, path), edit(path, old, new), create(path, content), run_tests(tests), "
    "run(command), submit()."
)
STATE_CHANGING = frozenset({"edit", "create", "run"})
T = TypeVar("T")


async def offload(pool: ThreadPoolExecutor | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in ``pool``'s threads (asyncio's default pool when None)."""
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))


def task_messages(task: Task) -> list[dict[str, Any]]:
    listing = "\n".join(sorted(task.repo_files()))
    user = f"{task.problem_statement}\n\nRepository files:\n{listing}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class SandboxTools:
    """The agent's ``Tools`` over the environment's tool registry and one sandbox session."""

    def __init__(self, env: envtools.Env, pool: ThreadPoolExecutor | None = None) -> None:
        self.env, self.pool = env, pool

    def definitions(self) -> list[dict[str, Any]]:
        return envtools.tool_definitions()

    async def execute(self, call: agent.ToolCall) -> agent.Observation:
        obs = await offload(
            self.pool, envtools.execute, self.env, {"name": call.name, "arguments": call.arguments}
        )
        if obs.infra_error:
            raise agent.SandboxInfraError(obs.infra_error)
        changed = call.name in STATE_CHANGING and not obs.error
        return agent.Observation(
            obs.content, error=obs.error, changed_state=changed, done=obs.submitted
        )


@dataclass
class GroupResult:
    task: Task
    rollouts: list[Rollout]
    final_files: list[dict[str, str]]
    verifications: int = 0  # verification runs for this group
    verdicts_shared: int = 0  # candidates given an identical twin's verdict instead of a run

    @property
    def eligible(self) -> bool:
        """Informative for training (``gar.eligible_groups``: the one definition)."""
        passed = torch.tensor([[r.passed for r in self.rollouts]], dtype=torch.bool)
        valid = torch.tensor([[r.valid for r in self.rollouts]], dtype=torch.bool)
        return bool(gar.eligible_groups(passed, valid)[0])


@dataclass(frozen=True)
class RolloutConfig:
    limits: agent.AgentLimits
    command_timeout: float
    verify_timeout: float


def _text_files(session: Any, base: Collection[str]) -> tuple[dict[str, str], list[Skipped]]:
    """The final repository as the grader may see it (``gagar.grader.bounds``: names it refuses,
    links and other unreadable entries, binary files, past the size and count bounds), with what
    was left out; never raises for what the code left in its workspace (a failure of the
    sandbox itself is raised: the rollout is then invalid, not its files missing)."""
    return admit_read(
        session.list_files(), session.read_file, prefer=base, reraise=(SandboxInfraError,)
    )


def _finish(
    task: Task,
    session: Any,
    factory: SessionFactory,
    traj: agent.Trajectory,
    timeout: float,
    verdicts: SharedVerdicts | None = None,
) -> tuple[Rollout, dict[str, str]]:
    """Verify the final repository (blocking; through ``verdicts``, the group's, where given)
    and collect what the grader needs."""
    if not traj.valid:
        return Rollout(traj, passed=False, valid=False), {}
    # the reward's verification runs the visible tests; a pass is run again with the held-back
    # ones (never shared: the twins' verdicts are the visible tests')
    seen = task.visible()
    if verdicts is not None:
        verdict = verdicts.verify(seen, session, factory, timeout)
    else:
        verdict = verify(seen, session, factory, timeout)
    overfit = False
    if seen is not task and verdict.valid and verdict.passed:
        overfit = not verify(task, session, factory, timeout).passed
    files, skipped = _text_files(session, task.repo_files()) if verdict.valid else ({}, [])
    patch = session.diff() if verdict.valid else ""
    rollout = Rollout(
        traj,
        passed=verdict.passed,
        valid=verdict.valid,
        tampered=bool(verdict.suspected_tampering),
        overfit=overfit,
        patch=patch,
        test_log=verdict.log,
        notes=verdict.notes,
        skipped=skipped,
    )
    return rollout, files


class Slot:
    """A concurrency slot, given back once however many times ``release`` is called (by ``one``
    when the conversation ends, by ``_member`` whatever happened)."""

    def __init__(self, limiter: asyncio.Semaphore) -> None:
        self.limiter, self.held = limiter, False

    async def acquire(self) -> None:
        await self.limiter.acquire()
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.limiter.release()


@dataclass(frozen=True)
class Rollouts:
    """Where trajectories run: sandbox sessions, the engine, the chat format, limits, concurrency,
    and the policy version the engine serves (stamped on every trajectory; the loop never syncs
    weights while a ``Rollouts`` is in use)."""

    factory: SessionFactory
    engine: agent.Engine
    fmt: agent.ChatFormat
    cfg: RolloutConfig
    limiter: asyncio.Semaphore | None = None
    version: int | None = None
    pool: ThreadPoolExecutor | None = None  # sandbox calls' threads (None: asyncio's default)
    _ahead: asyncio.Semaphore | None = field(default=None, repr=False)
    _verifying: asyncio.Semaphore | None = field(default=None, repr=False)

    @classmethod
    def bounded(
        cls,
        factory: SessionFactory,
        engine: agent.Engine,
        fmt: agent.ChatFormat,
        cfg: RolloutConfig,
        concurrency: int,
        version: int | None = None,
    ) -> Rollouts:
        """At most ``concurrency`` trajectories conversing (and as many sessions made ahead, and
        as many being verified), with a thread for each sandbox call they can make at once."""
        pool = ThreadPoolExecutor(3 * concurrency + 2, thread_name_prefix="gagar-sandbox")
        return cls(
            factory,
            engine,
            fmt,
            cfg,
            asyncio.Semaphore(concurrency),
            version,
            pool,
            asyncio.Semaphore(concurrency),
            asyncio.Semaphore(concurrency),
        )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False)

    async def _create(self, task: Task) -> Any:
        return await offload(self.pool, open_session, task, self.factory)  # its environment

    async def one(
        self,
        task: Task,
        seed: int | None,
        session: Any = None,
        verdicts: SharedVerdicts | None = None,
        slot: Slot | None = None,
    ) -> tuple[Rollout, dict[str, str]]:
        """One trajectory in a fresh sandbox (``session``, or one made now), verified (through
        ``verdicts``, its group's, where given); infrastructure failures make it invalid. The
        caller closes a session it passed. ``slot``, the concurrency slot the caller acquired,
        is given back when the conversation ends, before the verification."""
        own = session is None  # ``_member`` passes None when making one ahead failed
        try:
            if own:
                session = await self._create(task)
            env = envtools.Env(task, session, command_timeout_s=self.cfg.command_timeout)
            traj = await agent.Agent(
                self.engine, self.fmt, SandboxTools(env, self.pool), self.cfg.limits, seed
            ).run(task_messages(task))
            traj.policy_version = self.version
            if slot is not None:
                slot.release()  # the engine's batch can take the next trajectory now
            async with self._verifying or contextlib.nullcontext():
                return await offload(
                    self.pool,
                    _finish,
                    task,
                    session,
                    self.factory,
                    traj,
                    self.cfg.verify_timeout,
                    verdicts,
                )
        except Exception as err:  # a sandbox that cannot be created or verified: infrastructure
            traj = agent.Trajectory(
                [0], [0.0], [0], 1, [], exit_reason="sandbox_error", exit_detail=str(err)
            )
            traj.policy_version = self.version
            return Rollout(traj, passed=False, valid=False), {}
        finally:
            if own and session is not None:
                await offload(self.pool, session.close)

    async def _member(
        self, task: Task, seed: int, verdicts: SharedVerdicts
    ) -> tuple[Rollout, dict[str, str]]:
        if self.limiter is None:
            return await self.one(task, seed, None, verdicts)
        session: Any = None
        slot = Slot(self.limiter)
        try:
            async with self._ahead or contextlib.nullcontext():
                with contextlib.suppress(Exception):  # not made ahead: ``one`` tries again
                    session = await self._create(task)
                await slot.acquire()  # the session waits for the slot, made
            try:
                return await self.one(task, seed, session, verdicts, slot)
            finally:
                slot.release()
        finally:
            if session is not None:
                await offload(self.pool, session.close)  # after the slot is given back

    async def group(self, task: Task, n: int, seed: int) -> GroupResult:
        """``n`` trajectories on one task, concurrently (bounded by ``limiter``); identical final
        repositories are verified once (``SharedVerdicts``)."""
        verdicts = SharedVerdicts()
        results = await asyncio.gather(
            *(self._member(task, seed * 1000 + i, verdicts) for i in range(n))
        )
        return GroupResult(
            task, [r for r, _ in results], [f for _, f in results], verdicts.runs, verdicts.shared
        )


def grading_group(group: GroupResult) -> GradingGroup:
    """The grader's view of a group (wire type): base repo, each candidate's final repo and
    trajectory. Every repository passes ``gagar.grader.bounds.admit``, so no name or size the
    code left behind can make the group unbuildable; what was left out is ``skipped``."""
    base, skipped = admit(group.task.repo_files())
    candidates = []
    for i, (r, raw) in enumerate(zip(group.rollouts, group.final_files, strict=True)):
        files, left_out = admit(raw or base, i, base.keys())
        skipped += [s.model_copy(update={"member": i}) for s in r.skipped] + left_out
        actions = [
            Action(
                tool=t.call.name,
                arguments=t.call.arguments,
                observation=(t.observation.text if t.observation else "")[:4000],
                error=bool(t.observation and t.observation.error),
            )
            for t in r.trajectory.turns
            if t.call is not None
        ]
        counts = r.trajectory.flag_counts()
        stats = ToolStats(
            actions=len(actions),
            redundant=counts["redundant"],
            errors=counts["tool_error"],
            churn=counts["churn"],
        )
        candidates.append(
            Candidate(
                member=i,
                passed=r.passed,
                valid=r.valid,
                files=files,
                patch=r.patch,
                trajectory=actions,
                test_log=r.test_log[-4000:],
                notes=r.notes,
                stats=stats,
            )
        )
    relevant = sorted(group.task.reference_files or {})
    return GradingGroup(
        task_id=group.task.instance_id,
        statement=group.task.problem_statement,
        base_files=base,
        candidates=candidates,
        relevant_files=relevant,
        test_command=group.task.test_command,
        environment=group.task.environment,
        skipped=skipped,
    )
