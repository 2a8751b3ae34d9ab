"""The operator's requeue (``Reconciler.requeue`` / ``resync_loop``): one thread that reconciles
each run when it is due (a restart's backoff, a transient API error) and every known run at least
every ``resync_seconds``. ``reconcile_named`` is replaced by a recorder: no cluster here."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from prometheus_client import CollectorRegistry

from gagar.metrics import Metrics
from gagar.operator.handlers import OperatorConfig, Reconciler


class Recorder(Reconciler):
    def __init__(self, resync: float, fail: dict[str, Exception] | None = None) -> None:
        super().__init__(None, Metrics(CollectorRegistry(), "operator"), OperatorConfig(resync))  # type: ignore[arg-type]
        self.calls: list[tuple[str, float]] = []
        self.fail = fail or {}
        self.started = time.monotonic()

    def reconcile_named(self, namespace: str, run_name: str, force_apply: bool = False) -> None:
        self.calls.append((run_name, time.monotonic() - self.started))
        error = self.fail.pop(run_name, None)
        if error is not None:
            raise error

    def times(self, run_name: str) -> list[float]:
        return [t for n, t in self.calls if n == run_name]


@pytest.fixture
def loop() -> Iterator[Any]:
    stop, threads = threading.Event(), []

    def start(reconciler: Recorder) -> Recorder:
        thread = threading.Thread(target=reconciler.resync_loop, args=(stop,), daemon=True)
        thread.start()
        threads.append((reconciler, thread))
        return reconciler

    yield start
    stop.set()
    for reconciler, thread in threads:
        reconciler.wake()
        thread.join(timeout=5)
        assert not thread.is_alive(), "the loop did not stop when woken"


def test_known_runs_are_resynced_and_forgotten_ones_are_not(loop: Any) -> None:
    rec = loop(Recorder(resync=0.3))
    rec.remember("ns", "a")
    rec.remember("ns", "b")
    time.sleep(1.05)
    assert 2 <= len(rec.times("a")) <= 3 and 2 <= len(rec.times("b")) <= 3  # ~0.3, 0.6, 0.9 s
    rec.forget("ns", "a")
    seen = len(rec.times("a"))
    time.sleep(0.7)
    assert len(rec.times("a")) == seen and len(rec.times("b")) >= 4


def test_the_earliest_due_time_wins(loop: Any) -> None:
    rec = loop(Recorder(resync=60.0))
    rec.remember("ns", "a")  # due in a minute
    rec.requeue("ns", "a", 0.2)  # a backoff ends sooner: that one counts
    rec.requeue("ns", "a", 5.0)  # a later one does not push it back
    time.sleep(1.0)
    assert len(rec.times("a")) == 1 and 0.15 < rec.times("a")[0] < 1.0


def test_a_transient_error_is_retried_after_its_delay_not_the_resync(loop: Any) -> None:
    rec = loop(Recorder(resync=60.0, fail={"a": kopf.TemporaryError("500", delay=0.3)}))
    rec.requeue("ns", "a", 0.0)
    time.sleep(1.5)
    first, second = rec.times("a")
    assert 0.25 < second - first < 1.2


def test_another_error_waits_for_the_next_resync(loop: Any) -> None:
    rec = loop(Recorder(resync=0.4, fail={"a": RuntimeError("bug")}))
    rec.remember("ns", "a")
    time.sleep(0.95)
    first, second = rec.times("a")  # the loop survived it
    assert 0.35 < second - first < 0.6


def test_stopping_waits_for_the_reconcile_in_flight() -> None:
    """The operator's clean-up (``stop_resync``) returns only once the resync's reconcile in
    flight has ended: nothing of a stopped operator writes to the API or its log afterwards."""
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    class Slow(Recorder):
        def reconcile_named(self, namespace: str, run_name: str, force_apply: bool = False) -> None:
            entered.set()
            release.wait(10)
            finished.set()

    rec = Slow(resync=0.05)
    rec.remember("ns", "a")
    rec.start_resync()
    assert entered.wait(5)
    stopper = threading.Thread(target=rec.stop_resync)
    stopper.start()
    time.sleep(0.3)
    assert stopper.is_alive() and not finished.is_set()  # waiting for the reconcile
    release.set()
    stopper.join(5)
    assert not stopper.is_alive() and finished.is_set()
    assert rec._resync is None
    rec.stop_resync()  # a second clean-up is harmless


def test_a_reconcile_that_outlives_the_stop_timeout_is_logged(caplog: Any) -> None:
    entered, release = threading.Event(), threading.Event()

    class Stuck(Recorder):
        def reconcile_named(self, namespace: str, run_name: str, force_apply: bool = False) -> None:
            entered.set()
            release.wait(10)

    rec = Stuck(resync=0.05)
    rec.remember("ns", "a")
    rec.start_resync()
    assert entered.wait(5)
    with caplog.at_level("WARNING", logger="gagar.operator"):
        rec.stop_resync(timeout=0.2)
    release.set()
    assert "did not end within" in caplog.text
