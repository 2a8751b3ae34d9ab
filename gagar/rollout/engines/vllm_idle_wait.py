"""gagar's vLLM plugin: on CPU, vLLM's processes wait for each other without spinning.

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

Here the readers go straight to the socket wait (vLLM's own idle path: the writer notifies on
every message), so waiting costs nothing. ``GAGAR_VLLM_BUSY_LOOP_S`` sets the spin explicitly
(``1`` is vLLM's own default; ``bench/rollout.py --vllm-busy-loop 1`` measures it); unset, it is
0 on CPU and vLLM's default elsewhere. Only IPC waiting changes: which requests a step batches
and what they sample do not. Loaded in every vLLM process through the ``vllm.general_plugins``
entry point.
"""

from __future__ import annotations

import functools
import os
from typing import Any

ENV = "GAGAR_VLLM_BUSY_LOOP_S"
_MARK = "_gagar_idle_wait"


def busy_loop_seconds(env: dict[str, str] | None = None, *, on_cpu: bool) -> float | None:
    """The readers' spin in seconds: ``$GAGAR_VLLM_BUSY_LOOP_S``, else 0 on CPU, else None
    (vLLM's default)."""
    raw = (os.environ if env is None else env).get(ENV, "").strip()
    if not raw:
        return 0.0 if on_cpu else None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected seconds (a number >= 0)") from None
    if not value >= 0:  # also NaN
        raise ValueError(f"{ENV}={raw!r}: expected seconds (a number >= 0)")
    return value


def register() -> None:
    """Entry point: wrap ``SpinCondition.__init__`` (idempotent per process)."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    from vllm.platforms import current_platform

    spin = busy_loop_seconds(on_cpu=current_platform.is_cpu())
    original = SpinCondition.__init__
    if spin is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def init(self: Any, is_reader: bool, *args: Any, **kwargs: Any) -> None:
        original(self, is_reader, *args, **kwargs)
        if is_reader:
            self.busy_loop_s = spin

    setattr(init, _MARK, True)
    SpinCondition.__init__ = init
