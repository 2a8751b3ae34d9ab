"""The run's ConfigMaps (validated sub-specs; trainer progress) and its checkpoint volume.

``<run>-config`` holds the run as the operator validated it (``to_wire()``, defaults filled in) in
one document, ``run.json``, which every pod reads: each component sees exactly what was validated.
With task environments on sandbox pods, ``sandbox-pools.json`` beside it says where each
environment's executor pool is (``{"web": "http://<run>-sandbox-web:8090"}``): the trainer and
grader send a session of that environment there, the rest to ``GAGAR_SANDBOX_URL``. The pools of
task images the trainer asked for (``sandboxImages`` in ``<run>-progress``) are listed there too,
under ``image:<reference>`` (``builders.images``).
``<run>-progress`` is where the trainer reports step, policy version and checkpoints (pods never
patch the GagarRun): the operator applies it with metadata only, so the trainer's ``data`` is never
overwritten (server-side apply only touches the fields a manager sends).
"""

from __future__ import annotations

import json
from typing import Any

from gagar import RUN_FILE, SANDBOX_POOLS_FILE
from gagar.operator.builders.common import (
    BuildContext,
    Manifest,
    checkpoint_access_mode,
    checkpoint_claim,
    metadata,
    name,
    obj,
)
from gagar.operator.builders.images import image_pool_urls
from gagar.operator.builders.sandbox import environment_pools, pool_url
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


def config_data(run: GagarRun, ctx: BuildContext | None = None) -> dict[str, str]:
    """ConfigMap data: the whole run, validated (``run.json``), and where each task environment's
    and task image's executor pool is (``sandbox-pools.json``, when it has some)."""
    spec = run.spec
    meta = {"name": run.metadata.name}
    if run.metadata.namespace:
        meta["namespace"] = run.metadata.namespace
    wire: dict[str, Any] = {
        "apiVersion": run.api_version,
        "kind": run.kind,
        "metadata": meta,
    }
    out = {RUN_FILE: _dump({**wire, "spec": spec.to_wire()})}
    if pools := sandbox_pools(run, ctx or BuildContext()):
        out[SANDBOX_POOLS_FILE] = _dump(pools)
    return out


def sandbox_pools(run: GagarRun, ctx: BuildContext) -> dict[str, str]:
    """Each task environment's executor pool (its name -> its Service's URL) and each task
    image's (``image:<reference>`` -> URL, ``builders.images``)."""
    envs = {p.environment or "": pool_url(p.name) for p in environment_pools(run)}
    return {**envs, **image_pool_urls(run, ctx)}


def build_config_map(run: GagarRun, ctx: BuildContext) -> Manifest:
    meta = metadata(run, ctx, name(run, "config"), "config")
    return obj("v1", "ConfigMap", meta, data=config_data(run, ctx))


def build_progress_config_map(run: GagarRun, ctx: BuildContext) -> Manifest:
    """Metadata only: the trainer owns ``data`` (see module docstring)."""
    return obj("v1", "ConfigMap", metadata(run, ctx, name(run, "progress"), "progress"))


def build_checkpoint_pvc(run: GagarRun, ctx: BuildContext) -> list[Manifest]:
    """The checkpoint PVC, unless checkpoints go to an existing claim; owned by the run
    only under ``checkpoint.retention: Delete``."""
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
    if ckpt.retention == "Retain":
        # not owned: the garbage collector leaves it when the run goes, and a run of the same
        # name adopts it again (server-side apply of the same name), resuming from it
        del meta["ownerReferences"]
    return [obj("v1", "PersistentVolumeClaim", meta, spec=spec)]
