"""The gradient noise scale's parts, tr Σ and ‖G‖², are unbiased for every aggregation the loss
has, as the trainer reports them (``Learner.update``'s ``gradient_noise_trace`` and
``gradient_signal_sq``).

Per-token gradients are drawn from a known model, g_t = G + a_p + e_t (a_p shared by the tokens of
group p, e_t per token), with unequal token counts: sequences of 1 to 80 loss tokens, groups of 10
to 200. The step gradient is ḡ = Σ_t w_t g_t with the aggregation's token weights w_t, so the truth
is known exactly: ‖E ḡ‖² = (Σ w)² ‖G‖² and N · tr Cov(ḡ) = N (Σ_p W_p² tr Σ_a + Σ_t w_t² tr Σ_e).
Under ``token-mean`` with no group effect the latter is McCandlish's per-token tr Σ. Before issue 50
the estimator rescaled micro-batches by tokens: these tests fail on it for every aggregation (its
‖G‖² is off by 10 to 60 standard errors)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch

from gagar.trainer.gradvar import GradVarianceTracker, noise_scale
from gagar.trainer.learner import Learner, LearnerConfig, Sample
from gagar.trainer.loss import (
    LossConfig,
    aggregation_weight,
    global_counts,
    prompt_token_counts,
)

D = 6
GROUP = 4
BASES = (1, 2, 3, 6, 10, 20)  # sequence i of group p has BASES[p]·(i + 1) loss tokens
MAX_LEN = 100  # seq-mean-token-sum-norm's constant
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "prompt-mean")


def _lengths() -> list[list[int]]:
    return [[b * (i + 1) for i in range(GROUP)] for b in BASES]


class _Linear(torch.nn.Module):
    """log π of token t is ⟨θ, x_t⟩ at θ = 0: with A = 1 and the ratio 1, token t's loss gradient is
    −x_t, the feature row of its id (fresh rows every draw)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(D, dtype=torch.float64))
        self.x = torch.zeros(vocab, D, dtype=torch.float64)

    def token_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):  # type: ignore[no-untyped-def]
        return self.x[input_ids] @ self.theta, None


def _samples() -> tuple[list[Sample], list[list[range]]]:
    """One sample per sequence (a prompt token, then its loss tokens, each a distinct id) and the
    ids of each sequence's loss tokens."""
    samples, spans, nxt = [], [], 1
    for p, lengths in enumerate(_lengths()):
        spans.append([])
        for n in lengths:
            ids = [0, *range(nxt, nxt + n)]
            spans[-1].append(range(nxt, nxt + n))
            nxt += n
            samples.append(Sample(ids, [0] + [1] * n, [0.0] * (n + 1), [1.0] * (n + 1), p))
    return samples, spans


def _weights(mode: str) -> list[list[float]]:
    """w_t per sequence (constant within one), by the aggregation's definition (loss.py's doc)."""
    lengths = _lengths()
    n_tok, n_seq, n_prompt = sum(map(sum, lengths)), sum(map(len, lengths)), len(lengths)
    rule = {
        "token-mean": lambda group, n: 1 / n_tok,
        "seq-mean-token-mean": lambda group, n: 1 / (n * n_seq),
        "seq-mean-token-sum-norm": lambda group, n: 1 / (MAX_LEN * n_seq),
        "prompt-mean": lambda group, n: 1 / (sum(group) * n_prompt),
    }[mode]
    return [[rule(g, n) for n in g] for g in lengths]


def _truth(
    mode: str, g: torch.Tensor, var_a: torch.Tensor, var_e: torch.Tensor
) -> tuple[float, float]:
    """(N · tr Cov(ḡ), ‖E ḡ‖²) exactly (module docstring)."""
    w, lengths = _weights(mode), _lengths()
    total = sum(
        wi * n for ws, ns in zip(w, lengths, strict=True) for wi, n in zip(ws, ns, strict=True)
    )
    per_group = [
        sum(wi * n for wi, n in zip(ws, ns, strict=True)) for ws, ns in zip(w, lengths, strict=True)
    ]
    within = sum(
        wi**2 * n for ws, ns in zip(w, lengths, strict=True) for wi, n in zip(ws, ns, strict=True)
    )
    n_tok = sum(map(sum, lengths))
    trace = n_tok * (
        sum(x**2 for x in per_group) * float(var_a.sum()) + within * float(var_e.sum())
    )
    return trace, total**2 * float(g.pow(2).sum())


