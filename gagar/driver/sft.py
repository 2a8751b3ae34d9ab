"""SFT warm start on synthetic expert trajectories (the embedded default's starting policy).

Scripted experts act on real synthetic tasks through the real agent loop, tools and sandboxes, so
the trajectories are exactly what the policy will later see (same chat format, same tool
observations, same token ids). The mix is deliberate: clean fixes, bloated-but-passing fixes
(debug output, dead code), redundant tool use, and wrong fixes, so the warm-started policy has
real variation among its passes for GAGAR to act on. SFT itself is the learner with advantage 1
on every generated token (token-mean), i.e. maximum likelihood of the expert turns.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gagar.driver.rollouts import RolloutConfig, Rollouts
from gagar.rollout.agent import Trajectory
from gagar.rollout.chat import format_tool_call
from gagar.rollout.envs.task import Task
from gagar.sandbox import SessionFactory
from gagar.spec import ExpertStyles
from gagar.trainer.learner import Learner, Sample

Style = Literal["clean", "bloated", "redundant", "wrong"]
SFT_LR = 1e-3  # SFT from scratch needs a far larger step than RL fine-tuning
SFT_LR_PRETRAINED = 1e-5  # a pretrained policy only learns the format and the family's fixes
STYLES: tuple[Style, ...] = ("clean", "bloated", "redundant", "wrong")


def style_weights(styles: ExpertStyles | None) -> dict[Style, float]:
    """``spec.model.sftExpertStyles`` (or its defaults) as weights per style."""
    s = styles or ExpertStyles()
    return {"clean": s.clean, "bloated": s.bloated, "redundant": s.redundant, "wrong": s.wrong}


@dataclass(frozen=True)
class Fix:
    path: str
    old: str
    new: str


def reference_fix(task: Task) -> Fix:
    """The smallest line-level edit that turns the task's buggy file into the reference."""
    if not task.reference_files or not task.files:
        raise ValueError(f"{task.instance_id}: no reference fix to script an expert from")
    path, fixed = next(iter(sorted(task.reference_files.items())))
    buggy = task.files[path]
    a, b = buggy.splitlines(keepends=True), fixed.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b).get_opcodes() if op[0] != "equal"]
    i1, i2, j1, j2 = ops[0][1], ops[-1][2], ops[0][3], ops[-1][4]
    # widen the hunk with the lines before it until the old text occurs once (edits must be exact)
    while buggy.count("".join(a[i1:i2])) > 1 and i1 > 0:
        i1, j1 = i1 - 1, j1 - 1
    return Fix(path, "".join(a[i1:i2]).rstrip("\n"), "".join(b[j1:j2]).rstrip("\n"))


def expert_turns(task: Task, style: Style) -> list[str]:
    """The assistant turns (tool calls) of one scripted expert."""
    fix = reference_fix(task)
    view = format_tool_call("view", {"path": fix.path})
    tests = format_tool_call("run_tests", {})
    submit = format_tool_call("submit", {})
    if style == "clean":
        return [
            view,
            format_tool_call("edit", {"path": fix.path, "old": fix.old, "new": fix.new}),
            tests,
            submit,
        ]
    if (
        style == "bloated"
    ):  # the right fix plus an unrequested debugging module: passes, but sprawls
        helper = (
            fix.path.rsplit("/", 1)[0] + "/debug_helpers.py"
            if "/" in fix.path
            else "debug_helpers.py"
        )
        extra = format_tool_call(
            "create",
            {
                "path": helper,
                "content": "def trace(*args):\n    print('debug:', *args)\n    return args\n",
            },
        )
        return [
            view,
            format_tool_call("edit", {"path": fix.path, "old": fix.old, "new": fix.new}),
            extra,
            tests,
            submit,
        ]
    if style == "redundant":
        edit = format_tool_call("edit", {"path": fix.path, "old": fix.old, "new": fix.new})
        return [view, view, edit, tests, tests, submit]
    wrong = format_tool_call(
        "edit", {"path": fix.path, "old": fix.old, "new": fix.old + "  # checked"}
    )
    return [view, wrong, submit]


class ScriptedExpert:
    """An ``Engine`` that 'generates' a fixed list of assistant turns, tokenized exactly."""

    def __init__(self, turns: list[str], encode: Any, eos_id: int) -> None:
        self.turns, self.encode, self.eos_id, self.i = turns, encode, eos_id, 0

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        from gagar.rollout.agent import Generation

        text = self.turns[min(self.i, len(self.turns) - 1)]
        self.i += 1
        ids = [*self.encode(text), self.eos_id]
        return Generation(ids, [0.0] * len(ids), text, "stop")


