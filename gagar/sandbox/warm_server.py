"""The warm test runner's fork server: runs inside a session's jail; gagar imports it only to
read its source.

``warm.py`` runs this file's source as ``python -I -B -u -c SOURCE CTL_FD FILTER_FD [MODULE ...]``
in a jail built as a command's (same mounts, uid, rlimits; its seccomp filter lets ``unshare``
through for a user plus network namespace only): isolated, so nothing of the workspace, ``/tmp`` or
the environment is read while pytest and ``MODULE``s are imported. ``FILTER_FD`` holds the run's
filter (the jail's, ``unshare`` refused), read once. Then it refuses to be inspected or steered
from inside the jail: not dumpable (no ``ptrace``, no ``/proc/PID/mem`` or ``fd`` of it for a
process of the same uid) and every signal it may ignore ignored (``SIGKILL`` and ``SIGSTOP``
remain: the host sees their effect and discards the server).

Each run starts in a network namespace of its own, as a cold command does (a listener or a port in
``TIME_WAIT`` left by one run would otherwise fail the next run's bind): before the run's code, the
child unshares a user namespace (which maps only its own uid and gid: creating the network
namespace needs a capability, which it has inside that namespace alone) and a network namespace,
sets its loopback up, drops every capability and loads the run's filter, so the code has no
capability and cannot make a namespace. The server tries this once at its start; where the kernel
refuses (user namespaces off), runs share the server's network namespace, and the host checks it
after each run instead (``"netns": false`` in the ready message).

Protocol on ``CTL_FD``, a ``SOCK_SEQPACKET`` socket whose other end only the host holds:

- once, server to host: ``{"ready": PID, "modules": [...], "netns": bool}`` (the top-level names
  now imported; whether runs get a network namespace of their own) or ``{"error": "..."}``;
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
- the server waits for the child and writes ``{"exit": N}`` or ``{"signal": N}``, the number
  of System V IPC objects left in the jail (``"ipc"``) and how far the child's start went before
  the run's code (``"setup"``: ``"net"`` or ``"filter"``, else absent) on the status pipe.
"""

import array
import ctypes
import errno
import fcntl
import gc
import importlib
import json
import os
import signal
import socket
import struct
import sys
from typing import Any

_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 24, 22, 2
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_CAPABILITY_VERSION_3 = 0x20080522
_WRITABLE = ("/workspace", "/tmp", "/dev/shm")  # never imported from by the server
_MAX_REQUEST = 1 << 16


def _prctl_dumpable(value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, value, 0, 0, 0)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _own_network() -> None:
    """The calling process in a network namespace of its own, its loopback up, inside a user
    namespace mapping only its uid and gid; it has every capability there until
    ``_drop_capabilities``."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(ctypes.c_int(_CLONE_NEWUSER | _CLONE_NEWNET)) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))
        flags = struct.unpack_from("16sH", ifreq)[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _drop_capabilities() -> None:
    """Every capability ``_own_network`` gave, the bounding set too (empty, as a cold command's:
    the list ends where the kernel says EINVAL)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            if ctypes.get_errno() != errno.EINVAL:
                raise OSError(ctypes.get_errno(), "capbset")
            break
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _load_filter(bpf: bytes) -> None:
    """``bpf`` loaded on top of the jail's filter (``no_new_privs`` is set: no privilege
    needed); raises on failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    program = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = _Fprog(len(bpf) // 8, ctypes.addressof(program))
    mode, zero = ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.c_ulong(0)
    if libc.prctl(_PR_SET_SECCOMP, mode, ctypes.byref(fprog), zero, zero) != 0:
        raise OSError(ctypes.get_errno(), "seccomp")


def _probe_network() -> bool:
    """Whether a run can be given a network namespace of its own here (tried in a child)."""
    pid = os.fork()
    if pid == 0:
        try:
            _own_network()
        except BaseException:
            os._exit(1)
        os._exit(0)
    return os.waitpid(pid, 0)[1] == 0


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
) -> tuple[dict[str, Any], tuple[int, int, int, int], dict[str, Any]]:
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
        setup_r, setup_w = os.pipe()  # the child's word that its start went through
        pid = os.fork()
        if pid == 0:
            os.close(setup_r)
            return json.loads(data), (out, err, go, setup_w), pristine
        for fd in (out, err, go, setup_w):
            os.close(fd)
        ctl.send(json.dumps({"forked": pid}).encode())
        _, st = os.waitpid(pid, 0)
        ended = ("signal", os.WTERMSIG(st)) if os.WIFSIGNALED(st) else ("exit", os.WEXITSTATUS(st))
        record: dict[str, Any] = dict([ended], ipc=_ipc_objects())
        setup = os.read(setup_r, 16).decode(errors="replace")
        os.close(setup_r)
        if setup in ("net", "filter"):
            record["setup"] = setup
        try:
            os.write(status, json.dumps(record).encode() + b"\n")
        except OSError:
            pass
        os.close(status)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _start() -> tuple[dict[str, Any], tuple[int, int, int, int], dict[str, Any]]:
    ctl = socket.socket(fileno=int(sys.argv[1]))
    try:
        bpf = _read_all(int(sys.argv[2]))
        modules = _preload(sys.argv[3:])
    except BaseException as e:  # reported to the host, which runs cold
        ctl.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        os._exit(1)
    umask = os.umask(0o022)
    os.umask(umask)
    pristine = {
        "signals": {s: signal.getsignal(s) for s in signal.valid_signals()},
        "umask": umask,
        "filter": bpf,
        "netns": _probe_network(),
    }
    _prctl_dumpable(0)
    for s in signal.valid_signals():
        if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT):
            try:
                signal.signal(s, signal.SIG_IGN)
            except (OSError, ValueError):
                continue
    gc.freeze()  # what the server holds stays out of the children's collections: fewer copies
    ready = {"ready": os.getpid(), "modules": modules, "netns": pristine["netns"]}
    ctl.send(json.dumps(ready).encode())
    return _serve(ctl, pristine)


def _become_run(
    request: dict[str, Any], fds: tuple[int, int, int, int], pristine: dict[str, Any]
) -> tuple[str, str]:
    """In the forked child: wait for the host's go, then look like ``python ARGS`` would."""
    out, err, go, setup = fds
    os.dup2(out, 1)
    os.dup2(err, 2)
    if os.read(go, 1) != b"g":
        os._exit(125)  # the host gave up on this run
    os.closerange(3, setup)
    os.closerange(setup + 1, os.sysconf("SC_OPEN_MAX"))
    _prctl_dumpable(1)  # before the namespaces: its /proc/self/uid_map is root's until then
    try:
        if pristine["netns"]:
            _own_network()
            _drop_capabilities()
        _load_filter(pristine["filter"])
    except BaseException:  # no word on the setup pipe: the host discards the server
        os._exit(125)
    os.write(setup, b"net" if pristine["netns"] else b"filter")
    os.close(setup)
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
