"""On a CUDA machine: no CPU patches, NCCL, and the converted model still gives transformers' logits.

Not run where there is no GPU (the conftest skips ``gpu`` tests); run on a lent accelerator with
``python -m pytest tests/gpu/test_model_gpu.py -m gpu``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe"])
def test_megatron_on_cuda_matches_transformers(tmp_path: Path, family: str) -> None:
    from gagar.trainer.model import (
        Parallel,
        build_model,
        cpu_compat,
        init_distributed,
        iter_hf_weights,
        load_hf_into_megatron,
        read_config,
    )
    from tests.support.random_models import save_random_hf_model

    hf = save_random_hf_model(family, tmp_path / "hf").cuda()
    init_distributed(Parallel(), rank=0, world_size=1, init_method=f"file://{tmp_path}/rdzv")
    assert not cpu_compat.is_applied()
    model = build_model(read_config(tmp_path / "hf"))
    load_hf_into_megatron(model, tmp_path / "hf")
    ids = torch.randint(0, 256, (2, 16), device="cuda")
    pos = torch.arange(16, device="cuda").expand(2, 16)
    with torch.no_grad():
        diff = (hf(ids).logits - model(ids, pos, None)).abs().max().item()
    assert diff <= 1e-4
    weights = dict(iter_hf_weights(model))
    assert all(w.is_cuda for w in weights.values())
