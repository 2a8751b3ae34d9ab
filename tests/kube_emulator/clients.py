"""What kubectl and helm need beyond the REST core: media types, pod logs, categories.

Answers are JSON: an ``Accept`` listing protobuf before JSON (what client-go's typed clients
send) gets JSON, as the server answers it for a kind without protobuf (a custom kind); an
``Accept`` without JSON is refused (406). Bodies are JSON (YAML for apply), or protobuf for the
kinds :mod:`.protobuf` reads; any other protobuf body is refused (415) as the server refuses a
body it cannot decode. A pod's log is a text saying that no process runs (the emulator starts
no containers). Discovery carries the ``all`` category (``kubectl get all``) and a CRD's own.
"""

from __future__ import annotations

import logging
from typing import Any

import yaml
from aiohttp import web

from . import protobuf
from .errors import ApiError
from .resources import ResourceType

log = logging.getLogger(__name__)
PROTOBUF = "application/vnd.kubernetes.protobuf"
# what the emulator answers in (JSON) and reads besides the protobuf of a few kinds
ACCEPTED = ("application/json", "application/yaml")
ALL_CATEGORY = (("", "pods"), ("", "services"), ("apps", "deployments"), ("apps", "statefulsets"),
                ("batch", "jobs"), ("autoscaling", "horizontalpodautoscalers"))  # fmt: skip


async def body(request: web.Request, rt: ResourceType) -> Any:
    """A create or update body."""
    if request.content_type == PROTOBUF and not rt.custom:
        try:
            return protobuf.decode(await request.read())
        except protobuf.ProtobufError as e:
            log.info("protobuf body refused: %s", e)
    if request.content_type in (PROTOBUF, "application/cbor"):
        raise ApiError(
            415,
            "the body of the request was in an unknown format - accepted media types include: "
            + ", ".join(ACCEPTED),
        )
    if request.content_type == "application/yaml":
        return yaml.safe_load(await request.text())
    return await request.json()


def negotiate(accept: str, sub: str) -> None:
    """Refuse (406) an ``Accept`` that takes no JSON; a log is text whatever is asked."""
    if not accept.strip() or sub == "log":
        return
    ranges = [part.split(";")[0].strip() for part in accept.split(",")]
    if any(r in ("*/*", "application/*", *ACCEPTED) for r in ranges):
        return
    raise ApiError(
        406, "only the following media types are accepted: " + ", ".join(ACCEPTED), "NotAcceptable"
    )


def pod_log(pod: dict, container: str | None) -> str:
    """What ``kubectl logs`` gets: the emulator starts no containers, so a pod's log says so
    (with the container's image and command) instead of being empty."""
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    names = [c.get("name") for c in containers]
    main = [c.get("name", "") for c in spec.get("containers") or []]
    name = container or (main[0] if len(main) == 1 else None)
    if name is None:
        raise ApiError(400, f"a container name must be specified for pod {meta['name']}, "
                            f"choose one of: [{' '.join(main)}]")  # fmt: skip
    if name not in names:
        raise ApiError(400, f"container {name} is not valid for pod {meta['name']}")
    chosen = containers[names.index(name)]
    command = " ".join([*(chosen.get("command") or []), *(chosen.get("args") or [])])
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return (
        f"[kube-emulator] pod {meta.get('namespace')}/{meta['name']}, container {name} "
        f"(phase {phase}): no process runs here.\n"
        "[kube-emulator] The emulator schedules pods and reports their status; it starts no "
        "containers, so there is no output to show.\n"
        f"[kube-emulator] image: {chosen.get('image', '')}\n"
        f"[kube-emulator] command: {command or '(the image default)'}\n"
    )


def categories(crds: list[dict]) -> dict[tuple[str, str], list[str]]:
    """(group, plural) -> categories: ``all`` for the built-in kinds the server puts there, a
    CRD's ``spec.names.categories`` for its kind."""
    out = {key: ["all"] for key in ALL_CATEGORY}
    for crd in crds:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        if names.get("categories"):
            out[(spec.get("group", ""), names.get("plural", ""))] = list(names["categories"])
    return out
