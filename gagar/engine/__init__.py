"""The engine protocol shared by rollout and grader, and its vLLM client.

* ``base``   — ``Engine`` (token ids in, ``Generation`` out: the agent loop, the evaluation, the
               SFT experts), ``ChatEngine`` (messages and tools in, ``ChatReply`` out: the agentic
               grader), ``SamplingParams``, ``EngineError``
* ``client`` — ``AsyncOpenAIEngine``: both over vLLM's OpenAI-compatible HTTP

It imports nothing of gagar's components, so trainer, rollout and grader can all depend on it.
"""
