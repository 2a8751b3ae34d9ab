"""gagar's vLLM backend fetching a version from the trainer's weight server (a cluster's path).

The backend runs in vLLM's Python (``.venv-vllm``); the weight server runs here, in the test's
process, over real HTTP. The worker is gagar's engine class with a model that records what it
is given (a real vLLM model's loading is tests/integration/test_vllm_engine.py's, through the
same ``receive_weights``). Checks: the tensors arrive as published, fetched once per version
whatever the number of chunks and deleted when the update ends; a weight server other than
the one the pod names, a URL outside it (or climbing out of it), a size that does not match,
and a token the trainer refuses all fail the update.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from gagar import env
from gagar.rollout.engines.server import vllm_python
from gagar.rollout.engines.weight_http import WeightServer
from gagar.rollout.engines.weight_sync import SafetensorsWeightSync, publish_version
from tests.support.vllm_required import require_vllm

TOKEN = "the-runs-token"
WORKER = r"""
import json, os, sys
from pathlib import Path

import torch

from gagar.rollout.engines.vllm_plugin import SafetensorsWeightTransferEngine as Engine


class Model:
    def __init__(self):
        self.got = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.got[name] = tensor.tolist()


engine = Engine.__new__(Engine)  # vLLM constructs it with its config; the model is what counts
engine.model, engine.device = Model(), torch.device("cpu")
url, update = os.environ["GAGAR_WEIGHTS_URL"], json.loads(sys.argv[1])
out = {}


def attempt(key, init=None, **change):
    try:
        if init is not None:
            engine.init_transfer_engine(engine.parse_init_info(init))
        else:
            engine.receive_weights(engine.parse_update_info({**update, **change}))
        out[key] = "ok"
    except Exception as e:
        out[key] = f"{type(e).__name__}: {e}"


def files():
    return sorted(str(p) for p in Path(os.environ["GAGAR_WEIGHTS_DIR"]).rglob("*.safetensors"))


attempt("other_server", init={"url": "http://attacker.example:8600"})
attempt("before_init")
attempt("init", init={"url": url + "/"})
attempt("outside", url="http://attacker.example:8600/versions/1/model.safetensors")
attempt("climbing", url=update["url"].replace("/versions/1/", "/versions/1/../../"))
attempt("wrong_size", size=update["size"] + 1)
attempt("first_chunk", names=update["names"][:1])
inode = [os.stat(f).st_ino for f in files()]
attempt("second_chunk", names=update["names"][1:])
out["fetched_once"] = inode == [os.stat(f).st_ino for f in files()] and len(inode) == 1
engine.shutdown()  # finish_weight_update deletes the file the same way
out["left_after"] = files()
engine.init_transfer_engine(engine.parse_init_info({"url": url}))
os.environ["GAGAR_WEIGHT_SYNC_TOKEN"] = "not-the-runs-token"
attempt("wrong_token")
out["got"] = engine.model.got
print("RESULT " + json.dumps(out))
"""


def test_the_backend_fetches_a_version_from_the_named_server_only(tmp_path: Path) -> None:
    require_vllm()
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    g = torch.Generator().manual_seed(0)
    weights = {"a.weight": torch.randn(3, 2, generator=g), "b.weight": torch.randn(4, generator=g)}
    root = tmp_path / "published"
    pub = publish_version(weights.items(), root, 1, base)
    server = WeightServer(root, TOKEN, host="127.0.0.1")
    try:
        sync = SafetensorsWeightSync([object()], root, base, url=server.url)  # type: ignore[list-item]
        update = sync.update_info(pub, sorted(weights))
        local = tmp_path / "pod-disk"
        child_env = {**os.environ, env.WEIGHTS_URL: server.url, env.WEIGHTS_DIR: str(local),
                     env.WEIGHT_SYNC_TOKEN: TOKEN, "VLLM_TARGET_DEVICE": "cpu"}  # fmt: skip
        proc = subprocess.run(
            [vllm_python(), "-c", WORKER, json.dumps(update)],
            env=child_env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        server.close()
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))

    assert "is not the weight server this replica was given" in out["other_server"]
    assert out["before_init"].startswith("RuntimeError")  # no server named yet: nothing fetched
    assert out["init"] == "ok"
    assert "is not a published file of" in out["outside"]
    assert "is not a published file of" in out["climbing"]
    assert "bytes arrived" in out["wrong_size"]
    assert out["first_chunk"] == out["second_chunk"] == "ok"
    assert out["fetched_once"] is True  # one download for both chunks
    assert out["left_after"] == []  # deleted when the update ends
    assert "refused the weight-sync token" in out["wrong_token"]
    assert set(out["got"]) == set(weights)
    for name, tensor in weights.items():
        assert torch.equal(torch.tensor(out["got"][name]), tensor), name
