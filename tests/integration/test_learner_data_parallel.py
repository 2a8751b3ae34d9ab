"""Two data-parallel replicas (gloo) make exactly the update one process makes on the whole batch.

Each replica gets the whole batch and runs its half of the micro-batches; ``GroupDataParallel``
sums the gradients, clips by the one global norm (clipping is active here), and sums the metrics
and the gradient-variance statistics. Loss, gradient norm, gradient variance and the parameters
after an Adam step must match the single-process learner.
"""

from __future__ import annotations

import copy

import torch
import torch.multiprocessing as mp

from gagar.trainer.learner import Learner, LearnerConfig
from tests.unit.test_learner import TinyLM, _samples

CLIP = 0.02  # far below the gradient norm: the update is clipped


def _learner(model: TinyLM, parallel=None) -> Learner:  # type: ignore[no-untyped-def]
    # whole groups per micro-batch: a group split over two replicas would make the noise scale's
    # units dependent (gradvar), and the replicas would report none
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Learner(model, opt, LearnerConfig(micro_batch_size=4, grad_clip=CLIP), parallel)


def _replica(rank: int, tmp: str) -> None:
    import torch.distributed as dist

    from gagar.trainer.distributed import GroupDataParallel

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rdzv", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = TinyLM()
    dp = GroupDataParallel(
        rank=rank, size=2, group=None, expert_group=None, replica_ranks=1,
        counted=lambda p: True, first_copy=lambda p: rank == 0,
    )  # fmt: skip
    metrics = _learner(model, dp).update(_samples())
    params = [p.detach().clone() for p in model.parameters()]
    torch.save({"metrics": metrics, "params": params}, f"{tmp}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def test_two_replicas_equal_one_process(tmp_path) -> None:
    mp.spawn(_replica, args=(str(tmp_path),), nprocs=2, join=True)
    torch.manual_seed(0)
    model = TinyLM()
    ref = _learner(copy.deepcopy(model)).update(_samples())
    single = _learner(model)
    single.update(_samples())
    assert ref["grad_norm"] > 5 * CLIP  # clipping really happens
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        m = got["metrics"]
        assert abs(m["loss"] - ref["loss"]) < 1e-6
        assert abs(m["grad_norm"] - ref["grad_norm"]) < 1e-5 * ref["grad_norm"]
        assert (
            abs(m["gradient_variance"] - ref["gradient_variance"]) < 1e-4 * ref["gradient_variance"]
        )
        assert m["micro_batches"] == ref["micro_batches"] == 2  # a whole group each
        # the noise scale's extra stats go through the same all-reduce: one process's value
        for key in ("gradient_noise_trace", "gradient_signal_sq"):  # always there with M ≥ 2
            assert abs(m[key] - ref[key]) < 1e-4 * abs(ref[key])
        noise, ref_noise = m.get("gradient_noise_scale"), ref.get("gradient_noise_scale")
        assert (noise is None) == (ref_noise is None)
        if ref_noise is not None:
            assert abs(noise - ref_noise) < 1e-4 * abs(ref_noise)
        for p, q in zip(got["params"], model.parameters(), strict=True):
            assert torch.allclose(p, q.detach(), atol=1e-6)
