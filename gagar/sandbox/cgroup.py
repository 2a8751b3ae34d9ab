"""Optional cgroup v1 memory and pids controllers for one run: trusted OOM and fork-limit reports.

Rlimits bound a run everywhere, but only the kernel's cgroup counters say *why* a run died without
trusting its output (``oom_kill`` in ``memory.oom_control``, ``max`` in ``pids.events``). Used when
the hierarchy is writable (root on a cgroup v1 host); otherwise ``Cgroup.create`` returns None and
the rlimits stand alone. Not cgroup v2: the unified hierarchy needs delegation this host lacks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_path(controller: str) -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return ROOT / controller / path.lstrip("/")
    return None


@dataclass(frozen=True)
class Stats:
    oom_killed: bool
    pids_max_hit: bool
    cpu_time_s: float | None  # whole tree, from cpuacct (wait4 does not see past bubblewrap)


@dataclass(frozen=True)
class Cgroup:
    memory: Path
    pids: Path
    cpuacct: Path | None = None

    @classmethod
    def create(cls, memory_bytes: int, processes: int, tag: str = "") -> Cgroup | None:
        """``tag``: a prefix of the groups' names (a session's), for ``destroy_tagged``."""
        mem, pids, cpu = _own_path("memory"), _own_path("pids"), _own_path("cpuacct")
        if mem is None or pids is None or not (mem / "cgroup.procs").exists():
            return None
        name = f"gagar-{tag}{uuid.uuid4().hex[:12]}"
        cpu_dir = _try_mkdir(cpu / name) if cpu is not None else None
        try:
            (mem / name).mkdir()
            (pids / name).mkdir()
            (mem / name / "memory.limit_in_bytes").write_text(str(memory_bytes))
            with contextlib.suppress(OSError):  # absent without swap accounting
                (mem / name / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (pids / name / "pids.max").write_text(str(processes))
        except OSError:
            for d in (mem / name, pids / name, cpu_dir):
                if d is not None:
                    with contextlib.suppress(OSError):
                        d.rmdir()
            return None
        return cls(mem / name, pids / name, cpu_dir)

    def wrap(self, argv: list[str]) -> list[str]:
        """Prefix that moves the launcher into both groups before it execs ``argv``."""
        dirs = [d for d in (self.memory, self.pids, self.cpuacct) if d is not None]
        script = 'for f in $0; do echo $$ > "$f" || exit 125; done; exec "$@"'
        procs = " ".join(str(d / "cgroup.procs") for d in dirs)
        return ["/bin/sh", "-c", script, procs, *argv]

    def add(self, pid: int) -> None:
        """Move ``pid`` into every group (a warm run, held by its fork server until then)."""
        for d in (self.memory, self.pids, self.cpuacct):
            if d is not None:
                (d / "cgroup.procs").write_text(str(pid))

    def kill(self) -> None:
        """SIGKILL whatever is inside until nothing is; the groups stay (for ``stats``)."""
        for _ in range(50):
            pids = _procs(self.pids)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def stats(self) -> Stats:
        oom = _field(self.memory / "memory.oom_control", "oom_kill")
        pids_max = _field(self.pids / "pids.events", "max")
        cpu = None
        if self.cpuacct is not None:
            cpu = _field_raw(self.cpuacct / "cpuacct.usage") / 1e9
        return Stats(oom_killed=oom > 0, pids_max_hit=pids_max > 0, cpu_time_s=cpu)

    def destroy(self) -> None:
        """Kill whatever is still inside, then remove both groups."""
        for d in (self.memory, self.pids, self.cpuacct):
            if d is not None:
                _kill_and_remove(d)


def _kill_and_remove(d: Path) -> None:
    for _ in range(50):
        for pid in _procs(d):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def destroy_tagged(tag: str) -> int:
    """Kill and remove every group ``create`` made with ``tag`` (a dead session's, whatever
    their age or content); returns how many."""
    removed = 0
    for controller in ("memory", "pids", "cpuacct"):
        parent = _own_path(controller)
        if tag and parent is not None and parent.is_dir():
            for d in parent.glob(f"gagar-{tag}*"):
                _kill_and_remove(d)
                removed += not d.exists()
    return removed


def sweep_stale(min_age_s: float = 600.0) -> int:
    """Remove empty ``gagar-*`` groups left by an executor that was killed mid-run.

    Only groups older than ``min_age_s`` are touched, so a group another executor is setting up
    right now is never removed under it; a group with processes cannot be removed at all.
    """
    removed = 0
    for controller in ("memory", "pids", "cpuacct"):
        parent = _own_path(controller)
        if parent is None or not parent.is_dir():
            continue
        for d in parent.glob("gagar-*"):
            try:
                if time.time() - d.stat().st_mtime > min_age_s and not _procs(d):
                    d.rmdir()
                    removed += 1
            except OSError:
                continue
    return removed


def _procs(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _field(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def _field_raw(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def _try_mkdir(d: Path) -> Path | None:
    try:
        d.mkdir()
    except OSError:
        return None
    return d
