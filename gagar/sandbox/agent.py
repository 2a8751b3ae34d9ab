"""The ``agent-sandbox`` isolation mode: every session is a Sandbox of its own, claimed from a
SandboxWarmPool of the agent-sandbox project (kubernetes-sigs/agent-sandbox).

The operator renders a SandboxTemplate (the hardened executor pod of ``builders/sandbox.py``
running ``gagar sandbox serve``) and a SandboxWarmPool of ``sandbox.poolSize`` pre-started
Sandboxes of it. ``AgentSandboxFactory.create`` claims one (a SandboxClaim naming the pool),
waits until the claim is bound and Ready, reads the Sandbox's pod IP, and opens one session on
that executor over HTTP (``client.HttpFactory``). Closing the session deletes the claim, and
agent-sandbox deletes the Sandbox with it: no later session ever sees this one's pod, processes or
files, so the boundary between sessions is the pod (and its runtime class), not a uid.

The claim's life cycle goes through agent-sandbox's maintained Python client
(``k8s_agent_sandbox.SandboxClient``, PyPI ``k8s-agent-sandbox``): it names the claim, watches it
until Ready, fails fast on the controller's terminal reasons (pool or template missing, claim
expired, ...) and rolls a failed claim back. Its command and file APIs speak agent-sandbox's own
runtime (port 8888 through a router, a port-forward or a Gateway) and are not used: the claimed
pod runs gagar's executor, reached at its pod IP on ``SANDBOX_PORT``, which the run's
NetworkPolicy admits only from the trainer and grader pods.

Failures: the CRDs not installed (the claim's create answers 404) raise ``SandboxUnavailable``
with what to install; a claim not Ready within ``ready_timeout_s`` raises ``SandboxInfraError``
naming the claim and its last condition (the claim is deleted); a claimed pod that dies mid-session
turns the next ``exec`` into an ``ExecResult`` with ``infra_error`` (the code did not fail, the
infrastructure did), and other calls into ``SandboxInfraError``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from gagar.sandbox.client import HttpFactory, HttpSession
from gagar.sandbox.types import (
    Limits,
    SandboxInfraError,
    SandboxUnavailable,
    SessionFactory,
    SessionRequest,
)

log = logging.getLogger("gagar.sandbox.agent")

SANDBOX_GROUP = "agents.x-k8s.io"
EXTENSIONS_GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
EXECUTOR_PORT = 8090  # builders.sandbox.SANDBOX_PORT (the builders may not be imported here)
CLAIM_LABEL = "gagar.dev/run"  # on each claim: which run holds it (``kubectl get sandboxclaims``)
MISSING_CRDS = (
    f"the agent-sandbox CRDs are not served ({EXTENSIONS_GROUP}/{VERSION} sandboxclaims): install "
    "agent-sandbox with its extensions (kubernetes-sigs/agent-sandbox), or set "
    "spec.sandbox.isolation to auto or pod"
)


class AgentSandboxFactory(SessionFactory):
    """Sessions on Sandboxes claimed from the warm pool ``warmpool`` in ``namespace``.

    ``api_client``: a ``kubernetes.client.ApiClient`` (None: in-cluster config, else kubeconfig,
    as agent-sandbox's client loads it). ``ready_timeout_s``: how long a claim may take to be bound
    and Ready. ``port``: the executor's port in the claimed pod.
    """

    def __init__(  # noqa: PLR0913 - keyword-only knobs beside the pool's name and namespace
        self,
        warmpool: str,
        namespace: str,
        *,
        api_client: Any = None,
        run: str | None = None,
        limits: Limits | None = None,
        ready_timeout_s: float = 180.0,
        port: int = EXECUTOR_PORT,
    ) -> None:
        from k8s_agent_sandbox import SandboxClient
        from kubernetes.config import ConfigException

        self.warmpool, self.namespace, self.run = warmpool, namespace, run
        self.limits, self.port = limits, port
        self.ready_timeout_s = ready_timeout_s
        try:
            self.client: Any = SandboxClient(api_client=api_client)
        except ConfigException as e:  # no service account, no kubeconfig
            raise SandboxUnavailable(f"no Kubernetes API to claim Sandboxes from: {e}") from None
        self._lock = threading.Lock()
        self._sessions: dict[str, AgentSandboxSession] = {}

    def open(self, request: SessionRequest) -> AgentSandboxSession:
        """A session on a Sandbox claimed for it alone."""
        request = request.for_one_image(self.where, self.limits)  # refused before claiming
        claim, ip = self._claim()
        try:
            http = HttpFactory(self._url(ip))
            try:
                sid = http.open(request).id
            except BaseException:
                http.close()
                raise
        except BaseException:
            self._release(claim)
            raise
        session = AgentSandboxSession(self, claim, http, sid)
        with self._lock:
            self._sessions[claim] = session
        return session

    def _url(self, ip: str) -> str:
        host = f"[{ip}]" if ":" in ip else ip
        return f"http://{host}:{self.port}"

    def _claim(self) -> tuple[str, str]:
        """Claim a Sandbox; (claim name, its pod IP) once Ready."""
        from k8s_agent_sandbox import SandboxError as ClientError
        from kubernetes.client import ApiException

        labels = {CLAIM_LABEL: self.run} if self.run else None
        start = time.monotonic()
        try:
            sandbox = self.client.create_sandbox(
                self.warmpool,
                namespace=self.namespace,
                sandbox_ready_timeout=max(1, math.ceil(self.ready_timeout_s)),
                labels=labels,
            )
        except ApiException as e:
            if e.status == 404:
                raise SandboxUnavailable(MISSING_CRDS) from None
            raise SandboxInfraError(f"claiming a sandbox from {self.where}: {_api(e)}") from None
        except TimeoutError:
            raise SandboxInfraError(
                f"no sandbox of {self.where} was Ready within {self.ready_timeout_s:g} s (the "
                f"claim is deleted): is the pool's template schedulable, its image pullable, "
                f"its runtime class installed? (kubectl -n {self.namespace} describe "
                f"sandboxwarmpool {self.warmpool})"
            ) from None
        except ClientError as e:
            raise SandboxInfraError(f"claiming a sandbox from {self.where}: {e}") from None
        claim = str(sandbox.claim_name)
        try:
            ip = sandbox.get_pod_ip()
        except ApiException as e:
            self._release(claim)
            raise SandboxInfraError(f"reading sandbox {sandbox.sandbox_id}: {_api(e)}") from None
        if not ip:
            self._release(claim)
            raise SandboxInfraError(f"sandbox {sandbox.sandbox_id} is Ready but has no pod IP")
        log.debug("claim %s: sandbox %s at %s in %.2f s", claim, sandbox.sandbox_id, ip,
                  time.monotonic() - start)  # fmt: skip
        return claim, ip

    @property
    def where(self) -> str:
        return f"warm pool {self.namespace}/{self.warmpool}"

    def _release(self, claim: str) -> None:
        """Delete the claim (agent-sandbox then deletes its Sandbox and pod); never raises."""
        with self._lock:
            self._sessions.pop(claim, None)
        self.client.delete_sandbox(claim, namespace=self.namespace)  # logs its own failures

    def close(self) -> None:
        """Release every session still open (their claims, so their pods)."""
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.close()


def _api(e: Any) -> str:
    return f"API error {e.status} {e.reason}".strip()


class AgentSandboxSession(HttpSession):
    """One session on its own claimed Sandbox (its infrastructure failures name the claim);
    ``close`` ends both."""

    def __init__(
        self, factory: AgentSandboxFactory, claim: str, http: HttpFactory, sid: str
    ) -> None:
        super().__init__(http.client, sid, where=f"sandbox of claim {claim}")
        self.factory, self.claim, self._http, self._closed = factory, claim, http, False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            super().close()  # a pod gone already is no error: deleting the claim is what matters
        finally:
            self._http.close()
            self.factory._release(self.claim)


__all__ = ["MISSING_CRDS", "AgentSandboxFactory", "AgentSandboxSession"]