def _draws(r: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``r`` draws of every loss token's gradient (r, N, D) in the layout's order, and G, sd_a,
    sd_e."""
    g = torch.full((D,), 0.5, dtype=torch.float64)  # ‖G‖² = 1.5
    sd_a = torch.linspace(0.3, 0.8, D, dtype=torch.float64)  # group effect
    sd_e = torch.linspace(0.5, 1.5, D, dtype=torch.float64)  # token noise
    gen = torch.Generator().manual_seed(seed)
    totals = [sum(lengths) for lengths in _lengths()]
    a = sd_a * torch.randn(r, len(totals), D, generator=gen, dtype=torch.float64)
    e = sd_e * torch.randn(r, sum(totals), D, generator=gen, dtype=torch.float64)
    return g + a.repeat_interleave(torch.tensor(totals), dim=1) + e, g, sd_a, sd_e


def _micro_batches(micro: int) -> list[list[int]]:
    """Sequence indices of each micro-batch: ``micro`` sequences in order (the learner's rule)."""
    n = len(BASES) * GROUP
    return [list(range(i, min(i + micro, n))) for i in range(0, n, micro)]


@dataclass(frozen=True)
class _Plan:
    """How the learner feeds the tracker for one aggregation and micro-batch size: each
    micro-batch's token weights (M, N) (its contribution is ``weights @ grads``), its
    ``aggregation_weight`` and whether it closes a unit (no group of it continues later)."""

    weights: torch.Tensor
    agg_weights: list[float]
    closes: list[bool]
    tokens: float


def _plan(mode: str, micro: int) -> _Plan:
    lengths = [n for group in _lengths() for n in group]
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    groups = torch.arange(len(lengths)) // GROUP
    counts, prompt_tokens = global_counts(mask, groups), prompt_token_counts(mask, groups)
    cfg = LossConfig(agg_mode=mode, max_len=MAX_LEN)  # type: ignore[arg-type]
    starts, w = [0, *itertools.accumulate(lengths)], _flat_weights(mode)
    chunks = _micro_batches(micro)
    weights = torch.zeros(len(chunks), starts[-1], dtype=torch.float64)
    agg, closes = [], []
    for k, rows in enumerate(chunks):
        for i in rows:
            weights[k, starts[i] : starts[i + 1]] = w[i]
        later = {int(groups[i]) for c in chunks[k + 1 :] for i in c}
        agg.append(aggregation_weight(mask[rows], counts, cfg, prompt_tokens[rows]))
        closes.append(not ({int(groups[i]) for i in rows} & later))
    return _Plan(weights, agg, closes, counts.num_tokens)


def _track(contribs: torch.Tensor, plan: _Plan) -> tuple[float, float]:
    """One draw's micro-batch contributions (M, D) accumulated into .grad as backward does."""
    p = torch.nn.Parameter(torch.zeros(D, dtype=torch.float64))
    tracker = GradVarianceTracker([p])
    for acc, weight, closes in zip(contribs.cumsum(0), plan.agg_weights, plan.closes, strict=True):
        p.grad = acc.clone()
        tracker.after_micro_batch(weight, closes=closes)
    trace, signal, _ = tracker.noise(plan.tokens)
    return trace, signal


def _flat_weights(mode: str) -> list[float]:
    return [x for ws in _weights(mode) for x in ws]


@pytest.mark.parametrize("micro", [GROUP, GROUP // 2, 3], ids=["whole", "halves", "straddling"])
@pytest.mark.parametrize("mode", MODES)
def test_trace_and_signal_are_unbiased_for_every_aggregation(mode: str, micro: int) -> None:
    grads, g, sd_a, sd_e = _draws(2000)
    plan = _plan(mode, micro)
    contribs = torch.einsum("mn,rnd->rmd", plan.weights, grads)  # (R, M, D)
    got = torch.tensor([_track(c, plan) for c in contribs])  # (R, 2)
    true_trace, true_signal = _truth(mode, g, sd_a**2, sd_e**2)
    for est, truth in zip(got.T, (true_trace, true_signal), strict=True):
        se = float(est.std()) / math.sqrt(len(est))
        assert abs(float(est.mean()) - truth) < 4 * se, (mode, float(est.mean()), truth, se)


@pytest.mark.parametrize("mode", MODES)
def test_the_learner_reports_the_trackers_estimate(mode: str) -> None:
    """``Learner.update`` forms the same tr Σ and ‖G‖² from its own loss, micro-batches, weights and
    units as ``_track`` does from the drawn gradients (groups split in halves: units of two)."""
    samples, spans = _samples()
    vocab = 1 + sum(len(r) for s in spans for r in s)
    model = _Linear(vocab)
    loss = LossConfig(agg_mode=mode, max_len=MAX_LEN)  # type: ignore[arg-type]
    learner = Learner(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        LearnerConfig(micro_batch_size=GROUP // 2, grad_clip=math.inf, loss=loss),
    )
    grads = _draws(2, seed=1)[0]
    plan = _plan(mode, GROUP // 2)
    for x in grads:
        model.x = torch.cat([torch.zeros(1, D, dtype=torch.float64), -x])  # gradient −x_t: g_t
        out = learner.update(samples)
        want = _track(plan.weights @ x, plan)
        got = (out["gradient_noise_trace"], out["gradient_signal_sq"])
        assert got == pytest.approx(want, rel=1e-5, abs=1e-9)


def test_noise_scale_does_not_depend_on_the_unit_count_or_gradient_scale() -> None:
    # exact expectations for M equal units of a batch with ‖G‖² = 0.5, tr Cov(ḡ) = 10 / 64:
    # S2 = Σ_m ‖c_m‖² = M (‖G‖²/M² + tr Cov(ḡ)/M), ‖ḡ‖² = ‖G‖² + tr Cov(ḡ)
    signal, noise, n = 0.5, 10.0 / 64, 64.0
    for m in (2, 8):
        s2 = m * (signal / m**2 + noise / m)
        for scale in (1.0, 100.0):
            trace, got, b = noise_scale(scale * s2, scale * (signal + noise), 1 / m, n)
            assert got == pytest.approx(scale * signal) and trace == pytest.approx(scale * 10.0)
            assert b == pytest.approx(20.0)


def test_noise_scale_is_undefined_without_two_units_or_signal() -> None:
    assert noise_scale(1.0, 1.0, 1.0, 64.0)[2] is None  # one unit: its share is 1
    assert noise_scale(10.0, 0.1, 1 / 8, 64.0)[2] is None  # ‖G‖² estimate ≤ 0
    p = torch.nn.Parameter(torch.zeros(3))
    tracker = GradVarianceTracker([p])
    p.grad = torch.ones(3)
    tracker.after_micro_batch(0.5, closes=False)  # half a group: the unit stays open
    p.grad = 2 * torch.ones(3)
    tracker.after_micro_batch(0.5)
    assert tracker.num_micro == 1 and tracker.micro_batches == 2
    assert tracker.noise(4.0)[2] is None
    tracker.dependent = True  # units on two ranks share a group
    assert tracker.noise(4.0)[2] is None
