"""Benchmark: the embedded default's RL step, synchronous against ``rollout.maxStaleness: 1``
(and, optionally, against the loop of another checkout), in one run on the same machine.

Every variant resumes a copy of the same finished embedded-default run (``gagar train
examples/local.yaml``: its newest checkpoint and published policy) with ``gagar train --resume``
for ``--steps`` more RL steps, so no variant pays for the warm start and all start from the same
weights and sampler position. A ``--baseline`` checkout older than the run gets its manifest
without the fields its spec does not know yet (all at their defaults in the embedded default;
listed in the JSON as ``dropped_fields``). Prints each variant's step times (mean, and by stage where the
loop records them: rollout, grading wait, update, sync, checkpoint, other) and pass rates per
step, and writes ``bench/results/async.json``.

    .venv/bin/python bench/async.py [--run runs/local] [--steps 4]
        [--baseline CHECKOUT]  # e.g. a `git worktree` of main: today's loop, same run; with
                               # its own environments where its `make install` made them
        [--variants synchronous max_staleness_1]  # which of this checkout's to run (both)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import save  # noqa: E402

RESULTS = ROOT / "bench" / "results"
VARIANTS = {"synchronous": 0, "max_staleness_1": 1}  # name: rollout.maxStaleness
STAGES = ("rollout", "grading_wait", "update", "sync", "checkpoint", "other")


# Run in another checkout: drops the fields its GagarRun does not know (added since), one
# validation at a time, and prints the manifest it accepts with what was dropped.
FIT = """
import json, sys
from pydantic import ValidationError
from gagar.spec import GagarRun
doc, dropped = json.load(sys.stdin), []
while True:
    try:
        GagarRun.model_validate(doc)
        break
    except ValidationError as e:
        extra = [x["loc"] for x in e.errors() if x["type"] == "extra_forbidden"]
        if not extra:
            raise
        for loc in extra:
            node = doc
            for key in loc[:-1]:
                node = node[key]
            dropped.append([".".join(map(str, loc)), node.pop(loc[-1])])
json.dump({"doc": doc, "dropped": dropped}, sys.stdout)
"""


def fit_to_checkout(doc: dict[str, Any], checkout: Path) -> tuple[dict[str, Any], list[Any]]:
    """``doc`` as ``checkout``'s spec accepts it: fields it does not know (added since, or
    removed since the run was made) are dropped and returned, to be reported."""
    proc = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(checkout)!r})\n{FIT}"],
        input=json.dumps(doc),
        capture_output=True,
        text=True,
        cwd=checkout,
        check=True,
    )
    fitted = json.loads(proc.stdout)
    return fitted["doc"], fitted["dropped"]


def environments(checkout: Path) -> tuple[str, str]:
    """The Pythons of ``checkout``'s own environments (``.venv``, ``.venv-vllm``) where its
    ``make install`` made them, so a baseline runs as it was installed (how environments are
    made changes too: bytecode compiled or not), else this checkout's."""
    own = [checkout / ".venv" / "bin" / "python", checkout / ".venv-vllm" / "bin" / "python"]
    if all(p.exists() for p in own):
        return str(own[0]), str(own[1])
    return sys.executable, str(ROOT / ".venv-vllm" / "bin" / "python")


def _variant(
    name: str, checkout: Path, run_dir: Path, work: Path, staleness: int | None, steps: int
) -> dict[str, Any]:
    out = work / name
    shutil.copytree(run_dir, out, symlinks=True)
    doc = json.loads((run_dir / "run.json").read_text())
    # every checkout, this one too: a run made before a field left the spec carries it
    doc, dropped = fit_to_checkout(doc, checkout)
    done = max(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*"))
    if staleness is not None:
        doc["spec"]["rollout"]["maxStaleness"] = staleness
        if staleness:  # the spec refuses a lag without the truncated importance weight
            doc["spec"]["algorithm"].setdefault("loss", {})["truncatedIsCap"] = 2.0
    doc["spec"]["trainer"]["checkpoint"]["intervalSteps"] = 2
    manifest = work / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    python, vllm_python = environments(checkout)
    env = {**os.environ, "GAGAR_VLLM_PYTHON": vllm_python, "PYTHONPATH": str(checkout)}
    cmd = [
        python,
        "-c",
        f"import sys; sys.path.insert(0, {str(checkout)!r}); from gagar.cli import main; "
        "sys.exit(main())",
        "train",
        str(manifest),
        "--out",
        str(out),
        "--resume",
        "--steps",
        str(done + steps),
        "--metrics-port",
        "0",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    records = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["step"] > done
    ]
    step_s = [r["step_seconds"] for r in records]
    return {
        "name": name,
        "checkout": str(checkout),
        "max_staleness": staleness or 0,
        "steps": [r["step"] for r in records],
        "step_seconds": step_s,
        "step_seconds_mean": statistics.fmean(step_s),
        "stage_seconds_mean": {
            k: statistics.fmean(r["stage_seconds"][k] for r in records)
            for k in STAGES
            if all("stage_seconds" in r for r in records)
        },
        "pass_rate": [r["pass_rate"] for r in records],
        "staleness_versions": [r["staleness_versions"] for r in records],
        "generated_tokens": [r["generated_tokens"] for r in records],
        "process_wall_s": wall,
        "python": python,
        "dropped_fields": dropped,  # fields of the run's run.json the checkout does not know
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default=str(ROOT / "runs" / "local"), help="a finished local run")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--baseline", help="another checkout whose loop to time too (today's)")
    p.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=list(VARIANTS),
        help="this checkout's variants to run (the embedded default is synchronous)",
    )
    p.add_argument("--out", default=str(RESULTS / "async.json"))
    args = p.parse_args(argv)
    run_dir = Path(args.run)
    if not (run_dir / "checkpoints").is_dir():
        raise SystemExit(f"{run_dir}: no checkpoints; run `gagar train examples/local.yaml` first")
    variants = []
    with tempfile.TemporaryDirectory(prefix="gagar-bench-async-") as tmp:
        if args.baseline:
            base = Path(args.baseline).resolve()
            variants.append(_variant("baseline", base, run_dir, Path(tmp), None, args.steps))
        for name in args.variants:
            staleness = VARIANTS[name]
            variants.append(_variant(name, ROOT, run_dir, Path(tmp), staleness, args.steps))
    res = {"variants": variants, "run": str(run_dir), "load_average": os.getloadavg()}
    ref = variants[0]["step_seconds_mean"]
    print(f"{'variant':18} {'step s':>7} {'speed-up':>8}  stages (mean s)  pass rate per step")
    for v in variants:
        stages = " ".join(f"{k} {s:.1f}" for k, s in v["stage_seconds_mean"].items())
        passes = " ".join(f"{x:.2f}" for x in v["pass_rate"])
        print(
            f"{v['name']:18} {v['step_seconds_mean']:7.1f} {ref / v['step_seconds_mean']:7.2f}x"
            f"  {stages or '-'}  {passes}"
        )
    print(f"load average {res['load_average'][0]:.1f}")
    save(args.out, res, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
