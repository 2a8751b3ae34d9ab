"""agent-sandbox's controllers, played for tests and bench/isolation.py against the emulator.

``install(kube)`` loads the CRDs (``crds/agent-sandbox.yaml``); ``Controller`` keeps a warm pool
of Ready Sandboxes, each backed by a real executor (``gagar sandbox serve``) on a loopback address
of its own (127.0.0.N, one port for all: a pod IP and the executor's port), binds each new
SandboxClaim to a free Sandbox (``status.sandbox`` and the Ready condition in one status update,
as agent-sandbox's claim controller writes them) and deletes a released claim's Sandbox, stopping
its executor. ``bind=False``: claims are never bound (a pool whose pods cannot start).
"""

from __future__ import annotations

import datetime
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gagar.sandbox import isolation
from gagar.sandbox.server import Server, make_server
from gagar.sandbox.types import Limits

from .emulator import KubeEmulator

CRDS = Path(__file__).resolve().parent / "crds" / "agent-sandbox.yaml"
SANDBOX = "agents.x-k8s.io/v1beta1"
EXT = "extensions.agents.x-k8s.io/v1beta1"
NS = "default"
POOL = "run1-sandbox"


def install(kube: KubeEmulator) -> None:
    kube.load_yaml(CRDS)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(status: str = "True", reason: str = "Ready") -> list[dict[str, Any]]:
    return [
        {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": "",
            "lastTransitionTime": now(),
        }
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Controller:
    """agent-sandbox's controllers, as far as a claim's life goes: a warm pool of Ready Sandboxes,
    each a running executor; a claim is bound to a free one; a deleted claim's Sandbox is deleted
    and its executor stopped. ``bind=False``: claims are never bound (a pool that cannot start)."""

    kube: KubeEmulator
    port: int
    bind: bool = True
    limits: Limits = field(default_factory=Limits)
    pool: str = POOL
    servers: dict[str, Server] = field(default_factory=dict)  # Sandbox name -> its executor
    bound: dict[str, str] = field(default_factory=dict)  # claim -> Sandbox
    stop: threading.Event = field(default_factory=threading.Event)
    target: int = 0  # free Sandboxes to keep ready
    made: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)  # the test's calls vs. the loop

    def warm(self, count: int) -> None:
        """Keep ``count`` free Sandboxes ready (a SandboxWarmPool's ``replicas``): started now and
        again as claims take them."""
        with self.lock:
            self.target = count
            self.refill()

    def refill(self) -> None:
        taken = set(self.bound.values())
        while len([s for s in self.servers if s not in taken]) < self.target:
            self.start(f"{self.pool}-{self.made}", self.made)
            self.made += 1

    def start(self, sandbox: str, n: int) -> None:
        ip = f"127.0.{n // 250}.{n % 250 + 2}"
        factory, _ = isolation.factory("auto", self.limits)
        server = make_server(factory, ip, self.port)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers[sandbox] = server
        body = {"podTemplate": {"spec": {"containers": [{"name": "executor"}]}}}
        meta = {"name": sandbox, "namespace": NS}
        self.kube.create({"apiVersion": SANDBOX, "kind": "Sandbox", "metadata": meta,
                          "spec": body})  # fmt: skip
        status = {"podIPs": [ip], "conditions": ready_condition()}
        self.kube.patch(SANDBOX, "Sandbox", sandbox, lambda o, s=status: {**o, "status": s},
                        NS, subresource="status")  # fmt: skip

    def kill(self, sandbox: str) -> None:
        """The Sandbox's pod dies: its executor stops answering."""
        with self.lock:
            server = self.servers.pop(sandbox)
        server.shutdown()
        server.registry.close_all()
        server.server_close()

    def sweep(self) -> None:
        claims = {c["metadata"]["name"]: c for c in self.kube.list(EXT, "SandboxClaim", NS)}
        for claim, obj in claims.items():
            if claim in self.bound or not self.bind:
                continue
            taken = set(self.bound.values())
            free = [s for s in sorted(self.servers) if s not in taken]
            if not free or obj["spec"]["warmPoolRef"]["name"] != self.pool:
                continue
            sandbox = free[0]
            self.bound[claim] = sandbox
            ip = self.kube.get(SANDBOX, "Sandbox", sandbox, NS)["status"]["podIPs"]
            status = {"sandbox": {"name": sandbox, "podIPs": ip}, "conditions": ready_condition()}
            self.kube.patch(EXT, "SandboxClaim", claim, lambda o, s=status: {**o, "status": s},
                            NS, subresource="status")  # fmt: skip
        for claim in [c for c in self.bound if c not in claims]:
            sandbox = self.bound.pop(claim)
            self.kube.delete(SANDBOX, "Sandbox", sandbox, NS)
            if sandbox in self.servers:
                self.kill(sandbox)
        self.refill()

    def loop(self) -> None:
        while not self.stop.wait(0.02):
            with self.lock:
                self.sweep()

    def close(self) -> None:
        self.stop.set()
        with self.lock:
            self.target = 0
        for sandbox in list(self.servers):
            self.kill(sandbox)
