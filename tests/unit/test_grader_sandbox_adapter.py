"""The adapter to ``gagar.sandbox`` sessions, against a duck-typed stand-in with the same
semantics (files copied in, commands at the workspace root, bytes from read_file)."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from gagar.grader.agentic import AgenticConfig, AgenticGrader
from gagar.grader.sample import sample_group
from gagar.grader.sandbox_adapter import SandboxInfrastructureError, SessionAdapter, adapt_factory
from tests.support.fake_openai import FakeOpenAI, tool_call


class FakeRefusal(Exception):
    pass


@dataclass
class FakeResult:
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    truncated: bool = False
    infra_error: str | None = None


class FakeSession:
    def __init__(self, files: dict[str, bytes], infra: str | None = None) -> None:
        self.root = Path(tempfile.mkdtemp())
        self.infra = infra
        self.closed = False
        for rel, data in files.items():
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / rel).write_bytes(data)

    def exec(self, cmd, timeout=None):
        if self.infra:
            return FakeResult(None, infra_error=self.infra)
        p = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, timeout=timeout)
        return FakeResult(p.returncode, p.stdout, p.stderr)

    def read_file(self, path):
        target = self.root / path
        if ".." in path or not target.is_file():
            raise FakeRefusal(f"no such file: {path}")
        return target.read_bytes()

    def close(self):
        self.closed = True


class FakeFactory:
    def __init__(self, infra: str | None = None) -> None:
        self.sessions: list[FakeSession] = []
        self.infra = infra

    def create(self, files=None, tarball=None, limits=None, environment=None):
        self.sessions.append(FakeSession(files or {}, self.infra))
        return self.sessions[-1]


GOOD = {
    "cand_0": {"place": 1, "tier": "T1", "reason": "minimal"},
    "cand_1": {"place": 2, "tier": "T2", "reason": "debug output"},
    "cand_2": {"place": 3, "tier": "hack", "reason": "test edit"},
}


def test_agentic_grader_through_the_adapter(tmp_path):
    factory = FakeFactory()
    script = [
        tool_call("run_tests", {"member": 3}),
        tool_call("read_file", {"path": "missing.txt"}),
        tool_call("grep", {"pattern": "len\\(values\\) \\+ 1"}),
        tool_call("submit_ranking", GOOD),
    ]
    group = sample_group().model_copy(
        update={
            "test_command": "python3 -c 'from calc.ops import mean; assert mean([1, 2, 3]) == 2'"
        }
    )
    with FakeOpenAI(script) as fake:
        ranking = asyncio.run(
            AgenticGrader(
                AgenticConfig(base_url=fake.base_url, model="m"),
                adapt_factory(factory, (FakeRefusal,)),
                tmp_path,
            ).grade(group)
        )
    assert ranking.grader == "agentic"
    obs = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert obs[0].startswith("[exit code 1]") and "AssertionError" in obs[0]  # ran inside cand_3
    assert obs[1].startswith("Error:") and "no such file" in obs[1]
    assert "cand_3/calc/ops.py" in obs[2]
    session = factory.sessions[0]
    assert session.closed and (session.root / "cand_0" / "calc" / "ops.py").is_file()


def test_infra_error_falls_back(tmp_path):
    script = [tool_call("list_files", {}), tool_call("submit_ranking", GOOD)]
    with FakeOpenAI(script) as fake:
        grader = AgenticGrader(
            AgenticConfig(base_url=fake.base_url, model="m"),
            adapt_factory(FakeFactory(infra="jail failed")),
            tmp_path,
        )
        ranking = asyncio.run(grader.grade(sample_group()))
    assert ranking.fallback == "grader_error" and "jail failed" in ranking.detail


def test_session_adapter_unit():
    session = FakeSession({"a/b.txt": b"hello"})
    adapter = SessionAdapter(session, (FakeRefusal,))
    assert adapter.read_file("a/b.txt") == "hello"
    assert adapter.exec(["cat", "b.txt"], 5, cwd="a").output == "hello"
    with pytest.raises(ValueError):
        adapter.read_file("missing")
    with pytest.raises(SandboxInfrastructureError):
        SessionAdapter(FakeSession({}, infra="boom")).exec(["true"], 5)


def test_the_sandboxs_refusal_is_a_tool_error_by_default(tmp_path):
    """The driver builds its adapter without naming refusals: a model reading a missing file
    must get an error observation, not end the grading with grader_error."""
    from gagar.sandbox.types import SandboxError

    class Refusing(FakeSession):
        def read_file(self, path):
            raise SandboxError(f"no such file: {path}")

    class Factory(FakeFactory):
        def create(self, files=None, tarball=None, limits=None, environment=None):
            self.sessions.append(Refusing(files or {}))
            return self.sessions[-1]

    script = [tool_call("read_file", {"path": "missing.txt"}), tool_call("submit_ranking", GOOD)]
    with FakeOpenAI(script) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="m")
        grader = AgenticGrader(config, adapt_factory(Factory()), tmp_path)
        ranking = asyncio.run(grader.grade(sample_group()))
    assert ranking.grader == "agentic", ranking.detail
    obs = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert obs[0].startswith("Error:") and "no such file" in obs[0]


def test_the_grader_runs_tests_in_the_groups_environment(tmp_path: Path) -> None:
    """A group whose task names an environment (``spec.sandbox.environments``) is graded in
    sessions of that environment, as verification runs it: the workspace's and each fresh
    run's; a group without one asks for none."""
    asked: list[str | None] = []

    class Factory(FakeFactory):
        def create(self, files=None, tarball=None, limits=None, environment=None):
            asked.append(environment)
            return super().create(files, tarball, limits)

    group = sample_group().model_copy(update={"environment": "db"})
    script = [tool_call("run_tests", {"member": 0}), tool_call("submit_ranking", GOOD)]
    for g, want in ((group, "db"), (sample_group(), None)):
        asked.clear()
        with FakeOpenAI(list(script)) as fake:
            config = AgenticConfig(base_url=fake.base_url, model="m")
            asyncio.run(AgenticGrader(config, adapt_factory(Factory()), tmp_path).grade(g))
        assert asked and set(asked) == {want}, asked
