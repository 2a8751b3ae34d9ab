"""Verification in the sandbox: reference fixes pass, bugs fail, and editing tests earns nothing;
one verification per distinct final repository of a group (``verify.SharedVerdicts``): identical
candidates share a verdict, anything that differs in what verification is given runs its own,
and an infrastructure failure is never shared."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gagar.driver.rollouts import RolloutConfig, Rollouts
from gagar.engine.base import Generation, SamplingParams
from gagar.rollout.agent import AgentLimits
from gagar.rollout.envs import synthetic
from gagar.rollout.envs.tools import Env, execute, tool_definitions
from gagar.rollout.envs.verify import SharedVerdicts, repository_digest, verify
from gagar.sandbox import SandboxInfraError
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits
from tests.support.submitting import Fmt, Submits


@pytest.fixture(scope="module")
def factory() -> LocalFactory:
    check_isolation()
    return LocalFactory(limits=Limits(wall_time_s=60, cpu_time_s=30, memory_bytes=1 << 30))


@pytest.fixture(scope="module")
def task():
    return synthetic.generate(5)


def _module(task) -> str:
    return next(iter(task.reference_files))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes_and_bug_fails_in_sandbox(factory, seed: int) -> None:
    bug_fails, fix_passes = synthetic.check_in_sandbox(synthetic.generate(seed), factory)
    assert bug_fails and fix_passes


def test_editing_tests_earns_nothing(factory, task) -> None:
    with factory.create(files=task.files) as s:
        for test_path in task.test_files:
            s.write_file(test_path, "def test_nothing():\n    pass\n")
        s.write_file("conftest.py", "import pytest\ncollect_ignore_glob = ['*']\n")
        s.write_file(
            "tests/conftest.py", "def pytest_collection_modifyitems(items):\n    items.clear()\n"
        )
        before = s.diff()
        verdict = verify(task, s, factory)
        assert s.diff() == before  # the candidate's workspace is left as it was
    assert verdict.valid and not verdict.passed
    assert not any(verdict.tests[t] for t in task.fail_to_pass)
    assert set(verdict.suspected_tampering) >= {
        "conftest.py",
        "tests/conftest.py",
        *task.test_files,
    }


def test_real_fix_passes_even_with_deleted_tests(factory, task) -> None:
    path = _module(task)
    with factory.create(files=task.files) as s:
        s.write_file(path, task.reference_files[path])
        for test_path in task.test_files:
            s.delete_file(test_path)
        verdict = verify(task, s, factory)
    assert verdict.passed and all(verdict.tests.values())
    assert verdict.suspected_tampering == sorted(task.test_files)


def test_clean_fix_has_no_tampering(factory, task) -> None:
    path = _module(task)
    with factory.create(files=task.files) as s:
        s.write_file(path, task.reference_files[path])
        verdict = verify(task, s, factory)
    assert verdict.passed and verdict.suspected_tampering == []


def test_exiting_early_does_not_pass(factory, task) -> None:
    path = _module(task)
    with factory.create(files=task.files) as s:
        s.write_file(path, "import os\nos._exit(0)\n" + task.reference_files[path])
        verdict = verify(task, s, factory)
    assert verdict.valid and not verdict.passed


def test_infrastructure_failure_is_invalid(task) -> None:
    broken = LocalFactory(ro_paths=("/nonexistent/gagar-test",))
    with broken.create(files=task.files) as s:
        verdict = verify(task, s, broken)
    assert not verdict.valid and not verdict.passed and verdict.infra_error


def test_verify_through_an_executor_server(factory, task) -> None:
    """The verifier only needs the ``Session`` protocol: the HTTP backend works the same."""
    import threading

    from gagar.sandbox.client import HttpFactory
    from gagar.sandbox.server import make_server

    server = make_server(factory, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        remote = HttpFactory(f"http://127.0.0.1:{server.server_address[1]}")
        path = _module(task)
        with remote.create(files=task.files) as s:
            assert not verify(task, s, remote).passed
            s.write_file(path, task.reference_files[path])
            verdict = verify(task, s, remote)
        assert verdict.passed and verdict.valid and verdict.suspected_tampering == []
        assert server.registry.sessions == {}  # the verifier closed its throwaway sessions
    finally:
        server.shutdown()
        server.server_close()


def test_unreachable_executor_gives_an_invalid_verdict(task) -> None:
    import httpx

    from gagar.sandbox.client import HttpFactory, HttpSession

    gone = HttpFactory("http://127.0.0.1:9", timeout_s=2)
    with httpx.Client(base_url="http://127.0.0.1:9", timeout=2) as client:
        verdict = verify(task, HttpSession(client, "gone"), gone)
    assert not verdict.valid and not verdict.passed and "unreachable" in (verdict.infra_error or "")


def _call(name: str, **args) -> dict:
    return {
        "id": "c1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def test_tools_over_a_session(factory, task) -> None:
    path = _module(task)
    with factory.create(files=task.files) as s:
        env = Env(task, s, command_timeout_s=30)
        listing = execute(env, _call("view", path="."))
        assert path in listing.content and not listing.error
        view = execute(env, _call("view", path=path, start_line=1, end_line=2))
        assert view.content.startswith("    1  def ")
        fn = task.metadata["function"]
        assert f"{path}:" in execute(env, _call("search", pattern=f"def {fn}")).content
        assert "no matches" in execute(env, _call("search", pattern="zzz_absent")).content
        ref = task.reference_files[path]
        old = s.read_file(path).decode()
        edit = execute(env, _call("edit", path=path, old=old, new=ref))
        assert edit.content == f"edited {path}" and s.read_file(path).decode() == ref
        assert "passed" in execute(env, _call("run_tests")).content
        assert "hello" in execute(env, _call("run", command="echo hello")).content
        assert (
            execute(env, _call("create", path="notes.txt", content="x")).content
            == "created notes.txt"
        )
        assert execute(env, _call("submit")).submitted and env.submitted
        assert execute(env, _call("run", command="true")).error


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"function": {"name": "view", "arguments": "{bad"}}, "not valid JSON"),
        ({"function": {"name": "fly", "arguments": "{}"}}, "unknown tool 'fly'"),
        (_call("view"), "path: Field required"),
        (_call("view", path="README.md", colour="red"), "colour: Extra inputs"),
        (_call("view", path="missing.py"), "no such file"),
        (_call("view", path="../../etc/passwd"), "leaves the workspace"),
        (_call("view", path="README.md", start_line=0), "start_line"),
        (_call("edit", path="README.md", old="not there", new="x"), "not found"),
        (_call("edit", path="README.md", old="t", new="x"), "occurs"),
        (_call("create", path="README.md", content="x"), "already exists"),
    ],
)
def test_bad_tool_calls_become_error_observations(factory, task, call, message: str) -> None:
    with factory.create(files=task.files) as s:
        obs = execute(Env(task, s), call)
    assert obs.error and message in obs.content


def test_tool_definitions_are_openai_tools() -> None:
    defs = tool_definitions()
    names = {d["function"]["name"] for d in defs}
    assert names == {"view", "search", "edit", "create", "run_tests", "run", "submit"}
    edit = next(d for d in defs if d["function"]["name"] == "edit")
    assert edit["type"] == "function"
    assert edit["function"]["parameters"]["required"] == ["path", "old", "new"]
    assert edit["function"]["parameters"]["additionalProperties"] is False


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
        path = next(iter(task.reference_files))
        assert two.exec("find . -exec touch -h -d 2001-01-01 {} +").ok  # other times on all
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
        self.entered = threading.Event()  # the first verification holds its key by then

    def create(self, *a, **kw):
        if kw.get("tarball") is not None:
            with self.lock:
                first, self.failed = not self.failed, True
            if first:
                self.entered.set()
                time.sleep(0.5)
                raise SandboxInfraError("the executor went away")
        return self.factory.create(*a, **kw)


def test_an_infrastructure_failure_is_not_shared(task, factory) -> None:
    sessions = [_fixed(task, factory), _fixed(task, factory)]
    shared, flaky = SharedVerdicts(), _FailingOnce(factory)
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(shared.verify, task, sessions[0], flaky)
            # the first holds its key now: the second finds its run in flight (or, on a slow
            # machine, already forgotten after the failure, and runs its own the same)
            assert flaky.entered.wait(30)
            second = pool.submit(shared.verify, task, sessions[1], flaky)
            verdicts = [first.result(), second.result()]
    finally:
        for s in sessions:
            s.close()
    assert not verdicts[0].valid and verdicts[0].infra_error == "the executor went away"
    assert verdicts[1].valid and verdicts[1].passed  # its own run, not the failure
    assert (shared.runs, shared.shared) == (2, 0)


def _group_of(task, factory, engine, size: int, concurrency: int):
    """One group of ``size`` through ``Rollouts.group``, as the loop runs it."""
    cfg = RolloutConfig(AgentLimits(4, 64, 4096), 20.0, 60.0)
    rollouts = Rollouts.bounded(factory, engine, Fmt(), cfg, concurrency=concurrency)
    try:
        return asyncio.run(rollouts.group(task, size, 0))
    finally:
        rollouts.close()


def test_a_group_of_rollouts_shares_verdicts(task, factory) -> None:
    """Through the rollouts' path (``Rollouts.group``, as the loop runs it): every member of a
    group of four submits the untouched repository: one verification, shared three times."""
    group = _group_of(task, factory, Submits(), size=4, concurrency=4)
    assert [r.valid for r in group.rollouts] == [True] * 4
    assert not any(r.passed for r in group.rollouts)
    assert (group.verifications, group.verdicts_shared) == (1, 3)


def test_a_trajectory_gives_its_slot_back_before_its_verification(task, factory, monkeypatch):
    """At concurrency 1 a group's second trajectory converses while the first is verified:
    verification needs no engine, so it holds no slot (verifications are bounded apart)."""
    from gagar.driver import rollouts as rollouts_mod

    second_turn = threading.Event()

    class Counting(Submits):
        requests = 0

        async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
            self.requests += 1
            if self.requests == 2:
                second_turn.set()
            return await super().generate(prompt_ids, params)

    real, overlapped, lock, active, most = rollouts_mod._finish, [], threading.Lock(), [0], [0]

    def finish(*args):  # the first verification waits (in its thread) for the second's turn
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            if not overlapped:
                overlapped.append(second_turn.wait(10))
            return real(*args)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(rollouts_mod, "_finish", finish)
    group = _group_of(task, factory, Counting(), size=2, concurrency=1)
    assert overlapped == [True]
    assert most == [1]  # the second verification waited for the first: one at a time
    assert [r.valid for r in group.rollouts] == [True, True]
