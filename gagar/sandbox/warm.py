"""The warm test runner of a session: pytest runs forked from a fork server in the session's jail.

The warm isolation mode (``WarmRunner``, a ``jail.Jail``): in front of a session's cold
bubblewrap jail, which runs every other command and every fallback (given to it when the session
is made: no mode imports another). A cold ``python -m pytest`` costs about 0.2 CPU s before the
first test, most of it starting the interpreter and importing pytest. A ``LocalSession``
(``isolation="bwrap"``, a root executor with cgroups) starts, at its first pytest command, a fork server (``warm_server.py``) in a jail built
as a command's (same mounts, uid, rlimits and seccomp filter, plus ``mq_open`` refused): pytest,
its default plugins and the factory's ``warm_preload`` modules imported once, with nothing of the
workspace, ``/tmp`` or the environment read. Each pytest command is then one ``fork`` of that
pristine server, so nothing of one run (modules imported or changed, builtins patched, threads,
signal handlers, cwd, environment, umask, descriptors) reaches the next by construction. Per run:

- fresh cgroups (memory, pids, cpuacct), the run moved into them by the executor before the
  server lets it go; the session's rlimits (inherited: the CPU clock of a forked process starts
  at zero); the wall clock, output capture and the kill of the whole tree by the executor, as for
  a cold command; its exit status from the server's ``waitpid`` (``{"exit"}``/``{"signal"}``);
- ``python -m pytest ARGS`` as the interpreter would set it up: ``sys.path[0]`` the working
  directory, then ``PYTHONPATH``; the command's ``VAR=value`` assignments in the environment;
- a network namespace of its own, as a cold command has (its loopback up), made by the run
  before its code in a user namespace of its own, every capability then dropped and the jail's
  filter loaded again (``warm_server.py``): a port in ``TIME_WAIT`` or a listener one run leaves
  never fails the next run's bind. Where the kernel refuses user namespaces, runs share the
  server's namespace, and a run that leaves a socket there has its result kept and the server
  discarded.

Only commands of the form ``[VAR=value ...] python[3] [-I] [-B] -m pytest ARGS`` (or ``-c CODE``,
``SCRIPT``) without shell syntax (a string) or as an argv run warm (``-I``: nothing of the
workspace or ``PYTHONPATH`` on ``sys.path``, ``PYTHON*`` assignments only in the environment, as
the interpreter has it); an assignment to another ``PYTHON*`` variable without ``-I`` or to an
``LD_*`` one, a workspace (or ``PYTHONPATH`` entry) that would shadow a module the server imported,
or a user site under ``/tmp`` keeps the command cold, as everything else. The policy runs inside
the server's jail and will try to steer it; each attempt ends in a cold run or a discarded server:

- it cannot reach the server's control socket (only the executor holds the other end; the run's
  copies are closed before its code runs, and the server is not dumpable, so neither ``ptrace``
  nor ``/proc/PID/fd`` or ``mem`` of it works for the same uid); cold commands live in jails of
  their own (PID, network and IPC namespaces) and share only ``/workspace`` and ``/tmp``, from
  which the server imports nothing;
- signals the server may ignore, it ignores; ``SIGKILL`` ends the server and its PID namespace,
  ``SIGSTOP`` its replies: without the server's report of how a run ended, the run is rerun cold
  and the server discarded; one that does not answer a request in time is discarded the same way;
- a run that leaves System V IPC objects or files in the jail's ``/dev/shm`` (which, unlike a
  cold command's, outlive it) has its result kept and the server discarded;
- after ``MAX_RESTARTS`` discards the session stays cold for good: a policy that keeps breaking
  the server pays a cold run each time, never gets a result the server made up.

Changing the server's scheduling or resource limits (which a process of the same uid may, and later
runs would inherit) is refused by the jail's filter (``others=False``); a run that did so anyway
has its result kept and the server discarded too. Every fallback says why:
``ExecResult.warm_fallback`` and a log line. Verification uses this runner only in a station
(``station.py``): a session kept for verification alone, whose server never ran next to an agent.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import inspect
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gagar.sandbox import bwrap, runner, warm_server
from gagar.sandbox.cgroup import Cgroup
from gagar.sandbox.jail import Jail, Run, View, backstop, cgroups, finish
from gagar.sandbox.pycommand import PYTHONS, Request, parse
from gagar.sandbox.seccomp import filter_bpf
from gagar.sandbox.types import ExecResult, SandboxError
from gagar.sandbox.workspace import resolve_inside

log = logging.getLogger(__name__)
SOURCE = inspect.getsource(warm_server)  # what the jail runs: imported here only for its text
START_TIMEOUT_S = 60.0  # importing pytest on a loaded machine
REPLY_TIMEOUT_S = 10.0  # the server's answer to a request: a fork
STATUS_GRACE_S = 2.0  # the server's report after the run's end
MAX_RESTARTS = 3  # discarded servers before the session stays cold
MAX_REQUEST = 60_000  # bytes of one request (the server reads at most 64 KiB)
# Each run in a network namespace of its own (``warm_server.py``); off only in benchmarks.
RUN_NETNS = True
# bubblewrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that started it
# ends. A server outlives the command that started it (and a station's, many rollout steps, each
# with a thread pool of its own), so every server is started from this one long-lived thread.
_SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="gagar-warm-start")


class _Cold(Exception):  # a way out, not an error: the command runs cold
    """The run must be rerun cold; ``why`` says why."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _nspid(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next((x for x in status.splitlines() if x.startswith("NSpid:")), "")
    fields = line.split()
    return int(fields[-1]) if len(fields) > 2 else None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [
                    int(p) for p in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                ]
    except OSError:
        pass
    return out


