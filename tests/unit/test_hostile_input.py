"""Hostile manifests and arguments: refused with one clear line and a non-zero exit, never a
traceback, never accepted as valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gagar.cli import main
from gagar.crd import build_crd
from gagar.spec import MAX_NUMBER

HEAD = "apiVersion: gagar.dev/v1alpha1\nkind: GagarRun\nmetadata: {name: x}\n"
SPEC = "spec:\n  model: {preset: tiny}\n  rollout: {replicas: 1}\n  grader: {replicas: 1}\n"


def _validate(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    rc = main(["validate", str(path)])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return rc, out.out + out.err


@pytest.mark.parametrize(
    "text,message",
    [
        ("a: " + "[" * 5000 + "]" * 5000, "nested deeper than 64 levels"),
        ("a:\n" + "".join(f"{' ' * i}b{i}:\n" for i in range(1, 200)), "nested deeper than"),
        ("a: " + "9" * 5000, "invalid YAML: Exceeds the limit"),
        ("a: '" + "x" * (2 << 20) + "'", "larger than 1048576 bytes"),
        (HEAD + "kind: GagarRun\n" + SPEC, "duplicate key 'kind' (line 4)"),
        (
            HEAD + SPEC + "  algorithm: {optimizer: {lr: .inf}}\n",
            "optimizer.lr: Input should be a finite",
        ),
        (
            HEAD
            + SPEC.replace(
                "replicas: 1}\n  grader", "replicas: 1, agent: {temperature: .nan}}\n  grader"
            ),
            "agent.temperature: Input should be a finite",
        ),
        (HEAD + SPEC + "  sandbox: {limits: {memoryBytes: 1.0e+23}}\n", "limits.memoryBytes"),
        (
            HEAD + SPEC + "  sandbox: {limits: {diskBytes: 10000000000000000}}\n",
            "less than or equal",
        ),
        (HEAD + SPEC + "  algorithm: {seed: -10000000000000000}\n", "out of range"),
    ],
    ids=[
        "deep-flow",
        "deep-block",
        "huge-int",
        "huge-file",
        "dup-key",
        "inf",
        "nan",
        "1e23",
        "1e16",
        "neg",
    ],
)
def test_hostile_manifest_is_one_clear_line(
    tmp_path: Path, capsys, text: str, message: str
) -> None:
    rc, out = _validate(tmp_path, text, capsys)
    assert rc == 1
    assert message in out
    assert len(out.strip().splitlines()) == 1, out


def test_crd_bounds_every_number() -> None:
    """The API server refuses what pydantic refuses: every number has finite bounds."""
    unbounded = []

    def visit(node, path: str) -> None:
        if isinstance(node, dict):
            # an int-or-string (a quantity) bounds its integers beside its anyOf
            if node.get("type") in ("integer", "number") or node.get("x-kubernetes-int-or-string"):
                if not (abs(node.get("maximum", 1e300)) <= MAX_NUMBER and "minimum" in node):
                    unbounded.append(path)
            for k, v in node.items():
                if k == "anyOf" and node.get("x-kubernetes-int-or-string"):
                    continue
                visit(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                visit(v, f"{path}[{i}]")

    for version in build_crd()["spec"]["versions"]:
        visit(version["schema"], version["name"])
    assert unbounded == []


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--steps", "-5"], "invalid override: spec.algorithm.totalSteps"),
        (["--out", "FILE"], "cannot use --out"),
        (["--out", "/proc/x"], "cannot use --out"),
    ],
)
def test_train_bad_arguments_exit_2_in_one_line(
    tmp_path: Path, capsys, monkeypatch, extra: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("a file, not a directory")
    (tmp_path / "run.yaml").write_text(HEAD + SPEC)
    rc = main(["train", "run.yaml", *extra])
    out = capsys.readouterr()
    assert rc == 2
    assert message in out.err and "Traceback" not in out.err
    assert len(out.err.strip().splitlines()) == 1, out.err


def test_rendered_run_json_is_json(tmp_path: Path, capsys) -> None:
    """Whatever validates renders as strict JSON (no Infinity/NaN tokens)."""
    path = tmp_path / "run.yaml"
    path.write_text(HEAD + SPEC + "  algorithm: {optimizer: {lr: 1.0e-4}}\n")
    assert main(["validate", str(path)]) == 0
    from gagar.manifest import load_run

    json.loads(json.dumps(load_run(path).to_wire(), allow_nan=False))


def _bomb(levels: int) -> str:
    """A "billion laughs" where free-form Kubernetes fields are (a pod's affinity, which pydantic
    walks whole): each level an anchored list of ten aliases of the level below."""
    lines = ["x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    nested = "".join(f"          {line}\n" for line in lines)
    return (
        HEAD
        + SPEC
        + "  trainer:\n    podTemplate:\n      affinity:\n        nodeAffinity:\n"
        + nested
    )


def _chain(levels: int) -> str:
    """Aliases nesting one level deeper each: shallow as text, deep once expanded."""
    lines = ["x0: &a0 [z]"] + [f"x{i}: &a{i} [*a{i - 1}]" for i in range(1, levels)]
    return HEAD + SPEC + "\n".join(lines) + "\n"


POD = "  trainer:\n    podTemplate:\n"
MOUNT = "      volumes: [{name: data, emptyDir: {}}]\n      volumeMounts: [{name: data, "


@pytest.mark.parametrize(
    "text,message",
    [
        (_bomb(6), "invalid YAML: aliases expand past 100000 nodes"),
        (_chain(100), "invalid YAML: aliases expand past 64 levels"),
        ("a: &a [*a]\n", "invalid YAML: an alias refers to itself"),
        (HEAD + SPEC + "? [a, b]\n: 1\n", "invalid YAML: a mapping key must be a scalar (line 8)"),
        (HEAD + SPEC + "? {a: b}\n: 1\n", "a mapping key must be a scalar"),
        (
            HEAD.replace("{name: x}", "{name: x, namespace: Not_A_Label}") + SPEC,
            "metadata.namespace: Value error, 'Not_A_Label' is not a DNS-1123 label",
        ),
        (
            HEAD.replace("{name: x}", "{name: x, labels: {a/b/c: v}}") + SPEC,
            "metadata.labels: Value error, 'a/b/c': not a qualified name",
        ),
        (
            HEAD + SPEC + POD + "      labels: {team: " + "v" * 70 + "}\n",
            "spec.trainer.podTemplate.labels.team: Value error",
        ),
        (
            HEAD + SPEC + POD + "      annotations: {a: " + "v" * (256 << 10) + "}\n",
            "spec.trainer.podTemplate.annotations: Value error, annotations total 262145 bytes",
        ),
        (
            HEAD + SPEC + POD + MOUNT + "mountPath: /d, subPath: a/../../etc}]\n",
            "volumeMounts[0].subPath: Value error, 'a/../../etc' is not a relative path",
        ),
        (
            HEAD + SPEC + POD + MOUNT + "mountPath: /d, subPath: /etc}]\n",
            "volumeMounts[0].subPath: Value error, '/etc' is not a relative path",
        ),
        (
            HEAD + SPEC + POD + "      priorityClassName: High_Priority\n",
            "podTemplate.priorityClassName: Value error, 'High_Priority' is not a DNS-1123 sub",
        ),
        (
            HEAD + SPEC + "  trainer: {checkpoint: {volumeSize: 1e99999999999}}\n",
            "checkpoint.volumeSize: Value error, '1e99999999999' is not a Kubernetes quantity",
        ),
    ],
    ids=[
        "billion-laughs",
        "alias-depth",
        "alias-cycle",
        "complex-key",
        "mapping-key",
        "namespace",
        "label-key",
        "label-value-70",
        "annotations-256k",
        "subpath-dotdot",
        "subpath-absolute",
        "priority-class",
        "quantity-exponent",
    ],
)
def test_what_kubernetes_or_yaml_would_choke_on_is_one_clear_line(
    tmp_path: Path, capsys, text: str, message: str
) -> None:
    rc, out = _validate(tmp_path, text, capsys)
    assert rc == 1 and message in out, out
    assert len(out.strip().splitlines()) == 1, out


def test_render_of_a_billion_laughs_is_refused_at_once(tmp_path: Path, capsys) -> None:
    import resource
    import time

    path = tmp_path / "run.yaml"
    path.write_text(_bomb(9))  # 10^9 nodes once expanded; under 1 KiB as text
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    rc = main(["render", str(path)])
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert rc != 0 and "aliases expand past" in capsys.readouterr().err
    assert time.monotonic() - start < 5 and grown < 100 << 10  # KiB: no expansion happened


# (pydantic, CRD): the CRD cannot check map keys (no structural schema constrains them, a CEL
# regex over them exceeds the API server's cost budget); pydantic and the operator's boundary do
BOTH, KEYS_ONLY_BY_PYDANTIC = (False, False), (False, True)


@pytest.mark.parametrize(
    "where,value,verdict",
    [
        ("labels", {"gagar-team.example.com/owner": "a.b_c-1"}, (True, True)),
        ("labels", {"a/b/c": "v"}, KEYS_ONLY_BY_PYDANTIC),
        ("labels", {"-bad": "v"}, KEYS_ONLY_BY_PYDANTIC),
        ("labels", {"x" * 64: "v"}, KEYS_ONLY_BY_PYDANTIC),
        ("labels", {"ok": "v" * 64}, BOTH),
        ("labels", {"ok": "-v"}, BOTH),
        ("nodeSelector", {"kubernetes.io/arch": "amd64"}, (True, True)),
        ("nodeSelector", {"k": "bad value"}, BOTH),
        ("annotations", {"example.com/any": "any value at all, spaces too"}, (True, True)),
        ("annotations", {"bad key": "v"}, KEYS_ONLY_BY_PYDANTIC),
        (
            "volumeMounts",
            [{"name": "data", "mountPath": "/d", "subPath": "a/..b/.c"}],
            (True, True),
        ),
        ("volumeMounts", [{"name": "data", "mountPath": "/d", "subPath": "a/.."}], BOTH),
        ("volumeMounts", [{"name": "data", "mountPath": "/d", "subPath": "/abs"}], BOTH),
        ("priorityClassName", "high.priority", (True, True)),
        ("priorityClassName", "High", BOTH),
        ("imagePullSecrets", [{"name": "regcred"}], (True, True)),
        ("imagePullSecrets", [{"name": "Reg_Cred"}], BOTH),
        ("tolerations", [{"key": "nvidia.com/gpu", "operator": "Exists"}], (True, True)),
        ("tolerations", [{"key": "a/b/c", "operator": "Exists"}], BOTH),
        ("env", [{"name": "has space", "value": "v"}], BOTH),
    ],
)
def test_pydantic_and_the_crd_agree_on_kubernetes_rules(
    where: str, value: object, verdict: tuple[bool, bool]
) -> None:
    """What the API server would refuse when the operator creates the pods, pydantic refuses at
    ``gagar validate`` and, where a schema can say it, the CRD at ``kubectl apply``; what it
    accepts, both accept."""
    import yaml
    from pydantic import ValidationError

    from gagar.spec import GagarRun
    from tests.support.crd_check import crd_errors

    doc = yaml.safe_load(HEAD + SPEC)
    pod: dict = {where: value}
    if where == "volumeMounts":
        pod["volumes"] = [{"name": "data", "emptyDir": {}}]
    doc["spec"]["trainer"] = {"podTemplate": pod}
    try:
        GagarRun.model_validate(doc)
        by_pydantic = True
    except ValidationError:
        by_pydantic = False
    by_crd = crd_errors(doc, build_crd()) == []
    assert (by_pydantic, by_crd) == verdict
