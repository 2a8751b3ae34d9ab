"""Operator subcommands: ``gagar render`` (a dry run of the builders) and ``gagar operator``."""

from __future__ import annotations

import argparse
import os
import sys

from gagar.operator.builders.common import (
    AGENT_SANDBOX,
    DEFAULT_REGISTRY,
    JOBSET,
    KEDA,
    KUEUE,
    MONITORING,
    OPTIONAL_CRDS,
    PLACEHOLDER_UID,
    Scraper,
)
from gagar.operator.builders.trust import LEVELS, TrustPolicy

# Not 9400, the default of spec.observability.metricsPort that `gagar train` serves on: an
# operator run beside a local training run (docs/operations.md) must not take its port. The
# chart's operator.metricsPort has the same default (tests/unit/test_cli_papercuts.py).
OPERATOR_METRICS_PORT = 9401


def _render(args: argparse.Namespace) -> int:
    """What the operator creates for the run on a cluster with these capabilities, or, where
    it would create nothing, its Stalled condition's message (exit 1)."""
    from gagar.manifest import load_run
    from gagar.operator.builders import BuildContext, build_all
    from gagar.operator.builders.integrations import blocking
    from gagar.operator.builders.trust import trust_problems

    try:
        run = load_run(args.file)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 1
    crds = capabilities(args)
    terminal = args.terminal
    refused = [f"{p}: {m}" for p, m in trust_problems(run, trust_policy(args))]
    blocked = blocking(run, crds, crds, run.spec.suspend or terminal)
    if refused or blocked:
        reason = "InvalidSpec" if refused else blocked[0]  # type: ignore[index]
        message = "; ".join(refused) if refused else blocked[1]  # type: ignore[index]
        print(f"Stalled ({reason}), nothing created: {message}", file=sys.stderr)
        return 1
    ctx = BuildContext(
        uid=args.uid,
        crds=crds,
        state="terminal" if terminal else "active",
        scraper=scraper(args),
        image_registry=args.image_registry,
    )
    sys.stdout.write(to_yaml_stream(build_all(run, ctx)))
    return 0


# --capabilities' short names of the optional API groups
CAPABILITY_NAMES = {
    "keda": KEDA,
    "jobset": JOBSET,
    "kueue": KUEUE,
    "monitoring": MONITORING,
    "prometheus-operator": MONITORING,
    "agent-sandbox": AGENT_SANDBOX,
}


def _capability_list(text: str) -> frozenset[str]:
    out = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        group = CAPABILITY_NAMES.get(item, item)
        if group not in OPTIONAL_CRDS:
            known = ", ".join([*CAPABILITY_NAMES, *OPTIONAL_CRDS])
            raise argparse.ArgumentTypeError(f"unknown capability {item!r} (one of {known})")
        out.add(group)
    return frozenset(out)


def capabilities(args: argparse.Namespace) -> frozenset[str]:
    """The optional API groups the operator may use on the cluster rendered for: the flags'
    (``--capabilities``, ``--with-crd``), or a live cluster's discovery (``--discover``), as
    the operator with those integrations enabled sees them."""
    groups = set(args.capabilities or ()) | set(args.with_crd or ())
    if args.discover is not None:
        from gagar.operator.kube import Kube
        from gagar.operator.main import api_client

        client = api_client(args.discover or None)
        try:
            groups |= Kube(client).api_groups() & set(OPTIONAL_CRDS)
        finally:
            client.close()
    return frozenset(groups)


