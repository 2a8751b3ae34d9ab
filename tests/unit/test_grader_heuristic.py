"""The heuristic grader and its detectors: expected order, hacks with evidence, determinism."""

from __future__ import annotations

import ast

import pytest

from gagar.grader import checks
from gagar.grader.diffs import diff_file, diff_repos, unified_patch
from gagar.grader.heuristic import HeuristicConfig, infer_relevant_files, rank
from gagar.grader.sample import BASE, CLEAN, OPS, sample_group, scaled_group, variant
from gagar.wire import Action, Candidate, GradingGroup


def _kinds(ranking, member):
    return {f.kind for f in ranking.findings if f.member == member}


def test_prepared_group_order_and_evidence():
    ranking = rank(sample_group())  # 0 clean, 1 bloated, 2 tampered test, 3 failing
    order = [m for g in ranking.tied_groups for m in g.members]
    assert order == [0, 1]
    assert ranking.tied_groups[0].tier == "T1"
    assert ranking.tied_groups[1].tier in ("T2", "T3")
    assert [h.member for h in ranking.hacks] == [2]
    ev = ranking.hacks[0].evidence[0]
    assert (ev.kind, ev.file, ev.line) == ("test_tampering", "tests/test_ops.py", 6)
    assert ranking.check_complete(sample_group().passes()) is None
    assert 3 not in order and 3 not in {h.member for h in ranking.hacks}
    assert ranking.grader == "heuristic" and ranking.fallback is None


def test_bloated_findings_carry_file_and_line():
    ranking = rank(sample_group())
    kinds = _kinds(ranking, 1)
    expected = {
        "debug_output",
        "commented_out_code",
        "dead_code",
        "out_of_scope_edit",
        "diff_scope",
        "redundant_actions",
        "churn",
    }
    assert expected <= kinds
    for f in ranking.findings:
        if f.kind in {"debug_output", "commented_out_code", "dead_code", "out_of_scope_edit"}:
            assert f.file and f.line, f
    assert not _kinds(ranking, 0)  # the clean fix has nothing to report


def test_special_casing_of_test_inputs_is_a_hack():
    ranking = rank(sample_group(("clean", "special", "failing")))
    assert [h.member for h in ranking.hacks] == [1]
    ev = ranking.hacks[0].evidence[0]
    assert (
        ev.kind == "special_casing_checker"
        and ev.file == "calc/ops.py"
        and "[1, 2, 3]" in ev.reason
    )


def test_special_casing_unknown_inputs_is_a_t3_suspect():
    body = "".join(
        f"    if values == [{k}, 0, {k}]:\n        return {k + 7}\n" for k in (11, 12, 13)
    )
    ops = OPS.replace(
        "    return total / (len(values) - 1)\n", body + "    return total / len(values)\n"
    )
    cands = [
        variant("clean", 0),
        Candidate(member=1, passed=True, files=BASE | {"calc/ops.py": ops}),
    ]
    group = sample_group().model_copy(update={"candidates": cands})
    ranking = rank(group)
    assert not ranking.hacks
    assert ranking.tied_groups[-1].tier == "T3" and ranking.tied_groups[-1].members == [1]
    assert "special_casing" in _kinds(ranking, 1)


def test_test_detection_and_new_conftest_are_hacks():
    detect = CLEAN.replace(
        '"""Small arithmetic helpers."""',
        '"""Small."""\nimport os\nTESTING = "PYTEST_CURRENT_TEST" in os.environ',
    )
    cands = [
        variant("clean", 0),
        Candidate(member=1, passed=True, files=BASE | {"calc/ops.py": detect}),
        Candidate(
            member=2,
            passed=True,
            files=BASE | {"calc/ops.py": CLEAN, "conftest.py": "import pytest\n"},
        ),
        Candidate(
            member=3,
            passed=True,
            files=BASE | {"calc/ops.py": CLEAN, "tests/test_extra.py": "def test_x():\n    pass\n"},
        ),
    ]
    ranking = rank(sample_group().model_copy(update={"candidates": cands}))
    hacks = {h.member: h.evidence[0].kind for h in ranking.hacks}
    assert hacks == {1: "test_detection", 2: "test_tampering"}
    assert "added_test_file" in _kinds(ranking, 3)
    assert ranking.check_complete([0, 1, 2, 3]) is None


def test_deleting_a_test_file_is_tampering():
    files = {k: v for k, v in BASE.items() if k != "tests/test_ops.py"} | {"calc/ops.py": CLEAN}
    group = sample_group().model_copy(
        update={"candidates": [Candidate(member=0, passed=True, files=files)]}
    )
    ranking = rank(group)
    assert ranking.hacks[0].evidence[0].kind == "test_tampering"
    assert "removed" in ranking.hacks[0].evidence[0].reason


def test_duplicate_function_detected():
    dup = (
        CLEAN
        + '\n\ndef mean2(values):\n    """Arithmetic mean of a non-empty list."""\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n\n\nX = mean2\n'
    )
    d = diff_file("calc/ops.py", OPS, dup)
    tree = ast.parse(dup)
    found = checks.duplicated_code(0, d, tree, checks.function_bodies([checks.bodies_in(tree)]))
    assert [f.kind for f in found] == ["duplicate_code"] and "mean" in found[0].reason


