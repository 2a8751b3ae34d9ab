"""The isolation modes' one contract: ``Jail``, the ``View`` it runs in, and the end of every run.

A ``LocalSession`` picks its jail once, when it is created, from the isolation its factory
resolved (``local.JAILS``); every ``exec`` then hands the jail a ``View`` of the session (its
directory, uid, limits, the bubblewrap layout) and the command. The modes are peers, each in a
file of its own, none importing the session or another mode (an import-linter contract in
``pyproject.toml`` keeps it so):

- ``nojail.py``: ``isolation="none"``, rlimits only (development on trusted code);
- ``bwrapjail.py``: a bubblewrap jail per command (``bwrap.py`` builds its command line);
- ``podjail.py``: no namespaces, the pod's runtime class the boundary (a stock runc node);
- ``warm.py``: the warm test runner, Python commands forked from a fork server in a bubblewrap
  jail of the session's, wrapping the cold jail it falls back to.

What is the same in every mode lives here, once: the rlimits a jail sets (``backstop``: with
the cgroups as the exact bounds, the rlimits only back them up), the cgroups of a run
(``cgroups``), and the end of a run (``finish``): wait for it, read the cgroups' counters, kill
what is left, remove the cgroups, classify the limit hit from the executor's own observations
(``classify.py``), build the ``ExecResult``. What a mode protects against is in its own
docstring and ``docs/security.md``.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gagar.sandbox import bwrap, quota, runner, workspace
from gagar.sandbox.cgroup import Cgroup
from gagar.sandbox.classify import classify
from gagar.sandbox.types import ExecResult, Limits

RLIMIT_OF = {  # Limits field -> the rlimit ``prlimit`` sets from it
    "memory_bytes": resource.RLIMIT_AS,
    "processes": resource.RLIMIT_NPROC,
    "open_files": resource.RLIMIT_NOFILE,
    "file_size_bytes": resource.RLIMIT_FSIZE,
    "cpu_time_s": resource.RLIMIT_CPU,
}


@dataclass(frozen=True)
class View:
    """A session as its jail sees it for one run (the session makes one per ``exec``)."""

    dir: Path  # the session directory: workspace/, tmp/, etc/
    uid: int | None  # the session's leased uid; None: the executor's own (not root)
    limits: Limits
    layout: bwrap.Jail | None = None  # a bubblewrap jail's mounts, environment and waiter
    cgroup_tag: str | None = None  # each run in fresh cgroups named with this; None: none
    quota: bool = False  # the session directory is a quota tmpfs (``quota.py``)
    venv: str | None = None  # the task environment's virtual environment (``venvs.py``)

    @property
    def workspace(self) -> Path:
        return self.dir / "workspace"

    @property
    def tmp(self) -> Path:
        return self.dir / "tmp"


class Jail(Protocol):
    """One isolation mode: how a session's commands run."""

    def run(self, view: View, argv: list[str], wall: float) -> ExecResult:
        """``argv`` run in ``view``, at most ``wall`` seconds; only the executor's observations
        decide the result."""
        ...

    @property
    def serving(self) -> bool:
        """A process outlives the commands (a fork server) and holds the session's mounts."""
        ...

    def unfit(self) -> str | None:
        """Why this jail must not serve another verification candidate (``station.py``)."""
        ...

    def stop(self) -> None:
        """End whatever outlives a command (idempotent)."""
        ...


class Cold:
    """What a jail that starts every command afresh says to the rest of the ``Jail`` protocol."""

    serving = False

    def unfit(self) -> str | None:
        return "no warm runner"

    def stop(self) -> None:
        pass


@dataclass(frozen=True)
class Run:
    """How a mode's run ends: its cgroups, what else is left to kill, who started it."""

    cg: Cgroup | None = None
    kill: Callable[[], object] = lambda: None  # run before the cgroups go (they kill the rest)
    jailed: bool = False  # bubblewrap in between: its status records, its waiter's report
    # why the mode's launcher never started the command (its record missing), or None
    not_started: Callable[[runner.Outcome], str | None] = lambda outcome: None


