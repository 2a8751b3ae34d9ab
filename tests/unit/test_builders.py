"""Pure builders: structure and invariants of every child manifest."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gagar.env import EXIT_PERMANENT
from gagar.manifest import load_run
from gagar.operator.builders import BuildContext, build_all
from gagar.operator.builders.common import Scraper
from gagar.operator.builders.pools import transport, vllm_command
from gagar.spec import GagarRun

ROOT = Path(__file__).resolve().parents[2]
UID = "1234-uid"
ALL_CRDS = frozenset({"monitoring.coreos.com", "keda.sh", "jobset.x-k8s.io"})


def example(name: str, **changes: Any) -> GagarRun:
    """An example run with ``changes`` merged into its spec (dotted keys: "rollout.replicas")."""
    raw = load_run(ROOT / "examples" / f"{name}.yaml").model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    raw.pop("status", None)
    for dotted, value in changes.items():
        node = raw["spec"]
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return GagarRun.model_validate(raw)


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.mark.parametrize("name", ["local", "single-gpu", "flash-moe"])
def test_labels_owner_references_and_unique_names(name: str) -> None:
    run = example(name)
    objs = build_all(run, BuildContext(uid=UID, crds=ALL_CRDS))
    keys = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys))
    for o in objs:
        meta = o["metadata"]
        assert meta["labels"]["app.kubernetes.io/name"] == "gagar"
        assert meta["labels"]["app.kubernetes.io/instance"] == run.metadata.name
        assert meta["labels"]["gagar.dev/run"] == run.metadata.name
        assert meta["labels"]["app.kubernetes.io/component"]
        assert meta.get("namespace") == run.metadata.namespace
        if o["kind"] == "PersistentVolumeClaim":  # checkpoints outlive the run (Retain)
            assert "ownerReferences" not in meta
            continue
        (ref,) = meta["ownerReferences"]
        assert ref == {
            "apiVersion": "gagar.dev/v1alpha1",
            "kind": "GagarRun",
            "name": run.metadata.name,
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert len(meta["name"]) <= 63


def test_builders_are_deterministic() -> None:
    run = example("flash-moe")
    ctx = BuildContext(uid=UID, crds=ALL_CRDS)
    assert build_all(run, ctx) == build_all(run, ctx)


def test_trainer_indexed_job() -> None:
    run = example("single-gpu", **{"trainer.nodes": 2, "trainer.processesPerNode": 4})
    objs = build_all(run, BuildContext(uid=UID, attempt=2))
    job = one(objs, "Job", "qwen3-swe-1node-trainer")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2
    assert spec["backoffLimit"] == 0
    assert "suspend" not in spec  # never written against Kueue; the server defaults it to false
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    assert job["metadata"]["annotations"]["gagar.dev/attempt"] == "2"
    rules = spec["podFailurePolicy"]["rules"]
    # one rule: the permanent exit code fails the Job; anything else (an eviction too) counts
    # against backoffLimit 0, failing the Job at once so that no rank waits for a lost peer
    assert [r["action"] for r in rules] == ["FailJob"]
    assert rules[0]["onExitCodes"]["values"] == [EXIT_PERMANENT]
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "qwen3-swe-1node-trainer-rdzv"
    assert pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    # torchrun's launcher in process, so that a worker's EXIT_PERMANENT reaches the Job
    assert c["command"] == ["python", "-m", "gagar.driver.launch"]
    assert c["args"][-3:] == ["-m", "gagar.driver.worker", "--config-dir=/etc/gagar/config"]
    assert "--nnodes=2" in c["args"] and "--nproc-per-node=4" in c["args"]
    assert "--node-rank=$(NODE_RANK)" in c["args"]
    assert "--master-addr=qwen3-swe-1node-trainer-0.qwen3-swe-1node-trainer-rdzv" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert "job-completion-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    svc = one(objs, "Service", "qwen3-swe-1node-trainer-rdzv")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    labels = spec["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())
    claim = {v["name"]: v for v in pod["volumes"]}["checkpoints"]["persistentVolumeClaim"]
    assert claim == {"claimName": "qwen3-swe-1node-checkpoints"}


def _trainer_container(run: GagarRun) -> dict[str, Any]:
    job = one(build_all(run), "Job", f"{run.metadata.name}-trainer")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return c


def test_trainer_env_points_at_the_run_services() -> None:
    c = _trainer_container(example("single-gpu"))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GAGAR_ROLLOUT_URL"] == "http://qwen3-swe-1node-rollout:8000"
    assert env["GAGAR_ROLLOUT_SERVICE"] == "qwen3-swe-1node-rollout"
    assert env["GAGAR_GRADER_URL"] == "http://qwen3-swe-1node-grader:8080"
    assert env["GAGAR_SANDBOX_URL"] == "http://qwen3-swe-1node-sandbox:8090"
    assert env["GAGAR_RUN_DIR"] == "/gagar/checkpoints"
    assert env["GAGAR_CHECKPOINT_URI"] == "pvc://qwen3-swe-1node-checkpoints"
    assert env["GAGAR_PROGRESS_CONFIGMAP"] == "qwen3-swe-1node-progress"
    assert (
        env["GAGAR_WEIGHT_TRANSPORT"] == "gagar-cpu"
    )  # auto on GPU replicas: what the trainer syncs
    # the pvc:// base model is mounted in the trainer too, and the trainer is told where
    assert env["GAGAR_MODEL_DIR"] == "/gagar/base-model/Qwen3-1.7B"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert (
        mounts["base-model"] == "/gagar/base-model"
        and mounts["checkpoints"] == "/gagar/checkpoints"
    )
    # every Service the trainer is pointed at is one the operator builds
    services = {o["metadata"]["name"] for o in by_kind(build_all(example("single-gpu")), "Service")}
    for key in ("GAGAR_ROLLOUT_URL", "GAGAR_GRADER_URL", "GAGAR_SANDBOX_URL"):
        assert env[key].removeprefix("http://").split(":")[0] in services


def test_trainer_env_with_external_endpoints_and_local_sandboxes() -> None:
    run = example(
        "local",
        **{"rollout.replicas": None, "rollout.endpoint": "http://vllm.example:8000",
           "grader.replicas": None, "grader.endpoint": "http://llm.example/v1"},
    )  # fmt: skip
    env = {e["name"]: e.get("value") for e in _trainer_container(run)["env"]}
    assert env["GAGAR_ROLLOUT_URL"] == "http://vllm.example:8000"
    assert "GAGAR_ROLLOUT_SERVICE" not in env  # no pool: weights go to the endpoint itself
    assert "GAGAR_GRADER_URL" not in env  # no grader pool: the trainer grades in process
    assert "GAGAR_SANDBOX_URL" not in env and "GAGAR_MODEL_DIR" not in env
    assert env["GAGAR_WEIGHT_TRANSPORT"] == "gagar-cpu"


def test_jobset_only_when_asked_and_installed() -> None:
    run = example("flash-moe")
    assert run.spec.trainer.use_job_set
    without = build_all(run, BuildContext())
    assert by_kind(without, "JobSet") == [] and len(by_kind(without, "Job")) == 1
    objs = build_all(run, BuildContext(crds=ALL_CRDS))
    assert by_kind(objs, "Job") == []
    (js,) = by_kind(objs, "JobSet")
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    policy = js["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 5
    # a permanent exit (podFailurePolicy FailJob on EXIT_PERMANENT) fails the set, no restarts
    # and so does an attempt past trainer.activeDeadlineSeconds
    rules = [(r["action"], r["onJobFailureReasons"]) for r in policy["rules"]]
    assert rules == [("FailJobSet", ["PodFailurePolicy"]), ("FailJobSet", ["DeadlineExceeded"])]
    assert js["spec"]["network"]["subdomain"] == "flash-moe-310b-trainer-rdzv"
    (rj,) = js["spec"]["replicatedJobs"]
    assert rj["template"]["spec"]["completions"] == 32
    args = rj["template"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--master-addr=flash-moe-310b-trainer-node-0-0.flash-moe-310b-trainer-rdzv" in args
    # JobSet creates its own headless Service
    assert not any(o["metadata"]["name"].endswith("-rdzv") for o in by_kind(objs, "Service"))
    assert not build_all(example("single-gpu"), BuildContext(crds=ALL_CRDS)) == []
    assert by_kind(build_all(example("single-gpu"), BuildContext(crds=ALL_CRDS)), "JobSet") == []


def test_fixed_replicas_written() -> None:
    objs = build_all(example("single-gpu"))
    assert one(objs, "Deployment", "qwen3-swe-1node-rollout")["spec"]["replicas"] == 2
    assert one(objs, "Deployment", "qwen3-swe-1node-grader")["spec"]["replicas"] == 1
    assert one(objs, "Deployment", "qwen3-swe-1node-sandbox")["spec"]["replicas"] == 32
    assert by_kind(objs, "HorizontalPodAutoscaler") == by_kind(objs, "ScaledObject") == []


def test_autoscaled_pool_omits_replicas_keda() -> None:
    objs = build_all(example("flash-moe"), BuildContext(crds=ALL_CRDS))
    for pool in ("rollout", "grader"):
        dep = one(objs, "Deployment", f"flash-moe-310b-{pool}")
        assert "replicas" not in dep["spec"]
        so = one(objs, "ScaledObject", f"flash-moe-310b-{pool}")
        assert so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        assert "paused-replicas" not in json.dumps(so["metadata"])
    rq = one(objs, "ScaledObject", "flash-moe-310b-rollout")["spec"]["triggers"][0]["metadata"]
    assert (
        rq["query"]
        == 'sum(vllm:num_requests_waiting{namespace="gagar",service="flash-moe-310b-rollout"})'
    )
    assert rq["threshold"] == "8"
    gq = one(objs, "ScaledObject", "flash-moe-310b-grader")["spec"]["triggers"][0]["metadata"]
    assert gq["query"] == 'sum(gagar_grader_queue_depth{namespace="gagar",run="flash-moe-310b"})'
    assert one(objs, "ScaledObject", "flash-moe-310b-rollout")["spec"]["minReplicaCount"] == 4


def hpa_run(**more: Any) -> GagarRun:
    auto = {"minReplicas": 1, "maxReplicas": 6, "backend": "hpa", "targetQueueDepth": 2.5}
    return example("local", **{"rollout.replicas": None, "rollout.autoscaling": auto}, **more)


def test_autoscaled_pool_hpa() -> None:
    objs = build_all(hpa_run())
    assert "replicas" not in one(objs, "Deployment", "local-rollout")["spec"]
    hpa = one(objs, "HorizontalPodAutoscaler", "local-rollout")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 6)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "2500m"}
    assert one(objs, "Deployment", "local-grader")["spec"]["replicas"] == 1


def test_suspend_stops_trainer_and_pools() -> None:
    objs = build_all(example("single-gpu", suspend=True))
    assert one(objs, "Job", "qwen3-swe-1node-trainer")["spec"]["suspend"] is True
    for pool in ("rollout", "grader", "sandbox"):
        assert one(objs, "Deployment", f"qwen3-swe-1node-{pool}")["spec"]["replicas"] == 0
    keda = build_all(example("flash-moe", suspend=True), BuildContext(crds=ALL_CRDS))
    for pool in ("rollout", "grader"):
        so = one(keda, "ScaledObject", f"flash-moe-310b-{pool}")
        assert so["metadata"]["annotations"] == {"autoscaling.keda.sh/paused-replicas": "0"}
        assert "replicas" not in one(keda, "Deployment", f"flash-moe-310b-{pool}")["spec"]
    # without KEDA (the run is Stalled) a suspend still stops the pools: the operator's zero
    no_keda = build_all(example("flash-moe", suspend=True))
    assert by_kind(no_keda, "ScaledObject") == []
    for pool in ("rollout", "grader"):
        assert one(no_keda, "Deployment", f"flash-moe-310b-{pool}")["spec"]["replicas"] == 0
    hpa = build_all(hpa_run(suspend=True))
    assert by_kind(hpa, "HorizontalPodAutoscaler") == []  # an HPA cannot hold 0
    assert one(hpa, "Deployment", "local-rollout")["spec"]["replicas"] == 0


def test_terminal_releases_accelerators() -> None:
    for run in (example("flash-moe"), hpa_run(), example("single-gpu")):
        objs = build_all(run, BuildContext(state="terminal"))
        assert by_kind(objs, "HorizontalPodAutoscaler") == by_kind(objs, "ScaledObject") == []
        for dep in by_kind(objs, "Deployment"):
            assert dep["spec"]["replicas"] == 0, dep["metadata"]["name"]


def test_endpoint_pool_builds_nothing() -> None:
    run = example(
        "local",
        **{
            "rollout.replicas": None,
            "rollout.endpoint": "http://vllm:8000/v1",
            "grader.replicas": None,
            "grader.endpoint": "http://g:8000/v1",
        },
    )
    objs = build_all(run)
    names = {o["metadata"]["name"] for o in objs}
    assert not {n for n in names if n.endswith(("-rollout", "-grader"))}


def test_sandbox_pods_are_hardened() -> None:
    objs = build_all(example("single-gpu"))
    pod = one(objs, "Deployment", "qwen3-swe-1node-sandbox")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"]  # what each isolation adds: the next test
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    assert {m["name"] for m in c["volumeMounts"] if m["mountPath"] in writable} <= empty_dirs
    sa = one(objs, "ServiceAccount", "qwen3-swe-1node-sandbox")
    assert sa["automountServiceAccountToken"] is False
    np = one(objs, "NetworkPolicy", "qwen3-swe-1node-sandbox")["spec"]
    assert np["egress"] == [] and set(np["policyTypes"]) == {"Ingress", "Egress"}
    sources = [
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for p in np["ingress"][0]["from"]
    ]
    assert sorted(sources) == ["grader", "trainer"]
    local = {o["metadata"]["name"] for o in by_kind(build_all(example("local")), "NetworkPolicy")}
    assert local == {"local-rollout", "local-grader", "local-trainer"}  # no sandbox pods


# Pod Security "baseline" lets a pod add only these capabilities.
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD"}
BASELINE_CAPS |= {"NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


@pytest.mark.parametrize("mode", ["bubblewrap", "pod", "auto"])
def test_sandbox_isolation_sets_the_executors_mode_and_identity(mode: str) -> None:
    run = example("single-gpu", **{"sandbox.isolation": mode})
    dep = one(build_all(run), "Deployment", "qwen3-swe-1node-sandbox")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert f"--isolation={mode}" in c["args"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"  # the refusal's reason
    assert "procMount" not in json.dumps(pod)  # baseline forbids an unmasked /proc
    assert not sc["privileged"] and not sc["allowPrivilegeEscalation"]
    if mode == "bubblewrap":  # bubblewrap makes its own user namespace: nothing to add
        assert sc["runAsNonRoot"] and pod["securityContext"]["runAsNonRoot"]
        assert sc["capabilities"] == {"drop": ["ALL"]}
    else:  # the pod is the boundary; root only to give each session a uid of its own
        assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
        assert set(sc["capabilities"]["add"]) <= BASELINE_CAPS
        assert {"SETUID", "SETGID", "KILL"} <= set(sc["capabilities"]["add"])


def test_rbac_least_privilege() -> None:
    objs = build_all(example("single-gpu"))
    roles = by_kind(objs, "Role")
    assert [r["metadata"]["name"] for r in roles] == ["qwen3-swe-1node-trainer"]
    for rule in roles[0]["rules"]:
        assert "gagar.dev" not in rule["apiGroups"]
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        if rule["resources"] == ["configmaps"]:
            assert rule["resourceNames"]
        if {"patch", "update"} & set(rule["verbs"]):
            assert rule["resourceNames"] == ["qwen3-swe-1node-progress"]
    (rb,) = by_kind(objs, "RoleBinding")
    assert rb["subjects"] == [
        {"kind": "ServiceAccount", "name": "qwen3-swe-1node-trainer", "namespace": "gagar"}
    ]
    for pool in ("rollout", "grader"):
        pod = one(objs, "Deployment", f"qwen3-swe-1node-{pool}")["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False


def test_config_map_holds_the_validated_run() -> None:
    run = example("flash-moe")
    objs = build_all(run)
    data = one(objs, "ConfigMap", "flash-moe-310b-config")["data"]
    assert set(data) == {"run.json"}  # the one document every pod reads
    whole = json.loads(data["run.json"])
    assert GagarRun.model_validate(whole).spec == run.spec
    progress = one(objs, "ConfigMap", "flash-moe-310b-progress")
    assert "data" not in progress  # the trainer owns data


def test_checkpoint_pvc() -> None:
    objs = build_all(example("single-gpu"))
    pvc = one(objs, "PersistentVolumeClaim", "qwen3-swe-1node-checkpoints")
    assert "storageClassName" not in pvc["spec"]  # the cluster's default class
    assert pvc["spec"]["resources"]["requests"]["storage"] == "500Gi"
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]  # one trainer node: what it offers
    (moe,) = by_kind(build_all(example("flash-moe")), "PersistentVolumeClaim")
    assert moe["spec"]["resources"]["requests"]["storage"] == "30Ti"
    assert moe["spec"]["storageClassName"] == "fast-rwx"
    assert moe["spec"]["accessModes"] == ["ReadWriteMany"]  # 32 trainer nodes mount it
    existing = example("single-gpu", **{"trainer.checkpoint.existingClaim": "ckpts"})
    objs = build_all(existing)
    assert by_kind(objs, "PersistentVolumeClaim") == []
    pod = one(objs, "Job", "qwen3-swe-1node-trainer")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["checkpoints"]["persistentVolumeClaim"][
        "claimName"
    ] == "ckpts"


def test_checkpoint_pvc_outlives_the_run_unless_asked() -> None:
    """``retention: Retain`` (the default): no owner, so the garbage collector never deletes the
    checkpoints with the run; ``Delete``: owned by the run, as the run's other children."""
    ctx = BuildContext(uid=UID)
    (kept,) = by_kind(build_all(example("single-gpu"), ctx), "PersistentVolumeClaim")
    assert "ownerReferences" not in kept["metadata"]
    assert kept["metadata"]["labels"]["gagar.dev/run"] == "qwen3-swe-1node"
    deleted = example("single-gpu", **{"trainer.checkpoint.retention": "Delete"})
    (owned,) = by_kind(build_all(deleted, ctx), "PersistentVolumeClaim")
    assert owned["metadata"]["ownerReferences"][0]["uid"] == UID


