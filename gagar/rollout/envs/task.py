"""The task format: one code-repair problem, compatible with SWE-style datasets, loaded from JSONL.

A row names the repository snapshot (inline ``files``, or ``snapshot``: a directory or ``.tar.gz``
path relative to the JSONL file), the problem statement, the ``FAIL_TO_PASS`` and ``PASS_TO_PASS``
test ids (pytest node ids; lists, or JSON strings of lists as SWE-bench ships them), the pristine
``test_files`` written over the candidate's before verification and the ``test_command`` (a pytest
invocation). SWE-bench bookkeeping keys (``base_commit``, ``version``, ...) are kept in
``metadata``, the task's container image (``image``, ``image_name``, ``environment_image``) too:
every task runs in ``spec.sandbox.image`` (per-task sandbox images are not implemented, so the
image is information, not a setting). A ``test_patch`` (SWE-bench's diff of the tests) is applied
to the snapshot when the task is loaded, strictly (``patches.apply_patch``), and the files it
changes or creates join ``test_files``, which verification writes before the tests run. Any other
unknown key is an error, so a misspelt field never silently disappears.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gagar.rollout.envs.patches import PatchError, apply_patch

SWE_METADATA_KEYS = frozenset(
    {
        "base_commit",
        "environment_setup_commit",
        "version",
        "created_at",
        "hints_text",
        "repo_url",
        "difficulty",
        # the task's own container image: informative only, every task runs in spec.sandbox.image
        "image",
        "image_name",
        "environment_image",
    }
)
DEFAULT_TEST_COMMAND = "python -m pytest -q -p no:cacheprovider"
# For families whose tests need no pytest plugins: skipping the entry-point scan of a large
# site-packages saves seconds per run.
PLAIN_PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider"


class TaskError(ValueError):
    """A task file or row that cannot be used, with where and why."""


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    instance_id: str = Field(min_length=1, description="Unique id, e.g. 'django__django-11099'.")
    repo: str = Field(default="", description="Repository name (informative, as in SWE-bench).")
    family: str = Field(default="custom", description="Task family: synthetic, humaneval, ...")
    problem_statement: str = Field(min_length=1)
    files: dict[str, str] | None = Field(default=None, description="Repository snapshot, inline.")
    snapshot: str | None = Field(
        default=None, description="Repository snapshot: a directory or .tar.gz path."
    )
    fail_to_pass: list[str] = Field(
        validation_alias=AliasChoices("FAIL_TO_PASS", "fail_to_pass"), min_length=1
    )
    pass_to_pass: list[str] = Field(
        default_factory=list, validation_alias=AliasChoices("PASS_TO_PASS", "pass_to_pass")
    )
    test_files: dict[str, str] = Field(
        default_factory=dict, description="Pristine test files, written before verification."
    )
    test_command: str = Field(default=DEFAULT_TEST_COMMAND, description="A pytest invocation.")
    reference_files: dict[str, str] | None = Field(
        default=None, description="The reference fix, as whole files (synthetic families)."
    )
    patch: str | None = Field(default=None, description="The reference fix as a diff (SWE).")
    test_patch: str | None = Field(
        default=None,
        description="SWE-bench's test diff, applied to the snapshot into test_files on load.",
    )
    metadata: dict[str, Any] = Field(default_factory=dict)

    def content_key(self) -> str:
        """A digest of what an agent sees and is scored on (repository, tests, the tests that
        must pass), not of the id: two tasks with the same key are the same task, whatever their
        names (the synthetic generator draws from a finite space and repeats one now and then)."""
        body = [self.files, self.snapshot, self.test_files, self.fail_to_pass, self.pass_to_pass]
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    @field_validator("fail_to_pass", "pass_to_pass", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        """SWE-bench stores test lists as JSON strings: accept both forms."""
        if isinstance(v, str):
            try:
                return json.loads(v)
            except json.JSONDecodeError as e:
                raise ValueError(f"not a JSON list of test ids: {e}") from None
        return v

    @model_validator(mode="before")
    @classmethod
    def _apply_test_patch(cls, data: Any) -> Any:
        """``test_patch`` applied to the snapshot: the files it writes join ``test_files``."""
        if not isinstance(data, dict) or not data.get("test_patch"):
            return data
        if data.get("files") is not None:
            base = dict(data["files"])
        elif data.get("snapshot"):
            raw = _read_snapshot(Path(data["snapshot"]))
            base = {k: v.decode() for k, v in raw.items() if _is_text(v)}
        else:
            return data  # the snapshot check names what is missing
        try:
            patched = apply_patch(base, data["test_patch"])
        except PatchError as err:
            raise ValueError(f"test_patch: {err}") from None
        given = dict(data.get("test_files") or {})
        clash = sorted(p for p in patched if p in given and given[p] != patched[p])
        if clash:
            raise ValueError(f"test_patch and test_files give different contents for {clash}")
        return {**data, "test_files": {**given, **patched}}

    @field_validator("files", "test_files", "reference_files")
    @classmethod
    def _relative_paths(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for path in v or {}:
            if path.startswith("/") or ".." in Path(path).parts or not path:
                raise ValueError(f"file path {path!r} must be relative and stay in the repository")
        return v

    def model_post_init(self, _context: Any) -> None:
        if (self.files is None) == (self.snapshot is None):
            raise ValueError("give exactly one of 'files' (inline) or 'snapshot' (a path)")

    @property
    def test_ids(self) -> list[str]:
        return [*self.fail_to_pass, *self.pass_to_pass]

    def repo_files(self) -> dict[str, bytes]:
        """The repository snapshot as a files mapping (reads ``snapshot`` from disk)."""
        if self.files is not None:
            return {k: v.encode() for k, v in self.files.items()}
        return _read_snapshot(Path(self.snapshot or ""))

    def fixed_files(self) -> dict[str, bytes]:
        """The repository with the reference fix applied (needs ``reference_files``)."""
        if self.reference_files is None:
            raise TaskError(f"{self.instance_id}: no reference_files")
        return {**self.repo_files(), **{k: v.encode() for k, v in self.reference_files.items()}}


def _is_text(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _read_snapshot(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {
            str(p.relative_to(path)): p.read_bytes()
            for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink() and ".git" not in p.relative_to(path).parts
        }
    if path.is_file():
        with tarfile.open(path, "r:*") as tar:
            return {
                m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers()
                if m.isfile() and not m.name.startswith("/") and ".." not in Path(m.name).parts
            }
    raise TaskError(f"snapshot {path} does not exist")


def parse_task(raw: dict[str, Any], base_dir: Path | None = None) -> Task:
    """One row: SWE-bench bookkeeping keys go to ``metadata``; relative snapshots are resolved."""
    row = dict(raw)
    meta = {k: row.pop(k) for k in list(row) if k in SWE_METADATA_KEYS}
    row["metadata"] = {**row.get("metadata", {}), **meta}
    if base_dir is not None and isinstance(row.get("snapshot"), str):
        row["snapshot"] = str((base_dir / row["snapshot"]).resolve())
    return Task.model_validate(row)


def load_tasks(path: str | Path) -> list[Task]:
    """All tasks of a JSONL file; any bad row raises ``TaskError`` naming the line and field."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such file")
    tasks, seen = [], set()
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        tasks.append(_parse_line(path, lineno, line))
        if tasks[-1].instance_id in seen:
            raise TaskError(f"{path}:{lineno}: duplicate instance_id {tasks[-1].instance_id!r}")
        seen.add(tasks[-1].instance_id)
    if not tasks:
        raise TaskError(f"{path}: no tasks")
    return tasks


def _parse_line(path: Path, lineno: int, line: str) -> Task:
    where = f"{path}:{lineno}"
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as e:
        raise TaskError(f"{where}: not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise TaskError(f"{where}: a task must be a JSON object")
    try:
        return parse_task(raw, path.parent)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'task'}: {err['msg']}" for err in e.errors()
        )
        raise TaskError(f"{where}: {problems}") from None


def dump_tasks(tasks: list[Task], path: str | Path) -> None:
    lines = [t.model_dump_json(by_alias=False, exclude_none=True) for t in tasks]
    Path(path).write_text("\n".join(lines) + "\n")
