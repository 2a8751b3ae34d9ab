"""One RL step's policy updates from its trajectories: mini-batches, epochs, micro-batches.

The learner sees token-level samples (token ids, loss mask, rollout log-probs, per-token
advantages, group ids) and a ``PolicyModel`` that returns next-token log-probs; it does not know
about rollouts, graders or Megatron (the Megatron adapter implements ``PolicyModel``).

A step's batch is split into ``mini_batches`` contiguous mini-batches, each one optimizer step,
and the pass over them is repeated ``epochs`` times (verl's and OpenRLHF's PPO loop). Within an
optimizer step the loss is a sum of micro-batch contributions, each normalized by counts over that
mini-batch (``loss.global_counts``), so its gradient does not depend on the micro-batch size or
the data-parallel size.

The importance ratio's ``old_logp`` is the behaviour policy's: the policy as it was when the step
began (the weights the rollouts were sampled with), computed once, before the first optimizer
step. For the first mini-batch of the first epoch it is the training forward's own log-prob,
detached (the weights have not moved yet: the ratio is exactly 1, and one mini-batch and one epoch
is the plain single update, bit for bit); every other micro-batch gets a no-grad forward pass
before the first update. The rollout engine's log-probs enter through the optional truncated
importance correction (``exp(old_logp − rollout_logp)`` capped); a frozen ``reference`` policy's
log-probs, also computed once per step, enter the KL term when ``kl_coef > 0``.

Data parallelism (``DataParallel``): every replica is handed the *whole* step batch (the driver
broadcasts it), so counts and per-prompt token numbers are computed on the full batch, and
replica ``r`` of ``R`` runs micro-batches ``r, r + R, ...`` of each mini-batch. Gradients are then
summed over the replicas (each is already a global-normalized partial sum), so the update equals
the one a single process would make on the whole batch. When collectives run inside the forward
pass (expert parallelism's token dispatch), every replica must run the same number of equally
shaped micro-batches: ``equal_shapes`` pads them and gives the replicas short of work a
zero-weight micro-batch (also in the no-grad passes).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from gagar.trainer.gradvar import GradVarianceTracker
from gagar.trainer.loss import (
    LOG_RATIO_CLAMP,
    GlobalCounts,
    LossConfig,
    PolicyBatch,
    aggregation_weight,
    global_counts,
    policy_loss,
    prompt_token_counts,
)


@dataclass(frozen=True)
class Sample:
    """One trajectory as the trainer sees it (lists of equal length)."""

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantages: list[float]
    group: int


class PolicyModel(Protocol):
    def parameters(self) -> Iterator[torch.nn.Parameter]: ...

    def token_logprobs(
        self, input_ids: Tensor, attention_mask: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """``(logp, entropy)``, both (B, T): ``logp[:, t] = log π(x_t | x_<t)`` (0 at t = 0);
        entropy of the predictive distribution at t, or None when not available (e.g. TP > 1)."""
        ...


class DataParallel(Protocol):
    """This process's place among data-parallel replicas, and the collectives the update needs."""

    rank: int
    size: int
    equal_shapes: bool

    def sync_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum gradients over the replicas (in place)."""
        ...

    def grad_norm(self, params: list[torch.nn.Parameter]) -> float:
        """L2 norm of the whole model's (synced) gradient, the same number on every rank."""
        ...

    def counted(self, param: torch.nn.Parameter) -> bool:
        """Whether this rank counts ``param`` in its replica's norms (TP duplicates count once)."""
        ...

    def reduce_variance(self, stats: Tensor) -> Tensor:
        """``[S2, M, ‖ḡ‖²]`` of this rank → the same for the whole job (see ``gradvar``)."""
        ...

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """Sum additive metrics over the replicas."""
        ...

    def max_metrics(self, maxima: dict[str, float]) -> dict[str, float]:
        """Maximum of each metric over the replicas."""
        ...


