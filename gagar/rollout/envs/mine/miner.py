"""Mine code-repair tasks from a real package: plant a bug its own tests catch, keep the fix.

For one unpacked sdist, in one sandbox session:

1. run the test suite twice (the second time recording, per test, the lines it executes); a test
   whose outcome differs between the runs is flaky and dropped, and only tests that passed both
   times are ever listed;
2. find span edits (``edits.py``) in the package's non-test modules on lines some stable test
   executes and that do not run at import (those could break collection, not a test);
3. take them in an order fixed by the seed (shuffled per kind, then one of each kind in turn;
   an edit is checked to change the code only when its turn comes, as a check parses the whole
   file); apply one, run only the tests that execute its line, restore the file; keep it when
   between ``min_fail`` and ``max_fail`` of them fail (a test that does not execute the line
   cannot change its outcome, so the rest pass); stop at ``max_tasks`` kept;
4. drop a planted bug whose file text another kept edit already made (identical tasks);
5. write a ``Task`` per kept edit: the buggy snapshot, the package's test tree as
   ``test_files``, ``patch`` = the reverse diff (the reference fix), ``FAIL_TO_PASS`` = the
   tests that broke, ``PASS_TO_PASS`` = every other stable test, and a problem statement made of
   the failing tests' names and the first failure's error lines (never the file, the line or the
   edit), and ``held_back``: a seeded share of the listed tests kept out of training
   verification (never named in the statement); with ``verify``, each task is checked by the
   real verifier, running the whole listed suite: the snapshot fails exactly ``FAIL_TO_PASS``,
   and the patched one is the released package byte for byte, whose one verification (every
   listed test passes) serves all the package's tasks.

Same sdist, seed and limits: the same rows, byte for byte (instance ids are digests of the edit;
snapshots are tarballs with fixed times and owners). Time goes only into the summary.
"""

from __future__ import annotations

import difflib
import gzip
import hashlib
import io
import json
import math
import random
import re
import tarfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from gagar.rollout.envs.mine.edits import EDIT_KINDS, Changes, Edit, find_edits
from gagar.rollout.envs.mine.sdist import Sdist
from gagar.rollout.envs.mine.suite import COLLECT, PROBE_DIR, Suite, SuiteRun
from gagar.rollout.envs.task import PLAIN_PYTEST, Task, TaskError, is_text
from gagar.rollout.envs.verify import is_test_path, verify_files
from gagar.sandbox import Limits, SessionFactory

MINER_VERSION = 2
EDIT_MIN_CPU_S = 10


class MineError(ValueError):
    """The package cannot be mined: its suite does not run here, or nothing in it passes."""


@dataclass(frozen=True)
class MineConfig:
    seed: int = 0
    max_edits: int = 100
    min_fail: int = 1
    max_fail: int = 20
    # Planted bugs kept per package at most: edits stop being tried once this many are kept
    # (a count, not a clock, so the rows stay the same run to run); None: no cap.
    max_tasks: int | None = None
    # The share of each task's listed tests held back from training verification (``Task``'s
    # ``held_back``), drawn per task from the seed; one FAIL_TO_PASS test always stays visible.
    held_back: float = 0.2
    verify: bool = True
    timeout_s: float = 600.0  # wall clock of any run
    # An edited run may loop forever: it gets this many times the untraced baseline's CPU time,
    # at least EDIT_MIN_CPU_S. CPU, not wall time: a busy machine slows a run without changing
    # the verdict, so the rows stay the same run to run.
    edit_cpu_factor: float = 3.0
    # Or hang asleep (a deadlock, a wait for an event that never comes: more-itertools has such
    # edits), using no CPU, so only the wall clock stops it: this many times the baseline's wall
    # time, at least edit_min_wall_s, at most timeout_s (which a hang cost before: 10 minutes).
    # A busy machine changes the verdict only of a run it slows by more than that factor.
    edit_wall_factor: float = 20.0
    edit_min_wall_s: float = 60.0
    test_command: str = PLAIN_PYTEST


@dataclass
class Summary:
    package: str
    version: str
    sha256: str
    tests: int = 0
    flaky: list[str] = field(default_factory=list)
    suite_s: float = 0.0
    candidates: int = 0
    tried: int = 0
    kept: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    tried_by_kind: Counter[str] = field(default_factory=Counter)
    kept_by_kind: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    # where the seconds went: the two baseline runs, trying edits, verifying the kept ones
    phases: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = dict(sorted(value.items())) if isinstance(value, Counter) else value
        return out


