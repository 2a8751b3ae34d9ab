"""The grader's SFT as a bench: records from the benchmark's train groups and from training
pools (``gagar grader sft-data``), ``gagar grader sft``, then ``gagar grader eval`` on held-out
groups: the heuristic, the SFT'd model and the model it started from (both answering in one
forced turn, from the one-turn evidence prompt, ``gagar.grader.brief``), written to
bench/results/grader_sft.json with the machine record: the SFT's settings, NLL per step, its
validations and time, and each row's metrics and per-group scores.

Train and held-out groups come from one seeded split (``gagar.driver.grader_bench``); the pools
are built on tasks of their own; the SFT never sees a held-out group (``grader_sft.record``
refuses one) and picks its weights on validation groups it keeps out of the *train* groups:
nothing here is tuned on the held-out groups. Stages are slow on a CPU, so ``--trained DIR``
reuses a finished SFT and ``--evals FILE ...`` reuses finished eval results (``gagar grader eval
--out``), each checked to come from the same groups and seed.

    .venv/bin/python bench/grader_sft.py [--groups 48] [--pools 150] [--per-pool 4]
        [--per-group 1] [--steps 400] [--minutes 40] [--lr 2e-4] [--limit 12] [--shuffles 2]
        [--trained DIR] [--evals FILE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save
from gagar.cli import main as gagar

RESULT = Path(__file__).parent / "results" / "grader_sft.json"
BASE = "smollm2-135m"


def _eval(args: argparse.Namespace, model: str, out: Path, heuristic: bool = False) -> dict:
    common = ["--groups", str(args.groups), "--seed", str(args.seed), "--split", "held_out"]
    rows = ["--limit", str(args.limit), "--shuffles", str(args.shuffles)]
    rows += [] if heuristic else ["--no-heuristic"]
    serve = ["--serve", model, "--max-turns", "1", "--out", str(out)]
    # a process of its own, importing the code as it is now: the SFT takes ~half an hour, and a
    # grader module imported lazily after a change to the tree met the older wire models the
    # SFT's process had loaded (2026-12-07: GradingGroup.environment, every grading a
    # grader_error in 0.02 s)
    argv = [sys.executable, "-m", "gagar.cli", "grader", "eval", *common, *rows, *serve]
    if subprocess.run(argv, check=False).returncode != 0:
        raise SystemExit(f"gagar grader eval --serve {model} failed")
    return json.loads(out.read_text())


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-group", type=int, default=1)
    p.add_argument("--pools", type=int, default=150)
    p.add_argument("--per-pool", type=int, default=4)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--minutes", type=float, default=40.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--val-groups", type=int, default=16)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--shuffles", type=int, default=2)
    p.add_argument("--trained", help="a finished `gagar grader sft` folder to evaluate")
    p.add_argument("--evals", nargs="*", default=[], help="finished `gagar grader eval` JSONs")
    p.add_argument("--out", default=str(RESULT))
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="grader-sft-bench-"))
    trained = Path(args.trained) if args.trained else work / "grader"
    if not args.trained:
        data = work / "records.jsonl"
        build = ["--groups", str(args.groups), "--seed", str(args.seed)]
        build += ["--per-group", str(args.per_group), "--pools", str(args.pools)]
        build += ["--per-pool", str(args.per_pool)]
        if gagar(["grader", "sft-data", *build, "--out", str(data)]) != 0:
            raise SystemExit("gagar grader sft-data failed")
        train = ["--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr)]
        train += ["--minutes", str(args.minutes), "--val-groups", str(args.val_groups)]
        train += ["--eval-every", str(args.eval_every), "--seed", str(args.seed)]
        if gagar(["grader", "sft", "--data", str(data), *train, "--out", str(trained)]) != 0:
            raise SystemExit("gagar grader sft failed")
    sft = json.loads((trained / "grader_sft.json").read_text())
    evals = [json.loads(Path(f).read_text()) for f in args.evals]
    for e in evals:
        if (e["groups_built"], e["seed"], e["split"]) != (args.groups, args.seed, "held_out"):
            raise SystemExit(f"an eval of other groups: {e['groups_built']}, seed {e['seed']}")
    if not evals:
        evals = [
            _eval(args, str(trained), work / "sft.json", heuristic=True),
            _eval(args, BASE, work / "base.json"),
        ]
    # `eval --serve DIR` names its row by DIR's name: call the trained one what it is
    names = {f"agentic {trained.name}": "agentic SFT'd"}
    rows = {names.get(n, n): row for e in evals for n, row in e["rows"].items()}
    per_group = {names.get(n, n): g for e in evals for n, g in e["per_group"].items()}
    result = {
        "benchmark": "grader_sft",
        "groups_built": args.groups,
        "seed": args.seed,
        "held_out_group_ids": evals[0]["group_ids"],
        "shuffles": evals[0]["shuffles"],
        "sft": sft,
        "rows": rows,
        "per_group": per_group,
    }
    doc = save(args.out, result, indent=1)
    for name, row in rows.items():
        print(
            f"{name}: usable {row['usable_rate']:.2f}, pairwise {row['pairwise_accuracy']:.3f} "
            f"({row['pairs']} pairs), tau-b {_num(row['kendall_tau_b'])}, consistency "
            f"{_num(row['consistency'])}, hack P/R {_num(row['hack_precision'])}/"
            f"{_num(row['hack_recall'])}, 1st/last wins {row['first_slot_wins']:.2f}/"
            f"{row['last_slot_wins']:.2f}, {row['seconds_per_group']:.2f} s/group"
        )
    print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
