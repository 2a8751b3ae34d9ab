"""``gagar grader sft-job``: the grader's SFT as a Kubernetes Job (printed, for ``kubectl apply``).

The Job runs ``gagar grader sft-data`` (an init container, when no ``--data`` is given) and then
``gagar grader sft`` in gagar's trainer image (the one image with torch, transformers and the
Megatron-Core learner), with the operator's pod hardening (``pod_security``,
``container_security``), no service-account token, and the data, the caches and the trained HF
folder on a PersistentVolumeClaim mounted at ``/data``. The SFT's flags after ``--`` are checked
with ``gagar grader sft``'s own parser, so the Job's command is one the CLI takes."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from gagar.driver.grader_eval import register_sft
from gagar.operator.builders.common import container_security, pod_security
from gagar.spec import TrainerSpec

MOUNT = "/data"
GPU = "nvidia.com/gpu"
TTL_S = 7 * 24 * 3600  # the finished Job (and its pod's logs) kept a week
# flags the Job sets itself: where the data and the folder are on the PVC
OWN_FLAGS = ("--out", "--data", "--cache")
# sft's flags that sft-data takes too (the same train groups, the same records)
SHARED = ("groups", "seed", "per_group", "pools", "per_pool")


@dataclass(frozen=True)
class SftJob:
    name: str
    image: str
    pvc: str
    out: str  # on the PVC
    data: str | None = None  # on the PVC; None: built by sft-data first
    gpus: int = 0
    cpu: str = "4"
    memory: str = "32Gi"
    sft_args: list[str] = field(default_factory=list)  # ``gagar grader sft``'s other flags


def on_pvc(path: str) -> str:
    """``path`` (relative to the PVC's root) where the Job's pod mounts it."""
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"{path!r}: a path inside the PVC (relative, no '..')")
    return str(PurePosixPath(MOUNT) / rel)


def sft_parser() -> argparse.ArgumentParser:
    """``gagar grader sft``'s parser, alone: the Job's command is checked against it."""
    root = argparse.ArgumentParser(prog="gagar grader")
    register_sft(root.add_subparsers(dest="cmd"))
    return root


def _commands(job: SftJob) -> tuple[list[str] | None, list[str]]:
    """The init container's ``sft-data`` command (None with ``--data``) and ``sft``'s."""
    if job.gpus not in (0, 1):  # one learner process: a second GPU would sit idle, paid for
        raise ValueError(f"--gpus {job.gpus}: the grader's SFT runs one process, on 0 or 1 GPU")
    if any(a.split("=")[0] in OWN_FLAGS for a in job.sft_args):
        raise ValueError(f"{', '.join(OWN_FLAGS)} are the Job's own (--data, --out)")
    out = on_pvc(job.out)
    cache = f"{MOUNT}/.cache/gagar/grader-bench"
    data = on_pvc(job.data) if job.data else f"{out}.records.jsonl"
    sft = ["gagar", "grader", "sft", *job.sft_args, "--data", data, "--cache", cache, "--out", out]
    args = sft_parser().parse_args(sft[2:])  # a flag sft does not take fails here, not in the pod
    if job.data:
        return None, sft
    shared = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in SHARED]
    return ["gagar", "grader", "sft-data", *shared, "--cache", cache, "--out", data], sft


def _container(name: str, job: SftJob, command: list[str]) -> dict[str, Any]:
    res: dict[str, Any] = {"cpu": job.cpu, "memory": job.memory}
    if job.gpus:
        res[GPU] = str(job.gpus)
    return {
        "name": name,
        "image": job.image,
        "command": command,
        # HOME on the PVC: the HF hub's and gagar's caches (the base model, the groups) persist
        "env": [{"name": "HOME", "value": MOUNT}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": {"requests": res, "limits": res},
        "securityContext": container_security(),
        "volumeMounts": [{"name": "data", "mountPath": MOUNT}],
    }


def build_sft_job(job: SftJob) -> dict[str, Any]:
    """The batch/v1 Job of ``job`` (pure)."""
    data_cmd, sft_cmd = _commands(job)
    labels = {"app.kubernetes.io/name": "gagar", "app.kubernetes.io/component": "grader-sft"}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": pod_security(),
        "containers": [_container("sft", job, sft_cmd)],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": job.pvc}}],
    }
    if data_cmd is not None:
        pod["initContainers"] = [_container("sft-data", job, data_cmd)]
    if job.gpus:
        pod["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job.name, "labels": labels},
        "spec": {
            "backoffLimit": 0,  # a failed SFT is read, not retried from scratch
            "ttlSecondsAfterFinished": TTL_S,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def run_sft_job(args: argparse.Namespace) -> int:
    sft_args = args.sft_args[1:] if args.sft_args[:1] == ["--"] else args.sft_args
    job = SftJob(
        args.name, args.image, args.pvc, args.out, args.data,
        args.gpus, args.cpu, args.memory, sft_args,
    )  # fmt: skip
    try:
        manifest = build_sft_job(job)
    except ValueError as e:  # a flag sft does not take: argparse has said so and exited
        raise SystemExit(f"gagar grader sft-job: {e}") from None
    print(json.dumps(manifest, indent=2))
    return 0


def register(grader_sub: argparse._SubParsersAction) -> None:
    """``gagar grader sft-job``: print the Job (JSON, which ``kubectl apply -f -`` takes)."""
    p = grader_sub.add_parser(
        "sft-job", help="print a Kubernetes Job that runs the grader's SFT on a cluster"
    )
    p.add_argument("--image", default=TrainerSpec().image, help="gagar's trainer image")
    p.add_argument("--pvc", required=True, help="the PersistentVolumeClaim of data and output")
    p.add_argument("--out", required=True, help="the trained HF folder, a path on the PVC")
    p.add_argument("--data", help="sft-data's records on the PVC (default: built by the Job)")
    p.add_argument("--name", default="gagar-grader-sft", help="the Job's name")
    p.add_argument(
        "--gpus", type=int, default=0, help="0 or 1 GPU (nvidia.com/gpu) for the one learner"
    )
    p.add_argument("--cpu", default="4", help="CPU request and limit")
    p.add_argument("--memory", default="32Gi", help="memory request and limit")
    p.add_argument("sft_args", nargs=argparse.REMAINDER, help="-- then `gagar grader sft` flags")
    p.set_defaults(func=run_sft_job)
