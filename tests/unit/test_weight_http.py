"""The trainer's weight server and the replicas' fetch (``weight_http``), over real HTTP.

The server's promises, each tried against it: the run's token only (401/403), complete versions
only (a temporary or half-written folder is invisible), no path from the request reaching the
file system (traversal, encoded slashes, symbolic links), ``latest`` as published. The fetch's:
sizes checked, a folder replaced whole, the base model when nothing is published, waiting for
the first version when there is no base model, a refused token fatal at once. The trainer side
of a sync through it: ``SafetensorsWeightSync`` with a URL into the fake vLLM, which fetches the
file like gagar's vLLM backend does.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from gagar import env
from gagar.cli import main
from gagar.rollout.engines import weight_http
from gagar.rollout.engines.vllm_auth import control_token
from gagar.rollout.engines.weight_http import (
    FetchError,
    WeightServer,
    boot_weights,
    download,
    fetch_version,
)
from gagar.rollout.engines.weight_sync import (
    ReplicaClient,
    SafetensorsWeightSync,
    publish_version,
)
from tests.support.fake_vllm import FakeOpenAIServer
from tests.support.published import random_weights, write_base_model

TOKEN = "the-runs-token"


@pytest.fixture
def base_model(tmp_path: Path) -> Path:
    return write_base_model(tmp_path)


def weights(scale: float = 1.0) -> dict[str, torch.Tensor]:
    return random_weights(scale, lm_head=False)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "published"


@pytest.fixture
def server(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    s = WeightServer(root, TOKEN, host="127.0.0.1")
    yield s
    s.close()


def get(server: WeightServer, path: str, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(server.url + path, headers=headers, timeout=10)


def test_only_the_runs_token_reads_anything(server, root, base_model) -> None:
    publish_version(weights().items(), root, 1, base_model)
    for path in ("/versions/latest", "/versions/1", "/versions/1/model.safetensors"):
        assert get(server, path, token=None).status_code == 401
        assert get(server, path, token="not-the-token").status_code == 403
        assert get(server, path).status_code == 200
    scheme = httpx.get(server.url + "/versions/1", headers={"Authorization": f"Basic {TOKEN}"})
    assert scheme.status_code == 401
    assert get(server, "/healthz", token=None).status_code == 200  # probes


def test_latest_lists_the_published_version_and_streams_its_files(server, root, base_model) -> None:
    assert get(server, "/versions/latest").status_code == 404  # nothing published yet
    publish_version(weights().items(), root, 1, base_model)
    pub = publish_version(weights(2.0).items(), root, 2, base_model)
    info = get(server, "/versions/latest").json()
    assert info["version"] == 2
    on_disk = {p.name: p.stat().st_size for p in pub.path.iterdir()}
    assert info["files"] == on_disk and "model.safetensors" in on_disk
    r = get(server, "/versions/1/model.safetensors")
    assert r.content == (root / "v1" / "model.safetensors").read_bytes()
    assert int(r.headers["content-length"]) == len(r.content)


def test_an_incomplete_version_is_invisible(server, root, base_model) -> None:
    publish_version(weights().items(), root, 1, base_model)
    tmp = root / ".v2.tmp-123"  # publish_version's folder before its rename
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"half")
    half = root / "v3"  # a folder without its gagar-version.json (written last)
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"half")
    for path in ("/versions/.v2.tmp-123", "/versions/3", "/versions/3/model.safetensors"):
        assert get(server, path).status_code == 404, path
    (root / "latest").unlink()
    (root / "latest").symlink_to("v3")  # latest pointing at an incomplete folder: nothing
    assert get(server, "/versions/latest").status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/versions/1/../../secret.txt",
        "/versions/1/%2E%2E%2F%2E%2E%2Fsecret.txt",
        "/versions/1/..%2F..%2Fsecret.txt",
        "/versions/..%2F..%2F/secret.txt",
        "/versions/1/link.txt",
        "/versions/-1",
        "/versions/1/.hidden",
    ],
)
def test_no_path_from_the_request_reaches_the_file_system(
    server, root, base_model, path: str
) -> None:
    publish_version(weights().items(), root, 1, base_model)
    secret = root.parent / "secret.txt"
    secret.write_text("SECRET-BYTES")
    (root / "v1" / "link.txt").symlink_to(secret)
    (root / "v1" / ".hidden").write_text("HIDDEN-BYTES")
    r = httpx.get(server.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 404, (path, r.status_code)
    assert b"SECRET-BYTES" not in r.content and b"HIDDEN-BYTES" not in r.content


def test_fetch_replaces_the_folder_whole_and_checks_sizes(server, root, base_model, tmp_path):
    publish_version(weights().items(), root, 1, base_model)
    dest = tmp_path / "boot"
    got = fetch_version(server.url, dest, TOKEN)
    assert got.version == 1 and got.path == dest
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in (root / "v1").iterdir())
    loaded = load_file(dest / "model.safetensors")
    assert torch.equal(loaded["model.embed_tokens.weight"], weights()["model.embed_tokens.weight"])
    publish_version(weights(3.0).items(), root, 2, base_model)
    assert fetch_version(server.url, dest, TOKEN).version == 2
    assert json.loads((dest / "gagar-version.json").read_text())["version"] == 2
    assert not list(tmp_path.glob(".boot*"))  # no temporary folder left
    url = f"{server.url}/versions/2/model.safetensors"
    size = (root / "v2" / "model.safetensors").stat().st_size
    with pytest.raises(FetchError, match="bytes arrived"):
        download(url, tmp_path / "short", size + 1, TOKEN)
    assert not (tmp_path / "short").exists() and not list(tmp_path.glob(".short*"))
    with pytest.raises(FetchError, match="refused the weight-sync token") as err:
        fetch_version(server.url, tmp_path / "x", "wrong")
    assert err.value.status == 403


def test_boot_falls_back_to_the_base_model_when_nothing_is_published(server, tmp_path):
    dest = tmp_path / "boot"
    assert boot_weights(server.url, dest, TOKEN, "/models/base", wait_s=30) is None
    assert not dest.exists()


def test_boot_without_a_base_model_waits_for_the_first_version(server, root, base_model, tmp_path):
    def publish_later() -> None:
        time.sleep(0.5)
        publish_version(weights().items(), root, 4, base_model)

    threading.Thread(target=publish_later).start()
    got = boot_weights(server.url, tmp_path / "boot", TOKEN, None, wait_s=0, poll_s=0.1)
    assert got == tmp_path / "boot" and (got / "config.json").exists()


def test_boot_when_the_trainer_is_unreachable_and_when_it_refuses(server, tmp_path) -> None:
    gone = "http://127.0.0.1:9"  # discard port: nothing answers
    t0 = time.monotonic()
    assert boot_weights(gone, tmp_path / "b", TOKEN, "/models/base", wait_s=0.3, poll_s=0.1) is None
    assert time.monotonic() - t0 >= 0.3  # it waited for the trainer first
    with pytest.raises(FetchError, match="refused"):
        boot_weights(server.url, tmp_path / "b", "wrong", "/models/base", wait_s=30)


def test_the_init_containers_command(server, root, base_model, tmp_path, monkeypatch, capsys):
    dest = tmp_path / "boot"
    args = ["rollout", "fetch-weights", f"--url={server.url}", f"--dest={dest}"]
    monkeypatch.delenv(env.WEIGHT_SYNC_TOKEN, raising=False)
    assert main(args) == 2  # no token: said, not tried
    monkeypatch.setenv(env.WEIGHT_SYNC_TOKEN, TOKEN)
    assert main([*args, "--base-model=/models/base"]) == 0
    assert "booting from /models/base" in capsys.readouterr().out and not dest.exists()
    publish_version(weights().items(), root, 7, base_model)
    assert main([*args, "--base-model=/models/base"]) == 0
    assert f"booting from {dest}" in capsys.readouterr().out
    assert json.loads((dest / "gagar-version.json").read_text())["version"] == 7
    monkeypatch.setenv(env.WEIGHT_SYNC_TOKEN, "wrong")
    assert main(args) == 1


def test_a_sync_through_the_weight_server_loads_every_tensor(
    server, root, base_model, monkeypatch
) -> None:
    """The trainer's side: each replica is told the server's URL, then each chunk's file URL and
    size; the fake vLLM fetches the file with the run's token, as gagar's backend does."""
    monkeypatch.setattr(weight_http, "CHUNK", 7)  # many small reads of one stream
    token = control_token()
    server.close()
    s = WeightServer(root, token, host="127.0.0.1")
    try:
        with FakeOpenAIServer() as fake:
            sync = SafetensorsWeightSync([ReplicaClient(fake.base_url)], root, base_model,
                                         chunk=1, url=s.url + "/")  # fmt: skip
            sync.init()
            assert fake.state.url == s.url and fake.state.root is None
            w = weights(5.0)
            sync.sync(w.items(), 3)
            assert fake.state.version == "3" and set(fake.state.loaded) == set(w)
            assert fake.state.fetched == [f"{s.url}/versions/3/model.safetensors"] * len(w)
            update = next(b for p, b in fake.state.requests if p == "/update_weights")
            size = os.path.getsize(root / "v3" / "model.safetensors")
            assert update["update_info"]["size"] == size
    finally:
        s.close()
