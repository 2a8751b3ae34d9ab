"""The run's ConfigMaps (validated sub-specs; trainer progress) and its checkpoint volume.

``<run>-config`` holds the spec as the operator validated it (``to_wire()``, defaults filled in),
one JSON document per component, so every component reads exactly what was validated.
``<run>-progress`` is where the trainer reports step, policy version and checkpoints (pods never
patch the GagarRun): the operator applies it with metadata only, so the trainer's ``data`` is never
overwritten (server-side apply only touches the fields a manager sends).
"""

from __future__ import annotations

import json
from typing import Any

from gagar import RUN_FILE
from gagar.operator.builders.common import (
    BuildContext,
    Manifest,
    checkpoint_claim,
    metadata,
    name,
    obj,
)
from gagar.spec import GagarRun

# Keys the trainer writes into <run>-progress (all strings; the status calculator parses them).
PROGRESS_KEYS = (
    "step",
    "policyVersion",
    "rolloutPolicyVersion",
    "checkpointStep",
    "checkpointUri",
    "checkpointTime",
    "startTime",
)


def _dump(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def config_data(run: GagarRun) -> dict[str, str]:
    """ConfigMap data: the whole run and one document per sub-spec."""
    spec = run.spec
    meta = {"name": run.metadata.name}
    if run.metadata.namespace:
        meta["namespace"] = run.metadata.namespace
    wire: dict[str, Any] = {
        "apiVersion": run.api_version,
        "kind": run.kind,
        "metadata": meta,
    }
    parts = {
        RUN_FILE: {**wire, "spec": spec.to_wire()},
        "model.json": spec.model.to_wire(),
        "algorithm.json": spec.algorithm.to_wire(),
        "trainer.json": spec.trainer.to_wire(),
        "rollout.json": spec.rollout.to_wire(),
        "grader.json": spec.grader.to_wire(),
        "sandbox.json": spec.sandbox.to_wire(),
        "dataset.json": spec.dataset.to_wire(),
        "observability.json": spec.observability.to_wire(),
    }
    return {key: _dump(value) for key, value in parts.items()}


def build_config_map(run: GagarRun, ctx: BuildContext) -> Manifest:
    meta = metadata(run, ctx, name(run, "config"), "config")
    return obj("v1", "ConfigMap", meta, data=config_data(run))


def build_progress_config_map(run: GagarRun, ctx: BuildContext) -> Manifest:
    """Metadata only: the trainer owns ``data`` (see module docstring)."""
    return obj("v1", "ConfigMap", metadata(run, ctx, name(run, "progress"), "progress"))


def checkpoint_access_mode(run: GagarRun) -> str:
    """ReadWriteMany when several pods on different nodes mount it (multi-node trainer, or rollout
    replicas reading published weights), else ReadWriteOnce."""
    shared = run.spec.rollout.endpoint is None and run.spec.rollout.weight_sync.publish_safetensors
    return "ReadWriteMany" if run.spec.trainer.nodes > 1 or shared else "ReadWriteOnce"


def build_checkpoint_pvc(run: GagarRun, ctx: BuildContext) -> list[Manifest]:
    """The checkpoint PVC, unless checkpoints go to a URI or an existing claim."""
    ckpt = run.spec.trainer.checkpoint
    if checkpoint_claim(run) != name(run, "checkpoints"):
        return []
    spec: dict[str, Any] = {
        "accessModes": [checkpoint_access_mode(run)],
        "resources": {"requests": {"storage": ckpt.volume_size}},
    }
    if ckpt.storage_class_name:
        spec["storageClassName"] = ckpt.storage_class_name
    meta = metadata(run, ctx, name(run, "checkpoints"), "checkpoints")
    return [obj("v1", "PersistentVolumeClaim", meta, spec=spec)]
