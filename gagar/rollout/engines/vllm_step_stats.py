"""gagar's vLLM plugin: a line per engine step, for benchmarks (off unless asked for).

With ``GAGAR_VLLM_STEP_STATS=<file>`` in the server's environment, the engine core appends one
line per non-empty scheduler step to ``<file>``: ``monotonic_time running waiting
scheduled_seqs scheduled_tokens prefill_tokens``. ``running`` is the number of requests the
scheduler holds as running after the step was scheduled (the batch), ``scheduled_tokens`` the
step's tokens, ``prefill_tokens`` those of requests given more than one token (no speculative
decoding here, so a decoding request gets exactly one). ``bench/rollout.py`` reads the lines each
side added and reports batch sizes over time and the number of steps. Unset, nothing is patched.
Loaded in every vLLM process through the ``vllm.general_plugins`` entry point; only the engine
core has a scheduler.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "GAGAR_VLLM_STEP_STATS"
_MARK = "_gagar_step_stats"


@dataclass(frozen=True)
class Step:
    t: float
    running: int
    waiting: int
    seqs: int
    tokens: int
    prefill_tokens: int

    @property
    def decode_tokens(self) -> int:
        return self.tokens - self.prefill_tokens

    def line(self) -> str:
        return (
            f"{self.t:.6f} {self.running} {self.waiting} {self.seqs} {self.tokens} "
            f"{self.prefill_tokens}\n"
        )

    @classmethod
    def parse(cls, line: str) -> Step:
        t, *ints = line.split()
        if len(ints) != 5:
            raise ValueError(f"not a step line: {line!r}")
        return cls(float(t), *(int(x) for x in ints))


def step_of(running: int, waiting: int, scheduled: dict[str, int], t: float) -> Step:
    """A step from the scheduler's counts and its ``num_scheduled_tokens`` (request -> tokens)."""
    tokens = sum(scheduled.values())
    prefill = sum(n for n in scheduled.values() if n > 1)
    return Step(t, running, waiting, len(scheduled), tokens, prefill)


def read_steps(path: Path, start: int = 0) -> tuple[list[Step], int]:
    """The complete lines of ``path`` from byte ``start``, and the offset after them."""
    try:
        data = path.read_bytes()[start:]
    except FileNotFoundError:
        return [], start
    end = data.rfind(b"\n") + 1  # a line being written stays for the next read
    steps = [Step.parse(x) for x in data[:end].decode().splitlines() if x.strip()]
    return steps, start + end


def register() -> None:
    """Entry point: wrap ``Scheduler.schedule`` when ``$GAGAR_VLLM_STEP_STATS`` names a file."""
    path = os.environ.get(ENV)
    if not path:
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.schedule
    if getattr(original, _MARK, False):
        return
    out: list[Any] = []  # the file, opened by the first step (only the engine core steps)

    @functools.wraps(original)
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if result.total_num_scheduled_tokens:
            if not out:
                out.append(open(path, "a", buffering=1))
            step = step_of(
                len(self.running), len(self.waiting), result.num_scheduled_tokens, time.monotonic()
            )
            out[0].write(step.line())
        return result

    setattr(schedule, _MARK, True)
    Scheduler.schedule = schedule
