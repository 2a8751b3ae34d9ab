"""The seccomp filter every jailed command runs under, built with libseccomp (``pyseccomp``).

Everything is allowed except what a test suite never needs and a kernel exploit usually does
(the same choices as Docker's default profile, nsjail and gVisor): new namespaces of any kind
(``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag; a nested user namespace would
hand the code every capability inside it and with them nf_tables, raw sockets and mounts), the
kernel keyring (``keyctl``, ``add_key``, ``request_key``: keys would outlive the session and be
readable by the next one on the same uid), ``io_uring``, ``perf_event_open``, ``bpf``,
``userfaultfd``, the whole mount family (old and new API), module and kexec loading, ``ptrace``
of other processes is left alone (debuggers work; the PID namespace bounds it). Refused calls fail
with ``EPERM``; ``clone3`` fails with ``ENOSYS`` (its flags live in memory a filter cannot read),
so the C library falls back to ``clone``, whose flags the filter checks. System calls of other
architectures (32-bit ``int 0x80`` on x86-64) kill the process: libseccomp's default.

bubblewrap loads the filter (``--seccomp FD``) after it has built the namespaces and before it
executes the command, so the jail itself is unaffected. Built once per process (a few ms).
"""

from __future__ import annotations

import errno
import os
import socket
from functools import cache

# Namespace flags of clone(2); CLONE_NEWTIME (0x80) shares its bits with the exit signal in
# clone(2) and is only reachable through unshare, which is refused outright.
CLONE_NEW = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
REFUSED = (
    # namespaces
    "unshare",
    "setns",
    # kernel keyring
    "keyctl",
    "add_key",
    "request_key",
    # large kernel attack surface a test suite does not use
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    # mounts, old and new API
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    # the host's kernel and devices
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "open_by_handle_at",
)


# Calls that change a process's scheduling (for its children too), the process their first
# argument (0: the caller): refused for others where a process of the same uid that must not be
# steered shares the jail (``others=False``); setpriority, ioprio_set and prlimit64 below.
SCHED_OF_A_PID = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1


# What the warm runner's fork server makes for each run before the run's code starts: a network
# namespace of the run's own, in a user namespace (the capability the first needs, inside it only).
RUN_NETWORK = CLONE_NEW["CLONE_NEWUSER"] | CLONE_NEW["CLONE_NEWNET"]


@cache
def filter_bpf(
    ip_sockets: bool = True, mqueue: bool = True, others: bool = True, netns: bool = False
) -> bytes:
    """The compiled filter (classic BPF, as ``bwrap --seccomp`` reads it). ``ip_sockets=False``
    also refuses every socket but ``AF_UNIX`` (the ``pod`` mode, which has no network namespace
    of its own: the code must not reach the executor's port or the pod's network).
    ``mqueue=False`` also refuses ``mq_open`` (the warm runner's jail, ``warm.py``: its IPC
    namespace outlives a run, and POSIX queues, unlike System V objects, cannot be listed from
    inside to tell that a run left one). ``others=False`` also refuses to change the scheduling
    (nice, policy, affinity, I/O priority) or the resource limits of any process but the caller
    (a pid other than 0, a process group, a user): the warm runner's jail, whose fork server
    shares the run's uid and hands what it has to every later run. ``netns=True`` lets
    ``unshare`` through with exactly ``RUN_NETWORK``: the fork server's own filter, under which
    each run, before its code starts, makes its network namespace and then loads the filter
    without it (``warm_server.py``), so the run's code never may."""
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    refuse = sc.ERRNO(errno.EPERM)
    for name in REFUSED:
        if name == "unshare" and netns:
            f.add_rule(refuse, name, sc.Arg(0, sc.NE, RUN_NETWORK))
        else:
            f.add_rule(refuse, name)
    if not ip_sockets:
        f.add_rule(refuse, "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
    if not mqueue:
        f.add_rule(refuse, "mq_open")
    if not others:
        for name in SCHED_OF_A_PID:
            f.add_rule(refuse, name, sc.Arg(0, sc.NE, 0))
        f.add_rule(refuse, "setpriority", sc.Arg(0, sc.NE, PRIO_PROCESS))
        f.add_rule(refuse, "setpriority", sc.Arg(1, sc.NE, 0))
        f.add_rule(refuse, "ioprio_set", sc.Arg(0, sc.NE, IOPRIO_WHO_PROCESS))
        f.add_rule(refuse, "ioprio_set", sc.Arg(1, sc.NE, 0))
        f.add_rule(refuse, "prlimit64", sc.Arg(0, sc.NE, 0), sc.Arg(2, sc.NE, 0))
    for flag in CLONE_NEW.values():
        f.add_rule(refuse, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    fd = os.memfd_create("gagar-seccomp")  # libseccomp writes to a file descriptor
    with open(fd, "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()
