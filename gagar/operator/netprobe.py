"""Runs the NetworkPolicy enforcement probe (``builders.netprobe``) once per namespace.

The reconcile of a run asks ``NetworkPolicyProbe.verdict(namespace, image)``: the first asker
starts the probe (four objects) and every asker gets None until the client's pod has ended; the
verdict is then kept for the operator's life (one probe per namespace, not per run) and the
probe's objects are deleted. A probe that gives no verdict within ``timeout_s`` (its pods never
scheduled, its image never pulled) is ``Unknown`` with what the pods wait for. Off with the
operator flag ``--no-network-policy-probe`` (the chart's ``operator.networkPolicyProbe``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from gagar.operator.builders.netprobe import PROBE_LABEL, Verdict, probe_manifests, probe_verdict
from gagar.operator.kube import Kube, KubeError
from gagar.operator.observe import waiting_reasons

log = logging.getLogger(__name__)


@dataclass
class _Probe:
    started: float
    verdict: Verdict | None = None


class NetworkPolicyProbe:
    """Per-namespace probe state; thread-safe (the watch threads and the resync reconcile)."""

    def __init__(self, kube: Kube, timeout_s: float = 240.0) -> None:
        self.kube, self.timeout_s = kube, timeout_s
        self._probes: dict[str, _Probe] = {}
        self._lock = threading.Lock()

    def verdict(self, namespace: str, image: str) -> Verdict | None:
        """The namespace's verdict, or None while its probe runs (started by this call)."""
        with self._lock:
            probe = self._probes.get(namespace)
            if probe is None:
                self._probes[namespace] = probe = _Probe(time.monotonic())
                start = True
            else:
                start = False
            if probe.verdict is not None:
                return probe.verdict
        if start:
            self._start(namespace, image, probe)
            return probe.verdict
        return self._check(namespace, probe)

    def cached(self, namespace: str) -> Verdict | None:
        """The namespace's verdict if one was reached (starts nothing)."""
        with self._lock:
            probe = self._probes.get(namespace)
            return probe.verdict if probe else None

    def _start(self, namespace: str, image: str, probe: _Probe) -> None:
        try:  # apply: a probe a dead operator left is taken over, its verdict as good
            for obj in probe_manifests(namespace, image):
                self.kube.apply(obj)
            log.info("%s: probing whether NetworkPolicies are enforced", namespace)
        except KubeError as err:
            if err.transient:
                with self._lock:
                    self._probes.pop(namespace, None)  # the next reconcile starts it again
                raise
            probe.verdict = ("Unknown", "ProbeFailed", f"cannot start the probe: {err.message}")

    def _check(self, namespace: str, probe: _Probe) -> Verdict | None:
        pods = self.kube.list("v1", "Pod", namespace, f"{PROBE_LABEL}=netpol-client")
        verdict = probe_verdict(namespace, pods)
        if verdict is None and time.monotonic() - probe.started > self.timeout_s:
            waits = ", ".join(waiting_reasons(pods)) or "no pod ended"
            verdict = ("Unknown", "ProbeTimedOut", f"the probe gave no verdict in "
                       f"{self.timeout_s:.0f} s ({waits})")  # fmt: skip
        if verdict is not None:
            probe.verdict = verdict
            log.info("%s: NetworkPolicy enforcement %s: %s", namespace, verdict[0], verdict[2])
            self._clean(namespace)
        return verdict

    def _clean(self, namespace: str) -> None:
        for obj in reversed(probe_manifests(namespace, "")):
            meta = obj["metadata"]
            self.kube.delete(obj["apiVersion"], obj["kind"], namespace, meta["name"])
