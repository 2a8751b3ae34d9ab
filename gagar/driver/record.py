"""The step record: what one training step measured, built once per step by the loop
(``gagar.driver.loop.rl_step``) and read as is by every consumer: ``metrics.jsonl`` (one record a
line, with ``schema_version``), Prometheus (``report.export``), the experiment trackers, the
report and its plots, and the benches.

Fields are flat (one JSON key each, the names docs/trainer.md lists); the nested parts are typed
too (``StageSeconds``, ``FlaggedTurns``; open-ended counts by reason are ``dict[str, int]``). A
learner field of a step that trained nothing is None (no update, no learning rate used, no
gradient), never 0: plots and Prometheus skip it.

Schema versions: 1 (no ``schema_version`` key) carried ``reward_mean``, a copy of ``pass_rate``
(the reward is pass/fail); ``read_records`` reads it by dropping that copy. 2 lacked the
verification counts (``verifications``, ``verdicts_shared``: read as 0). 3 lacked the grader's
quality counts (``usable_groups``, ``heuristic_pairs``, ``audit_pairs``, ...: read as 0, which no
ratio divides by). 4: this model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

SCHEMA_VERSION = 4
# keys of an older schema that carried no information of their own, dropped when read
_DROPPED_V1 = ("reward_mean",)


class _Strict(BaseModel):
    # a key the model does not know is an error, on construction and on reading a line back
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StageSeconds(_Strict):
    """A step's wall time by stage (``STAGES``); they add up to ``step_seconds``."""

    rollout: float = 0.0
    grading_wait: float = 0.0
    update: float = 0.0
    sync: float = 0.0
    checkpoint: float = 0.0
    other: float = 0.0


class FlaggedTurns(_Strict):
    """Turns the agent loop flagged, by kind (``Trajectory.flag_counts``)."""

    redundant: int = 0
    tool_error: int = 0
    churn: int = 0


class AdvantageStats(_Strict):
    mean: float = 0.0
    std: float = 0.0
    abs_max: float = 0.0


class LearnerStats(_Strict):
    """The policy update's numbers (``Learner.update``), under the record's names; None where
    the step trained nothing."""

    loss: float | None = None
    kl: float | None = None
    entropy: float | None = None
    lr: float | None = None
    rollout_logp_abs_diff: float | None = None
    clip_ratio: float | None = None
    clip_low_ratio: float | None = None
    clip_high_ratio: float | None = None
    clip_dual_ratio: float | None = None
    ratio_mean: float | None = None
    ratio_max: float | None = None
    tis_weight: float | None = None
    grad_norm: float | None = None
    gradient_variance: float | None = None
    gradient_variance_scaled: float | None = None
    gradient_mean_norm: float | None = None
    gradient_noise_scale: float | None = None
    gradient_noise_trace: float | None = None
    gradient_signal_sq: float | None = None
    tokens_trained: int = 0
    micro_batches: int = 0
    optimizer_steps: int = 0


class RolloutStats(_Strict):
    """What the step's trajectories did (every sampled group, eligible or not)."""

    pass_rate: float = 0.0  # the mean reward too: the reward is pass/fail
    passes: int = 0
    valid_trajectories: int = 0
    invalid: dict[str, int] = {}  # by exit reason
    flagged_turns: FlaggedTurns = FlaggedTurns()
    tampered: int = 0
    response_tokens_mean: float = 0.0
    turns_mean: float = 0.0
    generated_tokens: int = 0
    verifications: int = 0  # verification runs (identical final repositories of a group: one)
    verdicts_shared: int = 0  # trajectories given an identical twin's verdict instead of a run


class GradingStats(_Strict):
    """Grading and advantages of the trained groups."""

    trained_groups: int = 0
    lambda_mean: float = 0.0
    fallbacks: dict[str, int] = {}  # groups GAGAR meant to redistribute and did not, by reason
    graded_by: dict[str, int] = {}  # which grader ranked each group ("none": unusable)
    grader_skipped: dict[str, int] = {}  # files the graders left out, by reason
    hacks: int = 0
    bloated_passes_ratio: float = 0.0
    bloated_passes: int = 0  # the counts behind the ratio, pooled by the summary
    graded_passes: int = 0
    # the grader's quality (``gagar.grader.quality``): counts, pooled over steps or in PromQL
    usable_groups: int = 0  # ranked by the grader itself, neither a fallback nor unusable
    heuristic_pairs: int = 0  # pairs of passes of agentic rankings compared with the heuristic's
    heuristic_agreeing_pairs: int = 0  # of them, ordered alike (<, = or >)
    audited_groups: int = 0  # graded again with the candidates relabelled (auditFraction)
    audit_unusable: int = 0  # of them, whose second grading was not usable
    audit_pairs: int = 0  # pairs of passes compared between a grading and its audit
    audit_consistent_pairs: int = 0  # of them, ordered alike
    adv_before: AdvantageStats = AdvantageStats()
    adv_after: AdvantageStats = AdvantageStats()


# The parts' fields, flat in the record and on disk (docs/trainer.md lists them by these names).
_PARTS: dict[str, type[_Strict]] = {
    "learner": LearnerStats,
    "rollouts": RolloutStats,
    "grading": GradingStats,
}


