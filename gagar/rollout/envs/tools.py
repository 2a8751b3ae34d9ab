"""The agent's tools over a sandbox session, as OpenAI-format tool definitions plus ``execute``.

``TOOLS`` maps a name to its argument model (pydantic: the JSON schema the model sees is generated
from it) and a handler. ``tool_definitions()`` is the ``tools=[...]`` list for a chat completion;
``execute(env, tool_call)`` runs one call and always returns an ``Observation``: bad JSON, an
unknown tool, missing or extra arguments, a missing file or an ambiguous edit become an error
observation the agent can read and act on, never an exception into the agent loop. Infrastructure
failures of the sandbox are marked (``infra_error``) so the trajectory can be invalidated.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gagar.rollout.envs.task import Task
from gagar.sandbox import SandboxError, SandboxInfraError, Session

OBS_CAP = 16_000
VIEW_LINES = 400


@dataclass
class Env:
    """What the tools act on: the task and the agent's sandbox session."""

    task: Task
    session: Session
    command_timeout_s: float = 60.0
    submitted: bool = False


@dataclass(frozen=True)
class Observation:
    content: str
    error: bool = False
    submitted: bool = False
    infra_error: str | None = None


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ViewArgs(_Args):
    path: str = Field(description="File or directory, relative to the repository root.")
    start_line: int | None = Field(default=None, ge=1, description="First line (1-based).")
    end_line: int | None = Field(default=None, ge=1, description="Last line, inclusive.")


class SearchArgs(_Args):
    pattern: str = Field(min_length=1, description="Text to find (fixed string, not a regex).")
    path: str = Field(default=".", description="File or directory to search.")


class EditArgs(_Args):
    path: str = Field(description="File to edit.")
    old: str = Field(min_length=1, description="Exact text to replace; must occur exactly once.")
    new: str = Field(description="Replacement text.")


class CreateArgs(_Args):
    path: str = Field(description="New file to create (must not exist).")
    content: str = Field(description="Full content of the file.")


class RunTestsArgs(_Args):
    tests: list[str] = Field(default_factory=list, description="Test ids or paths; empty = all.")


class RunArgs(_Args):
    command: str = Field(min_length=1, description="Shell command, run in the repository root.")


class SubmitArgs(_Args):
    pass


