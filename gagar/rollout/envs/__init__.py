"""Code-repair environments: the task format, task families, verification and the agent's tools.

API:

- ``task``: ``Task`` (SWE-style: ``instance_id``, repository snapshot as ``files`` or a
  ``snapshot`` path, ``problem_statement``, ``FAIL_TO_PASS``/``PASS_TO_PASS``, pristine
  ``test_files``, ``test_command``, ``reference_files``); ``load_tasks(path)`` reads
  JSONL and raises ``TaskError`` naming the line and field; ``dump_tasks``.
- ``patches``: ``apply_patch(files, patch)`` applies a unified diff strictly (a task's
  ``test_patch`` joins its ``test_files`` on load).
- ``synthetic``: ``generate(seed) -> Task`` and ``generate_many(n, seed)``, deterministic, each
  checked at generation (reference passes every hidden test, the bug fails at least one);
  ``check_in_sandbox(task, factory)`` repeats that through the verifier.
- ``humaneval``: ``tasks(limit=None)``, the 164 HumanEval problems as repository tasks.
- ``verify``: ``verify(task, session, factory) -> Verdict`` runs the hidden tests against
  pristine test files in a fresh sandbox (the candidate's session is left as it was);
  ``verify_files`` does the same for a files mapping; ``suspected_tampering(patch, task)``.
- ``plant``: the canary and control tests each verification plants in the task's test files.
- ``tools``: ``tool_definitions()`` (OpenAI ``tools`` list), ``Env(task, session)`` and
  ``execute(env, tool_call) -> Observation``.
"""
