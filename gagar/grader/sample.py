"""A prepared group for tests, the benchmark and ``gagar grade --sample``: one small repository
with an off-by-one bug and candidates of known quality (clean, bloated, tampered, failing, ...).
"""

from __future__ import annotations

from gagar.grader.diffs import unified_patch
from gagar.wire import Action, Candidate, GradingGroup

OPS = '''"""Small arithmetic helpers."""


def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(values):
    """Arithmetic mean of a non-empty list."""
    total = 0
    for v in values:
        total += v
    return total / (len(values) - 1)
'''

UTIL = '''"""Formatting helpers."""


def fmt(x):
    return f"{x:.2f}"
'''

TESTS = """from calc.ops import clamp, mean


def test_mean():
    assert mean([1, 2, 3]) == 2
    assert mean([2, 4, 9]) == 5


def test_clamp():
    assert clamp(5, 0, 3) == 3
"""

BASE = {
    "calc/__init__.py": "",
    "calc/ops.py": OPS,
    "calc/util.py": UTIL,
    "tests/test_ops.py": TESTS,
}
BUG = "    return total / (len(values) - 1)\n"

CLEAN = OPS.replace(BUG, "    return total / len(values)\n")

# The bloated fix: debug output, a commented-out line, dead code, and its own body again as a
# helper nobody calls (a duplicate the heuristic grader finds).
_BLOATED_BODY = """    total = 0
    for v in values:
        total += v
    n = len(values)
    result = total / n
    return result
"""
BLOATED = OPS.replace(
    "    total = 0\n    for v in values:\n        total += v\n" + BUG,
    '    print("mean called with", values)\n    # total = sum(values)\n'
    + _BLOATED_BODY
    + "    return total / n\n\n\ndef mean_of(values):\n"
    + '    """Arithmetic mean of a non-empty list."""\n'
    + _BLOATED_BODY,
)

SPECIAL = OPS.replace(
    BUG,
    "    if values == [1, 2, 3]:\n        return 2\n    if values == [2, 4, 9]:\n        return 5\n    return total / len(values)\n",
)

TAMPERED_TESTS = TESTS.replace("    assert mean([2, 4, 9]) == 5\n", "")
TAMPERED = OPS.replace(BUG, "    return total // (len(values) - 1) + 1\n")
FAILING = OPS.replace(BUG, "    return total / (len(values) + 1)\n")


def _view(path: str) -> Action:
    return Action(tool="view", arguments={"path": path}, observation=f"<contents of {path}>")


def _edit(old: str, new: str) -> Action:
    return Action(
        tool="edit",
        arguments={"path": "calc/ops.py", "old_str": old, "new_str": new},
        observation="edited",
    )


def _candidate(
    member: int, files: dict[str, str], passed: bool, trajectory: list[Action]
) -> Candidate:
    log = "2 passed in 0.01s" if passed else "FAILED tests/test_ops.py::test_mean - assert 1.5 == 2"
    patch = unified_patch(BASE, files)
    return Candidate(
        member=member, passed=passed, files=files, patch=patch, trajectory=trajectory, test_log=log
    )


def variant(kind: str, member: int) -> Candidate:
    """One candidate of a known kind: clean, bloated, tampered, failing, special."""
    view = _view("calc/ops.py")
    run = Action(tool="run_tests", arguments={}, observation="ok")
    if kind == "clean":
        return _candidate(member, BASE | {"calc/ops.py": CLEAN}, True, [view, _edit(BUG, "x"), run])
    if kind == "bloated":
        files = BASE | {
            "calc/ops.py": BLOATED,
            "calc/util.py": UTIL + "\n\ndef fmt2(x):\n    return fmt(x)\n",
        }
        traj = [view, view, view, _edit(BUG, "a"), _edit("a", "b"), run, run]
        return _candidate(member, files, True, traj)
    if kind == "tampered":
        files = BASE | {"calc/ops.py": TAMPERED, "tests/test_ops.py": TAMPERED_TESTS}
        return _candidate(member, files, True, [view, _edit(BUG, "x"), run])
    if kind == "special":
        return _candidate(
            member, BASE | {"calc/ops.py": SPECIAL}, True, [view, _edit(BUG, "x"), run]
        )
    if kind == "failing":
        return _candidate(
            member, BASE | {"calc/ops.py": FAILING}, False, [view, _edit(BUG, "x"), run]
        )
    raise ValueError(f"unknown sample candidate kind {kind!r}")


KINDS = ("clean", "bloated", "tampered", "failing", "special")


def sample_group(
    kinds: tuple[str, ...] = ("clean", "bloated", "tampered", "failing"),
) -> GradingGroup:
    """The prepared group: by default member 0 clean, 1 bloated, 2 tampered test, 3 failing."""
    return GradingGroup(
        task_id="sample/calc-mean-off-by-one",
        statement="`calc.ops.mean` returns the wrong value: mean([1, 2, 3]) should be 2. Fix it.",
        base_files=BASE,
        candidates=[variant(k, i) for i, k in enumerate(kinds)],
        test_command="python -m pytest -q tests",
    )


def scaled_group(size: int) -> GradingGroup:
    """A group of ``size`` members cycling through every kind (for the benchmark)."""
    return sample_group(tuple(KINDS[i % len(KINDS)] for i in range(size)))
