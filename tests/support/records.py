"""Step records for tests: a complete ``StepRecord`` with plausible values, any field set by its
flat name (as in ``metrics.jsonl``)."""

from __future__ import annotations

from typing import Any

from gagar.driver.record import GradingStats, LearnerStats, RolloutStats, StepRecord

DEFAULTS: dict[str, Any] = {
    "schema_version": StepRecord.model_fields["schema_version"].default,
    "rollout_policy_version": 0,
    "staleness_versions": 0,
    "sampled_groups": 2,
    "sampling_rounds": 1,
    "shortfall": 0,
    "eligible_groups_ratio": 0.5,
    "rollout_seconds": 6.0,
    "grading_seconds": 1.0,
    "training_seconds": 2.0,
    "sync_seconds": 0.5,
    "step_seconds": 10.0,
    "checkpoint_seconds": 0.0,
}
PARTS: dict[str, Any] = {  # fields of the record's parts, by their flat names
    "pass_rate": 0.5,
    "passes": 4,
    "valid_trajectories": 8,
    "response_tokens_mean": 100.0,
    "turns_mean": 4.0,
    "trained_groups": 1,
}


def step_record(step: int = 1, **flat: Any) -> StepRecord:
    """A record of ``step``; ``flat`` overrides fields by their names on disk (``pass_rate``,
    ``adv_after_std``, ``loss``...), as ``StepRecord.from_flat`` reads them."""
    parts = {"learner": LearnerStats(), "rollouts": RolloutStats(), "grading": GradingStats()}
    base = StepRecord.model_validate({**DEFAULTS, **parts, "step": step, "policy_version": step})
    return StepRecord.from_flat({**base.flat(), **PARTS, **flat})
