"""Policy model timings on this machine: build, load, forward+backward, conversion, TP=2 step.

Usage: .venv/bin/python bench/model.py [--seq 256] [--batch 4] [--steps 3]
Prints a table and writes bench/results/model.json. Uses the tiny preset (created on the fly).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save


def _step(model, ids: torch.Tensor) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    model(ids, pos, None, labels=ids).mean().backward()
    return time.perf_counter() - start


def _measure(rank: int, world: int, args: argparse.Namespace, hf: str, out: str) -> None:
    from gagar.trainer.model import (
        Parallel,
        build_model,
        init_distributed,
        load_hf_into_megatron,
        read_config,
    )

    t0 = time.perf_counter()
    init_distributed(Parallel(tp=world), rank, world, init_method=f"file://{out}.rdzv")
    t1 = time.perf_counter()
    model = build_model(read_config(hf))
    t2 = time.perf_counter()
    load_hf_into_megatron(model, hf)
    t3 = time.perf_counter()
    ids = torch.randint(0, 4096, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    steps = [_step(model, ids) for _ in range(args.steps)]
    if rank == 0:
        result = {"init_s": t1 - t0, "build_s": t2 - t1, "load_s": t3 - t2,
                  "first_step_s": steps[0], "step_s": min(steps[1:] or steps)}  # fmt: skip
        Path(out).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    from gagar.trainer.model.convert import convert_hf_to_megatron, export_megatron_to_hf
    from gagar.trainer.model.presets import create_preset

    tmp = Path(tempfile.mkdtemp())
    t = time.perf_counter()
    create_preset("tiny", tmp / "hf")
    results: dict[str, float] = {"preset_create_s": time.perf_counter() - t}
    t = time.perf_counter()
    convert_hf_to_megatron(tmp / "hf", tmp / "mg", tp=2)
    results["convert_tp2_s"] = time.perf_counter() - t
    t = time.perf_counter()
    export_megatron_to_hf(tmp / "mg", tmp / "back")
    results["export_s"] = time.perf_counter() - t
    for world in (1, 2):
        out = str(tmp / f"tp{world}.json")
        t = time.perf_counter()
        mp.spawn(_measure, args=(world, args, str(tmp / "hf"), out), nprocs=world, join=True)
        results[f"tp{world}_job_wall_s"] = time.perf_counter() - t
        results |= {f"tp{world}_{k}": v for k, v in json.loads(Path(out).read_text()).items()}
    print(
        f"tiny preset (hidden 256, 4 layers, vocab 4096), batch {args.batch} x seq {args.seq}, CPU"
    )
    for key, value in results.items():
        print(f"  {key:<24} {value:8.2f}")
    record = {"args": vars(args), "torch_threads": torch.get_num_threads(), "results": results}
    save("bench/results/model.json", record, indent=2)


if __name__ == "__main__":
    main()
