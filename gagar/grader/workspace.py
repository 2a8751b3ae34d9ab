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
    test_logs/cand_N.log    member N's hidden-test log (its code's output, nothing of gagar's)
    notes/cand_N.md         gagar's own notes on member N: verification's, the tamper screen's

Candidate text never passes for gagar's or for the workspace's structure: a fence around it is
longer than any run of backticks inside (``fenced``), names and tool names are shown escaped on
one line, and gagar's notes live in ``notes/`` (and ``index.json``), never in the test log the
candidate's code wrote.

Everything the grader needs is in the files, so ordinary tools (``diff -r``, ``grep -r``) work
and ``gagar grade DIR`` can grade a directory someone laid out by hand.

Reading a directory back is bounded like every host-side read of candidate content
(``gagar.grader.bounds``): the walk stops past the file count, links and anything but a regular
file are never followed or opened for reading (``O_NOFOLLOW | O_NONBLOCK``, a FIFO cannot block
it), at most ``file_bytes`` of a file are read (a larger one is hashed in chunks and kept as a
marker), and the task statement, patches, logs and trajectories are read up to ``EVIDENCE_BYTES``.
What was left out is reported in ``GradingGroup.skipped``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from gagar.grader.bounds import BOUNDS, HASH_BYTES, Bounds, Oversize, admit_read
from gagar.grader.checks import is_protected
from gagar.grader.diffs import diff_repos, unified_patch
from gagar.wire import (
    Action,
    Candidate,
    Finding,
    GradingGroup,
    Skipped,
    SkipReason,
    ToolStats,
    check_relative_path,
)

OBSERVATION_CHARS = 2000  # per observation in the readable trajectory; the JSON keeps all of it
SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache"}
EVIDENCE_BYTES = 8 << 20  # task.md, one patch, one test log, one trajectory
WALK_FACTOR = 4
MAX_CHANGE_ROWS = 8  # changed files named per member in the README; the rest are counted
CUT_NOTE = "\n... [cut: "  # starts the note ending evidence cut at EVIDENCE_BYTES


def cand_dir(member: int) -> str:
    return f"cand_{member}"


def write_tree(root: Path, files: dict[str, str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        path = root / check_relative_path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def fenced(text: str, info: str = "") -> str:
    """``text`` in a markdown code fence longer than any backtick run inside it, so nothing in it
    can close the fence and start markdown of its own (headings, notes)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}\n"


def one_line(text: str, limit: int = 200) -> str:
    """A name fit for a heading or a list item: a plain identifier as it is, anything else
    escaped and quoted (no newline, no markup), bounded."""
    if len(text) <= limit and re.fullmatch(r"[A-Za-z0-9_./-]+", text):
        return text
    return json.dumps(text[:limit], ensure_ascii=False)


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
        out.append(
            f"## {i}. {one_line(act.tool, 100)}{flag}\n\narguments:\n\n{fenced(args, 'json')}\n"
            f"observation:\n\n{fenced(obs)}"
        )
    return "\n".join(out)


def render_notes(member: int, notes: list[str], screened: list[Finding]) -> str:
    """gagar's notes on one member: verification's notes and the tamper screen's findings (what
    they quote of the candidate, a file name, is fenced or escaped)."""
    out = [f"# gagar's notes on {cand_dir(member)}\n"]
    out.append("Written by gagar, not by the candidate.\n\n## Tamper screen\n")
    out += [
        f"- {f.kind}: {one_line(f.file or '')} line {f.line}: {one_line(f.reason, 300)}"
        for f in screened
    ] or ["- nothing found"]
    out.append("\n## Verification\n")
    out += [fenced(n) for n in notes] or ["- no notes"]
    return "\n".join(out) + "\n"


def _changes(group: GradingGroup, screened: dict[int, list[Finding]]) -> list[str]:
    """The README's table of what each member changed (from its files, not its patch's words):
    each changed file with its added and removed lines, how many files lie outside the relevant
    ones, how many are tests or harness, and the tamper screen's findings. Evidence for a grader
    that answers from the index alone (a small SFT'd model), a map for one that reads on."""
    relevant = set(group.relevant_files)
    rows = [
        "| member | changed files (+added -removed lines) | outside relevant | tests/harness "
        "| tamper findings |",
        "|---|---|---|---|---|",
    ]
    for c in group.candidates:
        diffs = diff_repos(group.base_files, c.files)
        files = ", ".join(
            f"{one_line(d.path, 80).replace('|', '%7C')} (+{len(d.added)} -{len(d.removed)})"
            for d in diffs[:MAX_CHANGE_ROWS]
        )
        if len(diffs) > MAX_CHANGE_ROWS:
            files += f", ... {len(diffs) - MAX_CHANGE_ROWS} more"
        outside = sum(d.path not in relevant for d in diffs) if relevant else "?"
        tests = sum(is_protected(d.path, group.protected_files) for d in diffs)
        findings = len(screened.get(c.member, []))
        rows.append(
            f"| {cand_dir(c.member)} | {files or '(none)'} | {outside} | {tests} | {findings} |"
        )
    return rows


def readme(group: GradingGroup, screened: dict[int, list[Finding]] | None = None) -> str:
    """The workspace's ``README.md``: the index a grader opens with (what ``write_workspace``
    writes; the grader's SFT data builds its prompts from it without writing the workspace)."""
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
        "hidden-test log `test_logs/cand_N.log` (its code's output). gagar's own notes on member N\n"
        "(verification, tamper screen) are `notes/cand_N.md`, nowhere else.\n"
        "Compare with `diff -ru base cand_0`, `grep -rn`.\n\n"
        f"Test command (run inside `cand_N/`): `{group.test_command}`\n\n"
        f"Relevant files: {', '.join(group.relevant_files) or '(not given)'}\n\n"
        + "\n".join(rows)
        + "\n\nChanges (each member's files against `base/`):\n\n"
        + "\n".join(_changes(group, screened or {}))
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
                "notes": c.notes,
            }
            for c in group.candidates
        ],
    }


