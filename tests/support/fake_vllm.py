"""A deterministic, scripted OpenAI-compatible server on loopback, for fast tests.

It speaks the subset of vLLM's HTTP API that gagar uses, over real HTTP, so the code under test
(agent loop, agentic grader, engine client, weight sync) runs unchanged against it:

* ``/v1/chat/completions`` answers from a script: a list of replies (text or tool calls) taken
  in order, or a function of the request. Token ids are the UTF-8 bytes of what the reply
  emits (content, then each tool call as JSON), log-probs a fixed function of the id, so every
  run gives the same numbers.
* ``/v1/completions`` continues token-id prompts with ids derived from (prompt, seed, sample
  index): the same request always gets the same answer; or, given ``completions``, answers from
  that function of the request (a scripted policy that speaks a real tokenizer).
* the RL routes (``/pause`` ... ``/weight_info``) with vLLM's state rules (update only between
  start and finish), reading published safetensors like the real backend does: from the root
  directory it was given, or fetched from the weight server at the URL it was given
  (``weight_http``, with this process's weight-sync token).

Faults: ``fail_next(path, status)`` makes the next request to ``path`` fail.
Every request is recorded in ``requests`` (path, JSON body) for assertions.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = dict[str, Any]  # {"content": str} and/or {"tool_calls": [{"name", "arguments"}]}
Script = list[Reply] | Callable[[dict[str, Any]], Reply]
Completions = Callable[[dict[str, Any]], dict[str, Any]]  # /v1/completions body -> response
VOCAB = 1000


def fake_logprob(token_id: int) -> float:
    """The fake policy's log-prob of a token: deterministic, negative, varied."""
    return -0.05 - (token_id % 17) / 10.0


def encode(text: str) -> list[int]:
    """The fake tokenizer: UTF-8 bytes (exact round trip, ids < 256)."""
    return list(text.encode())


def continuation(prompt: list[int], seed: int | None, j: int, length: int) -> list[int]:
    h = hashlib.sha256(json.dumps([prompt, seed, j]).encode()).digest()
    return [(h[k % 32] * 7 + k * 13) % VOCAB for k in range(length)]


def render(messages: list[dict[str, Any]]) -> str:
    return "".join(f"<|{m['role']}|>{m.get('content') or ''}\n" for m in messages)


class FakeState:
    """Everything the fake server knows; guarded by one lock (handlers run in threads)."""

    def __init__(self, script: Script, completions: Completions | None = None) -> None:
        self.script, self.lock = script, threading.Lock()
        self.completions = completions or completions_response
        self.requests: list[tuple[str, Any]] = []
        self.failures: dict[str, tuple[int, int]] = {}  # path -> (status, remaining)
        self.version, self.paused, self.updating = "default", False, False
        self.root: str | None = None
        self.url: str | None = None  # the weight server, when init_info names one
        self.fetched: list[str] = []  # URLs of the files fetched from it
        self.loaded: dict[str, str] = {}  # tensor name -> sha256 of its bytes
        self.turn = 0

    def next_reply(self, body: dict[str, Any]) -> Reply:
        if callable(self.script):
            return self.script(body)
        if self.turn >= len(self.script):
            raise IndexError(f"script exhausted after {len(self.script)} replies")
        self.turn += 1
        return self.script[self.turn - 1]


def chat_response(reply: Reply, body: dict[str, Any], version: str) -> dict[str, Any]:
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))},
        }
        for i, c in enumerate(reply.get("tool_calls", []))
    ]
    content = reply.get("content")
    emitted = (content or "") + "".join(json.dumps(c["function"]) for c in calls)
    ids = encode(emitted)[: body.get("max_tokens") or None]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls else reply.get("finish_reason", "stop")
    return {
        "object": "chat.completion",
        "model": body.get("model", "fake"),
        "prompt_token_ids": encode(render(body.get("messages", []))),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "token_ids": ids,
                "logprobs": {
                    "content": [{"token": f"token_id:{t}", "logprob": fake_logprob(t)} for t in ids]
                },
            }
        ],
        "gagar_fake_version": version,
    }


def completions_response(body: dict[str, Any]) -> dict[str, Any]:
    prompts = body["prompt"]
    if prompts and isinstance(prompts[0], int):
        prompts = [prompts]
    n, length = body.get("n", 1), body.get("max_tokens", 16)
    choices = []
    for i, p in enumerate(prompts):
        for j in range(n):
            ids = continuation(p, body.get("seed"), j, length)
            choices.append(
                {
                    "index": i * n + j,
                    "text": " ".join(map(str, ids)),
                    "token_ids": ids,
                    "logprobs": {"token_logprobs": [fake_logprob(t) for t in ids]},
                    "finish_reason": "length",
                }
            )
    return {"object": "text_completion", "choices": choices}


