"""API requests the operator makes per minute for 3 active runs, in steady state.

The real handlers (``register`` on a fresh kopf registry, the production resync period) run
against the Kubernetes API emulator, which records every request. Three runs are created and
left until every one is Running with its pools ready; then the requests of a window
(``--window`` seconds, default 60) are counted by verb, scaled to a minute. Watches (long-lived
streams kopf reopens on its own timeout) are counted apart.

    .venv/bin/python bench/operator_requests.py [--window 60] [--out bench/results/operator-requests.json]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kopf  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from bench.record import save  # noqa: E402
from gagar.crd import build_crd  # noqa: E402
from gagar.manifest import load_run  # noqa: E402
from gagar.metrics import Metrics  # noqa: E402
from gagar.operator.handlers import (  # noqa: E402
    OperatorConfig,
    Reconciler,
    configure_settings,
    register,
)
from gagar.operator.kube import RUN_API, Kube  # noqa: E402
from tests.kube_emulator import KubeEmulator  # noqa: E402
from tests.kube_emulator.kopf_runner import run_operator  # noqa: E402


def manifest() -> dict[str, Any]:
    run = load_run(ROOT / "examples" / "single-gpu.yaml")
    raw = run.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw.pop("status", None)
    raw["metadata"] = {"name": f"bench-{uuid.uuid4().hex[:6]}", "namespace": "default"}
    return raw


def settle(kube: Kube, names: list[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [kube.get(RUN_API, "GagarRun", "default", n) or {} for n in names]
        conds = [
            {c["type"]: c["status"] for c in (r.get("status") or {}).get("conditions", [])}
            for r in runs
        ]
        if all(c.get("Ready") == "True" for c in conds):
            return
        time.sleep(0.5)
    raise TimeoutError("the runs did not become Ready")


def measure(window: float, runs: int) -> dict[str, Any]:
    with KubeEmulator(bookmark_interval=5.0, deployment_delay=0.05) as emulator:
        emulator.create(build_crd())
        client = emulator.api_client()
        admin = Kube(client)
        reconciler = Reconciler(
            Kube(emulator.api_client()),
            Metrics(CollectorRegistry(), "operator"),
            OperatorConfig(),  # the production resync period
        )
        registry = register(kopf.OperatorRegistry(), reconciler)

        def configure(settings: kopf.OperatorSettings) -> None:
            configure_settings(settings)
            settings.watching.server_timeout = 300  # watches reopen rarely, as in production

        with run_operator(emulator, registry, namespaces=("default",), configure=configure):
            names = []
            for _ in range(runs):
                body = manifest()
                admin.create(body)
                names.append(body["metadata"]["name"])
            settle(admin, names)
            time.sleep(5.0)  # the last events of start-up pass
            before = len(emulator.requests_for())
            time.sleep(window)
            seen = emulator.requests_for()[before:]
        client.close()
    by_verb = collections.Counter(r["verb"] for r in seen)  # the window's: the operator's only
    scale = 60.0 / window
    per_minute = {v: round(n * scale, 1) for v, n in sorted(by_verb.items())}
    total = round(sum(n for v, n in by_verb.items() if v != "watch") * scale, 1)
    return {"runs": runs, "window_s": window, "per_minute": per_minute, "total_per_minute": total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="bench/results/operator-requests.json")
    args = ap.parse_args()
    result = measure(args.window, args.runs)
    print(f"{'verb':<10}{'requests/min':>14}")
    for verb, n in result["per_minute"].items():
        print(f"{verb:<10}{n:>14}")
    print(f"{'total':<10}{result['total_per_minute']:>14}  (watches excluded)")
    save(args.out, result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