def _inheritable(pid: int) -> tuple[str, ...] | None:
    """What a process of the same uid may change of another, and the other's children inherit:
    its nice value, scheduling policy and real-time priority (``/proc/PID/stat``), CPU affinity
    and resource limits. The jail's filter refuses those calls (``others=False``); this is the
    check behind it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpus = ",".join(map(str, sorted(os.sched_getaffinity(pid))))
        limits = Path(f"/proc/{pid}/limits").read_text()
    except (OSError, IndexError):
        return None
    return fields[16], fields[37], fields[38], cpus, limits  # fields 19, 40, 41 of proc(5)


def _descendant(root: int, nspid: int) -> int | None:
    """The descendant of ``root`` that is ``nspid`` in its own PID namespace (the server)."""
    todo, seen = [root], 0
    while todo and seen < 64:
        pid = todo.pop()
        seen += 1
        if pid != root and _nspid(pid) == nspid:
            return pid
        todo += _children(pid)
    return None


class WarmRunner:
    """The warm mode: a session's fork server, started at its first Python command, in front of
    ``cold``, the jail every other command (and every fallback) runs in; see the module
    docstring. ``view``: the session as it is created."""

    def __init__(self, cold: Jail, view: View, preload: tuple[str, ...] = ()) -> None:
        self._cold, self._preload = cold, preload
        self._view, self._name = view, view.dir.name  # the view of the run in progress
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ctl: socket.socket | None = None
        self._cg: Cgroup | None = None
        self._server = 0  # the server's pid here
        self._fds: list[int] = []  # bubblewrap's status pipe (read end), kept open
        self._errlog: Any = None
        self._modules: frozenset[str] = frozenset()
        self._server_state: tuple[str, ...] | None = None
        self._netns = False  # the server gives each run a network namespace of its own
        self._restarts = 0
        self.start_cpu_s: float | None = None
        self.off: str | None = None  # why this session runs cold for good
        if view.uid is None or view.cgroup_tag is None:
            self.off = "the warm runner needs a root executor with cgroups (a leased uid)"
        ro_paths = view.layout.ro_paths if view.layout is not None else ()
        bins = ":".join(os.path.join(p, "bin") for p in ro_paths)  # first on the jail's PATH
        self._python = {
            name: found for name in PYTHONS if (found := shutil.which(name, path=bins)) is not None
        }
        if "python" not in self._python:
            self.off = "no python on the jail's PATH"

    @property
    def serving(self) -> bool:
        """A fork server was started and not stopped (its jail holds the session's mounts)."""
        return self._proc is not None

    def unfit(self) -> str | None:
        """Why this runner must not serve another candidate (a verification station), or None:
        it was ever discarded, or its server died."""
        if self.off is not None:
            return self.off
        if self._restarts:
            return f"its fork server was discarded ({self._restarts}x)"
        if self._proc is not None and self._proc.poll() is not None:
            return "its fork server died"
        return None

    def pids(self) -> set[int]:
        """The fork server and the jail around it (bubblewrap's two processes): the only
        processes of the session that outlive a command."""
        if self._proc is None or not self._server:
            return set()
        out, pid = {self._server}, self._server
        while pid != self._proc.pid and len(out) < 8:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                break
            pid = int(stat[stat.rfind(")") + 2 :].split()[1])
            out.add(pid)
        return out

    def run(self, view: View, argv: list[str], wall: float) -> ExecResult:
        """``argv`` forked from the server where it is a Python command the server can run,
        else (or where the warm run failed) in the cold jail, saying why."""
        shell = len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"]  # how a string command comes
        request = parse(argv[2] if shell else argv)
        if request is None:
            return self._cold.run(view, argv, wall)
        done = self._warm(view, request, wall)
        if isinstance(done, ExecResult):
            return done
        log.info("session %s: a Python command runs cold: %s", self._name, done)
        return self._cold.run(view, argv, wall).model_copy(update={"warm_fallback": done})

    def _warm(self, view: View, req: Request, wall: float) -> ExecResult | str:
        """The run's result, or why it must run cold (the server may be gone after)."""
        if not self._lock.acquire(blocking=False):
            return "the warm runner is busy with another command of this session"
        try:
            self._view = view
            reason = self._why_cold(req)
            if reason is None and self._proc is None:  # then the shadows of what it imported
                reason = self._start() or self._why_cold(req)
            if reason is not None:
                return reason
            return self._run(req, wall)
        finally:
            self._lock.release()

    def _why_cold(self, req: Request) -> str | None:
        if self.off is not None:
            return self.off
        if self._proc is not None and self._proc.poll() is not None:
            self._discard("the fork server died")
            if self.off is not None:
                return self.off
        python = self._python.get(req.python)
        if python is None or os.path.realpath(python) != os.path.realpath(self._python["python"]):
            return f"{req.python} is not the fork server's interpreter"
        if (self._view.tmp / ".local").exists():
            return "a user site under /tmp (the server does not read one)"
        dirs = self._path_dirs(req)
        if isinstance(dirs, str):
            return dirs
        for d in dirs:
            with contextlib.suppress(OSError):
                for name in os.listdir(d):
                    if name.partition(".")[0] in self._modules:
                        return f"{name} in the workspace shadows a module the server imported"
        return None

    def _path_dirs(self, req: Request) -> list[Path] | str:
        """The session directories the run's ``sys.path`` starts with, or why it runs cold."""
        dirs = [self._view.workspace]
        if req.isolated:  # nothing of the workspace on sys.path at the start; its root is
            return dirs  # checked all the same (a test run puts it there later)
        if req.kind == "script":  # its directory comes first on sys.path
            where = os.path.dirname(req.target.removeprefix(bwrap.WORKDIR).lstrip("/")) or "."
            if req.target.startswith("/") and not req.target.startswith(bwrap.WORKDIR + "/"):
                return f"a script outside the workspace: {req.target}"
            try:
                dirs.append(
                    resolve_inside(self._view.workspace, where) if where != "." else dirs[0]
                )
            except SandboxError as e:
                return f"the script: {e}"
        for entry in filter(None, req.env.get("PYTHONPATH", "").split(":")):
            under = entry == bwrap.WORKDIR or entry.startswith(bwrap.WORKDIR + "/")
            if entry.startswith("/") and not under:
                return f"PYTHONPATH entry {entry} outside the workspace"
            inside = entry.removeprefix(bwrap.WORKDIR).lstrip("/") or "."
            try:
                dirs.append(
                    resolve_inside(self._view.workspace, inside) if inside != "." else dirs[0]
                )
            except SandboxError as e:
                return f"PYTHONPATH: {e}"
        return dirs

    def _start(self) -> str | None:
        view = self._view
        assert view.layout is not None, "the fork server's jail is the session's bubblewrap jail"
        cg = cgroups(view)
        if cg is None:
            return "cannot create the fork server's cgroups"
        ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status_r, status_w = os.pipe()
        seccomp = runner.memfd(filter_bpf(mqueue=False, others=False, netns=RUN_NETNS))
        runs = runner.memfd(filter_bpf(mqueue=False, others=False))  # each run loads it
        jail = dataclasses.replace(view.layout, waiter=None)
        cmd = [self._python["python"], "-I", "-B", "-u", "-c", SOURCE, str(theirs.fileno())]
        cmd.append(str(runs))
        subst = {runner.STATUS_FD: str(status_w), runner.SECCOMP_FD: str(seccomp)}
        argv = bwrap.bwrap_argv(jail, backstop(view.limits, True), [*cmd, *self._preload])
        argv = [subst.get(a, a) for a in argv]
        self._errlog = tempfile.TemporaryFile()
        errlog = self._errlog

        def popen() -> subprocess.Popen:
            return runner.spawn(
                lambda: subprocess.Popen(
                    cg.wrap(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errlog,
                    env=bwrap.HOST_ENV,
                    process_group=0,
                    pass_fds=(theirs.fileno(), status_w, seccomp, runs),
                )
            )

        try:
            self._proc = _SPAWNER.submit(popen).result()
        except OSError as e:
            cg.destroy()
            ctl.close()
            os.close(status_r)
            return f"cannot start the fork server: {e}"
        finally:
            theirs.close()
            os.close(status_w)
            os.close(seccomp)
            os.close(runs)
        self._ctl, self._cg, self._fds = ctl, cg, [status_r]
        reply = self._recv(START_TIMEOUT_S)
        server = _descendant(self._proc.pid, reply["ready"]) if "ready" in reply else None
        if server is None:
            self._errlog.seek(0)
            why = reply.get("error") or self._errlog.read()[-300:].decode(errors="replace")
            return self._discard(f"the fork server did not start: {why or 'no reply'}")
        self._server, self._modules = server, frozenset(reply.get("modules", ()))
        self._netns = reply.get("netns") is True
        if not self._netns:
            log.warning("warm runner of %s: runs share the server's network", self._name)
        self._server_state = _inheritable(server)
        self.start_cpu_s = cg.stats().cpu_time_s  # the server's start, once per server
        log.info("warm runner of %s: fork server %d ready", self._name, server)
        return None

    def _recv(self, timeout: float) -> dict[str, Any]:
        assert self._ctl is not None
        self._ctl.settimeout(timeout)
        try:
            reply = json.loads(self._ctl.recv(1 << 20))
        except (OSError, ValueError):
            return {}
        return reply if isinstance(reply, dict) else {}

    def _run(self, req: Request, wall: float) -> ExecResult | str:
        view, start = self._view, time.monotonic()
        payload = json.dumps(
            {**dataclasses.asdict(req), "cwd": bwrap.WORKDIR}, separators=(",", ":")
        ).encode()
        if len(payload) > MAX_REQUEST:
            return "the command is too long for the fork server"
        rcg = cgroups(view)
        if rcg is None:
            return "cannot create the run's cgroups"
        assert self._ctl is not None and self._cg is not None
        server_cpu = self._cg.stats().cpu_time_s or 0.0
        (out_r, out_w), (err_r, err_w), (st_r, st_w), (go_r, go_w) = (os.pipe() for _ in range(4))
        mine = [out_r, err_r, st_r, go_w]
        try:
            fds = array.array("i", [out_w, err_w, st_w, go_r])
            self._ctl.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            reply = self._recv(REPLY_TIMEOUT_S)
            child = self._forked(reply.get("forked"))
            if child is None:
                raise OSError("the fork server did not fork the run")
            rcg.add(child)
            cap = runner.Capture(view.limits.output_bytes, child)
        except OSError as e:
            for fd in mine:
                os.close(fd)
            rcg.destroy()
            return self._discard(str(e) or type(e).__name__)
        finally:
            for fd in (out_w, err_w, st_w, go_r):
                os.close(fd)
        for fd in (out_r, err_r, st_r):
            cap.add(fd)
        os.write(go_w, b"g")
        os.close(go_w)

        def wait() -> runner.Outcome:
            outcome = runner.Outcome(timed_out=runner.pump_until(cap, start + wall))
            rcg.kill()  # whatever the run left, or the whole run at the wall clock
            runner.drain(cap, time.monotonic() + STATUS_GRACE_S)
            outcome.stdout, outcome.stderr = bytes(cap.data[out_r]), bytes(cap.data[err_r])
            outcome.truncated, outcome.duration_s = cap.truncated, time.monotonic() - start
            self._ended(outcome, runner.parse_status(bytes(cap.data[st_r])), rcg, server_cpu)
            return outcome

        try:  # the server's ``waitpid`` is the run's real status: no bubblewrap in between
            return finish(view, wait, Run(rcg)).model_copy(update={"warm": True})
        except _Cold as e:
            return e.why

    def _ended(
        self, outcome: runner.Outcome, records: list[dict], rcg: Cgroup, server_cpu: float
    ) -> None:
        """``outcome``'s status from the server's report (``_Cold`` without one), and the server
        discarded where the run left anything in it."""
        assert self._cg is not None
        record = records[0] if len(records) == 1 else {}
        if "exit" not in record and "signal" not in record:
            reason = self._discard("the fork server did not report how the run ended")
            if not outcome.timed_out:
                raise _Cold(reason)
            record = {"signal": signal.SIGKILL}  # ours, at the wall clock
        elif record.get("setup") != ("net" if self._netns else "filter"):
            raise _Cold(
                self._discard("the run's start (its network, its filter) did not go through")
            )
        elif record.get("ipc") or self._shm_used():
            self._discard("the run left System V IPC objects or files in /dev/shm")
        elif self._sockets_left():  # a run that shared the server's network namespace
            self._discard("the run left sockets in the server's network namespace")
        elif _inheritable(self._server) != self._server_state:  # later runs would inherit it
            self._discard("the run changed the server's scheduling or resource limits")
        else:  # the server's CPU while it forked the run counts as the run's
            spent = (self._cg.stats().cpu_time_s or 0.0) - server_cpu
            outcome.cpu_time_s = (rcg.stats().cpu_time_s or 0.0) + spent
        outcome.exit_code, outcome.signal = record.get("exit"), record.get("signal")

    def _forked(self, nspid: object) -> int | None:
        """The run's pid here: the server's only child, ``nspid`` inside."""
        if not isinstance(nspid, int):
            return None
        kids = _children(self._server)
        return kids[0] if len(kids) == 1 and _nspid(kids[0]) == nspid else None

    def _sockets_left(self) -> bool:
        """Whether a socket is left in the server's network namespace (a run sharing it can
        leave a port in ``TIME_WAIT``; with a namespace per run, none ever is): IP sockets in use
        or in ``TIME_WAIT`` as the namespace's ``sockstat`` counts them (``/proc/net/tcp`` would
        walk the host's whole TCP table: ~4 ms), Unix sockets as listed."""
        where = Path(f"/proc/{self._server}/net")
        try:
            stats = (where / "sockstat").read_text() + (where / "sockstat6").read_text()
            with open(where / "unix", "rb") as f:
                unix = f.read(1 << 16)
        except OSError:
            return True
        for line in stats.splitlines():
            proto, _, rest = line.partition(":")
            if proto == "sockets" or proto.startswith("FRAG"):  # host-wide; fragments expire
                continue
            words = rest.split()
            counts = dict(zip(words[::2], words[1::2], strict=False))
            if counts.get("inuse", "0") != "0" or counts.get("tw", "0") != "0":
                return True
        return len(unix.splitlines()) > 1  # past the header line

    def _shm_used(self) -> bool:
        try:
            return bool(os.listdir(f"/proc/{self._server}/root/dev/shm"))
        except OSError:
            return True

    def _discard(self, why: str) -> str:
        """Stop the server (a later run starts a fresh one), count it; returns ``why``."""
        self.stop()
        self._restarts += 1
        log.warning("warm runner of %s: %s; the server is discarded", self._name, why)
        if self._restarts >= MAX_RESTARTS:
            self.off = f"the fork server was discarded {self._restarts} times (last: {why})"
        return why

    def stop(self) -> None:
        """End the server and everything in its jail."""
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if self._cg is not None:
            self._cg.destroy()
            self._cg = None
        if self._proc is not None:
            self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
            runner.release(self._proc.pid)
            self._proc = None
        for fd in self._fds:
            os.close(fd)
        self._fds, self._server, self._modules = [], 0, frozenset()
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None


__all__ = ["MAX_RESTARTS", "Request", "WarmRunner", "parse"]
