"""vLLM's control routes take the run's weight-sync token (``gagar.rollout.engines.vllm_auth``):
the middleware as vLLM's ``--middleware`` wraps its app (an ASGI class around the routes; the real
vLLM server is in tests/integration/test_vllm_engine.py), the command line and environment of
the embedded server, and the pods the operator builds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gagar import env
from gagar.operator.builders import BuildContext, build_all
from gagar.operator.builders.common import build_weight_sync_secret
from gagar.rollout.engines import vllm_auth
from gagar.rollout.engines.server import ServerConfig, server_command, server_env
from gagar.rollout.engines.vllm_auth import MIDDLEWARE, ControlAuth, control_token, guarded
from gagar.rollout.engines.weight_sync import ReplicaClient, WeightSyncError
from tests.support.fake_vllm import FakeOpenAIServer
from tests.unit.test_builders import example

TOKEN = "s3cret-token"


ROUTES = {
    ("POST", "/update_weights"), ("POST", "/pause"), ("POST", "/collective_rpc"),
    ("POST", "/v1/completions"), ("GET", "/health"), ("GET", "/weight_info"), ("GET", "/metrics"),
}  # fmt: skip


async def routes(scope, receive, send) -> None:
    """The routes that matter, answering 200 as vLLM's do (404 for any other)."""
    status = 200 if (scope["method"], scope["path"]) in ROUTES else 404
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


def vllm_like_app() -> ControlAuth:
    """The routes wrapped by the middleware, as ``app.add_middleware(ControlAuth)`` wraps vLLM's."""
    return ControlAuth(routes, token=TOKEN)


def call(method: str, path: str, headers: dict[str, str] | None = None) -> int:
    async def go() -> int:
        transport = httpx.ASGITransport(app=vllm_like_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
            return (await client.request(method, path, headers=headers or {})).status_code

    return asyncio.run(go())


@pytest.mark.parametrize("path", ["/update_weights", "/pause", "/collective_rpc"])
def test_control_routes_refuse_a_missing_or_wrong_token(path):
    assert call("POST", path) == 401
    assert call("POST", path, {"Authorization": "Bearer nope"}) == 403
    assert call("POST", path, {"Authorization": f"Basic {TOKEN}"}) == 401
    assert call("POST", path, {"Authorization": f"Bearer {TOKEN}x"}) == 403
    assert call("POST", path, {"Authorization": f"Bearer {TOKEN}"}) == 200


def test_reads_of_control_state_need_it_probes_and_the_openai_api_do_not():
    assert call("GET", "/weight_info") == 401
    assert call("GET", "/health") == 200 and call("GET", "/metrics") == 200
    assert call("POST", "/v1/completions") == 200  # vLLM's own --api-key decides there
    assert guarded("/some_route_a_newer_vllm_adds") and guarded("/v1x") and not guarded("/v1/x")


def test_a_server_without_the_token_refuses_to_start(monkeypatch):
    monkeypatch.delenv(env.WEIGHT_SYNC_TOKEN, raising=False)
    with pytest.raises(RuntimeError, match=env.WEIGHT_SYNC_TOKEN):
        ControlAuth(routes)


def test_the_embedded_server_and_its_clients_share_one_token(tmp_path, monkeypatch):
    monkeypatch.delenv(env.WEIGHT_SYNC_TOKEN, raising=False)
    monkeypatch.setattr(vllm_auth, "_local", None)
    cfg = ServerConfig(model=tmp_path)
    cmd = server_command(cfg, "py", 1234)
    assert cmd[cmd.index("--middleware") + 1] == MIDDLEWARE
    token = server_env(cfg)[env.WEIGHT_SYNC_TOKEN]
    assert len(token) >= 32 and token == control_token() == server_env(cfg)[env.WEIGHT_SYNC_TOKEN]
    client = ReplicaClient("http://127.0.0.1:1")
    assert client._http.headers["Authorization"] == f"Bearer {token}"
    monkeypatch.setenv(env.WEIGHT_SYNC_TOKEN, "from-the-secret")  # in a pod
    assert server_env(cfg)[env.WEIGHT_SYNC_TOKEN] == "from-the-secret"
    assert ReplicaClient("http://x")._http.headers["Authorization"] == "Bearer from-the-secret"


def test_a_refused_token_is_named_in_the_sync_error(tmp_path: Path):
    with FakeOpenAIServer() as fake:
        fake.fail_next("/pause", 403)
        with pytest.raises(WeightSyncError, match="refused the weight-sync token"):
            ReplicaClient(fake.base_url).pause()


def test_trainer_and_rollout_pods_get_the_run_s_token_from_its_secret():
    run = example("single-gpu")
    objs = build_all(run, BuildContext(uid="u1"))
    secret = f"{run.metadata.name}-weight-sync"
    holders = set()
    for o in objs:
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []):
            for e in c.get("env", []):
                if e["name"] == env.WEIGHT_SYNC_TOKEN:
                    assert e["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "token"}
                    holders.add((o["metadata"]["name"], c["name"]))
    assert holders == {(f"{run.metadata.name}-rollout", "vllm"),
                       (f"{run.metadata.name}-trainer", "trainer")}  # fmt: skip
    rollout = next(
        o
        for o in objs
        if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{run.metadata.name}-rollout"
    )
    args = rollout["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--middleware") + 1] == MIDDLEWARE
    made = build_weight_sync_secret(run, BuildContext(uid="u1"), TOKEN)
    assert (
        made["metadata"]["name"] == secret and made["metadata"]["ownerReferences"][0]["uid"] == "u1"
    )
