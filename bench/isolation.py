"""Cost of each sandbox isolation mode: one command, and one session start, per mode.

For ``bubblewrap`` and ``pod`` (and, as the floor, ``none``: rlimits only), the median wall time
of ``exec(["true"])`` (the fixed cost of a command), of ``exec(["python3", "-c", "pass"])`` (what
a test command pays on top of the interpreter), and of creating plus closing a session with one
small file (a session start). The modes alternate in rounds within one process, so background
load on a shared machine affects all of them alike.

``--remote`` adds two rows: ``executor over HTTP`` (a session on a ``gagar sandbox serve`` in
``auto``, what the trainer pays per call to a pool pod) and ``agent-sandbox`` (a session on a
Sandbox claimed from a warm pool through the API emulator, its controller played by
``tests/kube_emulator/agent_sandbox.py``, each Sandbox an executor in ``auto``). The latter's
session start is create claim, wait Ready, open the session, close it, delete the claim: the
emulator's latency, not a cluster's (there the controller's reaction and the API server's, and
the warm pool's refill, decide it).

    .venv/bin/python bench/isolation.py [--runs N] [--rounds R] [--remote] [--out bench/results/isolation.json]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.podjail import check
from gagar.sandbox.types import Limits

MODES = {"bubblewrap": "bwrap", "pod": "pod", "none": "none"}
PROBES = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _round(factory: Any, runs: int, out: dict[str, list[float]]) -> None:
    with factory.create(files={"a.py": "X = 1\n"}) as s:
        for name, argv in PROBES.items():
            for _ in range(runs):
                out[name].append(_timed(lambda a=argv: s.exec(a)))
    for _ in range(runs):
        out["session start"].append(
            _timed(lambda: factory.create(files={"a.py": "X = 1\n"}).close())
        )


@contextlib.contextmanager
def remote_factories() -> Iterator[dict[str, Any]]:
    """An executor server in ``auto``, and agent-sandbox claims through the API emulator."""
    from gagar.sandbox import isolation
    from gagar.sandbox.agent import AgentSandboxFactory
    from gagar.sandbox.client import HttpFactory
    from gagar.sandbox.server import make_server
    from tests.kube_emulator import KubeEmulator
    from tests.kube_emulator.agent_sandbox import NS, POOL, Controller, free_port, install

    local, _ = isolation.factory("auto", Limits())
    server = make_server(local, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with KubeEmulator() as kube:
        install(kube)
        ctl = Controller(kube, free_port())
        ctl.warm(4)
        threading.Thread(target=ctl.loop, daemon=True).start()
        http = HttpFactory(f"http://127.0.0.1:{server.server_address[1]}")
        claims = AgentSandboxFactory(POOL, NS, api_client=kube.api_client(), port=ctl.port)
        try:
            yield {"executor over HTTP": http, "agent-sandbox": claims}
        finally:
            claims.close()
            http.close()
            ctl.close()
            server.shutdown()
            server.registry.close_all()
            server.server_close()


def measure(runs: int, rounds: int, remote: bool = False) -> dict[str, dict[str, float]]:
    check_isolation()
    check()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "isolation is OFF": the floor, on purpose
        factories: dict[str, Any] = {
            m: LocalFactory(Limits(), isolation=b)  # type: ignore[arg-type]
            for m, b in MODES.items()
        }
    with contextlib.ExitStack() as stack:
        if remote:
            factories.update(stack.enter_context(remote_factories()))
        samples = {m: {k: [] for k in [*PROBES, "session start"]} for m in factories}
        for _ in range(rounds):
            for mode, factory in factories.items():
                _round(factory, runs, samples[mode])
    return {
        mode: {k: round(statistics.median(v) * 1000, 1) for k, v in by.items()}
        for mode, by in samples.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="samples per probe per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--remote", action="store_true", help="add executor-over-HTTP, agent-sandbox")
    ap.add_argument("--out", default="bench/results/isolation.json")
    args = ap.parse_args()
    result = measure(args.runs, args.rounds, args.remote)
    header = ["mode", *PROBES, "session start"]
    print("| " + " | ".join(header) + " |  (median ms)")
    print("|" + "---|" * len(header))
    for mode, by in result.items():
        print(f"| {mode} | " + " | ".join(f"{by[k]:.1f}" for k in header[1:]) + " |")
    save(args.out, {"median_ms": result, "runs": args.runs, "rounds": args.rounds}, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
