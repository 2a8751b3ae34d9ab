"""The grader's SFT as a bench: records from the benchmark's train groups, ``gagar grader sft``,
then ``gagar grader eval`` on held-out groups with the SFT'd model and the model it started from
(both answering in one forced turn), written to bench/results/grader_sft.json with the machine
record: the SFT's settings, NLL per step and time, and each row's metrics and per-group scores.

Train and held-out groups come from one seeded split (``gagar.driver.grader_bench``); the SFT
never sees a held-out group (``grader_sft.record`` refuses one), and nothing here is tuned on
them. Stages are slow on a CPU (about 40 minutes of SFT and 7 minutes a row on 2 AVX2 cores), so
``--trained DIR`` reuses a finished SFT and ``--evals FILE ...`` reuses finished eval results
(``gagar grader eval --out``), each checked to come from the same groups and seed.

    .venv/bin/python bench/grader_sft.py [--groups 48] [--per-group 2] [--steps 32] [--lr 1e-4]
        [--limit 12] [--shuffles 2] [--trained DIR] [--evals FILE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save
from gagar.cli import main as gagar

RESULT = Path(__file__).parent / "results" / "grader_sft.json"
BASE = "smollm2-135m"


def _eval(args: argparse.Namespace, model: str, out: Path) -> dict:
    common = ["--groups", str(args.groups), "--seed", str(args.seed), "--split", "held_out"]
    rows = ["--limit", str(args.limit), "--shuffles", str(args.shuffles), "--no-heuristic"]
    serve = ["--serve", model, "--max-turns", "1", "--out", str(out)]
    if gagar(["grader", "eval", *common, *rows, *serve]) != 0:
        raise SystemExit(f"gagar grader eval --serve {model} failed")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-group", type=int, default=2)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
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
        gagar(
            ["grader", "sft-data", *build, "--per-group", str(args.per_group), "--out", str(data)]
        )
        train = ["--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr)]
        if gagar(["grader", "sft", "--data", str(data), *train, "--out", str(trained)]) != 0:
            raise SystemExit("gagar grader sft failed")
    sft = json.loads((trained / "grader_sft.json").read_text())
    evals = [json.loads(Path(f).read_text()) for f in args.evals]
    for e in evals:
        if (e["groups_built"], e["seed"], e["split"]) != (args.groups, args.seed, "held_out"):
            raise SystemExit(f"an eval of other groups: {e['groups_built']}, seed {e['seed']}")
    if not evals:
        evals = [
            _eval(args, str(trained), work / "sft.json"),
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
            f"({row['pairs']} pairs), consistency {row['consistency']:.3f}, "
            f"hack P/R {row['hack_precision']:.2f}/{row['hack_recall']:.2f}"
        )
    print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
