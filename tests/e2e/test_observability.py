"""Dashboards, alerts and autoscaling triggers against the real components' series.

A real Prometheus scrapes a real ``gagar sandbox serve``, ``gagar grader serve`` and ``gagar
operator`` (reconciling a GagarRun in the Kubernetes API emulator), labelled as in a cluster:
``run``/``pool`` set by each process (flags or the ``GAGAR_RUN``/``GAGAR_COMPONENT`` environment
the operator gives its pods), ``namespace`` added by the scrape (as a ServiceMonitor does; the
operator's own ``namespace`` labels are honoured, as the chart's ServiceMonitor does). The
trainer's and rollout's series come from a real ``gagar train`` in
``tests/e2e/test_train_local.py``, which runs the same checks for them.

Checked: each server lists every catalogue metric of its component on /metrics from start-up;
every dashboard query over these components returns finite series; every label matcher of the
dashboards, alerts and the grader pool's KEDA/HPA triggers matches a real series.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gagar.alerts import Windows, alerts
from gagar.crd import build_crd
from gagar.dashboards import DASHBOARDS, queries
from gagar.grader.sample import sample_group
from gagar.grader.service import GraderClient
from gagar.metrics import CATALOGUE
from gagar.operator.builders.common import BuildContext
from gagar.operator.builders.pools import build_hpa, build_scaled_object
from gagar.sandbox.client import HttpFactory
from gagar.spec import Autoscaling, GagarRun
from tests.e2e.test_prometheus import free_port, wait_for
from tests.integration.test_operator_scenarios import manifest
from tests.kube_emulator import KubeEmulator
from tests.support.exposition import missing
from tests.support.promql import by_metric, rendered, selectors, unmatched
from tests.support.tools import ROOT, stop, system_tool

pytestmark = pytest.mark.e2e

NAMESPACE, RUN = "default", "obs-demo"
COMPONENTS = ("sandbox", "grader", "operator")


@dataclass
class Stack:
    prometheus: str
    targets: dict[str, str]  # component -> base URL
    first_metrics: dict[str, str]  # component -> /metrics text before any request

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=10)
        data = body.json()
        assert data["status"] == "success", data
        return data["data"]["result"]

    def series(self) -> dict[str, list[dict[str, str]]]:
        params = {"match[]": '{__name__=~"gagar_.*"}'}
        body = httpx.get(f"{self.prometheus}/api/v1/series", params=params, timeout=10).json()
        return by_metric(body["data"])


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("w")
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=out)


def _ready(url: str, what: str) -> str:
    wait_for(lambda: httpx.get(f"{url}/metrics", timeout=2).status_code == 200, 60, what)
    return httpx.get(f"{url}/metrics", timeout=5).text


def _prometheus_config(tmp: Path, ports: dict[str, int]) -> Path:
    def job(component: str, honor: bool) -> dict[str, Any]:
        port = ports["sandbox-metrics" if component == "sandbox" else component]
        target = {"targets": [f"127.0.0.1:{port}"]}
        if not honor:
            target["labels"] = {"namespace": NAMESPACE}  # what a ServiceMonitor adds
        return {"job_name": component, "honor_labels": honor, "static_configs": [target]}

    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [job("sandbox", False), job("grader", False), job("operator", True)],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("observability")
    ports = {c: free_port() for c in (*COMPONENTS, "sandbox-metrics", "health", "prometheus")}
    procs: list[subprocess.Popen[bytes]] = []
    with KubeEmulator(deployment_delay=0.05) as kube:
        kube.create(build_crd())
        kubeconfig = kube.write_kubeconfig(tmp / "kubeconfig")
        try:
            gagar = [sys.executable, "-m", "gagar.cli"]
            # the sandbox server labels itself from flags, the grader from the pod environment
            procs.append(
                _start(
                    [*gagar, "sandbox", "serve", "--host", "127.0.0.1"]
                    + ["--port", str(ports["sandbox"]), "--run", RUN, "--pool", "sandbox"]
                    + ["--metrics-port", str(ports["sandbox-metrics"])],
                    {},
                    tmp / "sandbox.log",
                )
            )
            procs.append(
                _start(
                    [*gagar, "grader", "serve", "--host", "127.0.0.1"]
                    + ["--port", str(ports["grader"]), "--drain-seconds", "1"],
                    {"GAGAR_RUN": RUN, "GAGAR_COMPONENT": "grader"},
                    tmp / "grader.log",
                )
            )
            procs.append(
                _start(
                    [*gagar, "operator", "--namespace", NAMESPACE, "--standalone"]
                    + ["--metrics-port", str(ports["operator"])]
                    + ["--health-port", str(ports["health"])],
                    {"KUBECONFIG": str(kubeconfig)},
                    tmp / "operator.log",
                )
            )
            urls = {c: f"http://127.0.0.1:{ports[c]}" for c in COMPONENTS}
            # Prometheus scrapes the sandbox pods' metrics port, as the ServiceMonitor does
            metrics = {**urls, "sandbox": f"http://127.0.0.1:{ports['sandbox-metrics']}"}
            first = {c: _ready(metrics[c], f"{c} /metrics") for c in COMPONENTS}
            procs.append(
                subprocess.Popen(
                    [
                        system_tool("prometheus"),
                        f"--config.file={_prometheus_config(tmp, ports)}",
                        f"--storage.tsdb.path={tmp / 'data'}",
                        f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=(tmp / "prometheus.log").open("w"),
                )
            )
            stack = Stack(f"http://127.0.0.1:{ports['prometheus']}", urls, first)
            wait_for(
                lambda: httpx.get(f"{stack.prometheus}/-/ready", timeout=2).status_code == 200,
                60,
                "Prometheus ready",
            )
            # the first scrapes come before any event, so rates see every event
            wait_for(lambda: len(stack.query("up == 1")) == 3, 60, "every target scraped")
            run = manifest("local")
            run["metadata"] = {"name": RUN, "namespace": NAMESPACE}
            kube.create(run)
            _traffic(urls)
            kube.wait_for(
                lambda: (
                    (kube.get("gagar.dev/v1alpha1", "GagarRun", RUN).get("status") or {}).get(
                        "phase"
                    )
                    == "Running"
                ),
                timeout=60,
            )
            wait_for(
                lambda: (
                    stack.query(f'gagar_run_condition{{run="{RUN}",condition="Ready"}} == 1')
                    and stack.query("gagar_grader_request_duration_seconds_count > 0")
                    and stack.query("gagar_sandbox_execution_duration_seconds_count > 3")
                ),
                60,
                "the traffic scraped",
            )
        except Exception as err:  # say what the processes said
            logs = {p.name: p.read_text()[-1500:] for p in tmp.glob("*.log")}
            raise AssertionError(f"{type(err).__name__}: {err}; logs: {logs}") from err
        else:
            yield stack
        finally:
            for proc in reversed(procs):
                stop(proc)


def _traffic(urls: dict[str, str]) -> None:
    """Real requests: sandboxed commands (ok, failing, timed out, over memory) and gradings."""
    with HttpFactory(urls["sandbox"]).create(files={}) as s:
        s.exec("true")
        s.exec("exit 1")
        s.exec("sleep 5", timeout=0.3)
        s.exec("python3 -c 'x = bytearray(3 << 30)'")
    client = GraderClient(urls["grader"], retries=0)
    for _ in range(3):
        client.grade_sync(sample_group())
    httpx.post(f"{urls['grader']}/v1/grade", json={"task_id": "t"}, timeout=10)  # invalid


def _component_of(expr: str) -> set[str]:
    return {CATALOGUE[name].component for name, _ in selectors(expr) if name in CATALOGUE}


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_catalogue_metric_is_listed_from_start_up(stack: Stack, component: str) -> None:
    # a run's condition gauges exist once the operator has seen the run
    expected = ["gagar_run_condition"] if component == "operator" else []
    assert missing(stack.first_metrics[component], component) == expected  # type: ignore[arg-type]


def test_every_dashboard_query_over_these_components_returns_series(stack: Stack) -> None:
    checked, empty = 0, []
    for build in DASHBOARDS:
        for expr in queries(build()):
            if not _component_of(expr) or not _component_of(expr) <= set(COMPONENTS):
                continue
            checked += 1
            result = stack.query(rendered(expr, NAMESPACE, RUN, "5m"))
            if not any(math.isfinite(float(r["value"][1])) for r in result):
                empty.append(expr)
    assert checked >= 20 and empty == []


def _grader_triggers() -> list[str]:
    run = GagarRun.model_validate(
        {
            "metadata": {"name": RUN, "namespace": NAMESPACE},
            "spec": {
                "model": {"preset": "tiny"},
                "grader": {"autoscaling": {"maxReplicas": 4}},
            },
        }
    )
    ctx = BuildContext(uid="u")
    keda = build_scaled_object(run, ctx, "grader", Autoscaling(max_replicas=4))
    hpa = build_hpa(run, ctx, "grader", Autoscaling(max_replicas=4, backend="hpa"))
    return [
        keda["spec"]["triggers"][0]["metadata"]["query"],
        hpa["spec"]["metrics"][0]["pods"]["metric"]["name"],  # the adapter adds pod/namespace
    ]


def test_label_matchers_match_real_series(stack: Stack) -> None:
    """Every selector of the dashboards, the alerts and the grader pool's autoscaling triggers
    that names a metric of these components matches a series they emit, with the labels a
    cluster gives it (a query whose ``run`` or ``namespace`` never joins fails here)."""
    series = stack.series()
    exprs = [rendered(q, NAMESPACE, RUN, "5m") for b in DASHBOARDS for q in queries(b())]
    exprs += [a.expr for a in alerts(Windows())]
    exprs += _grader_triggers()
    bad = {}
    for expr in exprs:
        ours = [
            (n, m)
            for n, m in selectors(expr)
            if n in CATALOGUE and CATALOGUE[n].component in COMPONENTS
        ]
        if ours and (problems := unmatched(expr, {n: series.get(n, []) for n, _ in ours})):
            bad[expr] = problems
    assert bad == {}
    # and the queries would notice a wrong run
    assert unmatched(f'gagar_grader_queue_depth{{run="{RUN}-other"}}', series)
