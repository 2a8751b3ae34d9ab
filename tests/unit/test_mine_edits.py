"""The miner's pure parts: span edits keep formatting, the order is the seed's, the reference fix
is a reverse diff that applies, rows and snapshots are byte-identical run to run, sdists unpack
safely and are pinned by sha256."""

from __future__ import annotations

import ast
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from gagar.rollout.envs.mine import sdist
from gagar.rollout.envs.mine.edits import EDIT_KINDS, find_edits
from gagar.rollout.envs.mine.miner import (
    MineConfig,
    deterministic_tarball,
    held_back,
    order,
    problem_statement,
    reverse_diff,
)
from gagar.rollout.envs.patches import apply_patch

SOURCE = '''"""Module doc."""
LIMIT = 10  # module level: runs at import, never edited


def clamp(x, lo=0, hi=LIMIT):  # a comment that must survive
    """Doc: 5 < 6 is no code."""
    if x < lo:
        return lo
    elif x >= hi:
        return hi
    total = x + 1  # keep me
    total -= 2
    flag = True and not (x == 3)
    while total > 100:
        total //= 2
    return total if flag else -total


class Box:
    def get(self, items):
        if items is None:
            return []
        return [i for i in items if i in self.allowed]
'''


def _edits() -> list:
    return find_edits("pkg/mod.py", SOURCE)


def _one(kind: str, old: str, line: int) -> object:
    [edit] = [e for e in _edits() if e.kind == kind and e.old == old and e.line == line]
    return edit


@pytest.mark.parametrize(
    ("kind", "old", "line", "new"),
    [
        ("flip_comparison", "<", 7, "<="),
        ("flip_comparison", ">=", 9, ">"),
        ("flip_comparison", "is", 21, "is not"),
        ("flip_comparison", "in", 23, "not in"),
        ("flip_operator", "+", 11, "-"),
        ("flip_operator", "-=", 12, "+="),
        ("flip_operator", "//=", 15, "*="),
        ("flip_operator", "and", 13, "or"),
        ("flip_boolean", "True", 13, "False"),
        ("negate_condition", "x < lo", 7, "not (x < lo)"),
        ("negate_condition", "flag", 16, "not (flag)"),
        ("constant_shift", "100", 14, "99"),
        ("constant_shift", "3", 13, "2"),
    ],
)
def test_each_kind_replaces_one_span_and_keeps_the_rest_of_the_file(
    kind: str, old: str, line: int, new: str
) -> None:
    edit = _one(kind, old, line)
    assert edit.new == new  # type: ignore[attr-defined]
    edited = edit.apply(SOURCE)  # type: ignore[attr-defined]
    before, after = SOURCE.splitlines(), edited.splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert changed == [line - 1]  # one line, comments and spacing of every other line kept
    assert "# keep me" in edited and "# a comment that must survive" in edited


def test_a_negated_not_loses_its_not() -> None:
    src = "def f(x):\n    if not (x == 3):\n        return 1\n    return 2\n"
    [edit] = [e for e in find_edits("m.py", src) if e.kind == "negate_condition"]
    assert (edit.old, edit.new) == ("not (x == 3)", "x == 3")


def test_drop_if_removes_whole_lines_never_an_elif_or_an_if_with_else() -> None:
    drops = [e for e in _edits() if e.kind == "drop_if"]
    assert [(e.line, e.function) for e in drops] == [(21, "Box.get")]
    edited = drops[0].apply(SOURCE)
    assert "if items is None" not in edited and "return []" not in edited
    ast.parse(edited)


def test_only_function_bodies_are_edited_and_every_edit_changes_the_tree() -> None:
    edits = _edits()
    assert {e.kind for e in edits} == set(EDIT_KINDS)
    assert all(e.line >= 6 for e in edits)  # not LIMIT = 10, not the default hi=LIMIT
    assert not any(e.kind == "constant_shift" and e.old == "0" and e.line == 5 for e in edits)
    before = ast.dump(ast.parse(SOURCE))
    assert all(ast.dump(ast.parse(e.apply(SOURCE))) != before for e in edits)
    assert {e.function for e in edits} == {"clamp", "Box.get"}


