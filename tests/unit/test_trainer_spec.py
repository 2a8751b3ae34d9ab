"""The trainer's spec fields (``algorithm.miniBatches``, ``ppoEpochs``, ``microBatchTokens``,
``optimizer.schedule``,
``minLr``, ``warmupSteps``, ``loss.kl``): what validation refuses (pydantic and the CRD alike,
naming the field) and what the learner is built with."""

from __future__ import annotations

from typing import Any

import pytest

from gagar.crd import build_crd
from gagar.manifest import validate_document
from gagar.spec import GagarRun
from gagar.trainer.schedule import LRSchedule
from tests.support.crd_check import crd_errors
from tests.unit.test_spec import minimal, with_spec

REFUSED = [
    ({"optimizer": {"lr": 1e-5, "minLr": 1e-4}}, "minLr"),
    ({"optimizer": {"schedule": "linear"}}, "schedule"),
    ({"optimizer": {"warmupSteps": -1}}, "warmupSteps"),
    ({"miniBatches": 0}, "miniBatches"),
    ({"ppoEpochs": 0}, "ppoEpochs"),
    ({"microBatchTokens": 8}, "microBatchTokens"),
    ({"loss": {"kl": {"coef": -0.1}}}, "coef"),
]


@pytest.mark.parametrize(("algorithm", "field"), REFUSED, ids=[f for _, f in REFUSED])
def test_refused_by_pydantic_and_the_crd(algorithm: dict[str, Any], field: str) -> None:
    doc = with_spec("spec.algorithm", algorithm)
    run, problems = validate_document(doc)
    assert run is None and field in "\n".join(map(str, problems))
    assert crd_errors(doc, build_crd())


def test_accepted_fields_reach_the_learner_config(monkeypatch) -> None:
    from gagar.driver.setup import build_learner
    from gagar.trainer.model import parallel

    monkeypatch.setattr(parallel, "current_parallel", lambda: parallel.Parallel(1, 1, 1))
    alg = {
        "miniBatches": 3, "ppoEpochs": 2, "totalSteps": 10, "microBatchTokens": 4096,
        "optimizer": {"lr": 1e-3, "warmupSteps": 2, "schedule": "cosine", "minLr": 1e-4},
    }  # fmt: skip
    doc = with_spec("spec.algorithm", alg, minimal())
    assert crd_errors(doc, build_crd()) == []
    run = GagarRun.model_validate(doc)
    import torch

    model = torch.nn.Linear(2, 2)
    learner = build_learner(run, model)
    assert (learner.cfg.mini_batches, learner.cfg.epochs) == (3, 2)
    assert learner.cfg.micro_batch_tokens == 4096
    assert learner.cfg.lr == LRSchedule(1e-3, 2, "cosine", 1e-4, 10)
    assert learner.reference is None  # kl.coef 0: no reference model at all
    sft = build_learner(run, model, sft=True)
    assert (sft.cfg.mini_batches, sft.cfg.epochs, sft.cfg.lr) == (1, 1, None)


def test_dr_grpo_constant_is_the_maximum_response_length(monkeypatch) -> None:
    """Dr. GRPO divides by the maximum generated length, not the context length."""
    from gagar.driver.setup import build_learner
    from gagar.trainer.model import parallel

    monkeypatch.setattr(parallel, "current_parallel", lambda: parallel.Parallel(1, 1, 1))
    import torch

    agent = {"maxTurns": 4, "maxTokensPerTurn": 256, "maxContextTokens": 8192}
    doc = with_spec(
        "spec.algorithm", {"loss": {"aggregation": "seq-mean-token-sum-norm"}}, minimal()
    )
    doc = with_spec("spec.rollout.agent", agent, doc)
    learner = build_learner(GagarRun.model_validate(doc), torch.nn.Linear(2, 2))
    assert learner.cfg.loss.max_len == 4 * 256
    long = with_spec("spec.rollout.agent", agent | {"maxTurns": 64}, doc)
    assert (
        build_learner(GagarRun.model_validate(long), torch.nn.Linear(2, 2)).cfg.loss.max_len == 8192
    )
