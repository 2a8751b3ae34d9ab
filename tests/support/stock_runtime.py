"""Run a command as a stock container runtime runs a pod's container: ``python -m
tests.support.stock_runtime [--caps LIST] -- CMD ...``.

The seccomp filter is what containerd's and Docker's default profile refuses to a container
without ``CAP_SYS_ADMIN`` (moby ``profiles/seccomp/default.json``, containerd's
``contrib/seccomp``): new namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*``
flag, ``clone3`` answering ``ENOSYS`` so that the C library falls back to ``clone``), the mount
family, ``pivot_root``, ``bpf``, ``perf_event_open``, ``fanotify_init``, ``open_by_handle_at``,
``name_to_handle_at``, ``quotactl``, ``syslog``, ``sethostname``/``setdomainname``, the keyring,
``userfaultfd``, ``acct``, ``kexec``, module loading, ``reboot`` and swap; all with ``EPERM`` as
those profiles answer. The profile is an allow-list; as a deny-list this keeps every other call,
which only makes the test kinder to the code under it, never to bubblewrap. ``wrap`` also gives
the command a ``/proc`` masked as runc masks it (``masked_proc``). ``--caps`` narrows
the capability bounding set (a root container with ``drop: [ALL]`` and these added), then
``no_new_privs`` and the filter are set and ``CMD`` executed.
"""

from __future__ import annotations

import errno
import os
import sys

CLONE_NEW = 0x7E020000  # every CLONE_NEW* flag clone(2) takes (the profiles' mask)
DENIED = (
    "unshare",
    "setns",
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
    "bpf",
    "perf_event_open",
    "fanotify_init",
    "open_by_handle_at",
    "name_to_handle_at",
    "quotactl",
    "syslog",
    "sethostname",
    "setdomainname",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "acct",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
)
# What the rendered ``pod``/``auto`` sandbox pods add to ``drop: [ALL]`` (builders/sandbox.py).
POD_CAPS = "setuid,setgid,chown,fowner,dac_override,kill,setpcap"


# runc's defaults (config.json's maskedPaths and readonlyPaths): a /proc with parts covered.
MASKED = ("kcore", "keys", "latency_stats", "timer_list", "sched_debug", "acpi", "scsi")
READ_ONLY = ("bus", "fs", "irq", "sys", "sysrq-trigger")


def masked_proc() -> list[str]:
    """A PID namespace with a fresh ``/proc`` masked as runc masks a container's (bubblewrap,
    privileged, is the runtime here; everything else of the host stays as it is)."""
    argv = ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc"]
    for name in MASKED:
        if os.path.exists(f"/proc/{name}"):
            argv += (
                ["--tmpfs", f"/proc/{name}"]
                if os.path.isdir(f"/proc/{name}")
                else ["--ro-bind", "/dev/null", f"/proc/{name}"]
            )
    for name in READ_ONLY:
        if os.path.exists(f"/proc/{name}"):
            argv += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    return [*argv, "--die-with-parent", "--"]


def wrap(argv: list[str], caps: str | None = POD_CAPS, masked: bool = True) -> list[str]:
    """``argv`` as the stock runtime starts it: under a masked ``/proc`` (``masked``), with the
    capabilities ``caps`` (``None``: keep this process's), ``no_new_privs`` and the filter."""
    extra = ["--caps", caps] if caps is not None else []
    outer = masked_proc() if masked else []
    return [*outer, sys.executable, "-m", "tests.support.stock_runtime", *extra, "--", *argv]


def _load_filter() -> None:
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)  # sets no_new_privs before loading (libseccomp's default)
    refuse = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        f.add_rule(refuse, name)
    for bit in range(32):
        if CLONE_NEW >> bit & 1:
            f.add_rule(refuse, "clone", sc.Arg(0, sc.MASKED_EQ, 1 << bit, 1 << bit))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.load()


def main(args: list[str]) -> None:
    caps = None
    if args[:1] == ["--caps"]:
        caps, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if caps is not None and os.geteuid() == 0:  # setpriv drops the rest, then execs us again
        drop = ",".join(["-all", *(f"+{c}" for c in caps.split(","))])
        os.execvp(
            "setpriv",
            ["setpriv", f"--bounding-set={drop}", sys.executable, "-m", __spec__.name, "--", *args],
        )
    _load_filter()
    os.execvp(args[0], args)


if __name__ == "__main__":
    main(sys.argv[1:])