def test_a_file_that_does_not_parse_gives_no_edits() -> None:
    assert find_edits("bad.py", "def f(:\n") == []


def test_non_ascii_text_before_a_span_keeps_offsets_right() -> None:
    src = "def f(x):\n    s = 'é—ü'; return x < 1\n"
    [edit] = [e for e in find_edits("m.py", src) if e.kind == "flip_comparison"]
    assert edit.apply(src) == "def f(x):\n    s = 'é—ü'; return x <= 1\n"


def test_the_order_is_the_seeds_and_gives_every_kind_a_turn() -> None:
    edits = _edits()
    first = order(edits, seed=3, limit=len(EDIT_KINDS))
    assert sorted(e.kind for e in first) == sorted(EDIT_KINDS)
    assert order(edits, 3, 12) == order(edits, 3, 12)
    assert order(edits, 3, 12) != order(edits, 4, 12)


def test_the_reference_fix_is_a_reverse_diff_that_applies() -> None:
    edit = _one("flip_operator", "+", 11)
    buggy = edit.apply(SOURCE)  # type: ignore[attr-defined]
    patch = reverse_diff("pkg/mod.py", buggy, SOURCE)
    assert patch.count("\n-") == 2 and patch.count("\n+") == 2  # the headers and the fix
    assert apply_patch({"pkg/mod.py": buggy}, patch) == {"pkg/mod.py": SOURCE}


def test_snapshots_are_byte_identical_whatever_the_order_of_files() -> None:
    a = deterministic_tarball({"b.py": b"2", "a/x.py": b"1"})
    assert a == deterministic_tarball({"a/x.py": b"1", "b.py": b"2"})
    with tarfile.open(fileobj=io.BytesIO(a)) as tar:
        assert [(m.name, m.mtime) for m in tar.getmembers()] == [("a/x.py", 0), ("b.py", 0)]


def test_the_problem_statement_names_the_tests_never_the_fix() -> None:
    pkg = sdist.Sdist("tinycalc", "0.1", "0" * 64, {})
    text = problem_statement(
        pkg,
        ["tests/test_calc.py::test_add"],
        {"tests/test_calc.py::test_add": "E   assert <Obj at 0x7f00deadbeef> == 5"},
    )
    assert "tests/test_calc.py::test_add" in text and "assert <Obj at 0x...> == 5" in text
    assert "calc.py`" not in text.replace("test_calc.py", "")


def _sdist(tmp_path: Path, members: dict[str, bytes], name: str = "tiny-0.1.tar.gz") -> Path:
    path = tmp_path / name
    with tarfile.open(path, "w:gz") as tar:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_local_sdist_unpacks_without_its_top_directory_and_records_its_sha256(
    tmp_path: Path,
) -> None:
    path = _sdist(tmp_path, {"tiny-0.1/tiny.py": b"x = 1\n", "tiny-0.1/tests/t.py": b""})
    got = sdist.load(str(path), tmp_path / "cache")
    assert (got.name, got.version) == ("tiny", "0.1")
    assert got.files == {"tests/t.py": b"", "tiny.py": b"x = 1\n"}
    assert got.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(sdist.SdistError, match="is not the pinned"):
        sdist.load(str(path), tmp_path / "cache", sha256="0" * 64)


def test_an_sdist_member_outside_its_directory_is_refused(tmp_path: Path) -> None:
    path = _sdist(tmp_path, {"tiny-0.1/../../evil.py": b""})
    with pytest.raises(sdist.SdistError, match="outside the sdist"):
        sdist.load(str(path), tmp_path)


