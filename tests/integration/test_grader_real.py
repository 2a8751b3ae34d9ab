"""The grading benchmark's real-repository groups end to end on a package mined here (the tiny
sdist of ``test_mine``): every member runs through the real verifier in bubblewrap, the levels
follow the execution (a fix that breaks a held-back test is last, a planted forgery is a hack
only because it fools a plain pytest run and fails the verifier), and ``gagar grader eval
--real`` grades them beside the synthetic set and records each member's execution."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gagar.cli import main
from gagar.driver import grader_real_build as build
from gagar.grader.evaluate import Graded, score_group
from gagar.grader.protocol import HeuristicGrader
from gagar.rollout.envs.mine import sdist
from gagar.rollout.envs.mine.miner import MineConfig, dump_rows, mine
from gagar.rollout.envs.task import Task, load_tasks
from tests.integration.test_mine import make_sdist

pytest.importorskip("gagar.sandbox.local")


@pytest.fixture(scope="module")
def factory():
    from gagar.sandbox import Limits
    from gagar.sandbox.local import LocalFactory

    return LocalFactory(limits=Limits(wall_time_s=900, cpu_time_s=300))


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory: pytest.TempPathFactory, factory) -> Path:
    root = tmp_path_factory.mktemp("mine-real")
    pkg = sdist.load(str(make_sdist(root)), root / "cache")
    tasks, _ = mine(pkg, factory, MineConfig(seed=1, max_edits=8), root / "out")
    dump_rows(tasks, root / "out" / "tasks.jsonl")
    return root / "out" / "tasks.jsonl"


def _with_partner(tasks: list[Task]) -> tuple[Task, list[Task]]:
    for task in sorted(tasks, key=lambda t: t.instance_id):
        if partners := build.breaker_partners(task, tasks, random.Random(0)):
            return task, partners
    raise AssertionError("no mined task has a partner whose failures are all held back")


def test_members_are_labelled_by_running_them(tasks_file: Path, factory) -> None:
    tasks = load_tasks(tasks_file)
    task, partners = _with_partner(tasks)
    g = build.build_group("r", task, partners, factory, seed=0)
    by_kind = {m["kind"]: m for m in g.members}
    assert {"reference", "redundant", "dead_helper", "held_back_breaker"} <= set(by_kind)
    assert "reformat" in by_kind or "reformat" in g.dropped  # tinycalc may have none to reformat
    ref, breaker = by_kind["reference"], by_kind["held_back_breaker"]
    assert ref["execution"]["visible_passed"] and ref["execution"]["full_run"]
    assert ref["held_back_failed"] == [] and ref["level"] == 0 and ref["outside"] == 0
    assert by_kind["redundant"]["redundant"] == 2 and by_kind["redundant"]["level"] == 1
    assert by_kind["dead_helper"]["outside"] == 6 and by_kind["dead_helper"]["level"] == 2
    # the breaker passes its visible tests and fails a held-back one: last, whatever its scope
    assert breaker["execution"]["visible_passed"] and breaker["held_back_failed"]
    assert set(breaker["held_back_failed"]) <= set(task.held_back)
    assert breaker["level"] == max(m["level"] for m in g.members if m["level"] is not None)
    (hack,) = [m for m in g.members if m["hack"]]
    assert hack["kind"] in ("tests_edited", "conftest_hook") and hack["level"] is None
    assert hack["execution"]["naive_passed"] and not hack["execution"]["visible_passed"]
    assert [c.passed for c in g.group.candidates] == [True] * len(g.members)
    assert g.group.relevant_files == ["tinycalc/__init__.py"]
    ranking = HeuristicGrader().grade_sync(g.group)
    score = score_group(g.reference(), [Graded(ranking, list(range(len(g.kinds))), 0.0)])
    assert score.usable and score.pairs > 0 and score.hacks_planted == 1
    assert build.RealGroup.from_json(g.to_json()) == g


def test_eval_grades_real_groups_as_rows_of_their_own(tasks_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    args = ["grader", "eval", "--groups", "0", "--real", str(tasks_file), "--real-groups", "1"]
    args += ["--real-packages", "tinycalc", "--shuffles", "1", "--cache", str(tmp_path)]
    assert main([*args, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["rows"]) == ["heuristic · real"]
    row = result["rows"]["heuristic · real"]
    assert row["groups"] == 1 and row["usable_rate"] == 1.0
    (group,) = result["real"]["groups"]
    assert group["package"] == "tinycalc" and group["task_id"].startswith("tinycalc-0.1.")
    for member in group["members"]:
        assert {"kind", "execution", "level", "hack", "held_back_failed", "outside"} <= set(member)
    (scored,) = result["per_group"]["heuristic · real"]
    assert scored["id"] == group["id"] and len(scored["positions"]) == 2  # as built, 1 shuffle
    cached = list(tmp_path.glob("real-*-tinycalc-s0-n1.jsonl"))
    assert len(cached) == 1  # built once, appended as it was done
