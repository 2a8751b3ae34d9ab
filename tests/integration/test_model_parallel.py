"""TP=2 (dense) and EP=2 (MoE) on two CPU processes (gloo) match TP=1/EP=1 and transformers.

A PP=2 run checks that two pipeline stages compute transformers' logits and that the weight
gather collects both stages. One two-process job (spawned once, since starting Megatron costs seconds per process) runs every
case twice on the same HF weights and batch: first with TP=1/EP=1 (each process holds the whole
model and the whole batch), then re-initialized with TP=2 or EP=2 (with EP, data parallelism
splits the batch and gradients are summed over replicas). The loss is the global-batch token
sum over the global token count. Gradients are gathered back to HF names with the code that
weight sync uses; the ground truth is the ``transformers`` model on the full batch.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from tests.support.random_models import save_random_hf_model

BATCH, SEQ, VOCAB, WORLD = 4, 12, 256, 2
CASES = {"qwen2-tp2": ("qwen2", {"tp": 2}), "llama-tied-tp2": ("llama-tied", {"tp": 2}),
         "qwen3moe-ep2": ("qwen3_moe", {"ep": 2})}  # fmt: skip


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _loss_and_grads(hf_dir: str, rank: int, sizes: dict) -> dict:
    """One training step's loss and HF-named gradients under the current parallel layout."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from gagar.trainer.model import build_model, iter_hf_weights, load_hf_into_megatron, read_config

    model = build_model(read_config(hf_dir))
    load_hf_into_megatron(model, hf_dir)
    ids, labels = _batch()
    # Data parallel replicas split the batch; with TP=1 "replicas" each take the whole batch.
    dp = WORLD // sizes.get("tp", 1) if sizes else 1
    dp_rank = ps.get_data_parallel_rank() if sizes else 0
    rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)
    pos = torch.arange(SEQ).expand(ids[rows].shape[0], SEQ)
    loss = model(ids[rows], pos, None, labels=labels[rows]).sum() / labels.numel()
    loss.backward()
    total = loss.detach().clone()
    if dp > 1:
        dist.all_reduce(total)
        for p in model.parameters():
            expert = not getattr(p, "allreduce", True)
            group = ps.get_expert_data_parallel_group() if expert else ps.get_data_parallel_group()
            dist.all_reduce(p.grad, group=group)
    for p in model.parameters():
        p.data = p.grad  # gather gradients through the weights' own TP/EP gather
    return {"loss": total, "grads": dict(iter_hf_weights(model))}


def _pipeline_logits_and_weights(hf_dir: str, rank: int) -> dict:
    """PP=2: stage 0 sends its hidden states to stage 1, which computes the logits."""
    import torch.distributed as dist

    from gagar.trainer.model import build_model, iter_hf_weights, load_hf_into_megatron, read_config

    config = read_config(hf_dir)
    model = build_model(config)
    load_hf_into_megatron(model, hf_dir)
    ids, _ = _batch()
    pos = torch.arange(SEQ).expand(BATCH, SEQ)
    hidden = torch.empty(SEQ, BATCH, config["hidden_size"])  # Megatron's [s, b, h]
    with torch.no_grad():
        if rank == 0:
            dist.send(model(ids, pos, None).contiguous(), dst=1)
            logits = None
        else:
            dist.recv(hidden, src=0)
            model.set_input_tensor(hidden)
            logits = model(ids, pos, None)
    return {"logits": logits, "weights": dict(iter_hf_weights(model, all_ranks=True))}


def _worker(rank: int, tmp: str, hf_dirs: dict) -> None:
    import torch.distributed as dist

    from gagar.trainer.model import Parallel, destroy_distributed, init_distributed

    init_distributed(Parallel(pp=2), rank, WORLD, init_method=f"file://{tmp}/rdzv")
    pipeline = _pipeline_logits_and_weights(hf_dirs["qwen2-tp2"], rank)
    destroy_distributed(keep_process_group=True)
    if rank == 1:
        torch.save(pipeline, f"{tmp}/pipeline.pt")
    results, timings = {}, {}
    for case, (_, sizes) in CASES.items():
        for label, layout in (("single", {}), ("parallel", sizes)):
            start = time.perf_counter()
            init_distributed(Parallel(**layout), rank, WORLD, init_method=f"file://{tmp}/rdzv")
            results[(case, label)] = _loss_and_grads(hf_dirs[case], rank, layout)
            timings[(case, label)] = time.perf_counter() - start
            destroy_distributed(keep_process_group=True)
    if rank == 0:
        torch.save({"results": results, "timings": timings}, f"{tmp}/result.pt")
    dist.barrier()
    dist.destroy_process_group()


