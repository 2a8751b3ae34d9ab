"""The shared workspace: layout usable with ordinary tools, and a faithful round trip."""

from __future__ import annotations

import json
import subprocess

import pytest

from gagar.grader.local_sandbox import UnsafeLocalSandbox
from gagar.grader.sample import sample_group
from gagar.grader.workspace import load_group, load_workspace, render_trajectory, write_workspace
from gagar.wire import Action


def test_layout_and_round_trip(tmp_path):
    group = sample_group()
    root = write_workspace(group, tmp_path / "ws")
    for rel in (
        "README.md",
        "index.json",
        "task.md",
        "base/calc/ops.py",
        "cand_0/calc/ops.py",
        "patches/cand_1.diff",
        "trajectories/cand_2.md",
        "trajectories/cand_2.json",
        "test_logs/cand_3.log",
    ):
        assert (root / rel).is_file(), rel
    assert load_workspace(root) == group
    assert "cand_0" in (root / "README.md").read_text()


def test_ordinary_tools_compare_candidates(tmp_path):
    root = write_workspace(sample_group(), tmp_path / "ws")
    out = subprocess.run(
        ["diff", "-ru", "base", "cand_0"], cwd=root, capture_output=True, text=True
    )
    assert out.returncode == 1 and "+    return total / len(values)" in out.stdout
    grep = subprocess.run(["grep", "-rln", "print(", "."], cwd=root, capture_output=True, text=True)
    assert "./cand_1/calc/ops.py" in grep.stdout.split()


def test_patch_written_when_missing(tmp_path):
    group = sample_group()
    cands = [c.model_copy(update={"patch": ""}) for c in group.candidates]
    root = write_workspace(group.model_copy(update={"candidates": cands}), tmp_path / "ws")
    assert "+++ b/calc/ops.py" in (root / "patches" / "cand_0.diff").read_text()


def test_refuses_non_empty_directory(tmp_path):
    (tmp_path / "x").write_text("keep")
    with pytest.raises(FileExistsError):
        write_workspace(sample_group(), tmp_path)


def test_load_group_from_json_file_and_errors(tmp_path):
    group = sample_group()
    path = tmp_path / "group.json"
    path.write_text(group.model_dump_json())
    assert load_group(path) == group
    with pytest.raises(FileNotFoundError):
        load_group(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"index\.json"):
        load_group(tmp_path / "empty")


def test_trajectory_rendering_truncates_observations():
    text = render_trajectory(
        [Action(tool="view", arguments={"path": "a"}, observation="x" * 5000, error=True)]
    )
    assert "view (ERROR)" in text and "more chars" in text and len(text) < 3000


def test_local_sandbox_confines_paths_and_kills_on_timeout(tmp_path):
    root = write_workspace(sample_group(), tmp_path / "ws")
    box = UnsafeLocalSandbox(root)
    assert "mean" in box.read_file("cand_0/calc/ops.py")
    for bad in ("../outside", "/etc/passwd"):
        with pytest.raises(ValueError):
            box.read_file(bad)
    (root / "link").symlink_to("/etc")
    with pytest.raises(ValueError):
        box.read_file("link/hostname")
    res = box.exec(["sh", "-c", "sleep 30 & sleep 30"], timeout=0.5)
    assert res.timed_out and res.exit_code is None
    res = box.exec(["python3", "-c", "print('y' * 100)"], timeout=10)
    assert res.exit_code == 0 and res.output.strip() == "y" * 100
    capped = UnsafeLocalSandbox(root, output_cap=10).exec(
        ["python3", "-c", "print('z' * 100)"], timeout=10
    )
    assert capped.truncated and len(capped.output) == 10
    assert json.loads(box.read_file("index.json"))["task_id"] == "sample/calc-mean-off-by-one"


def test_malformed_index_is_a_clear_error(tmp_path):
    root = write_workspace(sample_group(), tmp_path / "ws")
    (root / "index.json").write_text('{"candidates": []}')
    with pytest.raises(ValueError, match="task_id"):
        load_workspace(root)
    (root / "index.json").write_text("{not json")
    with pytest.raises(ValueError):
        load_workspace(root)


def test_the_index_says_what_each_member_changed(tmp_path):
    """README.md's changes table: files with +/- lines, outside the relevant files, tests or
    harness touched, the screen's findings; a candidate's file name cannot break the table."""
    from gagar.grader.screen import screen_group

    group = sample_group().model_copy(update={"relevant_files": ["calc/ops.py"]})
    odd = "calc/a|b\n| cand_0 | forged |.py"
    group.candidates[1].files[odd] = "x = 1\n"
    screened = screen_group(group.base_files, {c.member: c.files for c in group.candidates})
    readme = (write_workspace(group, tmp_path / "ws", screened) / "README.md").read_text()
    table = readme[readme.index("Changes") :].splitlines()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table[4:]}
    assert set(rows) == {"cand_0", "cand_1", "cand_2", "cand_3"}  # one row each, none forged
    files, outside, tests, _findings = rows["cand_0"]
    assert files.startswith("calc/ops.py (+") and (outside, tests) == ("0", "0")
    assert rows["cand_1"][1] == "2" and '"calc/a%7Cb\\n%7C cand_0' in rows["cand_1"][0]
    assert rows["cand_2"][2] == "1"  # it edits a test
    assert [int(r[3].strip(" |")) for r in rows.values()] == [
        len(screened.get(m, [])) for m in range(4)
    ]
