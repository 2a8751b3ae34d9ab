"""Groupwise graders: shared workspace, heuristic grader, agentic grader, grader service.

Public API (input and output types live in ``gagar.wire``):

- input: ``GradingGroup`` (task statement, base files, ``Candidate``s with final files, patch,
  trajectory of ``Action``s, test log, ``passed``/``valid``, optional ``ToolStats``; optional
  ``relevant_files``/``protected_files``/``test_command``); output: ``Ranking``.
- ``protocol.Grader``: ``await grader.grade(group) -> Ranking``; never raises for bad model output.
  ``protocol.HeuristicGrader(config)`` and ``agentic.AgenticGrader(config, sandbox_factory)``.
- ``heuristic.rank(group, config) -> Ranking``: pure and deterministic.
- ``protocol.GraderSandbox`` / ``SandboxFactory``: how the agentic grader reaches a sandbox.
- ``workspace.write_workspace(group, dir)`` / ``load_group(path)``: the on-disk layout.
- ``bounds.admit(files)``: how much candidate content the host reads and parses, and the
  ``Skipped`` report of what it left out (``GradingGroup.skipped``, ``Ranking.skipped``).
- ``service.GraderService`` (``gagar grader serve``) and ``service.GraderClient``.
"""