def to_yaml_stream(objects: list[dict]) -> str:
    """A YAML stream with multi-line strings (ConfigMap JSON, shell scripts) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump_all(objects, Dumper=Dumper, sort_keys=False)


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def scraper(args: argparse.Namespace) -> Scraper:
    """The Prometheus the flags name (the defaults' when none is named)."""
    labels = tuple(sorted(args.prometheus_label)) if args.prometheus_label else None
    default = Scraper()
    return Scraper(args.prometheus_namespace or default.namespace, labels or default.labels)


def _prometheus_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prometheus-namespace",
        default="",
        metavar="NAMESPACE",
        help="namespace of the Prometheus whose pods may scrape runs' pods (chart value "
        f"prometheus.namespace; default {Scraper().namespace})",
    )
    p.add_argument(
        "--prometheus-label",
        action="append",
        type=_label,
        metavar="KEY=VALUE",
        help="a label of those Prometheus pods (repeatable; chart value prometheus.podLabels; "
        "default app.kubernetes.io/name=prometheus); no other pod may reach a run's ports",
    )
    p.add_argument(
        "--no-network-policy-probe",
        dest="network_policy_probe",
        action="store_false",
        help="do not probe namespaces for NetworkPolicy enforcement (two small pods per "
        "namespace, once; the runs' NetworkPoliciesEnforced condition then says NotChecked)",
    )
    p.add_argument(
        "--image-registry",
        default="",
        type=_registry,
        metavar="PREFIX",
        help=f"pull gagar's images from this registry prefix instead of {DEFAULT_REGISTRY} "
        "(a run's default images; chart value image.registry; `make images PUSH=PREFIX` "
        "pushes them there)",
    )
    p.add_argument(
        "--max-image-pools",
        type=_count,
        default=TrustPolicy.max_image_pools,
        metavar="N",
        help="executor pools of task images (rows' own images) one run may have at once; "
        "its trainer lists the images it wants, and the rest wait (an Event says so)",
    )


