"""The common-target moments (``gradvar.target_moments``, issue 50) are the unbiased estimates.

Two arms draw per-group gradients with different means and the same covariance Σ (their noise
correlated, as two arms' gradients on the same groups are): u_a = μ_a + ε, u_b = μ_b + ε' with
Cov ε = Cov ε' = Σ. The truth is known: tr Cov is tr Σ in both arms, B = tr Σ / ‖μ‖² differs by
‖μ_b‖² / ‖μ_a‖², and against the common target T = μ_b the bias² is ‖μ_a − μ_b‖² for arm a and 0
for arm b. With 5 groups a draw, a variance with ddof 0 is 20 % low and the plug-in ‖ū‖² is
tr Σ / 5 high: both fail these tests by many standard errors.
"""

from __future__ import annotations

import math

import pytest
import torch

from gagar.trainer.gradvar import TargetMoments, cosine, pair_mean, target_moments

DIM, GROUPS, DRAWS, RHO = 6, 5, 4000, 0.6


def _truth() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    chol = torch.randn(DIM, DIM, generator=gen, dtype=torch.float64) / math.sqrt(DIM)
    mu_b = torch.zeros(DIM, dtype=torch.float64)
    mu_b[0] = 1.0
    mu_a = 2.0 * mu_b
    mu_a[1] = 1.0  # a larger mean, at an angle to b's
    return mu_a, mu_b, chol


def _moments(seed: int = 0) -> list[tuple[TargetMoments, TargetMoments]]:
    mu_a, mu_b, chol = _truth()
    gen = torch.Generator().manual_seed(seed)
    out = []
    ids = torch.arange(GROUPS)
    for _ in range(DRAWS):
        e, f = (torch.randn(GROUPS, DIM, generator=gen, dtype=torch.float64) for _ in range(2))
        ua = mu_a + e @ chol.T  # (n, d)
        ub = mu_b + (RHO * e + math.sqrt(1 - RHO**2) * f) @ chol.T  # same Σ, correlated noise
        # both arms against the common target T = E u_b, estimated by the same groups' u_b
        out.append(
            (
                target_moments(ua @ ua.T, ua @ ub.T, ub @ ub.T, ids),
                target_moments(ub @ ub.T, ub @ ub.T, ub @ ub.T, ids),
            )
        )
    return out


@pytest.fixture(scope="module")
def draws() -> list[tuple[TargetMoments, TargetMoments]]:
    return _moments()


def _mean_se(values: list[float]) -> tuple[float, float]:
    x = torch.tensor(values, dtype=torch.float64)
    return float(x.mean()), float(x.std() / math.sqrt(len(values)))


def _close(values: list[float], truth: float) -> None:
    mean, se = _mean_se(values)
    assert abs(mean - truth) < 4 * se + 1e-12, (mean, truth, se)
    assert se < 0.03 * max(abs(truth), 1.0)  # precise enough that a biased formula fails


def test_the_common_target_variance_is_equal_and_b_differs(draws: list) -> None:
    mu_a, mu_b, chol = _truth()
    tr_sigma = float((chol @ chol.T).trace())
    a = [x for x, _ in draws]
    b = [y for _, y in draws]
    _close([m.trace for m in a], tr_sigma)  # the same variance in both arms ...
    _close([m.trace for m in b], tr_sigma)
    _close([m.signal for m in a], float(mu_a @ mu_a))  # ... around different means
    _close([m.signal for m in b], float(mu_b @ mu_b))
    b_a = _mean_se([m.trace for m in a])[0] / _mean_se([m.signal for m in a])[0]
    b_b = _mean_se([m.trace for m in b])[0] / _mean_se([m.signal for m in b])[0]
    assert b_a / b_b == pytest.approx(float(mu_b @ mu_b) / float(mu_a @ mu_a), rel=0.06)
    assert b_a / b_b < 0.3  # so B differs where the variance does not


def test_bias_and_mse_to_the_common_target(draws: list) -> None:
    mu_a, mu_b, chol = _truth()
    tr_sigma = float((chol @ chol.T).trace())
    a = [x for x, _ in draws]
    b = [y for _, y in draws]
    gap = float((mu_a - mu_b) @ (mu_a - mu_b))
    _close([m.bias for m in a], gap)
    assert all(m.bias == pytest.approx(0.0, abs=1e-12) for m in b)  # the target's own arm
    _close([m.mse(4) for m in a], tr_sigma / 4 + gap)
    _close([m.mse(4) for m in b], tr_sigma / 4)
    _close([m.cross for m in a], float(mu_a @ mu_b))
    cos = cosine(*(_mean_se([getattr(m, k) for m in a])[0] for k in ("cross", "signal", "target")))
    assert cos == pytest.approx(float(mu_a @ mu_b / (mu_a.norm() * mu_b.norm())), rel=0.03)


def test_moments_equal_the_explicit_vector_formulas() -> None:
    gen = torch.Generator().manual_seed(3)
    u, t = (torch.randn(7, 11, generator=gen, dtype=torch.float64) + 1.0 for _ in range(2))
    m = target_moments(u @ u.T, u @ t.T, t @ t.T, torch.arange(7))
    assert m.trace == pytest.approx(float(u.var(dim=0, correction=1).sum()))
    d = u - t  # ‖E d‖² unbiased: ‖d̄‖² − tr Cov(d) / n
    assert m.bias == pytest.approx(float(d.mean(0) @ d.mean(0) - d.var(0).sum() / 7))
    assert m.mse(3) == pytest.approx(m.trace / 3 + m.bias)
    assert m.noise_scale() == pytest.approx(m.trace / m.signal)


def test_a_repeated_group_is_no_pair() -> None:
    u = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1])  # a bootstrap resample: group 0 twice
    rows = u[torch.tensor([0, 0, 1])]
    assert pair_mean(rows @ rows.T, ids) == pytest.approx(float(u[0] @ u[1]))
    assert cosine(1.0, -1.0, 1.0) is None
    assert TargetMoments(1.0, -0.1, 0.0, 1.0, 0.0).noise_scale() is None
