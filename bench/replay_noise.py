"""Gradient noise scale of GAGAR vs GRPO at fixed weights, over resampled batches of replay groups.

The question: at the SAME weights and on the SAME groups, does GAGAR's advantage give a gradient
with a different noise scale B = tr Σ / ‖G‖² (per token, McCandlish et al. 2018; the trainer's
``gradient_noise_scale``) than GRPO's? It says nothing about learning dynamics: B at fixed weights
is one property of one update, not of a run.

1. Record (``--record``): on the embedded default's training tasks (``examples/local.yaml``), groups
   of ``spec.algorithm.groupSize`` scripted experts (styles drawn from ``spec.model.sftExpertStyles``,
   seeded per group) through the real agent loop, tools and bubblewrap sandboxes, verified by the
   pristine tests and ranked by the heuristic grader; every eligible group (a pass and a fail: the
   groups the trainer trains on) is kept, one per training task, until ``--groups`` or the end of
   the training set (48 tasks in the embedded default). The groups are written, compact, to
   ``docs/results/replay_groups-<date>.json.gz`` (token ids, loss masks, turn spans and flags,
   verification, ranking): the replay file.
2. Per-group gradients: at the fixed weights (``--policy``, by default the final policy of ``make
   run``: ``runs/local/policy/versions/latest``, while ``runs/local/policy/serving`` holds the
   weights served at the run's start, the warm start; the sha256 goes into the JSON), for every
   group and arm the arm's advantages (``gagar.driver.advantages``: the trainer's code) and the
   gradient of the trainer's loss on that group alone (``gagar.trainer.learner.Learner.update``
   with SGD at lr 0: the weights never move). The inner products of all these gradients form a
   Gram matrix.
3. A batch is ``--batch-groups`` distinct groups, one micro-batch each, as the trainer accumulates
   them (a group's contribution to the batch's loss is its own gradient scaled by the aggregation:
   1/P for prompt-mean, n_j/N for token-mean, which is also its share ``s_m``); its tr Σ and ‖G‖²
   come from the trainer's ``gagar.trainer.gradvar.noise_scale``: under prompt-mean unbiased for
   independent groups whatever their token counts (files before 2026-12-07 used the per-token
   rescaling that issue 50 found biased under prompt-mean). Before anything else the bench checks this assembly
   against ``Learner.update`` on one real batch (the trainer's numbers, to 1e-3 relative).
   ``--batches`` batches are drawn once (positions in the group list); both arms see the same ones.
   B(arm) = Σ tr Σ / Σ ‖G‖² over the batches (numerator and denominator averaged before dividing).
4. A common target (issue 50: the paper's "lower gradient variance" reads as a less noisy estimate
   of one quantity, which B does not measure: B divides each arm's noise by its own surrogate's
   expected gradient). With the group as the unit (under prompt-mean a batch's update is the mean
   of its P groups' gradients u_j, whatever their tokens), from the same Gram matrix
   (``gagar.trainer.gradvar.target_moments``, unbiased for independent groups): per arm tr Cov(u)
   (the update's variance per group; × the mean loss tokens per group: per token, the trainer's
   unit), ‖E u‖², the bias² ‖E u − T‖² and the MSE of a P-group update E‖ū_P − T‖² = tr Cov / P +
   bias² against two targets, and the cosine between the arms' expected directions. Targets:
   ``grpo_expected``, T = E u_grpo (estimated by the pooled GRPO direction over all groups; GRPO's
   update is unbiased for it by definition, GAGAR's for E u_gagar, so GAGAR's MSE is its variance
   plus the squared norm of what its advantages add on average); ``reinforce``, T = E[(n_j / n̄)
   u_grpo,j]: under prompt-mean and mean-centred rewards (no std), (G − 1)/n̄ times the RLOO
   policy-gradient of the pass rate (sequence-summed log-probabilities) over the groups'
   distribution, i.e. the same direction in the arms' units; neither arm is unbiased for it (the
   token normalization weighs a group by 1/n_j; GAGAR also redistributes and shapes). The groups
   are scripted experts, not the policy's samples, so this is the pass-rate gradient of that
   sampling distribution, not of π. Intervals: a percentile bootstrap over groups (the same
   resamples for every number; repeated groups are no pair). Descriptive: no test, no Holm.

Protocol (fixed before running): the unit of analysis is the recorded group (distinct tasks and
draws; batches are built from groups, so batch-level values are not independent and never tested
as if they were). The statistic is log B(gagar) − log B(grpo) on the same batches (paired).
Interval: bootstrap over groups (``scipy.stats.bootstrap``, percentile; a resample where the
statistic is undefined is left out and counted, and over 5 % of them leave no interval). p-value:
paired permutation test over groups (``scipy.stats.permutation_test``,
``permutation_type="samples"``: each group's two arms swapped or not), two-sided. Holm over every test of the file: these and the mechanism task's
(``bench/mechanism_noise.py``'s newest JSON, whose tests this file includes). A statistic that is
undefined on the data (a pooled ‖G‖² ≤ 0 makes B undefined) is reported as such and not tested;
under a permutation an undefined value counts as extreme (conservative).

Post hoc (added when the named statistic came out undefined on the first run, and labelled so in
the JSON): log tr Σ(gagar) − log tr Σ(grpo) per token on the same batches, and the signal with
the group as the sample (‖G‖² the mean inner product of distinct groups' gradients, unbiased for
the squared norm of the expected per-group gradient), each with the same interval and test, and
each arm's group-level ‖G‖² with its bootstrap interval (is the signal resolved at all?).

The per-group gradients' Gram matrix is cached in ``--work`` (keyed by the replay file, the
weights, the manifest and the batch size): a change of the analysis reruns in seconds.

    .venv/bin/python bench/replay_noise.py --record [--groups 40]   # then, or alone:
    .venv/bin/python bench/replay_noise.py [--replay docs/results/replay_groups-<date>.json.gz]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import gzip
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from scipy import stats as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
from bench.record import save  # noqa: E402
from gagar.spec import GagarRun  # noqa: E402

RESULTS = ROOT / "docs" / "results"
ARMS = {"grpo": {"mode": "grpo"}, "gagar": {"mode": "gagar"}}


# ------------------------------------------------------------------ recording
async def record_groups(run: GagarRun, policy_dir: Path, n_groups: int, seed: int) -> list[dict]:
    """``n_groups`` eligible groups of scripted experts (module doc, 1), as replay-file rows."""
    from bench.gagar_replay import scripted_groups

    kept: list[dict] = []
    tried = 0
    size = run.spec.algorithm.group_size
    async with contextlib.aclosing(scripted_groups(run, policy_dir, size, seed)) as groups:
        async for task, styles, group, ranking in groups:
            tried += 1
            if ranking is None:
                continue
            kept.append(to_row(task.instance_id, styles, group.rollouts, ranking))
            print(f"  group {len(kept)}/{n_groups}: {task.instance_id} {styles}", flush=True)
            if len(kept) >= n_groups:
                break
    if len(kept) < n_groups:  # kept, not lost: the training set has no more
        print(f"  {len(kept)} eligible groups in all {tried} training tasks (asked {n_groups})")
    if len(kept) < 2:
        raise SystemExit(f"only {len(kept)} eligible groups in {tried} training tasks")
    return kept


def to_row(task: str, styles: list[str], rollouts: list[Any], ranking: Any) -> dict[str, Any]:
    """One group as a replay-file row: what the advantages and the loss read, nothing else."""
    return {
        "task": task,
        "styles": styles,
        "ranking": ranking.model_dump(mode="json"),
        "rollouts": [
            {
                "passed": r.passed,
                "valid": r.valid,
                "tampered": r.tampered,
                "exit": r.trajectory.exit_reason,
                "prompt_len": r.trajectory.prompt_len,
                "token_ids": r.trajectory.token_ids,
                "loss_mask": r.trajectory.loss_mask,
                "turns": [[t.start, t.end, sorted(t.flags)] for t in r.trajectory.turns],
            }
            for r in rollouts
        ],
    }


def from_row(row: dict[str, Any]) -> tuple[list[Any], Any]:
    """A replay-file row back into the trainer's ``Rollout``s and ``Ranking``."""
    from gagar.driver.advantages import Rollout
    from gagar.rollout.agent import Trajectory, Turn
    from gagar.wire import Ranking

    rollouts = []
    for r in row["rollouts"]:
        ids = [int(x) for x in r["token_ids"]]
        traj = Trajectory(
            token_ids=ids,
            logprobs=[0.0] * len(ids),
            loss_mask=[int(x) for x in r["loss_mask"]],
            prompt_len=int(r["prompt_len"]),
            messages=[],
            turns=[Turn(int(a), int(b), "", None, None, set(f)) for a, b, f in r["turns"]],
            exit_reason=r["exit"],
        )
        rollouts.append(Rollout(traj, bool(r["passed"]), bool(r["valid"]), bool(r["tampered"])))
    return rollouts, Ranking.model_validate(row["ranking"])


