"""Verification: run a task's hidden tests against pristine test files, in a fresh sandbox.

The candidate's final repository is copied (``archive``) into a new session; every test file of
the task, and every test or harness file the candidate changed, is put back as the task has it
(files the candidate added there are deleted, whatever stands at their paths removed); then the
task's pytest invocation runs the ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` ids through a bootstrap
(``verify_boot.py``, ``python -I -B -c``): the interpreter, the standard library, pytest and its
plugins come from the task's environment (``Task.environment``: a read-only virtual environment,
``gagar.sandbox.venvs``, or on sandbox pods the executor of the environment's image) or else the
executor's, never from the workspace. The bootstrap forks:
pytest runs in the child, beside the candidate's code, and streams each outcome to the parent, a
witness where no code of the workspace runs, which alone reads the nonce and writes the record
(the record's and the secret file's names are in the test process's argv, so each has a random
token of its own, never the nonce). Each run also plants tests of its own in the task's test files
(``plant.py``): canaries that must be reported failing and controls that must pass, whose bodies
write markers the witness checks after the test process ended. ``judge`` decides from the record;
a record without the nonce, one showing the runner or a test loaded from the workspace, a pytest
plugin loaded from it that is not a file verification wrote (the task's own ``conftest.py`` is
one; a candidate's is deleted or overwritten before the run), pytest's machinery replaced, or
a canary passing or a control passing without its body having run, is ``tampering`` and never
passes. Editing tests therefore never earns reward. Separately, a
patch that touches tests, the test runner's configuration or the harness is recorded as
*suspected tampering* for the grader. What the candidate left that cannot be copied (links out of the workspace, FIFOs,
unreadable or huge files) is listed in ``refused``; it never makes verification raise.

Limits (stated, not hidden): the tests run in the same process as the candidate's code, so the
outcomes it sends are its word; code that inspects the collected tests while they run could tell
the planted ones apart and report only those honestly. Such code has to live in the patch, where
the graders' tamper screen sees it. docs/security.md lists the catalogue of reward hacks this is
tested against, and what remains.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import random
import re
import secrets
import shlex
import tarfile
import threading
from concurrent.futures import Future
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from gagar.rollout.envs import plant, verify_boot
from gagar.rollout.envs.task import Task
from gagar.sandbox import (
    ExecResult,
    SandboxError,
    SandboxInfraError,
    Session,
    SessionFactory,
    VerificationFactory,
)

log = logging.getLogger("gagar.rollout")
# Files that steer how tests run: changing them can change the verdict without fixing the code.
RUNNER_FILES = frozenset(
    {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", ".coveragerc"}
)
HARNESS_FILES = frozenset({"sitecustomize.py", "usercustomize.py"})
LOG_CAP = 20_000
# The test process's bootstrap, run as ``python -I -B -c`` inside the jail (never imported there).
BOOT_SOURCE = Path(verify_boot.__file__).read_text()


class TestCommandError(ValueError):
    """The task's ``test_command`` is not a pytest invocation the verifier can run safely."""


