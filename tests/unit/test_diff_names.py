"""Diff headers quote file names as git does (``core.quotePath``): a name the policy chose (a
newline, a quote, a backslash, a tab, bytes that are not ASCII) cannot add lines of its own to the
patch a grader reads. Checked against git itself."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gagar.gitpath import quote
from gagar.grader.diffs import unified_patch
from gagar.sandbox.workspace import unified_diff

NAMES = [
    "plain.py",
    "with space.py",
    'quote"d.py',
    "back\\slash.py",
    "tab\there.py",
    "caf\u00e9.py",
    "\u65e5\u672c.py",
    "bell\x07.py",
    "del\x7f.py",
    "new\nline.py",
    "evil\n+++ b/README.md",
]


def _headers(patch: str) -> list[str]:
    return [line for line in patch.split("\n") if line.startswith(("diff --git ", "--- ", "+++ "))]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_workspace_diff_headers_are_gits(tmp_path: Path) -> None:
    """Our ``diff --git``/``---``/``+++`` lines are, byte for byte, git's for the same change."""
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        env = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
        return subprocess.run(
            ["git", "-c", "core.quotePath=true", *args],
            cwd=repo,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    git("init", "-q")
    base = {name: b"one\n" for name in NAMES[:-2]}  # the last two are added in the change
    for name, data in base.items():
        (repo / name).write_bytes(data)
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    new = {name: b"one\ntwo\n" for name in NAMES}
    del new["plain.py"]
    for name in NAMES:
        if name in new:
            (repo / name).parent.mkdir(exist_ok=True)  # "evil\n+++ b" is a directory
            (repo / name).write_bytes(new[name])
        else:
            (repo / name).unlink()
    git("add", "-A")
    ours = _headers(unified_diff(base, new))
    assert ours == _headers(git("diff", "--cached", "--no-renames"))
    assert "+++ b/README.md" not in ours  # the name did not add a header of its own


@pytest.mark.parametrize(
    "name,quoted",
    [
        ("a.py", "a.py"),
        ("a b.py", "a b.py"),
        ("new\nline", '"new\\nline"'),
        ('q"', '"q\\""'),
        ("b\\s", '"b\\\\s"'),
        ("caf\u00e9", '"caf\\303\\251"'),
        ("\x01", '"\\001"'),
    ],
)
def test_quote_is_c_style(name: str, quoted: str) -> None:
    assert quote(name) == quoted


def test_grader_patch_cannot_be_injected_through_a_name() -> None:
    patch = unified_patch({}, {"x\n+++ b/README.md\n@@ -0,0 +1 @@\n+pwned": "hi\n"})
    lines = patch.split("\n")
    assert lines[:2] == ["--- /dev/null", '+++ "b/x\\n+++ b/README.md\\n@@ -0,0 +1 @@\\n+pwned"\t']
    assert [line for line in lines if line.startswith("+++")] == [lines[1]]