@dataclass(frozen=True)
class Baseline:
    stable: list[str]  # passed both runs, sorted
    covering: dict[tuple[str, int], set[str]]  # (path, line) -> stable tests executing it
    at_import: set[tuple[str, int]]  # lines run outside any test
    cpu_s: float  # the untraced run's CPU time
    wall_s: float  # and its wall time


def baseline(suite: Suite, summary: Summary) -> Baseline:
    """Two runs of the whole suite; the second records lines. Flaky tests are dropped."""
    first = suite.run()
    second = suite.run(trace=True)
    if first.collect_errors or not first.passed:
        why = next(iter(first.messages.values()), "") or "no test passed"
        raise MineError(f"{summary.package} {summary.version}: the suite does not run here: {why}")
    summary.suite_s = round(first.duration_s, 2)
    tests = set(first.outcomes) | set(second.outcomes)
    summary.flaky = sorted(t for t in tests if first.outcomes.get(t) != second.outcomes.get(t))
    stable = sorted(first.passed & second.passed)
    summary.tests = len(stable)
    covering: dict[tuple[str, int], set[str]] = {}
    for test in stable:
        for path, lines in second.lines.get(test, {}).items():
            for line in lines:
                covering.setdefault((path, line), set()).add(test)
    at_import = {(p, n) for p, ls in second.lines.get(COLLECT, {}).items() for n in ls}
    return Baseline(stable, covering, at_import, first.cpu_s, first.duration_s)


def candidate_edits(files: dict[str, bytes], base: Baseline, summary: Summary) -> list[Edit]:
    """Edits on lines stable tests execute (not at import), of non-test modules, in source order;
    not yet checked to change the code (``order`` checks those it takes)."""
    found = []
    for path, data in files.items():
        if not path.endswith(".py") or is_test_path(path) or path.startswith(PROBE_DIR):
            continue
        try:
            source = data.decode()
        except UnicodeDecodeError:
            continue
        for edit in find_edits(path, source, check=False):
            where = (path, edit.line)
            if where not in base.covering:
                summary.rejected["not_executed_by_tests"] += 1
            elif where in base.at_import:
                summary.rejected["runs_at_import"] += 1
            else:
                found.append(edit)
    summary.candidates = len(found)
    return found


def order(
    edits: list[Edit], seed: int, limit: int, usable: Callable[[Edit], bool] = lambda e: True
) -> list[Edit]:
    """Shuffled per kind by ``seed``, then one of each kind in turn: every kind gets tried.
    An edit ``usable`` refuses (one that does not change the code) gives its turn to the next
    of its kind; only the edits taken are checked."""
    rng = random.Random(seed)
    per_kind = [[e for e in edits if e.kind == k] for k in EDIT_KINDS]
    for group in per_kind:
        rng.shuffle(group)
    out: list[Edit] = []
    while len(out) < limit and any(per_kind):
        for group in per_kind:
            while group and len(out) < limit:
                edit = group.pop(0)
                if usable(edit):
                    out.append(edit)
                    break
    return out


def try_edit(
    suite: Suite, edit: Edit, source: str, base: Baseline, config: MineConfig
) -> tuple[str, SuiteRun, list[str]]:
    """Apply ``edit`` in the session, run the tests executing its line, restore the file:
    (verdict, the run, the tests that broke). The verdict is ``kept`` or a rejection reason."""
    select = sorted(base.covering[(edit.path, edit.line)])
    wall = min(config.timeout_s, max(config.edit_min_wall_s, config.edit_wall_factor * base.wall_s))
    suite.session.write_file(edit.path, edit.apply(source).encode())
    try:
        run = suite.run(select=select, timeout_s=wall)
    finally:
        suite.session.write_file(edit.path, source.encode())
    broke = sorted(t for t in select if run.outcomes.get(t) != "passed")
    if run.timed_out:
        return "timeout", run, broke
    if run.collect_errors:
        return "collection_error", run, broke
    if len(broke) < config.min_fail:
        return "no_test_fails", run, broke
    if len(broke) > config.max_fail:
        return "too_many_fail", run, broke
    return "kept", run, broke