def draw_styles(n: int, seed: int, weights: dict[Style, float]) -> list[Style]:
    """``n`` expert styles drawn by ``weights`` (seeded: the same mix for the same seed)."""
    rng = random.Random(seed)
    return rng.choices(list(weights), weights=list(weights.values()), k=n)


async def expert_trajectories(  # noqa: PLR0913 - the seed and the style mix of one warm start
    tasks: list[Task],
    factory: SessionFactory,
    fmt: Any,
    eos_id: int,
    cfg: RolloutConfig,
    seed: int = 0,
    styles: ExpertStyles | None = None,
) -> list[tuple[Style, Trajectory, bool]]:
    """Run one scripted expert per task (styles drawn by ``styles``' weights); returns (style,
    trajectory, passed)."""
    limiter = asyncio.Semaphore(4)

    async def one(task: Task, style: Style) -> tuple[Style, Trajectory, bool]:
        async with limiter:
            engine = ScriptedExpert(expert_turns(task, style), fmt.encode, eos_id)
            rollout, _ = await Rollouts(factory, engine, fmt, cfg).one(task, None)
            return style, rollout.trajectory, rollout.passed

    scripted = [t for t in tasks if t.reference_files]
    return await asyncio.gather(
        *(
            one(t, s)
            for t, s in zip(
                scripted, draw_styles(len(scripted), seed, style_weights(styles)), strict=True
            )
        )
    )


def sft_batches(
    trajectories: list[Trajectory],
    steps: int,
    batch_size: int,
    seed: int = 0,
    whole_sequence: bool = False,
) -> list[list[Sample]]:
    """``steps`` batches of maximum likelihood on the generated tokens (advantage 1 on each).

    ``whole_sequence``: on every token after the first instead, prompts and tool results too: a
    policy created from scratch must also learn to read, and the listing, the ``view`` output and
    the test report repeat what the statement names (more copying to learn from than the few
    generated tokens that copy). Used for the ``tiny`` preset; its measured recipe (copying
    curriculum, then this) is in the README."""
    usable = [t for t in trajectories if t.valid and t.response_tokens]
    if not usable:
        raise ValueError("no valid expert trajectories to warm-start from")
    rng = random.Random(seed)
    batches = []
    for _ in range(steps):
        batch = rng.sample(usable, min(batch_size, len(usable)))
        samples = []
        for i, t in enumerate(batch):
            mask = [0] + [1] * (len(t.token_ids) - 1) if whole_sequence else t.loss_mask
            samples.append(Sample(t.token_ids, mask, t.logprobs, [float(m) for m in mask], i))
        batches.append(samples)
    return batches


def sft_lr(model: Any) -> float:
    """``spec.model.sftLr``, or the default for a policy trained from scratch or a pretrained one."""
    if model.sft_lr is not None:
        return float(model.sft_lr)
    return SFT_LR if model.preset == "tiny" else SFT_LR_PRETRAINED


def sft(learner: Learner, batches: list[list[Sample]], on_step: Any = None) -> list[float]:
    """One update per batch; returns the NLL per token of each."""
    losses = []
    for batch in batches:
        losses.append(learner.update(batch)["nll"])
        if on_step is not None:
            on_step(len(losses), losses[-1])
    return losses


# ---------------------------------------------------------------- the warm-start cache
# The warm-started policy is a pure function of what its key hashes: the same manifest on the same
# machine and code makes the same policy, so `gagar train` keeps it per machine and a second run
# reaches RL at once (LocalProvider only; a cluster trainer always warm-starts).
CACHE_ENV = "GAGAR_CACHE_DIR"
CACHE_KEEP = 4  # newest entries kept (a tiny policy is a few MB, SmolLM2 about 540 MB)
WARM_MARKER = "warm_start.json"
_PKG = Path(__file__).resolve().parents[1]
# the code that decides the warm-started weights (tokenizer, copying curriculum, tasks, experts,
# agent loop, sandboxes, learner, model): any change to it is a new key
KEY_CODE = ("driver", "rollout", "trainer", "sandbox", "spec.py")


