"""`gagar train` on the embedded default, end to end: real vLLM (CPU), bubblewrap, Megatron-Core.

One short run checks the run directory, metrics and report; a second run is SIGKILLed in the middle
of a step and re-run with the same command, which must resume from the last complete checkpoint
with no lost and no repeated step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gagar.alerts import Windows, alerts
from gagar.dashboards import DASHBOARDS, queries
from gagar.driver.record import StepRecord, read_records
from gagar.driver.report import GAUGES
from gagar.metrics import CATALOGUE
from tests.e2e.test_prometheus import free_port
from tests.support.promql import by_metric, rendered, selectors, unmatched
from tests.support.tools import system_tool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "local.yaml"
pytestmark = pytest.mark.e2e

RECORD_KEYS = {
    "schema_version", "step", "policy_version", "pass_rate", "eligible_groups_ratio", "adv_before_mean", "adv_after_abs_max",
    "lambda_mean", "fallbacks", "hacks", "response_tokens_mean", "turns_mean",
    "tokens_trained", "rollout_seconds", "training_seconds", "sync_seconds", "step_seconds", "invalid", "flagged_turns",
    "stage_seconds", "staleness_versions", "rollout_policy_version",
}  # fmt: skip
TRAINED_KEYS = {"loss", "grad_norm", "lr", "kl", "clip_ratio", "ratio_max"}  # a step that updated


def _train(
    out: Path, *extra: str, manifest: Path = EXAMPLE, port: int = 0
) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "gagar.cli", "train", str(manifest), "--out", str(out)]
    cmd += ["--metrics-port", str(port), "--sft-steps", "2", "--sft-experts", "16"]
    cmd += ["--copy-steps", "2", *extra]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )


def _steps(out: Path) -> list[int]:
    log = out / "metrics.jsonl"
    return (
        [json.loads(line)["step"] for line in log.read_text().splitlines()] if log.exists() else []
    )


def _prometheus(tmp: Path, target_port: int) -> tuple[subprocess.Popen[bytes], str]:
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "gagar",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{target_port}"], "labels": {"namespace": "local"}}
                ],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [
        system_tool("prometheus"),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    ), f"http://127.0.0.1:{port}"


def _query(url: str, expr: str, at: float) -> list[dict]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr, "time": at}, timeout=10).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


TRAINER = ("trainer", "rollout")  # the components a `gagar train` process exports


def _dashboards_against(
    url: str, at: float, records: list[StepRecord]
) -> tuple[set[str], list[str], dict[str, list[str]]]:
    """Metric names Prometheus scraped from the run; the dashboard queries over the trainer's
    components that returned nothing, though the run had a value for each of their metrics (a
    step's gauge is exported when its record has the field: no gradient variance below two
    micro-batches, no loss or learning rate from a step that trained nothing); and the selectors
    of dashboards and alerts over them that match none of its series (labels that would not join)."""
    never = {name for name, value_of in GAUGES.items() if all(value_of(r) is None for r in records)}
    scraped = _query(url, '{__name__=~"gagar_.*", run="local"}', at)
    series = by_metric(r["metric"] for r in scraped)
    empty, bad = [], {}
    exprs = [q for build in DASHBOARDS for q in queries(build())]
    for expr in exprs + [a.expr for a in alerts(Windows())]:
        comps = {CATALOGUE[n].component for n, _ in selectors(expr) if n in CATALOGUE}
        if not comps or not comps <= set(TRAINER):
            continue
        if {n for n, _ in selectors(expr)} <= never:
            continue  # nothing to find: the run never had a value for these
        query = rendered(expr, "local", "local", "5m")
        if expr in exprs and not _query(url, query, at):
            empty.append(expr)
        if problems := [p for p in unmatched(query, series) if p.split("{")[0] not in never]:
            bad[expr] = problems
    for var in ("namespace", "run"):  # the dashboards' variables find the run
        values = {r["metric"].get(var) for r in _query(url, "gagar_trainer_step", at)}
        assert values == {"local"}, (var, values)
    return {r["metric"]["__name__"] for r in scraped}, empty, bad


def test_local_example_trains_and_reports(tmp_path: Path) -> None:
    metrics_port = free_port()
    prom, url = _prometheus(tmp_path, metrics_port)
    try:
        proc = _train(
            tmp_path / "run", "--steps", "2", "--eval-tasks", "2", "--probe", "4", port=metrics_port
        )
        output, _ = proc.communicate(timeout=1500)
        assert proc.returncode == 0, output[-4000:]
        records = read_records(tmp_path / "run" / "metrics.jsonl")
        # a real Prometheus scraped the real run: the dashboards' queries over what it exported work
        at = (tmp_path / "run" / "metrics.jsonl").stat().st_mtime + 3
        scraped, empty, bad = _dashboards_against(url, at, records)
    finally:
        prom.terminate()
        prom.wait(30)
    # tr Cov needs two micro-batches in a step: present exactly then, and exported then
    assert all(
        (r.learner.gradient_variance is not None) == (r.learner.micro_batches >= 2) for r in records
    )
    assert {
        "gagar_trainer_step",
        "gagar_pass_rate_ratio",
        "gagar_advantage_abs_max",
        "gagar_tokens_per_second",
        *(["gagar_gradient_variance"] if any(r.learner.gradient_variance for r in records) else []),
    } <= scraped
    assert empty == [] and bad == {}
    assert {"gagar_rollout_requests_total", "gagar_weight_sync_duration_seconds_count"} <= scraped
    tmp_path = tmp_path / "run"
    assert _steps(tmp_path) == [1, 2]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert RECORD_KEYS <= set(records[-1]), RECORD_KEYS - set(records[-1])
    for r in records:  # the optimization fields exactly when the step trained (null, not 0)
        have = {k for k in TRAINED_KEYS if r[k] is not None}
        assert have == (TRAINED_KEYS if r["tokens_trained"] > 0 else set()), r
    assert records[-1]["policy_version"] == 2
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"] == 2 and report["held_out"]["tasks"] == 2
    # the probe set: 4 fixed samples of one training task, scored before step 1 and after step 2
    probe = report["probe"]
    assert probe["start"]["tasks"] == probe["end"]["tasks"] == 4
    assert len({s["task"] for s in probe["end"]["samples"]}) == 1
    assert (tmp_path / "rollouts" / "probe_start.jsonl").exists()
    assert (tmp_path / "rollouts" / "probe_end.jsonl").exists()
    warm = report["warm_start"]
    assert warm["copy_curriculum"]["steps"] == 2 and warm["sft_steps"] == 2
    assert sum(int(v.split("/")[1].split()[0]) for v in warm["sft_experts"].values()) == 16
    assert all((tmp_path / name).stat().st_size > 0 for name in report["plots"])
    assert (tmp_path / "checkpoints" / "step_00000002" / "COMPLETE").exists()
    assert (tmp_path / "policy" / "versions").exists()
    # the terminal shows progress and one summary table, no library warnings, no raw dicts
    assert "held-out resolved" in output and "training pass rate" in output, output[-4000:]
    # the probe row counts its 4 samples (x/4 at each end, with intervals and the sign test)
    assert "probe pass rate (start → end)" in output, output[-4000:]
    assert re.search(r"\b\d/4\b", output) and "gained" in output, output[-4000:]
    assert str(tmp_path / "report.json") in output
    assert not re.search(r"Warning|warnings\.warn|\{'", output), output[-4000:]
    # the compute dtype the CPU computes natively, said in the log and the report
    precision = report["precision"]
    assert precision["requested"] == "auto" and precision["dtype"] in ("bfloat16", "float32")
    assert f"compute dtype: {precision['dtype']} (auto: " in output, output[-4000:]
    assert report["machine"]["cpu"] and "vector_units" in report["machine"]
    if precision["dtype"] == "bfloat16":  # torch's warning of bfloat16 inputs to float32 norms
        assert "Mismatch dtype" in (tmp_path / "logs" / "libraries.log").read_text()


def test_sigkill_mid_step_resumes_and_a_dead_engine_is_a_clear_error(tmp_path: Path) -> None:
    manifest = tmp_path / "run.yaml"
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["trainer"]["checkpoint"]["intervalSteps"] = 1
    manifest.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run"
    proc = _train(out, "--steps", "3", "--eval-tasks", "0", manifest=manifest)
    deadline = time.time() + 1200
    while (
        time.time() < deadline and not (out / "checkpoints" / "step_00000001" / "COMPLETE").exists()
    ):
        assert proc.poll() is None, proc.stdout.read()[-4000:] if proc.stdout else ""
        time.sleep(0.5)
    time.sleep(3)  # now inside step 2: rollouts on the new weights
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _steps(out)[:1] == [1]
    again = _train(out, "--steps", "3", "--eval-tasks", "0", manifest=manifest)
    # the resumed run does step 2; then its engine dies in the middle of step 3
    while (
        time.time() < deadline and not (out / "checkpoints" / "step_00000002" / "COMPLETE").exists()
    ):
        assert again.poll() is None, again.stdout.read()[-4000:] if again.stdout else ""
        time.sleep(0.5)
    time.sleep(3)
    serving = str(out / "policy" / "serving")
    found = subprocess.run(["pgrep", "-f", serving], capture_output=True, text=True, check=False)
    assert found.stdout.split(), "the run's vLLM server is running"
    for pid in {os.getpgid(int(p)) for p in found.stdout.split()}:
        os.killpg(pid, signal.SIGKILL)  # the server and its engine core
    output, _ = again.communicate(timeout=900)
    assert "resumed" in output
    assert again.returncode == 1, output[-4000:]
    message = " ".join(output.split())
    assert "step 3 failed" in message and "vLLM exited" in message, output[-4000:]
    assert "newest complete checkpoint is of step 2" in message
    assert _steps(out) == [1, 2], "every completed step exactly once; the failed one not at all"
    assert (out / "logs" / "error.log").read_text().startswith("Traceback")
    assert not (out / "checkpoints" / "step_00000003").exists()


def test_a_second_run_starts_from_the_machine_s_cached_warm_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same manifest twice (another run directory): the second restores the warm-started
    policy from the cache and skips the copying curriculum and the SFT, and takes the probe's start
    score (with its trajectories) from the first run's; another style mix misses both.
    The cache is this test's own: the suite's shared one already holds what other tests made."""
    env_cache = tmp_path / "cache"
    monkeypatch.setenv("GAGAR_CACHE_DIR", str(env_cache))
    first = _train(tmp_path / "a", "--steps", "1", "--eval-tasks", "0", "--probe", "2")
    out_a, _ = first.communicate(timeout=1500)
    assert first.returncode == 0, out_a[-4000:]
    assert "SFT warm start" in out_a and "cached on this machine" not in out_a
    second = _train(tmp_path / "b", "--steps", "1", "--eval-tasks", "0", "--probe", "2")
    out_b, _ = second.communicate(timeout=1500)
    assert second.returncode == 0, out_b[-4000:]
    assert "cached on this machine" in out_b, out_b[-4000:]
    assert "SFT warm start:" not in out_b and "copying curriculum" not in out_b
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["warm_start"]["cached"] is True and report["warm_start"]["sft_steps"] == 2
    assert any(p.is_dir() for p in (env_cache / "warm-start").iterdir())
    first_start = json.loads((tmp_path / "a" / "report.json").read_text())["probe"]["start"]
    assert "cached" not in first_start
    assert report["probe"]["start"] == {**first_start, "cached": report["probe"]["start"]["cached"]}
    assert (tmp_path / "b" / "rollouts" / "probe_start.jsonl").read_text() == (
        tmp_path / "a" / "rollouts" / "probe_start.jsonl"
    ).read_text()
    assert "cached" not in report["probe"]["end"], "the end is scored on the run's own weights"
    # another expert style mix is another warm start
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["model"]["sftExpertStyles"] = {"bloated": 0.9}
    manifest = tmp_path / "styles.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    third = _train(tmp_path / "c", "--steps", "1", "--eval-tasks", "0", manifest=manifest)
    out_c, _ = third.communicate(timeout=1500)
    assert third.returncode == 0, out_c[-4000:]
    assert "cached on this machine" not in out_c and "SFT warm start" in out_c