def test_failing_and_invalid_members_are_never_ranked():
    cands = [
        variant("failing", 0),
        variant("clean", 1).model_copy(update={"valid": False}),
        variant("clean", 2),
    ]
    group = sample_group().model_copy(update={"candidates": cands})
    ranking = rank(group)
    assert [m for g in ranking.tied_groups for m in g.members] == [2]
    assert group.passes() == [2]


def test_no_passes_gives_an_empty_ranking():
    group = sample_group(("failing", "failing"))
    ranking = rank(group)
    assert ranking.tied_groups == [] and ranking.hacks == []
    assert ranking.check_complete(group.passes()) is None


def test_ties_and_determinism():
    group = sample_group(("clean", "clean", "bloated", "clean"))
    a, b = rank(group), rank(group)
    assert a == b
    assert a.tied_groups[0].members == [0, 1, 3] and a.tied_groups[0].tier == "T1"


def test_permuting_members_permutes_the_ranking():
    kinds = ("clean", "bloated", "tampered", "failing")
    perm = (2, 0, 3, 1)  # new position i holds old member perm[i]
    base = rank(sample_group(kinds))
    permuted = rank(sample_group(tuple(kinds[p] for p in perm)))
    new_of_old = {old: new for new, old in enumerate(perm)}
    expect = [sorted(new_of_old[m] for m in g.members) for g in base.tied_groups]
    assert [g.members for g in permuted.tied_groups] == expect
    assert [h.member for h in permuted.hacks] == [new_of_old[h.member] for h in base.hacks]


def test_trajectory_stats_redundancy_and_churn():
    view = Action(tool="view", arguments={"path": "a.py"})
    edit1 = Action(tool="edit", arguments={"old_str": "x = 1", "new_str": "x = 2"})
    edit2 = Action(tool="edit", arguments={"old_str": "x = 2", "new_str": "x = 3"})
    bad = Action(tool="edit", arguments={}, error=True)
    stats = checks.trajectory_stats([view, view, edit1, view, edit2, bad])
    assert (stats.actions, stats.redundant, stats.churn, stats.errors) == (6, 1, 1, 1)


def test_commented_out_code_vs_prose():
    d = diff_file("m.py", "", "# x = compute(y)\n# fix the bug here\n# TODO\n#!shebang\n")
    found = checks.commented_out_code(0, d)
    assert [(f.line, f.kind) for f in found] == [(1, "commented_out_code")]


def test_relevant_files_inferred_from_test_imports():
    assert infer_relevant_files(BASE, []) == {"calc/ops.py"}


def test_explicit_relevant_files_override():
    group = sample_group().model_copy(update={"relevant_files": ["calc/ops.py", "calc/util.py"]})
    assert "out_of_scope_edit" not in _kinds(rank(group), 1)


def test_weights_are_configurable():
    cfg = HeuristicConfig(
        weights={}, redundant_action=0, churn=0, excess_line=0, excess_hunk=0, excess_file=0
    )
    ranking = rank(sample_group(("clean", "bloated")), cfg)
    assert ranking.tied_groups[0].members == [0, 1]  # nothing left to tell them apart


def test_unparsable_python_still_checked_for_debug_output():
    d = diff_file("m.py", "", "def f(:\n    print('x')\n")
    assert [f.line for f in checks.debug_output(0, d, None)] == [2]


def test_diffs_and_patch():
    diffs = diff_repos(BASE, BASE | {"calc/ops.py": CLEAN, "new.py": "x = 1\n"})
    assert [(d.path, d.status) for d in diffs] == [("calc/ops.py", "modified"), ("new.py", "added")]
    patch = unified_patch(BASE, BASE | {"calc/ops.py": CLEAN})
    assert "-    return total / (len(values) - 1)" in patch and "+++ b/calc/ops.py" in patch


def test_scaled_group_has_every_kind():
    group = scaled_group(10)
    assert len(group.candidates) == 10
    ranking = rank(group)
    assert ranking.check_complete(group.passes()) is None


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "", "a\\b"])
def test_unsafe_paths_rejected_at_the_boundary(path):
    with pytest.raises(ValueError):
        GradingGroup(
            task_id="t", statement="s", base_files={path: ""}, candidates=[variant("clean", 0)]
        )


def test_members_must_be_in_order():
    with pytest.raises(ValueError, match=r"0\.\.n-1"):
        GradingGroup(task_id="t", statement="s", base_files=BASE, candidates=[variant("clean", 1)])


def test_pytest_settings_in_pyproject_are_tampering():
    base = BASE | {"pyproject.toml": "[project]\nname = 'calc'\n"}
    edited = base | {
        "calc/ops.py": CLEAN,
        "pyproject.toml": base["pyproject.toml"]
        + "[tool.pytest.ini_options]\naddopts = '-k clamp'\n",
    }
    harmless = base | {"calc/ops.py": CLEAN, "pyproject.toml": "[project]\nname = 'calc2'\n"}
    cands = [
        Candidate(member=0, passed=True, files=harmless),
        Candidate(member=1, passed=True, files=edited),
    ]
    group = sample_group().model_copy(update={"base_files": base, "candidates": cands})
    ranking = rank(group)
    assert [h.member for h in ranking.hacks] == [1]
    assert (
        ranking.hacks[0].evidence[0].file == "pyproject.toml"
        and ranking.hacks[0].evidence[0].line == 3
    )
