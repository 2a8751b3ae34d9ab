"""Gradient variance across micro-batches (DESIGN §1.9), from running sums.

With a step's loss written as a sum of micro-batch contributions (global normalization), the
accumulated gradient after micro-batch ``m`` minus the one before is that micro-batch's contribution
``c_m``. Each ``g_m = M·c_m`` is an unbiased estimate of the full-batch gradient ``ḡ = Σ_m c_m``, and

    tr Cov = Σ_m ‖g_m − ḡ‖² / (M − 1) = (M² Σ_m ‖c_m‖² − M ‖ḡ‖²) / (M − 1)

so two running quantities suffice: ``S2 = Σ_m ‖c_m‖²`` (a scalar) and the accumulated gradient
itself (which the optimizer needs anyway). The tracker keeps one copy of the gradient (the value
before the current micro-batch), never M copies.

Sharded parameters (tensor/expert parallel) contribute partial squared norms that the caller sums
across ranks with ``reduce`` (an all-reduce of a small tensor); parameters replicated across
tensor-parallel ranks must be counted once (``count`` predicate). Data-parallel ranks each see
their own micro-batches: M and S2 are summed across them, and ‖ḡ‖² is taken after the gradient
all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]


def trace_covariance(
    sum_sq_contrib: float, mean_grad_sq_norm: float, num_micro: int
) -> float | None:
    """``(M² S2 − M ‖ḡ‖²) / (M − 1)``; None (undefined, not 0) below two micro-batches."""
    if num_micro < 2:
        return None
    m = float(num_micro)
    value = (m * m * sum_sq_contrib - m * mean_grad_sq_norm) / (m - 1.0)
    return max(value, 0.0)  # rounding can make a zero variance slightly negative


class GradVarianceTracker:
    """Call ``after_micro_batch()`` after each backward; ``result()`` after the last one."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        count: Callable[[torch.nn.Parameter], bool] | None = None,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.count = count or (lambda p: True)
        self._prev = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        self.sum_sq = 0.0
        self.num_micro = 0

    @staticmethod
    def _grad(p: torch.nn.Parameter) -> torch.Tensor:
        g = getattr(p, "main_grad", None)  # Megatron DDP accumulates into main_grad
        if g is None:
            g = p.grad
        return torch.zeros_like(p, dtype=torch.float32) if g is None else g.detach().float()

    def after_micro_batch(self) -> None:
        grads = [self._grad(p) for p in self.params]
        counted = [i for i, p in enumerate(self.params) if self.count(p)]
        # One fused pass per operation over all tensors (torch's foreach kernels), not four
        # small ops per parameter: this runs after every micro-batch.
        diffs = torch._foreach_sub([grads[i] for i in counted], [self._prev[i] for i in counted])
        norms = torch._foreach_norm(diffs) if diffs else []
        self.sum_sq += float(torch.stack(norms).double().pow(2).sum()) if norms else 0.0
        torch._foreach_copy_(self._prev, grads)
        self.num_micro += 1

    def result(self, reduce: Reduce | None = None) -> tuple[float | None, float]:
        """Return ``(tr Cov or None below two micro-batches, ‖ḡ‖)``; ``reduce`` all-reduces ``[S2, M, ‖ḡ‖²-partial]`` across ranks."""
        grad_sq = sum(float(self._grad(p).pow(2).sum()) for p in self.params if self.count(p))
        stats = torch.tensor([self.sum_sq, float(self.num_micro), grad_sq], dtype=torch.float64)
        if reduce is not None:
            stats = reduce(stats)
        s2, m, g2 = (float(x) for x in stats)
        return trace_covariance(s2, g2, round(m)), g2**0.5
