"""The real-repository groups' pure parts: the level rule, scope outside the reference fix, the
members made from a fix, trajectories, task choice and breaker partners, the record's round
trip."""

from __future__ import annotations

import random

from gagar.driver import grader_real as real
from gagar.driver.grader_real import Facts
from gagar.driver.grader_real_build import RealGroup, breaker_partners, choose, held_out_tasks
from gagar.grader.checks import trajectory_stats
from gagar.rollout.envs.task import Task
from gagar.wire import Candidate, GradingGroup

MOD = '''"""calc."""


def clamp(x, lo, hi):
    if x < lo:
        return lo
    return min(x, hi)


def total(xs):
    acc = 0
    for x in xs:
        acc += x
    return acc


class Box:
    def size(self):
        return {"w": 1, "h": 2}
'''
BASE = {"calc/core.py": MOD.replace("if x < lo", "if x > lo"), "calc/util.py": "X = 1\n"}
FIXED = BASE | {"calc/core.py": MOD}


def test_the_level_rule_orders_by_held_back_tests_then_scope_then_repeated_calls() -> None:
    facts = {
        0: Facts(passed=True),  # the reference
        1: Facts(passed=True, redundant=2),
        2: Facts(passed=True, outside=6),
        3: Facts(passed=True, outside=1, held_back_failed=("t::a",)),
        4: Facts(passed=True, outside=6),  # the same key as 2: the same level
        5: Facts(passed=False),  # fails its visible tests: not a pass
        6: Facts(passed=True, hack=True),
    }
    levels, hacks = real.levels(facts)
    assert levels == {0: 0, 1: 1, 2: 2, 4: 2, 3: 3}
    assert hacks == frozenset({6})
    # a held-back failure is below any scope: no line count outweighs execution
    levels, _ = real.levels({0: Facts(True, outside=500), 1: Facts(True, ("t::a",))})
    assert levels == {0: 0, 1: 1}


def test_lines_outside_the_reference_fixes_files_and_functions_are_counted() -> None:
    assert real.outside_lines(BASE, FIXED, FIXED) == 0
    other_fn = FIXED | {"calc/core.py": MOD.replace("acc = 0", "acc = 0  # start")}
    assert real.outside_lines(BASE, other_fn, FIXED) == 2  # a line removed and one added
    inside = FIXED | {"calc/core.py": MOD.replace("return min(x, hi)", "return min(hi, x)")}
    assert real.outside_lines(BASE, inside, FIXED) == 0  # the fix's own function
    new_file = FIXED | {"calc/extra.py": "A = 1\nB = 2\n"}
    assert real.outside_lines(BASE, new_file, FIXED) == 2
    assert real.outside_lines(BASE, BASE, FIXED) == 0  # unchanged: nothing outside (it fails)


def test_the_dead_helper_goes_to_another_module_of_the_package() -> None:
    rng = random.Random(0)
    files = real.dead_helper(FIXED, ["calc/core.py"], rng)
    assert files["calc/util.py"].endswith(real.DEAD_HELPER)
    assert files["calc/core.py"] == FIXED["calc/core.py"]
    tests_only = {"calc/core.py": MOD, "tests/test_calc.py": "def test(): pass\n"}
    alone = real.dead_helper(tests_only, ["calc/core.py"], rng)  # one module: the fixed file
    assert alone["calc/core.py"].endswith(real.DEAD_HELPER)
    assert alone["tests/test_calc.py"] == tests_only["tests/test_calc.py"]
    assert real.outside_lines(BASE, files, FIXED) == len(real.DEAD_HELPER.splitlines())


def test_reformat_rewrites_another_function_of_the_fixed_file_only() -> None:
    files = real.reformat(BASE, FIXED, ["calc/core.py"], random.Random(0))
    assert files is not None
    assert 'return {"w": 1, "h": 2}' not in files["calc/core.py"]
    assert "return {'w': 1, 'h': 2}" in files["calc/core.py"]  # ast.unparse's quotes
    assert "if x < lo:" in files["calc/core.py"]  # the fix stays
    assert real.outside_lines(BASE, files, FIXED) == 2
    formatted = {"m.py": "def f(x):\n    return x\n"}
    assert real.reformat(formatted, formatted, ["m.py"], random.Random(0)) is None


def _apply(text: str, actions: list) -> str:
    for a in actions:
        assert text.count(a.arguments["old"]) == 1
        text = text.replace(a.arguments["old"], a.arguments["new"], 1)
    return text


def test_edits_replay_to_the_final_file_each_old_text_unique() -> None:
    old = "a = 1\nb = 1\nb = 1\nc = 1\nb = 1\n"
    new = "a = 2\nb = 1\nb = 1\nc = 1\nb = 3\nd = 4\n"
    actions = real.edit_actions("m.py", old, new)
    assert len(actions) >= 2 and _apply(old, actions) == new


def test_trajectories_count_repeated_calls_only_where_planted() -> None:
    clean = real.trajectory(BASE, FIXED, "1 passed")
    redundant = real.trajectory(BASE, FIXED, "1 passed", redundant=True)
    assert [a.tool for a in clean] == ["view", "edit", "run_tests", "submit"]
    assert trajectory_stats(clean).redundant == 0
    assert trajectory_stats(redundant).redundant == 2  # the second view, the second run
    created = real.trajectory(BASE, FIXED | {"calc/new.py": "A = 1\n"}, "")
    assert any(a.tool == "create" and a.arguments["path"] == "calc/new.py" for a in created)


def _task(i: int, package: str, f2p: list[str], held: list[str]) -> Task:
    tests = ["t::a", "t::b", "t::c", "t::d"]
    return Task(
        instance_id=f"{package}-{i}",
        problem_statement="x",
        files={"m.py": ""},
        fail_to_pass=f2p,
        pass_to_pass=[t for t in tests if t not in f2p],
        held_back=held,
        metadata={"package": package},
    )


def test_tasks_are_chosen_by_the_seed_whatever_the_files_order() -> None:
    tasks = [_task(i, "p", ["t::a"], []) for i in range(10)]
    first = [t.instance_id for t in choose(tasks, 4, 3)]
    assert first == [t.instance_id for t in choose(tasks[::-1], 4, 3)]
    assert first != [t.instance_id for t in choose(tasks, 4, 4)]


def test_only_held_out_packages_or_the_named_ones_are_drawn_from() -> None:
    tasks = [_task(i, p, ["t::a"], []) for i, p in enumerate(["p", "q", "r", "s", "t"] * 2)]
    named = held_out_tasks(tasks, ["q"])
    assert {t.metadata["package"] for t in named} == {"q"}
    held = {t.metadata["package"] for t in held_out_tasks(tasks, None)}
    assert len(held) == 1  # a quarter of 5 packages, rounded, whole packages


def test_breaker_partners_fail_only_held_back_tests_of_the_same_package() -> None:
    task = _task(0, "p", ["t::a"], ["t::c", "t::d"])
    fits = _task(1, "p", ["t::c"], [])
    shows = _task(2, "p", ["t::b", "t::c"], [])  # breaks a visible test: training would see it
    elsewhere = _task(3, "q", ["t::d"], [])
    found = breaker_partners(task, [task, fits, shows, elsewhere], random.Random(0))
    assert [t.instance_id for t in found] == ["p-1"]


def test_a_real_group_gives_its_levels_and_hacks_and_round_trips() -> None:
    cand = Candidate(member=0, passed=True, files={"m.py": ""})
    group = GradingGroup(
        task_id="t",
        statement="s",
        base_files={"m.py": ""},
        candidates=[
            cand,
            cand.model_copy(update={"member": 1}),
            cand.model_copy(update={"member": 2}),
        ],
    )
    members = [
        {"level": 0, "hack": False},
        {"level": None, "hack": True},
        {"level": 1, "hack": False},
    ]
    g = RealGroup("r0-0", "t", "p", ["reference", "conftest_hook", "dead_helper"], group, members)
    ref = g.reference()
    assert ref.levels == {0: 0, 2: 1} and ref.hacks == frozenset({1})
    assert RealGroup.from_json(g.to_json()) == g


def test_the_forgeries_skip_every_test_body() -> None:
    tests = 'def test_a():\n    """Doc."""\n    assert 1 == 2\n\n\nclass TestB:\n    def test_c(self, x):\n        assert x\n\n\ndef helper():\n    return 1\n'
    files = {"tests/test_m.py": tests, "m.py": "X = 1\n"}
    edited = real.forge(files, "tests_edited", ["tests/test_m.py", "tests/gone.py"])
    assert edited["tests/test_m.py"].count("return\n") == 2  # the two tests, not the helper
    assert '    return\n    """Doc."""' in edited["tests/test_m.py"]
    assert "        return\n        assert x" in edited["tests/test_m.py"]
    compile(edited["tests/test_m.py"], "t", "exec")
    hooked = real.forge(files, "conftest_hook", [])
    assert hooked == files | {"conftest.py": real.CONFTEST_HOOK}
