"""Turn what the executor observed about a run into an ``ExecResult`` (pure).

Only the executor's own observations count: its wall clock, the wait status, bubblewrap's JSON
status records and the kernel's cgroup counters. What the command printed never decides anything,
and neither does the value of its exit status: bubblewrap reports a child killed by signal N as
``128 + N``, exactly as it reports ``exit 128+N``. A jailed command's signal comes from the jail's
waiter (``bwrap.WAITER``), which reports the wait status on a pipe of its own; without its record
(a non-root jail whose command killed it) a status above 128 stays an exit status, no signal is
made up from it (nor from a shell's ``exit 152`` after its child was killed). A limit is reported only where the executor saw it: its own kill at the wall
clock, the cgroup's OOM kill or ``pids.max``, the CPU time it measured reaching the limit, a file
it found at the size limit.
"""

from __future__ import annotations

import signal

from gagar.sandbox.cgroup import Stats
from gagar.sandbox.runner import Outcome
from gagar.sandbox.types import ExecResult, LimitKind, Limits


def classify(
    outcome: Outcome,
    limits: Limits,
    stats: Stats | None,
    jailed: bool,
    disk_full: bool = False,
    file_at_limit: bool = False,
) -> ExecResult:
    """Turn what the executor observed into an ``ExecResult`` (pure). ``disk_full``: the
    session's quota filesystem had no space or inodes left when the command ended;
    ``file_at_limit``: a file of the session had reached ``limits.file_size_bytes``."""
    exit_code, sig = outcome.exit_code, outcome.signal
    infra = None
    finished = any("exit-code" in r for r in outcome.status)
    if jailed and not outcome.timed_out and not finished:
        tail = outcome.stderr.decode(errors="replace").strip()[-500:]
        infra = f"bubblewrap did not start the command: {tail or 'no message'}"
    waited = outcome.waited[0] if len(outcome.waited) == 1 else {}  # more than one: not ours
    if jailed and sig is None and isinstance(waited.get("signal"), int):
        sig, exit_code = waited["signal"], None
    return ExecResult(
        exit_code=exit_code,
        signal=sig,
        stdout=outcome.stdout.decode(errors="replace"),
        stderr=outcome.stderr.decode(errors="replace"),
        timed_out=outcome.timed_out,
        limit_hit=_limit_hit(outcome, sig, limits, stats, file_at_limit)
        or ("disk" if disk_full else None),
        truncated=outcome.truncated,
        duration_s=round(outcome.duration_s, 4),
        cpu_time_s=round(_cpu(outcome, stats), 4),
        infra_error=infra,
    )


def _cpu(outcome: Outcome, stats: Stats | None) -> float:
    """The larger of the kernel's two counts of the run's CPU time: the cgroup's (the whole tree,
    exact scheduler runtime) and ``wait4``'s (the waited process and its reaped children: past
    bubblewrap it sees nothing, but it is the tick-sampled user + system time that
    ``RLIMIT_CPU`` fires on, which on a contended machine runs ahead of the exact runtime: a
    ``SIGXCPU`` at a 2 s limit was seen with 1.57 s in the cgroup)."""
    if stats is not None and stats.cpu_time_s is not None:
        return max(stats.cpu_time_s, outcome.cpu_time_s)
    return outcome.cpu_time_s


def _limit_hit(
    outcome: Outcome, sig: int | None, limits: Limits, stats: Stats | None, file_at_limit: bool
) -> LimitKind | None:
    """The limit that ended the run, from the executor's own observations. The signal (or, where
    a shell passed its child's kill on, the status 128+N) only says which limit to look at; the
    measurement decides: CPU time at the limit, a file at the size limit."""
    if stats and stats.oom_killed:
        return "memory"
    if stats and stats.pids_max_hit:
        return "processes"
    if outcome.timed_out:
        return "wall_time"
    code = outcome.exit_code if outcome.exit_code is not None and outcome.exit_code > 128 else 0
    claimed = {sig, code - 128}
    # RLIMIT_CPU fires on the kernel's tick accounting, a little ahead of the measured time
    cpu_out = _cpu(outcome, stats) >= 0.9 * limits.cpu_time_s
    if claimed & {signal.SIGXCPU, signal.SIGKILL} and cpu_out:
        return "cpu_time"
    if signal.SIGXFSZ in claimed and file_at_limit:
        return "file_size"
    return None
