"""The RL driver: the composition root where trainer, rollout and grader meet.

``gagar.trainer``, ``gagar.rollout`` and ``gagar.grader`` stay independent of each other (an
import-linter contract); this package wires them together for one step: sample tasks, roll out
groups, dynamic sampling, asynchronous grading, GAGAR advantages, the policy update, weight sync,
checkpoints and metrics.

``setup`` is the one builder (``build_rank`` on every rank, ``build`` on rank 0) and ``loop`` the
one loop (``train(ctx)``: the steps, the held-out evaluation, the report); ``local`` (``gagar
train``) and ``worker`` (the cluster trainer) each give it a ``Provider``. See docs/driver.md.
"""
