"""The command line that jails one command: bubblewrap namespaces, a privilege drop, rlimits.

Pure: builds argv lists from a ``Jail`` description, touches nothing. The layout inside:

- ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin`` links), the Python installation(s) the executor
  names, and a handful of ``/etc`` files needed to run programs, all read-only;
- fresh ``/proc``, a minimal ``/dev`` with a writable, size-limited ``/dev/shm`` (a tmpfs of its
  own: ``multiprocessing`` locks work); ``/workspace`` (the session's workspace, read-write) and
  ``/tmp`` (a per-session directory on disk, read-write); nothing else of the host exists;
- new PID, network (only a loopback of its own), IPC, UTS, mount and cgroup namespaces, a new
  session (no terminal injection), killed with the executor (``--die-with-parent``);
- then, when the executor is root, ``setpriv`` drops to the session's private uid with no
  capabilities and ``no_new_privs`` (a private non-root uid is what makes ``RLIMIT_NPROC`` bind:
  the kernel exempts uid 0, even behind a user namespace's mapping); when it is not root,
  bubblewrap runs unprivileged inside a user namespace instead;
- a seccomp filter (``seccomp.py``) loaded by bubblewrap just before the command runs;
- ``prlimit`` sets CPU time, address space, process count, open files, file size and no core dumps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from gagar.sandbox.runner import SECCOMP_FD, STATUS_FD, WAIT_FD
from gagar.sandbox.types import Limits

WORKDIR = "/workspace"
# /etc entries programs need to start (dynamic linker cache, alternatives links, time zone).
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime")
TOP_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}  # bubblewrap's own


# The jail's waiter, between bubblewrap and the command: bubblewrap reports a child killed by
# signal N as 128+N, the same as ``exit 128+N``; the waiter reports the wait status itself, on a
# pipe the command does not inherit (close-on-exec before the fork), then exits as bubblewrap
# would. Perl where the host has it (Debian's perl-base is essential; 2 ms of CPU), else the
# executor's own Python (``-I -S``: nothing of the workspace, no site; 10 ms of CPU).
PERL_WAITER = r"""my $fd = shift @ARGV;
open(my $w, ">&=", $fd) or exit 126;
fcntl($w, 2, 1);  # F_SETFD, FD_CLOEXEC
my $pid = fork;
exit 126 unless defined $pid;
if ($pid == 0) {
    exec { $ARGV[0] } @ARGV;
    print STDERR "$ARGV[0]: $!\n";
    exit 127;
}
waitpid($pid, 0);
my $st = $?;
if ($st & 127) {
    syswrite($w, sprintf(qq({"signal": %d}\n), $st & 127));
    exit(128 + ($st & 127));
}
syswrite($w, sprintf(qq({"exit": %d}\n), $st >> 8));
exit($st >> 8);
"""
WAITER = """import os, signal, sys
fd = int(sys.argv[1])
os.set_inheritable(fd, False)
pid = os.fork()
if pid == 0:
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them: the command must not
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as e:
        os.write(2, ("%s: %s\\n" % (sys.argv[2], e.strerror)).encode())
        os._exit(127)
st = os.waitpid(pid, 0)[1]
if os.WIFSIGNALED(st):
    os.write(fd, b'{"signal": %d}\\n' % os.WTERMSIG(st))
    os._exit(128 + os.WTERMSIG(st))
os.write(fd, b'{"exit": %d}\\n' % os.WEXITSTATUS(st))
os._exit(os.WEXITSTATUS(st))
"""


def waiter_argv(python: str, perl: str | None) -> tuple[str, ...]:
    """The waiter's command line, before the status fd and the command."""
    if perl is not None:
        return (perl, "-e", PERL_WAITER)
    return (python, "-I", "-S", "-c", WAITER)


@dataclass(frozen=True)
class Jail:
    workspace: str
    tmp: str
    etc: str  # directory holding the generated passwd, group and hosts
    uid: int | None  # drop to this uid (executor is root); None: stay, inside a user namespace
    ro_paths: tuple[str, ...] = ()  # extra read-only paths, e.g. the Python installation
    env: dict[str, str] = field(default_factory=dict)
    host_links: dict[str, str] = field(default_factory=dict)  # /bin -> usr/bin etc. on this host
    host_etc: tuple[str, ...] = ()  # which ETC_FILES exist here
    seccomp: bool = True  # load the filter from the fd the runner passes as SECCOMP_FD
    waiter: tuple[str, ...] | None = None  # ``waiter_argv``'s (None: no waiter)


