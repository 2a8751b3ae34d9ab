"""``gagar render`` shows what the operator creates (issue 49: it printed a Job for ``useJobSet``
and ScaledObjects without KEDA, where the operator refuses or drops them).

The same run, on the same capabilities, goes through ``gagar render --capabilities`` and through
the operator (the real kopf runtime, the chart's RBAC for those integrations, stand-in CRDs in the
emulator; ``GAGAR_TEST_KUBECONFIG``'s cluster otherwise, for what it has installed): the objects
the operator creates are exactly those render prints (kind and name), and where the operator
stalls the run render prints the same reason and nothing.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from gagar.cli import main
from gagar.operator.builders import CHILD_KINDS, OPTIONAL_CRDS
from tests.integration.test_operator_scenarios import Env, env, manifest, optional_crd

__all__ = ["env"]  # the fixture, shared with test_operator_scenarios

STAND_INS = {
    "keda.sh": [("ScaledObject", "scaledobjects", "v1alpha1")],
    "jobset.x-k8s.io": [("JobSet", "jobsets", "v1alpha2")],
    "monitoring.coreos.com": [("ServiceMonitor", "servicemonitors", "v1"),
                              ("PodMonitor", "podmonitors", "v1")],
}  # fmt: skip
CASES = {  # example -> capabilities
    "single-gpu": (),
    "flash-moe": ("keda.sh", "jobset.x-k8s.io"),
    "flash-moe-bare": (),  # asks for JobSet and KEDA on a cluster without them: refused
    "local": ("monitoring.coreos.com",),
}


def _render(
    run: dict[str, Any], uid: str, groups: tuple[str, ...], tmp: Path
) -> tuple[int, str, str]:
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    out, err = io.StringIO(), io.StringIO()
    argv = ["render", str(path), "--uid", uid, "--capabilities", ",".join(groups)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _live(env: Env, name: str, groups: tuple[str, ...]) -> set[tuple[str, str]]:
    out = set()
    for api, kind in CHILD_KINDS:
        if api.split("/")[0] in OPTIONAL_CRDS and api.split("/")[0] not in groups:
            continue  # an optional kind the cluster does not serve
        for obj in env.kube.list(api, kind, env.namespace, f"gagar.dev/run={name}"):
            out.add((kind, obj["metadata"]["name"]))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_prints_what_the_operator_creates(case: str, env: Env, tmp_path: Path) -> None:
    groups = CASES[case]
    if groups and not env.simulated:
        pytest.skip("installs stand-in CRDs")
    for group in groups:
        for kind, plural, version in STAND_INS[group]:
            env.kube.create(optional_crd(group, kind, plural, version))
    run = manifest(case.removesuffix("-bare"))
    run["metadata"]["namespace"] = env.namespace
    name = run["metadata"]["name"]
    with env.operator(integrations=frozenset(groups)):
        uid = env.create(run)["metadata"]["uid"]
        code, stdout, stderr = _render(run, uid, groups, tmp_path)
        if code:
            reason = stderr.split("(")[1].split(")")[0]
            stalled = env.reason(name, "Stalled", reason, what=f"the operator's {reason}")
            assert stalled["message"] in stderr and stdout == ""
            assert _live(env, name, groups) == set()
            return
        rendered = {(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(stdout)}
        env.wait(lambda: _live(env, name, groups) == rendered,
                 what=f"the operator's children == render's {sorted(rendered)}")  # fmt: skip


def test_render_discovers_a_live_clusters_capabilities(tmp_path: Path) -> None:
    """``--discover KUBECONFIG``: the capabilities are the cluster's API groups (here KEDA's
    stand-in CRD), so the KEDA pools render their ScaledObjects; without it the run is refused."""
    from tests.kube_emulator import KubeEmulator

    run = manifest("flash-moe", **{"trainer.useJobSet": False})
    with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(run))
        argv = ["render", str(path), "--discover", str(kubeconfig)]
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(argv) == 1
        assert "AutoscalerUnavailable" in err.getvalue()
        emulator.create(optional_crd("keda.sh", "ScaledObject", "scaledobjects", "v1alpha1"))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(argv) == 0
    kinds = [o["kind"] for o in yaml.safe_load_all(out.getvalue())]
    assert kinds.count("ScaledObject") == 2
