"""The grading benchmark (``gagar grader eval``) as a bench: prints its table, writes
bench/results/grader_eval.json with the machine record.

Held-out synthetic groups with known answers (scripted experts through the real agent loop and
bubblewrap sandboxes, planted hacks; ``gagar.driver.grader_bench``), cached per seed. Rows: the
heuristic grader, and the agentic grader on ``--endpoint`` (any OpenAI-compatible server, e.g. a
vLLM serving the grader model) when given. Run: ``.venv/bin/python bench/grader_eval.py``
(seconds for the heuristic once the groups are cached; building 24 groups takes about a minute).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save
from gagar.driver import grader_eval


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grader_eval.add_arguments(parser)
    parser.set_defaults(out=str(Path(__file__).parent / "results" / "grader_eval.json"))
    args = parser.parse_args(argv)
    out, args.out = args.out, None
    result = grader_eval.run_eval(args)
    meta = {"python": platform.python_version(), "cpus": os.cpu_count()}
    doc = save(out, result | {"meta": meta}, indent=1)
    print(f"wrote {out}")
    return doc


if __name__ == "__main__":
    main()
