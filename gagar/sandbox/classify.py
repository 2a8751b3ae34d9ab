"""Turn what the executor observed about a run into an ``ExecResult`` (pure).

Only the executor's own observations count: its wall clock, the wait status, bubblewrap's JSON
status records and the kernel's cgroup counters. What the command printed never decides anything.
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
) -> ExecResult:
    """Turn what the executor observed into an ``ExecResult`` (pure). ``disk_full``: the
    session's quota filesystem had no space or inodes left when the command ended."""
    exit_code, sig = outcome.exit_code, outcome.signal
    infra = None
    finished = any("exit-code" in r for r in outcome.status)
    if jailed and not outcome.timed_out and not finished:
        tail = outcome.stderr.decode(errors="replace").strip()[-500:]
        infra = f"bubblewrap did not start the command: {tail or 'no message'}"
    if jailed and sig is None and exit_code is not None and exit_code > 128:
        sig = exit_code - 128  # bubblewrap reports a signalled child as 128+N
        exit_code = None
    return ExecResult(
        exit_code=exit_code,
        signal=sig,
        stdout=outcome.stdout.decode(errors="replace"),
        stderr=outcome.stderr.decode(errors="replace"),
        timed_out=outcome.timed_out,
        limit_hit=_limit_hit(outcome, sig, limits, stats) or ("disk" if disk_full else None),
        truncated=outcome.truncated,
        duration_s=round(outcome.duration_s, 4),
        cpu_time_s=round(_cpu(outcome, stats), 4),
        infra_error=infra,
    )


def _cpu(outcome: Outcome, stats: Stats | None) -> float:
    if stats is not None and stats.cpu_time_s is not None:
        return stats.cpu_time_s
    return outcome.cpu_time_s


def _limit_hit(
    outcome: Outcome, sig: int | None, limits: Limits, stats: Stats | None
) -> LimitKind | None:
    if stats and stats.oom_killed:
        return "memory"
    if stats and stats.pids_max_hit:
        return "processes"
    cpu = _cpu(outcome, stats)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits.cpu_time_s):
        return "cpu_time"
    if sig == signal.SIGXFSZ:
        return "file_size"
    if outcome.timed_out:
        return "wall_time"
    return None
