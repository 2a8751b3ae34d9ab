"""Verification: run a task's hidden tests against pristine test files, in a fresh sandbox.

The candidate's final repository is copied (``archive``) into a new session; every test file of
the task, and every test or harness file the candidate changed, is put back as the task has it
(files the candidate added there are deleted); then the task's test command runs the
``FAIL_TO_PASS`` and ``PASS_TO_PASS`` ids, and a JUnit XML report at an unguessable path decides
each id. Editing tests therefore never earns reward. Separately, a patch that touches tests, the
test runner's configuration or the harness is recorded as *suspected tampering* for the grader.

Limits (stated, not hidden): the tests run in the same process as the candidate's code, so code
that rewrites pytest's report from inside could forge a pass; such code has to live in the patch,
where the graders see it. The exit status must agree with the report, which catches the crude
forms (``os._exit(0)`` at import leaves no report and fails).
"""

from __future__ import annotations

import posixpath
import re
import secrets
import shlex
import xml.etree.ElementTree as ET
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from gagar.rollout.envs.task import Task
from gagar.sandbox import ExecResult, SandboxInfraError, Session, SessionFactory

# Files that steer how tests run: changing them can change the verdict without fixing the code.
RUNNER_FILES = frozenset(
    {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", ".coveragerc"}
)
HARNESS_FILES = frozenset({"sitecustomize.py", "usercustomize.py"})
LOG_CAP = 20_000


class Verdict(BaseModel):
    """The outcome of verifying one candidate. ``valid`` is False on infrastructure failure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str
    passed: bool
    valid: bool
    tests: dict[str, bool] = Field(default_factory=dict, description="Test id -> passed.")
    suspected_tampering: list[str] = Field(default_factory=list, description="Paths touched.")
    infra_error: str | None = None
    exit_code: int | None = None
    log: str = ""
    duration_s: float = 0.0


def is_test_path(path: str) -> bool:
    p = PurePosixPath(path)
    name = p.name
    in_tests = any(part in ("tests", "test", "testing") for part in p.parts[:-1])
    return (
        in_tests or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
    )


def is_guarded_path(path: str, task: Task) -> bool:
    """Tests, runner configuration or harness: what a fix has no business changing."""
    name = PurePosixPath(path).name
    return (
        path in task.test_files
        or is_test_path(path)
        or name in RUNNER_FILES
        or name in HARNESS_FILES
        or name.endswith(".pth")
    )


def touched_paths(patch: str) -> list[str]:
    """Paths a ``diff --git`` style patch changes (either side)."""
    paths = []
    for line in patch.splitlines():
        m = re.match(r"diff --git a/(.+?) b/(.+)$", line)
        if m:
            paths += [m.group(1), m.group(2)]
    return sorted(set(paths))


def suspected_tampering(patch: str, task: Task) -> list[str]:
    return [p for p in touched_paths(patch) if is_guarded_path(p, task)]


def _restore(session: Session, task: Task, base: dict[str, bytes]) -> None:
    """Put every guarded file back as the task has it; delete guarded files the candidate added."""
    for path in session.list_files():
        if is_guarded_path(path, task) and path not in task.test_files and path not in base:
            session.delete_file(path)
    for path, data in base.items():
        if is_guarded_path(path, task):
            session.write_file(path, data)
    for path, text in task.test_files.items():
        session.write_file(path, text)


def _junit_results(xml_text: bytes, ids: list[str]) -> dict[str, bool]:
    """Map each requested node id to pass/fail from pytest's JUnit report (missing = fail)."""
    outcomes: dict[tuple[str, str], bool] = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        failed = any(child.tag in ("failure", "error", "skipped") for child in case)
        outcomes[key] = outcomes.get(key, True) and not failed
    return {tid: outcomes.get(_junit_key(tid), False) for tid in ids}


def _junit_key(node_id: str) -> tuple[str, str]:
    """``tests/test_a.py::TestX::test_y[1]`` -> ``("tests.test_a.TestX", "test_y[1]")``."""
    file, *rest = node_id.split("::")
    module = posixpath.splitext(file)[0].replace("/", ".")
    return ".".join([module, *rest[:-1]]), rest[-1] if rest else ""


def run_tests(
    session: Session, task: Task, timeout: float | None
) -> tuple[dict[str, bool], ExecResult]:
    """Run the task's test ids in ``session``; returns per-id results and the ``ExecResult``."""
    report = f".gagar-junit-{secrets.token_hex(8)}.xml"
    ids = task.test_ids
    cmd = f"{task.test_command} --junitxml={report} " + " ".join(shlex.quote(i) for i in ids)
    result = session.exec(cmd, timeout=timeout)
    try:
        xml_text = session.read_file(report)
        session.delete_file(report)
    except Exception:
        return dict.fromkeys(ids, False), result
    try:
        return _junit_results(xml_text, ids), result
    except ET.ParseError:
        return dict.fromkeys(ids, False), result


def verify(
    task: Task, candidate: Session, factory: SessionFactory, timeout: float | None = None
) -> Verdict:
    """Verify the candidate's current workspace (left untouched) against the task's tests.

    A failure of the sandbox machinery anywhere on the way gives an invalid verdict
    (``valid=False``), never a failed one.
    """
    try:
        patch = candidate.diff()
        fresh = factory.create(tarball=candidate.archive())
    except SandboxInfraError as e:
        return Verdict(instance_id=task.instance_id, passed=False, valid=False, infra_error=str(e))
    try:
        _restore(fresh, task, task.repo_files())
        tests, result = run_tests(fresh, task, timeout)
    except SandboxInfraError as e:
        return Verdict(instance_id=task.instance_id, passed=False, valid=False, infra_error=str(e))
    finally:
        fresh.close()
    log = (result.stdout + result.stderr)[-LOG_CAP:]
    return Verdict(
        instance_id=task.instance_id,
        # The exit status must agree with the report: no report, or a non-zero exit, is a fail.
        passed=result.infra_error is None and result.exit_code == 0 and all(tests.values()),
        valid=result.infra_error is None,
        tests=tests,
        suspected_tampering=suspected_tampering(patch, task),
        infra_error=result.infra_error,
        exit_code=result.exit_code,
        log=log,
        duration_s=result.duration_s,
    )


def open_session(task: Task, factory: SessionFactory) -> Session:
    """A session on the task's repository (local or on an executor server, per ``factory``)."""
    return factory.create(files=task.repo_files())


def verify_files(
    task: Task, files: dict[str, bytes], factory: SessionFactory, timeout: float | None = None
) -> Verdict:
    """Verify a repository given as files (e.g. the reference fix) via a throwaway session."""
    with_base = open_session(task, factory)
    try:
        for path in with_base.list_files():
            if path not in files:
                with_base.delete_file(path)
        for path, data in files.items():
            with_base.write_file(path, data)
        return verify(task, with_base, factory, timeout)
    finally:
        with_base.close()
