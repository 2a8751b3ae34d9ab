"""A tiny scripted OpenAI-compatible chat server for deterministic grader tests.

Each POST to ``/v1/chat/completions`` pops the next scripted turn: a message dict (returned as
``choices[0].message``), a callable ``(request_body) -> message``, or a ``Turn`` with a delay or
an HTTP status. Requests are recorded for assertions. Runs in a thread on a loopback port.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Message = dict[str, Any]


@dataclass
class Turn:
    message: Message | None = None
    delay: float = 0.0
    status: int = 200
    raw: str | None = None  # send this body verbatim (for protocol errors)


def tool_call(name: str, arguments: Any, call_id: str = "call_0") -> Message:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        ],
    }


def text(content: str) -> Message:
    return {"role": "assistant", "content": content}


@dataclass
class FakeOpenAI:
    script: list[Message | Turn | Callable[[dict], Message]]
    prompt_tokens: int = 100
    completion_tokens: int = 10
    requests: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                turn = fake._next(body)
                time.sleep(turn.delay)
                payload = turn.raw if turn.raw is not None else json.dumps(fake._response(turn))
                data = payload.encode()
                self.send_response(turn.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _next(self, body: dict) -> Turn:
        with self._lock:
            self.requests.append(body)
            if not self.script:
                return Turn(status=500, raw='{"error": "script exhausted"}')
            item = self.script.pop(0)
        if callable(item):
            return Turn(message=item(body))
        return item if isinstance(item, Turn) else Turn(message=item)

    def _response(self, turn: Turn) -> dict:
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
        choice = {"index": 0, "message": turn.message, "finish_reason": "stop"}
        return {"id": "fake", "object": "chat.completion", "choices": [choice], "usage": usage}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