def within_inherited(limits: Limits) -> Limits:
    """``limits`` lowered to the hard rlimits this executor inherited: the jail runs unprivileged
    and cannot raise them, so asking for more would fail every command."""
    lower = {}
    for name, res in RLIMIT_OF.items():
        hard = resource.getrlimit(res)[1]
        slack = 1 if name == "cpu_time_s" else 0  # prlimit's hard CPU limit is one second above
        if hard != resource.RLIM_INFINITY and getattr(limits, name) + slack > hard:
            lower[name] = max(hard - slack, 1)
    return limits.model_copy(update=lower) if lower else limits


def backstop(limits: Limits, cgroup: bool) -> Limits:
    """The rlimits of a jailed process. With the cgroups as the exact bounds, the rlimits are
    backstops: the address-space one only stops absurd reservations, and RLIMIT_NPROC (which
    counts every process of the uid, a dying one of the last command too) must not fire before
    ``pids.max`` does, or a fork bomb ends with EAGAIN that no counter of the executor's own saw."""
    if cgroup:
        update = {"memory_bytes": limits.memory_bytes * 4, "processes": limits.processes * 2}
        limits = limits.model_copy(update=update)
    return within_inherited(limits)


def cgroups(view: View) -> Cgroup | None:
    """Fresh memory, pids and cpuacct groups for one run (or a fork server), where the session
    has them."""
    if view.cgroup_tag is None:
        return None
    return Cgroup.create(view.limits.memory_bytes, view.limits.processes, view.cgroup_tag)


def finish(view: View, wait: Callable[[], runner.Outcome], run: Run) -> ExecResult:
    """The end of every run, in every mode: ``wait()`` for it (an ``OSError``: it never started),
    read its cgroups' counters, kill what is left (``run.kill``, then the cgroups: no process can
    leave its cgroup unprivileged), classify the limit hit from the executor's observations and
    build the ``ExecResult``."""
    try:
        outcome = wait()
    except OSError as e:
        return ExecResult(exit_code=None, infra_error=f"cannot start the command: {e}")
    finally:
        stats = run.cg.stats() if run.cg else None
        run.kill()  # first: our unreaped zombies would keep the groups busy
        if run.cg:
            run.cg.destroy()
    ended = outcome.signal is not None or (outcome.exit_code or 0) > 128  # only then look
    result = classify(
        outcome,
        view.limits,
        stats,
        jailed=run.jailed,
        disk_full=disk_full(view),
        file_at_limit=ended and file_at_limit(view),
    )
    why = run.not_started(outcome)
    return result.model_copy(update={"infra_error": why}) if why else result


def host_env(view: View, uid: int | None) -> dict[str, str]:
    """The sandbox's environment for a command without a filesystem view of its own (no
    bubblewrap): the session's own ``/tmp`` stands for ``/tmp``; the task environment's
    ``bin`` first on ``PATH`` where the session has one."""
    bins = [os.path.join(view.venv, "bin")] if view.venv else []
    env = bwrap.sandbox_env([*bins, os.path.dirname(sys.executable)], uid, view.venv)
    env["HOME"] = env["TMPDIR"] = str(view.tmp)
    return env


def file_at_limit(view: View) -> bool:
    """A file of the session at the size limit: what ``RLIMIT_FSIZE`` leaves when it fires
    (bubblewrap's status cannot tell its SIGXFSZ from an ``exit 153``)."""
    return any(
        not isinstance(st, bytes) and st.st_size >= view.limits.file_size_bytes
        for _, st in workspace.walk(view.dir, ignored=frozenset())
    )


def disk_full(view: View) -> bool:
    """Out of quota: the tmpfs is full or, without one (a non-root executor cannot mount), the
    workspace and ``/tmp`` hold more than the limits (measured after the fact: reported, not
    prevented; the pod's emptyDir ``sizeLimit`` is the bound there)."""
    if view.quota:
        return quota.full(view.dir)
    used, entries = workspace.usage(view.dir)
    return used > view.limits.disk_bytes or entries > view.limits.inodes


__all__ = [
    "Cold",
    "Jail",
    "Run",
    "View",
    "backstop",
    "cgroups",
    "finish",
    "host_env",
    "within_inherited",
]
