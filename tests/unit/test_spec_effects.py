"""Spec fields whose effect is where the driver or the operator hands them on: container images,
the agent's sampling and limits, the dynamic-sampling plan, devices, dataset files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gagar.driver import components as comp
from gagar.driver.loop import rollout_config
from gagar.driver.rollouts import GroupResult, Rollout
from gagar.driver.sampling import SamplingPlan, TaskSampler, collect
from gagar.operator.builders import BuildContext, build_all
from gagar.rollout.agent import Trajectory
from gagar.rollout.envs import synthetic
from gagar.spec import AlgorithmSpec, DatasetSpec, GagarRunSpec
from tests.unit.test_builders import example


def test_every_component_runs_the_image_its_spec_names() -> None:
    run = example(
        "single-gpu",
        **{
            "trainer.image": "r.io/t:1",
            "rollout.image": "r.io/r:2",
            "grader.image": "r.io/g:3",
            "sandbox.image": "r.io/s:4",
        },
    )
    images = {
        o["metadata"]["name"]: {c["image"] for c in o["spec"]["template"]["spec"]["containers"]}
        for o in build_all(run)
        if o["kind"] in ("Job", "Deployment")
    }
    assert images["qwen3-swe-1node-trainer"] == {"r.io/t:1"}
    assert images["qwen3-swe-1node-rollout"] == {"r.io/r:2"}
    assert "r.io/g:3" in images["qwen3-swe-1node-grader"]
    assert images["qwen3-swe-1node-sandbox"] == {"r.io/s:4"}


def test_agent_settings_reach_the_rollouts() -> None:
    run = example(
        "local",
        **{
            "rollout.agent": {
                "maxTurns": 5,
                "maxTokensPerTurn": 77,
                "maxContextTokens": 999,
                "temperature": 0.7,
                "topP": 0.9,
            },
            "sandbox.limits.wallSeconds": 12.5,
        },
    )
    cfg = rollout_config(run)
    lim = cfg.limits
    assert (lim.max_turns, lim.max_tokens_per_turn, lim.max_context_tokens) == (5, 77, 999)
    assert (lim.temperature, lim.top_p) == (0.7, 0.9)
    assert cfg.command_timeout == cfg.verify_timeout == 12.5


def _group(passes: list[bool]) -> GroupResult:
    rollouts = [
        Rollout(Trajectory([0], [0.0], [0], 1, [], exit_reason="submitted"), passed=p, valid=True)
        for p in passes
    ]
    return GroupResult(synthetic.generate(0), rollouts, [{} for _ in rollouts])


def _collect(alg: AlgorithmSpec, eligible_every: int) -> tuple[int, int, int]:
    """(groups trained on, groups sampled, rounds) when every ``eligible_every``-th draw is
    informative (one pass, one fail) and the others all fail."""
    sampler = TaskSampler([synthetic.generate(0)], seed=0)

    async def rollout(task, draw: int) -> GroupResult:  # type: ignore[no-untyped-def]
        return _group([True, False] if draw % eligible_every == 0 else [False, False])

    plan = SamplingPlan(
        alg.tasks_per_step,
        alg.dynamic_sampling.max_extra_rounds,
        alg.dynamic_sampling.enabled,
        grade=False,
    )
    out = asyncio.run(collect(sampler, plan, rollout, None))  # type: ignore[arg-type]
    return len(out.groups), out.sampled, out.rounds


def test_tasks_per_step_and_dynamic_sampling_shape_the_step() -> None:
    spec = {"tasksPerStep": 4, "dynamicSampling": {"enabled": True, "maxExtraRounds": 2}}
    # draws 0, 4, 8, ... are informative; each round draws what is still missing: 4 + 3 + 2
    # draws in three rounds (1 + maxExtraRounds) find 3 of the 4 groups
    assert _collect(AlgorithmSpec.model_validate(spec), 4) == (3, 9, 3)
    fewer = {**spec, "dynamicSampling": {"enabled": True, "maxExtraRounds": 0}}
    assert _collect(AlgorithmSpec.model_validate(fewer), 4) == (1, 4, 1)
    off = {**spec, "dynamicSampling": {"enabled": False, "maxExtraRounds": 2}}
    assert _collect(AlgorithmSpec.model_validate(off), 4) == (4, 4, 1)  # trains on what it drew
    assert _collect(AlgorithmSpec.model_validate({**spec, "tasksPerStep": 2}), 1) == (2, 2, 1)


@pytest.mark.parametrize("field", ["trainer", "rollout"])
def test_cuda_devices_need_a_gpu(field: str) -> None:
    spec = GagarRunSpec.model_validate(
        {"model": {"preset": "tiny"}, field: {"device": "cuda", "replicas": 1}}
        if field == "rollout"
        else {"model": {"preset": "tiny"}, field: {"device": "cuda"}}
    )
    with pytest.raises(comp.SetupError, match=rf"spec\.{field}\.device is 'cuda' but"):
        comp.check_devices(spec, cuda_available=False)
    comp.check_devices(spec, cuda_available=True)


def test_trainer_device_cpu_is_refused_where_cuda_would_be_used() -> None:
    spec = GagarRunSpec.model_validate({"model": {"preset": "tiny"}, "trainer": {"device": "cpu"}})
    comp.check_devices(spec, cuda_available=False)
    with pytest.raises(comp.SetupError, match=r"spec\.trainer\.device is 'cpu' but this machine"):
        comp.check_devices(spec, cuda_available=True)


def test_jsonl_sources_are_read_from_their_path(tmp_path: Path) -> None:
    task = synthetic.generate(3)
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task.model_dump(mode="json", exclude_none=True)) + "\n")
    spec = DatasetSpec.model_validate(
        {"sources": [{"kind": "jsonl", "path": str(path)}], "heldOutFraction": 0.0}
    )
    train, held = comp.load_datasets(spec)
    assert [t.instance_id for t in train] == [task.instance_id] and held == []
    missing = DatasetSpec.model_validate({"sources": [{"kind": "jsonl", "path": "/nope.jsonl"}]})
    with pytest.raises(comp.SetupError, match=r"spec\.dataset\.sources\[0\]\.path '/nope.jsonl'"):
        comp.load_datasets(missing)


def test_group_size_and_concurrency_shape_a_group() -> None:
    """``algorithm.groupSize`` trajectories per task, at most ``rollout.agent.concurrency`` in
    flight (the loop's limiter), each with its own seed."""
    from gagar.driver.rollouts import Rollouts

    spec = GagarRunSpec.model_validate(
        {
            "model": {"preset": "tiny"},
            "algorithm": {"groupSize": 6},
            "rollout": {"replicas": 1, "agent": {"concurrency": 2}},
        }
    )
    in_flight, most, seeds = 0, 0, []

    class Counted(Rollouts):
        async def one(self, task, seed, session=None, verdicts=None, slot=None):  # type: ignore[no-untyped-def]
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            seeds.append(seed)
            await asyncio.sleep(0.01)
            in_flight -= 1
            return _group([True]).rollouts[0], {}

    limiter = asyncio.Semaphore(spec.rollout.agent.concurrency)
    rollouts = Counted(None, None, None, None, limiter)  # type: ignore[arg-type]
    group = asyncio.run(rollouts.group(synthetic.generate(0), spec.algorithm.group_size, 7))
    assert len(group.rollouts) == 6 and most == 2 and sorted(seeds) == list(range(7000, 7006))


def test_rollout_pool_settings_reach_vllm() -> None:
    two = {"nvidia.com/gpu": "2"}  # one GPU per tensor-parallel worker
    run = example(
        "single-gpu",
        **{"rollout.tensorParallelSize": 2, "rollout.gpuMemoryUtilization": 0.5},
        **{"rollout.resources.limits": two},
    )
    (dep,) = [
        o
        for o in build_all(run)
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "qwen3-swe-1node-rollout"
    ]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.5"


def test_autoscaling_settings_reach_keda() -> None:
    auto = {
        "minReplicas": 2,
        "maxReplicas": 9,
        "backend": "keda",
        "targetQueueDepth": 3.5,
        "prometheusAddress": "http://prom.example:9090",
        "cooldownSeconds": 45,
    }
    run = example("local", **{"rollout.replicas": None, "rollout.autoscaling": auto})
    keda = BuildContext(crds=frozenset({"keda.sh"}))
    (so,) = [o for o in build_all(run, keda) if o["kind"] == "ScaledObject"]
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (2, 9)
    assert so["spec"]["cooldownPeriod"] == 45
    (trigger,) = so["spec"]["triggers"]
    assert trigger["metadata"]["serverAddress"] == "http://prom.example:9090"
    assert trigger["metadata"]["threshold"] == "3.5"


def test_every_pod_template_field_reaches_the_pods() -> None:
    """Each leaf of ``podTemplate`` set to a distinctive value appears in the trainer's pods as
    Kubernetes spells it (the overlay of every component: tests/unit/test_builders.py)."""
    sources = {
        "persistentVolumeClaim": {"claimName": "c"},
        "configMap": {"name": "cm"},
        "secret": {"secretName": "s"},
        "emptyDir": {"sizeLimit": "1Gi"},
        "csi": {"driver": "d.example"},
        "nfs": {"server": "n.example", "path": "/x"},
        "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}},
        "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]},
    }
    volumes = [{"name": f"v{i}", kind: src} for i, (kind, src) in enumerate(sources.items())]
    overlay = {
        "labels": {"team": "rl"},
        "annotations": {"note": "x"},
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [
            {
                "key": "k",
                "operator": "Equal",
                "value": "v",
                "effect": "NoExecute",
                "tolerationSeconds": 30,
            }
        ],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "priorityClassName": "high",
        "imagePullSecrets": [{"name": "regcred"}],
        "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
        "envFrom": [
            {"configMapRef": {"name": "cm"}, "prefix": "P_"},
            {"secretRef": {"name": "sec"}},
        ],
        "volumes": volumes,
        "volumeMounts": [{"name": "v1", "mountPath": "/cm", "readOnly": True, "subPath": "sub"}],
        "serviceAccountAnnotations": {"iam.gke.io/gcp-service-account": "x@y"},
        "schedulerName": "volcano",
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"team": "rl"}},
            }
        ],
        "securityContext": {"runAsGroup": 3000, "supplementalGroups": [4000]},
        "initContainers": [
            {"name": "fetch", "image": "busybox:1.36", "command": ["sh", "-c", "true"]},
            {
                "name": "proxy",
                "image": "envoyproxy/envoy:v1.31",
                "restartPolicy": "Always",
                "ports": [{"containerPort": 15001}],
                "env": [{"name": "LEVEL", "value": "info"}],
                "volumeMounts": [{"name": "v1", "mountPath": "/etc/proxy"}],
                "startupProbe": {"tcpSocket": {"port": 15001}},
            },
        ],
    }
    run = example("single-gpu", **{"trainer.podTemplate": overlay})
    objs = build_all(run)
    (job,) = [o for o in objs if o["kind"] == "Job"]
    tpl = job["spec"]["template"]
    pod = tpl["spec"]
    assert (
        tpl["metadata"]["labels"]["team"] == "rl" and tpl["metadata"]["annotations"]["note"] == "x"
    )
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["priorityClassName"] == "high"
    assert pod["tolerations"] == overlay["tolerations"] and pod["affinity"] == overlay["affinity"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert all(v in pod["volumes"] for v in volumes)
    (c,) = pod["containers"]
    assert all(e in c["env"] for e in overlay["env"]) and c["envFrom"] == overlay["envFrom"]
    assert overlay["volumeMounts"][0] in c["volumeMounts"]
    assert pod["schedulerName"] == "volcano"
    assert pod["topologySpreadConstraints"] == overlay["topologySpreadConstraints"]
    assert pod["securityContext"]["runAsGroup"] == 3000
    assert pod["securityContext"]["runAsNonRoot"] is True  # the operator's keys stay
    fetch, proxy = pod["initContainers"]
    assert fetch["name"] == "fetch" and fetch["command"] == ["sh", "-c", "true"]
    assert (
        proxy["restartPolicy"] == "Always" and proxy["startupProbe"]["tcpSocket"]["port"] == 15001
    )
    assert proxy["ports"] == [{"containerPort": 15001, "protocol": "TCP"}]
    assert proxy["securityContext"]["allowPrivilegeEscalation"] is False
    (sa,) = [
        o
        for o in objs
        if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-trainer")
    ]
    assert sa["metadata"]["annotations"] == overlay["serviceAccountAnnotations"]


def test_every_component_gets_the_resources_its_spec_names() -> None:
    def res(cpu: str) -> dict[str, dict[str, str]]:
        return {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"memory": "2Gi"}}

    cpus = {"trainer": "7", "rollout": "5", "grader": "3", "sandbox": "2"}
    run = example("single-gpu", **{f"{c}.resources": res(cpu) for c, cpu in cpus.items()})
    for o in build_all(run):
        if o["kind"] not in ("Job", "Deployment"):
            continue
        component = o["metadata"]["name"].removeprefix("qwen3-swe-1node-")
        # the agentic grader's pods: the model server beside the grader service gets them (the
        # service asks for its own defaults)
        given = {c["name"]: c["resources"] for c in o["spec"]["template"]["spec"]["containers"]}
        if component == "grader":
            assert given.pop("grader") == {"requests": {"cpu": "500m", "memory": "1Gi"}}
        (spec_res,) = given.values()
        assert spec_res["requests"]["cpu"] == cpus[component], component
        assert spec_res["limits"]["memory"] == "2Gi", component
