"""Sandbox throughput: test executions per second, jailed vs. unisolated, at 1, 2 and 4 sessions.

Each worker owns one session (or, unisolated, one plain directory with the same files) and runs
the same command back to back. The jailed and unisolated runs alternate per concurrency level in
the same process, so background load affects both alike. Commands: ``pytest`` (a synthetic task's
visible tests, the executor's real workload) and ``true`` (the fixed cost of a jail).

Unisolated commands also start a new session (``setsid``), as bubblewrap's ``--new-session``
does: with ``sched_autogroup`` on, a new session is its own scheduling group, and on a shared,
loaded machine that alone made jailed runs look up to 2x *faster* than unisolated ones.

``--fixed-cost`` measures instead the fixed cost of one jailed command (median wall time of
``exec(["true"])``, and of creating plus closing a session) with the seccomp filter and the disk
quota each switched off and on, the four variants alternating in rounds. Switching them off is
done here only (by patching the executor's modules), never offered by the executor itself.

    .venv/bin/python bench/sandbox.py [--runs N] [--out bench/results/sandbox.json]
    .venv/bin/python bench/sandbox.py --fixed-cost [--runs N] [--out bench/results/sandbox-fixed-cost.json]
    .venv/bin/python bench/sandbox.py --verify [--runs N] [--baseline OLD/verify.py]
    .venv/bin/python bench/sandbox.py --waiter [--runs N] [--rounds R]
    .venv/bin/python bench/sandbox.py --warm [--runs N] [--rounds R] [--out bench/results/sandbox-warm.json]
    .venv/bin/python bench/sandbox.py --station [--runs N] [--rounds R] [--out bench/results/sandbox-station.json]

``--warm`` measures the CPU seconds of one pytest run (a synthetic task's visible tests) cold (a
fresh interpreter per run) and warm (forked from the session's fork server, ``warm.py``): the
user+system CPU of the run's process tree from its cgroups (for a warm run, plus the server's own
CPU during the run: the fork and the wait), the executor's own CPU per run (``RUSAGE_SELF``), and
the wall time, cold and warm alternating in rounds in one process; the server's start is reported
apart (once per session).

``--station`` measures one verification's run in a station (``station_cost``), each run in a
network namespace of its own against runs sharing the server's (the fallback).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save
from gagar.rollout.envs import synthetic
from gagar.sandbox import bwrap, bwrapjail, local
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits

COMMANDS = {
    "pytest": "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider",
    "true": "true",
}


def _plain_runner(files: dict[str, bytes]):
    root = Path(tempfile.mkdtemp(prefix="gagar-bench-"))
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    env = bwrap.sandbox_env([os.path.dirname(sys.executable)], None)
    env["HOME"] = env["TMPDIR"] = str(root)

    def run(cmd: str) -> bool:
        p = subprocess.run(
            cmd, shell=True, cwd=root, env=env, capture_output=True, start_new_session=True
        )
        return p.returncode == 0

    return run, lambda: subprocess.run(["rm", "-rf", str(root)], check=False)


def _jailed_runner(factory: LocalFactory, files: dict[str, bytes]):
    session = factory.create(files=files)
    return (lambda cmd: session.exec(cmd).ok), session.close


def _timed(make, cmd: str, workers: int, runs: int) -> float:
    """Seconds for ``workers`` threads, each with its own runner, to run ``cmd`` ``runs`` times."""
    runners = [make() for _ in range(workers)]
    failures: list[str] = []

    def work(run) -> None:
        for _ in range(runs):
            if not run(cmd):
                failures.append(cmd)

    threads = [threading.Thread(target=work, args=(r,)) for r, _ in runners]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for _, close in runners:
        close()
    if failures:
        raise RuntimeError(f"{len(failures)} runs of {cmd!r} failed")
    return elapsed


def _compare(files, factory, cmd: str, workers: int, runs: int, rounds: int) -> tuple[float, float]:
    """Rates (runs/s) unisolated and jailed, alternating in short rounds so drift hits both."""
    plain = jailed = 0.0
    for _ in range(rounds):
        plain += _timed(lambda: _plain_runner(files), cmd, workers, runs)
        jailed += _timed(lambda: _jailed_runner(factory, files), cmd, workers, runs)
    total = workers * runs * rounds
    return total / plain, total / jailed


@contextlib.contextmanager
def _variant(seccomp: bool, quota: bool):
    """The executor with its seccomp filter and/or its disk quota switched off (bench only)."""
    saved = (bwrapjail.filter_bpf, local.quota.try_mount, local.bwrap.bwrap_argv)

    def argv_without_seccomp(*a, **k):
        argv = saved[2](*a, **k)
        i = argv.index("--seccomp")
        return argv[:i] + argv[i + 2 :]

    if not seccomp:
        bwrapjail.filter_bpf = lambda: None  # type: ignore[assignment]
        local.bwrap.bwrap_argv = argv_without_seccomp  # type: ignore[assignment]
    if not quota:
        local.quota.try_mount = lambda *a: False  # type: ignore[assignment]
    try:
        yield
    finally:
        bwrapjail.filter_bpf, local.quota.try_mount, local.bwrap.bwrap_argv = saved


def waiter_cost(runs: int, rounds: int, out: str) -> int:
    """Median ms of ``exec(["true"])`` with the jail's waiter (``bwrap.WAITER``) and without it
    (bench only), alternating in rounds."""
    import dataclasses

    factory = LocalFactory(limits=Limits(wall_time_s=60))
    jail = local.LocalSession._jail
    times: dict[bool, list[float]] = {True: [], False: []}
    with factory.create(files={"a.py": "print(1)\n"}) as session:
        for _ in range(rounds):
            for waiter in (True, False):
                if not waiter:
                    local.LocalSession._jail = lambda self: dataclasses.replace(  # type: ignore[method-assign]
                        jail(self), waiter=None
                    )
                try:
                    for _ in range(runs):
                        t = time.perf_counter()
                        if not session.exec(["true"]).ok:
                            raise RuntimeError("true failed")
                        times[waiter].append(time.perf_counter() - t)
                finally:
                    local.LocalSession._jail = jail  # type: ignore[method-assign]
    med = {w: round(statistics.median(v) * 1e3, 2) for w, v in times.items()}
    print(f"{'waiter':<8}{'exec true ms':>14}")
    for w in (False, True):
        print(f"{w!s:<8}{med[w]:>14}")
    result = {
        "benchmark": "sandbox-waiter-cost",
        "load_avg": os.getloadavg(),
        "exec_median_ms": {"with_waiter": med[True], "without_waiter": med[False]},
        "n": len(times[True]),
    }
    save(out, result, indent=2)
    print(f"wrote {out}")
    return 0


def fixed_cost(runs: int, rounds: int, out: str) -> int:
    """Median ms of ``exec(["true"])`` and of create+close, per variant, alternating in rounds."""
    factory = LocalFactory(limits=Limits(wall_time_s=60))
    variants = [(False, False), (True, False), (False, True), (True, True)]
    execs: dict[tuple[bool, bool], list[float]] = {v: [] for v in variants}
    lives: dict[tuple[bool, bool], list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            with _variant(*v):
                t = time.perf_counter()
                session = factory.create(files={"a.py": "print(1)\n"})
                for _ in range(runs):
                    t1 = time.perf_counter()
                    if not session.exec(["true"]).ok:
                        raise RuntimeError(f"variant {v}: true failed")
                    execs[v].append(time.perf_counter() - t1)
                t2 = time.perf_counter()
                session.close()
                lives[v].append(time.perf_counter() - t2 + (t2 - t) - sum(execs[v][-runs:]))
    rows = []
    print(f"{'seccomp':<9}{'quota':<7}{'exec true ms':>14}{'create+close ms':>17}")
    for v in variants:
        row = {
            "seccomp": v[0],
            "quota": v[1],
            "exec_median_ms": round(statistics.median(execs[v]) * 1e3, 2),
            "create_close_median_ms": round(statistics.median(lives[v]) * 1e3, 2),
            "n": len(execs[v]),
        }
        rows.append(row)
        print(
            f"{v[0]!s:<9}{v[1]!s:<7}{row['exec_median_ms']:>14}{row['create_close_median_ms']:>17}"
        )
    result = {"benchmark": "sandbox-fixed-cost", "load_avg": os.getloadavg(), "rows": rows}
    save(out, result, indent=2)
    print(f"wrote {out}")
    return 0


def verify_cost(runs: int, baseline: str | None, out: str) -> int:
    """Median wall time of one verification (``verify_files`` of a synthetic task's reference
    fix: two sessions, the archive, the restore, the test run), today's verifier against
    ``baseline`` (a ``verify.py`` of an older checkout, loaded beside it), alternating."""
    import importlib.util

    from gagar.rollout.envs import verify

    variants = {"current": verify.verify_files}
    if baseline:
        spec = importlib.util.spec_from_file_location("gagar_verify_baseline", baseline)
        old = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(old)  # type: ignore[union-attr]
        variants["baseline"] = old.verify_files
    task = synthetic.generate(5)
    files = task.fixed_files()
    factory = LocalFactory(limits=Limits(wall_time_s=120, cpu_time_s=60))
    times: dict[str, list[float]] = {k: [] for k in variants}
    load_start = os.getloadavg()
    for _ in range(runs):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            v = fn(task, files, factory)
            times[name].append(time.perf_counter() - t0)
            assert v.passed, (name, v.log[-500:])
    result = {
        "what": "seconds per verification of a synthetic task's reference fix",
        "runs": runs,
        "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "host": platform.node(),  # save adds the CPU (this was "machine")
    }
    for k, v in result["median_s"].items():  # type: ignore[union-attr]
        print(f"{k:<10}{v:>8.3f} s per verification (median of {runs})")
    save(out, result, indent=2)
    print(f"wrote {out}")
    return 0


WARM_COMMANDS = {
    "pytest": COMMANDS["pytest"],
    "pytest-autoload": "python -m pytest -q -p no:cacheprovider",  # entry-point plugins scanned
}


def warm_cost(runs: int, rounds: int, out: str) -> int:
    """CPU seconds per pytest run, cold against warm, alternating in rounds (see the docstring)."""
    import resource

    files = synthetic.generate(3).repo_files()
    limits = Limits(wall_time_s=120, cpu_time_s=60)
    modes = {"cold": LocalFactory(limits=limits, warm=False), "warm": LocalFactory(limits=limits)}
    load_start = os.getloadavg()
    rows: list[dict[str, Any]] = []
    print(f"{'command':<17}{'mode':<6}{'cpu s/run':>11}{'executor s/run':>16}{'wall s/run':>12}")
    for name, cmd in WARM_COMMANDS.items():
        sessions = {m: f.create(files=files) for m, f in modes.items()}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        own: dict[str, list[float]] = {m: [] for m in modes}
        wall: dict[str, list[float]] = {m: [] for m in modes}
        try:
            for _ in range(rounds):
                for mode, session in sessions.items():
                    for _ in range(runs):
                        before = resource.getrusage(resource.RUSAGE_SELF)
                        r = session.exec(cmd)
                        after = resource.getrusage(resource.RUSAGE_SELF)
                        if not r.ok or r.warm != (mode == "warm"):
                            raise RuntimeError(f"{mode} {name}: {r.describe()} {r.warm_fallback}")
                        cpu[mode].append(r.cpu_time_s)
                        own[mode].append(
                            after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                        )
                        wall[mode].append(r.duration_s)
            start_cpu = sessions["warm"]._warm.start_cpu_s  # type: ignore[union-attr]
        finally:
            for session in sessions.values():
                session.close()
        for mode in modes:
            row = {
                "command": name,
                "mode": mode,
                "cpu_s_per_run": round(statistics.median(cpu[mode]), 4),
                "executor_cpu_s_per_run": round(statistics.median(own[mode]), 4),
                "wall_s_per_run": round(statistics.median(wall[mode]), 4),
                "n": len(cpu[mode]),
            }
            if mode == "warm":
                row["server_start_cpu_s"] = round(start_cpu or 0.0, 4)
            rows.append(row)
            print(
                f"{name:<17}{mode:<6}{row['cpu_s_per_run']:>11.4f}"
                f"{row['executor_cpu_s_per_run']:>16.4f}{row['wall_s_per_run']:>12.4f}"
            )
        ratio = rows[-2]["cpu_s_per_run"] / max(rows[-1]["cpu_s_per_run"], 1e-9)
        print(f"{name:<17}cold/warm CPU per run: {ratio:.2f}x; server start {start_cpu:.3f} CPU s")
    result = {
        "benchmark": "sandbox-warm-runner",
        "what": "median CPU seconds (user+sys of the run's process tree) per pytest run",
        "runs_per_round": runs,
        "rounds": rounds,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    save(out, result, indent=2)
    print(f"wrote {out}")
    return 0


STATION_COMMANDS = {
    "pytest": COMMANDS["pytest"],  # a synthetic task's visible tests
    "pass": "python -I -B -c pass",  # the fixed cost of a warm run
}


def station_cost(runs: int, rounds: int, out: str) -> int:
    """Per verification in a station (``station.py``): one candidate's archive refilled into an
    idle station, one command run warm, the station given back. Each run in a network namespace
    of its own (``netns``, the default) against runs sharing the server's namespace, whose sockets
    are checked after each run (``shared``: the fallback where the kernel refuses user
    namespaces; ``warm.RUN_NETNS`` off, patched here only), alternating in rounds. Run on an
    older checkout (no ``RUN_NETNS``), both modes measure that checkout."""
    from gagar.sandbox import warm
    from gagar.sandbox.workspace import files_tarball

    tarball = files_tarball(synthetic.generate(3).repo_files())
    limits = Limits(wall_time_s=120, cpu_time_s=60)
    modes = {"netns": True, "shared": False}
    load_start = os.getloadavg()
    rows = []
    print(f"{'command':<8}{'mode':<8}{'cpu s/run':>11}{'executor s/run':>16}{'wall s/run':>12}")
    for name, cmd in STATION_COMMANDS.items():
        factories = {m: LocalFactory(limits=limits) for m in modes}
        samples: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
        for _ in range(rounds):
            for mode, factory in factories.items():
                warm.RUN_NETNS = modes[mode]  # read when a station's server starts
                for _ in range(runs + (factory.stations.made == 0)):  # the first starts it
                    sample = _station_run(factory, tarball, cmd, mode)
                    if factory.stations.reused:
                        samples[mode].append(sample)
        warm.RUN_NETNS = True
        for mode, factory in factories.items():
            factory.stations.close()
            cpu, own, wall = (statistics.median(x) for x in zip(*samples[mode], strict=True))
            row = {
                "command": name,
                "mode": mode,
                "cpu_s_per_run": round(cpu, 4),
                "executor_cpu_s_per_run": round(own, 4),
                "wall_s_per_run": round(wall, 4),
                "n": len(samples[mode]),
                "stations_made": factory.stations.made,
            }
            rows.append(row)
            print(f"{name:<8}{mode:<8}{cpu:>11.4f}{own:>16.4f}{wall:>12.4f}")
    result = {
        "benchmark": "sandbox-station",
        "what": "median per verification run in a station: run CPU (its cgroups, with the "
        "server's share), executor CPU (refill, exec, give back), wall",
        "runs_per_round": runs,
        "rounds": rounds,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    save(out, result, indent=2)
    print(f"wrote {out}")
    return 0


def _station_run(
    factory: LocalFactory, tarball: bytes, cmd: str, mode: str
) -> tuple[float, float, float]:
    """One verification's use of a station: (run CPU s, executor CPU s, wall s)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    with factory.verification_session(tarball) as s:
        r = s.exec(cmd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    if not r.warm or r.exit_code not in (0, 1):
        raise RuntimeError(f"{mode}: {r.describe()} {r.warm_fallback} {r.stderr}")
    own = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return r.cpu_time_s or 0.0, own, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs per worker (session) per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--out", default=None)
    ap.add_argument("--fixed-cost", action="store_true", help="fixed cost per command instead")
    ap.add_argument("--verify", action="store_true", help="cost per verification instead")
    ap.add_argument("--waiter", action="store_true", help="fixed cost of the jail's waiter")
    ap.add_argument("--warm", action="store_true", help="CPU per pytest run, cold vs warm")
    ap.add_argument("--station", action="store_true", help="cost per run in a station")
    ap.add_argument("--baseline", default=None, help="with --verify: an older verify.py")
    args = ap.parse_args()
    check_isolation()
    if args.station:
        out = args.out or "bench/results/sandbox-station.json"
        return station_cost(args.runs, args.rounds, out)
    if args.warm:
        return warm_cost(args.runs, args.rounds, args.out or "bench/results/sandbox-warm.json")
    if args.waiter:
        return waiter_cost(args.runs, args.rounds, args.out or "bench/results/waiter-cost.json")
    if args.verify:
        out = args.out or "bench/results/verify-cost.json"
        return verify_cost(args.runs, args.baseline, out)
    if args.fixed_cost:
        return fixed_cost(
            args.runs, args.rounds, args.out or "bench/results/sandbox-fixed-cost.json"
        )
    args.out = args.out or "bench/results/sandbox.json"
    print(f"{'command':<8}{'sessions':>9}{'unisolated/s':>16}{'sandboxed/s':>15}{'ratio':>8}")
    load_start = os.getloadavg()
    files = synthetic.generate(3).repo_files()
    factory = LocalFactory(limits=Limits(wall_time_s=120, cpu_time_s=60))
    rows = []
    for name, cmd in COMMANDS.items():
        runs = args.runs * (5 if name == "true" else 1)
        for workers in (1, 2, 4):
            plain, jailed = _compare(files, factory, cmd, workers, runs, args.rounds)
            rows.append(
                {
                    "command": name,
                    "sessions": workers,
                    "unisolated_per_s": round(plain, 2),
                    "sandboxed_per_s": round(jailed, 2),
                    "ratio": round(jailed / plain, 3),
                }
            )
            r = rows[-1]
            print(
                f"{name:<8}{workers:>9}{r['unisolated_per_s']:>16.2f}{r['sandboxed_per_s']:>15.2f}{r['ratio']:>8.3f}",
                flush=True,
            )
    result = {
        "benchmark": "sandbox",
        "machine": {"load_avg_at_end": os.getloadavg()},  # save adds the CPU and its cores
        "runs_per_worker_per_round": args.runs,
        "rounds": args.rounds,
        "load_avg_at_start": load_start,
        "rows": rows,
    }
    save(args.out, result, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
