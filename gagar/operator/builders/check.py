"""The API server's pod rules held against the pods a run renders (pure).

Some of what the server refuses depends on the pod the operator builds around the user's parts: an
init container may mount the operator's volumes (``checkpoints``, ``config``, ...), but only those
its component's pod has (a grader pod has no ``checkpoints``). ``pod_problems`` renders the run's
children and checks each pod spec with ``gagar.k8s_rules.pod_spec_problems``; ``validate_run``
is ``gagar.manifest.validate_document`` plus that check, which ``gagar validate`` and the
operator's boundary use, so such a run is refused with the field path in the GagarRun instead of
a 422 on apply. (``gagar.manifest`` cannot render: the pods import it, and the builders reach
into the rollout package.) No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from gagar.k8s_rules import pod_spec_problems
from gagar.manifest import Problem, validate_document
from gagar.operator.builders import build_all
from gagar.operator.builders.overlay import overlay_of
from gagar.spec import GagarRun, PodTemplate

_INIT = re.compile(r"^initContainers\[(\d+)\]")


def pod_specs(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, pod spec) of every pod spec in a manifest (a mapping with ``containers``)."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield path, node
            return
        for key, value in node.items():
            yield from pod_specs(value, f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from pod_specs(value, f"{path}[{i}]")


def _user_path(run: GagarRun, component: str, pod: dict[str, Any], at: str) -> str | None:
    """``at`` in the run's spec when it lies in one of the user's init containers."""
    m = _INIT.match(at)
    overlay = overlay_of(run, component) if component in ("trainer", "rollout", "grader") else None
    if m is None or not isinstance(overlay, PodTemplate):
        return None
    container = pod["initContainers"][int(m.group(1))]["name"]
    mine = [c.name for c in overlay.init_containers]
    if container not in mine:
        return None
    index = mine.index(container)
    return f"spec.{component}.podTemplate.initContainers[{index}]{at[m.end() :]}"


def pod_problems(run: GagarRun) -> list[tuple[str, str]]:
    """(field path, message) of each refusal the API server would answer the run's pods with:
    the path in the run for the user's init containers and sidecars, else the child's own."""
    out = []
    for obj in build_all(run):
        component = obj["metadata"]["labels"].get("app.kubernetes.io/component", "")
        for where, pod in pod_specs(obj, ""):
            for problem in pod_spec_problems(pod):
                at, _, message = problem.partition(": ")
                path = _user_path(run, component, pod, at)
                if path is None:
                    path = f"{obj['kind']} {obj['metadata']['name']}: {where}.{at}"
                out.append((path, message))
    return out


def validate_run(
    doc: Any, source: str = "<input>", index: int = 0
) -> tuple[GagarRun | None, list[Problem]]:
    """``validate_document``, then the API server's rules on the pods the run renders."""
    run, problems = validate_document(doc, source, index)
    if run is None:
        return None, problems
    problems = [Problem(source, index, path, msg) for path, msg in pod_problems(run)]
    return (None, problems) if problems else (run, [])
