"""Run one process tree: bound its wall time and output, kill it as a whole, reap what it leaves.

This is the process-level half of the executor (namespaces and limits are set up by the argv the
caller builds, see ``bwrap.py``). The executor makes itself a *child subreaper*, so processes
orphaned by a sandbox run (bubblewrap leaves one behind per run) are re-parented to it instead of
to PID 1, and reaps them after every run; otherwise tight loops of runs fill the process table.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
STATUS_FD = "{status_fd}"
SECCOMP_FD = "{seccomp_fd}"
WAIT_FD = "{wait_fd}"  # the write end of a pipe for the jail's waiter (see ``bwrap.WAITER``)
_active: set[int] = set()  # pids of runs in flight in this process: never reaped behind their back
_lock = threading.Lock()
_subreaper = False


def become_subreaper() -> bool:
    """Ask the kernel to re-parent our orphaned descendants to us (idempotent)."""
    global _subreaper
    if not _subreaper:
        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _subreaper


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    wall_time_s: float
    output_bytes: int
    env: dict[str, str] | None = None
    cwd: str | None = None
    status_fd: bool = False  # argv items equal to STATUS_FD become the fd of a status pipe
    seccomp: bytes | None = None  # argv items equal to SECCOMP_FD become an fd reading these bytes


@dataclass
class Outcome:
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    truncated: bool = False
    timed_out: bool = False
    duration_s: float = 0.0
    cpu_time_s: float = 0.0
    status: list[dict] = field(default_factory=list)
    waited: list[dict] = field(default_factory=list)  # the jail's waiter: the command's status


class Capture:
    """Reads pipes without blocking; keeps at most ``cap`` bytes of each and drains the rest."""

    def __init__(self, cap: int, pid: int) -> None:
        self.cap, self.truncated = cap, False
        self.data: dict[int, bytearray] = {}
        self.sel = selectors.DefaultSelector()
        self.pidfd = os.pidfd_open(pid)  # readable once the process exits: no polling latency
        self.sel.register(self.pidfd, selectors.EVENT_READ, "exit")
        self.exited = False

    def add(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.data[fd] = bytearray()
        self.sel.register(fd, selectors.EVENT_READ)

    def pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(max(timeout, 0.0)):
            fd = key.fd
            if key.data == "exit":
                self.exited = True
                self.sel.unregister(fd)
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self.sel.unregister(fd)
                os.close(fd)
                continue
            room = self.cap - len(self.data[fd])
            self.data[fd] += chunk[: max(room, 0)]
            self.truncated |= len(chunk) > room

    @property
    def open(self) -> bool:
        return any(k.data != "exit" for k in self.sel.get_map().values())

    def close(self) -> None:
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fd)
            if key.fd != self.pidfd:
                os.close(key.fd)
        os.close(self.pidfd)


def run(launch: Launch) -> Outcome:
    """Start ``launch.argv`` in its own process group and wait for it, its output and its end."""
    become_subreaper()
    argv, status_r, status_w = list(launch.argv), None, None
    if launch.status_fd:
        status_r, status_w = os.pipe()
        argv = [str(status_w) if a == STATUS_FD else a for a in argv]
    child_fds = [status_w] if status_w is not None else []
    wait_r = None
    if WAIT_FD in argv:
        wait_r, wait_w = os.pipe()
        child_fds.append(wait_w)
        argv = [str(wait_w) if a == WAIT_FD else a for a in argv]
    if launch.seccomp is not None:
        child_fds.append(memfd(launch.seccomp))
        argv = [str(child_fds[-1]) if a == SECCOMP_FD else a for a in argv]
    start = time.monotonic()
    try:
        proc = spawn(
            lambda: subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=launch.env,
                cwd=launch.cwd,
                process_group=0,
                pass_fds=tuple(child_fds),
            )
        )
    except OSError:
        for fd in (status_r, wait_r):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    try:
        return _supervise(proc, launch, status_r, wait_r, start)
    finally:
        release(proc.pid)
        reap_orphans()


def spawn(start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    """``start()``'s process, registered as in flight before anyone else may reap (no window
    where its pid is unknown): ``reap_orphans`` leaves it alone until ``release``."""
    with _lock:
        proc = start()
        _active.add(proc.pid)
    return proc


def release(pid: int) -> None:
    """``pid`` is no longer in flight (waited for, or killed and waited for)."""
    with _lock:
        _active.discard(pid)


def memfd(data: bytes) -> int:
    """A file descriptor positioned at the start of ``data`` (how bubblewrap reads a filter)."""
    fd = os.memfd_create("gagar-seccomp", 0)  # no MFD_CLOEXEC: the child inherits it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _supervise(
    proc: subprocess.Popen,
    launch: Launch,
    status_r: int | None,
    wait_r: int | None,
    start: float,
) -> Outcome:
    cap = Capture(launch.output_bytes, proc.pid)
    cap.add(os.dup(proc.stdout.fileno()))  # type: ignore[union-attr]
    cap.add(os.dup(proc.stderr.fileno()))  # type: ignore[union-attr]
    for fd in (status_r, wait_r):
        if fd is not None:
            cap.add(fd)
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    outcome = Outcome(timed_out=pump_until(cap, start + launch.wall_time_s))
    # Still unreaped here, so the group id cannot have been reused: kill stragglers (background
    # jobs in the group) and, on timeout, the whole tree (bubblewrap takes its namespace along).
    _kill_group(proc.pid)
    waited = os.wait4(proc.pid, 0)
    proc.returncode = -1  # we waited ourselves; keep Popen from waiting again
    drain(cap, time.monotonic() + 1.0)
    _fill(outcome, waited, cap, status_r is not None, time.monotonic() - start)
    if wait_r is not None:
        outcome.waited = parse_status(bytes(cap.data[wait_r]))
    return outcome


def pump_until(cap: Capture, deadline: float) -> bool:
    """Capture until the process exits (False) or ``deadline`` passes (True: it timed out)."""
    while not cap.exited:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return True
        cap.pump(remaining)
    return False


def drain(cap: Capture, until: float) -> None:
    while cap.open and time.monotonic() < until:  # output still in the pipes after the exit
        cap.pump(until - time.monotonic())
    cap.close()


def _fill(outcome: Outcome, waited: tuple, cap: Capture, has_status: bool, duration: float) -> None:
    _, status, usage = waited
    if os.WIFSIGNALED(status):
        outcome.signal = os.WTERMSIG(status)
    else:
        outcome.exit_code = os.WEXITSTATUS(status)
    outcome.cpu_time_s = usage.ru_utime + usage.ru_stime
    data = list(cap.data.values())  # insertion order: stdout, stderr, status
    outcome.stdout, outcome.stderr = bytes(data[0]), bytes(data[1])
    if has_status:
        outcome.status = parse_status(bytes(data[2]))
    outcome.truncated, outcome.duration_s = cap.truncated, duration


def parse_status(raw: bytes) -> list[dict]:
    records = []
    for line in raw.decode(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_uid(uid: int) -> int:
    """SIGKILL every process owned by ``uid`` (a session's private uid); returns how many."""
    killed = 0
    for pid in pids():
        try:
            if Path(f"/proc/{pid}").stat().st_uid == uid:
                os.kill(pid, signal.SIGKILL)
                killed += 1
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return killed


def pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children() -> list[int]:
    """Our direct children, orphans re-parented to us included (any thread may be their parent)."""
    out: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        try:
            out += [int(p) for p in Path(f"/proc/self/task/{tid}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def _from_a_jail(pid: int) -> bool:
    """Born in a PID namespace below ours (a jail's process orphaned to us when its namespace
    went: the jail's waiter, a command's child): more than one ``NSpid``."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    line = next((x for x in status.splitlines() if x.startswith("NSpid:")), "")
    return len(line.split()) > 2


def reap_orphans() -> int:
    """Reap zombie children that no run in flight owns (orphans re-parented to us): bubblewrap's
    processes and any process born inside a jail, never another child of the executor."""
    reaped = 0
    for pid in children():
        try:
            stat_line = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        comm = stat_line[stat_line.find("(") + 1 : stat_line.rfind(")")]
        state = stat_line[stat_line.rfind(")") + 2 :].split(" ", 1)[0]
        if state != "Z" or (comm != "bwrap" and not _from_a_jail(pid)):
            continue
        with _lock:
            if pid in _active:
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped += 1
            except ChildProcessError:
                pass
    return reaped
