"""``gagar grader eval``: the grading benchmark (``gagar.driver.grader_bench`` groups,
``gagar.grader.evaluate`` metrics) for the heuristic grader and any OpenAI-compatible endpoint.

Each held-out group is graded as built, then ``--shuffles`` more times with its candidates
relabelled (a seeded permutation each), every ranking mapped back to the group's own numbers. A
row per grader: usable rate and fallbacks by reason, pairwise accuracy (all groups; and over the
usable ones), Kendall's tau-b, hack precision and recall, relabelling consistency, first/last
slot wins beside the reference's, seconds and tokens per group. Printed as a table, written as
JSON (``--out``). An endpoint's row uses the agentic grader with ``fallback: unusable``, so the
row measures the model, not the heuristic it would fall back to. With ``--episodes FILE`` every
grading (each shuffle too) is a grading-episode record (``gagar.grader.episodes``).

``--real TASKS.jsonl`` adds groups on mined real-repository tasks (``grader_real`` and
``grader_real_build``: members run through the real verifier, levels from their visible and
held-back tests, then their scope): every grader then has a row per set (``NAME · synthetic``,
``NAME · real``; ``--groups 0`` leaves the synthetic set out), and the JSON keeps each real
group's task, package, members' kinds, executions and levels beside every grading's positions.

The command is registered under ``gagar grader`` from here (``gagar.cli.NESTED``): building the
groups runs the agent loop, which the grader package may not import.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gagar.grader import episodes
from gagar.grader.evaluate import (
    Graded,
    GroupScore,
    permutation,
    relabel,
    score_group,
    summarize,
    unlabel,
)
from gagar.grader.protocol import Grader

if TYPE_CHECKING:  # the groups' module runs the agent loop (torch): imported where used
    from gagar.driver.grader_bench import BenchGroup, Split
    from gagar.driver.grader_real_build import RealGroup

    Scored = BenchGroup | RealGroup  # a group with a known answer: ``id``, ``group``, ``reference``

DEFAULT_GROUPS = 24
DEFAULT_SHUFFLES = 3
COLUMNS = (
    ("usable_rate", "usable", "{:.2f}"),
    ("pairwise_accuracy", "pair acc", "{:.3f}"),
    ("pairwise_accuracy_usable", "pair acc|usable", "{:.3f}"),
    ("kendall_tau_b", "tau-b", "{:.3f}"),
    ("hack_precision", "hack P", "{:.2f}"),
    ("hack_recall", "hack R", "{:.2f}"),
    ("consistency", "consist.", "{:.3f}"),
    ("first_slot_wins", "1st wins", "{:.2f}"),
    ("last_slot_wins", "last wins", "{:.2f}"),
    ("seconds_per_group", "s/group", "{:.3f}"),
    ("tokens_per_group", "tok/group", "{:.0f}"),
)


def default_cache() -> Path:
    """``$GAGAR_CACHE_DIR/grader-bench`` (default ``~/.cache/gagar/grader-bench``)."""
    return Path(os.environ.get("GAGAR_CACHE_DIR") or Path.home() / ".cache" / "gagar") / (
        "grader-bench"
    )


def _machinery() -> tuple[Any, Any, int, Any]:
    """The experts' sandboxes (bubblewrap), chat format, end token and agent limits."""
    from gagar.driver.rollouts import RolloutConfig
    from gagar.rollout.agent import AgentLimits
    from gagar.rollout.chat import HFChatFormat
    from gagar.sandbox import Limits
    from gagar.sandbox.local import LocalFactory
    from gagar.trainer.model.presets import fast_tokenizer

    fast = fast_tokenizer(["def f(x):\n    return x + 1\n"] * 10, vocab_size=512)
    cfg = RolloutConfig(AgentLimits(8, 512, 8192), 20, 30)
    fmt = HFChatFormat(fast)
    return LocalFactory(Limits(wall_time_s=20)), fmt, fast.convert_tokens_to_ids("<|im_end|>"), cfg


def groups(n: int, seed: int, cache: Path, rebuild: bool = False) -> list[BenchGroup]:
    """The benchmark's ``n`` groups for ``seed``: from the cache, else built and cached."""
    from gagar.driver.grader_bench import build_groups, cache_path, load_groups, save_groups

    path = cache_path(cache, n, seed)
    if path.exists() and not rebuild:
        return load_groups(path)
    factory, fmt, eos, cfg = _machinery()
    built = asyncio.run(build_groups(n, seed, factory, fmt, eos, cfg))
    save_groups(path, built, seed)
    return built


