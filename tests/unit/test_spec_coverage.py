"""Every leaf field of the GagarRun spec acts, or is refused at the door.

``ACTS`` maps each leaf field (a dotted path; ``*`` stands for any component where a shared
sub-model repeats: pod templates, resources, pools) to the tests that show what it does.
``REFUSED`` lists values gagar cannot honour, each with a manifest holding one and the words of
the refusal, checked three ways: pydantic (``gagar validate``), the CRD's schema and CEL rules
(``tests/support/crd_check``) and the Kubernetes API emulator with the generated CRD installed (what
``kubectl apply`` answers). A field can be in both: it acts for some values and is refused for
the others. ``PENDING`` names fields whose effect a change under way delivers.

Adding a spec field: add one line to ``ACTS`` (or ``REFUSED``); the failure message says which.
The named tests must exist (read from the test files, without importing them), so the table
cannot point at a test that was renamed or removed.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import typing
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from gagar.crd import build_crd
from gagar.manifest import validate_document
from gagar.spec import GagarRunSpec
from tests.support.crd_check import crd_errors

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- fields that act
U, INT, E = "tests/unit/", "tests/integration/", "tests/e2e/"
POD = U + "test_builders.py::test_pod_template_overlays_every_component"
RENDER_GPU = INT + "test_render.py::test_single_gpu_render_shapes_the_gpu_pods"
ACTS: dict[str, tuple[str, ...]] = {
    "spec.model.path": (U + "test_builders.py::test_trainer_env_points_at_the_run_services",),
    "spec.model.preset": (U + "test_sft_data.py::test_tiny_base_policy_is_never_left_half_made",),
    "spec.model.dtype": (
        INT
        + "test_model_presets.py::test_cpu_mixed_precision_keeps_float32_weights_and_close_logprobs",
        U + "test_builders.py::test_rollout_vllm_weight_transfer",
    ),
    "spec.model.numExperts": (U + "test_spec.py::test_invalid_specs_name_the_field",),
    "spec.model.sftWarmupSteps": (U + "test_sft_data.py::test_sft_tasks_scale_with_steps",),
    "spec.model.sftLr": (
        U + "test_sft_data.py::test_sft_lr_defaults_to_from_scratch_or_fine_tuning",
    ),
    "spec.model.sftExpertTasks": (
        U + "test_sft_data.py::test_sft_expert_tasks_overrides_the_step_scaling",
    ),
    "spec.model.copyCurriculumSteps": (
        U + "test_sft_data.py::test_tiny_base_policy_is_never_left_half_made",
    ),
    "spec.algorithm.mode": (U + "test_driver_advantages.py::test_grpo_mode_ignores_the_grader",),
    "spec.algorithm.groupSize": (
        U + "test_spec_effects.py::test_group_size_and_concurrency_shape_a_group",
    ),
    "spec.algorithm.tasksPerStep": (
        U + "test_spec_effects.py::test_tasks_per_step_and_dynamic_sampling_shape_the_step",
    ),
    "spec.algorithm.totalSteps": (
        E + "test_train_local.py::test_local_example_trains_and_reports",
    ),
    "spec.algorithm.microBatchSize": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
        U + "test_learner.py::test_update_is_invariant_to_micro_batching",
    ),
    "spec.algorithm.seed": (
        U + "test_task_sampler.py::test_draw_indices_are_unique_and_reproducible",
    ),
    "spec.algorithm.stdNormalize": (U + "test_gar.py::test_grpo_hand_vectors",),
    "spec.algorithm.eps": (U + "test_gar.py::test_grpo_degenerate_groups_are_zero_not_nan",),
    "spec.algorithm.hackZeroing": (U + "test_driver_advantages.py::test_confirmed_hack_is_zeroed",),
    "spec.algorithm.dynamicSampling.enabled": (
        U + "test_spec_effects.py::test_tasks_per_step_and_dynamic_sampling_shape_the_step",
    ),
    "spec.algorithm.dynamicSampling.maxExtraRounds": (
        U + "test_spec_effects.py::test_tasks_per_step_and_dynamic_sampling_shape_the_step",
    ),
    "spec.algorithm.redistribution.lambdaMax": (
        U + "test_gar.py::test_redistribution_capped_hand_vector",
    ),
    "spec.algorithm.redistribution.rescale": (U + "test_gar.py::test_ablation_without_rescale",),
    "spec.algorithm.redistribution.qualityFactors.*": (
        U + "test_gar.py::test_quality_factors_overrides",
    ),
    "spec.algorithm.lengthPenalty.*": (
        U + "test_gar.py::test_length_penalty_hand_vector",
        U + "test_gar.py::test_length_penalty_only_above_pass_rate",
    ),
    "spec.algorithm.segmentPenalty.*": (
        U
        + "test_driver_advantages.py::test_segment_shaping_zeroes_flagged_positive_tokens_and_conserves_mass",
        U + "test_gar.py::test_segment_shaping_hand_vector",
        U + "test_agent.py::test_redundant_and_tool_error_flags",
        U + "test_agent.py::test_churn_flags_the_overwritten_edit",
    ),
    "spec.algorithm.loss.aggregation": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
        U + "test_loss.py::test_aggregation_hand_vectors",
    ),
    "spec.algorithm.loss.clipLow": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
        U + "test_loss.py::test_ppo_clip_hand_vectors",
    ),
    "spec.algorithm.loss.clipHigh": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
        U + "test_loss.py::test_ppo_clip_hand_vectors",
    ),
    "spec.algorithm.loss.dualClip": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
        U + "test_loss.py::test_ppo_clip_hand_vectors",
    ),
    "spec.algorithm.loss.truncatedIsCap": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
        U + "test_loss.py::test_truncated_importance_sampling",
    ),
    "spec.algorithm.loss.kl.coef": (
        U + "test_learner_ppo.py::test_kl_to_the_frozen_reference",
        E + "test_trainer_ppo_loop.py::test_mini_batches_kl_and_warmup_train_and_resume",
    ),
    "spec.algorithm.optimizer.warmupSteps": (
        U + "test_learner_ppo.py::test_schedule_warms_up_then_holds_or_decays",
        E + "test_trainer_ppo_loop.py::test_mini_batches_kl_and_warmup_train_and_resume",
    ),
    "spec.algorithm.loss.kl.estimator": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
        U + "test_loss.py::test_kl_estimators_hand_values",
    ),
    "spec.algorithm.miniBatches": (
        "tests/unit/test_learner_ppo.py::test_second_mini_batch_sees_the_moved_policy",
        "tests/e2e/test_trainer_ppo_loop.py::test_mini_batches_kl_and_warmup_train_and_resume",
    ),
    "spec.algorithm.ppoEpochs": (
        "tests/unit/test_learner_ppo.py::test_epochs_with_a_large_step_make_the_clips_act",
    ),
    "spec.algorithm.microBatchTokens": (
        "tests/unit/test_learner_ppo.py::test_token_budget_micro_batches_pad_less_and_update_the_same",
    ),
    "spec.algorithm.optimizer.schedule": (
        "tests/unit/test_learner_ppo.py::test_schedule_warms_up_then_holds_or_decays",
    ),
    "spec.algorithm.optimizer.minLr": (
        "tests/unit/test_learner_ppo.py::test_schedule_warms_up_then_holds_or_decays",
    ),
    "spec.trainer.failurePolicy.backoffSeconds": (
        "tests/unit/test_status.py::test_restart_waits_for_an_exponential_backoff",
    ),
    "spec.trainer.failurePolicy.maxBackoffSeconds": (
        "tests/unit/test_status.py::test_restart_waits_for_an_exponential_backoff",
    ),
    "spec.trainer.shmSize": (
        "tests/integration/test_render.py::test_single_gpu_render_shapes_the_gpu_pods",
    ),
    "spec.rollout.shmSize": (
        "tests/integration/test_render.py::test_single_gpu_render_shapes_the_gpu_pods",
    ),
    "spec.grader.shmSize": (
        "tests/integration/test_render.py::test_single_gpu_render_shapes_the_gpu_pods",
    ),
    "spec.rollout.maxStaleness": (
        "tests/integration/test_loop_staleness.py::test_synchronous_loop_samples_each_step_on_the_last_update",
        "tests/integration/test_loop_staleness.py::test_one_version_of_staleness_overlaps_rollouts_with_the_update",
    ),
    "spec.model.sftExpertStyles.clean": (
        "tests/integration/test_sft_experts.py::test_the_spec_style_mix_decides_which_experts_run",
        "tests/unit/test_sft_data.py::test_expert_style_mix_comes_from_the_spec",
    ),
    "spec.model.sftExpertStyles.bloated": (
        "tests/integration/test_sft_experts.py::test_the_spec_style_mix_decides_which_experts_run",
        "tests/unit/test_sft_data.py::test_expert_style_mix_comes_from_the_spec",
    ),
    "spec.model.sftExpertStyles.redundant": (
        "tests/integration/test_sft_experts.py::test_the_spec_style_mix_decides_which_experts_run",
        "tests/unit/test_sft_data.py::test_expert_style_mix_comes_from_the_spec",
    ),
    "spec.model.sftExpertStyles.wrong": (
        "tests/integration/test_sft_experts.py::test_the_spec_style_mix_decides_which_experts_run",
        "tests/unit/test_sft_data.py::test_expert_style_mix_comes_from_the_spec",
    ),
    "spec.algorithm.optimizer.lr": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
    ),
    "spec.algorithm.optimizer.weightDecay": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
    ),
    "spec.algorithm.optimizer.betas": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
    ),
    "spec.algorithm.optimizer.gradClip": (
        INT
        + "test_spec_reaches_the_learner.py::test_algorithm_settings_reach_the_optimizer_and_the_loss",
    ),
    "spec.trainer.image": (
        U + "test_spec_effects.py::test_every_component_runs_the_image_its_spec_names",
    ),
    "spec.trainer.nodes": (U + "test_builders.py::test_trainer_indexed_job",),
    "spec.trainer.processesPerNode": (U + "test_builders.py::test_trainer_indexed_job",),
    "spec.*.resources.*": (
        U + "test_spec_effects.py::test_every_component_gets_the_resources_its_spec_names",
        RENDER_GPU,
    ),
    "spec.trainer.parallelism.tensor": (
        INT + "test_model_parallel.py::test_parallel_matches_single_process",
        U + "test_cluster_trainer.py::test_every_example_passes_the_trainers_start_up_checks",
    ),
    "spec.trainer.parallelism.expert": (
        INT + "test_model_parallel.py::test_parallel_matches_single_process",
    ),
    "spec.trainer.failurePolicy.maxRestarts": (
        INT + "test_operator_scenarios.py::test_trainer_failure_and_restart_budget",
    ),
    "spec.trainer.checkpoint.intervalSteps": (
        E + "test_train_local.py::test_sigkill_mid_step_resumes_and_a_dead_engine_is_a_clear_error",
    ),
    "spec.trainer.checkpoint.keep": (U + "test_checkpoint.py::test_save_load_roundtrip_and_prune",),
    "spec.trainer.checkpoint.resume": (
        U + "test_checkpoint_hostile.py::test_resume_falls_back_past_checkpoints_that_do_not_load",
    ),
    "spec.trainer.checkpoint.volumeSize": (U + "test_builders.py::test_checkpoint_pvc",),
    "spec.trainer.checkpoint.storageClassName": (U + "test_builders.py::test_checkpoint_pvc",),
    "spec.trainer.checkpoint.existingClaim": (U + "test_builders.py::test_checkpoint_pvc",),
    "spec.trainer.checkpoint.accessMode": (
        U + "test_checkpoint_storage.py::test_access_mode_follows_what_the_run_needs",
        U
        + "test_checkpoint_storage.py::test_the_rollout_pool_mounts_no_checkpoint_volume_and_goes_anywhere",
    ),
    "spec.trainer.checkpoint.retention": (
        U + "test_builders.py::test_checkpoint_pvc_outlives_the_run_unless_asked",
        "tests/integration/test_operator_scenarios.py::"
        "test_checkpoints_outlive_the_run_and_a_new_run_resumes_from_them",
    ),
    "spec.trainer.activeDeadlineSeconds": (
        "tests/integration/test_operator_scenarios.py::"
        "test_a_finished_trainer_gets_its_ttl_and_a_deadline_fails_the_run",
    ),
    "spec.trainer.ttlSecondsAfterFinished": (
        "tests/integration/test_operator_scenarios.py::"
        "test_a_finished_trainer_gets_its_ttl_and_a_deadline_fails_the_run",
    ),
    "spec.*.podTemplate.*": (
        U + "test_spec_effects.py::test_every_pod_template_field_reaches_the_pods",
        POD,
        RENDER_GPU,
    ),
    "spec.trainer.queueName": (
        U + "test_builders.py::test_kueue_queue_label_on_the_trainer_workload",
    ),
    "spec.trainer.useJobSet": (U + "test_builders.py::test_jobset_only_when_asked_and_installed",),
    "spec.trainer.device": (
        U + "test_spec_effects.py::test_cuda_devices_need_a_gpu",
        U + "test_spec_effects.py::test_trainer_device_cpu_is_refused_where_cuda_would_be_used",
    ),
    "spec.*.replicas": (U + "test_builders.py::test_fixed_replicas_written",),
    "spec.*.autoscaling.*": (
        U + "test_spec_effects.py::test_autoscaling_settings_reach_keda",
        U + "test_builders.py::test_autoscaled_pool_hpa",
    ),
    "spec.*.endpoint": (
        U + "test_builders.py::test_endpoint_pool_builds_nothing",
        U + "test_builders.py::test_trainer_env_with_external_endpoints_and_local_sandboxes",
    ),
    "spec.rollout.image": (
        U + "test_spec_effects.py::test_every_component_runs_the_image_its_spec_names",
    ),
    "spec.rollout.tensorParallelSize": (
        U + "test_spec_effects.py::test_rollout_pool_settings_reach_vllm",
    ),
    "spec.rollout.device": (U + "test_spec_effects.py::test_cuda_devices_need_a_gpu",),
    "spec.rollout.gpuMemoryUtilization": (
        U + "test_spec_effects.py::test_rollout_pool_settings_reach_vllm",
    ),
    "spec.rollout.weightSync.transport": (
        U + "test_builders.py::test_rollout_vllm_weight_transfer",
    ),
    "spec.rollout.agent.*": (
        U + "test_spec_effects.py::test_agent_settings_reach_the_rollouts",
        U + "test_spec_effects.py::test_group_size_and_concurrency_shape_a_group",
    ),
    "spec.grader.kind": (
        U
        + "test_driver_grader_model.py::test_only_an_agentic_grader_without_endpoint_gets_a_server",
    ),
    "spec.grader.model": (
        U + "test_driver_grader_model.py::test_grader_model_is_a_preset_or_a_local_folder",
    ),
    "spec.grader.toolCallParser": (
        U + "test_driver_grader_model.py::test_server_is_started_with_the_spec_tool_call_parser",
    ),
    "spec.grader.maxTokensPerTurn": (
        U + "test_driver_grader_model.py::test_build_graders_talks_to_the_runners_server",
    ),
    "spec.grader.image": (
        U + "test_spec_effects.py::test_every_component_runs_the_image_its_spec_names",
    ),
    "spec.grader.deadlineSeconds": (
        U + "test_driver_bad_input.py::test_grader_past_its_deadline_falls_back_with_the_reason",
    ),
    "spec.grader.fallback": (
        U + "test_grader_agentic.py::test_malformed_output_retries_then_falls_back_to_heuristic",
    ),
    "spec.grader.maxRetries": (
        U + "test_grader_agentic.py::test_malformed_output_retries_then_falls_back_to_heuristic",
    ),
    "spec.grader.auditFraction": (
        U + "test_grader_quality.py::test_audit_fraction_sets_the_share_of_groups_graded_again",
    ),
    "spec.grader.maxTurns": (
        INT + "test_pod_commands.py::test_grader_pod_reads_its_settings_from_the_config_dir",
    ),
    "spec.grader.queueSize": (
        INT + "test_grader_service.py::test_back_pressure_when_the_queue_is_full",
    ),
    "spec.sandbox.backend": (U + "test_builders.py::test_sandbox_pods_are_hardened",),
    "spec.sandbox.image": (
        U + "test_spec_effects.py::test_every_component_runs_the_image_its_spec_names",
    ),
    "spec.sandbox.limits.*": (
        INT + "test_sandbox_server.py::test_pool_sessions_get_the_runs_limits_not_the_pods",
        U + "test_sandbox_pure.py::test_argv_isolates_and_limits",
        U + "test_spec_effects.py::test_agent_settings_reach_the_rollouts",
    ),
    "spec.sandbox.runtimeClassName": (U + "test_builders.py::test_sandbox_pods_are_hardened",),
    "spec.sandbox.isolation": (
        U + "test_builders.py::test_sandbox_isolation_sets_the_executors_mode_and_identity",
        INT + "test_sandbox_stock_runtime.py::test_exec_with_no_flag_prints_ok",
        INT + "test_sandbox_stock_runtime.py::test_the_embedded_trainer_takes_the_specs_mode",
    ),
    "spec.sandbox.poolSize": (U + "test_builders.py::test_fixed_replicas_written",),
    "spec.sandbox.environments.name": (
        INT + "test_task_environments.py::"
        "test_the_specs_environments_reach_the_sandbox_and_the_sources_tasks",
        U
        + "test_task_environments.py::test_environments_are_unique_by_name_and_name_what_their_backend_uses",
    ),
    "spec.sandbox.environments.lock": (
        INT + "test_task_environments.py::"
        "test_the_specs_environments_reach_the_sandbox_and_the_sources_tasks",
        INT
        + "test_task_environments.py::test_a_lock_with_a_wrong_hash_or_without_pytest_is_refused",
    ),
    "spec.sandbox.environments.image": (
        U
        + "test_environment_pools.py::test_each_environment_gets_a_pool_of_its_image_beside_the_default_one",
        U
        + "test_environment_pools.py::test_an_environments_image_is_pulled_as_the_sandbox_image_is",
        INT
        + "test_operator_scenarios.py::test_task_environments_get_pools_that_pools_ready_waits_for",
    ),
    "spec.dataset.sources.environment": (
        INT + "test_task_environments.py::"
        "test_the_specs_environments_reach_the_sandbox_and_the_sources_tasks",
        U
        + "test_task_environments.py::test_a_source_environment_reaches_its_rows_and_a_row_keeps_its_own",
        U + "test_task_environments.py::test_a_source_naming_an_unknown_environment_is_refused",
    ),
    "spec.dataset.sources.kind": (
        U + "test_spec_effects.py::test_jsonl_sources_are_read_from_their_path",
        U + "test_mined_source.py::test_the_held_out_tasks_are_whole_packages",
        U + "test_sft_data.py::test_sft_top_up_skips_seeds_a_source_uses",
    ),
    "spec.dataset.sources.path": (
        U + "test_spec_effects.py::test_jsonl_sources_are_read_from_their_path",
    ),
    "spec.dataset.sources.repoCache": (
        U + "test_envs_swe_rows.py::test_the_sources_repo_cache_reaches_the_loader",
        U + "test_envs_swe_rows.py::test_validate_reads_the_dataset_and_names_each_bad_row",
    ),
    "spec.dataset.sources.size": (
        U + "test_task_sampler.py::test_the_spec_weights_reach_the_sampler",
    ),
    "spec.dataset.sources.seed": (
        U + "test_task_sampler.py::test_the_spec_weights_reach_the_sampler",
    ),
    "spec.dataset.sources.weight": (
        U + "test_task_sampler.py::test_the_spec_weights_reach_the_sampler",
    ),
    "spec.dataset.heldOutFraction": (
        U + "test_task_sampler.py::test_the_spec_weights_reach_the_sampler",
    ),
    "spec.observability.metricsPort": (
        INT + "test_operator_scenarios.py::test_trainer_template_changes_wait_for_suspend",
    ),
    "spec.observability.monitors": (U + "test_builders.py::test_monitors_follow_crds_and_mode",),
    "spec.observability.logLevel": (
        U + "test_cluster_trainer.py::test_worker_takes_its_log_level_from_the_run",
    ),
    "spec.observability.trackers": (INT + "test_trackers.py::test_tensorboard",),
    "spec.observability.mlflowTrackingUri": (
        INT + "test_trackers.py::test_mlflow_tracking_uri_is_honoured",
    ),
    "spec.observability.wandbProject": (INT + "test_trackers.py::test_wandb_offline",),
    "spec.authTokenSecret": (
        U + "test_auth_wiring.py::test_token_secret_is_mounted_where_the_services_and_callers_run",
    ),
    "spec.suspend": (INT + "test_operator_scenarios.py::test_suspend_and_resume",),
}

# Fields whose effect a change under way delivers (field path -> what is missing); each moves to
# ACTS with its test when it lands. Empty: every field acts or is refused.
PENDING: dict[str, str] = {}


# ---------------------------------------------------------------- refused values
def _trainer(parallelism: dict[str, Any], processes: int = 2) -> dict[str, Any]:
    return {"trainer": {"nodes": 1, "processesPerNode": processes, "parallelism": parallelism}}


# path -> (spec fragment holding a refused combination, words of the refusal); the rules behind
# them are rows of gagar.spec.RULES (tests/unit/test_spec_rules.py checks each row both ways).
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "spec.trainer.parallelism.tensor": (
        {"model": {"path": "/m", "numExperts": 8}, **_trainer({"tensor": 2})},
        "MoE layers under tensor parallelism",
    ),
    "spec.model.path": (
        {"model": {"path": "s3://models/x"}},
        "reads the base checkpoint from a file system",
    ),
    "spec.dataset.sources.path": (
        {"dataset": {"sources": [{"kind": "jsonl", "path": "s3://d/tasks.jsonl"}]}},
        "reads the task file from its file system",
    ),
    "spec.rollout.maxStaleness": (
        {"rollout": {"replicas": 1, "maxStaleness": 1}},
        "set algorithm.loss.truncatedIsCap",
    ),
}

# Fields v1alpha1 no longer has because no value of theirs worked (docs/design.md lists them as
# planned): a manifest that still sets one is refused as an unknown field, by pydantic and by the
# API server (which would otherwise prune it silently, so the CRD must not declare it).
PLANNED: dict[str, dict[str, Any]] = {
    "spec.trainer.parallelism.pipeline": _trainer({"pipeline": 2}),
    "spec.trainer.parallelism.context": _trainer({"context": 2}),
    "spec.trainer.parallelism.expertTensor": _trainer({"expertTensor": 1}),
    "spec.trainer.checkpoint.uri": {"trainer": {"checkpoint": {"uri": "s3://bucket/ckpt"}}},
    "spec.model.tokenizer": {"model": {"preset": "tiny", "tokenizer": "/t"}},
    "spec.rollout.weightSync.publishSafetensors": {
        "rollout": {"replicas": 1, "weightSync": {"publishSafetensors": True}}
    },
}
# (field, value): values of a field that acts for others
PLANNED_VALUES: dict[tuple[str, str], dict[str, Any]] = {
    ("spec.rollout.weightSync.transport", t): {
        "rollout": {"replicas": 1, "weightSync": {"transport": t}}
    }
    for t in ("nccl", "nccl_m2n", "ipc")
}


# ---------------------------------------------------------------- the spec's leaf fields
def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def leaf_fields(model: type[BaseModel] = GagarRunSpec, prefix: str = "spec") -> list[str]:
    """Dotted camelCase paths of every leaf (a list of objects contributes its items' fields)."""
    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}"
        inner = _models(field.annotation)
        out += leaf_fields(inner[0], path) if inner else [path]
    return out