def test_monitors_follow_crds_and_mode() -> None:
    run = example("single-gpu")
    assert by_kind(build_all(run), "ServiceMonitor") == []
    objs = build_all(run, BuildContext(crds=frozenset({"monitoring.coreos.com"})))
    monitors = {m["metadata"]["name"]: m for m in by_kind(objs, "ServiceMonitor")}
    assert sorted(monitors) == [f"qwen3-swe-1node-{c}" for c in ("grader", "rollout", "sandbox")]
    assert len(by_kind(objs, "PodMonitor")) == 1
    # the sandbox pods' metrics port is open to Prometheus; the executor only to the run's pods
    sandbox = next(
        o for o in objs if o["kind"] == "Service" and o["metadata"]["name"].endswith("-sandbox")
    )
    assert monitors["qwen3-swe-1node-sandbox"]["spec"]["endpoints"][0]["port"] == "metrics"
    assert "metrics" in {p["name"] for p in sandbox["spec"]["ports"]}
    policy = by_kind(objs, "NetworkPolicy")
    rules = next(p for p in policy if p["metadata"]["name"].endswith("-sandbox"))["spec"]["ingress"]
    prometheus = Scraper().peer()  # the named Prometheus only, never every pod of the cluster
    assert rules[1] == {"from": [prometheus], "ports": [{"protocol": "TCP", "port": 9400}]}
    assert "from" in rules[0]
    off = example("single-gpu", **{"observability.monitors": "disabled"})
    assert by_kind(build_all(off, BuildContext(crds=ALL_CRDS)), "PodMonitor") == []
    on = example("single-gpu", **{"observability.monitors": "enabled"})
    assert len(by_kind(build_all(on, BuildContext(crds=ALL_CRDS)), "PodMonitor")) == 1
    assert by_kind(build_all(on), "PodMonitor") == []  # without the CRDs: Stalled, none built