def train_groups(args: argparse.Namespace) -> list[BenchGroup]:
    """The grader's SFT groups: the benchmark's train split, and ``--pools`` pools (built or
    cached) composed ``--per-pool`` ways each (``grader_bench.pool_groups``)."""
    from gagar.driver.grader_bench import build_pools, pool_groups

    benches = groups(args.groups, args.seed, Path(args.cache))
    if not args.pools:
        return benches
    pools = asyncio.run(build_pools(args.pools, args.seed, Path(args.cache), _machinery()))
    return benches + pool_groups(pools, args.per_pool, args.seed)


async def grade_group(
    grader: Grader, bench: Scored, perms: list[list[int]], log: Path | None
) -> list[Graded]:
    """``bench`` graded once per relabelling in ``perms``, each ranking mapped back."""
    out = []
    for k, perm in enumerate(perms):
        shown = relabel(bench.group, perm)
        start = time.perf_counter()
        with episodes.capture() as transcripts:
            ranking = await grader.grade(shown)
        seconds = time.perf_counter() - start
        if log is not None:
            where = {"source": "grader_eval", "group_id": bench.id, "shuffle": k, "perm": perm}
            episodes.append(log, episodes.record(shown, ranking, transcripts, **where))
        out.append(Graded(unlabel(ranking, perm), perm, seconds))
    return out


async def evaluate(
    grader: Grader,
    benches: Sequence[Scored],
    shuffles: int,
    seed: int,
    log: Path | None = None,
) -> tuple[dict[str, Any], list[GroupScore]]:
    """One row (``summarize``) and the per-group scores of ``grader`` on ``benches``."""
    rng = random.Random(seed)
    scores = []
    for bench in benches:
        n = len(bench.group.candidates)
        perms = [list(range(n))] + [permutation(n, rng) for _ in range(shuffles)]
        gradings = await grade_group(grader, bench, perms, log)
        scores.append(score_group(bench.reference(), gradings))
    row = summarize(scores)
    usable = [s for s in scores if s.usable]
    pairs = sum(s.pairs for s in usable)
    row["pairwise_accuracy_usable"] = sum(s.credit for s in usable) / pairs if pairs else None
    return row, scores


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def table(rows: dict[str, dict[str, Any]]) -> Any:
    """The rows as a rich table: a metric per line, a grader per column."""
    from rich.table import Table

    t = Table(title="grading benchmark (groups with known answers)")
    t.add_column("metric")
    for name in rows:
        t.add_column(name, justify="right")
    t.add_row("groups", *(str(r["groups"]) for r in rows.values()))
    for key, title, fmt in COLUMNS:
        t.add_row(title, *(_cell(r.get(key), fmt) for r in rows.values()))
    for key, title in (
        ("reference_first_slot_wins", "1st wins (ref)"),
        ("reference_last_slot_wins", "last wins (ref)"),
    ):
        t.add_row(title, *(_cell(r.get(key), "{:.2f}") for r in rows.values()))
    fallbacks = [
        ", ".join(f"{k} {v}" for k, v in sorted(r["fallbacks"].items())) or "-"
        for r in rows.values()
    ]
    t.add_row("fallbacks", *fallbacks)
    return t


def _graders(args: argparse.Namespace, served: tuple[str, str] | None = None) -> dict[str, Grader]:
    """The rows: the heuristic, and the agentic grader on ``--endpoint`` or on the model this
    command serves (``served``: its /v1 URL and name)."""
    from gagar.grader.protocol import HeuristicGrader

    out: dict[str, Grader] = {}
    if not args.no_heuristic:
        out["heuristic"] = HeuristicGrader()
    endpoint, model = served or (args.endpoint, args.model)
    if endpoint:
        from gagar.grader.agentic import AgenticConfig, AgenticGrader
        from gagar.grader.cli import _sandbox_factory

        config = AgenticConfig(
            base_url=endpoint,
            model=model,
            fallback="unusable",
            deadline_seconds=args.deadline,
            api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
            **({"max_turns": args.max_turns} if args.max_turns else {}),
        )
        name = f"agentic {Path(args.serve).name if served else args.model}"
        out[name] = AgenticGrader(config, _sandbox_factory(args))
    return out