def _entry(table: dict[str, Any], path: str) -> str | None:
    if path in table:
        return path
    return next((key for key in table if "*" in key and fnmatch.fnmatchcase(path, key)), None)


@cache
def _tests_in(file: str) -> frozenset[str]:
    """``test`` functions of a test file and ``Class::test`` methods, read with ``ast``."""
    tree = ast.parse((ROOT / file).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}::{f.name}"
                for f in node.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
    return frozenset(n for n in names if n.split("::")[-1].startswith("test"))


def _missing(node_id: str) -> bool:
    file, _, name = node_id.partition("::")
    return not (ROOT / file).is_file() or name not in _tests_in(file)


def test_every_leaf_field_acts_or_is_refused() -> None:
    unlisted = [p for p in leaf_fields() if not any(_entry(t, p) for t in (ACTS, REFUSED, PENDING))]
    assert not unlisted, "spec fields neither shown to act nor refused:\n" + "\n".join(
        f'  {p}: add `"{p}": ("tests/<dir>/test_<file>.py::test_<name>",),` to ACTS in '
        f"{Path(__file__).relative_to(ROOT)} (the test that shows its effect), or a refused "
        "value to REFUSED (and the pydantic validator + CEL rule that refuse it)"
        for p in unlisted
    )


def test_every_table_entry_names_a_field() -> None:
    fields = leaf_fields()
    for table in (ACTS, REFUSED, PENDING):
        stale = [k for k in table if not any(fnmatch.fnmatchcase(p, k) for p in fields)]
        assert not stale, f"entries for fields the spec no longer has: {stale}"
    assert not set(PENDING) & (set(ACTS) | set(REFUSED)), "a PENDING field is listed elsewhere"


