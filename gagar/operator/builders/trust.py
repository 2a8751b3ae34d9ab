"""What creating a GagarRun entitles: the trust model the operator enforces (pure).

The operator's ServiceAccount creates pods that the run's creator may not be allowed to create
(a confused deputy). So the parts of a pod a run supplies (``spec.<component>.podTemplate``: the
pod ``securityContext``, init containers and sidecars, volumes, environment) are held to a Pod
Security Standards level that the operator's own configuration sets (the chart's
``podSecurity.runs``, operator flag ``--pod-security``; ``restricted`` by default), never the
run: a privileged or ``SYS_ADMIN`` init container, uid 0 or ``runAsNonRoot: false``, a seccomp
``Unconfined`` profile, added capabilities, an ``nfs`` volume are each refused with the field
that asks for them. Secret references (``env[].valueFrom.secretKeyRef``, ``envFrom[].secretRef``,
``volumes[].secret``, projected secrets) and ``spec.authTokenSecret`` reach only the Secrets the
configuration names (chart ``podSecurity.runSecrets``, ``--run-secret``; the chart adds the
Secret it creates, ``authSecret.name``, when ``authSecret.create``) or, when configured, that carry its label (chart
``podSecurity.runSecretLabel``, checked on the Secret by the operator). The namespace's Pod
Security admission (``pod-security.kubernetes.io/enforce``) lowers the level further: a run it
would refuse is refused here, with the field, instead of pods that never appear.

gagar's own pods meet ``restricted``, except the sandbox executor in ``isolation`` ``pod``,
``auto`` and ``agent-sandbox``: root with the capabilities that switching uids needs
(``baseline``), a declared need the chart allows by name (``podSecurity.sandboxBaseline``, on by
default); without it only ``bubblewrap`` (non-root, no capability) is accepted. hostPath, host
namespaces, other ServiceAccounts and other namespaces are not in the spec at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from gagar.spec import Container, EnvFromSource, EnvVar, GagarRun, PodTemplate

Level = Literal["restricted", "baseline", "privileged"]
LEVELS: tuple[Level, ...] = ("restricted", "baseline", "privileged")
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
# Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards)
BASELINE_CAPS = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
     "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)  # fmt: skip
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
     "projected", "secret"}
)  # fmt: skip
COMPONENTS = ("trainer", "rollout", "grader")


@dataclass(frozen=True)
class TrustPolicy:
    """The operator's configuration of what a run may ask for (chart values, never the run).

    ``runs``: the Pod Security level of the parts a run supplies. ``sandbox_baseline``: the named
    exception for the sandbox executor's declared need (root, uid-switching capabilities).
    ``secrets``: Secret names a run may reference. ``secret_label``: ``key=value`` a Secret
    carries to be referenced by runs (checked by the operator on the Secret; unknown to
    ``gagar validate``). ``max_image_pools``: how many task images' executor pools one run may
    have at once (``builders.images``; its trainer asks for them)."""

    runs: Level = "restricted"
    sandbox_baseline: bool = True
    secrets: frozenset[str] = field(default_factory=frozenset)
    secret_label: str = ""
    # executor pools of task images a run's trainer may have at once (builders.images)
    max_image_pools: int = 8


def lower(a: Level, b: Level) -> Level:
    return a if LEVELS.index(a) <= LEVELS.index(b) else b


def namespace_level(labels: dict[str, str]) -> Level:
    """The level the namespace's Pod Security admission enforces (``privileged`` when unset)."""
    value = labels.get(ENFORCE_LABEL, "privileged")
    return value if value in LEVELS else "restricted"


def _context(sc: dict[str, Any], at: str) -> Iterator[tuple[str, Level, str]]:
    """(field, the level that allows it, why) of each key of a pod's or container's
    ``securityContext`` beyond ``restricted``."""
    if sc.get("privileged") is True:
        yield f"{at}.privileged", "privileged", "a privileged container"
    if sc.get("runAsUser") == 0:
        yield f"{at}.runAsUser", "baseline", "uid 0 (root)"
    if sc.get("runAsNonRoot") is False:
        yield f"{at}.runAsNonRoot", "baseline", "runAsNonRoot: false"
    if sc.get("allowPrivilegeEscalation") is True:
        yield f"{at}.allowPrivilegeEscalation", "baseline", "privilege escalation"
    if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        yield f"{at}.seccompProfile.type", "privileged", "seccomp Unconfined"
    if sc.get("procMount") not in (None, "Default"):
        yield f"{at}.procMount", "privileged", "an unmasked /proc"
    drop = (sc.get("capabilities") or {}).get("drop")
    if drop is not None and "ALL" not in drop:
        yield f"{at}.capabilities.drop", "baseline", "capabilities not all dropped"
    for i, cap in enumerate((sc.get("capabilities") or {}).get("add") or []):
        level: Level = "baseline" if cap in BASELINE_CAPS else "privileged"
        if cap != "NET_BIND_SERVICE":
            yield f"{at}.capabilities.add[{i}]", level, f"the added capability {cap}"
    if (sc.get("windowsOptions") or {}).get("hostProcess") is True:
        yield f"{at}.windowsOptions.hostProcess", "privileged", "a host process"
    if sc.get("sysctls"):
        yield f"{at}.sysctls", "privileged", "sysctls"


