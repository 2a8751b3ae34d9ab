"""The task format: one code-repair problem, compatible with SWE-style datasets, loaded from JSONL.

A row names the repository snapshot (inline ``files``; ``snapshot``: a directory or ``.tar.gz``
path relative to the JSONL file; or, as SWE-bench rows do, ``repo`` and ``base_commit``, found in
a repository cache, ``repo_cache.py``), the problem statement, the ``FAIL_TO_PASS`` and ``PASS_TO_PASS``
test ids (pytest node ids; lists, or JSON strings of lists as SWE-bench ships them), the pristine
``test_files`` written over the candidate's before verification, the ``test_command`` (a pytest
invocation), the reference fix (``reference_files``, whole files, or ``patch``, a diff) and the
``environment`` its tests run in: a name of ``spec.sandbox.environments`` (the dataset source's
``environment`` where the row names none; neither: the sandbox's own Python), whose packages the
sessions of the task, the agent's and verification's alike, run with: on the local sandbox
backend a read-only virtual environment made once from the environment's lock, first on ``PATH``
(``gagar.sandbox.venvs``), on sandbox pods the executor pool of the environment's image
(``gagar.sandbox.routing``; docs/design.md). SWE-bench bookkeeping keys (``base_commit``,
``version``, ...) are kept in ``metadata``. A row's own container image (``image``, or
SWE-bench's and SWE-Gym's ``image_name``, ``environment_image``) is ``image``: on sandbox pods the
sessions of a task that names no environment run in an executor pool of that image, which the
operator makes on demand (``gagar.sandbox.routing``, docs/design.md); an environment, the row's
or its source's, wins over the image (it is what the run declared), and a backend without
containers (``local``) runs the task in its environment or the sandbox's own Python and says so
(``verify.placement``). A ``test_patch`` (SWE-bench's diff of the tests) is applied
to the snapshot when the task is loaded, strictly (``patches.apply_patch``), and the files it
changes or creates join ``test_files``, which verification writes before the tests run. Any other
unknown key is an error, so a misspelt field never silently disappears.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Collection
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

from gagar.rollout.envs import repo_cache
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
        # the row's own container image, also kept as ``Task.image``
        "image",
        "image_name",
        "environment_image",
    }
)
IMAGE_KEYS = ("image", "image_name", "environment_image")  # the first a row gives is its image
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
    held_back: list[str] = Field(
        default_factory=list,
        validation_alias=AliasChoices("HELD_BACK", "held_back"),
        description="Listed tests (of FAIL_TO_PASS or PASS_TO_PASS) kept out of training "
        "verification (``visible``): evaluation and grading labels run them, so a fix that "
        "passes the visible tests and breaks these overfit.",
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
    environment: str | None = Field(
        default=None,
        pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="The task environment its tests run in (a name of spec.sandbox.environments); "
        "unset: the dataset source's, else the sandbox's own Python.",
    )
    image: str | None = Field(
        default=None,
        max_length=255,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$",
        description="The task's own container image (SWE-bench's image_name): on sandbox pods "
        "its sessions run in an executor pool of that image, unless it names an environment.",
    )
    metadata: dict[str, Any] = Field(default_factory=dict)

    def content_key(self) -> str:
        """A digest of what an agent sees and is scored on (repository, tests, the tests that
        must pass), not of the id: two tasks with the same key are the same task, whatever their
        names (the synthetic generator draws from a finite space and repeats one now and then)."""
        body = [self.files, self.snapshot, self.test_files, self.fail_to_pass, self.pass_to_pass]
        if self.held_back:  # a task without held-back tests keeps the key it always had
            body.append(self.held_back)
        if self.environment:  # other packages, another task; none: the key it always had
            body.append(self.environment)
        elif self.image:  # its own image is its packages: another image, another task
            body.append({"image": self.image})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    @field_validator("fail_to_pass", "pass_to_pass", "held_back", mode="before")
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
            base = {k: v.decode() for k, v in raw.items() if is_text(v)}
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

    @model_validator(mode="after")
    def _one_snapshot(self) -> Task:
        if (self.files is None) == (self.snapshot is None):
            raise ValueError(
                "give exactly one of 'files' (inline), 'snapshot' (a path) or 'repo' with "
                "'base_commit' (found in the repository cache)"
            )
        return self

    @model_validator(mode="after")
    def _held_back_listed(self) -> Task:
        unlisted = sorted(set(self.held_back) - set(self.test_ids))
        if unlisted:
            raise ValueError(f"held_back: not in FAIL_TO_PASS or PASS_TO_PASS: {unlisted[:3]}")
        if not set(self.fail_to_pass) - set(self.held_back):
            raise ValueError("held_back: holds every FAIL_TO_PASS test; one must stay visible")
        return self

    @property
    def package(self) -> str:
        """The package the task comes from (a mined task's ``metadata.package``), else its
        repository: what the held-out split and the per-package rates group by."""
        return str(self.metadata.get("package", self.repo))

    @property
    def sandbox_image(self) -> str | None:
        """The image its sessions ask for: its own, unless it names an environment (the run
        declared that one; a SWE-bench image without gagar's executor cannot serve)."""
        return None if self.environment else self.image

    @property
    def test_ids(self) -> list[str]:
        """Every listed test, held-back ones included (evaluation's, grading labels')."""
        return [*self.fail_to_pass, *self.pass_to_pass]

    def visible(self) -> Task:
        """The task training verifies against: its held-back tests unlisted (``self`` when it
        holds none back)."""
        if not self.held_back:
            return self
        hidden = set(self.held_back)
        return self.model_copy(
            update={
                "fail_to_pass": [t for t in self.fail_to_pass if t not in hidden],
                "pass_to_pass": [t for t in self.pass_to_pass if t not in hidden],
                "held_back": [],
            }
        )

    def repo_files(self) -> dict[str, bytes]:
        """The repository snapshot as a files mapping (reads ``snapshot`` from disk)."""
        if self.files is not None:
            return {k: v.encode() for k, v in self.files.items()}
        return _read_snapshot(Path(self.snapshot or ""))

    def fixed_files(self) -> dict[str, bytes]:
        """The repository with the reference fix applied (``reference_files``, else ``patch``)."""
        if self.reference_files is not None:
            fixed = {k: v.encode() for k, v in self.reference_files.items()}
            return {**self.repo_files(), **fixed}
        if not self.patch:
            raise TaskError(f"{self.instance_id}: no reference fix (reference_files or patch)")
        files = self.repo_files()
        text = {k: v.decode() for k, v in files.items() if is_text(v)}
        try:
            patched = apply_patch(text, self.patch)
        except PatchError as err:
            raise TaskError(f"{self.instance_id}: patch: {err}") from None
        # apply_patch returns only the files the patch writes: the others stay as they are
        return {**files, **{k: v.encode() for k, v in patched.items()}}


def is_text(data: bytes) -> bool:
    """Whether ``data`` decodes as UTF-8 (a text file a task's repository can hold as ``str``)."""
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _read_snapshot(path: Path) -> dict[str, bytes]:
    if repo_cache.is_git_ref(str(path)):
        return repo_cache.read_git(str(path))
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


def parse_task(
    raw: dict[str, Any], base_dir: Path | None = None, cache: Path | None = None
) -> Task:
    """One row: SWE-bench bookkeeping keys go to ``metadata`` (its image to ``image`` too); relative snapshots are resolved; a
    row with ``repo`` and ``base_commit`` but no files gets its snapshot from the repository
    ``cache`` (``TaskError`` when there is none or the repository is not in it)."""
    row = dict(raw)
    meta = {k: row.pop(k) for k in list(row) if k in SWE_METADATA_KEYS}
    row["metadata"] = {**row.get("metadata", {}), **meta}
    if image := next((meta[k] for k in IMAGE_KEYS if meta.get(k)), None):
        row["image"] = image
    if base_dir is not None and isinstance(row.get("snapshot"), str):
        row["snapshot"] = str((base_dir / row["snapshot"]).resolve())
    if row.get("files") is None and row.get("snapshot") is None and meta.get("base_commit"):
        row["snapshot"] = _cached_snapshot(row.get("repo"), meta["base_commit"], cache)
    return Task.model_validate(row)


def _cached_snapshot(repo: Any, commit: Any, cache: Path | None) -> str:
    if not isinstance(repo, str) or not repo or not isinstance(commit, str):
        raise TaskError("repo: a row with base_commit and no files needs 'repo' (owner/name)")
    if cache is None:
        raise TaskError(
            f"base_commit: {repo}@{commit[:12]} needs a repository cache (the dataset "
            "source's repoCache), or give 'files' or 'snapshot'"
        )
    try:
        return repo_cache.resolve(repo, commit, cache)
    except repo_cache.RepoCacheError as err:
        raise TaskError(f"base_commit: {err}") from None


def load_tasks(
    path: str | Path, cache: str | Path | None = None, environments: Collection[str] | None = None
) -> list[Task]:
    """All tasks of a JSONL file (SWE-bench rows' repositories from ``cache``); the first bad row
    raises ``TaskError`` naming the line and field. ``environments``: the names a row's
    ``environment`` may take (None: any)."""
    tasks, problems = scan_tasks(path, cache, environments)
    if problems:
        raise TaskError(problems[0])
    return tasks


def scan_tasks(
    path: str | Path, cache: str | Path | None = None, environments: Collection[str] | None = None
) -> tuple[list[Task], list[str]]:
    """The good tasks of a JSONL file and one line per problem (``<file>:<line>: <field>: why``);
    a row naming an ``environment`` outside ``environments`` (unless None) is one."""
    path = Path(path)
    if not path.is_file():
        return [], [f"{path}: no such file"]
    tasks: list[Task] = []
    problems: list[str] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = _parse_line(path, lineno, line, None if cache is None else Path(cache))
            _known_environment(task, environments, f"{path}:{lineno} ({task.instance_id})")
        except TaskError as err:
            problems.append(str(err))
            continue
        if task.instance_id in seen:
            problems.append(f"{path}:{lineno}: duplicate instance_id {task.instance_id!r}")
        seen.add(task.instance_id)
        tasks.append(task)
    if not tasks and not problems:
        problems.append(f"{path}: no tasks")
    return tasks, problems


def _known_environment(task: Task, names: Collection[str] | None, where: str) -> None:
    if names is None or task.environment is None or task.environment in names:
        return
    have = ", ".join(sorted(names)) or "none declared"
    raise TaskError(
        f"{where}: environment: {task.environment!r} is not one of spec.sandbox.environments "
        f"({have})"
    )


def with_environment(tasks: list[Task], environment: str | None) -> list[Task]:
    """``tasks`` with ``environment`` (a dataset source's) where a row names none."""
    if environment is None:
        return tasks
    return [
        t if t.environment else t.model_copy(update={"environment": environment}) for t in tasks
    ]


def check_environments(tasks: list[Task], names: Collection[str], where: str) -> None:
    """``TaskError`` for the first task whose environment is not among ``names``."""
    for task in tasks:
        _known_environment(task, names, f"{where} ({task.instance_id})")


def _parse_line(path: Path, lineno: int, line: str, cache: Path | None) -> Task:
    where = f"{path}:{lineno}"
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as e:
        raise TaskError(f"{where}: not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise TaskError(f"{where}: a task must be a JSON object")
    if isinstance(raw.get("instance_id"), str):
        where += f" ({raw['instance_id']})"
    try:
        return parse_task(raw, path.parent, cache)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'task'}: {_one_line(err['msg'])}"
            for err in e.errors()
        )
        raise TaskError(f"{where}: {problems}") from None
    except (TaskError, repo_cache.RepoCacheError) as e:
        raise TaskError(f"{where}: {_one_line(str(e))}") from None


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


def dump_tasks(tasks: list[Task], path: str | Path) -> None:
    lines = [t.model_dump_json(by_alias=False, exclude_none=True) for t in tasks]
    Path(path).write_text("\n".join(lines) + "\n")
