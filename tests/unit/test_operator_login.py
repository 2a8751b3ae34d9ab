"""The operator's login: the kubernetes client's kubeconfig loader, exec plugins included (EKS's
``aws eks get-token``, GKE's ``gke-gcloud-auth-plugin``), turned into kopf's ``ConnectionInfo``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from gagar.operator.main import client_configuration, connection_info


def kubeconfig(tmp_path: Path, user: dict) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_exec_plugin_token_reaches_kopf(tmp_path: Path) -> None:
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": "from-the-plugin"},
    }
    plugin = tmp_path / "plugin.py"
    plugin.write_text(f"print({json.dumps(json.dumps(credential))})\n")
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin)],
            "interactiveMode": "Never",
        }
    }
    info = connection_info(client_configuration(str(kubeconfig(tmp_path, exec_user))))
    assert info.server == "https://10.0.0.1:6443"
    assert (info.scheme, info.token) == ("Bearer", "from-the-plugin")


def test_static_token_and_insecure_flag(tmp_path: Path) -> None:
    info = connection_info(client_configuration(str(kubeconfig(tmp_path, {"token": "t0k"}))))
    assert (info.scheme, info.token) == ("Bearer", "t0k")
    assert info.insecure is False and info.username is None
