"""The ``pod`` isolation mode: the pod (its runtime class) is the boundary, no namespaces needed.

Where the container runtime's seccomp profile refuses ``unshare``, ``mount`` and namespace
``clone`` (containerd's and Docker's default without ``CAP_SYS_ADMIN``), bubblewrap cannot build
its jail. This mode runs each command without new namespaces, under what an unprivileged process
can still set up for itself:

- a launcher (a few lines of Python, ``LAUNCHER``) sets ``no_new_privs`` and loads the sandbox's
  seccomp filter (``seccomp.filter_bpf(ip_sockets=False)``: the usual refusals plus every socket
  but ``AF_UNIX``, since the code shares the pod's network namespace and must reach neither the
  executor's own port nor anything the NetworkPolicy lets the pod reach), then executes
- ``setpriv`` to the session's leased uid with no capabilities (when the executor is root-capable:
  the rendered ``pod``/``auto`` sandbox pods run it as root with only ``SETUID``, ``SETGID``,
  ``CHOWN``, ``FOWNER``, ``DAC_OVERRIDE`` and ``KILL``), then
- ``prlimit`` with the session's rlimits, inside fresh memory/pids cgroups where they are writable;
- the command runs in its own workspace with its own ``/tmp`` (``HOME``/``TMPDIR``), a rebuilt
  environment, and the session directory sealed from other uids (``0711``, workspace and tmp
  ``0700``); afterwards every process of the session uid is killed, repeatedly until none is left.

What it does not give (docs/security.md lists it per promise; the runtime class must): a
filesystem view of its own (the code reads what the container's other uids may read, e.g. the
image, and sees the pod's process list and command lines, though it can signal, trace or read
the memory of none of them), a kernel boundary (gVisor or Kata), and the disk quota where the
executor cannot mount. A non-root executor has no uid to lease: its sessions run as its own uid,
so the code could signal the executor or read another session's workspace, and a process that
leaves its process group (``setsid``) outlives the command; one session per pod is the only
safe shape there, and ``gagar sandbox serve`` says so in its log.

``PodJail`` is the mode's ``jail.Jail`` (a peer of the others: it imports neither the session nor
another mode); ``check`` probes it in a directory sealed as a session's, as a leased uid.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

from gagar.sandbox import bwrap, runner
from gagar.sandbox.host import UidLease
from gagar.sandbox.jail import Cold, Run, View, backstop, cgroups, finish, host_env
from gagar.sandbox.runner import SECCOMP_FD, STATUS_FD
from gagar.sandbox.seccomp import filter_bpf
from gagar.sandbox.types import ExecResult, Limits, SandboxUnavailable

LAUNCHED = "launched"  # the status record the launcher writes just before it executes the command
# Runs as ``python -I -S -c``: no site, no environment, nothing read from the workspace (its cwd).
LAUNCHER = r"""
import ctypes, os, sys
bpf_fd, status_fd = int(sys.argv[1]), int(sys.argv[2])
bpf = b""
while chunk := os.read(bpf_fd, 65536):
    bpf += chunk
os.close(bpf_fd)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
buf = ctypes.create_string_buffer(bpf, len(bpf))
prog = Prog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
libc = ctypes.CDLL(None, use_errno=True)
ul = ctypes.c_ulong
if libc.prctl(38, ul(1), ul(0), ul(0), ul(0)) or libc.prctl(22, ul(2), ctypes.byref(prog), ul(0), ul(0)):
    err = os.strerror(ctypes.get_errno())
    os.write(2, f"gagar pod jail: cannot load the seccomp filter: {err}\n".encode())
    os._exit(126)
os.write(status_fd, b'{"launched": true}\n')
os.close(status_fd)
import signal
for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores both; an exec would inherit that
    signal.signal(sig, signal.SIG_DFL)
