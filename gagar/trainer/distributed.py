"""Several trainer ranks acting as one: data-parallel collectives, rank 0's lead, sharded checkpoints.

In the cluster trainer only global rank 0 runs the driver (rollouts, grading, advantages); the
other ranks hold their shard of the policy and wait. Every step that needs all ranks (a policy
update, gathering the weights for publication, a checkpoint, a restore) goes through ``Team.call``
on rank 0: it first broadcasts the step's name and arguments over a CPU (gloo) control group, then
runs it itself, while every other rank, inside ``Team.follow``, receives the same call and runs it
too. The control group has its own long timeout because followers wait there for as long as a
step's rollouts take; the collectives inside a call run on the default group.

``GroupDataParallel`` is the learner's ``DataParallel`` over process groups: gradients summed over
data-parallel replicas (expert parameters over expert-data-parallel replicas), one global
gradient norm for clipping (each shard counted once: tensor-parallel duplicates and other
replicas skipped), and the gradient-variance statistics summed over the job. Under expert
parallelism an expert's gradient mixes the micro-batches of every replica that routed tokens to
it, so the variance is an approximation there (the update itself is exact).

A checkpoint of a Megatron policy holds the model, the optimizer and the KL reference in
Megatron-Core's layout-independent sharded format (``gagar.trainer.sharded``), plus one ``rng``
part per global rank (``rng-rank00001`` ...): every rank writes its shards and its RNG state into
rank 0's staging directory, then rank 0 records their sizes and checksums in the manifest and
renames it into place, so a kill at any point still leaves the previous complete checkpoint. Such
a checkpoint resumes at any tensor, expert or data-parallel layout (a rank beyond the saved world
takes rank 0's RNG state). Checkpoints of the older per-rank format (``model-rank00001``, and the
one-process ``model``/``optimizer`` parts of a model without sharded state) are restored only
by a job of the same layout; another layout is refused, saying how to convert them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from gagar.trainer import sharded
from gagar.trainer.checkpoint import Checkpoint, CheckpointManager
from gagar.trainer.learner import Learner, Sample

STOP = "stop"
# The steps every rank takes part in (rank 0 announces each by name: the name is what travels).
TeamStep = Literal["update", "weights", "save", "restore", "sft"]
Param = torch.nn.Parameter


class LayoutMismatch(ValueError):
    """A checkpoint was written by a job of another world size or parallel layout."""


def _is_expert(p: Param) -> bool:
    return not getattr(p, "allreduce", True)  # Megatron marks expert parameters allreduce=False


def _world(group: Any) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


@dataclass
class GroupDataParallel:
    """``learner.DataParallel`` over explicit process groups (see the module docstring).

    ``counted(p)``: this rank counts ``p`` within its model replica (not a tensor-parallel
    duplicate). ``first_copy(p)``: this rank counts ``p`` in the global norm (``counted`` and on
    the first data-parallel replica of ``p``). ``replica_ranks``: ranks per model replica.
    """

    rank: int
    size: int
    group: Any
    expert_group: Any
    replica_ranks: int
    counted: Callable[[Param], bool]
    first_copy: Callable[[Param], bool]
    equal_shapes: bool = False

    def sync_grads(self, params: list[Param]) -> None:
        for expert, group in ((False, self.group), (True, self.expert_group)):
            mine = [p for p in params if p.requires_grad and _is_expert(p) == expert]
            if not mine or _world(group) == 1:
                continue
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in mine]
            flat = _flatten_dense_tensors(grads)  # one all-reduce per group, not one per tensor
            dist.all_reduce(flat, group=group)
            for p, summed in zip(mine, _unflatten_dense_tensors(flat, grads), strict=True):
                p.grad = summed.to(p.dtype).view_as(p)

    def grad_norm(self, params: list[Param]) -> float:
        device = params[0].device if params else torch.device("cpu")
        sq = torch.zeros(1, dtype=torch.float64, device=device)
        for p in params:
            if p.grad is not None and self.first_copy(p):
                sq += p.grad.detach().double().pow(2).sum()
        dist.all_reduce(sq)
        return float(sq.sqrt())

    def reduce_variance(self, stats: torch.Tensor) -> torch.Tensor:
        """Sum ``[S2, M, ‖ḡ‖²]`` over the job: every rank of a replica counted M, and every
        replica counted ‖ḡ‖² (gradients are synced by then), so those two are divided back."""
        device = torch.device("cuda", torch.cuda.current_device()) if _nccl() else "cpu"
        out = stats.to(device).clone()
        dist.all_reduce(out)
        out = out.cpu()
        out[1] /= self.replica_ranks
        out[2] /= self.size
        return out

    def _gather(self, values: dict[str, float]) -> list[dict[str, float]]:
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, values, group=self.group)
        return gathered

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for part in self._gather(totals):
            for key, value in part.items():
                out[key] = out.get(key, 0.0) + value
        return out

    def max_metrics(self, maxima: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for part in self._gather(maxima):
            for key, value in part.items():
                out[key] = max(out.get(key, value), value)
        return out


def _nccl() -> bool:
    return dist.is_initialized() and dist.get_backend() == "nccl"


def megatron_data_parallel() -> GroupDataParallel:
    """The learner's data parallelism from Megatron's initialized parallel state."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    def counted(p: Param) -> bool:
        if _is_expert(p):
            return bool(getattr(p, "tensor_model_parallel", False)) or (
                ps.get_expert_tensor_parallel_rank() == 0
            )
        return bool(param_is_not_tensor_parallel_duplicate(p))

    def first_copy(p: Param) -> bool:
        dp_rank = (
            ps.get_expert_data_parallel_rank() if _is_expert(p) else ps.get_data_parallel_rank()
        )
        return dp_rank == 0 and counted(p)

    size = ps.get_data_parallel_world_size()
    return GroupDataParallel(
        rank=ps.get_data_parallel_rank(),
        size=size,
        group=ps.get_data_parallel_group(),
        expert_group=ps.get_expert_data_parallel_group(),
        replica_ranks=dist.get_world_size() // size,
        counted=counted,
        first_copy=first_copy,
        equal_shapes=ps.get_expert_model_parallel_world_size() > 1,
    )