def _opt(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_rollout_vllm_weight_transfer() -> None:
    objs = build_all(example("single-gpu"))
    (c,) = one(objs, "Deployment", "qwen3-swe-1node-rollout")["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert json.loads(_opt(c["args"], "--weight-transfer-config")) == {
        "backend": "gagar_safetensors"  # auto on GPU replicas too: the trainer's transport
    }
    assert _opt(c["args"], "--logprobs-mode") == "raw_logprobs"  # exact log-probs, as embedded
    assert _opt(c["args"], "--dtype") == "bfloat16"  # the trainer's dtype on GPU replicas
    assert _opt(c["args"], "--served-model-name") == "policy"
    assert transport(example("local")) == "gagar-cpu"  # auto without GPUs
    local = one(build_all(example("local")), "Deployment", "local-rollout")
    (cpu,) = local["spec"]["template"]["spec"]["containers"]
    # vLLM knows gagar's CPU transport by the name its plugin registers
    assert json.loads(_opt(cpu["args"], "--weight-transfer-config")) == {
        "backend": "gagar_safetensors"
    }
    assert _opt(cpu["args"], "--dtype") == "float32"  # CPU: the trainer's float32 parameters
    grader = one(objs, "Deployment", "qwen3-swe-1node-grader")["spec"]["template"]["spec"]
    names = [x["name"] for x in grader["containers"]]
    assert names == ["grader", "model"]
    service, model = grader["containers"]
    assert [*service["command"], *service["args"][:2]] == ["gagar", "grader", "serve"]
    assert "--config-dir=/etc/gagar/config" in service["args"]
    assert _opt(model["args"], "--served-model-name") == "grader"
    assert _opt(model["args"], "--tool-call-parser") == "hermes"  # the grader calls tools
    assert "--weight-transfer-config" not in model["args"]  # a fixed model
    heur = one(build_all(example("local")), "Deployment", "local-grader")["spec"]["template"][
        "spec"
    ]
    assert [x["name"] for x in heur["containers"]] == ["grader"]


def _run_entry(tmp_path: Path, command: list[str], args: list[str]) -> str:
    """Run a vLLM entry script with a fake ``vllm`` that prints its arguments."""
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        [*command, *args], env=env, capture_output=True, text=True, timeout=10, check=True
    )
    return out.stdout