class Verdict(BaseModel):
    """The outcome of verifying one candidate. ``valid`` is False on infrastructure failure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str
    passed: bool
    valid: bool
    tests: dict[str, bool] = Field(default_factory=dict, description="Test id -> passed.")
    suspected_tampering: list[str] = Field(default_factory=list, description="Paths touched.")
    tampering: list[str] = Field(
        default_factory=list,
        description="What the run itself showed subverted (the runner or a test loaded from the "
        "workspace, pytest's machinery replaced, a forged record): never passed.",
    )
    refused: list[str] = Field(
        default_factory=list,
        description="Entries of the workspace not carried into verification, or not restored.",
    )
    infra_error: str | None = None
    exit_code: int | None = None
    log: str = Field(
        default="", description="The test run's output: the candidate's code wrote it."
    )
    notes: list[str] = Field(
        default_factory=list,
        description="gagar's own notes on the run, kept apart from ``log`` so that no output of "
        "the code can pass for one of them.",
    )
    duration_s: float = 0.0


def is_test_path(path: str) -> bool:
    p = PurePosixPath(path)
    name = p.name
    in_tests = any(part in ("tests", "test", "testing") for part in p.parts[:-1])
    return (
        in_tests or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
    )


def is_guarded_path(path: str, task: Task) -> bool:
    """Tests, runner configuration or harness: what a fix has no business changing."""
    name = PurePosixPath(path).name
    return (
        path in task.test_files
        or is_test_path(path)
        or name in RUNNER_FILES
        or name in HARNESS_FILES
        or name.endswith(".pth")
    )


def touched_paths(patch: str) -> list[str]:
    """Paths a ``diff --git`` style patch changes (either side)."""
    paths = []
    for line in patch.splitlines():
        m = re.match(r"diff --git a/(.+?) b/(.+)$", line)
        if m:
            paths += [m.group(1), m.group(2)]
    return sorted(set(paths))


def suspected_tampering(patch: str, task: Task) -> list[str]:
    return [p for p in touched_paths(patch) if is_guarded_path(p, task)]


def pristine_files(task: Task, base: dict[str, bytes]) -> dict[str, bytes]:
    """The guarded files as the task has them: its repository's (``base``), its ``test_files``
    over those. Verification writes exactly these before the tests run, so a ``conftest.py``
    among them is the task's own (a package's test tree has them), never the candidate's."""
    pristine = {p: d for p, d in base.items() if is_guarded_path(p, task)}
    pristine.update({p: t.encode() for p, t in task.test_files.items()})
    return pristine


def _restore(
    session: Session, task: Task, base: dict[str, bytes], planted: dict[str, bytes]
) -> list[str]:
    """Put every guarded file back as the task has it (``planted``: the test files with this
    run's planted tests); delete guarded files the candidate added.

    Whatever stands in the way (a link, a FIFO or a directory at a test path, a file where a
    directory of tests should be) is removed first. Returns what could not be restored, with why:
    never raises for what the candidate left."""
    before = session.list_files()
    pristine = pristine_files(task, base) | planted
    problems = []
    for path in before:
        if is_guarded_path(path, task) and path not in pristine:
            problems += _try(session.delete_file, path)
    listed = set(session.list_files())
    dirs = {str(d) for e in listed for d in PurePosixPath(e).parents}
    for path, data in sorted(pristine.items()):
        ancestors = [str(d) for d in PurePosixPath(path).parents if str(d) in listed]
        for entry in [*ancestors, *([path] if path in dirs else [])]:
            problems += _try(session.delete_file, entry)  # a link or file where a dir goes
            listed.discard(entry)
        if _try(session.write_file, path, data):  # a FIFO or other special file: remove, again
            problems += _try(session.delete_file, path) + _try(session.write_file, path, data)
    return problems


def _try(op, path: str, *args: object) -> list[str]:
    try:
        op(path, *args)
    except SandboxInfraError:
        raise
    except (SandboxError, OSError) as e:
        return [f"{path}: {e}"]
    return []


def _boot_command(task: Task, record: str, nonce: str) -> str | None:
    """The task's pytest invocation, run through the bootstrap (``verify_boot``) instead: the
    variable assignments and pytest's arguments kept, the interpreter started isolated."""
    try:
        words = shlex.split(task.test_command)
    except ValueError:
        return None
    env = []
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        env.append(words.pop(0))
    if words[:1] and PurePosixPath(words[0]).name in ("pytest", "py.test"):
        python, args = "python", words[1:]
    elif len(words) >= 3 and re.fullmatch(r"python3?(\.\d+)?", PurePosixPath(words[0]).name):
        if words[1:3] != ["-m", "pytest"]:
            return None
        python, args = words[0], words[3:]
    else:
        return None
    boot = [python, "-I", "-B", "-c", BOOT_SOURCE, record, nonce, ".", "--", *args]
    return " ".join(shlex.quote(w) for w in [*env, *boot])


