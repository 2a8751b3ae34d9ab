"""Gradient variance from running sums equals the explicit M-copies formula."""

from __future__ import annotations

import torch

from gagar.trainer.gradvar import GradVarianceTracker, trace_covariance


def _explicit(model: torch.nn.Module, batches: list[torch.Tensor]) -> tuple[float, float]:
    m = len(batches)
    grads = []
    for x in batches:
        model.zero_grad()
        model(x).pow(2).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]) * m)  # g_m = M·c_m
    g = torch.stack(grads)
    mean = g.mean(0)
    return float(((g - mean) ** 2).sum() / (m - 1)), float(mean.norm())


def test_running_sums_match_explicit_copies() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    batches = [torch.randn(4, 5) for _ in range(4)]
    expected = _explicit(model, batches)
    model.zero_grad()
    tracker = GradVarianceTracker(model.parameters())
    for x in batches:
        model(x).pow(2).sum().backward()
        tracker.after_micro_batch()
    var, norm = tracker.result()
    assert var is not None
    assert abs(var - expected[0]) <= 1e-4 * max(1.0, expected[0])
    assert abs(norm - expected[1]) <= 1e-5 * max(1.0, expected[1])


def test_identical_micro_batches_have_zero_variance() -> None:
    model = torch.nn.Linear(3, 2)
    x = torch.randn(2, 3)
    tracker = GradVarianceTracker(model.parameters())
    for _ in range(3):
        model(x).sum().backward()
        tracker.after_micro_batch()
    var, norm = tracker.result()
    assert var is not None and var <= 1e-5 * norm**2 and norm > 0


def test_reduce_combines_ranks_like_one_process() -> None:
    # two "ranks" each with two micro-batches == one process with four
    s2 = [1.0, 2.0]
    total = trace_covariance(sum(s2), 4.0, 4)
    assert total == (16 * 3.0 - 4 * 4.0) / 3
    assert trace_covariance(5.0, 1.0, 1) is None  # undefined for one micro-batch, not 0