def test_vllm_entry_script_boots_base_model(tmp_path: Path) -> None:
    args = ['--x={"a": 1}', "--served-model-name", "policy"]
    out = _run_entry(tmp_path, vllm_command("/models/base dir"), args)
    assert out.split()[:2] == ["serve", "/models/base"]  # quoting keeps the space in one arg
    assert '--x={"a": 1}' in out and "--served-model-name policy" in out
    plain = _run_entry(tmp_path, vllm_command("m", published=False), ["--host", "0.0.0.0"])
    assert plain.startswith("serve m --host 0.0.0.0")


def test_pure_modules_import_no_io_libraries() -> None:
    """Builders, observe and status load without kopf, kubernetes, HTTP or distributed code."""
    code = (
        "import sys, gagar.operator.builders, gagar.operator.status, gagar.operator.observe\n"
        "bad = ('kopf', 'kubernetes', 'httpx', 'requests', 'aiohttp', 'vllm', 'megatron', 'gagar.sandbox', 'torch')\n"
        "print([m for m in sys.modules if m.startswith(bad)])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_grader_model_preset_is_pulled_by_its_hub_name_in_a_cluster(tmp_path: Path) -> None:
    """``gagar train`` resolves ``grader.model: smollm2-135m`` offline; a cluster's grader pod
    serves the same model by its Hugging Face Hub name (a bare preset name is no model vLLM knows)."""
    run = example("single-gpu", **{"grader.model": "smollm2-135m", "grader.endpoint": None})
    spec = one(build_all(run), "Deployment", "qwen3-swe-1node-grader")["spec"]["template"]["spec"]
    (model,) = [c for c in spec["containers"] if c["name"] == "model"]
    out = _run_entry(tmp_path, model["command"], model["args"])
    assert out.split()[:2] == ["serve", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert "--served-model-name grader" in out


OVERLAY = {
    "labels": {"team": "rl"},
    "annotations": {"note": "x"},
    "nodeSelector": {"pool": "gpu"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "priorityClassName": "high",
    "imagePullSecrets": [{"name": "regcred"}],
    "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}],
    "envFrom": [{"secretRef": {"name": "s3"}}],
    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "swe"}}],
    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    "serviceAccountAnnotations": {"iam.gke.io/gcp-service-account": "g@p.iam"},
}
SCHEDULING = {k: OVERLAY[k] for k in ("labels", "nodeSelector", "tolerations", "priorityClassName")}