class StepRecord(_Strict):
    """One step, as written to ``metrics.jsonl``. Built by the loop from its typed parts
    (``StepRecord.build``); consumers read attributes, so a key the record does not have is a
    type error (mypy) or an ``AttributeError``, never a silent ``.get`` default."""

    schema_version: int = SCHEMA_VERSION
    step: int
    policy_version: int
    rollout_policy_version: int
    staleness_versions: int  # updates between the sampling and this one
    checkpoint_step: int = 0  # the newest complete checkpoint when the record was written

    learner: LearnerStats
    rollouts: RolloutStats
    grading: GradingStats

    sampled_groups: int
    sampling_rounds: int
    shortfall: int  # groups short of the quota after the last round
    eligible_groups_ratio: float

    rollout_seconds: float
    grading_seconds: float
    training_seconds: float
    sync_seconds: float
    step_seconds: float
    # None until the checkpoint is complete (a checkpoint step's record is rewritten then); 0 on
    # a step without one
    checkpoint_seconds: float | None = None
    stage_seconds: StageSeconds = StageSeconds()
    rollout_tokens_per_second: float = 0.0
    training_tokens_per_second: float = 0.0

    def flat(self) -> dict[str, Any]:
        """The record as one JSON object: the parts' fields at the top level (advantage stats as
        ``adv_<stage>_<stat>``), the names on disk and in docs/trainer.md."""
        out = self.model_dump(exclude=set(_PARTS))
        for part in _PARTS:
            for key, value in getattr(self, part).model_dump().items():
                if key in ("adv_before", "adv_after"):
                    out.update({f"{key}_{k}": v for k, v in value.items()})
                else:
                    out[key] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.flat())

    @classmethod
    def from_flat(cls, data: dict[str, Any]) -> StepRecord:
        """A record from its JSON object, of this schema or an older one (see the module's
        docstring); an unknown key or a missing field is a ``ValueError``."""
        data = dict(data)
        version = data.pop("schema_version", 1)
        if version == 1:
            for key in _DROPPED_V1:
                data.pop(key, None)
        elif version not in range(2, SCHEMA_VERSION + 1):
            raise ValueError(
                f"step record schema {version}: this gagar reads 1 to {SCHEMA_VERSION}"
            )
        # every field is on disk (a value the step lacks is null); older schemas lack the fields
        # added since (``_NEW_IN``), which then take their defaults
        optional = frozenset().union(*(_NEW_IN[v] for v in _NEW_IN if v > version))
        missing = sorted(_flat_keys() - optional - set(data) - {"schema_version"})
        if missing:
            raise ValueError(f"step record of schema {version} lacks {', '.join(missing)}")
        parts: dict[str, dict[str, Any]] = {}
        for part, model in _PARTS.items():
            fields: dict[str, Any] = {}
            for name in model.model_fields:
                if name in ("adv_before", "adv_after"):
                    fields[name] = {
                        k: data.pop(f"{name}_{k}")
                        for k in AdvantageStats.model_fields
                        if f"{name}_{k}" in data
                    }
                elif name in data:
                    fields[name] = data.pop(name)
            parts[part] = fields
        return cls.model_validate({**data, **parts})

    @classmethod
    def from_json(cls, line: str) -> StepRecord:
        return cls.from_flat(json.loads(line))


def _flat_keys() -> frozenset[str]:
    keys = set(StepRecord.model_fields) - set(_PARTS)
    for model in _PARTS.values():
        for name in model.model_fields:
            if name in ("adv_before", "adv_after"):
                keys |= {f"{name}_{k}" for k in AdvantageStats.model_fields}
            else:
                keys.add(name)
    return frozenset(keys)


# The fields each schema added (schema 1 also left out every learner field a step lacked).
_NEW_IN: dict[int, frozenset[str]] = {
    2: frozenset(
        {"checkpoint_step", "grader_skipped"}
        | {name for name, info in LearnerStats.model_fields.items() if info.default is None}
    ),
    3: frozenset({"verifications", "verdicts_shared"}),
    4: frozenset(
        {
            "usable_groups",
            "heuristic_pairs",
            "heuristic_agreeing_pairs",
            "audited_groups",
            "audit_unusable",
            "audit_pairs",
            "audit_consistent_pairs",
        }
    ),
}


def read_records(path: Path) -> list[StepRecord]:
    """The records of a ``metrics.jsonl`` (none when it does not exist); a line that is not a
    record is a ``ValueError`` naming the file and the line."""
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(StepRecord.from_json(line))
        except (ValueError, ValidationError) as e:
            raise ValueError(f"{path}:{n}: not a step record: {e}") from e
    return out


def field_value(record: StepRecord, key: str) -> float | None:
    """The number under a flat key (``adv_after_abs_max``, ``loss``, ``pass_rate``...); None
    where the step has none. A key the record does not have raises ``KeyError``."""
    flat = record.flat()
    if key not in flat:
        raise KeyError(f"the step record has no field {key!r}")
    value = flat[key]
    if value is None:
        return None
    if isinstance(value, bool | int | float):
        return float(value)
    raise KeyError(f"step record field {key!r} is not a number")


@dataclass
class StepSamples:
    """A step's per-trajectory (and per-group) values, for Prometheus' histograms only: the
    record keeps their summaries."""

    adv_before: list[float] = field(default_factory=list)
    adv_after: list[float] = field(default_factory=list)
    lambdas: list[float] = field(default_factory=list)  # of the redistributed groups
    factors: list[float] = field(default_factory=list)  # of the graded passes
    response_tokens: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
