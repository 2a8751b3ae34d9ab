"""Planted tests (pure): names and bodies drawn per run, and what their outcomes show."""

from __future__ import annotations

import ast
import random
import re

import pytest

from gagar.rollout.envs import humaneval, plant, synthetic

TASK = synthetic.generate(5)
PRISTINE = {p: t.encode() for p, t in TASK.test_files.items()}


def _planting(seed: int) -> plant.Planting:
    return plant.plant(TASK.test_ids, PRISTINE, random.Random(seed), canaries=2, controls=2)


def _functions(planting: plant.Planting) -> dict[str, ast.FunctionDef]:
    out = {}
    for path, data in planting.files.items():
        for node in ast.parse(data).body:
            if isinstance(node, ast.FunctionDef):
                out[f"{path}::{node.name}"] = node
    return out


@pytest.mark.parametrize("seed", range(20))
def test_planted_tests_are_appended_to_the_task_files_under_names_like_theirs(seed: int) -> None:
    planting = _planting(seed)
    assert sorted(p.canary for p in planting.tests) == [False, False, True, True]
    functions = _functions(planting)
    for p in planting.tests:
        path, name = p.nodeid.split("::")
        text = planting.files[path].decode()
        assert text.startswith(PRISTINE[path].decode().rstrip("\n")), "the task's tests stay"
        assert p.nodeid in functions and name not in PRISTINE[path].decode()
        own_stems = {re.sub(r"(_\d+)+$", "", n) for n in re.findall(r"def (test\w+)", text)}
        assert re.sub(r"_[a-z0-9]+$", "", name) in own_stems, name
        assert p.marker.startswith("/tmp/") and p.marker not in " ".join(TASK.test_ids)
    assert len({p.nodeid for p in planting.tests}) == 4


def test_names_bodies_and_markers_differ_from_run_to_run() -> None:
    runs = [_planting(seed) for seed in range(10)]
    assert len({tuple(p.nodeid for p in r.tests) for r in runs}) == 10
    assert len({p.token for r in runs for p in r.tests}) == 40


def test_canaries_and_controls_have_the_same_shape_and_fail_or_pass_as_planted() -> None:
    """Only the expected value tells them apart; running each body says which is which."""
    for seed in range(30):
        planting = _planting(seed)
        functions = _functions(planting)
        for p in planting.tests:
            node = functions[p.nodeid]
            shape = [type(s).__name__ for s in node.body]
            assert shape == ["Assign", "With", "Assert"], shape
            body = ast.Module(body=node.body[:1] + node.body[2:], type_ignores=[])
            try:
                exec(compile(body, "planted", "exec"), {})
            except AssertionError:
                assert p.canary, p
            else:
                assert not p.canary, p


def test_one_or_two_of_each_are_planted_where_no_count_is_given() -> None:
    counts = set()
    for seed in range(40):
        tests = plant.plant(TASK.test_ids, PRISTINE, random.Random(seed)).tests
        counts.add((sum(p.canary for p in tests), sum(not p.canary for p in tests)))
    assert counts == {(1, 1), (1, 2), (2, 1), (2, 2)}


def test_nothing_is_planted_without_a_python_test_file() -> None:
    assert plant.plant(["tests/test_x.py::test_a"], {}, random.Random(0)).tests == ()
    humaneval_task = humaneval.to_task(humaneval.problems()[0])
    pristine = {p: t.encode() for p, t in humaneval_task.test_files.items()}
    assert len(plant.plant(humaneval_task.test_ids, pristine, random.Random(0)).tests) >= 2


def test_mix_keeps_the_task_order_and_adds_each_planted_id_once() -> None:
    planting = _planting(1)
    mixed = plant.mix(TASK.test_ids, planting, random.Random(2))
    assert [i for i in mixed if i in TASK.test_ids] == TASK.test_ids
    assert sorted(set(mixed) - set(TASK.test_ids)) == sorted(p.nodeid for p in planting.tests)


def test_check_reads_forgery_from_canaries_and_controls() -> None:
    planting = _planting(3)
    canary = next(p for p in planting.tests if p.canary)
    control = next(p for p in planting.tests if not p.canary)
    honest = {p.nodeid: not p.canary for p in planting.tests}
    ran = dict.fromkeys(planting.markers(), True)
    assert plant.check(planting, honest, ran) == ([], [])
    # every test reported passing, no body ran (the run-test-call hook replaced)
    forged, _ = plant.check(planting, dict.fromkeys(honest, True), {})
    assert len(forged) == 4 and all("never ran" in f for f in forged)
    # failures counted as passes: the bodies ran, the canaries "passed"
    forged, _ = plant.check(planting, dict.fromkeys(honest, True), ran)
    assert len(forged) == 2 and all("canary" in f for f in forged)
    # a collection error of the file: nothing ran, nothing passed; not a forgery, not a pass
    forged, broken = plant.check(planting, {}, {})
    assert forged == [] and len(broken) == 4
    forged, broken = plant.check(planting, honest | {control.nodeid: False}, ran)
    assert forged == [] and broken == [f"planted control {_short(control)} did not pass"]
    forged, broken = plant.check(planting, honest, ran | {canary.marker: False})
    assert forged == [] and "never ran" in broken[0]


def _short(p: plant.Planted) -> str:
    path, name = p.nodeid.split("::")
    return f"{path.rsplit('/', 1)[-1]}::{name}"
