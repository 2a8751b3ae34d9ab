"""Serve the emulator as a process of its own, reachable only through the kubeconfigs it writes.

    python -m tests.kube_emulator DIR [--service-account NS/NAME ...]

writes ``DIR/admin.kubeconfig`` (the cluster admin), one ``DIR/<ns>.<name>.kubeconfig`` per
``--service-account`` (requests as that ServiceAccount, so RBAC applies), then ``DIR/ready``, and serves until stdin closes or SIGTERM arrives. Tests
use it for the code path a real cluster takes: nothing but a kubeconfig connects them.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys
import threading

from .emulator import KubeEmulator


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.kube_emulator")
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("--service-account", action="append", default=[], metavar="NS/NAME")
    p.add_argument("--bookmark-interval", type=float, default=0.5)
    p.add_argument("--deployment-delay", type=float, default=0.05)
    p.add_argument("--openapi-validate", action="store_true")
    args = p.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    emulator = KubeEmulator(
        bookmark_interval=args.bookmark_interval,
        deployment_delay=args.deployment_delay,
        openapi_validate=args.openapi_validate,
    )
    with emulator:
        emulator.write_kubeconfig(args.dir / "admin.kubeconfig")
        for account in args.service_account:
            ns, _, name = account.partition("/")
            source = emulator.service_account_kubeconfig(ns, name)
            (args.dir / f"{ns}.{name}.kubeconfig").write_text(source.read_text())
        (args.dir / "ready").write_text(emulator.url)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