def mine(
    pkg: Sdist, factory: SessionFactory, config: MineConfig, out: Path
) -> tuple[list[Task], Summary]:
    """The tasks of one package (snapshots written under ``out/snapshots``) and the summary."""
    started = time.monotonic()
    summary = Summary(pkg.name, pkg.version, pkg.sha256)
    limits = Limits(wall_time_s=config.timeout_s, cpu_time_s=int(config.timeout_s))
    session = factory.create(files=pkg.files, limits=limits)
    try:
        base = baseline(Suite(session, config.test_command, config.timeout_s), summary)
    finally:
        session.close()
    summary.phases["baseline_s"] = round(time.monotonic() - started, 1)
    cpu = math.ceil(max(EDIT_MIN_CPU_S, config.edit_cpu_factor * base.cpu_s))
    found = candidate_edits(pkg.files, base, summary)
    changes = Changes({e.path: pkg.files[e.path].decode() for e in found})
    edits = order(found, config.seed, config.max_edits, changes)
    session = factory.create(files=pkg.files, limits=limits.model_copy(update={"cpu_time_s": cpu}))
    try:
        suite = Suite(session, config.test_command, config.timeout_s)
        tasks = _run_edits(suite, edits, pkg, base, config, summary, out)
    finally:
        session.close()
    summary.phases["edits_s"] = round(time.monotonic() - started - summary.phases["baseline_s"], 1)
    if config.verify and tasks:
        verifying = time.monotonic()
        fixed_ok = _original_passes(tasks[0], pkg, factory)
        tasks = [t for t in tasks if _verified(t, pkg, fixed_ok, factory, summary)]
        summary.phases["verify_s"] = round(time.monotonic() - verifying, 1)
    summary.kept = len(tasks)
    summary.kept_by_kind = Counter(t.metadata["edit_kind"] for t in tasks)
    summary.seconds = round(time.monotonic() - started, 1)
    return tasks, summary


def _run_edits(  # noqa: PLR0913 - the miner's state, passed through once
    suite: Suite,
    edits: list[Edit],
    pkg: Sdist,
    base: Baseline,
    config: MineConfig,
    summary: Summary,
    out: Path,
) -> list[Task]:
    tasks: list[Task] = []
    seen: set[str] = set()
    for edit in edits:
        if config.max_tasks is not None and len(tasks) >= config.max_tasks:
            break
        source = pkg.files[edit.path].decode()
        buggy = edit.apply(source)
        summary.tried += 1
        summary.tried_by_kind[edit.kind] += 1
        digest = hashlib.sha256(f"{edit.path}\0{buggy}".encode()).hexdigest()
        if digest in seen:
            summary.rejected["duplicate"] += 1
            continue
        verdict, run, broke = try_edit(suite, edit, source, base, config)
        if verdict != "kept":
            summary.rejected[verdict] += 1
            continue
        seen.add(digest)
        tasks.append(make_task(pkg, edit, buggy, broke, run, base, config, out))
    return tasks


def _original_passes(task: Task, pkg: Sdist, factory: SessionFactory) -> bool:
    """Whether the package as released passes every stable test through the real verifier.

    Every reference fix of a package gives back exactly the released files (``_verified``
    checks it byte for byte) and every task of the package lists the same tests, so this one
    run is each task's check of its fixed repository: one full suite per package, not per task.
    """
    after = verify_files(task, pkg.files, factory)
    return after.valid and after.passed


def _verified(
    task: Task, pkg: Sdist, fixed_ok: bool, factory: SessionFactory, summary: Summary
) -> bool:
    """The real verifier agrees: unfixed fails exactly FAIL_TO_PASS (held-back tests listed),
    and the reference fix gives back the released files, which pass everything (``fixed_ok``)."""
    try:
        fixed = task.fixed_files()
    except TaskError:
        summary.rejected["patch_does_not_apply"] += 1
        return False
    if fixed != pkg.files or not fixed_ok:
        summary.rejected["unverified_fixed"] += 1
        return False
    before = verify_files(task, task.repo_files(), factory)
    failing = sorted(t for t, ok in before.tests.items() if not ok)
    if not before.valid or failing != sorted(task.fail_to_pass):
        summary.rejected["unverified_unfixed"] += 1
        return False
    return True


