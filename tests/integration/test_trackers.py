"""spec.observability.trackers, each through its own library and read back with it, offline:
TensorBoard event files, an MLflow file store, a W&B offline run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import matplotlib
import pytest
import yaml

from gagar.crd import build_crd
from gagar.driver.trackers import Trackers, scalars
from gagar.spec import GagarRun
from tests.support.crd_check import crd_errors
from tests.support.records import step_record
from tests.support.tools import ROOT

matplotlib.use("Agg")
RECORD = step_record(
    1, pass_rate=0.5, loss=-0.25, fallbacks={"timeout": 2}, graded_by={"heuristic": 3}
)
STEP_2 = step_record(2, pass_rate=0.75, loss=-0.25, fallbacks={"timeout": 2})


def run_with(trackers: list[str], **observability: str) -> GagarRun:
    doc = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    doc["spec"].setdefault("observability", {}).update(trackers=trackers, **observability)
    return GagarRun.model_validate(doc)


def plot(out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 2], [0.1, 0.5])
    fig.savefig(out / "pass_rate.png", dpi=30)
    plt.close(fig)
    return out / "pass_rate.png"


def log_two_steps(run: GagarRun, out: Path) -> None:
    trackers = Trackers(run, out)
    trackers.log_step(RECORD)
    trackers.log_step(STEP_2)
    trackers.log_plots([plot(out), out / "missing.png"])
    trackers.close()


def test_scalars_flatten_a_record() -> None:
    assert scalars({"step": 1, "loss": -0.25, "shortfall": False, "note": "left out"}) == {
        "step": 1.0,
        "loss": -0.25,
        "shortfall": 0.0,
    }
    values = scalars(RECORD.flat())
    assert values["pass_rate"] == 0.5 and values["loss"] == -0.25
    assert values["fallbacks/timeout"] == 2.0 and values["graded_by/heuristic"] == 3.0
    assert values["stage_seconds/rollout"] == 0.0 and values["flagged_turns/churn"] == 0.0
    assert "kl" not in values  # the step has none (None), not a 0


def test_none_by_default_and_each_at_most_once(tmp_path: Path) -> None:
    assert run_with([]).spec.observability.trackers == []
    Trackers(run_with([]), tmp_path).log_step(RECORD)
    assert list(tmp_path.iterdir()) == []  # nothing written without trackers
    with pytest.raises(ValueError, match="each tracker at most once"):
        run_with(["mlflow", "mlflow"])
    doc = run_with(["mlflow"]).model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["spec"]["observability"]["trackers"] = ["mlflow", "mlflow"]
    assert crd_errors(doc, build_crd()) != []  # the CRD's list is a set
    with pytest.raises(ValueError):
        run_with(["neptune"])


def test_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_two_steps(run_with(["tensorboard"]), tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("pass_rate")] == [(1, 0.5), (2, 0.75)]
    assert [e.value for e in events.Scalars("fallbacks/timeout")] == [2.0, 2.0]
    assert "plots/pass_rate" in events.Tags()["images"]
    assert "spec" in "".join(events.Tags()["tensors"])


def test_mlflow_file_store(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = run_with(["mlflow"])
    log_two_steps(run, tmp_path)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name(run.metadata.name)
    (found,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(found.info.run_id, "pass_rate")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    assert found.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {"spec.json", "plots"} <= artifacts
    assert [a.path for a in client.list_artifacts(found.info.run_id, "plots")] == [
        "plots/pass_rate.png"
    ]
    spec = json.loads(Path(client.download_artifacts(found.info.run_id, "spec.json")).read_text())
    assert spec["metadata"]["name"] == run.metadata.name


def test_mlflow_tracking_uri_is_honoured(tmp_path: Path) -> None:
    elsewhere = (tmp_path / "elsewhere").resolve().as_uri()
    (tmp_path / "run").mkdir()
    log_two_steps(run_with(["mlflow"], mlflowTrackingUri=elsewhere), tmp_path / "run")
    assert (tmp_path / "elsewhere").is_dir() and not (tmp_path / "run" / "mlruns").exists()


def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = run_with(["wandb"], wandbProject="gagar-test")
    trackers = Trackers(run, tmp_path)
    trackers.log_step(RECORD)
    trackers.log_step(STEP_2)
    trackers.log_plots([plot(tmp_path)])
    (wb,) = trackers.trackers
    assert wb.run.offline and wb.run.project == "gagar-test" and wb.run.name == run.metadata.name
    # W&B commits a step's row when a later step begins (or at finish): step 1 is in the summary
    assert wb.run.summary["pass_rate"] == 0.5 and wb.run.summary["fallbacks/timeout"] == 2
    assert wb.run.config["metadata"]["name"] == run.metadata.name
    trackers.close()
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list((offline / "files" / "media" / "images" / "plots").glob("pass_rate_2_*.png"))
    (data,) = offline.glob("run-*.wandb")  # what `wandb sync` uploads later
    deadline = time.monotonic() + 30  # W&B's service process may still be writing it
    while b"0.75" not in (raw := data.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"pass_rate" in raw and b"0.75" in raw and b"fallbacks/timeout" in raw