def test_every_named_test_exists() -> None:
    missing = sorted({t for tests in ACTS.values() for t in tests if _missing(t)})
    assert not missing, "ACTS names tests that do not exist:\n" + "\n".join(missing)
    assert all(ACTS.values()), "every ACTS entry names at least one test"


def _document(fragment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"preset": "tiny"},
        "rollout": {"replicas": 1},
        "grader": {"replicas": 1},
    }
    spec.update(copy.deepcopy(fragment))
    return {
        "apiVersion": "gagar.dev/v1alpha1",
        "kind": "GagarRun",
        "metadata": {"name": "refused", "namespace": "default"},
        "spec": spec,
    }


@pytest.mark.parametrize("path", list(REFUSED))
def test_refused_values_are_refused_by_pydantic_and_the_crd(path: str) -> None:
    fragment, words = REFUSED[path]
    run, problems = validate_document(_document(fragment))
    text = "\n".join(map(str, problems))
    assert run is None and words in text, text
    leaf = path.rsplit(".", 1)[1]
    assert leaf in text, f"the message does not name {leaf}: {text}"
    errors = crd_errors(_document(fragment), build_crd())
    assert any(words in e and leaf in e for e in errors), errors


@pytest.fixture(scope="module")
def kube() -> Any:
    from tests.kube_emulator.emulator import KubeEmulator

    emulator = KubeEmulator(strict_fields=True)
    emulator.create(build_crd())
    return emulator


