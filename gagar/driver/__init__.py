"""The RL driver: the composition root where trainer, rollout and grader meet.

``gagar.trainer``, ``gagar.rollout`` and ``gagar.grader`` stay independent of each other (an
import-linter contract); this package wires them together for one step: sample tasks, roll out
groups, dynamic sampling, asynchronous grading, GAGAR advantages, the policy update, weight sync,
checkpoints and metrics.
"""
