"""A run dirtied as fast as it is reconciled (a loaded machine: one reconcile takes as long as
the 1 s resync, and the reconcile's own writes come back as events) once kept the caller of
``reconcile_named`` (a watch's thread, or a whole ``reconcile``) chasing the ``dirty`` flag for
ever: the stale-view scenario's three reconciles never ended. The chase is bounded; the run left
dirty is due at once for the resync thread. No cluster: ``_locked_reconcile`` is a recorder."""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry

from gagar.metrics import Metrics
from gagar.operator.handlers import MAX_PASSES, OperatorConfig, Reconciler


class Busy(Reconciler):
    """Every reconcile is followed by an event of the run's own (it is dirty again at once)."""

    def __init__(self) -> None:
        super().__init__(None, Metrics(CollectorRegistry(), "operator"), OperatorConfig(30.0))  # type: ignore[arg-type]
        self.passes = 0

    def _locked_reconcile(self, namespace: str, run_name: str, mem: Any, force: bool) -> None:
        mem.dirty = False
        self.passes += 1
        mem.dirty = True  # the status write's own watch event, arriving during the pass


def _ends(call: Any) -> bool:
    done = threading.Event()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    return done.wait(5.0)


def test_a_run_dirtied_as_fast_as_it_is_reconciled_releases_its_caller() -> None:
    rec = Busy()
    assert _ends(lambda: rec.reconcile_named("ns", "run")), "reconcile_named chased dirty for ever"
    assert rec.passes == MAX_PASSES
    assert rec._due[("ns", "run")] <= time.monotonic()  # the resync thread takes it next


def test_a_whole_reconcile_is_one_pass_and_leaves_the_events_to_the_resync() -> None:
    rec = Busy()
    body = {"metadata": {"namespace": "ns", "name": "run"}}
    assert _ends(lambda: rec.reconcile(body)), "reconcile chased dirty for ever"
    assert rec.passes == 1
    assert rec._due[("ns", "run")] <= time.monotonic()