def _hf_named_grads(model) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """transformers 5 fuses MoE experts in memory; split them into the on-disk names."""
    out = {}
    for name, p in model.named_parameters():
        if name.endswith("experts.gate_up_proj"):
            prefix, half = name[: -len("gate_up_proj")], p.grad.shape[1] // 2
            for e, g in enumerate(p.grad):
                out[f"{prefix}{e}.gate_proj.weight"] = g[:half]
                out[f"{prefix}{e}.up_proj.weight"] = g[half:]
        elif name.endswith("experts.down_proj"):
            prefix = name[: -len("down_proj")]
            out.update({f"{prefix}{e}.down_proj.weight": g for e, g in enumerate(p.grad)})
        else:
            out[name] = p.grad
    return out


def _reference(model) -> dict:  # type: ignore[no-untyped-def]
    ids, labels = _batch()
    logits = model(ids).logits
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="sum")
    loss = loss / labels.numel()
    loss.backward()
    return {"loss": loss.detach(), "grads": _hf_named_grads(model)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("parallel")
    hf_dirs, references = {}, {}
    for case, (family, _) in CASES.items():
        hf_dirs[case] = str(tmp / case)
        references[case] = _reference(save_random_hf_model(family, hf_dirs[case], vocab_size=VOCAB))
    start = time.perf_counter()
    mp.spawn(_worker, args=(str(tmp), hf_dirs), nprocs=WORLD, join=True)
    out = torch.load(tmp / "result.pt")
    timings = ", ".join(f"{c}/{k}: {t:.1f}s" for (c, k), t in out["timings"].items())
    print(f"\n2-process job {time.perf_counter() - start:.1f}s ({timings})")
    pipeline = torch.load(tmp / "pipeline.pt")
    return {"references": references, "hf_dirs": hf_dirs, "pipeline": pipeline, **out}


def _assert_same(got: dict, want: dict, what: str) -> None:
    assert torch.allclose(got["loss"], want["loss"], atol=1e-6), (what, got["loss"], want["loss"])
    assert set(got["grads"]) == set(want["grads"]), what
    for name, grad in want["grads"].items():
        diff = (got["grads"][name] - grad).abs().max().item()
        assert diff <= 1e-5 * max(1.0, grad.abs().max().item()), (what, name, diff)


@pytest.mark.parametrize("case", list(CASES))
def test_single_process_matches_transformers(runs: dict, case: str) -> None:
    _assert_same(runs["results"][(case, "single")], runs["references"][case], case)


@pytest.mark.parametrize("case", list(CASES))
def test_parallel_matches_single_process(runs: dict, case: str) -> None:
    single, parallel = runs["results"][(case, "single")], runs["results"][(case, "parallel")]
    _assert_same(parallel, single, case)
    # Not vacuous: the gradients are not all zero.
    assert any(g.abs().max() > 0 for g in parallel["grads"].values())


def test_pipeline_parallel_stages_compute_transformers_logits(runs: dict) -> None:
    from safetensors.torch import load_file

    from tests.support.random_models import random_hf_model

    hf = random_hf_model("qwen2", vocab_size=VOCAB)
    ids, _ = _batch()
    with torch.no_grad():
        want = hf(ids).logits
    assert (runs["pipeline"]["logits"] - want).abs().max().item() <= 1e-4
    weights = load_file(Path(runs["hf_dirs"]["qwen2-tp2"]) / "model.safetensors")
    got = runs["pipeline"]["weights"]  # gathered from both stages onto the last one
    assert set(got) == set(weights)
    assert all(torch.equal(got[n], weights[n]) for n in weights)