def write_replay(path: Path, meta: dict[str, Any], rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump({"meta": meta, "groups": rows}, fh, separators=(",", ":"))


def read_replay(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list) or not data["groups"]:
        raise SystemExit(f"{path}: not a replay file (no groups)")
    return data


# ------------------------------------------------------------------ gradients
def arm_run(base: dict[str, Any], arm: str) -> GagarRun:
    doc = json.loads(json.dumps(base))
    doc["spec"]["algorithm"].update(ARMS[arm])
    return GagarRun.model_validate(doc)


def samples_of(groups: list[tuple[list[Any], Any]], alg: Any) -> list[Any]:
    """The trainer's ``Sample``s of ``groups`` under ``alg``'s advantages (the trainer's code)."""
    from gagar.driver import advantages as adv_mod
    from gagar.trainer.learner import Sample

    rollouts = [g for g, _ in groups]
    batch = adv_mod.group_advantages(rollouts, [r for _, r in groups], alg)
    per_token = adv_mod.token_advantages(rollouts, batch.adv, alg)
    flat = [r for g in rollouts for r in g]
    out = []
    for k, (r, adv) in enumerate(zip(flat, per_token, strict=True)):
        t = r.trajectory
        out.append(
            Sample(t.token_ids, t.loss_mask, [0.0] * len(t.token_ids), adv, k // len(rollouts[0]))
        )
    return out


def fixed_learner(run: GagarRun, model: Any, group_size: int) -> Any:
    """The arm's learner with SGD at lr 0 and no clipping: ``update`` only forms gradients."""
    from gagar.driver.setup import build_learner

    learner = build_learner(run, model)
    learner.optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    learner.cfg = dataclasses.replace(
        learner.cfg,
        micro_batch_size=group_size,
        micro_batch_tokens=None,
        grad_clip=math.inf,
        mini_batches=1,
        epochs=1,
        lr=None,
    )
    return learner


def flat_grad(model: Any) -> torch.Tensor:
    return torch.cat(
        [p.grad.detach().float().reshape(-1) for p in model.parameters() if p.grad is not None]
    )


def contribution_scale(agg: str, tokens: np.ndarray, groups: int) -> np.ndarray:
    """How a group's own gradient (the group alone, P = 1) enters a batch's loss: (..., P)."""
    if agg == "prompt-mean":
        return np.full_like(tokens, 1.0 / groups, dtype=float)
    if agg == "token-mean":
        return tokens / tokens.sum(axis=-1, keepdims=True)
    raise SystemExit(f"aggregation {agg!r}: this bench assembles prompt-mean and token-mean only")


def batch_parts(
    gram: np.ndarray, tokens: np.ndarray, ids: np.ndarray, agg: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For batches ``ids`` (R, P) of gradient rows, one group per micro-batch: the tracker's
    inputs per batch, as ``GradVarianceTracker.noise`` forms them (``S2 = Σ_m ‖c_m‖²``, ‖ḡ‖²,
    ``Σ_m s_m²``, N). Under prompt-mean and token-mean a group's contribution scale is its share
    ``s_m`` (``loss.aggregation_weight`` over the batch's)."""
    n = tokens[ids]  # (R, P)
    s = contribution_scale(agg, n, ids.shape[1])
    sub = gram[ids[:, :, None], ids[:, None, :]]  # (R, P, P)
    big = np.einsum("rp,rpq,rq->r", s, sub, s)
    own = (s**2 * np.einsum("rpp->rp", sub)).sum(axis=1)  # Σ_m ‖c_m‖²
    return own, big, (s**2).sum(axis=1), n.sum(axis=1)


def noise_parts(gram: np.ndarray, tokens: np.ndarray, ids: np.ndarray, agg: str) -> np.ndarray:
    """(R, 2): tr Σ and ‖G‖² per batch, from the trainer's ``noise_scale``."""
    from gagar.trainer.gradvar import noise_scale

    parts = batch_parts(gram, tokens, ids, agg)
    return np.array([noise_scale(*map(float, row))[:2] for row in zip(*parts, strict=True)])


def distinct(gram: np.ndarray, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The batches of ``pos`` whose groups are distinct in ``x`` (a bootstrap resample repeats
    groups; a batch holding one group twice would count its gradient as signal)."""
    groups = x[pos] % (gram.shape[0] // len(ARMS))
    ok = np.array([len(set(row)) == len(row) for row in groups.tolist()])
    return pos[ok]


def log_ratio(
    gram: np.ndarray, tokens: np.ndarray, x: np.ndarray, y: np.ndarray, pos: np.ndarray, agg: str
) -> float:
    """log B(y) − log B(x) on the batches ``pos`` (positions) of the gradient rows ``x``, ``y``."""
    pos = distinct(gram, x, pos)
    if not len(pos):  # a resample of few groups can leave no batch of distinct groups
        return math.nan
    a, b = noise_parts(gram, tokens, x[pos], agg), noise_parts(gram, tokens, y[pos], agg)
    (ta, sa), (tb, sb) = a.sum(axis=0), b.sum(axis=0)
    if min(ta, sa, tb, sb) <= 0:  # a pooled tr Σ or ‖G‖² ≤ 0: B undefined
        return math.nan
    return math.log((tb / sb) / (ta / sa))


# ------------------------------------------------------------------ main
def gradients(args: argparse.Namespace, base: dict[str, Any], replay_path: Path) -> dict[str, Any]:
    """The Gram matrix of every (arm, group) gradient at the fixed weights, the groups' loss tokens
    and the assembly check; cached in ``--work`` by replay file, weights and manifest."""
    from gagar.driver.local import build_model

    replay = read_replay(replay_path)
    key = hashlib.sha256()
    for part in (
        replay_path.read_bytes(),
        (Path(args.policy) / "model.safetensors").read_bytes(),
        Path(args.manifest).read_bytes(),
        json.dumps(ARMS).encode(),
        str(args.batch_groups).encode(),
    ):
        key.update(part)
    cache = Path(args.work) / f"gram-{key.hexdigest()[:16]}.npz"
    runs = {arm: arm_run(base, arm) for arm in ARMS}
    agg = runs["grpo"].spec.algorithm.loss.aggregation
    if cache.exists():
        z = np.load(cache)
        print(f"  gradients from {cache}")
        return {
            "gram": z["gram"],
            "tokens": z["tokens"],
            "check": z["check"].tolist(),
            "seconds": float(z["seconds"]),
            "agg": agg,
            "replay": replay,
        }
    torch.manual_seed(0)
    groups = [from_row(r) for r in replay["groups"]]
    size = len(groups[0][0])
    model = build_model(Path(args.policy))
    learners = {arm: fixed_learner(run, model, size) for arm, run in runs.items()}
    start = [p.detach().clone() for p in model.parameters()]
    # the assembly against the trainer's own numbers on one real batch (module doc, 3)
    check_ids = list(range(args.batch_groups))
    direct = learners["gagar"].update(
        samples_of([groups[i] for i in check_ids], runs["gagar"].spec.algorithm)
    )
    rows: list[torch.Tensor] = []
    tokens: list[float] = []
    t0 = time.perf_counter()
    for arm, learner in learners.items():
        alg = runs[arm].spec.algorithm
        for j, g in enumerate(groups):
            learner.update(samples_of([g], alg))
            rows.append(flat_grad(model))
            if arm == "grpo":
                tokens.append(float(sum(sum(r.trajectory.loss_mask) for r in g[0])))
            print(
                f"  {arm} group {j + 1}/{len(groups)} ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    seconds = time.perf_counter() - t0
    for p, s in zip(model.parameters(), start, strict=True):
        assert torch.equal(p.detach(), s), "the weights moved: lr 0 must leave them fixed"
    u = torch.stack(rows).double()
    gram = (u @ u.T).numpy()
    del u, rows
    tok = np.array(tokens * len(ARMS))
    n = len(groups)
    assembled = noise_parts(gram, tok, np.arange(n, 2 * n)[np.array([check_ids])], agg)[0]
    want = (direct["gradient_noise_trace"], direct["gradient_signal_sq"])
    for got, ref in zip(assembled, want, strict=True):
        if not math.isclose(got, ref, rel_tol=1e-3, abs_tol=1e-12):
            raise SystemExit(f"assembly check failed: {assembled.tolist()} vs the trainer's {want}")
    check = [list(assembled), list(want)]
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, gram=gram, tokens=tok, check=np.array(check), seconds=seconds)
    return {
        "gram": gram,
        "tokens": tok,
        "check": check,
        "seconds": seconds,
        "agg": agg,
        "replay": replay,
    }


def group_signal(gram: np.ndarray, ids: np.ndarray) -> tuple[float, float]:
    """(‖G‖², tr Σ) with the group as the sample: ‖G‖² the mean inner product of distinct groups'
    gradients (unbiased for ‖E u‖²), tr Σ the unbiased variance of the groups' gradients."""
    sub = gram[np.ix_(ids, ids)]
    groups = ids % (gram.shape[0] // len(ARMS))
    # pairs of distinct groups only: a bootstrap resample's repeated group is no second sample
    signal = sub[groups[:, None] != groups[None, :]].mean()
    return float(signal), float(np.diag(sub).mean() - signal)


# ------------------------------------------------------------------ a common target (issue 50)
TARGETS = ("grpo_expected", "reinforce")


def target_parts(gram: np.ndarray, tok: np.ndarray, pos: np.ndarray) -> dict[str, Any]:
    """Both arms' ``gradvar.TargetMoments`` against each target on the groups at ``pos`` (n,)
    (positions in the group list; a bootstrap resample repeats some), module doc, 4."""
    from gagar.trainer.gradvar import target_moments

    n = gram.shape[0] // len(ARMS)
    k = torch.from_numpy(gram)
    ids = torch.from_numpy(pos)
    rows = {"grpo": ids, "gagar": ids + n}
    w = torch.from_numpy(tok[pos] / tok[pos].mean())  # RLOO's per-group weight, arms' units

    def block(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return k[a[:, None], b[None, :]]

    grpo = block(rows["grpo"], rows["grpo"])
    out: dict[str, Any] = {}
    for arm, r in rows.items():
        uu, ug = block(r, r), block(r, rows["grpo"])
        out[arm] = {
            "grpo_expected": target_moments(uu, ug, grpo, ids),
            "reinforce": target_moments(uu, ug * w[None, :], grpo * w[:, None] * w[None, :], ids),
        }
    return out


def target_stats(gram: np.ndarray, tok: np.ndarray, pos: np.ndarray, p: int) -> dict[str, Any]:
    """The common-target numbers on the groups at ``pos``: per arm, and GAGAR / GRPO."""
    from gagar.trainer.gradvar import cosine, pair_mean

    parts = target_parts(gram, tok, pos)
    n = gram.shape[0] // len(ARMS)
    ids = torch.from_numpy(pos)
    cross = pair_mean(torch.from_numpy(gram)[ids[:, None], ids[None, :] + n], ids)
    own = {arm: parts[arm]["grpo_expected"] for arm in ARMS}
    arms = {
        arm: {
            "trace_cov_group": m["grpo_expected"].trace,
            "trace_cov_token": m["grpo_expected"].trace * float(tok[pos].mean()),
            "signal_sq_group": m["grpo_expected"].signal,
            "noise_scale_groups": m["grpo_expected"].noise_scale(),
            **{f"bias_sq_{t}": m[t].bias for t in TARGETS},
            **{f"mse_{t}_{p}_groups": m[t].mse(p) for t in TARGETS},
            **{f"cos_{t}": m[t].cosine() for t in TARGETS},
        }
        for arm, m in parts.items()
    }

    def ratio(key: str) -> float | None:
        a, b = arms["gagar"][key], arms["grpo"][key]
        return a / b if a is not None and b is not None and a > 0 and b > 0 else None

    keys = ["trace_cov_group", *(f"mse_{t}_{p}_groups" for t in TARGETS), "noise_scale_groups"]
    return {
        "arms": arms,
        "gagar_over_grpo": {k: ratio(k) for k in keys},
        "cos_arms": cosine(cross, own["gagar"].signal, own["grpo"].signal),
    }


def target_report(gram: np.ndarray, tok: np.ndarray, p: int, args: argparse.Namespace) -> dict:
    """``target_stats`` on all groups, with percentile intervals from a bootstrap over groups
    (the same resamples for every number) and the per-group numbers a reader recomputes from."""
    n = gram.shape[0] // len(ARMS)
    point = target_stats(gram, tok, np.arange(n), p)
    rng = np.random.default_rng(args.seed)
    boot = [target_stats(gram, tok, rng.integers(0, n, n), p) for _ in range(args.resamples)]

    def ci(get: Any) -> list[float] | None:
        values = np.array([v for b in boot if (v := get(b)) is not None], dtype=float)
        if len(values) < 0.95 * len(boot):  # undefined too often for an interval to mean much
            return None
        return np.percentile(values, [2.5, 97.5]).tolist()

    for arm, row in point["arms"].items():
        row["ci95"] = {k: ci(lambda b, a=arm, k=k: b["arms"][a][k]) for k in row}
    point["gagar_over_grpo_ci95"] = {
        k: ci(lambda b, k=k: b["gagar_over_grpo"][k]) for k in point["gagar_over_grpo"]
    }
    point["cos_arms_ci95"] = ci(lambda b: b["cos_arms"])
    return point | {"batch_groups": p, "per_group": per_group(gram, tok)}


def per_group(gram: np.ndarray, tok: np.ndarray) -> dict[str, Any]:
    """Per group: loss tokens, squared norms, the arms' inner product, each arm's projection on
    the pooled mean directions; and the whole Gram matrix (rows grpo 0..n−1, then gagar)."""
    n = gram.shape[0] // len(ARMS)
    ones = np.full(n, 1.0 / n)
    out: dict[str, Any] = {"tokens": tok[:n].tolist()}
    for arm, a in (("grpo", 0), ("gagar", n)):
        out[f"sq_norm_{arm}"] = np.diag(gram)[a : a + n].tolist()
        for dirn, d in (("grpo", 0), ("gagar", n)):
            mean_sq = ones @ gram[d : d + n, d : d + n] @ ones  # ‖ū_dirn‖² (plug-in)
            proj = gram[a : a + n, d : d + n] @ ones / math.sqrt(mean_sq)
            out[f"proj_{arm}_on_mean_{dirn}"] = proj.tolist()
    out["inner_grpo_gagar"] = np.diag(gram[:n, n:]).tolist()
    out["gram"] = gram.tolist()
    return out


def paired_group_test(name: str, f: Any, n: int, args: argparse.Namespace, **extra: Any) -> dict:
    """``f(x, y)`` (gradient rows of grpo and gagar, group-aligned) → a log ratio: the point value,
    a bootstrap interval over groups, a paired permutation p over groups (arms swapped per group).
    Undefined (not tested) when the observed value is not finite."""
    grpo, gagar = np.arange(n), np.arange(n, 2 * n)
    point = f(grpo, gagar)
    out = {"name": name, "log_ratio": point, "n": n, "unit": "recorded group", **extra}
    if not math.isfinite(point):
        return out | {"defined": False, "p_value": None}
    boot = st.bootstrap(
        (np.arange(n),),
        lambda sel, axis=-1: f(grpo[sel], gagar[sel]),
        vectorized=False,
        n_resamples=args.resamples,
        rng=args.seed,
        method="percentile",
    )

    def extreme(x: np.ndarray, y: np.ndarray) -> float:  # undefined under a permutation: extreme
        value = f(x, y)
        return value if math.isfinite(value) else math.inf

    perm = st.permutation_test(
        (grpo, gagar),
        extreme,
        permutation_type="samples",
        vectorized=False,
        n_resamples=args.resamples,
        rng=args.seed,
    )
    # a resample where the statistic is undefined (e.g. a group-level ‖G‖² ≤ 0) has no value:
    # the percentiles of the defined ones, and how many were not (no interval above 5 %)
    dist = boot.bootstrap_distribution
    finite = dist[np.isfinite(dist)]
    ci = (
        np.exp(np.percentile(finite, [2.5, 97.5])).tolist()
        if len(finite) >= 0.95 * len(dist)
        else None
    )
    return out | {
        "defined": True,
        "ratio_gagar_over_grpo": math.exp(point),
        "ratio_ci95": ci,
        "resamples_undefined": int(len(dist) - len(finite)),
        "p_value": float(perm.pvalue),
    }


def measure(args: argparse.Namespace, base: dict[str, Any], replay_path: Path) -> dict:
    g = gradients(args, base, replay_path)
    gram, tok, agg, replay = g["gram"], g["tokens"], g["agg"], g["replay"]
    n = len(replay["groups"])
    grpo, gagar = np.arange(n), np.arange(n, 2 * n)
    rng = np.random.default_rng(args.seed)
    pos = np.array([rng.choice(n, args.batch_groups, replace=False) for _ in range(args.batches)])
    parts = {
        arm: noise_parts(gram, tok, ids[pos], agg)
        for arm, ids in (("grpo", grpo), ("gagar", gagar))
    }
    arms = {
        arm: {
            "trace_sigma": float(v[:, 0].mean()),
            "grad_sq_norm": float(v[:, 1].mean()),
            "noise_scale_tokens": float(v[:, 0].sum() / v[:, 1].sum())
            if v[:, 1].sum() > 0
            else None,
            "batches_with_signal_le_0": int((v[:, 1] <= 0).sum()),
            "group_level": dict(
                zip(("signal_sq", "trace_sigma"), group_signal(gram, ids), strict=True)
            ),
        }
        for (arm, v), ids in zip(parts.items(), (grpo, gagar), strict=True)
    }

    def log_trace(x: np.ndarray, y: np.ndarray) -> float:
        kept = distinct(gram, x, pos)
        a, b = noise_parts(gram, tok, x[kept], agg), noise_parts(gram, tok, y[kept], agg)
        ta, tb = a[:, 0].mean(), b[:, 0].mean()
        return math.log(tb / ta) if ta > 0 and tb > 0 else math.nan

    def log_group_signal(x: np.ndarray, y: np.ndarray) -> float:
        sx, sy = group_signal(gram, x)[0], group_signal(gram, y)[0]
        return math.log(sy / sx) if sx > 0 and sy > 0 else math.nan

    tests = [
        paired_group_test(
            "replay: log B(gagar) - log B(grpo) (named before the run)",
            lambda x, y: log_ratio(gram, tok, x, y, pos, agg),
            n,
            args,
            reason_if_undefined="pooled ‖G‖² ≤ 0 over the batches: B undefined",
        ),
        paired_group_test(
            "replay, post hoc: log tr Σ(gagar) - log tr Σ(grpo), per token", log_trace, n, args
        ),
        paired_group_test(
            "replay, post hoc: log ‖G‖²(gagar) - log ‖G‖²(grpo), group as the sample",
            log_group_signal,
            n,
            args,
            reason_if_undefined="a group-level ‖G‖² estimate ≤ 0",
        ),
    ]
    # descriptive: bootstrap interval of each arm's group-level ‖G‖² (is the signal resolved?)
    for arm, ids in (("grpo", grpo), ("gagar", gagar)):
        boot = st.bootstrap(
            (ids,),
            lambda sel, axis=-1: group_signal(gram, sel)[0],
            vectorized=False,
            n_resamples=args.resamples,
            rng=args.seed,
            method="percentile",
        )
        ci = boot.confidence_interval
        arms[arm]["group_level"]["signal_sq_ci95"] = [float(ci.low), float(ci.high)]
    # distinct tiers with members (two tied groups in T1 are one tier: issue 50's 14 → 9)
    tiers = [
        len({t["tier"] for t in r["ranking"]["tied_groups"] if t["members"]})
        for r in replay["groups"]
    ]
    common = target_report(gram, tok, args.batch_groups, args) if agg == "prompt-mean" else None
    return {
        "arms": arms,
        "common_target": common,
        "groups_with_two_or_more_tiers": sum(t >= 2 for t in tiers),
        "assembly_check": {"assembled": g["check"][0], "trainer": g["check"][1]},
        "gradient_seconds": round(g["seconds"], 1),
        "aggregation": agg,
        "tests": tests,
    }


def mechanism_tests() -> tuple[str | None, list[dict[str, Any]]]:
    """The mechanism task's noise tests (``bench/mechanism_noise.py``'s newest JSON)."""
    found = sorted(RESULTS.glob("mechanism_noise-*.json"))
    if not found:
        return None, []
    data = json.loads(found[-1].read_text())
    out = []
    for r in data["rows"]:
        if "p_value" not in r:
            continue
        out.append(
            {
                "name": f"mechanism: log B(gagar) - log B(grpo), {r['point']}, q={r['q']}, b={r['bonus']}",
                "ratio_gagar_over_grpo": r["ratio_gagar_over_grpo"],
                "ratio_ci95": r["ratio_ci95"],
                "p_value": r["p_value"],
                "n": r["batches"],
                "unit": "batch (independent draws)",
            }
        )
    return found[-1].name, out


def main(argv: list[str] | None = None) -> int:
    day = dt.date.today().isoformat()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--manifest", default=str(ROOT / "examples" / "local.yaml"))
    ap.add_argument(
        "--policy", default=str(ROOT / "runs" / "local" / "policy" / "versions" / "latest")
    )
    ap.add_argument("--record", action="store_true", help="record the replay groups first")
    ap.add_argument("--groups", type=int, default=48, help="at most (one per training task)")
    ap.add_argument("--replay", type=Path, help="default: the newest docs/results/replay_groups-*")
    ap.add_argument("--batch-groups", type=int, default=4, help="groups (micro-batches) per batch")
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--resamples", type=int, default=999)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / f"replay_noise-{day}.json")
    ap.add_argument("--work", default=str(ROOT / "runs" / "replay_noise"), help="gradient cache")
    ap.add_argument("--note", default="", help="what the weights are (into the JSON's protocol)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    t0 = time.perf_counter()
    base = yaml.safe_load(Path(args.manifest).read_text())
    if args.record:
        run = GagarRun.model_validate(base)
        rows = asyncio.run(record_groups(run, Path(args.policy), args.groups, args.seed))
        args.replay = args.replay or RESULTS / f"replay_groups-{day}.json.gz"
        meta = {
            "manifest": os.path.relpath(args.manifest, ROOT),
            "seed": args.seed,
            "recorded": day,
            "source": "scripted experts, heuristic grader; bench/replay_noise.py",
        }
        write_replay(args.replay, meta, rows)
        print(f"-> {args.replay} ({args.replay.stat().st_size} bytes)")
    replay_path = args.replay or sorted(RESULTS.glob("replay_groups-*.json.gz"))[-1]
    replay = read_replay(replay_path)
    weights = Path(args.policy) / "model.safetensors"
    result = measure(args, base, replay_path)
    mech_file, mech = mechanism_tests()
    tests = [*result.pop("tests"), *mech]
    family = [t for t in tests if t.get("p_value") is not None]  # an undefined test is no test
    for t, p in zip(family, stats.holm([t["p_value"] for t in family]), strict=True):
        t["p_holm"] = p
    out = {
        "bench": "replay_noise",
        "protocol": {
            "question": "B = tr Σ / ‖G‖² (per token) of GAGAR vs GRPO at fixed weights, same batches",
            "unit": "recorded group (batches are built from groups; never tested as independent)",
            "statistic": "log B(gagar) − log B(grpo), B = Σ tr Σ / Σ ‖G‖² over the batches",
            "interval": f"bootstrap over groups, percentile, {args.resamples} resamples",
            "p_value": f"paired permutation over groups (arms swapped per group), {args.resamples}",
            "multiplicity": "Holm over every defined test in this file (replay and mechanism "
            "task); an undefined statistic is reported, not tested",
            "post_hoc": "added after the named test came out undefined: tr Σ per token on the "
            "same batches, and ‖G‖² with the group as the sample",
            "replay": os.path.relpath(replay_path, ROOT),
            "replay_meta": replay["meta"],
            "groups": len(replay["groups"]),
            "batch_groups": args.batch_groups,
            "batches": args.batches,
            "seed": args.seed,
            "manifest": os.path.relpath(args.manifest, ROOT),
            "policy": args.policy,
            "policy_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
            "policy_note": args.note,
            "mechanism_file": mech_file,
            "common_target": "module doc, 4: per arm tr Cov of the update per group and per token, "
            "bias² and MSE of a batch_groups-group update against T = E u_grpo "
            "(grpo_expected) and T = the RLOO pass-rate gradient in the arms' units (reinforce), "
            "GAGAR / GRPO, the cosine of the arms' expected directions; percentile bootstrap "
            "over groups; descriptive (no test). per_group.gram: rows grpo 0..n-1 then gagar",
        },
        **result,
        "tests": tests,
        "elapsed_seconds": round(time.perf_counter() - t0, 1),
        "machine": {"loadavg": os.getloadavg()},  # save adds the CPU and its cores
    }
    save(args.out, out, indent=1)
    for t in tests:
        if t.get("p_value") is None:
            print(f"{t['name']}: undefined ({t.get('reason_if_undefined')}): not tested")
            continue
        lo, hi = t["ratio_ci95"] or (math.nan, math.nan)
        print(
            f"{t['name']}: {t['ratio_gagar_over_grpo']:.3f} [{lo:.3f}, {hi:.3f}] "
            f"p {t['p_value']:.3g} Holm {t['p_holm']:.3g}"
        )
    if out.get("common_target"):
        print_targets(out["common_target"])
    print(f"-> {args.out}")
    return 0


def print_targets(ct: dict[str, Any]) -> None:
    """The common-target table: each arm's number, then GAGAR / GRPO, with the intervals."""

    def fmt(v: float | None, ci: list[float] | None) -> str:
        if v is None:
            return "undefined"
        return f"{v:.4g} [{ci[0]:.4g}, {ci[1]:.4g}]" if ci else f"{v:.4g} [no interval]"

    for key in ct["arms"]["grpo"]:
        if key == "ci95":
            continue
        cells = [fmt(ct["arms"][a][key], ct["arms"][a]["ci95"][key]) for a in ARMS]
        if key in ct["gagar_over_grpo"]:
            k = ct["gagar_over_grpo"]
            cells.append(fmt(k[key], ct["gagar_over_grpo_ci95"][key]))
        print(f"  {key}: " + " | ".join(cells))
    print(f"  cos(E u_grpo, E u_gagar): {fmt(ct['cos_arms'], ct['cos_arms_ci95'])}")


if __name__ == "__main__":
    raise SystemExit(main())
