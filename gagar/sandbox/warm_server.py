"""The warm test runner's fork server: runs inside a session's jail; gagar imports it only to
read its source.

``warm.py`` runs this file's source as ``python -I -B -u -c SOURCE CTL_FD [MODULE ...]`` in a jail
built exactly as a command's (same mounts, uid, rlimits, seccomp filter): isolated, so nothing of
the workspace, ``/tmp`` or the environment is read while pytest and ``MODULE``s are imported. Then
it refuses to be inspected or steered from inside the jail: not dumpable (no ``ptrace``, no
``/proc/PID/mem`` or ``fd`` of it for a process of the same uid) and every signal it may ignore
ignored (``SIGKILL`` and ``SIGSTOP`` remain: the host sees their effect and discards the server).

Protocol on ``CTL_FD``, a ``SOCK_SEQPACKET`` socket whose other end only the host holds:

- once, server to host: ``{"ready": PID, "modules": [...]}`` (the top-level names now imported)
  or ``{"error": "..."}``;
- per run, host to server: ``{"kind": "module"|"code"|"script", "target": ..., "args": [...],
  "env": {...}, "isolated": bool, "cwd": "..."}`` with four descriptors
  (``SCM_RIGHTS``): the run's stdout, stderr, a status pipe and a "go" pipe;
- the server forks and answers ``{"forked": PID}``; the child waits for one byte on "go" (the host
  has moved it into the run's cgroups by then), closes every other descriptor, restores what a
  fresh interpreter has (signal dispositions and mask, umask, dumpable), starts a session of its
  own, applies the command's environment, ``sys.path`` and ``sys.argv`` as ``python [-I] -m
  MODULE``, ``-c CODE`` or ``SCRIPT`` would, and runs it at the top level of this script: its exit
  is a fresh interpreter's (atexit, threads, flush, an uncaught exception's traceback and status
  1);
- the server waits for the child and writes ``{"exit": N}`` or ``{"signal": N}`` and the number
  of System V IPC objects left in the jail (``"ipc"``) on the status pipe.
"""

import array
import ctypes
import gc
import importlib
import json
import os
import signal
import socket
import sys
from typing import Any

_PR_SET_DUMPABLE = 4
_WRITABLE = ("/workspace", "/tmp", "/dev/shm")  # never imported from by the server
_MAX_REQUEST = 1 << 16


def _prctl_dumpable(value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, value, 0, 0, 0)


def _preload(names: list[str]) -> list[str]:
    import pytest  # noqa: F401
    from _pytest.config import default_plugins

    for name in default_plugins:
        try:
            importlib.import_module("_pytest." + name)
        except ImportError:
            continue
    for name in names:
        importlib.import_module(name)
    # The interpreter's installation is bound read-only into the jail (after /tmp: a clone's
    # environment may live under /tmp); anything else under a writable folder is the policy's.
    installed = tuple(
        os.path.join(os.path.realpath(p), "")
        for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    )
    for mod in list(sys.modules.values()):
        where = getattr(mod, "__file__", None) or ""
        if where.startswith(_WRITABLE) and not os.path.realpath(where).startswith(installed):
            raise ImportError(f"{mod.__name__} was imported from {where}")
    return sorted({n.partition(".")[0] for n in sys.modules})


def _ipc_objects() -> int:
    count = 0
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                count += max(len(f.read().splitlines()) - 1, 0)
        except OSError:
            continue
    return count


def _serve(
    ctl: socket.socket, pristine: dict[str, Any]
) -> tuple[dict[str, Any], tuple[int, int, int], dict[str, Any]]:
    """The server's loop; returns in a forked child only, with its request."""
    while True:
        try:
            data, ancdata, _, _ = ctl.recvmsg(_MAX_REQUEST, socket.CMSG_SPACE(4 * 4))
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)  # the host closed its end
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            ctl.send(b'{"error": "a request carries four descriptors"}')
            continue
        out, err, status, go = fds
        pid = os.fork()
        if pid == 0:
            return json.loads(data), (out, err, go), pristine
        for fd in (out, err, go):
            os.close(fd)
        ctl.send(json.dumps({"forked": pid}).encode())
        _, st = os.waitpid(pid, 0)
        record = {"signal": os.WTERMSIG(st)} if os.WIFSIGNALED(st) else {"exit": os.WEXITSTATUS(st)}
        record["ipc"] = _ipc_objects()
        try:
            os.write(status, json.dumps(record).encode() + b"\n")
        except OSError:
            pass
        os.close(status)


def _start() -> tuple[dict[str, Any], tuple[int, int, int], dict[str, Any]]:
    ctl = socket.socket(fileno=int(sys.argv[1]))
    try:
        modules = _preload(sys.argv[2:])
    except BaseException as e:  # reported to the host, which runs cold
        ctl.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        os._exit(1)
    umask = os.umask(0o022)
    os.umask(umask)
    pristine = {
        "signals": {s: signal.getsignal(s) for s in signal.valid_signals()},
        "umask": umask,
    }
    _prctl_dumpable(0)
    for s in signal.valid_signals():
        if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT):
            try:
                signal.signal(s, signal.SIG_IGN)
            except (OSError, ValueError):
                continue
    gc.freeze()  # what the server holds stays out of the children's collections: fewer copies
    ctl.send(json.dumps({"ready": os.getpid(), "modules": modules}).encode())
    return _serve(ctl, pristine)


def _become_run(
    request: dict[str, Any], fds: tuple[int, int, int], pristine: dict[str, Any]
) -> tuple[str, str]:
    """In the forked child: wait for the host's go, then look like ``python ARGS`` would."""
    out, err, go = fds
    os.dup2(out, 1)
    os.dup2(err, 2)
    if os.read(go, 1) != b"g":
        os._exit(125)  # the host gave up on this run
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    _prctl_dumpable(1)
    for s, handler in pristine["signals"].items():
        if handler is not None:
            try:
                signal.signal(s, handler)
            except (OSError, ValueError):
                continue
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.umask(pristine["umask"])
    os.chdir(request["cwd"])
    os.environ.update(request["env"])
    os.setsid()  # as a cold command's (bubblewrap's --new-session): its own session, autogroup
    kind, target, args = request["kind"], request["target"], request["args"]
    if not request.get("isolated"):  # ``-I`` leaves sys.path as the (isolated) server has it
        first = {"module": os.getcwd(), "code": ""}.get(kind)
        if first is None:  # a script: its directory
            first = os.path.dirname(os.path.abspath(target))
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [first, *extra]
    sys.argv = [{"module": "-m", "code": "-c"}.get(kind, target), *args]
    return kind, target


def _run_main(kind: str, target: str) -> None:
    """Run ``target`` as the interpreter's ``-m``, ``-c`` or script would, in a fresh ``__main__``."""
    import runpy
    import types

    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "script":
        runpy.run_path(target, run_name="__main__")
    else:
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        exec(compile(target, "<string>", "exec"), main.__dict__)


if __name__ == "__main__":  # ``python -c``; importing this module does nothing
    _run_main(*_become_run(*_start()))
