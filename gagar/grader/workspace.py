"""The shared workspace: one group laid out on disk so an agent can compare candidates jointly.

Layout (``cand_N`` is member N)::

    README.md               index: task, members, outcomes, stats, how to compare
    index.json              the same, machine-readable (``load_workspace`` reads it back)
    task.md                 the task statement
    base/                   the base repository
    cand_N/                 member N's final repository      (diff -r base cand_N)
    patches/cand_N.diff     member N's unified patch against base
    trajectories/cand_N.md  member N's actions and observations, readable
    trajectories/cand_N.json  the same, exact
    test_logs/cand_N.log    member N's hidden-test log

Everything the grader needs is in the files, so ordinary tools (``diff -r``, ``grep -r``) work
and ``gagar grade DIR`` can grade a directory someone laid out by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from gagar.grader.diffs import unified_patch
from gagar.wire import Action, Candidate, GradingGroup, ToolStats, check_relative_path

OBSERVATION_CHARS = 2000  # per observation in the readable trajectory; the JSON keeps all of it
SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache"}


def cand_dir(member: int) -> str:
    return f"cand_{member}"


def write_tree(root: Path, files: dict[str, str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        path = root / check_relative_path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def render_trajectory(actions: list[Action]) -> str:
    """Markdown rendering of a trajectory: one section per action, long observations cut."""
    out = [f"# Trajectory ({len(actions)} actions)\n"]
    for i, act in enumerate(actions):
        args = json.dumps(act.arguments, ensure_ascii=False, sort_keys=True)
        obs = act.observation
        if len(obs) > OBSERVATION_CHARS:
            obs = (
                obs[:OBSERVATION_CHARS]
                + f"\n... [{len(act.observation) - OBSERVATION_CHARS} more chars]"
            )
        flag = " (ERROR)" if act.error else ""
        out.append(f"## {i}. {act.tool}{flag}\n\narguments: `{args}`\n\n```\n{obs}\n```\n")
    return "\n".join(out)


def _readme(group: GradingGroup) -> str:
    rows = [
        "| member | passed | valid | actions | redundant | errors | churn |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in group.candidates:
        s = c.stats or ToolStats()
        rows.append(
            f"| {cand_dir(c.member)} | {c.passed} | {c.valid} | {s.actions} | {s.redundant} | {s.errors} | {s.churn} |"
        )
    return (
        f"# Grading workspace: {group.task_id}\n\n"
        "Task statement: `task.md`. Base repository: `base/`. Member N's final repository is\n"
        "`cand_N/`, its patch `patches/cand_N.diff`, its trajectory `trajectories/cand_N.md`, its\n"
        "hidden-test log `test_logs/cand_N.log`. Compare with `diff -ru base cand_0`, `grep -rn`.\n\n"
        f"Test command (run inside `cand_N/`): `{group.test_command}`\n\n"
        f"Relevant files: {', '.join(group.relevant_files) or '(not given)'}\n\n"
        + "\n".join(rows)
        + "\n"
    )


def _index(group: GradingGroup) -> dict:
    return {
        "task_id": group.task_id,
        "relevant_files": group.relevant_files,
        "protected_files": group.protected_files,
        "test_command": group.test_command,
        "candidates": [
            {
                "member": c.member,
                "dir": cand_dir(c.member),
                "passed": c.passed,
                "valid": c.valid,
                "stats": c.stats.model_dump() if c.stats else None,
            }
            for c in group.candidates
        ],
    }


def write_workspace(group: GradingGroup, root: Path) -> Path:
    """Lay ``group`` out under ``root`` (created; must be empty or absent). Returns ``root``."""
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"workspace directory is not empty: {root}")
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.md").write_text(group.statement, encoding="utf-8")
    write_tree(root / "base", group.base_files)
    for sub in ("patches", "trajectories", "test_logs"):
        (root / sub).mkdir()
    for c in group.candidates:
        name = cand_dir(c.member)
        write_tree(root / name, c.files)
        patch = c.patch or unified_patch(group.base_files, c.files)
        (root / "patches" / f"{name}.diff").write_text(patch, encoding="utf-8")
        (root / "trajectories" / f"{name}.md").write_text(
            render_trajectory(c.trajectory), encoding="utf-8"
        )
        traj = [a.model_dump() for a in c.trajectory]
        (root / "trajectories" / f"{name}.json").write_text(
            json.dumps(traj, indent=1), encoding="utf-8"
        )
        (root / "test_logs" / f"{name}.log").write_text(c.test_log, encoding="utf-8")
    (root / "index.json").write_text(json.dumps(_index(group), indent=2), encoding="utf-8")
    (root / "README.md").write_text(_readme(group), encoding="utf-8")
    return root


def read_tree(root: Path) -> dict[str, str]:
    """Text files under ``root`` as relative path -> text (caches and binary files skipped)."""
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or path.is_symlink() or SKIP_DIRS & set(rel.parts):
            continue
        try:
            files[rel.as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return files


def _read_opt(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _load_candidate(root: Path, entry: dict) -> Candidate:
    name = cand_dir(entry["member"])
    traj_path = root / "trajectories" / f"{name}.json"
    traj = json.loads(traj_path.read_text(encoding="utf-8")) if traj_path.is_file() else []
    return Candidate(
        member=entry["member"],
        passed=entry["passed"],
        valid=entry.get("valid", True),
        files=read_tree(root / name),
        patch=_read_opt(root / "patches" / f"{name}.diff"),
        trajectory=traj,
        test_log=_read_opt(root / "test_logs" / f"{name}.log"),
        stats=entry.get("stats"),
    )


def load_workspace(root: Path) -> GradingGroup:
    """Read a workspace laid out by ``write_workspace`` (or by hand, same layout) back into a group."""
    root = Path(root)
    index_path = root / "index.json"
    if not index_path.is_file():
        raise FileNotFoundError(f"{root} is not a grading workspace: index.json is missing")
    index = json.loads(index_path.read_text(encoding="utf-8"))
    try:
        return _group_from_index(root, index)
    except (KeyError, TypeError) as err:
        raise ValueError(f"{index_path}: missing or malformed field {err}") from None


def _group_from_index(root: Path, index: dict) -> GradingGroup:
    return GradingGroup(
        task_id=index["task_id"],
        statement=_read_opt(root / "task.md"),
        base_files=read_tree(root / "base"),
        candidates=[_load_candidate(root, e) for e in index["candidates"]],
        relevant_files=index.get("relevant_files", []),
        protected_files=index.get("protected_files", []),
        test_command=index.get("test_command", "python -m pytest -q"),
    )


def load_group(path: Path) -> GradingGroup:
    """A group from a JSON file, or from a directory in the workspace layout."""
    path = Path(path)
    if path.is_file():
        return GradingGroup.model_validate_json(path.read_text(encoding="utf-8"))
    if path.is_dir():
        return load_workspace(path)
    raise FileNotFoundError(f"no such group file or workspace directory: {path}")
