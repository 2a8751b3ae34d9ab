"""The agentic grader of examples/local-smollm2.yaml on prepared groups: outcome, latency, tokens.

Starts the grader's model server exactly as ``gagar train`` does (SmolLM2-135M-Instruct from the
model cache, vLLM's CPU build with the ``hermes`` tool-call parser, one thread) and grades
``gagar.grader.sample`` groups of growing size with the preset's grader settings. Each row says
whether SmolLM2 produced a complete ranking (``agentic``) or the run would have fallen back, and
why. Greedy decoding, so one pass per group. Run: ``.venv/bin/python bench/grader_smollm2.py`` (minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import save  # noqa: E402
from gagar.driver import grader_model  # noqa: E402
from gagar.driver.components import sandbox_factory  # noqa: E402
from gagar.driver.setup import build_graders  # noqa: E402
from gagar.grader.sample import sample_group  # noqa: E402
from gagar.manifest import load_run  # noqa: E402

GROUPS = (
    ("clean", "failing"),
    ("clean", "bloated", "failing"),
    ("clean", "bloated", "tampered", "failing"),
    ("bloated", "clean", "special", "tampered", "failing"),
)


async def grade_all(grader) -> list[dict]:
    rows = []
    for kinds in GROUPS:
        group = sample_group(kinds)
        start = time.perf_counter()
        ranking = await grader.grade(group)
        rows.append(
            {
                "members": list(kinds),
                "passes": len(group.passes()),
                "grader": ranking.grader,
                "fallback": ranking.fallback,
                "detail": ranking.detail[:300],
                "seconds": time.perf_counter() - start,
                "prompt_tokens": ranking.usage.prompt_tokens,
                "completion_tokens": ranking.usage.completion_tokens,
                "tiers": [[g.tier, g.members] for g in ranking.tied_groups],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=str(ROOT / "examples" / "local-smollm2.yaml"))
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "grader_smollm2.json")
    )
    args = parser.parse_args()
    run = load_run(args.run)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        server = grader_model.launch(run.spec.grader, Path(tmp))
        assert server is not None, "the run's grader needs no server (not agentic, or an endpoint)"
        try:
            grader_model.ready(server)
            startup = time.perf_counter() - start
            factory = sandbox_factory(run.spec.sandbox)
            grader, _ = build_graders(run, factory, f"{server.base_url}/v1")
            rows = asyncio.run(grade_all(grader))
        finally:
            server.stop()
    print(f"grader server ready in {startup:.0f}s")
    print(f"{'members':>8} {'passes':>6} {'outcome':>28} {'s':>6} {'tokens out':>10}")
    for r in rows:
        outcome = r["grader"] + (f" ({r['fallback']})" if r["fallback"] else "")
        print(
            f"{len(r['members']):>8} {r['passes']:>6} {outcome:>28} {r['seconds']:>6.1f} "
            f"{r['completion_tokens']:>10}"
        )
    meta = {"python": platform.python_version(), "cpus": os.cpu_count(), "run": args.run}
    save(args.out, {"meta": meta, "startup_seconds": startup, "rows": rows}, indent=2)


if __name__ == "__main__":
    main()
