"""Executor pools per task image, on demand (``sandbox.backend: pods``; pure).

A task row may name its own container image (SWE-bench's and SWE-Gym's ``image_name``). Such
datasets name thousands of images, and the operator never reads the dataset (it lies on the
trainer's volume or image), so these pools are not declared in the spec: the trainer asks for
the images it needs now, most wanted first, as a JSON list under ``sandboxImages`` in
``<run>-progress`` (the one object it may write), and the operator keeps a pool for each of the
first ``TrustPolicy.max_image_pools`` of them and prunes the pool of an image that leaves the
list. Each image's pool is ``<run>-sandbox-i<hash>`` (a DNS label whatever the image's name),
of ``IMAGE_POOL_REPLICAS`` pods at most, and ``sandbox-pools.json`` lists it under
``image:<reference>`` (no environment name holds a ``:``), where the trainer's and grader's
``RoutingFactory`` finds it.

What it guards against: the list is the run author's input (the trainer runs their code), so
each entry must be an image reference and nothing else (``IMAGE_REFERENCE``: no whitespace,
no scheme, at most 255 characters); it reaches a pod's ``image`` field and an annotation only,
never a name or a label (those carry its hash). An entry that is not one, a list that is not
one and entries past the cap are refused with a message the run's Event carries, never applied.
Each pool is the default pool's hardened pod with the image (``builders.sandbox``): the same
identity, read-only root, no token, deny-all egress, and the same ``spec.sandbox.image`` policy
(the run may already name any image there). What it does not do: the image must hold gagar's
executor (``gagar sandbox serve`` on the ``PATH``), as an environment's image must; an image
without one (SWE-bench's) crash-loops, and docs/design.md says what bringing one in needs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from gagar.operator.builders.common import BuildContext, Manifest, labels, name, selector
from gagar.operator.builders.sandbox import MAX_NAME, Pool, build_executor_pool, pool_url
from gagar.spec import GagarRun

IMAGES_KEY = "sandboxImages"  # the trainer's list in <run>-progress
IMAGE_POOL_KEY = "image:"  # sandbox-pools.json's key of an image's pool: "image:<reference>"
IMAGE_COMPONENT = "sandbox-img"  # neither "sandbox" nor "sandbox-env": their selectors miss it
IMAGE_LABEL = "gagar.dev/image"  # the hash of the reference (a label value cannot hold one)
IMAGE_ANNOTATION = "gagar.dev/image"  # the reference itself, for people
IMAGE_POOL_PREFIX = "sandbox/image-"  # then the hash: its key in status.pools, its metrics' pool
IMAGE_POOL_REPLICAS = 2  # at most (poolSize if smaller): one image is one task's few sessions
MAX_REFERENCE = 255
# A container image reference: [host[:port]/]path[:tag][@sha256:digest], lowercase path
# components (distribution/reference's grammar, less its rarely used corners).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)


@dataclass(frozen=True)
class Demand:
    """The images whose pools the run gets (sorted) and why the rest do not."""

    images: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()


def demand(raw: str | None, cap: int) -> Demand:
    """The trainer's ``sandboxImages`` (untrusted): the first ``cap`` distinct valid references
    (the trainer lists the most wanted first)."""
    if not raw:
        return Demand()
    try:
        listed = json.loads(raw)
    except ValueError as err:
        return Demand(refused=(f"{IMAGES_KEY} is not JSON: {err}",))
    if not isinstance(listed, list):
        return Demand(refused=(f"{IMAGES_KEY} is not a JSON list of image references",))
    images: list[str] = []
    refused: list[str] = []
    for i, ref in enumerate(listed):
        if not isinstance(ref, str) or not valid_reference(ref):
            refused.append(f"{IMAGES_KEY}[{i}] is not an image reference: {str(ref)[:80]!r}")
        elif ref not in images:
            images.append(ref)
    cap = max(cap, 0)
    if len(images) > cap:
        refused.append(
            f"{len(images)} task images wanted, at most {cap} pools a run "
            f"(the operator's --max-image-pools): {len(images) - cap} wait"
        )
    # sorted once chosen: the trainer reorders its list with every use, which must not
    # change the desired state (a new order would re-apply every child)
    return Demand(tuple(sorted(images[:cap])), tuple(refused))


def valid_reference(ref: str) -> bool:
    return len(ref) <= MAX_REFERENCE and IMAGE_REFERENCE.fullmatch(ref) is not None


def image_hash(ref: str) -> str:
    return hashlib.sha256(ref.encode()).hexdigest()[:12]


def image_pool_name(run: GagarRun, ref: str) -> str:
    """``<run>-sandbox-i<12 hex>``, the run's name cut so that it fits a DNS label (the run's
    name is unique in its namespace, the hash in the run: two cut names share no pool)."""
    suffix = f"-sandbox-i{image_hash(ref)}"
    if len(run.metadata.name) + len(suffix) <= MAX_NAME:
        return name(run, "sandbox", f"i{image_hash(ref)}")
    run_hash = hashlib.sha256(run.metadata.name.encode()).hexdigest()[:5]
    keep = MAX_NAME - len(suffix) - len(run_hash) - 1
    return f"{run.metadata.name[:keep].rstrip('-')}-{run_hash}{suffix}"


def no_image_pools(run: GagarRun) -> str | None:
    """Why this run's task images get no pools (None: they do)."""
    sb = run.spec.sandbox
    if sb.backend != "pods":
        return "task images run on sandbox pods only (spec.sandbox.backend is local)"
    if sb.isolation == "agent-sandbox":
        return "spec.sandbox.isolation agent-sandbox claims from one warm pool: no task images"
    return None


def image_pools(run: GagarRun, ctx: BuildContext) -> list[Pool]:
    """A pool per image the trainer wants (``ctx.task_images``, already ``demand``-checked)."""
    sb = run.spec.sandbox
    if no_image_pools(run) is not None:
        return []
    out = []
    for ref in ctx.task_images:
        own = {IMAGE_LABEL: image_hash(ref)}
        sel = {**selector(run, IMAGE_COMPONENT), **own}
        lab = {**labels(run, IMAGE_COMPONENT), **own}
        pool = Pool(
            image_pool_name(run, ref),
            ref,
            sel,
            lab,
            metrics_pool=image_pool_key(ref),
            replicas=min(sb.pool_size, IMAGE_POOL_REPLICAS),
            annotations={IMAGE_ANNOTATION: ref},
        )
        out.append(pool)
    return out


def image_pool_key(ref: str) -> str:
    """The pool's key in ``status.pools`` and its executors' ``pool`` label."""
    return f"{IMAGE_POOL_PREFIX}{image_hash(ref)}"


def image_pool_urls(run: GagarRun, ctx: BuildContext) -> dict[str, str]:
    """``sandbox-pools.json``'s entries of the image pools: ``image:<reference>`` -> URL."""
    return {f"{IMAGE_POOL_KEY}{p.image}": pool_url(p.name) for p in image_pools(run, ctx)}


def build_image_pools(run: GagarRun, ctx: BuildContext) -> list[Manifest]:
    return [m for pool in image_pools(run, ctx) for m in build_executor_pool(run, ctx, pool)]