@pytest.mark.parametrize("path", list(REFUSED))
def test_kubectl_apply_of_a_refused_value_fails_with_the_field_path(kube: Any, path: str) -> None:
    from tests.kube_emulator.errors import ApiError

    fragment, words = REFUSED[path]
    with pytest.raises(ApiError) as refused:
        kube.create(_document(fragment))
    assert words in str(refused.value) and path.rsplit(".", 1)[1] in str(refused.value)


def test_the_refused_manifests_differ_from_an_accepted_one_only_there(kube: Any) -> None:
    """Not vacuous: the base document the refusals start from is accepted everywhere."""
    doc = _document({})
    assert validate_document(doc)[1] == [] and crd_errors(doc, build_crd()) == []
    kube.create({**doc, "metadata": {"name": "accepted", "namespace": "default"}})


@pytest.mark.parametrize("key", [*PLANNED, *PLANNED_VALUES], ids=str)
def test_planned_fields_and_values_are_not_in_v1alpha1(kube: Any, key: Any) -> None:
    from tests.kube_emulator.errors import ApiError

    if isinstance(key, tuple):
        (path, value), fragment = key, PLANNED_VALUES[key]
        assert path in leaf_fields()
    else:
        path, value, fragment = key, None, PLANNED[key]
        assert path not in leaf_fields()
    doc = _document(fragment)
    run, problems = validate_document(doc)
    leaf = path.rsplit(".", 1)[1]
    assert run is None and any(leaf in str(p) for p in problems), problems
    with pytest.raises(ApiError) as refused:
        kube.create(doc)
    assert leaf in str(refused.value)
    planned = (ROOT / "docs/design.md").read_text()
    assert f"`{path.removeprefix('spec.')}`" in planned, f"docs/design.md does not plan {path}"
    assert value is None or f"`{value}`" in planned, f"docs/design.md does not plan {value}"