def _count(text: str) -> int:
    """A whole number of at least 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"a whole number of at least 0, got {text!r}")
    return value


def _registry(text: str) -> str:
    """A registry prefix (``registry.example.com/team``): no scheme, no tag."""
    prefix = text.rstrip("/")
    tagged = "/" in prefix and ":" in prefix.rpartition("/")[2]  # a host's :port is fine
    if "://" in prefix or "@" in prefix or tagged:  # empty: the default registry
        raise argparse.ArgumentTypeError(f"a registry prefix (host[:port]/path), got {text!r}")
    return prefix


def trust_policy(args: argparse.Namespace) -> TrustPolicy:
    """What creating a run entitles, as the flags say (the chart's ``podSecurity``)."""
    return TrustPolicy(
        runs=args.pod_security,
        sandbox_baseline=args.sandbox_baseline,
        secrets=frozenset(args.run_secret or ()),
        secret_label=getattr(args, "run_secret_label", ""),
        max_image_pools=getattr(args, "max_image_pools", TrustPolicy.max_image_pools),
    )


def trust_flags(p: argparse.ArgumentParser, label: bool = True) -> None:
    p.add_argument(
        "--pod-security",
        choices=LEVELS,
        default="restricted",
        help="Pod Security level of what runs supply in podTemplate (chart value "
        "podSecurity.runs; default restricted: no root, privileged, added capabilities, "
        "seccomp Unconfined)",
    )
    p.add_argument(
        "--no-sandbox-baseline",
        dest="sandbox_baseline",
        action="store_false",
        help="refuse the sandbox executor's root with uid-switching capabilities (isolation "
        "pod, auto, agent-sandbox; Pod Security baseline): only bubblewrap is accepted",
    )
    p.add_argument(
        "--run-secret",
        action="append",
        metavar="NAME",
        help="a Secret runs may reference (repeatable; chart value podSecurity.runSecrets); "
        "every other reference is refused",
    )
    if label:
        p.add_argument(
            "--run-secret-label",
            default="",
            type=_secret_label,
            metavar="KEY=VALUE",
            help="a Secret with this label may be referenced too (chart value "
            "podSecurity.runSecretLabel; needs get on Secrets)",
        )


def _secret_label(text: str) -> str:
    key, sep, _ = text.partition("=")
    if text and (not sep or not key):  # empty: no label (the default)
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def _lease_seconds(text: str) -> int:
    seconds = int(text)
    if seconds < 3:  # kubernetes' leader election needs lease > renew > 1.2 * retry >= 1.2 s
        raise argparse.ArgumentTypeError(f"at least 3 seconds, got {seconds}")
    return seconds


def _run_selector(text: str) -> str:
    from gagar.operator.handlers import parse_selector

    try:
        parse_selector(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _operator(args: argparse.Namespace) -> int:
    from gagar.operator.handlers import OperatorConfig
    from gagar.operator.main import Election, run_operator

    return run_operator(
        namespaces=args.namespace or [],
        standalone=args.standalone,
        port=args.metrics_port,
        health_port=args.health_port,
        config=OperatorConfig(
            integrations=frozenset(args.integration or ()),
            run_selector=args.run_selector,
            scraper=scraper(args),
            image_registry=args.image_registry,
            network_policy_probe=args.network_policy_probe,
            trust=trust_policy(args),
        ),
        election=Election(
            args.leader_election_lease,
            args.leader_election_namespace,
            args.leader_election_seconds,
        )
        if args.leader_election_lease
        else None,
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "render", help="print every child object of a GagarRun as a YAML stream (dry run)"
    )
    p.add_argument("file", metavar="RUN.yaml")
    p.add_argument(
        "--uid",
        default=PLACEHOLDER_UID,
        help="uid of the GagarRun for owner references (kubectl get gagarrun X -o jsonpath='{.metadata.uid}')",
    )
    p.add_argument(
        "--capabilities",
        default=frozenset(),
        type=_capability_list,
        metavar="LIST",
        help="render as the operator does on a cluster with these integrations installed and "
        f"enabled (comma-separated: {', '.join(CAPABILITY_NAMES)}); without one a run that "
        "needs it is refused, as the operator stalls it",
    )
    p.add_argument(
        "--discover",
        nargs="?",
        const="",
        default=None,
        metavar="KUBECONFIG",
        help="take the capabilities from a live cluster's API discovery (the kubeconfig's "
        "current context, or KUBECONFIG's)",
    )
    p.add_argument(
        "--with-crd",
        action="append",
        choices=OPTIONAL_CRDS,
        metavar="GROUP",
        help=f"an optional API group the cluster has ({', '.join(OPTIONAL_CRDS)}); repeatable; "
        "the same as --capabilities",
    )
    p.add_argument(
        "--terminal", action="store_true", help="render the released state of an ended run"
    )
    _prometheus_flags(p)
    trust_flags(p, label=False)
    p.set_defaults(func=_render)

    p = sub.add_parser("operator", help="run the GagarRun operator (kopf)")
    p.add_argument(
        "--namespace",
        action="append",
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    p.add_argument(
        "--standalone", action="store_true", help="no peering with other operator instances"
    )
    p.add_argument(
        "--integration",
        action="append",
        choices=OPTIONAL_CRDS,
        metavar="GROUP",
        help="manage this optional CRD group's kinds (the chart's integrations.*, which also grant "
        f"the RBAC; {', '.join(OPTIONAL_CRDS)}); repeatable; a group not named is left alone "
        "even when installed",
    )
    p.add_argument(
        "--run-selector",
        default="",
        type=_run_selector,
        metavar="SELECTOR",
        help="reconcile only the GagarRuns this equality-based label selector selects "
        "(e.g. team=a,!canary; the chart's runSelector), filtered by the API server",
    )
    p.add_argument(
        "--leader-election-lease",
        default="",
        metavar="NAME",
        help="elect a leader through this coordination.k8s.io Lease: only its holder "
        "reconciles, so several replicas are safe (the chart's operator.replicas)",
    )
    p.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        metavar="NAMESPACE",
        help="namespace of that Lease (default: $POD_NAMESPACE, else default)",
    )
    p.add_argument(
        "--leader-election-seconds",
        type=_lease_seconds,
        default=15,
        help="how long a leader that stopped renewing its Lease keeps it (whole seconds, at "
        "least 3; default 15)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=OPERATOR_METRICS_PORT,
        help=f"port of the operator's /metrics (default {OPERATOR_METRICS_PORT}: `gagar train` "
        "serves a run's on spec.observability.metricsPort, 9400, so both can run on one machine)",
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=8080,
        help="port of the probes every replica answers: /healthz (liveness), /readyz (readiness)",
    )
    _prometheus_flags(p)
    trust_flags(p)
    p.set_defaults(func=_operator)
