"""On a CUDA machine (NCCL, no CPU patches): a sharded checkpoint saves CUDA tensors and a fresh
policy restores the same weights and AdamW moments onto the GPU.

Not run where there is no GPU (the conftest skips ``gpu`` tests); run on a lent accelerator with
``python -m pytest tests/gpu/test_checkpoint_gpu.py -m gpu``. The resharding itself (TP=2 / EP=2
to TP=1 DP=2 and back) is checked on the CPU in ``tests/e2e/test_checkpoint_reshard.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_sharded_checkpoint_round_trip_on_cuda(tmp_path: Path) -> None:
    from gagar.driver.setup import load_policy
    from gagar.trainer.checkpoint import CheckpointManager
    from gagar.trainer.distributed import RankState
    from gagar.trainer.learner import Learner, LearnerConfig
    from gagar.trainer.model import Parallel, cpu_compat, init_distributed
    from gagar.trainer.policy import MegatronPolicy
    from tests.e2e.test_checkpoint_reshard import _batch
    from tests.support.random_models import save_random_hf_model

    save_random_hf_model("qwen2", tmp_path / "hf")
    init_distributed(Parallel(), rank=0, world_size=1, init_method=f"file://{tmp_path}/rdzv")
    assert not cpu_compat.is_applied()

    def rank_state() -> RankState:
        model = load_policy(tmp_path / "hf")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        learner = Learner(MegatronPolicy(model), opt, LearnerConfig(micro_batch_size=2))
        return RankState(model, learner, CheckpointManager(tmp_path / "ckpt"), {"tp": 1})

    saved = rank_state()
    saved.update(_batch(1), 0)
    saved.save(1, {"policy_version": 1})
    restored = rank_state()
    assert restored.restore(1)["format"] == "megatron-dist"
    for p, q in zip(saved.model.parameters(), restored.model.parameters(), strict=True):
        assert q.is_cuda and torch.equal(p, q)
    for p, q in zip(saved.model.parameters(), restored.model.parameters(), strict=True):
        a, b = saved.learner.optimizer.state[p], restored.learner.optimizer.state[q]
        assert b["exp_avg"].is_cuda and torch.equal(a["exp_avg"], b["exp_avg"])
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"]) and float(b["step"]) == 1.0
    after_saved, after_restored = saved.update(_batch(2), 1), restored.update(_batch(2), 1)
    assert after_saved["loss"] == pytest.approx(after_restored["loss"], rel=1e-6)