def rlimit_argv(limits: Limits, cpu_grace_s: int = 1) -> list[str]:
    """``prlimit`` options: soft CPU limit sends SIGXCPU, the hard one a second later SIGKILL."""
    cpu = limits.cpu_time_s
    return [
        "prlimit",
        f"--cpu={cpu}:{cpu + cpu_grace_s}",
        f"--as={limits.memory_bytes}",
        f"--nproc={limits.processes}",
        f"--nofile={limits.open_files}",
        f"--fsize={limits.file_size_bytes}",
        "--core=0",
        "--",
    ]


def drop_argv(uid: int) -> list[str]:
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]


def _dirs_for(path: str, made: set[str]) -> list[str]:
    """``--dir`` for each missing ancestor, world-readable so the dropped uid can traverse it."""
    out = []
    for parent in reversed(PurePosixPath(path).parents):
        p = str(parent)
        if p != "/" and p not in made:
            made.add(p)
            out += ["--perms", "0755", "--dir", p]
    return out


def _system_argv(jail: Jail) -> list[str]:
    argv = ["--ro-bind", "/usr", "/usr"]
    for name, target in jail.host_links.items():
        argv += ["--symlink", target, f"/{name}"]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for name in jail.host_etc:
        argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for name in ("passwd", "group", "hosts"):
        argv += ["--ro-bind", os.path.join(jail.etc, name), f"/etc/{name}"]
    return argv


def _ro_paths_argv(jail: Jail) -> list[str]:
    """The extra read-only paths (the executor's Python), bound after ``/tmp`` and the workspace:
    one under ``/tmp`` (a clone's environment) is then seen over the session's ``/tmp``, not
    hidden by it. The mount points this needs are made in the session's own ``/tmp``."""
    argv: list[str] = []
    made = {"/etc", "/usr", "/tmp", WORKDIR}
    for path in jail.ro_paths:
        if path == "/usr" or path.startswith("/usr/"):
            continue
        argv += [*_dirs_for(path, made), "--ro-bind", path, path]
    return argv


def bwrap_argv(jail: Jail, limits: Limits, cmd: list[str]) -> list[str]:
    """The whole command line for ``cmd`` inside ``jail``."""
    argv = ["bwrap", "--json-status-fd", STATUS_FD]
    argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if jail.uid is None:
        argv += ["--unshare-user"]
    argv += ["--hostname", "sandbox"]
    argv += _system_argv(jail)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", str(limits.shm_bytes), "--tmpfs", "/dev/shm"]
    argv += ["--bind", jail.tmp, "/tmp", "--bind", jail.workspace, WORKDIR, "--chdir", WORKDIR]
    argv += _ro_paths_argv(jail)
    if jail.seccomp:
        argv += ["--seccomp", SECCOMP_FD]
    argv += ["--clearenv"]
    for key, value in sorted(jail.env.items()):
        argv += ["--setenv", key, value]
    argv += ["--"]
    if jail.waiter is not None:
        argv += [*jail.waiter, WAIT_FD]
    if jail.uid is not None:
        argv += drop_argv(jail.uid)
    return argv + rlimit_argv(limits) + cmd


def sandbox_env(python_bins: list[str], uid: int | None, venv: str | None = None) -> dict[str, str]:
    """The whole environment inside: nothing of the host's variables passes. ``venv``: the task
    environment's virtual environment (its ``bin`` is then the first of ``python_bins``)."""
    path = ":".join([*python_bins, "/usr/local/bin", "/usr/bin", "/bin"])
    extra = {"VIRTUAL_ENV": venv} if venv else {}
    return {
        **extra,
        "PATH": path,
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "USER": "sandbox",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "SANDBOX_UID": str(uid if uid is not None else ""),
    }


def etc_files(uid: int) -> dict[str, str]:
    """Minimal account database: the sandbox user exists (tools that look up the uid work)."""
    return {
        "passwd": f"root:x:0:0::/nonexistent:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}::/tmp:/bin/sh\n",
        "group": f"root:x:0:\nsandbox:x:{uid}:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    }
