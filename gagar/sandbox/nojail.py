"""``isolation="none"``: commands run directly on this host, under rlimits only.

For development on trusted code, and nothing else: it protects against nothing but runaway
resource use (CPU time, memory, processes, open files, file size, the wall clock and the output
cap) and says so loudly where a factory takes it (``local.UNSAFE_WARNING``). The command runs in
the session's workspace with its ``/tmp`` as ``HOME`` and ``TMPDIR`` and a rebuilt environment,
as the executor's uid: it can read and write whatever the executor can, reach the network and
signal the executor.
"""

from __future__ import annotations

from gagar.sandbox import bwrap, runner
from gagar.sandbox.jail import Cold, Run, View, finish, host_env, within_inherited
from gagar.sandbox.types import ExecResult


class NoJail(Cold):
    """No isolation at all; see the module docstring."""

    def run(self, view: View, argv: list[str], wall: float) -> ExecResult:
        launch = runner.Launch(
            argv=bwrap.rlimit_argv(within_inherited(view.limits)) + argv,
            wall_time_s=wall,
            output_bytes=view.limits.output_bytes,
            env=host_env(view, None),
            cwd=str(view.workspace),
        )
        return finish(view, lambda: runner.run(launch), Run())


__all__ = ["NoJail"]