def _templates(objs: list[dict[str, Any]], run: str) -> dict[str, dict[str, Any]]:
    job = one(objs, "Job", f"{run}-trainer")["spec"]["template"]
    deps = {c: one(objs, "Deployment", f"{run}-{c}")["spec"]["template"] for c in
            ("rollout", "grader", "sandbox")}  # fmt: skip
    return {"trainer": job, **deps}


def test_pod_template_overlays_every_component() -> None:
    run = example(
        "single-gpu",
        **{f"{c}.podTemplate": OVERLAY for c in ("trainer", "rollout", "grader")},
        **{"sandbox.podTemplate": SCHEDULING},
    )
    objs = build_all(run, BuildContext(uid=UID))
    for component, tpl in _templates(objs, "qwen3-swe-1node").items():
        spec, labels = tpl["spec"], tpl["metadata"]["labels"]
        assert labels["team"] == "rl" and labels["app.kubernetes.io/component"] == component
        assert spec["nodeSelector"] == {"pool": "gpu"} and spec["priorityClassName"] == "high"
        assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
        if component == "sandbox":  # scheduling only: nothing of the user's in the sandbox
            assert not any("envFrom" in c for c in spec["containers"])
            assert "data" not in {v["name"] for v in spec["volumes"]}
            continue
        assert spec["affinity"] == OVERLAY["affinity"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert {"name": "data", "persistentVolumeClaim": {"claimName": "swe"}} in spec["volumes"]
        for c in spec["containers"]:
            assert c["envFrom"] == [{"secretRef": {"name": "s3"}}]
            assert c["env"][-1]["name"] == "HF_TOKEN"
            assert any(e["name"] == "GAGAR_RUN" for e in c["env"])  # the operator's stay
            assert {"name": "data", "mountPath": "/data", "readOnly": False} in c["volumeMounts"]
        sa = one(objs, "ServiceAccount", f"qwen3-swe-1node-{component}")
        assert sa["metadata"]["annotations"] == OVERLAY["serviceAccountAnnotations"]


def test_kueue_queue_label_on_the_trainer_workload() -> None:
    for extra in ({}, {"trainer.useJobSet": True}):
        run = example("single-gpu", **{"trainer.queueName": "team-a", **extra})
        objs = build_all(run, BuildContext(uid=UID, crds=ALL_CRDS))
        (workload,) = [o for o in objs if o["kind"] in ("Job", "JobSet")]
        assert workload["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert "suspend" not in workload["spec"]


def test_an_integration_the_cluster_lacks_is_named_never_skipped() -> None:
    """Issue 49: KEDA, Prometheus Operator monitors and a Kueue queue asked for on a cluster
    (or an operator configuration) without them: a Stalled reason naming the field and the
    chart value, or what is not installed."""
    from gagar.operator.builders.integrations import missing

    keda = example("flash-moe", **{"trainer.useJobSet": False})
    reason, message = missing(keda, frozenset(), frozenset()) or ("", "")
    assert reason == "AutoscalerUnavailable"
    assert "spec.rollout.autoscaling.backend" in message and "integrations.keda" in message
    assert "not installed" in missing(keda, frozenset(), frozenset({"keda.sh"}))[1]  # type: ignore[index]
    assert missing(keda, frozenset({"keda.sh"}), frozenset({"keda.sh"})) is None
    on = example("single-gpu", **{"observability.monitors": "enabled"})
    assert missing(on, frozenset(), frozenset())[0] == "MonitoringUnavailable"  # type: ignore[index]
    queued = example("single-gpu", **{"trainer.queueName": "team-a"})
    assert missing(queued, frozenset(), frozenset())[0] == "QueueUnavailable"  # type: ignore[index]
    # Kueue installed, the operator's integration off: Kueue's own webhook holds the Job
    assert missing(queued, frozenset({"kueue.x-k8s.io"}), frozenset()) is None
    assert missing(example("single-gpu"), frozenset(), frozenset()) is None
