"""``spec.algorithm`` reaches the learner the driver builds (``setup.build_learner``): the
optimizer's learning rate, betas and weight decay, the gradient clip and micro-batch size, and
every scalar of the policy loss (their effects are the learner's and the loss's own tests:
tests/unit/test_learner.py, tests/unit/test_loss.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gagar.driver.setup import build_learner
from gagar.spec import GagarRun
from tests.support.random_models import save_random_hf_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from gagar.trainer.model import Parallel, build_model, init_distributed, read_config

    tmp = tmp_path_factory.mktemp("learner")
    init_distributed(Parallel(), rank=0, world_size=1, init_method=f"file://{tmp}/rdzv")
    save_random_hf_model("llama", str(tmp / "hf"), vocab_size=256)
    return build_model(read_config(Path(tmp / "hf")))


def test_algorithm_settings_reach_the_optimizer_and_the_loss(model) -> None:  # type: ignore[no-untyped-def]
    run = GagarRun.model_validate(
        {
            "metadata": {"name": "learner"},
            "spec": {
                "model": {"preset": "tiny"},
                "algorithm": {
                    "microBatchSize": 3,
                    "optimizer": {
                        "lr": 3e-4,
                        "betas": [0.8, 0.95],
                        "weightDecay": 0.1,
                        "gradClip": 0.5,
                    },
                    "loss": {
                        "aggregation": "seq-mean-token-sum-norm",
                        "clipLow": 0.1,
                        "clipHigh": 0.3,
                        "dualClip": 4.0,
                        "truncatedIsCap": 2.5,
                        "kl": {"estimator": "k2"},
                    },
                },
                "rollout": {"replicas": 1, "agent": {"maxContextTokens": 512}},
            },
        }
    )
    learner = build_learner(run, model)
    (group,) = learner.optimizer.param_groups
    assert (group["lr"], group["betas"], group["weight_decay"]) == (3e-4, (0.8, 0.95), 0.1)
    assert (learner.cfg.micro_batch_size, learner.cfg.grad_clip) == (3, 0.5)
    loss = learner.cfg.loss
    assert (loss.agg_mode, loss.eps_low, loss.eps_high, loss.dual_clip) == (
        "seq-mean-token-sum-norm",
        0.1,
        0.3,
        4.0,
    )
    assert (loss.tis_cap, loss.kl_estimator, loss.max_len) == (2.5, "k2", 512)
