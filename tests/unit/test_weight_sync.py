"""Publishing policy versions and driving vLLM's RL weight-update routes (against the fake)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gagar.rollout.engines.weight_sync import (
    ReplicaClient,
    SafetensorsWeightSync,
    WeightSyncError,
    chunked,
    prune_versions,
    publish_version,
)
from tests.support.fake_vllm import FakeOpenAIServer
from tests.support.openai_engine import engine_for_servers
from tests.support.published import random_weights, write_base_model


@pytest.fixture
def base_model(tmp_path: Path) -> Path:
    return write_base_model(tmp_path)


def weights(scale: float = 1.0) -> dict[str, torch.Tensor]:
    return random_weights(scale)


def test_publish_writes_a_bootable_folder_and_points_latest(tmp_path, base_model):
    root = tmp_path / "pub"
    w = weights()
    pub = publish_version(w.items(), root, 3, base_model)
    assert pub.path == root / "v3" and (root / "latest").resolve() == pub.path.resolve()
    assert (pub.path / "config.json").exists() and (pub.path / "tokenizer.json").exists()
    loaded = load_file(str(root / "latest" / "model.safetensors"))
    assert set(loaded) == set(w) and all(torch.equal(loaded[k], w[k]) for k in w)
    assert pub.num_bytes == sum(t.numel() * 4 for t in w.values())
    publish_version(weights(2.0).items(), root, 4, base_model)
    assert (root / "latest").resolve().name == "v4"
    assert not list(root.glob(".v*"))  # no temporary folders left behind


def test_publish_rejects_duplicates_empty_and_negative_versions(tmp_path, base_model):
    dup = [("a", torch.zeros(1)), ("a", torch.ones(1))]
    with pytest.raises(ValueError, match="'a' yielded twice"):
        publish_version(dup, tmp_path / "p", 1, base_model)
    with pytest.raises(ValueError, match="no weights"):
        publish_version([], tmp_path / "p", 1, base_model)
    with pytest.raises(ValueError, match=">= 0"):
        publish_version(weights().items(), tmp_path / "p", -1, base_model)
    assert not (tmp_path / "p" / "v1").exists()


def test_publish_writes_tied_weights_once(tmp_path, base_model):
    """An HF state dict of a tied model (SmolLM2) names one tensor twice; it is written once, under
    its first name, and a slice of the same memory with another shape is still its own tensor."""
    embed = torch.randn(10, 4)
    tied = [
        ("model.embed_tokens.weight", embed),
        ("model.norm.weight", embed[0]),  # same data_ptr, other shape: not an alias
        ("lm_head.weight", embed),
    ]
    pub = publish_version(tied, tmp_path / "p", 1, base_model)
    loaded = load_file(str(pub.path / "model.safetensors"))
    assert pub.names == ["model.embed_tokens.weight", "model.norm.weight"] == sorted(loaded)
    assert torch.equal(loaded["model.embed_tokens.weight"], embed)
    assert torch.equal(loaded["model.norm.weight"], embed[0])
    assert pub.num_bytes == (40 + 4) * 4


def test_prune_keeps_the_newest(tmp_path, base_model):
    for v in (1, 2, 3, 10):
        publish_version(weights().items(), tmp_path, v, base_model)
    assert prune_versions(tmp_path, keep=2) == [1, 2]
    assert sorted(p.name for p in tmp_path.glob("v*")) == ["v10", "v3"]


def test_chunked_rejects_nonpositive_size():
    assert list(chunked(["a", "b", "c"], 2)) == [["a", "b"], ["c"]]
    with pytest.raises(ValueError):
        list(chunked(["a"], 0))


def test_sync_drives_vllm_routes_in_order_on_every_replica(tmp_path, base_model):
    with FakeOpenAIServer() as r1, FakeOpenAIServer() as r2:
        engine = engine_for_servers([r1.base_url, r2.base_url], tmp_path / "pub", base_model)
        engine.weight_sync.chunk = 2
        report = engine.update_weights(weights().items(), version=1)
        assert engine.policy_version() == ["1", "1"]
        assert report.num_tensors == 3 and report.replicas == 2
        for r in (r1, r2):
            paths = [p for p, _ in r.requests if p != "/weight_info"]
            assert paths == [
                "/init_weight_transfer_engine",
                "/pause",
                "/start_weight_update",
                "/update_weights",
                "/update_weights",
                "/finish_weight_update",
                "/resume",
            ]
            assert set(r.state.loaded) == set(weights())
            assert not r.state.paused and not r.state.updating
        before = dict(r1.state.loaded)
        engine.update_weights(weights(3.0).items(), version=2)
        assert engine.policy_version() == ["2", "2"]
        assert all(r1.state.loaded[k] != before[k] for k in before)  # new bytes arrived


def test_failed_update_names_the_replica_and_keeps_it_paused_until_a_sync_succeeds(
    tmp_path, base_model
):
    with FakeOpenAIServer() as r1:
        sync = SafetensorsWeightSync([ReplicaClient(r1.base_url)], tmp_path / "pub", base_model)
        sync.init()
        r1.fail_next("/update_weights", 500)
        with pytest.raises(
            WeightSyncError, match=rf"(?s){r1.base_url}/update_weights -> 500.*stays paused"
        ):
            sync.sync(weights().items(), 1)
        assert r1.state.paused  # no generation on half-loaded weights
        r1.state.updating = False  # vLLM ends the session when a chunk fails
        sync.sync(weights().items(), 2)
        assert not r1.state.paused and r1.state.version == "2"


def test_worker_refuses_files_outside_the_root_and_missing_tensors(tmp_path, base_model):
    with FakeOpenAIServer() as r1:
        client = ReplicaClient(r1.base_url)
        client.init_weight_transfer_engine({"root": str(tmp_path / "pub")})
        pub = publish_version(weights().items(), tmp_path / "elsewhere", 1, base_model)
        client.start_weight_update()
        with pytest.raises(WeightSyncError, match="outside the weight-transfer root"):
            client.update_weights(
                {"file": str(pub.path / "model.safetensors"), "names": ["lm_head.weight"]}
            )
        good = publish_version(weights().items(), tmp_path / "pub", 1, base_model)
        client.start_weight_update()  # vLLM ended the session when the chunk failed
        with pytest.raises(WeightSyncError, match="'nope' missing"):
            client.update_weights({"file": str(good.path / "model.safetensors"), "names": ["nope"]})


def test_update_outside_a_session_is_refused(tmp_path):
    with FakeOpenAIServer() as r1:
        with pytest.raises(WeightSyncError, match="start_weight_update must be called"):
            ReplicaClient(r1.base_url).update_weights({"file": "x", "names": []})


def test_missing_dev_mode_routes_give_a_hint(tmp_path, base_model):
    with FakeOpenAIServer() as r1:
        r1.fail_next("/init_weight_transfer_engine", 404)
        with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
            SafetensorsWeightSync([ReplicaClient(r1.base_url)], tmp_path, base_model).init()


def test_sync_needs_a_replica(tmp_path, base_model):
    with pytest.raises(ValueError, match="at least one replica"):
        SafetensorsWeightSync([], tmp_path, base_model)