def write_workspace(
    group: GradingGroup, root: Path, screened: dict[int, list[Finding]] | None = None
) -> Path:
    """Lay ``group`` out under ``root`` (created; must be empty or absent), with the tamper
    screen's findings per member where given. Returns ``root``."""
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"workspace directory is not empty: {root}")
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.md").write_text(group.statement, encoding="utf-8")
    write_tree(root / "base", group.base_files)
    for sub in ("patches", "trajectories", "test_logs", "notes"):
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
        notes = render_notes(c.member, c.notes, (screened or {}).get(c.member, []))
        (root / "notes" / f"{name}.md").write_text(notes, encoding="utf-8")
    (root / "index.json").write_text(json.dumps(_index(group), indent=2), encoding="utf-8")
    (root / "README.md").write_text(readme(group, screened), encoding="utf-8")
    return root


def walk(root: Path, limit: int) -> Iterator[str]:
    """Relative paths of the entries under ``root`` that are not directories (links included,
    never followed), caches skipped, sorted per directory; at most ``limit + 1`` of them."""
    seen = 0
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        rel = Path(top).relative_to(root)
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        for name in sorted(names + links):
            yield (rel / name).as_posix()
            seen += 1
            if seen > limit:
                return


def read_bytes(path: Path, limit: int) -> bytes | Oversize:
    """A regular file's bytes (links not followed, FIFOs not waited on), or past ``limit`` its
    size and digest (read in chunks); ``OSError`` for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(f"not a regular file: {path.name}")
        data = fh.read(limit + 1)
        if len(data) <= limit:
            return data
        sha, size = hashlib.sha256(data), len(data)
        while size < HASH_BYTES and (chunk := fh.read(min(1 << 20, HASH_BYTES - size))):
            sha.update(chunk)
            size += len(chunk)
        return Oversize(os.fstat(fh.fileno()).st_size, sha.hexdigest())


def read_tree(
    root: Path, member: int | None = None, bounds: Bounds = BOUNDS
) -> tuple[dict[str, str], list[Skipped]]:
    """Text files under ``root`` as relative path -> text, within ``bounds``, and what was left
    out (caches are not part of a repository and are not reported). The walk itself stops after
    ``WALK_FACTOR`` entries per admitted file: links and FIFOs count too."""
    limit = bounds.files * WALK_FACTOR
    paths = list(walk(root, limit)) if root.is_dir() else []
    files, skipped = admit_read(
        paths[:limit], lambda rel: read_bytes(root / rel, bounds.file_bytes), member, (), bounds
    )
    if len(paths) > limit:
        why = f"walk stopped after {limit} entries"
        skipped.append(
            Skipped(member=member, path=paths[limit], reason="too_many_files", detail=why)
        )
    return files, skipped


def _read_opt(path: Path, limit: int = EVIDENCE_BYTES) -> str:
    """A piece of evidence's text ("" when absent), cut at ``limit`` bytes with a note."""
    try:
        data = read_bytes(path, limit)
    except FileNotFoundError:
        return ""
    except OSError as err:  # a link, a FIFO, a directory where a file belongs
        return f"[not read: {err}]"
    if isinstance(data, Oversize):
        with path.open("rb") as fh:
            head = fh.read(limit)
        cut = f"{CUT_NOTE}{data.size} bytes, the grader reads {limit}]\n"
        return head.decode("utf-8", "replace") + cut
    return data.decode("utf-8", "replace")