def run_tests(
    session: Session,
    task: Task,
    timeout: float | None,
    planting: plant.Planting | None = None,
    restored: frozenset[str] = frozenset(),
) -> TestRun:
    """Run the task's test ids (and ``planting``'s, mixed in) in ``session`` through the
    bootstrap and judge its record; ``restored``: the paths verification wrote as the task has
    them (``judge``)."""
    planting = planting or plant.Planting()
    # The names are in the test process's argv (``/proc/self/cmdline``): never the nonce, never
    # the planted tests' markers (the secret file has them; only the witness reads it).
    record = f".gagar-verify-{secrets.token_hex(16)}.json"
    secret_file, nonce = f".gagar-nonce-{secrets.token_hex(16)}", secrets.token_hex(16)
    cmd = _boot_command(task, record, secret_file)
    if cmd is None:
        raise TestCommandError(
            f"{task.instance_id}: test_command {task.test_command!r} is not a pytest invocation "
            "the verifier can run (`[VAR=value ...] python -m pytest [args]` or `pytest [args]`)"
        )
    secret = {"nonce": nonce, "markers": planting.markers(), "expect": planting.expected_exit()}
    session.write_file(secret_file, json.dumps(secret))
    ids = plant.mix(task.test_ids, planting, random.SystemRandom())
    if planting.tests:  # a failing canary must not end the run (``-x``, ``--maxfail``)
        ids.insert(0, "--maxfail=0")
    result = session.exec(cmd + " " + " ".join(shlex.quote(i) for i in ids), timeout)
    try:
        raw: bytes | None = session.read_file(record)
        session.delete_file(record)
    except SandboxInfraError:
        raise
    except SandboxError:
        raw = None
    return judge(raw, nonce, task, result, planting, restored)


