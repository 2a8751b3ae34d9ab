"""The CPU generator gagar's vLLM plugin gives seeded requests (the real engine: test_vllm_engine)."""

from __future__ import annotations

import torch

from gagar.rollout.engines.vllm_cpu_seeds import RewindlessGenerator, rewindless


def test_keeps_the_generators_state_and_draws():
    gen = torch.Generator().manual_seed(17)
    torch.rand(5, generator=gen)  # a generator some way into its stream
    wrapped = rewindless(gen)
    assert isinstance(wrapped, RewindlessGenerator)
    assert torch.equal(torch.rand(8, generator=wrapped), torch.rand(8, generator=gen))
    q = torch.empty(6)
    assert torch.equal(q.exponential_(generator=wrapped), q.clone().exponential_(generator=gen))


def test_the_offset_rewind_is_a_no_op_and_wrapping_is_idempotent():
    wrapped = rewindless(torch.Generator().manual_seed(3))
    before = wrapped.get_state()
    wrapped.set_offset(wrapped.get_offset() - 4)  # what vLLM 0.32 does after a discarded draw
    assert torch.equal(wrapped.get_state(), before)
    assert rewindless(wrapped) is wrapped
    assert rewindless(None) is None
