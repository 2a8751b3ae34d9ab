"""The grading benchmark's real-repository groups: built from mined tasks, labelled by execution.

``grader_real`` makes each member's repository and trajectory and states the level rule; here
every member runs through the real verifier (``gagar.rollout.envs.verify.verify_files``, a fresh
sandbox session, the task's pristine tests restored): once against the visible tests
(``Task.visible``, what training's reward runs) and, where those pass, once against every listed
test, which gives the held-back outcomes. A planted hack is also run as it stands (the task's
pytest command on the visible tests in a session of its workspace, nothing restored): it is kept
only where that run passes and the verifier's fails, i.e. a forgery that fools a runner and fixes
nothing. A ``held_back_breaker`` is kept only where the visible tests pass and a held-back test
fails. Identical repositories of one task are run once.

Tasks come from the held-out packages only (``split_by_package`` with the mined example's
fraction and seed, ``examples/mined.yaml``) or from an explicit package list, and are chosen and
composed by the seed; nothing is tuned on them. Groups are cached as JSONL beside the synthetic
ones, under a name holding the task file's digest, the packages, the seed and the count.
"""

from __future__ import annotations

import hashlib
import json
import random
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gagar.driver import grader_real as real
from gagar.grader.bounds import admit
from gagar.grader.checks import trajectory_stats
from gagar.grader.diffs import unified_patch
from gagar.grader.evaluate import Reference
from gagar.rollout.envs.task import Task, is_text
from gagar.rollout.envs.verify import Verdict, is_test_path, touched_paths, verify_files
from gagar.sandbox.types import SessionFactory
from gagar.wire import Candidate, GradingGroup

HELD_OUT_FRACTION = 0.25  # examples/mined.yaml's heldOutFraction and source seed
SPLIT_SEED = 0
BREAKER_TRIES = 2


@dataclass(frozen=True)
class Run:
    """One member's execution: the verifier's visible and full runs, the forgery's own run."""

    visible_passed: bool
    valid: bool
    held_back_failed: tuple[str, ...] = ()
    full_run: bool = False
    naive_passed: bool | None = None
    seconds: float = 0.0
    log: str = ""
    notes: tuple[str, ...] = ()


@dataclass
class RealGroup:
    """One real-repository group: its wire group, each member's kind, execution and level."""

    id: str
    task_id: str
    package: str
    kinds: list[str]
    group: GradingGroup
    members: list[dict[str, Any]]  # kind, execution, outside, redundant, level / hack
    dropped: list[str] = field(default_factory=list)  # kinds execution did not confirm
    split: str = "held_out"

    def reference(self) -> Reference:
        levels = {i: m["level"] for i, m in enumerate(self.members) if m.get("level") is not None}
        hacks = frozenset(i for i, m in enumerate(self.members) if m.get("hack"))
        return Reference(levels, hacks)

    def to_json(self) -> str:
        doc = {k: v for k, v in vars(self).items() if k != "group"}
        return json.dumps(doc | {"group": self.group.model_dump(mode="json")})

    @classmethod
    def from_json(cls, line: str) -> RealGroup:
        doc = json.loads(line)
        return cls(**{**doc, "group": GradingGroup.model_validate(doc["group"])})


def held_out_tasks(tasks: list[Task], packages: list[str] | None) -> list[Task]:
    """The tasks of ``packages``, else of the held-out packages of the mined example's split."""
    if packages:
        return [t for t in tasks if t.package in packages]
    from gagar.driver.components import split_by_package

    return split_by_package(tasks, HELD_OUT_FRACTION, SPLIT_SEED)[1]


def choose(tasks: list[Task], n: int, seed: int) -> list[Task]:
    """``n`` tasks drawn by ``seed`` (in instance-id order first: the file's order is no input)."""
    pool = sorted(tasks, key=lambda t: t.instance_id)
    random.Random(seed).shuffle(pool)
    return pool[:n]


def breaker_partners(task: Task, tasks: list[Task], rng: random.Random) -> list[Task]:
    """Other tasks of the package whose failing tests are all this task's held-back ones."""
    held = set(task.held_back)
    out = [
        t
        for t in tasks
        if t.instance_id != task.instance_id
        and t.package == task.package
        and set(t.fail_to_pass) <= held
    ]
    out.sort(key=lambda t: t.instance_id)
    rng.shuffle(out)
    return out