class TestRun(BaseModel):
    """What one run of the tests gave: per-id outcomes, what the record says went wrong, notes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    __test__ = False  # not a test class, whatever pytest thinks of the name

    tests: dict[str, bool]
    tampering: list[str] = Field(default_factory=list)
    broken: list[str] = Field(
        default_factory=list, description="Why the run cannot pass, short of a forgery shown."
    )
    notes: list[str] = Field(default_factory=list)
    result: ExecResult
    exit: int | None = None
    expected_exit: int = Field(
        default=0, description="pytest's status of an honest pass: 1 where canaries were planted."
    )


def judge(
    raw: bytes | None,
    nonce: str,
    task: Task,
    result: ExecResult,
    planting: plant.Planting | None = None,
    restored: frozenset[str] = frozenset(),
) -> TestRun:
    """The verdict's facts from the witness's record (pure). No record, or the test process
    ended before pytest finished: every id failed; a record without the nonce, facts that show
    the run was subverted, or planted tests that show the outcomes forged: tampering. A pytest
    plugin loaded from the workspace is one too, unless its file is among ``restored`` (the
    paths verification wrote as the task has them: the package's own ``conftest.py``)."""
    failed = dict.fromkeys(task.test_ids, False)
    if raw is None:
        note = "no record from the verification: it ended before the witness wrote one"
        return TestRun(tests=failed, notes=[note], result=result)
    try:
        rec = json.loads(raw)
        if not isinstance(rec, dict) or rec.get("nonce") != nonce:
            raise ValueError("wrong nonce")
    except (ValueError, UnicodeDecodeError):
        forged = ["the verification record was not written by the verifier (forged)"]
        return TestRun(tests=failed, tampering=forged, result=result)
    planting = planting or plant.Planting()
    outcomes, markers = _mapping(rec, "outcomes"), _mapping(rec, "markers")
    forged, broken = plant.check(planting, outcomes, markers)
    expected = planting.expected_exit()
    if expected and rec.get("exit") == 0:
        forged.append("the test process exited 0 although planted canaries must fail")
    if rec.get("finished", True) is not True:
        broken.append("the test process ended before pytest finished (no facts from it)")
    stream = _mapping(rec, "stream")
    if stream.get("bad_lines") or stream.get("overflow"):
        broken.append(f"the test process's messages to the witness were not its own: {stream}")
    notes = [planting.describe()] if planting.tests else []
    if stream and stream.get("witness_guarded") is False:
        notes.append("the witness could not make itself undumpable (prctl failed)")
    return TestRun(
        tests={tid: outcomes.get(tid) is True for tid in task.test_ids},
        tampering=[*forged, *_record_findings(rec, task, restored)],
        broken=broken,
        notes=notes,
        result=result,
        exit=rec.get("exit") if isinstance(rec.get("exit"), int) else None,
        expected_exit=expected,
    )


def _mapping(rec: dict, key: str) -> dict:
    value = rec.get(key)
    return value if isinstance(value, dict) else {}


def _record_findings(rec: dict, task: Task, restored: frozenset[str]) -> list[str]:
    root = str(rec.get("root") or "/workspace").rstrip("/")

    def rel(path: object) -> str | None:
        p = str(path or "")
        return p[len(root) + 1 :] if p.startswith(root + "/") else None

    out = []
    for name, where in (rec.get("runner") or {}).items():
        if not where or rel(where) is not None:
            out.append(f"the test runner's {name} was loaded from {where!r}")
    expected = {tid.split("::")[0] for tid in task.test_ids}
    for item in rec.get("items") or []:
        path, node = rel(item.get("path")), item.get("nodeid")
        if path not in expected:
            out.append(f"{node}: collected from {item.get('path')!r}, not a test file of the task")
        module = item.get("module_file")
        # an item without a module (a doctest of a text file, ``--doctest-glob``) is the text of
        # a file verification wrote, when it is one
        if module != item.get("path") and not (module is None and path in restored):
            out.append(f"{node}: its module was loaded from {module!r}")
        code = rel(item.get("code_file"))
        if code is not None and not is_guarded_path(code, task):
            out.append(f"{node}: its function's code comes from {code!r}")
        if rel(item.get("loader_file")) is not None:
            out.append(f"{node}: its module was loaded by a loader from {item['loader_file']!r}")
    for where in rec.get("plugins") or []:
        if rel(where) not in restored:  # a conftest.py verification wrote is the task's own
            out.append(f"a pytest plugin was loaded from {where!r}")
    for where in rec.get("shadowed") or []:
        out.append(f"{where!r} shadowed a module of the standard library or the test runner")
    out += [str(f) for f in rec.get("flags") or []]
    return out


def verify(
    task: Task,
    candidate: Session,
    factory: SessionFactory,
    timeout: float | None = None,
    archive: bytes | None = None,
) -> Verdict:
    """Verify the candidate's current workspace (left untouched) against the task's tests;
    ``archive``: its ``archive()``, where the caller has it already.

    A failure of the sandbox machinery anywhere on the way gives an invalid verdict
    (``valid=False``), never a failed one. What the candidate left (links, FIFOs, odd names, huge
    or unreadable files) never makes this raise: what could not be carried over or restored is
    listed in ``refused`` and the log, and the tests decide.
    """
    try:
        patch = candidate.diff()
        before = set(candidate.list_files())
        tarball = candidate.archive() if archive is None else archive
        fresh = _fresh(factory, tarball, task)
    except SandboxInfraError as e:
        return Verdict(instance_id=task.instance_id, passed=False, valid=False, infra_error=str(e))
    except SandboxError as e:  # what the candidate left cannot be copied at all: its failure
        return Verdict(
            instance_id=task.instance_id,
            passed=False,
            valid=True,
            tests=dict.fromkeys(task.test_ids, False),
            refused=[f"the workspace: {e}"],
            log=f"verification could not copy the workspace: {e}",
        )
    try:
        refused = sorted(before - set(fresh.list_files()))
        base = task.repo_files()
        planting = _planting(task, base)
        refused += _restore(fresh, task, base, planting.files)
        # a path whose restoring failed may still hold the candidate's file: not the task's
        failed = {r.split(": ", 1)[0] for r in refused}
        restored = frozenset(pristine_files(task, base)) - failed
        run = run_tests(fresh, task, timeout, planting, restored)
    except SandboxInfraError as e:
        return Verdict(instance_id=task.instance_id, passed=False, valid=False, infra_error=str(e))
    except (
        TestCommandError
    ) as e:  # the task's own test command: a configuration error, not the code's
        return Verdict(instance_id=task.instance_id, passed=False, valid=False, infra_error=str(e))
    finally:
        fresh.close()
    result = run.result
    notes = [*run.notes, *(f"tampering: {t}" for t in run.tampering)]
    notes += [f"cannot pass: {b}" for b in run.broken]
    if refused:
        notes.append("not carried into verification: " + "; ".join(refused[:50]))
    log = (result.stdout + result.stderr)[-LOG_CAP:]
    return Verdict(
        instance_id=task.instance_id,
        # The process's exit status, the record's and every id must agree on a pass: pytest's
        # status (the record's) is 1 where the planted canaries failed, as they must; the
        # witness then leaves with 0, the process's status of no other run of it.
        passed=result.infra_error is None
        and result.exit_code == 0
        and run.exit == run.expected_exit
        and not run.tampering
        and not run.broken
        and all(run.tests.values()),
        valid=result.infra_error is None,
        tests=run.tests,
        suspected_tampering=suspected_tampering(patch, task),
        tampering=run.tampering,
        refused=refused,
        infra_error=result.infra_error,
        exit_code=result.exit_code,
        log=log,
        notes=[n[:2000] for n in notes],
        duration_s=result.duration_s,
    )


# pytest options that deselect tests: a planted test they leave out would never run.
SELECTING = ("-k", "-m", "--deselect", "--co", "--collect-only", "--lf", "--last-failed")


def _selects(word: str, after: str) -> bool:
    if word == "-m":
        return after != "pytest"  # ``python -m pytest`` runs pytest; ``pytest -m slow`` selects
    return word[:2] in ("-k", "-m") or any(word.split("=")[0] == o for o in SELECTING)


def _planting(task: Task, base: dict[str, bytes]) -> plant.Planting:
    """This run's planted tests, in the task's test files as verification restores them; none
    where the task's command selects among the tests itself."""
    try:
        words = shlex.split(task.test_command)
    except ValueError:
        return plant.Planting()  # refused by ``_boot_command``
    if any(_selects(w, after) for w, after in zip(words, [*words[1:], ""], strict=True)):
        return plant.Planting()
    return plant.plant(task.test_ids, pristine_files(task, base), random.SystemRandom())


def _fresh(factory: SessionFactory, tarball: bytes, task: Task) -> Session:
    """The session the tests run in, in the task's environment or image (its Python and
    packages): a station where the factory keeps them (``station.py``: its fork server has the
    bootstrap's imports preloaded, in that environment), else a new session."""
    env, image = placement(task, factory)
    if isinstance(factory, VerificationFactory):
        preload = verify_boot.PRELOAD
        return factory.verification_session(tarball, preload, environment=env, image=image)
    return factory.create(tarball=tarball, environment=env, image=image)


def placement(task: Task, factory: SessionFactory) -> tuple[str | None, str | None]:
    """Where the task's sessions run, (environment, image): its ``environment``, else its own image
    (``Task.sandbox_image``) where ``factory`` runs task images (sandbox pods' routing factory,
    ``runs_task_images``). Elsewhere (the local backend: no containers) the image is left out,
    once logged, and the task runs in the sandbox's own Python, as before images were read: a
    refusal would fail every SWE-bench row that runs fine there."""
    image = task.sandbox_image
    if image is not None and not getattr(factory, "runs_task_images", False):
        _image_left_out(type(factory).__name__, image)
        image = None
    return task.environment, image


@functools.cache
def _image_left_out(factory: str, image: str) -> None:
    """Said once per factory kind and image (a dataset of many images: once each, at most)."""
    log.warning(
        "the task image %s is not used: %s runs no task images (only sandbox.backend: pods "
        "does); the task runs in the sandbox's own Python (give it an environment to choose "
        "its packages)",
        image,
        factory,
    )


def repository_digest(archive: bytes, listed: list[str]) -> str:
    """What verification is given of a candidate, as a sha256: every entry of its ``archive()``
    (path, kind, permission bits, link target, bytes; not times, owners or the entries' order)
    and the paths its workspace lists (``refused`` names those the archive left out)."""
    h = hashlib.sha256()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        members = sorted(tar.getmembers(), key=lambda m: m.name)
        for m in members:
            head = [m.name, m.type.decode(errors="replace"), oct(m.mode & 0o7777), m.linkname]
            h.update(json.dumps(head).encode() + b"\n")
            data = tar.extractfile(m) if m.isreg() else None
            if data is not None:
                h.update(hashlib.sha256(data.read()).digest())
    h.update(json.dumps(sorted(listed)).encode())
    return h.hexdigest()


class SharedVerdicts:
    """One verification per distinct repository among the candidates of one group.

    A group's trajectories often end on the same repository (the same one-line fix, or no edit at
    all): verification is deterministic in what it is given (``repository_digest``: the archive
    the fresh session is made from and the workspace's listing), so identical candidates get the
    verdict of one run instead of a run each; a candidate whose identical twin is still being
    verified waits for that verdict. Only valid verdicts are shared: after an infrastructure
    failure every candidate runs its own. Tests that are themselves random then give identical
    candidates one draw between them, not one each; the expected reward is the same. Thread-safe
    (verification runs in the rollouts' worker threads). ``runs`` and ``shared`` count.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verdicts: dict[str, Future[Verdict]] = {}
        self.runs = 0
        self.shared = 0

    def verify(
        self,
        task: Task,
        candidate: Session,
        factory: SessionFactory,
        timeout: float | None = None,
    ) -> Verdict:
        try:
            archive = candidate.archive()
            key = repository_digest(archive, candidate.list_files())
        except (SandboxError, tarfile.TarError, OSError):  # ``verify`` says what went wrong
            return self._run(task, candidate, factory, timeout, None)
        with self._lock:
            pending = self._verdicts.get(key)
            if pending is None:
                mine: Future[Verdict] = Future()
                self._verdicts[key] = mine
        if pending is not None:
            try:
                verdict = pending.result()
            except Exception:  # the twin's verification raised: run this one's own
                verdict = None
            if verdict is not None and verdict.valid:
                with self._lock:
                    self.shared += 1
                return verdict
            return self._run(task, candidate, factory, timeout, archive)
        try:
            verdict = self._run(task, candidate, factory, timeout, archive)
        except BaseException as e:
            self._forget(key)
            mine.set_exception(e)
            raise
        if not verdict.valid:
            self._forget(key)  # later twins run their own
        mine.set_result(verdict)
        return verdict

    def _run(
        self,
        task: Task,
        candidate: Session,
        factory: SessionFactory,
        timeout: float | None,
        archive: bytes | None,
    ) -> Verdict:
        with self._lock:
            self.runs += 1
        return verify(task, candidate, factory, timeout, archive)

    def _forget(self, key: str) -> None:
        with self._lock:
            self._verdicts.pop(key, None)


def open_session(task: Task, factory: SessionFactory) -> Session:
    """A session on the task's repository (local or on an executor server, per ``factory``), in
    the task's environment or image (``placement``)."""
    env, image = placement(task, factory)
    return factory.create(files=task.repo_files(), environment=env, image=image)


def verify_files(
    task: Task, files: dict[str, bytes], factory: SessionFactory, timeout: float | None = None
) -> Verdict:
    """Verify a repository given as files (e.g. the reference fix) via a throwaway session."""
    with_base = open_session(task, factory)
    try:
        for path in with_base.list_files():
            if path not in files:
                with_base.delete_file(path)
        for path, data in files.items():
            with_base.write_file(path, data)
        return verify(task, with_base, factory, timeout)
    finally:
        with_base.close()
