"""The gradient noise scale B = tr Σ / ‖G‖² on synthetic gradients with known Σ and G: the
estimator from micro-batch and full-batch squared norms is unbiased, and the tracker forms it
from the gradients a learner accumulates."""

from __future__ import annotations

import math

import pytest
import torch

from gagar.trainer.gradvar import GradVarianceTracker, noise_scale


def _steps(g: torch.Tensor, sd: torch.Tensor, sizes: list[int], steps: int, seed: int = 0):
    """Per step: micro-batch gradients of per-token draws G + sd·z, as global-normalised
    contributions c_m = (1/N) Σ_t g_t, accumulated into a parameter's .grad like backward does."""
    gen = torch.Generator().manual_seed(seed)
    n_total = sum(sizes)
    for _ in range(steps):
        contribs = []
        for n in sizes:
            draws = g + sd * torch.randn(n, g.numel(), generator=gen, dtype=torch.float64)
            contribs.append(draws.sum(0) / n_total)
        yield contribs


def test_noise_scale_is_unbiased_on_known_sigma_and_g() -> None:
    d = 50
    g = torch.full((d,), 0.1, dtype=torch.float64)  # ‖G‖² = 0.5
    sd = torch.linspace(0.5, 1.5, d, dtype=torch.float64)  # tr Σ = Σ sd²
    true_trace, true_signal = float(sd.pow(2).sum()), float(g.pow(2).sum())
    sizes = [16, 32, 24, 8]  # unequal micro-batches: the 1/n_m weighting matters
    traces, signals = [], []
    p = torch.nn.Parameter(torch.zeros(d, dtype=torch.float64))
    for contribs in _steps(g, sd, sizes, steps=3000):
        p.grad = None
        tracker = GradVarianceTracker([p])
        acc = torch.zeros(d, dtype=torch.float64)
        for c, n in zip(contribs, sizes, strict=True):
            acc = acc + c
            p.grad = acc.clone()
            tracker.after_micro_batch(tokens=n)
        trace, signal, _ = tracker.noise(float(sum(sizes)))
        traces.append(trace)
        signals.append(signal)
    mean_trace, mean_signal = sum(traces) / len(traces), sum(signals) / len(signals)
    se_trace = torch.tensor(traces).std().item() / math.sqrt(len(traces))
    se_signal = torch.tensor(signals).std().item() / math.sqrt(len(signals))
    assert abs(mean_trace - true_trace) < 4 * se_trace
    assert abs(mean_signal - true_signal) < 4 * se_signal
    # B from the step-averaged numerator and denominator (McCandlish's advice)
    assert mean_trace / mean_signal == pytest.approx(true_trace / true_signal, rel=0.1)


def test_noise_scale_does_not_depend_on_the_micro_batch_count_or_gradient_scale() -> None:
    # the same true Σ and G split 2 or 8 ways, and scaled 10x: the same expected B, whereas the
    # scale-free ratio tr Cov / ‖ḡ‖² grows with M
    big_sq_2, trace, n = 0.5 + 10.0 / 64, 10.0, 64.0
    # exact expectations: E‖G_m‖² = ‖G‖² + tr Σ / n_m
    for m in (2, 8):
        small = 0.5 + trace / (n / m)
        assert noise_scale(small, big_sq_2, m / n, n)[2] == pytest.approx(20.0)
        assert noise_scale(100 * small, 100 * big_sq_2, m / n, n)[2] == pytest.approx(20.0)


def test_noise_scale_is_undefined_without_two_batch_sizes_or_signal() -> None:
    assert noise_scale(1.0, 1.0, 1 / 64, 64.0)[2] is None  # one micro-batch: n_m = N
    assert noise_scale(10.0, 0.1, 1 / 8, 64.0)[2] is None  # ‖G‖² estimate ≤ 0
    p = torch.nn.Parameter(torch.zeros(3))
    tracker = GradVarianceTracker([p])
    p.grad = torch.ones(3)
    tracker.after_micro_batch(tokens=4)
    assert tracker.noise(4.0)[2] is None