def cache_root() -> Path:
    """``$GAGAR_CACHE_DIR/warm-start`` (default ``~/.cache/gagar/warm-start``)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gagar") / "warm-start"


def code_hash(package: Path = _PKG, parts: tuple[str, ...] = KEY_CODE) -> str:
    """One hash of the ``parts`` sources of ``package`` (paths and contents)."""
    h = hashlib.sha256()
    for rel in parts:
        top = package / rel
        if not top.exists():
            h.update(rel.encode() + b"\0absent")
            continue
        for path in sorted(top.rglob("*.py")) if top.is_dir() else [top]:
            h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def warm_start_key(run: Any) -> str:
    """A hash of everything the warm-started weights depend on: the model spec (preset or path,
    SFT steps, lr, experts and their style mix, copying curriculum, dtype), the seed, the learner
    settings, the dataset, the agent's limits, the sandbox limits, the code and library versions."""
    import importlib.metadata as md

    import torch

    from gagar.trainer.precision import resolve, trainer_device

    s = run.spec
    dump = lambda m: m.model_dump(mode="json", by_alias=True, exclude_none=True)  # noqa: E731
    model = dump(s.model)
    if s.model.path is not None:  # a base folder on disk: its files' sizes and times
        base = Path(s.model.path)
        model["files"] = sorted(
            (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in base.glob("*") if p.is_file()
        )
    parts = {
        "model": model,
        "seed": s.algorithm.seed,
        "microBatchSize": s.algorithm.micro_batch_size,
        "optimizer": dump(s.algorithm.optimizer),
        "loss": dump(s.algorithm.loss),
        "dataset": dump(s.dataset),
        "agent": dump(s.rollout.agent),
        "limits": dump(s.sandbox.limits),
        "device": s.trainer.device,
        # ``auto`` resolves per machine (and per ONEDNN_MAX_CPU_ISA): the dtypes that computed it
        "dtype": [
            resolve(s.model.dtype, "cpu").dtype,  # the curriculum's: on the CPU
            resolve(s.model.dtype, trainer_device(s.trainer.device)).dtype,
        ],
        "code": code_hash(),
        "versions": {p: md.version(p) for p in ("gagar", "transformers", "tokenizers")}
        | {"torch": torch.__version__},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def restore_warm_start(run: Any, dest: Path) -> dict[str, Any] | None:
    """Copy the cached warm-started policy of ``run`` to ``dest`` (written whole, then renamed);
    its summary, or None when this machine has none."""
    entry = cache_root() / warm_start_key(run)
    if not (entry / WARM_MARKER).exists():
        return None
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(entry, tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    os.utime(entry)  # the newest use: pruned last
    return json.loads((dest / WARM_MARKER).read_text())["summary"]


def cached_summary(run: Any, policy_dir: Path) -> dict[str, Any] | None:
    """The warm start's summary when ``policy_dir`` already holds ``run``'s warm-started policy."""
    marker = policy_dir / WARM_MARKER
    if not marker.exists():
        return None
    data = json.loads(marker.read_text())
    return {**data["summary"], "cached": True} if data["key"] == warm_start_key(run) else None


def store_warm_start(
    run: Any, model: Any, policy_dir: Path, summary: dict[str, Any], key: str | None = None
) -> Path:
    """Keep the warm-started ``model`` under ``key`` (by default ``run``'s now; a caller takes it
    before the warm start, so that code edited meanwhile does not name it), written whole, then
    renamed; prune the cache to its ``CACHE_KEEP`` newest entries."""
    from gagar.trainer.model import save_hf_checkpoint

    key = key or warm_start_key(run)
    root = cache_root()
    entry = root / key
    tmp = root / f"{key}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_hf_checkpoint(model, tmp, side_files_from=policy_dir)
    (tmp / WARM_MARKER).write_text(json.dumps({"key": key, "summary": summary}))
    commit_entry(tmp, entry, CACHE_KEEP)
    return entry


def commit_entry(tmp: Path, entry: Path, keep: int) -> None:
    """Rename a cache entry written whole in ``tmp`` to ``entry`` (another process's identical
    entry already there wins), then prune ``entry``'s folder to its ``keep`` newest entries."""
    if entry.exists():
        shutil.rmtree(tmp)
    else:
        tmp.rename(entry)
    entries = sorted(
        (p for p in entry.parent.iterdir() if p.is_dir() and ".partial" not in p.name),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in entries[keep:]:
        shutil.rmtree(old, ignore_errors=True)