def control_group(timeout_s: float) -> Any:
    """A gloo group over every rank for the leader's announcements (all ranks must call this)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


@dataclass
class Team:
    """Rank 0 leads, the others follow (see the module docstring); one process is a team of one."""

    handlers: dict[TeamStep, Callable[..., Any]]
    group: Any = None

    @property
    def rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def size(self) -> int:
        return _world(self.group) if self.group is not None else 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def _announce(self, message: tuple[str, tuple[Any, ...]]) -> None:
        if self.size > 1:
            dist.broadcast_object_list([message], src=0, group=self.group)

    def call(self, name: TeamStep, *args: Any) -> Any:
        """On rank 0: make every rank run handler ``name`` with ``args``; returns rank 0's result."""
        if not self.leader:
            raise RuntimeError(f"rank {self.rank} cannot lead the team (call {name!r})")
        if name not in self.handlers:
            raise KeyError(f"no team step {name!r}")
        self._announce((name, args))
        return self.handlers[name](*args)

    def follow(self) -> None:
        """On the other ranks: run what rank 0 announces until it says stop."""
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, group=self.group)
            name, args = box[0]
            if name == STOP:
                return
            self.handlers[name](*args)

    def stop(self) -> None:
        if self.leader:
            self._announce((STOP, ()))


def _part(name: str, rank: int, world: int) -> str:
    return name if world == 1 else f"{name}-rank{rank:05d}"