def make_task(  # noqa: PLR0913 - the parts of one row
    pkg: Sdist,
    edit: Edit,
    buggy: str,
    broke: list[str],
    run: SuiteRun,
    base: Baseline,
    config: MineConfig,
    out: Path,
) -> Task:
    source = pkg.files[edit.path].decode()
    key = hashlib.sha256(f"{edit.path}\0{edit.start}\0{edit.kind}\0{edit.new}".encode())
    instance_id = f"{pkg.name}-{pkg.version}.{edit.kind}.{key.hexdigest()[:10]}"
    files = {**pkg.files, edit.path: buggy.encode()}
    snapshot = out / "snapshots" / f"{instance_id}.tar.gz"
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.write_bytes(deterministic_tarball(files))
    text = {p: d.decode() for p, d in pkg.files.items() if is_test_path(p) and is_text(d)}
    broke_set = set(broke)
    passing = [t for t in base.stable if t not in broke_set]
    held = held_back(instance_id, broke, passing, config)
    shown = [t for t in broke if t not in held]
    return Task(
        instance_id=instance_id,
        repo=f"{pkg.name}=={pkg.version}",
        family="mined",
        problem_statement=problem_statement(pkg, shown, run.messages),
        snapshot=str(snapshot.resolve()),
        fail_to_pass=broke,
        pass_to_pass=passing,
        held_back=held,
        test_files=text,
        test_command=config.test_command,
        patch=reverse_diff(edit.path, buggy, source),
        metadata={
            "package": pkg.name,
            "version": pkg.version,
            "sha256": pkg.sha256,
            "edit_kind": edit.kind,
            "file": edit.path,
            "function": edit.function,
            "line": edit.line,
            "seed": config.seed,
            "miner": MINER_VERSION,
        },
    )


def held_back(
    instance_id: str, broke: list[str], passing: list[str], config: MineConfig
) -> list[str]:
    """``config.held_back`` of the task's tests, drawn by the seed and the task's id (sorted):
    as many of FAIL_TO_PASS as of PASS_TO_PASS in proportion, never every FAIL_TO_PASS test."""
    rng = random.Random(f"{config.seed}\0{instance_id}")
    k_broke = min(len(broke) - 1, round(len(broke) * config.held_back))
    k_pass = round(len(passing) * config.held_back)
    return sorted(rng.sample(broke, k_broke) + rng.sample(passing, k_pass))


ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def problem_statement(pkg: Sdist, broke: list[str], messages: dict[str, str]) -> str:
    """What fails, in the tests' words: their names and the first failure's error lines (memory
    addresses masked so the text is the same run to run). Never the file, line or edit."""
    listed = "\n".join(f"- `{t}`" for t in broke)
    first = ADDRESS.sub("0x...", messages.get(broke[0], "").strip())
    shown = f"\n\nThe first failure (`{broke[0]}`):\n\n```\n{first}\n```" if first else ""
    return (
        f"After a change to {pkg.name} {pkg.version}, {len(broke)} of its tests fail:\n\n"
        f"{listed}{shown}\n\nFind the bug in the package's code and fix it so that these tests "
        "pass again; the other tests must keep passing. Do not change the tests."
    )


def reverse_diff(path: str, buggy: str, fixed: str) -> str:
    """The reference fix: the unified diff from the buggy file back to the original."""
    lines = difflib.unified_diff(
        buggy.splitlines(keepends=True), fixed.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def deterministic_tarball(files: dict[str, bytes]) -> bytes:
    """A ``.tar.gz`` whose bytes depend on the files only (sorted, times and owners zero)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(files[path]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[path]))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def dump_rows(tasks: list[Task], path: Path) -> None:
    """JSONL rows whose snapshots are relative to the file (the directory moves as one)."""
    rows = []
    for task in tasks:
        row = task.model_dump(mode="json", exclude_none=True)
        row["snapshot"] = str(Path(task.snapshot or "").relative_to(path.parent.resolve()))
        row["FAIL_TO_PASS"], row["PASS_TO_PASS"] = row.pop("fail_to_pass"), row.pop("pass_to_pass")
        row["HELD_BACK"] = row.pop("held_back")
        rows.append(row)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
