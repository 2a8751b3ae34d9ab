"""Operator subcommands: ``gagar render`` (a dry run of the builders) and ``gagar operator``."""

from __future__ import annotations

import argparse
import sys

OPTIONAL_CRDS = ("monitoring.coreos.com", "keda.sh", "jobset.x-k8s.io")


def _render(args: argparse.Namespace) -> int:
    import yaml

    from gagar.manifest import load_run
    from gagar.operator.builders import BuildContext, build_all

    try:
        run = load_run(args.file)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 1
    ctx = BuildContext(
        uid=args.uid,
        crds=frozenset(args.with_crd or ()),
        state="terminal" if args.terminal else "active",
    )
    yaml.safe_dump_all(build_all(run, ctx), sys.stdout, sort_keys=False)
    return 0


def _operator(args: argparse.Namespace) -> int:
    from gagar.operator.main import run_operator

    return run_operator(namespace=args.namespace, standalone=args.standalone, port=args.metrics_port)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "render", help="print every child object of a GagarRun as a YAML stream (dry run)"
    )
    p.add_argument("file", metavar="RUN.yaml")
    p.add_argument(
        "--uid",
        default="00000000-0000-0000-0000-000000000000",
        help="uid of the GagarRun for owner references (kubectl get gagarrun X -o jsonpath='{.metadata.uid}')",
    )
    p.add_argument(
        "--with-crd",
        action="append",
        choices=OPTIONAL_CRDS,
        metavar="GROUP",
        help=f"render as for a cluster with this optional CRD group installed ({', '.join(OPTIONAL_CRDS)}); repeatable",
    )
    p.add_argument(
        "--terminal", action="store_true", help="render the released state of an ended run"
    )
    p.set_defaults(func=_render)

    p = sub.add_parser("operator", help="run the GagarRun operator (kopf)")
    p.add_argument("--namespace", help="watch only this namespace (default: all)")
    p.add_argument(
        "--standalone", action="store_true", help="no peering with other operator instances"
    )
    p.add_argument("--metrics-port", type=int, default=9400, help="port of the operator's /metrics")
    p.set_defaults(func=_operator)