@dataclass
class RankState:
    """One rank's trainer: model shard, learner, checkpoints; its methods are team steps."""

    model: Any
    learner: Learner
    ckpt: CheckpointManager
    layout: dict[str, int] = field(default_factory=dict)
    group: Any = None  # the team's control group (barriers and small gathers)

    def handlers(self) -> dict[TeamStep, Callable[..., Any]]:
        return {
            "update": self.update,
            "weights": self.weights,
            "save": self.save,
            "restore": self.restore,
        }

    @property
    def rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def world(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else 1

    def update(self, samples: list[Sample], step: int | None = None) -> dict[str, float]:
        return self.learner.update(samples, step)

    def weights(self) -> list[tuple[str, torch.Tensor]]:
        """The full HF-named weights on global rank 0 (a gather over every shard; empty elsewhere)."""
        from gagar.trainer.model import iter_hf_weights

        return list(iter_hf_weights(self.model))

    def _sharded(self) -> bool:
        """Whether checkpoints take the layout-independent format (a Megatron model)."""
        return dist.is_initialized() and hasattr(self.model, "sharded_state_dict")

    def _reference_model(self) -> Any:
        reference = self.learner.reference
        return getattr(reference, "model", reference)  # the Megatron model under the policy

    def _parts(self) -> dict[str, Any]:
        r, w = self.rank, self.world
        parts = {
            _part("model", r, w): self.model.state_dict(),
            _part("optimizer", r, w): self.learner.optimizer.state_dict(),
            _part("rng", r, w): torch.get_rng_state(),
        }
        reference = self.learner.reference_state()
        if reference is not None:  # the start policy: a resumed run keeps it, not its own start
            parts[_part("reference", r, w)] = reference
        return parts

    def _write(self, staging: Path) -> dict[str, Any]:
        """This rank's files in ``staging`` (its shards and RNG state, or its per-rank parts);
        returns their manifest records (the shards' are recorded by rank 0)."""
        if not self._sharded():
            return self.ckpt.write_parts(staging, self._parts())
        sharded.save(staging, self.model, self.learner.optimizer, self._reference_model())
        rng = {_part("rng", self.rank, self.world): torch.get_rng_state()}
        return self.ckpt.write_parts(staging, rng)

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Every rank writes its parts; rank 0 commits them as one checkpoint."""
        state = {**state, "layout": {"world_size": self.world, **self.layout}}
        if self._sharded():
            state["format"] = sharded.FORMAT
        if self.world == 1 and not self._sharded():
            self.ckpt.save(step, self._parts(), state)
            return
        staging = self.ckpt.stage(step, "job") if self.rank == 0 else None
        dist.barrier(group=self.group)
        files = self._write(staging or self.ckpt.staging_path(step, "job"))
        gathered: list[Any] = [None] * self.world if self.rank == 0 else []
        dist.gather_object(files, gathered if self.rank == 0 else None, dst=0, group=self.group)
        if staging is not None:
            merged = {name: meta for part in gathered for name, meta in part.items()}
            if self._sharded():
                merged.update(sharded.records(staging))
            self.ckpt.commit(step, staging, merged, state)
        dist.barrier(group=self.group)

    def restore(self, step: int) -> dict[str, Any]:
        """Load this rank's part of the checkpoint of ``step``; returns its state."""
        ckpt = Checkpoint(step, self.ckpt.root / f"step_{step:08d}")
        state = ckpt.state()
        saved = state.get("layout", {"world_size": 1})
        if state.get("format") == sharded.FORMAT:
            if not self._sharded():
                raise LayoutMismatch(f"{ckpt.path} holds a sharded Megatron model, not this model")
            sharded.load(ckpt.path, self.model, self.learner.optimizer, self._reference_model())
            world = int(saved.get("world_size", 1))
            torch.set_rng_state(
                ckpt.load(_part("rng", self.rank if self.rank < world else 0, world))
            )
            return state
        mine = {"world_size": self.world, **self.layout}
        if any(saved.get(k, 1) != v for k, v in mine.items()):
            raise LayoutMismatch(
                f"{ckpt.path} is a per-rank checkpoint of layout {saved}, this job is {mine}: "
                "resume it once at its own layout (same nodes, processesPerNode and parallelism); "
                "the checkpoints it writes then resume at any layout"
            )
        r, w = self.rank, self.world
        self.model.load_state_dict(ckpt.load(_part("model", r, w)))
        self.learner.optimizer.load_state_dict(ckpt.load(_part("optimizer", r, w)))
        torch.set_rng_state(ckpt.load(_part("rng", r, w)))
        if self.learner.reference is not None:
            self.learner.load_reference(ckpt.load(_part("reference", r, w)))
        return state
