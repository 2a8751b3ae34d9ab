"""Experiment trackers (``spec.observability.trackers``): the same step records as
``metrics.jsonl``, the run's spec and the report's plots, logged through each tool's own library.

- ``tensorboard``: event files under ``<run dir>/tensorboard`` (``torch.utils.tensorboard``, which
  writes TensorBoard's format with the ``tensorboard`` package): scalars per step, the spec as
  text, the plots as images;
- ``mlflow``: one MLflow run per ``gagar train`` process in the experiment named after the
  GagarRun, at ``mlflowTrackingUri`` or a file store under ``<run dir>/mlruns`` (MLflow 3's file
  store is opted into with ``MLFLOW_ALLOW_FILE_STORE``): metrics per step,
  ``spec.json`` and ``plots/*.png`` as artifacts;
- ``wandb``: a W&B run under ``<run dir>/wandb``, offline unless ``WANDB_API_KEY`` is set:
  the spec as its config, metrics per step, the plots as images.

A record's fields are logged under their names in ``metrics.jsonl`` (``StepRecord.flat``); its nested
counts (``fallbacks``, ``invalid``...) become ``name/key`` scalars, and fields a step lacks (None) are
left out. Each library is imported only when the run names its tracker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from gagar.driver.record import StepRecord
from gagar.spec import GagarRun


def scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a step record, nested dicts flattened to ``name/key``."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, bool | int | float):
            out[name] = float(value)
    return out


class Tracker(Protocol):
    def log_step(self, step: int, values: dict[str, float]) -> None: ...

    def log_plots(self, step: int, plots: list[Path]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, run: GagarRun, out: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))
        spec = json.dumps(run.to_wire(), indent=2)
        self.writer.add_text("spec", f"```\n{spec}\n```")

    def log_step(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_plots(self, step: int, plots: list[Path]) -> None:
        import matplotlib.image

        for path in plots:
            image = matplotlib.image.imread(path)[..., :3]  # RGBA -> RGB, floats in [0, 1]
            self.writer.add_image(f"plots/{path.stem}", image, step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    def __init__(self, run: GagarRun, out: Path) -> None:
        from mlflow.tracking import MlflowClient

        uri = run.spec.observability.mlflow_tracking_uri or (out / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store in maintenance mode behind this opt-out; a run
            # directory's own store needs no database server
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        name = run.metadata.name
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment, run_name=name).info.run_id
        self.client.log_dict(self.run_id, run.to_wire(), "spec.json")

    def log_step(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_plots(self, step: int, plots: list[Path]) -> None:
        for path in plots:
            self.client.log_artifact(self.run_id, str(path), "plots")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    def __init__(self, run: GagarRun, out: Path) -> None:
        import wandb

        self.wandb = wandb
        online = bool(os.environ.get("WANDB_API_KEY"))
        self.run = wandb.init(
            project=run.spec.observability.wandb_project,
            name=run.metadata.name,
            dir=str(out),
            config=run.to_wire(),
            mode="online" if online else "offline",
            reinit="create_new",
        )

    def log_step(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def log_plots(self, step: int, plots: list[Path]) -> None:
        images = {f"plots/{p.stem}": self.wandb.Image(str(p)) for p in plots}
        self.run.log(images, step=step)

    def close(self) -> None:
        self.run.finish()


TRACKERS: dict[str, type] = {
    "tensorboard": TensorBoardTracker,
    "mlflow": MlflowTracker,
    "wandb": WandbTracker,
}


class Trackers:
    """The run's trackers as one: every call goes to each of them."""

    def __init__(self, run: GagarRun, out: Path) -> None:
        self.trackers: list[Tracker] = [
            TRACKERS[name](run, out) for name in run.spec.observability.trackers
        ]
        self.step = 0

    def log_step(self, record: StepRecord) -> None:
        self.step = record.step
        values = scalars(record.flat())
        for tracker in self.trackers:
            tracker.log_step(self.step, values)

    def log_plots(self, plots: Iterable[Path]) -> None:
        existing = [p for p in plots if p.exists()]
        for tracker in self.trackers:
            tracker.log_plots(self.step, existing)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []
