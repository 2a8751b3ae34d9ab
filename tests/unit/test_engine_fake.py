"""The OpenAI-compatible engine client against the scripted fake server (real HTTP, loopback)."""

from __future__ import annotations

import asyncio
import json

import pytest

from gagar.engine.base import ChatReply, EngineError, SamplingParams
from gagar.engine.client import AsyncOpenAIEngine, openai_base_url, parse_completions
from tests.support.fake_openai import FakeOpenAI, Turn, tool_call
from tests.support.fake_vllm import FakeOpenAIServer, encode, fake_logprob
from tests.support.openai_engine import InferenceEngine, OpenAIEngine, parse_chat, split_even

TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]


@pytest.fixture
def fake():
    script = [
        {"tool_calls": [{"name": "run_tests", "arguments": {"path": "tests/"}}]},
        {"content": "All tests pass."},
    ]
    with FakeOpenAIServer(script) as server:
        yield server


def test_engine_satisfies_protocol(fake):
    assert isinstance(OpenAIEngine([fake.base_url]), InferenceEngine)


def test_chat_tool_call_then_text_with_exact_tokens(fake):
    engine = OpenAIEngine([fake.base_url])
    msgs = [{"role": "user", "content": "fix the bug"}]
    turn = engine.chat(msgs, SamplingParams(max_tokens=200), tools=TOOLS)
    assert turn.tool_calls[0]["function"]["name"] == "run_tests"
    assert json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"path": "tests/"}
    assert turn.completion.finish_reason == "tool_calls"
    assert turn.completion.logprobs == [fake_logprob(t) for t in turn.completion.token_ids]
    assert turn.completion.prompt_ids == encode("<|user|>fix the bug\n")
    assert turn.completion.policy_version == "default"
    # The request carried the tool schemas and asked for token ids and log-probs.
    _, body = next(r for r in fake.requests if r[0] == "/v1/chat/completions")
    assert body["tools"] == TOOLS and body["return_token_ids"] and body["logprobs"]

    second = engine.chat([*msgs, turn.message], SamplingParams(max_tokens=200), tools=TOOLS)
    assert second.message["content"] == "All tests pass." and not second.tool_calls
    assert second.completion.token_ids == encode("All tests pass.")


def test_exhausted_script_is_an_engine_error(fake):
    engine = OpenAIEngine([fake.base_url])
    for _ in range(2):
        engine.chat([{"role": "user", "content": "x"}], SamplingParams())
    with pytest.raises(EngineError, match="script exhausted"):
        engine.chat([{"role": "user", "content": "x"}], SamplingParams())


def test_generate_is_deterministic_and_grouped_by_prompt(fake):
    engine = OpenAIEngine([fake.base_url])
    params = SamplingParams(max_tokens=5, n=3, seed=7)
    prompts = [[1, 2, 3], [4, 5], [6]]
    a = engine.generate(prompts, params)
    b = engine.generate(prompts, params)
    assert a == b
    assert [len(g) for g in a] == [3, 3, 3]
    assert all(c.prompt_ids == prompts[i] for i, g in enumerate(a) for c in g)
    assert all(len(c.token_ids) == 5 == len(c.logprobs) for g in a for c in g)
    assert a[0][0].token_ids != a[0][1].token_ids  # samples of one prompt differ


def test_generate_splits_the_batch_across_replicas():
    with FakeOpenAIServer() as f1, FakeOpenAIServer() as f2:
        engine = OpenAIEngine([f1.base_url, f2.base_url])
        out = engine.generate([[1], [2], [3]], SamplingParams(max_tokens=2))
        single = OpenAIEngine([f1.base_url]).generate([[1], [2], [3]], SamplingParams(max_tokens=2))
        assert out == single
        sizes = [
            [len(b["prompt"]) for p, b in f.requests if p == "/v1/completions"] for f in (f1, f2)
        ]
        assert sizes == [[2, 3], [1]]  # split 2+1, then the single-replica engine's 3
        assert engine.policy_version() == ["default", "default"]


def test_server_error_surfaces_with_status(fake):
    fake.fail_next("/v1/completions", 503)
    with pytest.raises(EngineError, match="503"):
        OpenAIEngine([fake.base_url]).generate([[1]], SamplingParams())


def test_empty_prompt_and_bad_params_are_rejected(fake):
    with pytest.raises(ValueError, match="at least one token"):
        OpenAIEngine([fake.base_url]).generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_unreachable_server_is_an_engine_error():
    with FakeOpenAIServer() as f:
        url = f.base_url
    with pytest.raises(EngineError):
        OpenAIEngine([url], timeout=2).generate([[1]], SamplingParams())


def test_parsers_reject_responses_without_tokens():
    with pytest.raises(EngineError, match="token_ids"):
        parse_completions({"choices": [{"index": 0, "text": "x"}]}, [[1]], 1, None)
    with pytest.raises(EngineError, match="expected 2 choices"):
        parse_completions({"choices": []}, [[1], [2]], 1, None)
    with pytest.raises(EngineError, match="no choices"):
        parse_chat({"choices": []}, None)
    with pytest.raises(EngineError, match="log-probs"):
        parse_completions(
            {
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "token_ids": [1, 2],
                        "logprobs": {"token_logprobs": [0.0]},
                    }
                ]
            },
            [[1]],
            1,
            None,
        )


def test_split_even_keeps_order_and_sizes():
    assert split_even([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert split_even([1], 3) == [[1], [], []]


def test_async_engine_matches_the_agent_loop_contract(fake):
    """The agent loop awaits ``generate(prompt_ids, params)`` and reads ids/logprobs/text."""
    engine = AsyncOpenAIEngine(fake.base_url)

    async def run():
        try:
            return await engine.generate([1, 2, 3], SamplingParams(max_tokens=4, seed=1))
        finally:
            await engine.aclose()

    gen = asyncio.run(run())
    ref = OpenAIEngine([fake.base_url]).generate([[1, 2, 3]], SamplingParams(max_tokens=4, seed=1))
    assert gen.token_ids == ref[0][0].token_ids and gen.logprobs == ref[0][0].logprobs
    assert gen.finish_reason == "length"


def test_openai_base_url_accepts_a_root_or_a_base():
    assert openai_base_url("http://h:8000") == "http://h:8000/v1"
    assert openai_base_url("http://h:8000/") == "http://h:8000/v1"
    assert openai_base_url("http://h:8000/v1/") == "http://h:8000/v1"


def _chat(url: str, **kw: object) -> ChatReply:
    engine = AsyncOpenAIEngine(url, "grader", api_key="secret")

    async def run() -> ChatReply:
        try:
            return await engine.chat(
                [{"role": "user", "content": "hi"}], SamplingParams(max_tokens=7), **kw
            )
        finally:
            await engine.aclose()

    return asyncio.run(run())


def test_chat_returns_the_assistant_message_and_usage():
    """The grader's side of the protocol: tools and tool_choice go out, only the transcript's
    keys come back, usage is counted."""
    call = tool_call("submit_ranking", {"tied_groups": [[0]]})
    with FakeOpenAI([call | {"refusal": None, "reasoning_content": "x"}]) as server:
        tools = [{"type": "function", "function": {"name": "submit_ranking"}}]
        reply = _chat(server.base_url.removesuffix("/v1"), tools=tools, tool_choice="required")
        body = server.requests[0]
    assert reply.message == {"role": "assistant", "content": None, "tool_calls": call["tool_calls"]}
    assert (reply.prompt_tokens, reply.completion_tokens) == (100, 10)
    assert body["model"] == "grader" and body["max_tokens"] == 7
    assert body["tools"] == tools and body["tool_choice"] == "required"


@pytest.mark.parametrize(
    ("turn", "match"),
    [
        (Turn(status=503, raw='{"error": "overloaded"}'), "503"),
        (Turn(raw="not json"), "not JSON"),
        (Turn(raw='{"choices": []}'), "malformed"),
        (Turn(raw='["a list"]'), "JSON object"),
    ],
)
def test_chat_failures_are_engine_errors(turn: Turn, match: str):
    """Each names the server and route that failed (several pools may serve one run)."""
    with FakeOpenAI([turn]) as server, pytest.raises(EngineError, match=match) as err:
        _chat(server.base_url)
    assert f"{server.base_url}/chat/completions" in str(err.value)


def test_chat_on_a_closed_port_is_an_engine_error():
    with pytest.raises(EngineError, match="chat/completions"):
        _chat("http://127.0.0.1:9")


class DroppingServer:
    """Raw HTTP/1.1 on loopback that answers the first request of each connection with a
    completion (keep-alive) and closes the connection, unanswered, on its second: the server's
    idle close crossing the client's reuse. ``drop_all`` closes every connection unanswered."""

    BODY = json.dumps(
        {
            "choices": [
                {
                    "index": 0,
                    "text": "ok",
                    "token_ids": [7],
                    "logprobs": {"token_logprobs": [-0.5]},
                    "finish_reason": "stop",
                }
            ]
        }
    ).encode()

    def __init__(self, drop_all: bool = False) -> None:
        self.drop_all, self.connections, self.answered = drop_all, 0, 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                if self.drop_all or served:
                    return
                served += 1
                self.answered += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(self.BODY)}\r\n\r\n".encode()
                    + self.BODY
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


def test_a_connection_closed_under_a_reuse_is_retried_once():
    """The second request reuses the first's connection, which the server closes unanswered: it
    is sent again on a new connection and succeeds (once, not more)."""

    async def run() -> tuple[list[list[int]], int, int]:
        server = DroppingServer()
        engine = AsyncOpenAIEngine(await server.start())
        try:
            got = [
                (await engine.generate([1, 2], SamplingParams(max_tokens=1))).token_ids
                for _ in range(3)
            ]
        finally:
            await engine.aclose()
            server.server.close()
        return got, server.connections, server.answered

    got, connections, answered = asyncio.run(run())
    assert got == [[7], [7], [7]] and answered == 3 and connections == 3


def test_a_server_that_drops_every_request_is_an_engine_error_after_two_tries():
    async def run() -> int:
        server = DroppingServer(drop_all=True)
        engine = AsyncOpenAIEngine(await server.start())
        try:
            with pytest.raises(EngineError, match="/v1/completions: ServerDisconnected"):
                await engine.generate([1], SamplingParams(max_tokens=1))
        finally:
            await engine.aclose()
            server.server.close()
        return server.connections

    assert asyncio.run(run()) == 2


def test_an_engine_serves_the_event_loop_it_was_first_used_in(fake):
    """aiohttp's connections belong to one loop: a second loop gets a clear error, not a hang."""
    engine = AsyncOpenAIEngine(fake.base_url)
    asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_tokens=2)))
    with pytest.raises(RuntimeError, match="event loop it was first used in"):
        asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_tokens=2)))
