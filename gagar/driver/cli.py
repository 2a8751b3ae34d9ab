"""``gagar train RUN.yaml [--out DIR] [--steps N] [--resume]``: the embedded default."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from io import TextIOWrapper
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from gagar.driver.loop import Context
    from gagar.spec import GagarRun


class _LogFile(logging.FileHandler):
    """A log file made (with its folder) at the first record, so that a run that cannot start
    leaves nothing behind unless something was logged."""

    def _open(self) -> TextIOWrapper:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def _library_output_to(log: Path) -> Callable[[], None]:
    """Send what libraries say (Python warnings, log records, Hugging Face progress bars) to
    ``log`` instead of the terminal, which shows gagar's progress and summary only: Megatron-Core
    warns at import that Transformer Engine/Apex are absent and torch warns of bfloat16 inputs to
    float32 norm weights on every CPU step, both expected here. gagar's own warnings still reach
    the terminal. Returns a function that removes ``log`` again if this process created it (a run
    that could not start)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers loads
    existed = log.exists()
    handler = _LogFile(log, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.captureWarnings(True)
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)  # not every HTTP request of httpx
    logging.getLogger("gagar").setLevel(logging.INFO)
    ours = logging.StreamHandler()
    ours.setLevel(logging.WARNING)
    logging.getLogger("gagar").addHandler(ours)

    def discard() -> None:
        handler.close()
        if not existed:
            log.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                log.parent.rmdir()  # only when empty

    return discard


