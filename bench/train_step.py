"""Platform overhead of one training step: gagar's learner on the Megatron-Core policy against a
plain PyTorch loop (transformers' LlamaForCausalLM, the same weights, batch and optimizer), in the
same process. Rows: the learner as it runs (core attention through SDPA); the same with
Megatron's own unfused attention (the path before); with the KL term on (a frozen reference's
forward pass per micro-batch); with two mini-batches (the behaviour log-probs' extra no-grad
forward on the second); and the plain loop. The row whose learner is configured as the embedded
default configures it (``examples/local.yaml``: its KL coefficient and mini-batches, SDPA
attention) is marked ``default`` in the table and in the JSON (``default_row``, and
``"default": true`` on the row); every learner row here uses token-mean aggregation in float32,
whatever the manifest's aggregation and autocast. Prints a table and writes
bench/results/train_step.json.

    .venv/bin/python bench/train_step.py [--batch 8] [--seq 512] [--micro 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save
from gagar.driver.local import init_one_process
from gagar.trainer.learner import Learner, LearnerConfig, Sample
from gagar.trainer.loss import LossConfig
from gagar.trainer.model.presets import create_preset
from gagar.trainer.policy import MegatronPolicy

RESULTS = Path(__file__).resolve().parent / "results"
MANIFEST = Path(__file__).resolve().parents[1] / "examples" / "local.yaml"


def default_learner() -> dict[str, Any]:
    """How ``gagar train`` configures the learner for the embedded default, in the terms the
    rows differ by (``gagar.driver.setup.build_learner``; the model is built with SDPA
    attention)."""
    from gagar.manifest import load_run

    alg = load_run(MANIFEST).spec.algorithm
    return {"fused": True, "kl": alg.loss.kl.coef, "mini_batches": alg.mini_batches}


def _batch(vocab: int, batch: int, seq: int) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(batch):
        ids = torch.randint(0, vocab, (seq,), generator=g).tolist()
        mask = [0] * (seq // 4) + [1] * (seq - seq // 4)
        out.append(Sample(ids, mask, [0.0] * seq, [1.0 if i % 2 else -1.0] * seq, i // 2))
    return out


def _plain_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, samples: list[Sample], micro: int
) -> None:
    """The same loss (token-mean policy gradient at ratio 1) written the plain way."""
    opt.zero_grad()
    total = sum(sum(s.loss_mask) for s in samples)
    for start in range(0, len(samples), micro):
        chunk = samples[start : start + micro]
        ids = torch.tensor([s.token_ids for s in chunk])
        mask = torch.tensor([s.loss_mask for s in chunk], dtype=torch.bool)[:, 1:]
        adv = torch.tensor([s.advantages for s in chunk])[:, 1:]
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(torch.where(mask, adv * torch.exp(logp - logp.detach()), 0)).sum() / total
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def _learner(folder: Path, micro: int, fused: bool = True, kl: float = 0.0, mini_batches: int = 1):
    """A learner's ``update`` on a fresh Megatron-Core copy of the policy in ``folder``."""
    from gagar.trainer.model import build_model as megatron_model
    from gagar.trainer.model import load_hf_into_megatron, read_config

    def model():
        m = megatron_model(read_config(folder), fused_attention=fused)
        load_hf_into_megatron(m, folder)
        return m

    policy = model()
    reference = None
    if kl > 0:
        frozen = model().eval()
        frozen.requires_grad_(False)
        reference = MegatronPolicy(frozen)
    learner = Learner(
        MegatronPolicy(policy),
        torch.optim.AdamW(policy.parameters(), lr=1e-5),
        LearnerConfig(
            micro, 1.0, LossConfig(agg_mode="token-mean", kl_coef=kl), mini_batches=mini_batches
        ),
        reference=reference,
    )
    return learner.update


def _time(fns: dict[str, Any], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Wall and process-CPU seconds per call of each, after a warm-up call. The rows take turns
    in every repeat, so a change in the machine's load (it is shared) weighs on all of them
    alike; CPU seconds (all of the process's threads) are the steadier measure on a busy machine."""
    for fn in fns.values():
        fn()
    times: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            times[name]["wall"].append(time.perf_counter() - t)
            times[name]["cpu"].append(time.process_time() - c)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from transformers import LlamaForCausalLM

    init_one_process()

    folder = Path(tempfile.mkdtemp()) / "tiny"
    create_preset("tiny", folder)
    samples = _batch(4096, args.batch, args.seq)
    plain = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-5)
    configs: dict[str, dict[str, Any]] = {
        "gagar learner (Megatron-Core, SDPA attention)": {},
        "gagar learner, Megatron's unfused attention (before)": {"fused": False},
        "gagar learner, KL on (reference forward)": {"kl": 0.05},
        "gagar learner, 2 mini-batches (behaviour forward)": {"mini_batches": 2},
    }
    default = default_learner()
    plain_cfg = {"fused": True, "kl": 0.0, "mini_batches": 1}
    default_row = next(
        (name for name, c in configs.items() if {**plain_cfg, **c} == default),
        "gagar learner as the embedded default configures it",
    )
    configs.setdefault(default_row, default)  # a default none of the rows has gets its own
    rows = {name: _learner(folder, args.micro, **c) for name, c in configs.items()}
    calls: dict[str, Any] = {name: (lambda u=update: u(samples)) for name, update in rows.items()}
    calls["plain PyTorch (transformers)"] = lambda: _plain_step(
        plain, plain_opt, samples, args.micro
    )
    times = _time(calls, args.repeats)
    tokens = sum(len(s.token_ids) for s in samples)
    table = Table(
        title=f"one training step: {args.batch} × {args.seq} tokens, micro-batch {args.micro}"
    )
    for col in ("implementation", "median s", "tokens/s", "ratio vs plain", "CPU s", "CPU ratio"):
        table.add_column(col)
    plain_row = times["plain PyTorch (transformers)"]
    base, base_cpu = statistics.median(plain_row["wall"]), statistics.median(plain_row["cpu"])
    result = {
        "batch": args.batch,
        "seq": args.seq,
        "micro": args.micro,
        "threads": torch.get_num_threads(),
        "default_row": default_row,
        "default_config": default,
        "rows": {},
    }
    for name, row in times.items():
        med, cpu = statistics.median(row["wall"]), statistics.median(row["cpu"])
        table.add_row(
            f"{name} (default)" if name == default_row else name,
            f"{med:.3f}",
            f"{tokens / med:.0f}",
            f"{med / base:.2f}×",
            f"{cpu:.3f}",
            f"{cpu / base_cpu:.2f}×",
        )
        result["rows"][name] = {
            "median_seconds": med,
            "all_seconds": row["wall"],
            "tokens_per_second": tokens / med,
            "ratio_vs_plain": med / base,
            "median_cpu_seconds": cpu,
            "all_cpu_seconds": row["cpu"],
            "cpu_ratio_vs_plain": cpu / base_cpu,
            "default": name == default_row,
        }
    Console().print(table)
    save(RESULTS / "train_step.json", result, indent=2)


if __name__ == "__main__":
    main()
