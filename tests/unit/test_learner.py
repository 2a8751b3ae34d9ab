"""The learner: the update does not depend on micro-batching; it moves log-probs the right way."""

from __future__ import annotations

import copy

import pytest
import torch

from gagar.trainer.learner import Learner, LearnerConfig, Sample, causal_lm_logprobs


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 11, dim: int = 8) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.rnn = torch.nn.GRU(dim, dim, batch_first=True)
        self.out = torch.nn.Linear(dim, vocab)

    def token_logprobs(self, input_ids, attention_mask):
        hidden, _ = self.rnn(self.emb(input_ids))
        return causal_lm_logprobs(self.out(hidden), input_ids)


def _samples() -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(8):
        length = 5 + i % 3
        ids = torch.randint(0, 11, (length,), generator=g).tolist()
        mask = [0, 0] + [1] * (length - 2)
        adv = [1.0 if i % 2 else -1.0] * length
        out.append(Sample(ids, mask, [-2.0] * length, adv, group=i // 4))
    return out


def _run(mb: int, model: TinyLM) -> tuple[dict[str, float], list[torch.Tensor]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    learner = Learner(model, opt, LearnerConfig(micro_batch_size=mb, grad_clip=1e9))
    metrics = learner.update(_samples())
    return metrics, [p.detach().clone() for p in model.parameters()]


def test_update_is_invariant_to_micro_batching() -> None:
    torch.manual_seed(0)
    base = TinyLM()
    results = {mb: _run(mb, copy.deepcopy(base)) for mb in (1, 2, 4, 8)}
    ref_metrics, ref_params = results[8]
    for mb, (metrics, params) in results.items():
        assert abs(metrics["loss"] - ref_metrics["loss"]) < 1e-5, mb
        for p, q in zip(params, ref_params, strict=True):
            assert torch.allclose(p, q, atol=1e-6), mb
    assert results[1][0]["micro_batches"] == 8 and results[1][0]["gradient_variance"] > 0
    assert "gradient_variance" not in results[8][0]  # one micro-batch: undefined, not 0


def test_update_raises_positive_and_lowers_negative_logprobs() -> None:
    torch.manual_seed(1)
    model = TinyLM()
    samples = _samples()
    ids = torch.tensor(samples[0].token_ids)[None]
    pos_ids = torch.tensor(samples[1].token_ids)[None]
    with torch.no_grad():
        before_neg = model.token_logprobs(ids, None)[0][0, 2:].sum()
        before_pos = model.token_logprobs(pos_ids, None)[0][0, 2:].sum()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    learner = Learner(model, opt, LearnerConfig(micro_batch_size=4))
    for _ in range(10):
        learner.update(samples)
    with torch.no_grad():
        assert model.token_logprobs(ids, None)[0][0, 2:].sum() < before_neg
        assert model.token_logprobs(pos_ids, None)[0][0, 2:].sum() > before_pos


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (Sample([1, 2, 3], [0, 1], [0.0] * 3, [1.0] * 3, 0), "differ in length"),
        (Sample([1, 2, 3], [1, 1, 1], [0.0] * 3, [1.0] * 3, 0), "first token"),
        (Sample([1, 2, 3], [0, 1, 1], [0.0] * 3, [float("nan")] * 3, 0), "non-finite"),
    ],
)
def test_bad_samples_are_rejected(sample: Sample, message: str) -> None:
    learner = Learner(TinyLM(), torch.optim.SGD(TinyLM().parameters(), lr=0.1), LearnerConfig(2))
    with pytest.raises(ValueError, match=message):
        learner.update([sample])


class SoloReplica:
    """``DataParallel`` of one replica of ``size`` with no communication: each replica's update
    is then its own share of the batch, and the shares must add up to the whole update."""

    def __init__(self, rank: int, size: int, equal_shapes: bool = False) -> None:
        self.rank, self.size, self.equal_shapes = rank, size, equal_shapes

    def sync_grads(self, params) -> None:
        pass

    def grad_norm(self, params) -> float:
        return 0.0  # below grad_clip: no clipping

    def counted(self, param) -> bool:
        return True

    def reduce_variance(self, stats: torch.Tensor) -> torch.Tensor:
        return stats

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        return totals

    def max_metrics(self, maxima: dict[str, float]) -> dict[str, float]:
        return maxima


class CountingLM(TinyLM):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def token_logprobs(self, input_ids, attention_mask):
        self.shapes.append(tuple(input_ids.shape))
        return super().token_logprobs(input_ids, attention_mask)


@pytest.mark.parametrize("equal_shapes", [False, True])
def test_data_parallel_replicas_share_the_batch(equal_shapes: bool) -> None:
    """Replica r of 2 runs micro-batches r, r+2, ... of the whole batch, normalized globally:
    with plain SGD the replicas' updates sum to the single-process update."""
    torch.manual_seed(2)
    base, samples = CountingLM(), _samples()[:6]  # 3 micro-batches of 2: replica 1 gets one
    whole = copy.deepcopy(base)
    ref = Learner(whole, torch.optim.SGD(whole.parameters(), lr=0.1), LearnerConfig(2, 1e9))
    ref_metrics = ref.update(samples)
    deltas, losses = [], 0.0
    for rank in (0, 1):
        model = copy.deepcopy(base)
        dp = SoloReplica(rank, 2, equal_shapes)
        learner = Learner(
            model, torch.optim.SGD(model.parameters(), lr=0.1), LearnerConfig(2, 1e9), dp
        )
        losses += learner.update(samples)["loss"]
        deltas.append(
            [
                p.detach() - q.detach()
                for p, q in zip(model.parameters(), base.parameters(), strict=True)
            ]
        )
        if equal_shapes:  # every replica runs the same rounds of same-shaped micro-batches
            assert model.shapes == [(2, max(len(s.token_ids) for s in samples))] * 2
        else:
            assert len(model.shapes) == (2 if rank == 0 else 1)
    assert abs(losses - ref_metrics["loss"]) < 1e-6
    for d0, d1, p, q in zip(*deltas, whole.parameters(), base.parameters(), strict=True):
        assert torch.allclose(d0 + d1, p.detach() - q.detach(), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_logprobs_equal_the_plain_log_softmax(monkeypatch, dtype) -> None:
    """Values, entropies and gradients of the memory-lean form equal log_softmax + gather, across
    chunk boundaries and on a transposed ([s, b, v] → [b, s, v]) logits view like Megatron's."""
    import gagar.trainer.learner as learner_mod

    monkeypatch.setattr(learner_mod, "ROWS_PER_CHUNK", 3)  # 10 positions: chunks of 3, 3, 3, 1
    g = torch.Generator().manual_seed(1)
    base = torch.randn(10, 2, 17, generator=g).to(dtype)  # [s, b, v]
    ids = torch.randint(0, 17, (2, 10), generator=g)
    weights = torch.randn(2, 10, generator=g)

    def plain(logits):
        logsm = torch.log_softmax(logits[:, :-1].float(), -1)
        taken = logsm.gather(-1, ids[:, 1:, None]).squeeze(-1)
        ent = -(logsm.exp() * logsm).sum(-1)
        zero = torch.zeros(2, 1)
        return torch.cat([zero, taken], 1), torch.cat([zero, ent], 1)

    results = []
    for fn in (plain, lambda x: causal_lm_logprobs(x, ids)):
        leaf = base.clone().requires_grad_(True)
        logp, ent = fn(leaf.transpose(0, 1))
        (logp * weights).sum().backward()
        results.append((logp.detach(), ent.detach(), leaf.grad.float()))
    (lp_a, ent_a, grad_a), (lp_b, ent_b, grad_b) = results
    assert torch.allclose(lp_a, lp_b, atol=1e-5) and torch.allclose(ent_a, ent_b, atol=1e-5)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: the gradient is rounded to bf16
    assert torch.allclose(grad_a, grad_b, atol=tol)
    assert lp_b[:, 0].eq(0).all() and ent_b[:, 0].eq(0).all()
