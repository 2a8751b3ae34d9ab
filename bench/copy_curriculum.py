"""The copying curriculum's row shape: when does the induction circuit form, and at what cost?

The tiny preset's copying curriculum (``gagar.trainer.model.presets.copy_curriculum``) trains a
freshly initialized policy to continue a repeated span of random tokens. Its loss sits on a
plateau until the induction circuit forms, then drops within ~150 steps; a warm start whose
curriculum stops on the plateau copies paths from its context unreliably. This bench trains the
tiny preset (the embedded default's tokenizer and token pool, float32, seed fixed) with each
row shape given, one after another in this process, and prints a table of the mean NLL per
``--every`` steps, the first step whose window mean falls below ``--jump`` (the transition) and
the wall seconds a step; the JSON holds every step's NLL per shape.

    .venv/bin/python bench/copy_curriculum.py --steps 900 \\
        --shape 4-24,0-16 --shape 4-10,0-4 --out bench/results/copy_curriculum.json

A shape is ``SPAN_LO-SPAN_HI,FILLER_LO-FILLER_HI`` (token counts, inclusive). Compare shapes
from one run of this bench (same machine, same load), never across machines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save


def parse_shape(text: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """``"4-10,0-4"`` -> ((4, 10), (0, 4)); a clear error on anything else."""
    try:
        span, filler = (tuple(int(x) for x in part.split("-")) for part in text.split(","))
        if len(span) != 2 or len(filler) != 2 or span[0] < 1 or filler[0] < 0:
            raise ValueError
        if span[0] > span[1] or filler[0] > filler[1]:
            raise ValueError
    except ValueError:
        raise SystemExit(f"--shape {text!r}: want SPAN_LO-SPAN_HI,FILLER_LO-FILLER_HI") from None
    return (span[0], span[1]), (filler[0], filler[1])


def windows(nll: list[float], every: int) -> list[float]:
    return [statistics.fmean(nll[i : i + every]) for i in range(0, len(nll) - every + 1, every)]


def transition(nll: list[float], every: int, jump: float) -> int | None:
    """The last step of the first window whose mean NLL is below ``jump`` (None: never)."""
    for i, mean in enumerate(windows(nll, every)):
        if mean < jump:
            return (i + 1) * every
    return None


def run_shape(shape: str, steps: int, seed: int) -> dict[str, object]:
    import torch

    from gagar.driver.components import _tokenizer_corpus
    from gagar.trainer.model.presets import PRESETS, copy_curriculum, fast_tokenizer, random_llama

    span, filler = parse_shape(shape)
    texts = _tokenizer_corpus()
    preset = PRESETS["tiny"]
    tokenizer = fast_tokenizer(texts, preset.vocab_size)
    model = random_llama(preset, tokenizer, seed)
    pool = sorted({i for text in texts for i in tokenizer.encode(text)})
    start = time.perf_counter()
    nll = copy_curriculum(model, pool, steps, seed, span=span, filler=filler)
    wall = time.perf_counter() - start
    return {
        "shape": shape, "span": span, "filler": filler, "steps": steps, "seed": seed,
        "threads": torch.get_num_threads(), "pool": len(pool), "seconds": wall,
        "seconds_per_step": wall / steps, "nll": nll,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append", help="SPAN_LO-SPAN_HI,FILLER_LO-FILLER_HI")
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, default=50, help="steps per window of the table")
    p.add_argument("--jump", type=float, default=2.0, help="window mean NLL that marks the jump")
    p.add_argument("--out", default="bench/results/copy_curriculum.json")
    args = p.parse_args(argv)
    shapes = args.shape or ["4-24,0-16", "4-10,0-4"]
    for shape in shapes:
        parse_shape(shape)  # every shape checked before the first one trains
    results = [run_shape(shape, args.steps, args.seed) for shape in shapes]
    for r in results:
        r["transition_step"] = transition(r["nll"], args.every, args.jump)  # type: ignore[arg-type]
    table = Table(title=f"copying curriculum, tiny preset, float32, seed {args.seed}")
    table.add_column("step")
    for r in results:
        table.add_column(f"span {r['shape']}", justify="right")
    rows = [windows(r["nll"], args.every) for r in results]  # type: ignore[arg-type]
    for i in range(max(len(w) for w in rows)):
        table.add_row(
            str((i + 1) * args.every), *(f"{w[i]:.2f}" if i < len(w) else "" for w in rows)
        )
    table.add_row("jump below", *(str(r["transition_step"] or "never") for r in results))
    table.add_row("s / step", *(f"{r['seconds_per_step']:.3f}" for r in results))
    Console().print(table)
    doc = {"bench": "copy_curriculum", "every": args.every, "jump": args.jump, "results": results}
    return save(args.out, doc)


if __name__ == "__main__":
    main()