def test_a_pin_is_read_from_the_cache_under_any_spelling_of_its_name(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    _sdist(cache, {"My_Pkg-1.0/m.py": b""}, name="My_Pkg-1.0.tar.gz")
    assert sdist.fetch("my-pkg==1.0", cache).name == "My_Pkg-1.0.tar.gz"
    with pytest.raises(sdist.SdistError, match="name==version"):
        sdist.fetch("my-pkg", cache)


def test_an_sdist_pip_saved_counts_though_pip_then_failed_on_its_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"

    def pip(cmd: list[str], **_: object) -> object:
        _sdist(cache, {"tiny-0.2/m.py": b""}, name="tiny-0.2.tar.gz")  # saved, then it fails
        return type("Done", (), {"returncode": 1, "stderr": "InvalidRequirement"})()

    monkeypatch.setattr(sdist.subprocess, "run", pip)
    monkeypatch.setattr(sdist, "_pip", lambda: ["pip"])
    assert sdist.fetch("tiny==0.2", cache).name == "tiny-0.2.tar.gz"
    with pytest.raises(sdist.SdistError, match=r"pip download tiny==0\.3: InvalidRequirement"):
        sdist.fetch("tiny==0.3", cache)


def test_order_checks_only_the_edits_it_takes_and_skips_those_refused() -> None:
    edits = find_edits("pkg/mod.py", SOURCE, check=False)
    checked = []

    def usable(edit: object) -> bool:
        checked.append(edit)
        return len(checked) % 3 != 0  # every third one does not change the code

    taken = order(edits, seed=0, limit=4, usable=usable)
    assert len(taken) == 4 and len(checked) <= 6
    assert all(checked.index(e) % 3 != 2 for e in taken)


def test_unchecked_edits_are_a_superset_that_the_check_filters() -> None:
    assert set(find_edits("pkg/mod.py", SOURCE)) <= set(find_edits("pkg/mod.py", SOURCE, False))


def test_the_held_back_share_is_the_seeds_and_leaves_a_failing_test() -> None:
    broke, passing = ["t::a", "t::b"], [f"t::p{i}" for i in range(10)]
    config = MineConfig(seed=3, held_back=0.5)
    held = held_back("pkg.x.1", broke, passing, config)
    assert held == held_back("pkg.x.1", broke, passing, config) == sorted(held)
    assert len(set(held) & set(broke)) == 1 and len(set(held) & set(passing)) == 5
    assert held != held_back("pkg.x.2", broke, passing, config)
    assert held_back("pkg.x.1", ["t::a"], passing, config)[0] != "t::a"


def test_pip_downloads_the_package_from_source_and_its_build_backend_as_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, seen = tmp_path / "cache", []

    def pip(cmd: list[str], **_: object) -> object:
        seen.append(cmd)
        _sdist(cache, {"tiny-0.2/m.py": b""}, name="tiny-0.2.tar.gz")
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(sdist.subprocess, "run", pip)
    monkeypatch.setattr(sdist, "_pip", lambda: ["pip"])
    sdist.fetch("tiny==0.2", cache)
    [cmd] = seen
    assert cmd[cmd.index("--no-binary") + 1] == "tiny" and ":all:" not in cmd


def test_an_edits_run_collects_only_the_files_of_its_tests() -> None:
    from gagar.rollout.envs.mine.suite import Suite

    class Session:
        def __init__(self) -> None:
            self.commands: list[str] = []

        def write_file(self, path: str, data: bytes) -> None:
            pass

        def exec(self, cmd: str, timeout: float) -> object:
            self.commands.append(cmd)
            done = {"duration_s": 0.0, "cpu_time_s": 0.0, "timed_out": False, "limit_hit": None}
            return type("Result", (), done)()

        def read_file(self, path: str) -> bytes:
            return b'{"outcomes": {}, "messages": {}, "lines": {}, "collect_errors": 0}'

        def delete_file(self, path: str) -> None:
            pass

    session = Session()
    suite = Suite(session, "python -m pytest", 10.0)  # type: ignore[arg-type]
    select = ["tests/test_b.py::t[1]", "tests/test_a.py::t", "tests/test_b.py::u"]
    suite.run(select=select)
    assert session.commands[-1].endswith(" tests/test_a.py tests/test_b.py")
