"""The mechanism test: one update from identical weights per recorded group, per advantage arm.

Does GAGAR's advantage move the policy towards the best-ranked pass and away from the worst one
more than GRPO's does, and with what gradient variance? No long run is needed to answer that:

1. Record groups: on the manifest's training tasks, a group of ``--group-size`` scripted experts
   per task (styles drawn from ``spec.model.sftExpertStyles``, seeded per group), run through the
   real agent loop, tools and bubblewrap sandboxes, verified by the pristine tests, and ranked by
   the heuristic grader. A group is kept when it is eligible (a pass and a fail) and its passes
   fall into at least two tied groups (a best and a worst pass exist), until ``--groups``. The
   groups are written to ``--work``/groups.jsonl (token ids, passes, ranking).
2. Replay: for every group and every arm (``grpo``, ``gagar``, ``gagar-redistribution``,
   ``gagar-shaping``: ``bench.gagar_vs_grpo.ARMS``), restore the same starting weights, compute
   the arm's advantages (``gagar.driver.advantages``: the trainer's own code), and run one
   learner update (a fresh optimizer, one trajectory per micro-batch). Measured per group: the
   change of ``log π(best pass) − log π(worst pass)`` (sums over generated tokens, float32), the
   gradient variance across the trajectories (``tr Cov``, docs/design.md §1.9) raw and scale-free
   (divided by ``‖mean gradient‖²``: an arm that rescales advantages scales its raw variance).
3. Paired tests per arm against ``grpo`` over the groups: exact Wilcoxon signed-rank (and sign
   test) p-values, in ``--json``.

    .venv/bin/python bench/gagar_replay.py --policy runs/local/policy/serving [--groups 24]

``--optimizer sgd`` replays with plain SGD (``--lr``) instead of the manifest's AdamW, whose first
step from a fresh state normalizes every coordinate and so hides the advantages' scale.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
from bench.gagar_vs_grpo import ARMS, arm_spec  # noqa: E402
from bench.record import save  # noqa: E402
from gagar.driver.sft import style_weights  # noqa: E402
from gagar.spec import AlgorithmSpec, GagarRun  # noqa: E402


def best_and_worst(ranking: Any) -> tuple[int, int] | None:
    """(a best-ranked pass, a worst-ranked pass), or None when the passes are all tied."""
    tied = [g for g in ranking.tied_groups if g.members]
    if len(tied) < 2:
        return None
    return tied[0].members[0], tied[-1].members[-1]


async def scripted_groups(run: GagarRun, policy_dir: Path, size: int, seed: int):
    """One group of ``size`` scripted experts per training task with a reference fix, in order:
    ``(task, styles, group, ranking)``, ``ranking`` None for a group the grader does not see
    (not eligible). Shared by this bench and ``replay_noise.py``."""
    from gagar.driver import components as comp
    from gagar.driver.loop import rollout_config
    from gagar.driver.rollouts import GroupResult, Rollouts, grading_group
    from gagar.driver.setup import chat_format
    from gagar.driver.sft import ScriptedExpert, draw_styles, expert_turns, style_weights
    from gagar.grader.protocol import HeuristicGrader

    fmt, eos = chat_format(policy_dir)
    factory = comp.sandbox_factory(run.spec.sandbox)
    cfg = rollout_config(run)
    weights = style_weights(run.spec.model.sft_expert_styles)
    train, _ = comp.load_datasets(run.spec.dataset)
    grader = HeuristicGrader()
    limiter = asyncio.Semaphore(4)
    for tried, task in enumerate(t for t in train if t.reference_files):
        styles = list(draw_styles(size, seed * 1_000_003 + tried, weights))

        async def one(style: str, task: Any = task) -> Any:
            async with limiter:
                engine = ScriptedExpert(expert_turns(task, style), fmt.encode, eos)  # type: ignore[arg-type]
                return await Rollouts(factory, engine, fmt, cfg).one(task, None)

        results = await asyncio.gather(*(one(s) for s in styles))
        group = GroupResult(task, [r for r, _ in results], [f for _, f in results])
        ranking = await grader.grade(grading_group(group)) if group.eligible else None
        yield task, styles, group, ranking


async def record_groups(run: GagarRun, policy_dir: Path, n_groups: int, size: int, seed: int):
    """``n_groups`` eligible, ranked groups of scripted experts (see the module doc)."""
    kept: list[tuple[Any, Any, list[str]]] = []
    tried = 0
    async with contextlib.aclosing(scripted_groups(run, policy_dir, size, seed)) as groups:
        async for task, styles, group, ranking in groups:
            tried += 1
            if ranking is None or best_and_worst(ranking) is None:
                continue
            kept.append((group, ranking, styles))
            print(f"  group {len(kept)}/{n_groups}: {task.instance_id} {styles}", flush=True)
            if len(kept) >= n_groups:
                break
    if len(kept) < n_groups:
        raise SystemExit(f"only {len(kept)} usable groups in {tried} training tasks")
    return kept


def sequence_logp(policy: Any, token_ids: list[int], mask: list[int]) -> float:
    """log π of the generated tokens of one trajectory (float32, no autocast)."""
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logp, _ = policy.token_logprobs(ids, torch.ones_like(ids))
    return float((logp[0] * torch.tensor(mask, dtype=logp.dtype)).sum())


def replay_group(
    learner_for: Any,
    model: Any,
    start: list[torch.Tensor],
    group: Any,
    ranking: Any,
    alg: AlgorithmSpec,
) -> dict[str, float]:
    """One update of ``alg``'s advantages on ``group`` from ``start``; the paired measurements."""
    from gagar.driver import advantages as adv_mod
    from gagar.trainer.learner import Sample

    with torch.no_grad():
        for p, s in zip(model.parameters(), start, strict=True):
            p.copy_(s)
    learner = learner_for()
    rollouts = group.rollouts
    batch = adv_mod.group_advantages([rollouts], [ranking], alg)
    per_token = adv_mod.token_advantages([rollouts], batch.adv, alg)
    samples = [
        Sample(r.trajectory.token_ids, r.trajectory.loss_mask, r.trajectory.logprobs, adv, 0)
        for r, adv in zip(rollouts, per_token, strict=True)
        if r.valid and r.trajectory.response_tokens
    ]
    best, worst = best_and_worst(ranking)  # type: ignore[misc]
    tb, tw = rollouts[best].trajectory, rollouts[worst].trajectory
    before = sequence_logp(learner.model, tb.token_ids, tb.loss_mask) - sequence_logp(
        learner.model, tw.token_ids, tw.loss_mask
    )
    metrics = learner.update(samples)
    after = sequence_logp(learner.model, tb.token_ids, tb.loss_mask) - sequence_logp(
        learner.model, tw.token_ids, tw.loss_mask
    )
    mean_norm = metrics["gradient_mean_norm"]
    # The learner's variance is over units closed at a group's end (issue 50): one group replayed
    # is one unit, so it has none (NaN here); the 2026-12-05 records measured it over micro-batches.
    variance = metrics.get("gradient_variance", float("nan"))
    return {
        "gap_change": after - before,
        "gradient_variance": variance,
        "scale_free_variance": variance / mean_norm**2 if mean_norm else float("nan"),
        "best_advantage": float(batch.adv[0, best]),
        "worst_advantage": float(batch.adv[0, worst]),
    }