@contextlib.contextmanager
def _served(args: argparse.Namespace) -> Iterator[tuple[str, str] | None]:
    """``--serve DIR``: the HF folder served by vLLM as ``gagar train`` serves a grader's model
    (tool-call parser, one thread), (its /v1 URL, the served name) while the rows are graded;
    else None."""
    if not args.serve:
        yield None
        return
    from gagar.driver import grader_model
    from gagar.rollout.engines.server import VllmServer
    from gagar.spec import GRADER_SERVED_NAME, GraderSpec

    spec = GraderSpec(kind="agentic", model=args.serve, replicas=1)
    folder = grader_model.model_dir(spec)
    log = Path(args.out).parent if args.out else Path(tempfile.mkdtemp(prefix="grader-eval-"))
    server = VllmServer(grader_model.server_config(spec, folder), log / "vllm-grader-eval.log")
    with server.launch():
        grader_model.ready(server)
        yield f"{server.base_url}/v1", GRADER_SERVED_NAME


def real_groups(args: argparse.Namespace) -> list[RealGroup]:
    """``--real-groups`` groups on ``--real``'s mined tasks (``grader_real_build``): from the
    cache, else built (each appended to the cache as it is done) in bubblewrap sandboxes with
    the mined example's limits."""
    from gagar.driver.grader_real_build import build_groups, cache_path
    from gagar.rollout.envs.task import load_tasks
    from gagar.sandbox import Limits
    from gagar.sandbox.local import LocalFactory

    tasks_file = Path(args.real)
    packages = args.real_packages.split(",") if args.real_packages else None
    path = cache_path(Path(args.cache), tasks_file, packages, args.real_groups, args.seed)
    if args.rebuild:
        path.unlink(missing_ok=True)
    factory = LocalFactory(Limits(wall_time_s=300, cpu_time_s=120))  # examples/mined.yaml's
    tasks = load_tasks(tasks_file)
    return build_groups(tasks, args.real_groups, args.seed, factory, packages, path)


def _sets(args: argparse.Namespace) -> dict[str, Sequence[Scored]]:
    """The groups to grade by set: ``synthetic`` (unless ``--groups 0``) and ``real``."""
    out: dict[str, Sequence[Scored]] = {}
    if args.groups:
        benches = groups(args.groups, args.seed, Path(args.cache), args.rebuild)
        wanted: tuple[Split, ...] = ("train", "held_out") if args.split == "all" else (args.split,)
        out["synthetic"] = [b for b in benches if b.split in wanted][: args.limit or None]
    if args.real:
        out["real"] = real_groups(args)[: args.limit or None]
    return out


