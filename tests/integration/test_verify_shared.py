"""One verification per distinct final repository of a group (``verify.SharedVerdicts``): identical
candidates share a verdict, anything that differs in what verification is given runs its own,
and an infrastructure failure is never shared."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gagar.driver.rollouts import RolloutConfig, Rollouts
from gagar.engine.base import Generation, SamplingParams
from gagar.rollout.agent import AgentLimits
from gagar.rollout.chat import parse_tool_call
from gagar.rollout.envs import synthetic
from gagar.rollout.envs.verify import SharedVerdicts, repository_digest, verify
from gagar.sandbox import SandboxInfraError
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits

SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


@pytest.fixture(scope="module")
def factory() -> LocalFactory:
    check_isolation()
    return LocalFactory(limits=Limits(wall_time_s=60, cpu_time_s=30, memory_bytes=1 << 30))


@pytest.fixture(scope="module")
def task():
    return synthetic.generate(5)


def _fixed(task, factory, reverse: bool = False):
    """A session holding the reference fix, its files written in one order or the other."""
    s = factory.create(files=task.files)
    items = sorted(task.reference_files.items(), reverse=reverse)
    for path, text in items:
        s.write_file(path, text)
    return s


def test_the_digest_is_what_verification_is_given(task, factory) -> None:
    one, two = _fixed(task, factory), _fixed(task, factory, reverse=True)
    try:
        time.sleep(1.1)  # other times on every file of the second
        path = next(iter(task.reference_files))
        two.write_file(path, task.reference_files[path])
        digest = repository_digest(one.archive(), one.list_files())
        assert digest == repository_digest(two.archive(), two.list_files())
        two.exec(f"chmod +x {path}")  # a permission bit is content
        assert repository_digest(two.archive(), two.list_files()) != digest
        two.exec(f"chmod -x {path}")
        assert repository_digest(two.archive(), two.list_files()) == digest
        two.exec("mkfifo pipe")  # not archived, but listed: `refused` names it
        assert repository_digest(two.archive(), two.list_files()) != digest
        two.exec("rm pipe && echo '# one more line' >> " + path)
        assert repository_digest(two.archive(), two.list_files()) != digest
    finally:
        one.close()
        two.close()


def test_identical_candidates_share_one_verification(task, factory) -> None:
    """Four candidates verified at once: two identical fixes, the untouched bug, a fix with an
    extra file. Three runs, one shared verdict, each verdict what its own run would give."""
    sessions = [
        _fixed(task, factory),
        _fixed(task, factory, reverse=True),
        factory.create(files=task.files),
        _fixed(task, factory),
    ]
    sessions[3].write_file("notes.txt", "an extra file\n")
    shared = SharedVerdicts()
    try:
        with ThreadPoolExecutor(4) as pool:
            verdicts = list(pool.map(lambda s: shared.verify(task, s, factory), sessions))
        alone = [verify(task, s, factory) for s in sessions]
    finally:
        for s in sessions:
            s.close()
    assert (shared.runs, shared.shared) == (3, 1)
    assert [v.passed for v in verdicts] == [True, True, False, True]
    assert [v.passed for v in alone] == [v.passed for v in verdicts]
    assert [v.tests for v in alone] == [v.tests for v in verdicts]
    assert verdicts[0] is verdicts[1]


class _FailingOnce:
    """The factory, whose first ``create`` from an archive (verification's) fails as
    infrastructure, after a pause in which a twin's verification starts waiting."""

    def __init__(self, factory: LocalFactory) -> None:
        self.factory, self.failed, self.lock = factory, False, threading.Lock()

    def create(self, *a, **kw):
        if kw.get("tarball") is not None:
            with self.lock:
                first, self.failed = not self.failed, True
            if first:
                time.sleep(0.5)
                raise SandboxInfraError("the executor went away")
        return self.factory.create(*a, **kw)


def test_an_infrastructure_failure_is_not_shared(task, factory) -> None:
    sessions = [_fixed(task, factory), _fixed(task, factory)]
    shared, flaky = SharedVerdicts(), _FailingOnce(factory)
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(shared.verify, task, sessions[0], flaky)
            time.sleep(0.1)  # the second finds the first's run in flight
            second = pool.submit(shared.verify, task, sessions[1], flaky)
            verdicts = [first.result(), second.result()]
    finally:
        for s in sessions:
            s.close()
    assert not verdicts[0].valid and verdicts[0].infra_error == "the executor went away"
    assert verdicts[1].valid and verdicts[1].passed  # its own run, not the failure
    assert (shared.runs, shared.shared) == (2, 0)


class _Submits:
    """An engine whose every answer is ``submit``: each member ends on the untouched repository."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        await asyncio.sleep(0.01)
        return Generation([5, 6], [-0.1, -0.2], SUBMIT, "stop", list(prompt_ids))


class _Fmt:
    def initial_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return [1, 2, 3]

    def observation_ids(self, message: dict[str, Any]) -> list[int]:
        return [4]

    def parse_tool_call(self, text: str) -> Any:
        return parse_tool_call(text)


def test_a_group_of_rollouts_shares_verdicts(task, factory) -> None:
    """Through the rollouts' path (``Rollouts.group``, as the loop runs it): every member of a
    group of four submits the untouched repository: one verification, shared three times."""
    cfg = RolloutConfig(AgentLimits(4, 64, 4096), 20.0, 60.0)
    rollouts = Rollouts.bounded(factory, _Submits(), _Fmt(), cfg, concurrency=4)
    try:
        group = asyncio.run(rollouts.group(task, 4, 0))
    finally:
        rollouts.close()
    assert [r.valid for r in group.rollouts] == [True] * 4
    assert not any(r.passed for r in group.rollouts)
    assert (group.verifications, group.verdicts_shared) == (1, 3)