@dataclass(frozen=True)
class LearnerConfig:
    micro_batch_size: int
    grad_clip: float = 1.0
    loss: LossConfig = field(default_factory=LossConfig)
    autocast: torch.dtype | None = None
    """Mixed precision for float32 parameters: forward *and* backward run under
    ``torch.autocast`` (Megatron's linear layers are custom autograd functions whose backward
    matmuls need it too); log-probabilities, the loss and the gradients stay float32."""
    micro_batch_tokens: int | None = None
    """Token budget of a micro-batch (rows × padded width); None: ``micro_batch_size`` rows in
    order. Either way a micro-batch holds at most ``micro_batch_size`` samples."""
    mini_batches: int = 1
    """Optimizer steps per pass over the step's batch."""
    epochs: int = 1
    """Passes over the step's batch."""
    lr: Callable[[int], float] | None = None
    """Learning rate of RL step ``step`` (0-based); None leaves the optimizer's as it is."""

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or self.mini_batches < 1 or self.epochs < 1:
            raise ValueError("micro_batch_size, mini_batches and epochs must be >= 1")


def _pad(rows: Sequence[Sequence[float]], width: int, dtype: torch.dtype) -> Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


@dataclass
class _MicroBatch:
    input_ids: Tensor  # (B, T)
    attention: Tensor  # (B, T) bool
    mask: Tensor  # (B, T) bool
    rollout_logp: Tensor  # (B, T)
    adv: Tensor  # (B, T)
    prompt_tokens: Tensor  # (B,)
    old_logp: Tensor | None = None  # (B, T) behaviour policy; None: this forward's own (detached)
    ref_logp: Tensor | None = None  # (B, T) reference policy (KL)
    real: bool = True  # False: a zero-weight round that only joins the collectives
    closes: bool = True  # no group of this rank's unit continues in a later micro-batch (gradvar)

    def to(self, device: torch.device) -> _MicroBatch:
        tensors = {f: getattr(self, f) for f in self.__dataclass_fields__}
        moved: dict[str, Any] = {
            f: x.to(device) for f, x in tensors.items() if isinstance(x, Tensor)
        }
        return replace(self, **moved)


@dataclass
class _MiniBatch:
    counts: GlobalCounts  # over the mini-batch: the denominators of its optimizer step
    micro: list[_MicroBatch]  # this replica's rounds
    dependent: bool = False  # a group's micro-batches on two ranks: no noise scale (gradvar)


def _collate(
    samples: list[Sample], prompt_tokens: Tensor, shape: tuple[int, int] | None = None
) -> _MicroBatch:
    """Pad to the longest sample, or to ``shape`` (rows, width) with zero-weight rows."""
    rows, width = shape or (len(samples), max(len(s.token_ids) for s in samples))
    filler = Sample([0], [0], [0.0], [0.0], -1)  # no loss token: contributes nothing
    samples = samples + [filler] * (rows - len(samples))
    # A padded row's prompt has no loss tokens; 1 keeps prompt-mean's division finite.
    prompt_tokens = torch.cat([prompt_tokens, torch.ones(rows - len(prompt_tokens))])
    return _MicroBatch(
        input_ids=_pad([s.token_ids for s in samples], width, torch.long),
        attention=_pad([[1] * len(s.token_ids) for s in samples], width, torch.long).bool(),
        mask=_pad([s.loss_mask for s in samples], width, torch.long).bool(),
        rollout_logp=_pad([s.rollout_logprobs for s in samples], width, torch.float32),
        adv=_pad([s.advantages for s in samples], width, torch.float32),
        prompt_tokens=prompt_tokens,
    )


def _zero_weight(samples: list[Sample]) -> list[Sample]:
    """The same shapes with no loss token: a micro-batch that only joins the collectives."""
    return [replace(s, loss_mask=[0] * len(s.loss_mask)) for s in samples]