def load_published(state: FakeState, update_info: dict[str, Any]) -> None:
    """Read the named tensors as the real backend does, and remember a digest of each."""
    from pathlib import Path

    from safetensors import safe_open

    if "url" in update_info:
        _load_fetched(state, update_info)
        return
    file = Path(update_info["file"]).resolve()
    if state.root is None or not file.is_relative_to(state.root):
        raise ValueError(f"{file} is outside the weight-transfer root {state.root}")
    with safe_open(str(file), framework="numpy") as f:
        for name in update_info["names"]:
            if name not in f.keys():
                raise ValueError(f"{file}: tensor {name!r} missing")
            state.loaded[name] = hashlib.sha256(f.get_tensor(name).tobytes()).hexdigest()


def _load_fetched(state: FakeState, update_info: dict[str, Any]) -> None:
    import tempfile
    from pathlib import Path

    from safetensors import safe_open

    from gagar.rollout.engines.vllm_auth import control_token
    from gagar.rollout.engines.weight_http import download

    url = update_info["url"]
    if state.url is None or not url.startswith(state.url + "/versions/"):
        raise ValueError(f"{url} is not a published file of {state.url}")
    with tempfile.TemporaryDirectory() as tmp:
        file = download(url, Path(tmp) / "model.safetensors", update_info["size"], control_token())
        state.fetched.append(url)
        with safe_open(str(file), framework="numpy") as f:
            for name in update_info["names"]:
                if name not in f.keys():
                    raise ValueError(f"{url}: tensor {name!r} missing")
                state.loaded[name] = hashlib.sha256(f.get_tensor(name).tobytes()).hexdigest()


def _init_engine(state: FakeState, info: dict[str, Any]) -> None:
    from pathlib import Path

    if "url" in info:
        state.url, state.root = info["url"].rstrip("/"), None
    else:
        state.url, state.root = None, str(Path(info["root"]).resolve())


def _update(state: FakeState, update_info: dict[str, Any]) -> None:
    try:
        load_published(state, update_info)
    except Exception:
        state.updating = False  # vLLM ends the session when a chunk fails
        raise


def rl_route(state: FakeState, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's RL control routes with their ordering rules; raises ValueError on misuse."""
    if path == "/pause":
        state.paused = True
    elif path == "/resume":
        state.paused = False
    elif path == "/init_weight_transfer_engine":
        _init_engine(state, body["init_info"])
    elif path == "/start_weight_update":
        if state.updating:
            raise ValueError("start_weight_update called while a weight update is already active")
        state.updating = True
    elif path == "/update_weights":
        if not state.updating:
            raise ValueError("start_weight_update must be called before update_weights")
        _update(state, body["update_info"])
    elif path == "/finish_weight_update":
        if not state.updating:
            raise ValueError("finish_weight_update called without a matching start_weight_update")
        state.updating = False
        if body and body.get("weight_version") is not None:
            state.version = body["weight_version"]
    elif path == "/update_weight_version":
        state.version = body["new_version"]
    else:
        raise KeyError(path)
    return {"status": "ok"}


class _Handler(BaseHTTPRequestHandler):
    state: FakeState  # set per server by make_handler

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _injected(self, path: str) -> bool:
        with self.state.lock:
            status, left = self.state.failures.get(path, (0, 0))
            if left <= 0:
                return False
            self.state.failures[path] = (status, left - 1)
        self._send(status, {"error": f"injected failure on {path}"})
        return True

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.state.requests.append((path, None))
        if self._injected(path):
            return
        if path == "/health":
            self._send(200, {})
        elif path == "/weight_info":
            self._send(200, {"weight_version": self.state.version})
        elif path == "/v1/models":
            self._send(200, {"data": [{"id": "policy", "object": "model"}]})
        else:
            self._send(404, {"error": f"no route {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        size = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(size) or b"{}") if size else {}
        self.state.requests.append((path, body))
        if self._injected(path):
            return
        try:
            with self.state.lock:
                payload = self._dispatch(path, body)
        except KeyError as e:
            self._send(404, {"error": f"no route {e}"})
        except (ValueError, IndexError) as e:
            self._send(400, {"error": str(e)})
        else:
            self._send(200, payload)

    def _dispatch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path == "/v1/chat/completions":
            return chat_response(self.state.next_reply(body), body, self.state.version)
        if path == "/v1/completions":
            return self.state.completions(body)
        return rl_route(self.state, path, body)


def make_handler(state: FakeState) -> type[BaseHTTPRequestHandler]:
    return type("FakeHandler", (_Handler,), {"state": state})


class FakeOpenAIServer:
    """``with FakeOpenAIServer(script) as fake: OpenAIEngine([fake.base_url])``."""

    def __init__(
        self, script: Script | None = None, completions: Completions | None = None
    ) -> None:
        self.state = FakeState(script if script is not None else [], completions)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> list[tuple[str, Any]]:
        return self.state.requests

    def fail_next(self, path: str, status: int = 500, times: int = 1) -> None:
        with self.state.lock:
            self.state.failures[path] = (status, times)

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