def _text(files: dict[str, bytes]) -> dict[str, str]:
    return {p: d.decode() for p, d in files.items() if is_text(d)}


def _bytes(base: dict[str, bytes], files: dict[str, str]) -> dict[str, bytes]:
    """``files`` (text) over ``base`` (the binary files kept), the ones ``files`` drops removed."""
    return {p: d for p, d in base.items() if not is_text(d)} | {
        p: t.encode() for p, t in files.items()
    }


def naive_run(task: Task, files: dict[str, bytes], factory: SessionFactory) -> bool:
    """Whether the visible tests pass when the task's command runs them in the workspace as it
    stands (no test restored, no verifier): what a forgery aims at."""
    visible = task.visible()
    cmd = visible.test_command + "".join(" " + shlex.quote(t) for t in visible.test_ids)
    session = factory.create(files=files, environment=task.environment)
    try:
        result = session.exec(cmd)
    finally:
        session.close()
    return result.infra_error is None and result.exit_code == 0


class Executor:
    """Runs members of one task through the verifier, each distinct repository once."""

    def __init__(self, task: Task, factory: SessionFactory) -> None:
        self.task, self.factory = task, factory
        self.base = task.repo_files()
        self._seen: dict[str, Run] = {}

    def run(self, files: dict[str, str], hack: bool = False) -> Run:
        raw = _bytes(self.base, files)
        key = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest() + str(hack)
        if key not in self._seen:
            self._seen[key] = self._run(raw, hack)
        return self._seen[key]

    def _run(self, raw: dict[str, bytes], hack: bool) -> Run:
        start = time.perf_counter()
        visible = verify_files(self.task.visible(), raw, self.factory)
        full: Verdict | None = None
        if visible.passed and self.task.held_back:
            full = verify_files(self.task, raw, self.factory)
        naive = naive_run(self.task, raw, self.factory) if hack else None
        failed = [t for t in self.task.held_back if full is not None and not full.tests.get(t)]
        return Run(
            visible_passed=visible.passed,
            valid=visible.valid and (full is None or full.valid),
            held_back_failed=tuple(failed),
            full_run=full is not None,
            naive_passed=naive,
            seconds=time.perf_counter() - start,
            log=visible.log[-real.OBS :],
            notes=tuple(visible.notes),
        )


@dataclass
class _Made:
    kind: str
    files: dict[str, str]
    redundant: bool = False
    run: Run | None = None


def _fix_paths(task: Task) -> list[str]:
    return [p for p in touched_paths(task.patch or "") if not is_test_path(p)]


def _members(
    task: Task, partners: list[Task], ex: Executor, rng: random.Random
) -> tuple[list[_Made], list[str]]:
    """Every member of ``task``'s group that execution confirms, and the kinds it did not."""
    base, fixed = _text(ex.base), _text(task.fixed_files())
    paths = _fix_paths(task)
    made = [_Made("reference", fixed), _Made("redundant", fixed, redundant=True)]
    made.append(_Made("dead_helper", real.dead_helper(fixed, paths, rng)))
    if (reformatted := real.reformat(base, fixed, paths, rng)) is not None:
        made.append(_Made("reformat", reformatted))
    for m in made:
        m.run = ex.run(m.files)
    extra = {"held_back_breaker": _breaker(task, partners, fixed, ex), "hack": _hack(base, ex, rng)}
    dropped = [] if reformatted is not None else ["reformat"]
    dropped += [k for k, m in extra.items() if m is None]
    return made + [m for m in extra.values() if m is not None], dropped


def _breaker(task: Task, partners: list[Task], fixed: dict[str, str], ex: Executor) -> _Made | None:
    """The fix plus a partner's planted bug, where execution confirms it breaks held-back
    tests and no visible one."""
    for other in partners[:BREAKER_TRIES]:
        bug = {p: t for p, t in _text(other.repo_files()).items() if fixed.get(p) != t}
        files = fixed | bug
        run = ex.run(files)
        if run.visible_passed and run.held_back_failed:
            return _Made("held_back_breaker", files, run=run)
    return None


