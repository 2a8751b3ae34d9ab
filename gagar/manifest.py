"""Read GagarRun manifests from YAML files: the boundary where raw dicts become ``GagarRun``.

Every problem is reported with its file, document index and field path, so ``gagar validate``
can print all of them at once and exit non-zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gagar import API_GROUP, API_VERSION, KIND, RUN_FILE
from gagar.spec import FieldError, GagarRun

MAX_MANIFEST_BYTES = 1 << 20  # a GagarRun is a few KiB; bigger input is refused before parsing
MAX_DEPTH = 64  # nesting of collections; the YAML composer recurses once per level
# Nodes of a document with every alias expanded: a GagarRun has a few hundred; 814 bytes of
# nested aliases ("billion laughs") expand to 10^9, which validation and rendering would walk.
MAX_NODES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with the same key twice (YAML says keys are
    unique; PyYAML would silently keep the last one), a key that is a collection (``? [a, b]``),
    and a document whose aliases expand past ``MAX_NODES`` nodes or ``MAX_DEPTH`` levels (counted
    on the composed graph, before anything is constructed)."""

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a scalar", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Raise ``yaml.YAMLError`` if ``root`` with its aliases expanded has more than ``MAX_NODES``
    nodes, more than ``MAX_DEPTH`` levels, or a cycle. Iterative, each node once (an alias is the
    same node object as its anchor, so sizes are shared, not recomputed)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = _children(node)
            size[key] = min(1 + sum(size[id(k)] for k in kids), MAX_NODES + 1)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_.discard(key)
            if size[key] > MAX_NODES or depth[key] > MAX_DEPTH:
                what = f"{MAX_NODES} nodes" if size[key] > MAX_NODES else f"{MAX_DEPTH} levels"
                line = node.start_mark.line + 1
                raise yaml.YAMLError(f"aliases expand past {what} (line {line})")
        elif key not in size:
            if key in open_:
                raise yaml.YAMLError(f"an alias refers to itself (line {node.start_mark.line + 1})")
            open_.add(key)
            stack.append((node, True))
            stack.extend((k, False) for k in _children(node) if id(k) not in size)


_OPEN: tuple[type[yaml.Token], ...] = (
    yaml.FlowMappingStartToken,
    yaml.FlowSequenceStartToken,
    yaml.BlockMappingStartToken,
)
_OPEN += (yaml.BlockSequenceStartToken,)
_CLOSE = (yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken, yaml.BlockEndToken)