def _split(n: int, parts: int) -> list[range]:
    """``parts`` contiguous, nearly equal ranges of ``n`` samples (fewer when ``n < parts``)."""
    parts = min(parts, n)
    bounds = [n * k // parts for k in range(parts + 1)]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def _check(samples: list[Sample]) -> None:
    if not samples:
        raise ValueError("no samples to train on")
    for i, s in enumerate(samples):
        lengths = {len(s.token_ids), len(s.loss_mask), len(s.rollout_logprobs), len(s.advantages)}
        if len(lengths) != 1:
            raise ValueError(
                f"sample {i}: token_ids, loss_mask, rollout_logprobs and advantages differ in length"
            )
        if s.loss_mask and s.loss_mask[0]:
            raise ValueError(f"sample {i}: the first token has no context and cannot be trained")
        if not all(math.isfinite(a) for a in s.advantages):
            raise ValueError(f"sample {i}: non-finite advantage")


# Token means over the optimizer steps (weighted by each step's tokens); the rest as named.
_MAXIMA = ("ratio_max",)
_STEP_MEANS: tuple[str, ...] = (
    "grad_norm",
    "gradient_variance",
    "gradient_mean_norm",
    "gradient_variance_scaled",
)
_STEP_MEANS += ("gradient_noise_scale", "gradient_noise_trace", "gradient_signal_sq")


class Learner:
    """Owns the optimizer; ``update(samples, step)`` runs one RL step's optimizer steps."""

    def __init__(
        self,
        model: PolicyModel,
        optimizer: torch.optim.Optimizer,
        cfg: LearnerConfig,
        parallel: DataParallel | None = None,
        reference: PolicyModel | None = None,
    ) -> None:
        self.model, self.optimizer, self.cfg, self.parallel = model, optimizer, cfg, parallel
        self.reference = reference
        if cfg.loss.kl_coef > 0 and reference is None:
            raise ValueError("kl_coef > 0 needs a reference policy")
        if reference is not None:
            for p in reference.parameters():
                p.requires_grad_(False)

    def reset_reference(self) -> None:
        """Freeze the policy as it is now as the reference (after the warm start)."""
        if self.reference is not None:
            self.load_reference([p.detach() for p in self.model.parameters()])

    def reference_state(self) -> list[Tensor] | None:
        """The reference's parameters, for a checkpoint (None without a reference)."""
        if self.reference is None:
            return None
        return [p.detach().clone() for p in self.reference.parameters()]

    def load_reference(self, tensors: list[Tensor]) -> None:
        assert self.reference is not None
        params = list(self.reference.parameters())
        if len(params) != len(tensors) or any(
            p.shape != t.shape for p, t in zip(params, tensors, strict=True)
        ):
            raise ValueError("the reference state does not fit this policy's shards")
        with torch.no_grad():
            for p, t in zip(params, tensors, strict=True):
                p.copy_(t)

    def _set_lr(self, step: int | None) -> float:
        if self.cfg.lr is not None and step is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.cfg.lr(step)
        return float(self.optimizer.param_groups[0]["lr"])

    def _chunks(self, samples: list[Sample], mini: range) -> list[list[int]]:
        """The micro-batches of ``mini`` (sample indices): ``micro_batch_size`` samples in order,
        or with ``micro_batch_tokens`` the longest first, each micro-batch taking samples while
        ``rows × its longest`` fits the budget (and the size): padding is then to similar
        lengths, not to the longest of a random few."""
        mb, budget = self.cfg.micro_batch_size, self.cfg.micro_batch_tokens
        if budget is None:
            return [
                list(range(i, min(i + mb, mini.stop))) for i in range(mini.start, mini.stop, mb)
            ]
        chunks: list[list[int]] = []
        for j in sorted(mini, key=lambda j: -len(samples[j].token_ids)):
            cur = chunks[-1] if chunks else []
            if cur and len(cur) < mb and (len(cur) + 1) * len(samples[cur[0]].token_ids) <= budget:
                cur.append(j)
            else:
                chunks.append([j])
        return chunks

    def _rounds(self, chunks: list[list[int]]) -> list[tuple[list[int], bool]]:
        """This replica's micro-batches, each with whether it carries weight."""
        dp = self.parallel
        mine = chunks if dp is None else chunks[dp.rank :: dp.size]
        if dp is None or not dp.equal_shapes:
            return [(rows, True) for rows in mine]
        rounds = -(-len(chunks) // dp.size)
        return [(mine[i], True) if i < len(mine) else (chunks[0], False) for i in range(rounds)]

    def _plan(self, samples: list[Sample], mini: range, width: int) -> _MiniBatch:
        part = samples[mini.start : mini.stop]
        mask = _pad([s.loss_mask for s in part], width, torch.long).bool()
        groups = torch.tensor([s.group for s in part])
        # Every replica holds the whole batch: the counts are computed, not reduced.
        counts, prompt_tokens = global_counts(mask, groups), prompt_token_counts(mask, groups)
        dp, chunks = self.parallel, self._chunks(samples, mini)
        rows = max(self.cfg.micro_batch_size if self.cfg.micro_batch_tokens is None else 0,
                   *(len(c) for c in chunks))  # fmt: skip
        shape = (rows, width) if dp is not None and dp.equal_shapes else None
        micro = []
        rounds = self._rounds(chunks)
        # a zero-weight round's filler rows are no group's: only real rounds keep a unit open
        later = [
            {samples[j].group for c, r in rounds[i + 1 :] if r for j in c}
            for i in range(len(rounds))
        ]
        for (chosen, real), after in zip(rounds, later, strict=True):
            tokens = prompt_tokens[[j - mini.start for j in chosen]]
            picked = [samples[j] for j in chosen]
            batch = _collate(picked if real else _zero_weight(picked), tokens, shape)
            batch.real = real
            batch.closes = not ({samples[j].group for j in chosen} & after)
            micro.append(batch)
        return _MiniBatch(counts, micro, self._split_groups(samples, chunks))

    def _split_groups(self, samples: list[Sample], chunks: list[list[int]]) -> bool:
        """Whether a group's micro-batches fall on two data-parallel ranks."""
        dp = self.parallel
        if dp is None or dp.size == 1:
            return False
        ranks: dict[int, set[int]] = {}
        for k, chunk in enumerate(chunks):
            for j in chunk:
                ranks.setdefault(samples[j].group, set()).add(k % dp.size)
        return any(len(r) > 1 for r in ranks.values())

    def _score(self, model: PolicyModel, batch: _MicroBatch) -> Tensor:
        device = next(iter(model.parameters())).device
        with torch.no_grad(), self._precision(batch.input_ids):
            logp, _ = model.token_logprobs(batch.input_ids.to(device), batch.attention.to(device))
        return logp.float()

    def _behaviour(self, minis: list[_MiniBatch]) -> None:
        """Old and reference log-probs, before the first optimizer step (see the module doc)."""
        kl = self.cfg.loss.kl_coef > 0
        for k, mini in enumerate(minis):
            for batch in mini.micro:
                if k > 0 or self.cfg.epochs > 1:
                    batch.old_logp = self._score(self.model, batch)
                if kl:
                    assert self.reference is not None
                    batch.ref_logp = self._score(self.reference, batch)

    def update(self, samples: list[Sample], step: int | None = None) -> dict[str, float]:
        """``step``: the RL step's index (0-based), which sets the learning rate."""
        _check(samples)
        lr = self._set_lr(step)
        width = max(len(s.token_ids) for s in samples)
        minis = [self._plan(samples, m, width) for m in _split(len(samples), self.cfg.mini_batches)]
        self._behaviour(minis)
        params = list(self.model.parameters())
        results = [
            self._optimizer_step(params, mini) for _ in range(self.cfg.epochs) for mini in minis
        ]
        out = _combine(results)
        out.update(
            lr=lr,
            optimizer_steps=float(len(results)),
            tokens_trained=sum(m.counts.num_tokens for m in minis),
        )
        return out

    def _optimizer_step(self, params: list[Any], mini: _MiniBatch) -> dict[str, float]:
        tracker = GradVarianceTracker(params, self.parallel.counted if self.parallel else None)
        tracker.dependent = mini.dependent
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        maxima: dict[str, float] = {}
        for batch in mini.micro:
            loss, metrics, peaks = self._micro_step(batch, mini.counts)
            if batch.real:  # a zero-weight round adds nothing to the gradient or the metrics
                weight = aggregation_weight(
                    batch.mask, mini.counts, self.cfg.loss, batch.prompt_tokens
                )
                tracker.after_micro_batch(weight, closes=batch.closes)
                for key, value in {"loss": loss.detach(), **metrics}.items():
                    totals[key] = totals.get(key, 0.0) + float(value)
                for key, peak in peaks.items():
                    maxima[key] = max(maxima.get(key, -math.inf), peak)
        return self._step(params, tracker, totals, maxima, mini.counts)

    def _step(
        self,
        params: list[Any],
        tracker: GradVarianceTracker,
        totals: dict[str, float],
        maxima: dict[str, float],
        counts: GlobalCounts,
    ) -> dict[str, float]:
        """Sum over replicas, clip by the global norm, step; returns the step's metrics."""
        dp = self.parallel
        if dp is not None:
            dp.sync_grads(params)
            totals = dp.sum_metrics(totals)
            maxima = dp.max_metrics(maxima)
        variance, mean_norm = tracker.result(dp.reduce_variance if dp is not None else None)
        trace, signal, noise = tracker.noise(
            counts.num_tokens, dp.reduce_variance if dp is not None else None
        )
        grad_norm = dp.grad_norm(params) if dp is not None else _local_norm(params)
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm {grad_norm}: update skipped")
        _clip(params, self.cfg.grad_clip, grad_norm)
        self.optimizer.step()
        totals.update(maxima, grad_norm=grad_norm, gradient_mean_norm=mean_norm)
        if variance is not None:  # one micro-batch has no variance across micro-batches
            totals["gradient_variance"] = variance
            if mean_norm > 0:
                totals["gradient_variance_scaled"] = variance / mean_norm**2
        if math.isfinite(trace):  # B's parts, to pool over steps (one step's ‖G‖² may be ≤ 0)
            totals.update(gradient_noise_trace=trace, gradient_signal_sq=signal)
        if noise is not None:  # ‖G‖² estimated ≤ 0 this step: undefined, not 0
            totals["gradient_noise_scale"] = noise
        totals["tokens"] = counts.num_tokens
        totals["micro_batches"] = (
            float(tracker.micro_batches) if dp is None else _global_micro(tracker, dp)
        )
        return totals

    def _precision(self, like: Tensor) -> Any:
        if self.cfg.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(like.device.type, dtype=self.cfg.autocast)

    def _micro_step(
        self, batch: _MicroBatch, counts: GlobalCounts
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, float]]:
        device = next(iter(self.model.parameters())).device  # the batch goes where the model is
        batch = batch.to(device)
        with self._precision(batch.input_ids):
            logp, entropy = self.model.token_logprobs(batch.input_ids, batch.attention)
        old = logp.detach() if batch.old_logp is None else batch.old_logp
        policy = PolicyBatch(
            logp=logp,
            old_logp=old,
            adv=batch.adv,
            mask=batch.mask,
            prompt_tokens=batch.prompt_tokens,
            rollout_logp=batch.rollout_logp,
            ref_logp=batch.ref_logp,
        )
        loss, metrics = policy_loss(policy, counts, self.cfg.loss)
        with self._precision(batch.input_ids):
            loss.backward()
        mask, n = batch.mask, counts.num_tokens
        metrics["nll"] = -torch.where(mask, logp.detach(), 0).sum() / n
        # Trainer vs rollout engine on the same tokens: ~0 when conversion, serving and weight sync
        # agree (the policy's sampled tokens are scored by both with the weights that sampled them).
        gap = (logp.detach() - batch.rollout_logp).abs()
        metrics["rollout_logp_abs_diff"] = torch.where(mask, gap, 0).sum() / n
        if entropy is not None:
            metrics["entropy"] = torch.where(mask, entropy.detach(), 0).sum() / n
        peaks = {}
        if bool(mask.any()):
            log_ratio = (logp.detach() - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            peaks["ratio_max"] = float(torch.exp(log_ratio[mask]).max())
        return loss, metrics, peaks


def _combine(steps: list[dict[str, float]]) -> dict[str, float]:
    """One RL step's metrics from its optimizer steps': token-weighted means of the additive ones
    (one step: its own values), plain means of the per-step ones (over the steps that have them),
    maxima, and the total of micro-batches."""
    tokens = sum(s["tokens"] for s in steps)
    out: dict[str, float] = {}
    for key in {k for s in steps for k in s} - {"tokens", "micro_batches"}:
        have = [s for s in steps if key in s]
        if key in _MAXIMA:
            out[key] = max(s[key] for s in have)
        elif key in _STEP_MEANS:
            out[key] = sum(s[key] for s in have) / len(have)
        elif len(steps) == 1:
            out[key] = steps[0][key]
        else:
            out[key] = sum(s[key] * s["tokens"] for s in have) / tokens
    out["micro_batches"] = sum(s["micro_batches"] for s in steps)
    return out


def _local_norm(params: list[Any]) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    return (
        float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        if grads
        else 0.0
    )


def _clip(params: list[Any], max_norm: float, norm: float) -> None:
    """Scale gradients by ``max_norm / norm`` when above it (torch's ``clip_grad_norm_`` rule),
    with a norm every rank agrees on, so replicas and tensor-parallel shards stay consistent."""
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)


def _global_micro(tracker: GradVarianceTracker, dp: DataParallel) -> float:
    stats = torch.tensor([0.0, float(tracker.micro_batches), 0.0], dtype=torch.float64)
    return float(dp.reduce_variance(stats)[1])


ROWS_PER_CHUNK = 1024  # positions whose full-vocabulary float32 row is materialised at once


class _TokenLogprob(torch.autograd.Function):
    """``log softmax(logits)[target]`` per position, and the entropy of each position's
    distribution (no gradient), without a (B, T, V) float32 log-softmax.

    The plain form keeps the float32 log-softmax for backward and makes more full-vocabulary
    temporaries: with a 49152-token vocabulary, 4 sequences of 4096 tokens are 3.2 GB each. Here the
    forward keeps only the log-sum-exp per position, taking the entropy from the same exponentials
    (``H = lse − Σ p·x``), and the backward forms ``onehot − softmax`` a chunk of positions at a
    time, straight into the logits' gradient (in the logits' dtype).
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        b, t, _ = logits.shape
        lse = torch.empty(b, t, dtype=torch.float32, device=logits.device)
        ent = torch.empty_like(lse)
        for i in range(b):
            for j in range(0, t, ROWS_PER_CHUNK):
                k = slice(j, j + ROWS_PER_CHUNK)
                x = logits[i, k].float()
                top = x.amax(-1, keepdim=True)
                e = torch.sub(x, top).exp_()  # one full-vocabulary temporary per chunk
                total = e.sum(-1)
                lse[i, k] = top.squeeze(-1) + torch.log(total)
                # Σ e·x as a batched dot product: no second (rows, V) temporary
                dot = torch.bmm(e.unsqueeze(1), x.unsqueeze(2)).view(-1)
                ent[i, k] = lse[i, k] - dot / total
        ctx.save_for_backward(logits, targets, lse)
        ctx.mark_non_differentiable(ent)
        return logits.gather(-1, targets[..., None]).squeeze(-1).float() - lse, ent

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _ent_grad: Tensor) -> tuple[Tensor, None]:
        logits, targets, lse = ctx.saved_tensors
        out = torch.empty_like(logits)
        g = grad.float()
        exact = logits.dtype == torch.float32  # float32 logits: formed in place in the gradient
        for i in range(logits.shape[0]):
            for j in range(0, logits.shape[1], ROWS_PER_CHUNK):
                k = slice(j, j + ROWS_PER_CHUNK)
                d = out[i, k] if exact else torch.empty_like(logits[i, k], dtype=torch.float32)
                torch.sub(logits[i, k].float(), lse[i, k, None], out=d)
                d.exp_().mul_(-g[i, k, None])
                d.scatter_add_(-1, targets[i, k, None], g[i, k, None])
                if not exact:
                    out[i, k] = d  # rounded to the logits' dtype
        return out, None


def causal_lm_logprobs(logits: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    """From (B, T, V) next-token logits: ``logp`` (B, T) of each token given its prefix (0 at t=0)
    and the entropy (B, T) of the distribution that produced it (a metric: no gradient).

    Memory-lean: no full-vocabulary float32 tensor of all positions is kept or made at once."""
    # The last position predicts nothing; scoring it against any token keeps the logits unsliced
    # (a slice of a transposed [s, b, v] output would be copied whole).
    targets = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], 1)
    taken, ent = _TokenLogprob.apply(logits, targets)  # (B, T): position t scores token t + 1
    zero = torch.zeros_like(taken[:, :1])
    return torch.cat([zero, taken[:, :-1]], 1), torch.cat([zero, ent[:, :-1]], 1)