def _real_record(args: argparse.Namespace, reals: Sequence[Any]) -> dict[str, Any]:
    """What a reader needs of the real groups beside the scores: each member's kind, execution
    and level."""
    keep = ("id", "task_id", "package", "kinds", "members", "dropped")
    return {
        "tasks_file": args.real,
        "packages": args.real_packages or "held out (split_by_package 0.25, seed 0)",
        "groups": [{k: getattr(g, k) for k in keep} for g in reals],
    }


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Build or load the groups, grade them with every row's grader, print the table; the
    result (JSON-ready), also written to ``args.out`` when set. With ``--real`` each grader has
    a row per set of groups (``NAME · synthetic``, ``NAME · real``)."""
    from rich.console import Console

    from gagar.driver.grader_bench import cache_path

    sets = _sets(args)
    log = Path(args.episodes) if args.episodes else None
    rows, per_group = {}, {}
    with _served(args) as served:
        for name, grader in _graders(args, served).items():
            for which, chosen in sets.items():
                key = f"{name} · {which}" if args.real else name
                row, scores = asyncio.run(evaluate(grader, chosen, args.shuffles, args.seed, log))
                rows[key] = row
                per_group[key] = [
                    {"id": b.id, **vars(s)} for b, s in zip(chosen, scores, strict=True)
                ]
    Console(width=max(100, Console().width)).print(table(rows))
    result = {
        "benchmark": "grader_eval",
        "seed": args.seed,
        "groups_built": args.groups,
        "split": args.split,
        "group_ids": [b.id for b in sets.get("synthetic", [])],
        "shuffles": args.shuffles,
        "cache": str(cache_path(Path(args.cache), args.groups, args.seed)),
        "rows": rows,
        "per_group": per_group,
    }
    if "real" in sets:
        result["real"] = _real_record(args, sets["real"])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


def run(args: argparse.Namespace) -> int:
    run_eval(args)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--groups", type=int, default=DEFAULT_GROUPS, help="groups built (all splits)")
    p.add_argument("--seed", type=int, default=0, help="tasks, kinds, split and shuffles")
    p.add_argument("--split", choices=("held_out", "train", "all"), default="held_out")
    p.add_argument(
        "--limit", type=int, default=0, help="grade at most this many groups of each set (0: all)"
    )
    p.add_argument("--shuffles", type=int, default=DEFAULT_SHUFFLES, help="relabellings a group")
    p.add_argument("--cache", default=str(default_cache()), help="folder of the groups' JSONL")
    p.add_argument("--rebuild", action="store_true", help="build the groups even if cached")
    p.add_argument("--no-heuristic", action="store_true", help="leave out the heuristic row")
    p.add_argument("--endpoint", help="an OpenAI-compatible /v1 URL: adds the agentic row")
    p.add_argument("--model", default="grader", help="the endpoint's model name")
    p.add_argument(
        "--serve", help="an HF folder (e.g. `gagar grader sft`'s): serve it, add its row"
    )
    p.add_argument("--max-turns", type=int, help="the agentic grader's turns (1: answer at once)")
    p.add_argument("--deadline", type=float, default=300.0, help="seconds per grading")
    p.add_argument("--sandbox", default="bwrap", help="the agentic grader's tool sandbox")
    p.add_argument("--sandbox-url", help="--sandbox pool: the sandbox Service")
    p.add_argument("--sandbox-warmpool", help="--sandbox agent-sandbox: the warm pool")
    p.add_argument("--episodes", help="append every grading as an episode record (JSONL)")
    p.add_argument("--real", help="mined tasks' JSONL (`make tasks`): add real-repository groups")
    p.add_argument("--real-groups", type=int, default=16, help="real groups built (--real)")
    p.add_argument(
        "--real-packages",
        help="comma-separated packages to draw from (default: the held-out packages)",
    )
    p.add_argument("--out", help="write the result JSON here")


def register(grader_sub: argparse._SubParsersAction) -> None:
    """``gagar grader eval`` (added under the grader's command by ``gagar.cli``)."""
    p = grader_sub.add_parser("eval", help="grading benchmark on groups with known answers")
    add_arguments(p)
    p.set_defaults(func=run)
    register_sft_data(grader_sub)
    register_sft(grader_sub)


def _pool_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--per-group", type=int, default=4, help="relabelled records per train group")
    p.add_argument(
        "--pools", type=int, default=0, help="more train groups: pools on tasks of their own"
    )
    p.add_argument("--per-pool", type=int, default=4, help="groups composed on each pool")


def run_sft_data(args: argparse.Namespace) -> int:
    """``gagar grader sft-data``: the benchmark's train groups (built or cached as ``eval``
    builds them) as SFT records, JSONL; with ``--tokenizer`` each record also carries its
    rendered ``text``."""
    from gagar.driver.grader_sft import records, render  # heavy: the benchmark's machinery

    benches = train_groups(args)
    recs = records(benches, args.per_group, args.seed)
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        recs = [{**r, "text": render(r, tokenizer)} for r in recs]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    train = sum(b.split == "train" for b in benches)
    held = len(benches) - train
    print(f"{len(recs)} records from {train} train groups ({held} held out) → {out}")
    return 0


def register_sft_data(grader_sub: argparse._SubParsersAction) -> None:
    """``gagar grader sft-data``: the grader's SFT records from the benchmark's train groups."""
    p = grader_sub.add_parser("sft-data", help="the grader's SFT records from the train groups")
    p.add_argument("--groups", type=int, default=DEFAULT_GROUPS, help="groups built (all splits)")
    p.add_argument("--seed", type=int, default=0, help="the benchmark's seed (its split)")
    p.add_argument("--cache", default=str(default_cache()), help="folder of the groups' JSONL")
    _pool_options(p)
    p.add_argument("--tokenizer", help="an HF folder: add each record's rendered chat text")
    p.add_argument("--out", required=True, help="the records' JSONL")
    p.set_defaults(func=run_sft_data)


def _base_model(name: str) -> Path:
    """``--model``: a pretrained preset (from the machine's model cache) or an HF folder."""
    from gagar.driver.components import SetupError, pretrained
    from gagar.spec import HUB_MODELS

    if name in HUB_MODELS:
        return pretrained(name, "--model")
    path = Path(name)
    if not (path / "config.json").is_file():
        raise SetupError(f"--model {name!r}: neither a preset nor an HF folder (config.json)")
    return path


def run_sft(args: argparse.Namespace) -> int:
    """``gagar grader sft``: the grader's SFT on the benchmark's train groups' records (built as
    ``sft-data`` builds them, or read from ``--data``), written as an HF folder."""
    from rich.console import Console

    from gagar.driver.grader_sft import SftConfig, records, train
    from gagar.driver.local import init_one_process
    from gagar.driver.setup import progress_bar

    if args.data:
        recs = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line]
    else:
        recs = records(train_groups(args), args.per_group, args.seed)
    fields = ("steps", "batch", "lr", "max_tokens", "dtype", "warmup", "val_groups")
    given = {f: getattr(args, f) for f in (*fields, "eval_every", "minutes")}
    cfg = SftConfig(seed=args.seed, **{f: v for f, v in given.items() if v is not None})
    console = Console()
    base = _base_model(args.model)
    init_one_process()
    every = max(1, cfg.steps // 20)  # a log line each 5 % where no bar is drawn (a pipe, a pod)

    with progress_bar("grader SFT", console) as bar:
        task = bar.add_task("", total=cfg.steps)

        def on_step(i: int, nll: float) -> None:
            bar.update(task, completed=i, description=f"nll/token {nll:.3f}")
            if not console.is_terminal and (i % every == 0 or i == cfg.steps):
                console.print(f"grader SFT step {i}/{cfg.steps}: nll/token {nll:.3f}")

        summary = train(recs, base, Path(args.out), cfg, on_step)
    nll, chosen = summary["nll_per_step"], summary["chosen"]
    picked = f", weights of step {chosen['step']} (validation)" if chosen else ""
    console.print(
        f"{summary['trained_on']} records ({summary['left_out_too_long']} too long) from "
        f"{len(summary['groups'])} groups, {summary['steps_done']} steps in "
        f"{summary['seconds']:.0f} s, NLL/token {nll[0]:.3f} → {nll[-1]:.3f}{picked} → {args.out}"
    )
    return 0


def register_sft(grader_sub: argparse._SubParsersAction) -> None:
    """``gagar grader sft``: train the agentic grader's model on the benchmark's train groups
    (the training settings' defaults are ``gagar.driver.grader_sft.SftConfig``'s)."""
    p = grader_sub.add_parser("sft", help="SFT the grader's model on the benchmark's train groups")
    p.add_argument("--data", help="records from `gagar grader sft-data` (default: build them)")
    p.add_argument("--groups", type=int, default=DEFAULT_GROUPS, help="groups built (all splits)")
    p.add_argument("--seed", type=int, default=0, help="the benchmark's split, the SFT's order")
    p.add_argument("--cache", default=str(default_cache()), help="folder of the groups' JSONL")
    _pool_options(p)
    p.add_argument("--model", default="smollm2-135m", help="a preset or an HF folder")
    # the defaults are SftConfig's (a test holds them equal): its module is too heavy for --help
    p.add_argument("--steps", type=int, help="optimizer steps (default 200)")
    p.add_argument("--batch", type=int, help="records a step (default 4)")
    p.add_argument("--lr", type=float, help="AdamW's peak learning rate (default 0.0001)")
    p.add_argument("--max-tokens", type=int, help="longer records left out (default 4096)")
    p.add_argument("--warmup", type=int, help="warm-up steps (default 10)")
    p.add_argument(
        "--val-groups", type=int, help="train groups kept out to pick the weights (default 16)"
    )
    p.add_argument("--eval-every", type=int, help="steps between validations (default 25)")
    p.add_argument(
        "--minutes", type=float, help="training's wall-clock budget, 0: none (default 0.0)"
    )
    p.add_argument(
        "--dtype", choices=("auto", "float32", "bfloat16"), help="compute dtype (default auto)"
    )
    p.add_argument("--out", required=True, help="the trained model's HF folder")
    p.set_defaults(func=run_sft)