def _container(c: Container, at: str) -> Iterator[tuple[str, Level, str]]:
    yield from _context(c.security_context or {}, f"{at}.securityContext")


def pod_needs(o: PodTemplate, at: str) -> Iterator[tuple[str, Level, str]]:
    """What a run's pod overlay asks for beyond ``restricted``."""
    yield from _context(o.security_context or {}, f"{at}.securityContext")
    for i, c in enumerate(o.init_containers):
        yield from _container(c, f"{at}.initContainers[{i}]")
    for i, v in enumerate(o.volumes):
        for kind in v.to_wire():
            if kind != "name" and kind not in RESTRICTED_VOLUMES:
                yield f"{at}.volumes[{i}].{kind}", "baseline", f"a {kind} volume"


def _env_secrets(
    env: list[EnvVar], env_from: list[EnvFromSource], at: str
) -> Iterator[tuple[str, str]]:
    for i, e in enumerate(env):
        ref = (e.value_from or {}).get("secretKeyRef")
        if isinstance(ref, dict):
            yield f"{at}.env[{i}].valueFrom.secretKeyRef.name", str(ref.get("name", ""))
    for i, f in enumerate(env_from):
        if f.secret_ref is not None:
            yield f"{at}.envFrom[{i}].secretRef.name", f.secret_ref.name


def secret_refs(o: PodTemplate, at: str) -> Iterator[tuple[str, str]]:
    """(field, Secret name) of every Secret a run's pod overlay reads."""
    yield from _env_secrets(o.env, o.env_from, at)
    for i, c in enumerate(o.init_containers):
        yield from _env_secrets(c.env, c.env_from, f"{at}.initContainers[{i}]")
    for i, v in enumerate(o.volumes):
        if v.secret is not None:
            yield f"{at}.volumes[{i}].secret.secretName", str(v.secret.get("secretName", ""))
        for j, source in enumerate((v.projected or {}).get("sources") or []):
            if isinstance(source, dict) and isinstance(source.get("secret"), dict):
                name = str(source["secret"].get("name", ""))
                yield f"{at}.volumes[{i}].projected.sources[{j}].secret.name", name


def run_secret_refs(run: GagarRun) -> list[tuple[str, str]]:
    """(field, Secret name) of every Secret the run makes the operator mount: its pod overlays'
    references and ``spec.authTokenSecret`` (mounted in the trainer, grader and sandbox pods,
    whose code the run chooses: naming any Secret there would read it as well as any other)."""
    refs = [
        ref
        for c in COMPONENTS
        for ref in secret_refs(getattr(run.spec, c).pod_template, f"spec.{c}.podTemplate")
    ]
    if run.spec.auth_token_secret:
        refs.append(("spec.authTokenSecret", run.spec.auth_token_secret))
    return refs


def _refusal(need: Level, allowed: Level, why: str, namespace: Level) -> str:
    if LEVELS.index(need) > LEVELS.index(namespace):
        by = f"the namespace's Pod Security admission ({ENFORCE_LABEL}={namespace})"
    else:
        by = f"the operator's configuration (Pod Security {allowed} for runs: chart value podSecurity.runs)"
    return f"{why} needs Pod Security {need}, which {by} refuses"


def trust_problems(
    run: GagarRun, policy: TrustPolicy, namespace: Level = "privileged"
) -> list[tuple[str, str]]:
    """(field path, message) of each thing the run asks for that the operator's configuration
    or the namespace's Pod Security admission does not allow. Secrets allowed by label only are
    not decided here (``unlisted_secrets``)."""
    out = []
    allowed = lower(policy.runs, namespace)
    for c in COMPONENTS:
        for at, need, why in pod_needs(getattr(run.spec, c).pod_template, f"spec.{c}.podTemplate"):
            if LEVELS.index(need) > LEVELS.index(allowed):
                out.append((at, _refusal(need, policy.runs, why, namespace)))
    if run.spec.sandbox.backend == "pods" and run.spec.sandbox.isolation != "bubblewrap":
        mine: Level = "baseline" if policy.sandbox_baseline else "restricted"
        if LEVELS.index("baseline") > LEVELS.index(lower(mine, namespace)):
            by = (
                f"the namespace's Pod Security admission ({ENFORCE_LABEL}={namespace})"
                if mine == "baseline"
                else "the operator's configuration (chart value podSecurity.sandboxBaseline: false)"
            )
            out.append(("spec.sandbox.isolation", f"{run.spec.sandbox.isolation} runs the sandbox "
                        f"executor as root with uid-switching capabilities (Pod Security baseline), "
                        f"which {by} refuses: use isolation: bubblewrap"))  # fmt: skip
    if not policy.secret_label:
        out += unlisted_secrets(run, policy)
    return out


def unlisted_secrets(run: GagarRun, policy: TrustPolicy) -> list[tuple[str, str]]:
    """The run's Secret references to Secrets the configuration does not name."""
    return [
        (at, f"Secret {name!r} is not one runs may read (chart value podSecurity.runSecrets"
             + (f", or the label {policy.secret_label} on the Secret" if policy.secret_label else "")
             + ")")
        for at, name in run_secret_refs(run)
        if name not in policy.secrets
    ]  # fmt: skip
