"""Sandboxed execution of untrusted code (bubblewrap locally, executor servers in sandbox pods).

API (everything a caller needs):

- ``Session`` (protocol): ``exec(cmd, timeout) -> ExecResult``, ``read_file``, ``write_file``,
  ``delete_file``, ``list_files``, ``diff()`` (unified diff against the base), ``archive()``
  (``.tar.gz`` of the workspace), ``reset()``, ``close()``; sessions are context managers.
- ``SessionFactory`` (protocol): ``create(files=..., tarball=..., limits=..., environment=...)
  -> Session`` (``environment``: a task environment's name, ``venvs.py``: its packages first on
  the session's ``PATH``, read-only);
  ``VerificationFactory`` (protocol): ``verification_session(tarball)``, a session kept between
  verifications with its fork server warm (``station.py``). Both check their arguments into one
  ``SessionRequest`` (a frozen value) and hand it to ``open(request)``, the one method a factory
  that subclasses them defines: ``LocalFactory`` (bubblewrap on this machine), ``HttpFactory
  (base_url)`` (``gagar sandbox serve`` in a sandbox pod), ``HttpPoolFactory`` (every executor
  behind a headless Service) and ``AgentSandboxFactory`` (a claimed pod per session).
- ``Limits`` and ``ExecResult`` (pydantic); ``SandboxError`` (refused request),
  ``SandboxUnavailable`` (no isolation here: untrusted code must not run),
  ``SandboxInfraError`` (the machinery failed). ``check_isolation()`` raises ``SandboxUnavailable``
  with the reason when bubblewrap is missing or cannot create its namespaces.

What it protects against (each has a test in ``tests/integration/test_sandbox_adversarial.py``
or ``test_sandbox_hostile.py``; ``docs/security.md`` maps each promise to its test): code under
test reaching the network (own network namespace: only its own loopback), seeing or signalling
host processes (own PID namespace, a private unprivileged uid, no capabilities, ``no_new_privs``),
reading host files or the executor's environment (only ``/usr``, the Python installation and a few
``/etc`` files exist inside, all read-only; the environment is rebuilt from scratch), writing
anywhere but its workspace, ``/tmp`` and a bounded ``/dev/shm``, new namespaces, the kernel
keyring, io_uring, perf, bpf, userfaultfd and mounts (a seccomp filter, ``seccomp.py``), filling
the disk (workspace and ``/tmp`` on a size- and inode-limited tmpfs when the executor is root:
``limit_hit="disk"``), fork bombs (``RLIMIT_NPROC`` and a pids cgroup), memory bombs (memory
cgroup when available, ``RLIMIT_AS``), infinite loops (CPU rlimit), sleeping forever (wall clock,
then the whole process group and the PID namespace are killed), flooding output (captured up to a
cap, the rest dropped), leaving processes behind (the PID namespace dies with the command;
whatever the session uid still owns is killed), symlinks or FIFOs that would lead the host's file
operations out of the workspace, and trees that would break the host's walks (iterative, bounded
in depth, entries and bytes read; removal by descriptor, never following links).

What it does not protect against: kernel exploits (bubblewrap shares the host kernel; the filter
narrows it, a gVisor ``runtimeClassName`` in pods replaces it), disk space when the executor
cannot mount (a non-root sandbox pod: its emptyDir's ``sizeLimit`` bounds it), CPU contention
between sessions (no CPU shares), and side channels. Exit codes above 128 are read as "killed by
signal N" (bubblewrap's convention), and a command's own output is never used to decide what
happened to it. Python ignores SIGXFSZ, so a Python program over the file-size limit sees
``EFBIG`` and is reported as an ordinary failure.

A local bubblewrap session of a root executor runs its Python commands (``python -m pytest ...``)
warm: forked from a fork server it starts in its own jail with pytest imported (``warm.py``),
each run with its own cgroups, clock, capture and limits and nothing of the previous run; where
the server cannot start or the code broke it, the command runs cold and the result says why
(``ExecResult.warm_fallback``). Verification runs warm only in a station (``station.py``): a
session kept for verification, whose server no candidate's code ever ran in.

Where the container runtime forbids namespaces (a stock runc node's seccomp profile), bubblewrap
cannot run: the ``pod`` isolation mode (``podjail.py``) then runs each command without namespaces,
as a leased uid with no capabilities under the same filter (plus no IP sockets), rlimits and
cgroups, and leaves the filesystem view, the PID space and the kernel boundary to the pod's
runtime class (gVisor, Kata). ``isolation.choose("auto")`` probes and takes the strongest mode
that works here, and says which; ``LocalFactory(isolation="pod")`` asks for it directly.

The shape: each isolation mode is a ``Jail`` (``jail.py``) in a file of its own, a peer of the
others (``nojail.py``, ``bwrapjail.py``, ``podjail.py``, ``warm.py``), none importing the session
(``local.py``) or another mode; the session picks its jail once, when it is created, and hands it
a ``jail.View`` of itself with each command. ``jail.finish`` is the one end of every run (wait,
cgroup counters, kill what is left, classify, result) and ``jail.backstop`` the one computation
of the rlimits behind the cgroups. ``bwrap.py`` builds a bubblewrap command line (pure),
``runner.py`` runs and captures one process tree, ``classify.py`` turns observations into an
``ExecResult`` (pure), ``host.py`` keeps uid leases and owner locks and sweeps dead sessions,
``station.py`` keeps sessions for verification, ``server.py``/``client.py`` serve sessions over
HTTP and ``agent.py`` claims a pod per session.
"""

from gagar.sandbox.types import (
    Command,
    ExecResult,
    FileData,
    Isolation,
    LimitKind,
    Limits,
    SandboxError,
    SandboxInfraError,
    SandboxUnavailable,
    Session,
    SessionFactory,
    SessionRequest,
    VerificationFactory,
)

__all__ = [
    "Command",
    "ExecResult",
    "FileData",
    "Isolation",
    "LimitKind",
    "Limits",
    "SandboxError",
    "SandboxInfraError",
    "SandboxUnavailable",
    "Session",
    "SessionFactory",
    "SessionRequest",
    "VerificationFactory",
]
