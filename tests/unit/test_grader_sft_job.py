"""``gagar grader sft-job``: the grader's SFT as a Job a cluster accepts, hardened, whose
commands ``gagar``'s own parser takes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gagar.cli import build_parser
from gagar.driver.grader_sft_job import GPU, SftJob, build_sft_job, sft_parser
from tests.kube_emulator.builtin import object_errors, openapi_errors

SFT = ["--steps", "300", "--model", "smollm2-135m", "--groups", "64", "--lr", "2e-5"]


def job(**kw: Any) -> dict[str, Any]:
    fields = {"name": "gs", "image": "gagar-trainer:t", "pvc": "runs", "out": "grader/v1"}
    return build_sft_job(SftJob(**(fields | {"sft_args": SFT} | kw)))


def pod(j: dict[str, Any]) -> dict[str, Any]:
    return j["spec"]["template"]["spec"]


def containers(j: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod(j).get("initContainers", []), *pod(j)["containers"]]


@pytest.mark.parametrize("kw", [{}, {"gpus": 1}, {"data": "grader/records.jsonl"}])
def test_the_job_is_one_kubernetes_takes(kw: dict[str, Any]) -> None:
    j = job(**kw)
    assert openapi_errors(j) == []
    assert object_errors(("batch", "jobs"), j) == []


def test_the_commands_round_trip_through_gagars_parser() -> None:
    data_cmd, sft_cmd = (c["command"] for c in containers(job()))
    sft = build_parser().parse_args(sft_cmd[1:])
    assert (sft.steps, sft.model, sft.groups, sft.lr) == (300, "smollm2-135m", 64, 2e-5)
    assert (sft.out, sft.data) == ("/data/grader/v1", "/data/grader/v1.records.jsonl")
    data = build_parser().parse_args(data_cmd[1:])
    # sft-data builds the records sft reads, of the same train groups and the same cache
    assert (data.out, data.groups, data.seed, data.cache) == (sft.data, 64, 0, sft.cache)


def test_given_data_no_init_container_and_sft_reads_it() -> None:
    j = job(data="grader/records.jsonl")
    assert "initContainers" not in pod(j)
    assert build_parser().parse_args(containers(j)[0]["command"][1:]).data == (
        "/data/grader/records.jsonl"
    )


def test_the_pod_is_hardened() -> None:
    j = job()
    assert j["spec"]["backoffLimit"] == 0 and j["spec"]["ttlSecondsAfterFinished"] > 0
    p = pod(j)
    assert p["automountServiceAccountToken"] is False and p["restartPolicy"] == "Never"
    assert p["securityContext"]["runAsNonRoot"] is True
    assert p["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in containers(j):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"] == c["resources"]["limits"]
        assert c["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert p["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "runs"}}]


def test_gpu_fields_only_with_gpus() -> None:
    cpu = json.dumps(job())
    assert GPU not in cpu and "tolerations" not in cpu
    j = job(gpus=1)
    assert pod(j)["tolerations"][0]["key"] == GPU
    assert pod(j)["containers"][0]["resources"]["limits"][GPU] == "1"


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"out": "/abs"}, "inside the PVC"),
        ({"out": "../up"}, "inside the PVC"),
        ({"sft_args": ["--out", "x"]}, "the Job's own"),
        ({"gpus": 2}, "one process, on 0 or 1 GPU"),  # a second GPU would sit idle
    ],
)
def test_bad_paths_and_own_flags_are_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        job(**kw)


def test_a_flag_sft_does_not_take_fails_before_the_pod() -> None:
    with pytest.raises(SystemExit):
        job(sft_args=["--stepz", "3"])
    assert sft_parser().parse_args(["sft", "--out", "o"]).out == "o"


def test_the_cli_prints_the_job_and_nothing_else(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(
        ["grader", "sft-job", "--pvc", "runs", "--out", "g/v1", "--", "--steps", "5"]
    )
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["kind"] == "Job" and "--steps" in pod(printed)["containers"][0]["command"]


def test_the_learner_resolves_its_dtype_where_the_weights_are_cpu() -> None:
    import torch

    from gagar.driver.grader_sft import learner_precision
    from gagar.trainer.precision import resolve

    assert learner_precision(torch.nn.Linear(2, 2), "auto") == resolve("auto", "cpu")


def test_the_learner_resolves_its_dtype_where_the_weights_are_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from gagar.driver.grader_sft import learner_precision
    from gagar.trainer.precision import resolve

    model = torch.nn.Linear(2, 2).cuda()
    assert learner_precision(model, "auto") == resolve("auto", "cuda")
