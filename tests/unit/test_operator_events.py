"""``Reconciler._post``: an event identical to one the run posted within ``EVENT_SERIES_S`` is a
count on that Event (a merge patch of ``count`` and ``lastTimestamp``), as client-go's event
correlator does; a gone Event or an ended series posts anew. A recording API, no cluster (the
scenario through kopf and the emulator: tests/integration/test_operator_refusals.py)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from gagar.metrics import Metrics
from gagar.operator import handlers
from gagar.operator.handlers import OperatorConfig, Reconciler
from gagar.operator.kube import KubeError
from gagar.operator.status import Event

RUN = {"metadata": {"name": "r", "namespace": "ns", "uid": "u"}}


class RecordingKube:
    """Creates and merge patches, recorded; a patch of a name in ``gone`` is a 404."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.gone: set[str] = set()

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        named = {**obj, "metadata": {**obj["metadata"], "name": f"r.{len(self.created)}"}}
        self.created.append(named)
        return named

    def merge_patch(self, api: str, kind: str, ns: str, name: str, body: dict) -> dict:
        if name in self.gone:
            raise KubeError(404, f'events "{name}" not found')
        self.patched.append((name, body))
        return {}


def reconciler(kube: RecordingKube) -> Reconciler:
    config = OperatorConfig(clock=lambda: "2026-12-07T10:00:00Z")
    return Reconciler(kube, Metrics(CollectorRegistry(), "operator"), config)  # type: ignore[arg-type]


def test_repeats_count_on_one_event_and_other_words_are_other_events() -> None:
    kube = RecordingKube()
    rec = reconciler(kube)
    stalled = Event("Warning", "ApplyFailed", "Deployment/r-rollout: refused")
    for _ in range(3):
        rec._post(RUN, [stalled])
    assert [e["reason"] for e in kube.created] == ["ApplyFailed"]
    assert [(n, b["count"]) for n, b in kube.patched] == [("r.0", 2), ("r.0", 3)]
    rec._post(RUN, [Event("Warning", "ApplyFailed", "Deployment/r-grader: refused")])
    rec._post(RUN, [Event("Normal", "Ready", "Ready")])
    assert len(kube.created) == 3  # another message, another reason: events of their own
    other = {"metadata": {"name": "r2", "namespace": "ns", "uid": "u2"}}
    before = len(kube.created)
    rec._post(other, [stalled])  # the same words for another run: its own event
    assert len(kube.created) == before + 1


def test_a_gone_event_or_an_ended_series_is_posted_anew(monkeypatch) -> None:
    kube = RecordingKube()
    rec = reconciler(kube)
    ready = Event("Normal", "Ready", "Ready")
    rec._post(RUN, [ready])
    kube.gone.add("r.0")  # expired (the API server's event TTL) or deleted
    rec._post(RUN, [ready])
    assert len(kube.created) == 2 and kube.patched == []
    rec._post(RUN, [ready])
    assert kube.patched == [("r.1", {"count": 2, "lastTimestamp": "2026-12-07T10:00:00Z"})]
    monkeypatch.setattr(handlers, "EVENT_SERIES_S", -1.0)  # every series has ended
    rec._post(RUN, [ready])
    assert len(kube.created) == 3 and len(kube.patched) == 1
