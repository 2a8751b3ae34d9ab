"""Checkpoint save and load time and size per parallel layout: sharded (Megatron-Core
``dist_checkpointing``) against the per-rank format it replaces.

Usage: .venv/bin/python bench/checkpoint.py [--model tiny|smollm2-135m] [--repeats 2]
Prints a table and writes bench/results/checkpoint-<model>.json. On the CPU (gloo): one process at
TP=1, then two processes at TP=2 and at TP=1 with DP=2. Each layout saves ``--repeats`` times
(the first sharded save of a process also starts Megatron's writer queue, so it is reported
apart) and restores the last save into the same ranks. The optimizer is AdamW with its state
allocated (two moments per parameter); sizes are the checkpoint directory's bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save

LAYOUTS = {1: [{"tp": 1}], 2: [{"tp": 2}, {"tp": 1}]}


def _rank_state(hf: str, root: Path) -> Any:
    from gagar.driver.setup import load_policy
    from gagar.trainer.checkpoint import CheckpointManager
    from gagar.trainer.distributed import RankState
    from gagar.trainer.learner import Learner, LearnerConfig
    from gagar.trainer.model.parallel import current_parallel
    from gagar.trainer.policy import MegatronPolicy

    p = current_parallel()
    model = load_policy(Path(hf))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for q in model.parameters():
        q.grad = torch.zeros_like(q)
    opt.step()  # allocates AdamW's moments, as after the first update
    learner = Learner(MegatronPolicy(model, p.tp), opt, LearnerConfig(micro_batch_size=1))
    return RankState(
        model, learner, CheckpointManager(root, keep=1), {"tp": p.tp, "ep": p.ep, "pp": p.pp}
    )


def _per_rank_save(rank: Any, step: int) -> None:
    """The format before sharded checkpoints: one model/optimizer/rng part per rank."""
    import torch.distributed as dist

    world = dist.get_world_size()
    staging = rank.ckpt.staging_path(step, "job")
    if dist.get_rank() == 0:
        rank.ckpt.stage(step, "job")
    dist.barrier()
    files = rank.ckpt.write_parts(staging, rank._parts())
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, files)
    if dist.get_rank() == 0:
        merged = {n: m for part in gathered for n, m in part.items()}
        state = {"policy_version": step, "layout": {"world_size": world, **rank.layout}}
        rank.ckpt.commit(step, staging, merged, state)
    dist.barrier()


def _timed(fn: Any, *args: Any) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    fn(*args)
    dist.barrier()
    return time.perf_counter() - start


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def _measure(rank: Any, fmt: str, repeats: int) -> dict[str, Any]:
    save = rank.save if fmt == "sharded" else _per_rank_save
    args = (lambda s: (s, {"policy_version": s})) if fmt == "sharded" else (lambda s: (rank, s))
    saves = [_timed(save, *args(step)) for step in range(1, repeats + 1)]
    load = _timed(rank.restore, repeats)
    return {"save_first_s": saves[0], "save_s": min(saves[1:] or saves), "load_s": load,
            "bytes": _size(rank.ckpt.root / f"step_{repeats:08d}")}  # fmt: skip


def _layouts(hf: str, world: int) -> list[dict[str, int]]:
    """The layouts of ``world`` processes this model takes (SmolLM2-135M's 3 KV heads: no TP=2)."""
    from gagar.trainer.model import read_config

    heads = int(read_config(hf)["num_key_value_heads"])
    return [layout for layout in LAYOUTS[world] if heads % layout["tp"] == 0]


def _worker(rank_id: int, world: int, hf: str, tmp: str, repeats: int) -> None:
    import warnings

    import torch.distributed as dist

    from gagar.trainer.model import Parallel, destroy_distributed, init_distributed

    warnings.filterwarnings("ignore")
    rows = []
    for layout in _layouts(hf, world):
        init_distributed(
            Parallel(**layout), rank_id, world, init_method=f"file://{tmp}/rdzv{world}"
        )
        name = f"world={world} tp={layout['tp']} dp={world // layout['tp']}"
        for fmt in ("sharded", "per-rank"):
            rank = _rank_state(hf, Path(tmp) / f"{world}-{layout['tp']}-{fmt}")
            rows.append({"layout": name, "format": fmt, **_measure(rank, fmt, repeats)})
        destroy_distributed(keep_process_group=True)
    if rank_id == 0:
        Path(tmp, f"rows{world}.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def _policy(model: str, tmp: Path) -> Path:
    if model == "tiny":
        from gagar.trainer.model.presets import create_preset

        return create_preset("tiny", tmp / "tiny")
    from gagar.trainer.model.fetch import cached_model

    return cached_model(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "smollm2-135m"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/...)")
    args = parser.parse_args()
    out = Path(args.out or Path(__file__).parent / "results" / f"checkpoint-{args.model}.json")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        hf = str(_policy(args.model, Path(tmp)))
        for world in LAYOUTS:
            mp.spawn(_worker, args=(world, hf, tmp, args.repeats), nprocs=world, join=True)
            rows += json.loads(Path(tmp, f"rows{world}.json").read_text())
    print(
        f"{'layout':<22} {'format':<9} {'first save s':>12} {'save s':>8} {'load s':>8} {'MB':>8}"
    )
    for r in rows:
        print(f"{r['layout']:<22} {r['format']:<9} {r['save_first_s']:>12.2f} {r['save_s']:>8.2f} "
              f"{r['load_s']:>8.2f} {r['bytes'] / 1e6:>8.1f}")  # fmt: skip
    save(out, {"model": args.model, "repeats": args.repeats, "rows": rows}, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
