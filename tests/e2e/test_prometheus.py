"""Alerts against a real Prometheus scraping an exporter of the catalogue that can degrade.

One module-scoped setup: a Prometheus server (Debian ``prometheus``) on a random loopback port with
tmp storage, scraping ``tests/support/metrics_exporter.py`` every second and loading two rules
files: the shipped one (production windows: must load and evaluate healthily) and the same rules
built with windows in seconds (must stay silent while the exporter is healthy and all fire once
it degrades). The dashboards are checked against the real components instead:
``tests/e2e/test_observability.py`` (sandbox, grader, operator) and
``tests/e2e/test_train_local.py`` (trainer, rollout).
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gagar.alerts import Windows, alerts, rule_groups, rules_yaml
from gagar.dashboards import DASHBOARDS, queries
from gagar.metrics import CATALOGUE
from tests.support.tools import CHART, ROOT, run, system_tool

pytestmark = pytest.mark.e2e

NAMESPACE, RUN = "gagar-test", "demo"
FAST = Windows(short="5s", long="60s", resolution="1s", stall="5s", hold="2s", quality="5s")
HEALTHY_SECONDS = 15


@dataclass
class Server:
    url: str
    exporter: subprocess.Popen[str]
    started: float

    def api(self, path: str, **params: Any) -> Any:
        body = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (httpx.HTTPError, AssertionError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


def write_config(tmp: Path, exporter_port: int) -> Path:
    fast = rule_groups(FAST)
    fast["groups"][0]["name"] = "gagar-fast"
    (tmp / "fast.yaml").write_text(yaml.safe_dump(fast))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(CHART / "rules/gagar-alerts.yaml"), str(tmp / "fast.yaml")],
        "scrape_configs": [
            {
                "job_name": "gagar",
                # like the chart's ServiceMonitor: honor the run's own namespace label
                "honor_labels": True,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{exporter_port}"], "labels": {"namespace": NAMESPACE}}
                ],
            }
        ],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("prometheus")
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.metrics_exporter",
            "--run",
            RUN,
            "--namespace",
            NAMESPACE,
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    port = free_port()
    prom = None
    log = (tmp / "prometheus.log").open("w")
    try:
        exporter_port = int(exporter.stdout.readline())
        started = time.monotonic()
        config = write_config(tmp, exporter_port)
        prom = subprocess.Popen(
            [
                system_tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200,
            30,
            "Prometheus ready",
        )
        yield Server(url, exporter, started)
    finally:
        for proc in (prom, exporter):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)
        log.close()


def rendered(expr: str) -> str:
    """A dashboard query as Grafana sends it, with the variables set to the exporter's run."""
    return (
        expr.replace("$namespace", NAMESPACE).replace("$run", RUN).replace("$__rate_interval", "5s")
    )


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def test_promtool_checks_the_shipped_rules() -> None:
    out = run([system_tool("promtool"), "check", "rules", CHART / "rules/gagar-alerts.yaml"]).stdout
    assert f"SUCCESS: {len(alerts(Windows()))} rules found" in out


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    groups = rule_groups()
    groups["groups"][0]["rules"][0]["expr"] = "sum by (run) (rate(gagar_loss[5m])"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(groups))
    proc = run([system_tool("promtool"), "check", "rules", tmp_path / "bad.yaml"], check=False)
    assert proc.returncode != 0


def test_every_catalogue_metric_is_on_a_dashboard() -> None:
    text = " ".join(q for build in DASHBOARDS for q in queries(build()))
    missing = [name for name in CATALOGUE if name.removesuffix("_total") not in text]
    assert missing == []


def test_rules_load_and_evaluate(server: Server) -> None:
    def evaluated() -> list[dict[str, Any]]:
        groups = server.api("rules")["groups"]
        never = [r for g in groups for r in g["rules"] if r["lastEvaluation"].startswith("0001")]
        return groups if len(groups) == 2 and not never else []

    wait_for(lambda: server.query("gagar_trainer_step > 3"), 20, "a few scrapes")
    time.sleep(2)  # evaluations after the first scrapes
    groups = wait_for(evaluated, 10, "both rule groups evaluated")
    assert sorted(g["name"] for g in groups) == ["gagar", "gagar-fast"]
    for group in groups:
        assert {r["name"] for r in group["rules"]} == {a.name for a in alerts(Windows())}
        for rule in group["rules"]:
            assert rule["health"] == "ok", (group["name"], rule["name"], rule.get("lastError"))


def test_alert_signals_return_series(server: Server) -> None:
    wait_for(lambda: server.query("gagar_trainer_step > 3"), 20, "a few scrapes")
    time.sleep(2)
    for alert in alerts(FAST):
        result = server.query(alert.signal)
        assert finite(result), alert.name
        assert {r["metric"].get("run") for r in result} == {RUN}, alert.name


def active_alerts(server: Server) -> dict[str, str]:
    return {
        a["labels"]["alertname"]: a["state"]
        for g in server.api("rules")["groups"]
        if g["name"] == "gagar-fast"
        for r in g["rules"]
        for a in r.get("alerts", [])
    }


def test_alerts_silent_when_healthy_then_fire_when_degraded(server: Server) -> None:
    # runs last in this module (pytest keeps file order): it switches the exporter's regime
    wait_for(lambda: server.query("gagar_trainer_step > 3"), 20, "a few scrapes")
    time.sleep(max(0.0, HEALTHY_SECONDS - (time.monotonic() - server.started)))
    assert active_alerts(server) == {}, "no alert may be pending or firing on a healthy run"

    server.exporter.stdin.write("degraded\n")
    server.exporter.stdin.flush()
    names = {a.name for a in alerts(FAST)}
    firing = wait_for(
        lambda: (lambda a: a if {n for n, s in a.items() if s == "firing"} == names else None)(
            active_alerts(server)
        ),
        30,
        f"all of {sorted(names)} firing",
    )
    assert set(firing) == names
    for alert in server.api("alerts")["alerts"]:
        assert alert["labels"]["run"] == RUN and alert["labels"]["namespace"] == NAMESPACE


def test_pool_alert_ignores_suspended_and_finished_runs(tmp_path: Path) -> None:
    """`promtool test rules`: GagarPoolNotReady fires for a running run whose pools are short,
    not for a suspended or finished one (its pools are at zero on purpose)."""
    (tmp_path / "rules.yaml").write_text(rules_yaml(Windows(hold="1m")))

    def series(name: str, condition: str, status: str, value: int) -> dict[str, str]:
        labels = f'run="{name}",namespace="ns",condition="{condition}",status="{status}"'
        return {"series": f"gagar_run_condition{{{labels}}}", "values": f"{value}x10"}

    inputs = []
    for name, suspended, failed in (("busy", 0, 0), ("paused", 1, 0), ("done", 0, 1)):
        inputs += [
            series(name, "PoolsReady", "False", 1),
            series(name, "PoolsReady", "True", 0),
            series(name, "Suspended", "True", suspended),
            series(name, "Failed", "True", failed),
        ]
    firing = {"severity": "warning", "run": "busy", "namespace": "ns"}
    (alert,) = [a for a in alerts(Windows()) if a.name == "GagarPoolNotReady"]
    notes = {
        k: v.replace("{{ $labels.run }}", "busy")
        for k, v in (("summary", alert.summary), ("description", alert.description))
    }
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {
                        "eval_time": "5m",
                        "alertname": "GagarPoolNotReady",
                        "exp_alerts": [{"exp_labels": firing, "exp_annotations": notes}],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    proc = run([system_tool("promtool"), "test", "rules", tmp_path / "test.yaml"], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