os.execv(sys.argv[3], sys.argv[3:])
"""
KILL_PASSES = 64  # a fork loop racing the sweep is bounded by RLIMIT_NPROC per pass


@cache
def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SandboxUnavailable(f"refusing to run untrusted code: {name} not found (util-linux)")
    return path


def pod_argv(uid: int | None, limits: Limits, cmd: list[str]) -> list[str]:
    """The command line: launcher (filter), privilege drop to ``uid`` (None: stay the executor's
    uid), rlimits, then ``cmd``."""
    argv = [sys.executable, "-I", "-S", "-c", LAUNCHER, SECCOMP_FD, STATUS_FD]
    if uid is not None:
        argv += [_tool("setpriv"), *bwrap.drop_argv(uid)[1:]]
    return argv + [_tool("prlimit"), *bwrap.rlimit_argv(limits)[1:], *cmd]


def seal(session_dir: Path) -> None:
    """Other uids may pass through the session directory (not list it) and see nothing inside."""
    os.chmod(session_dir, 0o711)
    for name in ("workspace", "tmp"):
        os.chmod(session_dir / name, 0o700)


class PodJail(Cold):
    """The ``pod`` mode; see the module docstring."""

    def run(self, view: View, argv: list[str], wall: float) -> ExecResult:
        cg = cgroups(view)
        full = pod_argv(view.uid, backstop(view.limits, cg is not None), argv)
        launch = runner.Launch(
            argv=cg.wrap(full) if cg else full,
            wall_time_s=wall,
            output_bytes=view.limits.output_bytes,
            env=host_env(view, view.uid),
            cwd=str(view.workspace),
            status_fd=True,
            seccomp=filter_bpf(ip_sockets=False),
        )
        # the launcher execs down to the command: the wait status is the command's own, and an
        # exit status above 128 stays one (a shell's `exit 152`, or its child's kill passed on:
        # the limit is then named only from what the executor finds, a file at the size limit)
        run = Run(cg, lambda: kill_leftovers(view.uid), not_started=_not_launched)
        return finish(view, lambda: runner.run(launch), run)


def _not_launched(outcome: runner.Outcome) -> str | None:
    """Why the launcher never started the command (its record missing), or None."""
    if outcome.timed_out or any(r.get(LAUNCHED) for r in outcome.status):
        return None
    return f"the pod jail did not start: {outcome.stderr.decode(errors='replace').strip()[-500:]}"


def kill_leftovers(uid: int | None) -> None:
    """Kill every process of the session uid and reap those re-parented to this executor (its
    subreaper), pass after pass until none is left: a fork loop racing the sweep is bounded by
    ``RLIMIT_NPROC``. Without a uid of its own the runner's kill of the process group is all
    there is: a process that left it (``setsid``) lives on."""
    if uid is None:
        return
    for _ in range(KILL_PASSES):
        runner.kill_uid(uid)
        if not _reap(uid):
            return
        time.sleep(0.001)


def _reap(uid: int) -> bool:
    """Reap our zombie children of ``uid``; whether any process of ``uid`` is still there."""
    for pid in runner.children():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                os.waitpid(pid, os.WNOHANG)
        except (FileNotFoundError, ChildProcessError):
            continue
    return any(_owned_by(pid, uid) for pid in runner.pids())


def _owned_by(pid: int, uid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except FileNotFoundError:
        return False


def check_root(root: str | None) -> None:
    """Refuse a session root that the sessions' uids could not pass through to their workspace."""
    path = os.path.realpath(root or tempfile.gettempdir())
    check_reachable(path, f"their workspaces under {path}", "a workspace root")


def check_reachable(path: str, what: str, give: str) -> None:
    """Refuse ``path`` where the sessions' uids could not pass through one of its directories
    (``what`` they would miss; ``give``: what to give instead)."""
    if os.geteuid() != 0:
        return  # no uid to switch to: the sessions run as the executor, who made the path
    where = Path(path)
    for d in (where, *where.parents):
        if not os.stat(d).st_mode & 0o001:
            raise SandboxUnavailable(
                f"the pod mode's session uids cannot pass through {d} (mode "
                f"{os.stat(d).st_mode & 0o777:o}) to reach {what}: give {give} every ancestor "
                "of which others may traverse (o+x)"
            )


@cache
def check() -> None:
    """Raise ``SandboxUnavailable`` unless a trivial command runs in this mode here (checked
    once): in a directory sealed as a session's, as a leased uid where the executor is root,
    under the launcher's filter, ``setpriv`` and ``prlimit``, in cgroups where it may make them."""
    lease = UidLease() if os.geteuid() == 0 else None
    uid = lease.uid if lease is not None else None
    probe = Path(tempfile.mkdtemp(prefix="gagar-pod-check-"))
    try:
        for name in ("workspace", "tmp"):
            (probe / name).mkdir()
            if uid is not None:
                os.chown(probe / name, uid, uid)
        seal(probe)
        tag = probe.name + "-" if uid is not None else None  # cgroups as a session has them
        view = View(probe, uid, Limits(wall_time_s=20), cgroup_tag=tag)
        result = PodJail().run(view, ["true"], 20.0)
    finally:
        if lease is not None:
            lease.release()
        shutil.rmtree(probe, ignore_errors=True)
    if not result.ok:
        raise SandboxUnavailable(
            f"refusing to run untrusted code: the pod mode cannot start a command here "
            f"({result.describe()}; {result.stderr.strip()[-300:]})"
        )


__all__ = ["LAUNCHER", "PodJail", "check", "kill_leftovers", "pod_argv", "seal"]