def parse_yaml(text: str) -> list[Any]:
    """Every document of ``text``, after bounding its size and nesting (the scanner is iterative,
    so this check cannot itself overflow); ``yaml.YAMLError`` for anything refused."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise yaml.YAMLError(f"larger than {MAX_MANIFEST_BYTES} bytes")
    depth = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        depth += isinstance(token, _OPEN) - isinstance(token, _CLOSE)
        if depth > MAX_DEPTH:
            raise yaml.YAMLError(
                f"nested deeper than {MAX_DEPTH} levels (line {token.start_mark.line + 1})"
            )
    try:
        return list(yaml.load_all(text, Loader=_StrictLoader))
    except ValueError as err:  # e.g. an integer of thousands of digits
        raise yaml.YAMLError(str(err)) from None


@dataclass(frozen=True)
class Problem:
    """One reason a document is not a valid GagarRun."""

    source: str
    index: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.source if self.index is None else f"{self.source}[{self.index}]"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


@dataclass
class Loaded:
    """The GagarRuns found in some files, and every problem met."""

    runs: list[tuple[str, int, GagarRun]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    # other Kubernetes objects beside the runs (a Namespace, say): skipped, each with a note
    skipped: list[Problem] = field(default_factory=list)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _where(error: Any) -> str:
    """The error's field path; a spec rule's ends with the field it names (as the API server's
    ``fieldPath`` does)."""
    rule = (error.get("ctx") or {}).get("error")
    return _loc(error["loc"]) + (rule.field if isinstance(rule, FieldError) else "")


def validate_document(
    doc: Any, source: str = "<input>", index: int = 0
) -> tuple[GagarRun | None, list[Problem]]:
    """Validate one parsed YAML document as a GagarRun."""
    if not isinstance(doc, dict):
        return None, [
            Problem(
                source,
                index,
                "",
                f"expected a mapping (a Kubernetes object), got {type(doc).__name__}",
            )
        ]
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if kind != KIND or api != f"{API_GROUP}/{API_VERSION}":
        msg = f"not a GagarRun: apiVersion {api!r}, kind {kind!r} (expected {API_GROUP}/{API_VERSION}, {KIND})"
        return None, [Problem(source, index, "", msg)]
    try:
        return GagarRun.model_validate(doc), []
    except ValidationError as err:
        return None, [Problem(source, index, _where(e), e["msg"]) for e in err.errors()]


def load_files(paths: list[str | Path]) -> Loaded:
    """Load every document of every file; unreadable files and YAML errors are problems too."""
    loaded = Loaded()
    for path in map(str, paths):
        try:
            text = Path(path).read_text()
            docs = parse_yaml(text)
        except (OSError, UnicodeDecodeError) as err:
            loaded.problems.append(Problem(path, None, "", f"cannot read: {err}"))
            continue
        except yaml.YAMLError as err:
            loaded.problems.append(Problem(path, None, "", f"invalid YAML: {_one_line(err)}"))
            continue
        _collect(loaded, path, docs)
    return loaded


def _one_line(err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        return f"{err.problem} (line {err.problem_mark.line + 1})"
    return " ".join(str(err).split())


def other_object(doc: Any) -> str | None:
    """``"Namespace 'gagar'"`` for a Kubernetes object of another kind (``apiVersion`` and
    ``kind`` given, neither gagar's group nor ``GagarRun``), which a file of runs may hold beside
    them (``kubectl apply -f`` takes it); None for a run, or for anything meant as one."""
    if not isinstance(doc, dict):
        return None
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if not (isinstance(api, str) and isinstance(kind, str) and api and kind):
        return None
    if kind == KIND or api.split("/")[0] == API_GROUP:
        return None  # a misspelt version of a run is a problem, not another object
    obj_name = (
        (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
    )
    return f"{kind} {obj_name!r}" if obj_name else kind


def _collect(loaded: Loaded, path: str, docs: list[Any]) -> None:
    present = [(i, d) for i, d in enumerate(docs) if d is not None]
    if not present:
        loaded.problems.append(Problem(path, None, "", "no YAML documents in file"))
    others = [(i, other_object(d)) for i, d in present]
    if present and all(other for _, other in others):
        what = ", ".join(str(other) for _, other in others)
        msg = f"no GagarRun in the file: it holds {what}, not a GagarRun ({API_GROUP}/{API_VERSION}, {KIND})"
        loaded.problems.append(Problem(path, None, "", msg))
        return
    for (index, doc), (_, other) in zip(present, others, strict=True):
        if other:
            note = f"{other} skipped: not a GagarRun (gagar validates GagarRuns only)"
            loaded.skipped.append(Problem(path, index, "", note))
            continue
        run, problems = validate_document(doc, path, index)
        loaded.problems.extend(problems)
        if run is not None:
            loaded.runs.append((path, index, run))


def load_run(path: str | Path) -> GagarRun:
    """Load exactly one GagarRun from a file, or raise ``ValueError`` listing every problem."""
    loaded = load_files([path])
    if loaded.problems:
        raise ValueError("\n".join(map(str, loaded.problems)))
    if len(loaded.runs) != 1:
        raise ValueError(f"{path}: expected exactly one GagarRun, found {len(loaded.runs)}")
    return loaded.runs[0][2]


class ConfigError(ValueError):
    """The run's configuration is unusable here; the message names the file, variable or field."""


def load_config_dir(config_dir: Path) -> GagarRun:
    """The GagarRun a pod finds in ``config_dir/run.json`` (the operator's ConfigMap), validated
    again with the same rules as the CRD; ``ConfigError`` naming the file if missing or invalid."""
    file = config_dir / RUN_FILE
    if not file.is_file():
        raise ConfigError(f"{file} is missing: is the run's ConfigMap mounted at {config_dir}?")
    try:
        return load_run(file)  # JSON is YAML: every problem is named with its field path
    except ValueError as err:
        raise ConfigError(f"invalid GagarRun in {file}:\n{err}") from err