def summarize(per_arm: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Mean (95 % interval over groups) per arm and metric; paired tests of each arm vs grpo over
    the groups (the unit: each group's update starts from the same weights), Holm over all."""
    keys = ("gap_change", "gradient_variance", "scale_free_variance")
    means = {arm: {k: stats.mean_ci95(v[k]) for k in keys} for arm, v in per_arm.items()}
    tests = {
        f"{arm} vs grpo": {k: stats.paired(v[k], per_arm["grpo"][k]) for k in keys}
        for arm, v in per_arm.items()
        if arm != "grpo"
    }
    family = [t for per in tests.values() for t in per.values()]  # Holm over all of them
    for t, p in zip(family, stats.holm([t["p_value"] for t in family]), strict=True):
        t["p_holm"] = p
    return {"means": means, "tests": tests}


def table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(
        title=f"replay: one update per group from identical weights · {result['groups']} groups"
    )
    t.add_column("arm")
    for head in (
        "Δ(log π best − worst)",
        "grad variance",
        "scale-free variance",
        "p (gap vs grpo)",
    ):
        t.add_column(head, justify="right")
    for arm, m in result["means"].items():
        test = result["tests"].get(f"{arm} vs grpo", {}).get("gap_change")
        t.add_row(
            arm,
            *(
                f"{m[k]['mean']:.4g} [{m[k]['low']:.3g}, {m[k]['high']:.3g}]"
                for k in ("gap_change", "gradient_variance", "scale_free_variance")
            ),
            f"{test['p_value']:.2g}" if test else "–",
        )
    return t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--manifest", default=str(ROOT / "examples" / "gagar-vs-grpo.yaml"))
    p.add_argument("--policy", required=True, help="HF folder of the starting policy")
    p.add_argument("--groups", type=int, default=24)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--lr", type=float, help="default: the manifest's (adamw), 1e-2 (sgd)")
    p.add_argument("--work", default=str(ROOT / "runs" / "gagar_replay"))
    day = datetime.date.today().isoformat()
    p.add_argument("--json", default=str(ROOT / "docs" / "results" / f"gagar_replay-{day}.json"))
    args = p.parse_args()
    from rich.console import Console

    from gagar.driver.local import build_model
    from gagar.driver.setup import build_learner

    console = Console()
    t0 = time.perf_counter()
    base = yaml.safe_load(Path(args.manifest).read_text())
    run = GagarRun.model_validate(base)
    policy_dir = Path(args.policy)
    console.print(f"[bold]recording[/] {args.groups} groups of {args.group_size} scripted experts")
    kept = asyncio.run(record_groups(run, policy_dir, args.groups, args.group_size, args.seed))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "groups.jsonl", "w") as fh:
        for group, ranking, styles in kept:
            fh.write(json.dumps({
                "task": group.task.instance_id, "styles": styles,
                "passed": [r.passed for r in group.rollouts],
                "token_ids": [r.trajectory.token_ids for r in group.rollouts],
                "loss_mask": [r.trajectory.loss_mask for r in group.rollouts],
                "ranking": ranking.model_dump(mode="json"),
            }) + "\n")  # fmt: skip
    record_seconds = time.perf_counter() - t0
    model = build_model(policy_dir)
    start = [p.detach().clone() for p in model.parameters()]
    lr = args.lr or (run.spec.algorithm.optimizer.lr if args.optimizer == "adamw" else 1e-2)
    per_arm: dict[str, dict[str, list[float]]] = {}
    for arm in ARMS:
        doc = arm_spec(base, arm)
        doc["spec"]["algorithm"]["microBatchSize"] = 1  # one trajectory per micro-batch
        arm_run = GagarRun.model_validate(doc)

        def learner_for(arm_run: GagarRun = arm_run) -> Any:
            learner = build_learner(arm_run, model)
            if args.optimizer == "sgd":
                learner.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            else:
                for g in learner.optimizer.param_groups:
                    g["lr"] = lr
            return learner

        rows = [
            replay_group(learner_for, model, start, g, r, arm_run.spec.algorithm)
            for g, r, _ in kept
        ]
        per_arm[arm] = {k: [row[k] for row in rows] for k in rows[0]}
        console.print(
            f"  {arm}: Δgap {statistics.fmean(per_arm[arm]['gap_change']):.4g}, "
            f"variance {statistics.fmean(per_arm[arm]['gradient_variance']):.4g}"
        )
    summary = summarize(per_arm)
    gagar_test = summary["tests"]["gagar vs grpo"]["gap_change"]
    result = {
        "protocol": {
            "manifest": os.path.relpath(args.manifest, ROOT),
            "policy": str(policy_dir),
            "group_size": args.group_size,
            "seed": args.seed,
            "optimizer": args.optimizer,
            "lr": lr,
            "styles": style_weights(run.spec.model.sft_expert_styles),
            "statistic": "change of log π(best-ranked pass) − log π(worst-ranked pass) after one "
            "update from identical weights; paired over groups (exact Wilcoxon, sign test)",
        },
        "groups": len(kept),
        "p_value": gagar_test["p_value"],
        "arms": per_arm,
        **summary,
        "per_group": [
            {
                "task": g.task.instance_id,
                "styles": s,
                "passes": sum(r.passed for r in g.rollouts),
                "tiers": [t.tier for t in r.tied_groups],
            }
            for g, r, s in kept
        ],
        "seconds": {"record": record_seconds, "total": time.perf_counter() - t0},
        "machine": {"loadavg": os.getloadavg()},  # save adds the CPU and its cores
    }
    console.print(table(result))
    save(args.json, result, indent=2)
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