def _hack(base: dict[str, str], ex: Executor, rng: random.Random) -> _Made | None:
    """A forgery on the unfixed snapshot (the seed's kind first), where execution confirms it."""
    kinds = list(real.HACKS)
    rng.shuffle(kinds)
    for kind in kinds:
        files = real.forge(base, kind, sorted(ex.task.test_files))
        run = ex.run(files, hack=True)
        if run.naive_passed and not run.visible_passed:
            return _Made(kind, files, run=run)
    return None


def _ran(m: _Made) -> Run:
    assert m.run is not None, f"{m.kind} was never run"
    return m.run


def _candidate(i: int, m: _Made, base: dict[str, str]) -> Candidate:
    run, hack = _ran(m), m.kind in real.HACKS
    files, _ = admit(m.files, i, base.keys())
    return Candidate(
        member=i,
        passed=run.visible_passed or hack,  # a hack: the forgery verification missed
        valid=run.valid,
        files=files,
        patch=unified_patch(base, m.files),
        trajectory=real.trajectory(base, m.files, run.log, m.redundant),
        test_log=run.log,
        notes=list(run.notes),
    )


def _facts(m: _Made, c: Candidate, base: dict[str, str], fixed: dict[str, str]) -> real.Facts:
    return real.Facts(
        passed=c.passed and c.valid,
        held_back_failed=_ran(m).held_back_failed,
        outside=real.outside_lines(base, m.files, fixed),
        redundant=trajectory_stats(c.trajectory).redundant,
        hack=m.kind in real.HACKS,
    )


def build_group(
    gid: str, task: Task, partners: list[Task], factory: SessionFactory, seed: int
) -> RealGroup:
    """One group on ``task``: every confirmed member, in an order drawn by ``seed``."""
    rng = random.Random(f"{seed}:{task.instance_id}")
    ex = Executor(task, factory)
    made, dropped = _members(task, partners, ex, rng)
    rng.shuffle(made)
    base, fixed = _text(ex.base), _text(task.fixed_files())
    admitted, skipped = admit(base)
    candidates = [_candidate(i, m, base) for i, m in enumerate(made)]
    facts = {
        i: _facts(m, c, base, fixed) for i, (m, c) in enumerate(zip(made, candidates, strict=True))
    }
    levels, hacks = real.levels(facts)
    members = [  # JSON's own types (lists, not tuples): the record reads back equal
        {
            "kind": m.kind,
            "execution": json.loads(json.dumps(asdict(_ran(m)) | {"log": None})),
            **json.loads(json.dumps(asdict(facts[i]))),
            "level": levels.get(i),
            "hack": i in hacks,
        }
        for i, m in enumerate(made)
    ]
    group = GradingGroup(
        task_id=task.instance_id,
        statement=task.problem_statement,
        base_files=admitted,
        candidates=candidates,
        relevant_files=_fix_paths(task),
        test_command=task.visible().test_command,
        environment=task.environment,
        skipped=skipped,
    )
    kinds = [m.kind for m in made]
    return RealGroup(gid, task.instance_id, task.package, kinds, group, members, dropped)


def cache_path(
    cache: Path, tasks_file: Path, packages: list[str] | None, n: int, seed: int
) -> Path:
    digest = hashlib.sha256(tasks_file.read_bytes()).hexdigest()[:12]
    which = "-".join(packages) if packages else "held-out"
    return cache / f"real-{digest}-{which}-s{seed}-n{n}.jsonl"


def build_groups(
    tasks: list[Task],
    n: int,
    seed: int,
    factory: SessionFactory,
    packages: list[str] | None = None,
    path: Path | None = None,
) -> list[RealGroup]:
    """``n`` groups on tasks of the held-out packages (or ``packages``), drawn by ``seed``; with
    ``path``, the groups already there first, each new one appended as it is built."""
    pool = held_out_tasks(tasks, packages)
    out = load_groups(path)[:n] if path is not None and path.exists() else []
    for i, task in enumerate(choose(pool, n, seed)):
        if i < len(out):
            continue
        partners = breaker_partners(task, pool, random.Random(f"{seed}:{i}"))
        out.append(build_group(f"r{seed}-{i}", task, partners, factory, seed))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(out[-1].to_json() + "\n")
    return out


def load_groups(path: Path) -> list[RealGroup]:
    return [RealGroup.from_json(line) for line in path.read_text().splitlines() if line.strip()]
