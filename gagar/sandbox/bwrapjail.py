"""``isolation="bwrap"``: every command in a bubblewrap jail of its own, built afresh.

The jail (``bwrap.py`` builds its command line from the session's ``View.layout``): new PID,
network (a loopback of its own), IPC, UTS, mount and cgroup namespaces; only ``/usr``, the
Python installation(s) and a few ``/etc`` files, read-only; the workspace, ``/tmp`` and a bounded
``/dev/shm`` writable; the session's leased uid with no capabilities and ``no_new_privs`` (a root
executor; otherwise an unprivileged user namespace); the seccomp filter (``seccomp.py``); the
session's rlimits (``jail.backstop``). Each run has fresh memory, pids and cpuacct cgroups where
the executor may make them, and whatever is left when it ends is killed: the cgroups' members,
or else every process of the session's uid. The jail's waiter (``bwrap.WAITER``) reports the
command's wait status, which bubblewrap's own exit status cannot tell from an ``exit 128+N``.
``docs/security.md`` maps each promise to its test.
"""

from __future__ import annotations

from gagar.sandbox import bwrap, runner
from gagar.sandbox.jail import Cold, Run, View, backstop, cgroups, finish
from gagar.sandbox.seccomp import filter_bpf
from gagar.sandbox.types import ExecResult


class BwrapJail(Cold):
    """A bubblewrap jail per command; see the module docstring."""

    def run(self, view: View, argv: list[str], wall: float) -> ExecResult:
        assert view.layout is not None, "a bubblewrap jail needs the session's layout"
        cg = cgroups(view)
        full = bwrap.bwrap_argv(view.layout, backstop(view.limits, cg is not None), argv)
        launch = runner.Launch(
            argv=cg.wrap(full) if cg else full,
            wall_time_s=wall,
            output_bytes=view.limits.output_bytes,
            env=bwrap.HOST_ENV,
            status_fd=True,
            seccomp=filter_bpf(),
        )
        uid = view.uid
        # the cgroups kill all inside; without them, every process of the session's uid
        kill = (lambda: runner.kill_uid(uid)) if cg is None and uid is not None else lambda: None
        return finish(view, lambda: runner.run(launch), Run(cg, kill, jailed=True))


__all__ = ["BwrapJail"]
