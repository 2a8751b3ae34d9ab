"""Verification in the sandbox: reference fixes pass, bugs fail, and editing tests earns nothing."""

from __future__ import annotations

import json

import pytest

from gagar.rollout.envs import synthetic
from gagar.rollout.envs.tools import Env, execute, tool_definitions
from gagar.rollout.envs.verify import verify
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits


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
