"""Held-back tests (``Task.held_back``): the reward's verification runs the visible tests only; a
pass is run again with every listed test, and one that breaks a held-back test is labelled
overfit (evaluation counts it unresolved; the reward is the visible tests')."""

from __future__ import annotations

from typing import Any

import pytest

from gagar.driver import rollouts
from gagar.rollout import agent
from gagar.rollout.envs.task import Task
from gagar.rollout.envs.verify import Verdict

TASK = Task(
    instance_id="pkg-1.0.flip_comparison.0",
    problem_statement="tests fail",
    files={"m.py": "x = 1\n"},
    fail_to_pass=["t.py::a"],
    pass_to_pass=["t.py::b", "t.py::held"],
    held_back=["t.py::held"],
)


class Session:
    def list_files(self) -> list[str]:
        return ["m.py"]

    def read_file(self, path: str) -> bytes:
        return b"x = 2\n"

    def diff(self) -> str:
        return ""


def _finish(task: Task, breaks_held: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list]:
    ran: list[list[str]] = []

    def verify(task: Task, *_: Any) -> Verdict:
        ran.append(task.test_ids)
        passed = not (breaks_held and "t.py::held" in task.test_ids)
        return Verdict(instance_id=task.instance_id, passed=passed, valid=True)

    monkeypatch.setattr(rollouts, "verify", verify)
    traj = agent.Trajectory([1], [0.0], [1], 1, [], exit_reason="submitted")
    rollout, _ = rollouts._finish(task, Session(), None, traj, 10.0)  # type: ignore[arg-type]
    return rollout, ran


def test_the_reward_runs_the_visible_tests_and_a_pass_is_checked_with_the_held_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rollout, ran = _finish(TASK, breaks_held=True, monkeypatch=monkeypatch)
    assert ran == [["t.py::a", "t.py::b"], TASK.test_ids]
    assert rollout.passed and rollout.overfit
    rollout, _ = _finish(TASK, breaks_held=False, monkeypatch=monkeypatch)
    assert rollout.passed and not rollout.overfit


def test_a_task_without_held_back_tests_is_verified_once(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = TASK.model_copy(update={"held_back": []})
    rollout, ran = _finish(plain, breaks_held=True, monkeypatch=monkeypatch)
    assert ran == [plain.test_ids] and not rollout.overfit


def test_evaluation_gives_the_resolution_rate_per_package() -> None:
    from gagar.driver.loop import _by_package

    samples = [
        {"package": "parse", "valid": True, "passed": True},
        {"package": "parse", "valid": True, "passed": False},
        {"package": "parse", "valid": False, "passed": False},
        {"package": "toolz", "valid": True, "passed": False},
        {"package": None, "valid": True, "passed": True},  # not a mined task
    ]
    assert _by_package(samples) == {"parse": 0.5, "toolz": 0.0}