def _trajectory(root: Path, name: str) -> tuple[list, list[Skipped]]:
    path = root / "trajectories" / f"{name}.json"
    text = _read_opt(path)
    try:
        return (json.loads(text) if text else []), []
    except json.JSONDecodeError as err:  # cut, or not JSON: the trajectory is left out, said so
        reason: SkipReason = "file_too_large" if CUT_NOTE in text[-200:] else "unreadable"
        why = f"trajectory not read: {err}"[:200]
        return [], [Skipped(path=f"trajectories/{name}.json", reason=reason, detail=why)]


def _load_candidate(root: Path, entry: dict) -> tuple[Candidate, list[Skipped]]:
    name = cand_dir(entry["member"])
    files, skipped = read_tree(root / name, entry["member"])
    traj, left_out = _trajectory(root, name)
    candidate = Candidate(
        member=entry["member"],
        passed=entry["passed"],
        valid=entry.get("valid", True),
        files=files,
        patch=_read_opt(root / "patches" / f"{name}.diff"),
        trajectory=traj,
        test_log=_read_opt(root / "test_logs" / f"{name}.log"),
        notes=entry.get("notes", []),
        stats=entry.get("stats"),
    )
    return candidate, skipped + [s.model_copy(update={"member": entry["member"]}) for s in left_out]


def load_workspace(root: Path) -> GradingGroup:
    """Read a workspace laid out by ``write_workspace`` (or by hand, same layout) back into a group."""
    root = Path(root)
    index_path = root / "index.json"
    if not index_path.is_file():
        raise FileNotFoundError(f"{root} is not a grading workspace: index.json is missing")
    data = read_bytes(index_path, EVIDENCE_BYTES)
    if isinstance(data, Oversize):
        raise ValueError(f"{index_path}: {data.size} bytes, past the {EVIDENCE_BYTES} read")
    index = json.loads(data)
    try:
        return _group_from_index(root, index)
    except (KeyError, TypeError) as err:
        raise ValueError(f"{index_path}: missing or malformed field {err}") from None


def _group_from_index(root: Path, index: dict) -> GradingGroup:
    base, skipped = read_tree(root / "base")
    candidates = []
    for entry in index["candidates"]:
        candidate, left_out = _load_candidate(root, entry)
        candidates.append(candidate)
        skipped += left_out
    return GradingGroup(
        task_id=index["task_id"],
        statement=_read_opt(root / "task.md"),
        base_files=base,
        candidates=candidates,
        relevant_files=index.get("relevant_files", []),
        protected_files=index.get("protected_files", []),
        test_command=index.get("test_command", "python -m pytest -q"),
        skipped=skipped,
    )


def load_group(path: Path) -> GradingGroup:
    """A group from a JSON file, or from a directory in the workspace layout."""
    path = Path(path)
    if path.is_file():
        return GradingGroup.model_validate_json(path.read_text(encoding="utf-8"))
    if path.is_dir():
        return load_workspace(path)
    raise FileNotFoundError(f"no such group file or workspace directory: {path}")
