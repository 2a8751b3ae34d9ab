"""Process groups for the policy: torch.distributed plus Megatron-Core's parallel state.

On a machine without a GPU the backend is gloo and ``cpu_compat`` is applied first; with GPUs it
is NCCL and nothing is patched. Data parallelism is what is left of the world after tensor and
pipeline parallelism (``dp = world / (tp * pp)``); expert parallelism divides ``dp * tp``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gagar.trainer.model import cpu_compat


@dataclass(frozen=True)
class Parallel:
    """Parallel sizes of the trainer (tensor, expert, pipeline); dp is derived from the world."""

    tp: int = 1
    ep: int = 1
    pp: int = 1

    def check(self, world_size: int) -> None:
        for name in ("tp", "ep", "pp"):
            if getattr(self, name) < 1:
                raise ValueError(f"parallel size {name}={getattr(self, name)} must be >= 1")
        if world_size % (self.tp * self.pp):
            raise ValueError(
                f"world size {world_size} is not divisible by tp*pp={self.tp * self.pp}"
            )
        dp = world_size // (self.tp * self.pp)
        if (dp * self.tp) % self.ep:
            raise ValueError(f"expert-parallel size {self.ep} does not divide dp*tp={dp * self.tp}")


def init_distributed(
    parallel: Parallel,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str = "env://",
    seed: int = 1234,
) -> None:
    """Start torch.distributed (if needed) and Megatron's model-parallel groups.

    ``rank``/``world_size`` default to the ``RANK``/``WORLD_SIZE`` environment (torchrun).
    Idempotent for the same sizes; call ``destroy_distributed`` before changing them.
    """
    cuda = torch.cuda.is_available()
    if not cuda:
        cpu_compat.apply()
    if not dist.is_initialized():
        rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        if init_method == "env://":
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29500")
        if cuda:
            torch.cuda.set_device(
                int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
            )
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    parallel.check(dist.get_world_size())
    _init_megatron_groups(parallel, seed)


def _init_megatron_groups(parallel: Parallel, seed: int) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    if ps.model_parallel_is_initialized():
        current = current_parallel()
        if current != parallel:
            raise RuntimeError(f"model parallel already initialized as {current}, asked {parallel}")
        return
    ps.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        expert_model_parallel_size=parallel.ep,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def destroy_distributed(keep_process_group: bool = False) -> None:
    """Tear down Megatron's groups (and torch.distributed unless ``keep_process_group``).

    Keeping the process group lets a job re-initialize Megatron with other parallel sizes.
    """
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    if dist.is_initialized() and not keep_process_group:
        dist.destroy_process_group()


def current_parallel() -> Parallel:
    from megatron.core import parallel_state as ps

    return Parallel(
        ps.get_tensor_model_parallel_world_size(),
        ps.get_expert_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_world_size(),
    )
