"""The isolation modes' contract (``gagar/sandbox/jail.py``): one registry, one end of a run,
one computation of the backstop rlimits."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import get_args

import pytest

from gagar.sandbox import jail, local, runner
from gagar.sandbox.cgroup import Stats
from gagar.sandbox.types import Isolation, Limits

LIMITS = Limits(memory_bytes=64 << 20, processes=10, file_size_bytes=1 << 16)


def test_every_isolation_has_one_jail_and_each_says_what_stations_ask() -> None:
    assert set(local.JAILS) == set(get_args(Isolation))
    for make in local.JAILS.values():
        mode = make()
        assert not mode.serving and mode.unfit() is not None  # cold: never a station's
        mode.stop()


def test_backstop_loosens_only_what_the_cgroups_bind_exactly() -> None:
    loose = jail.backstop(LIMITS, cgroup=True)
    assert (loose.memory_bytes, loose.processes) == (LIMITS.memory_bytes * 4, LIMITS.processes * 2)
    assert loose.cpu_time_s == LIMITS.cpu_time_s and loose.open_files == LIMITS.open_files
    assert jail.backstop(LIMITS, cgroup=False) == jail.within_inherited(LIMITS)


class FakeCgroup:
    def __init__(self, stats: Stats) -> None:
        self._stats, self.events = stats, []

    def stats(self) -> Stats:
        self.events.append("stats")
        return self._stats

    def destroy(self) -> None:
        self.events.append("destroy")


def _view(tmp_path: Path) -> jail.View:
    for name in ("workspace", "tmp"):
        (tmp_path / name).mkdir()
    return jail.View(tmp_path, None, LIMITS)


def test_finish_reads_the_counters_then_kills_then_removes_the_cgroups(tmp_path: Path) -> None:
    cg = FakeCgroup(Stats(oom_killed=True, pids_max_hit=False, cpu_time_s=0.5))
    run = jail.Run(cg, lambda: cg.events.append("kill"))  # type: ignore[arg-type]
    result = jail.finish(_view(tmp_path), lambda: runner.Outcome(signal=signal.SIGKILL), run)
    assert cg.events == ["stats", "kill", "destroy"]
    assert result.limit_hit == "memory" and result.cpu_time_s == 0.5 and not result.ok


def test_a_run_that_never_started_is_an_infrastructure_error_and_still_cleaned(
    tmp_path: Path,
) -> None:
    cg = FakeCgroup(Stats(oom_killed=False, pids_max_hit=False, cpu_time_s=None))

    def wait() -> runner.Outcome:
        raise OSError("no such file")

    result = jail.finish(_view(tmp_path), wait, jail.Run(cg))  # type: ignore[arg-type]
    assert result.infra_error and "no such file" in result.infra_error
    assert cg.events == ["stats", "destroy"]


def test_a_mode_names_why_its_launcher_did_not_start(tmp_path: Path) -> None:
    run = jail.Run(not_started=lambda outcome: "the launcher said nothing")
    result = jail.finish(_view(tmp_path), lambda: runner.Outcome(exit_code=1), run)
    assert result.infra_error == "the launcher said nothing"


@pytest.mark.parametrize(("size", "hit"), [(1 << 16, "file_size"), (10, None)])
def test_a_file_at_the_size_limit_is_what_names_the_limit(
    tmp_path: Path, size: int, hit: str | None
) -> None:
    view = _view(tmp_path)
    (view.workspace / "big").write_bytes(b"x" * size)
    result = jail.finish(view, lambda: runner.Outcome(signal=signal.SIGXFSZ), jail.Run())
    assert result.limit_hit == hit