def _train(args: argparse.Namespace) -> int:
    from gagar.driver.setup import quiet_megatron
    from gagar.manifest import load_run

    quiet_megatron()
    console = Console(stderr=True)
    try:
        run = load_run(args.run)
    except ValueError as err:
        console.print(f"[red]invalid GagarRun[/]\n{err}")
        return 2
    from pydantic import ValidationError

    try:
        run = _override(run, args)
    except ValidationError as err:
        bad = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        console.print(f"[red]invalid override[/]: {bad}", soft_wrap=True)
        return 2
    out = Path(args.out or f"runs/{run.metadata.name}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ".gagar-write-test").touch()
        (out / ".gagar-write-test").unlink()
    except OSError as err:
        console.print(f"[red]cannot use --out {out}[/]: {err.strerror or err}", soft_wrap=True)
        return 2
    discard_log = _library_output_to(out / "logs" / "libraries.log")
    from gagar.driver.components import SetupError
    from gagar.driver.local import LocalProvider
    from gagar.driver.setup import build, build_rank

    port = run.spec.observability.metrics_port if args.metrics_port is None else args.metrics_port
    provider = LocalProvider(out, console, ("127.0.0.1", port))
    try:  # in the main thread: vLLM's parent-death signal is tied to the thread that starts it
        rank = build_rank(run, provider)
        ctx = build(rank, provider, resume_run=args.resume or run.spec.trainer.checkpoint.resume)
    except SetupError as err:
        console.print(f"[red]cannot start[/]: {err}")
        discard_log()
        return 2
    return asyncio.run(_main(ctx, out, console, args))


def _override(run: GagarRun, args: argparse.Namespace) -> GagarRun:
    """Apply --steps/--sft-steps/--sft-experts/--copy-steps by re-validating the manifest, so
    overrides obey the same rules."""
    from gagar.spec import GagarRun

    doc = run.to_wire()
    if args.steps is not None:
        doc["spec"]["algorithm"]["totalSteps"] = args.steps
    if args.sft_steps is not None:
        doc["spec"]["model"]["sftWarmupSteps"] = args.sft_steps
    if args.sft_experts is not None:
        doc["spec"]["model"]["sftExpertTasks"] = args.sft_experts
    if args.copy_steps is not None:
        doc["spec"]["model"]["copyCurriculumSteps"] = args.copy_steps
    return GagarRun.model_validate(doc)


async def _main(ctx: Context, out: Path, console: Console, args: argparse.Namespace) -> int:
    from gagar.driver.loop import close, save_checkpoint, summary_line, train
    from gagar.driver.setup import progress_bar

    run = ctx.run
    total = run.spec.algorithm.total_steps
    console.print(
        f"run [bold]{run.metadata.name}[/] ({run.spec.algorithm.mode}) → {out} · metrics on 127.0.0.1:{ctx.metrics_port}/metrics"
    )
    try:
        with progress_bar("step", console) as bar:
            task = bar.add_task("", total=total, completed=ctx.step)
            report = await train(
                ctx,
                lambda record: bar.update(
                    task, completed=ctx.step, description=summary_line(record)
                ),
                eval_tasks=args.eval_tasks,
                eval_only=args.eval_only,
                probe_samples=args.probe,
            )
        _print_summary(console, report, out)
        return 0
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Cancellation only lands at an await, i.e. between steps or during rollouts, never between
        # an update and its step counter: the checkpoint holds exactly the completed steps.
        console.print("[yellow]interrupted[/]: writing a checkpoint of the last completed step")
        save_checkpoint(ctx)
        return 130
    except Exception as err:  # an engine that died, a sandbox host that failed, a disk that filled
        _explain_failure(ctx, out, console, err, evaluating=ctx.step >= total or args.eval_only)
        return 1
    finally:
        close(ctx)


def _print_summary(console: Console, report: dict, out: Path) -> None:
    """One short table of what the run did, then where its files are."""
    from rich.table import Table

    from gagar.driver.record import read_records
    from gagar.driver.report import summary_rows

    table = Table(title=f"gagar train: {report['run']}", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in summary_rows(report, read_records(out / "metrics.jsonl")):
        table.add_row(name, value)
    console.print(table)
    console.print(f"report  [bold]{out / 'report.json'}[/] and plots {out}/*.png", soft_wrap=True)
    console.print(
        f"records {out / 'metrics.jsonl'}, trajectories {out / 'rollouts'}", soft_wrap=True
    )
    console.print(f"logs    {out / 'logs'}", soft_wrap=True)


def _explain_failure(
    ctx: Context, out: Path, console: Console, err: Exception, *, evaluating: bool = False
) -> None:
    """One clear message (the vLLM server's own exit if that is the cause), the traceback in a
    log, and where the run stands: a failed step is never recorded, so re-running resumes; a
    failed evaluation writes no report, and ``--eval-only`` repeats it on the last checkpoint."""
    import traceback

    log = out / "logs" / "error.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(traceback.format_exc())
    cause = f"{type(err).__name__}: {err}"
    if ctx.services.engine_alive is not None:
        try:
            ctx.services.engine_alive(0.0)
        except Exception as dead:  # VllmServerError, with the exit code and the log
            cause = str(dead).splitlines()[0]
    done = ctx.ckpt.complete()
    if evaluating:
        console.print(
            f"[red]held-out evaluation failed[/]: {cause}\n"
            f"no report was written (traceback: {log}); the newest complete checkpoint is of step "
            f"{done[-1].step if done else 0}: re-run the same command with --eval-only to evaluate it"
        )
        return
    console.print(
        f"[red]step {ctx.step + 1} failed[/]: {cause}\n"
        f"nothing of that step was recorded (traceback: {log}); the newest complete checkpoint "
        f"is of step {done[-1].step if done else 0}: re-run the same command to resume from it"
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run a GagarRun on this machine (the embedded default)")
    p.add_argument("run", help="GagarRun manifest (YAML)")
    p.add_argument("--out", help="run directory (default: runs/<name>)")
    p.add_argument("--steps", type=int, help="override spec.algorithm.totalSteps")
    p.add_argument("--sft-steps", type=int, help="override spec.model.sftWarmupSteps")
    p.add_argument("--sft-experts", type=int, help="override spec.model.sftExpertTasks")
    p.add_argument("--copy-steps", type=int, help="override spec.model.copyCurriculumSteps")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint in --out",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics here (default: spec.observability.metricsPort; 0 picks a free port)",
    )
    p.add_argument(
        "--eval-tasks", type=int, default=16, help="held-out tasks evaluated at the end (0 skips)"
    )
    p.add_argument(
        "--eval-only",
        action="store_true",
        help="no RL steps: warm-start (or resume), evaluate the held-out tasks, write the report",
    )
    p.add_argument(
        "--probe",
        type=int,
        default=0,
        metavar="N",
        help="score N fixed samples of training tasks at the start and the end (docs/driver.md)",
    )
    p.set_defaults(func=_train)