def _cap(text: str) -> str:
    if len(text) <= OBS_CAP:
        return text
    return (
        text[: OBS_CAP // 2]
        + f"\n... [{len(text) - OBS_CAP} characters cut] ...\n"
        + text[-OBS_CAP // 2 :]
    )


def _read_text(env: Env, path: str) -> str:
    data = env.session.read_file(path)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise SandboxError(f"{path} is not a text file") from None


def _view(env: Env, a: ViewArgs) -> Observation:
    files = env.session.list_files()
    prefix = "" if a.path in (".", "") else a.path.rstrip("/") + "/"
    if a.path not in files and any(f.startswith(prefix) for f in files):
        return Observation("\n".join(f for f in files if f.startswith(prefix)))
    lines = _read_text(env, a.path).splitlines()
    start = a.start_line or 1
    end = min(a.end_line or start + VIEW_LINES - 1, len(lines))
    if start > max(len(lines), 1):
        return Observation(
            f"{a.path} has {len(lines)} lines; start_line {start} is past the end", True
        )
    body = "\n".join(f"{i:>5}  {lines[i - 1]}" for i in range(start, end + 1))
    more = f"\n[{len(lines) - end} more lines]" if end < len(lines) else ""
    return Observation(body + more)


def _search(env: Env, a: SearchArgs) -> Observation:
    cmd = ["grep", "-rnIF", "--exclude-dir=.git", "--", a.pattern, a.path]
    r = env.session.exec(cmd, timeout=env.command_timeout_s)
    if r.infra_error:
        return Observation(r.describe(), True, infra_error=r.infra_error)
    if r.exit_code == 1:
        return Observation(f"no matches for {a.pattern!r} in {a.path}")
    return Observation(_cap(r.stdout or r.stderr), r.exit_code != 0)


def _edit(env: Env, a: EditArgs) -> Observation:
    text = _read_text(env, a.path)
    count = text.count(a.old)
    if count == 0:
        return Observation(
            f"'old' text not found in {a.path}; view the file and copy it exactly", True
        )
    if count > 1:
        return Observation(
            f"'old' text occurs {count} times in {a.path}; include more context", True
        )
    env.session.write_file(a.path, text.replace(a.old, a.new, 1))
    return Observation(f"edited {a.path}")


def _create(env: Env, a: CreateArgs) -> Observation:
    if a.path in env.session.list_files():
        return Observation(f"{a.path} already exists; use edit to change it", True)
    env.session.write_file(a.path, a.content)
    return Observation(f"created {a.path}")


def _run_tests(env: Env, a: RunTestsArgs) -> Observation:
    cmd = env.task.test_command + "".join(" " + shlex.quote(t) for t in a.tests)
    return _shell(env, cmd)


def _run(env: Env, a: RunArgs) -> Observation:
    return _shell(env, a.command)


def _shell(env: Env, cmd: str) -> Observation:
    r = env.session.exec(cmd, timeout=env.command_timeout_s)
    if r.infra_error:
        return Observation(r.describe(), True, infra_error=r.infra_error)
    out = r.stdout + (("\n[stderr]\n" + r.stderr) if r.stderr else "")
    return Observation(_cap(f"[{r.describe()}]\n{out}"))


def _submit(env: Env, _a: SubmitArgs) -> Observation:
    env.submitted = True
    return Observation("submitted", submitted=True)


@dataclass(frozen=True)
class Tool:
    description: str
    args: type[_Args]
    handler: Callable[[Env, Any], Observation]


TOOLS: dict[str, Tool] = {
    "view": Tool("Show a file with line numbers, or list a directory.", ViewArgs, _view),
    "search": Tool("Find a fixed string in files (like grep -rn).", SearchArgs, _search),
    "edit": Tool("Replace one exact occurrence of 'old' with 'new' in a file.", EditArgs, _edit),
    "create": Tool("Create a new file with the given content.", CreateArgs, _create),
    "run_tests": Tool(
        "Run the repository's tests (all, or the given ids).", RunTestsArgs, _run_tests
    ),
    "run": Tool("Run a shell command in the repository (no network).", RunArgs, _run),
    "submit": Tool("Finish: submit the repository as it is now.", SubmitArgs, _submit),
}


def tool_definitions() -> list[dict[str, Any]]:
    """The OpenAI ``tools`` list."""
    defs = []
    for name, tool in TOOLS.items():
        schema = tool.args.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        defs.append(
            {
                "type": "function",
                "function": {"name": name, "description": tool.description, "parameters": schema},
            }
        )
    return defs


def _parse_call(tool_call: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    fn = tool_call.get("function", tool_call)
    name, raw = fn.get("name"), fn.get("arguments", {})
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments of {name!r} are not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"arguments of {name!r} must be a JSON object")
    return str(name), raw


def execute(env: Env, tool_call: dict[str, Any]) -> Observation:
    """Run one OpenAI-format tool call (``{"function": {"name", "arguments"}}``)."""
    try:
        name, raw = _parse_call(tool_call)
    except ValueError as e:
        return Observation(str(e), True)
    tool = TOOLS.get(name)
    if tool is None:
        return Observation(f"unknown tool {name!r}; available: {', '.join(TOOLS)}", True)
    if env.submitted:
        return Observation("already submitted; no more tool calls are accepted", True)
    try:
        args = tool.args.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, x['loc'])) or name}: {x['msg']}" for x in e.errors()
        )
        return Observation(f"bad arguments for {name}: {problems}", True)
    try:
        return tool.handler(env, args)
    except SandboxInfraError as e:
        return Observation(f"{name} failed: {e}", True, infra_error=str(e))
    except SandboxError as e:
        return Observation(f"{name} failed: {e}", True)
