"""A pytest plugin the miner writes into the sandbox workspace and loads with ``-p``; never
imported by gagar (its text is). Standard library only.

Environment: ``GAGAR_MINE_OUT`` (the JSON record, relative to the workspace), ``GAGAR_MINE_TRACE``
(``1``: record the lines of workspace files each test executes, with ``sys.settrace``; lines run
outside any test, at import and collection, are recorded under ``<collect>``),
``GAGAR_MINE_SELECT`` (a file of node ids, one a line: only those run).

The record: ``outcomes`` (node id -> passed/failed/skipped/xfail: a test marked xfail, whether
it failed or passed), ``messages`` (node id -> the first
``E`` lines of its failure), ``collect_errors`` (how many collectors failed), ``lines`` (node id ->
{path: [line, ...]}).
"""

import json
import os
import sys
import threading

ROOT = os.path.abspath(os.getcwd())
COLLECT = "<collect>"
_current = [COLLECT]
_lines: dict = {}  # node id -> {path: {line, ...}}
_outcomes: dict = {}
_messages: dict = {}
_collect_errors = [0]


def _tracer(frame, event, arg):
    path = frame.f_code.co_filename
    if not path.startswith(ROOT + os.sep) or "/.gagar_mine/" in path:
        return None

    def local(frame, event, arg):
        if event == "line":
            _lines.setdefault(_current[0], {}).setdefault(path, set()).add(frame.f_lineno)
        return local

    _lines.setdefault(_current[0], {}).setdefault(path, set()).add(frame.f_lineno)
    return local


def pytest_configure(config):
    if os.environ.get("GAGAR_MINE_TRACE") == "1":
        threading.settrace(_tracer)
        sys.settrace(_tracer)


def pytest_collection_modifyitems(session, config, items):
    select = os.environ.get("GAGAR_MINE_SELECT")
    if not select:
        return
    with open(select) as f:
        keep = {line.rstrip("\n") for line in f if line.strip()}
    chosen = [i for i in items if i.nodeid in keep]
    dropped = [i for i in items if i.nodeid not in keep]
    items[:] = chosen
    if dropped:
        config.hook.pytest_deselected(items=dropped)


def pytest_collectreport(report):
    if report.failed:
        _collect_errors[0] += 1


def pytest_runtest_logstart(nodeid, location):
    _current[0] = nodeid


def pytest_runtest_logfinish(nodeid, location):
    _current[0] = COLLECT


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    if hasattr(report, "wasxfail"):  # xfail or xpass: never listed (the verifier fails an xpass)
        _outcomes[nodeid] = "xfail"
    elif report.failed:
        if _outcomes.get(nodeid) != "failed":
            errors = [ln for ln in report.longreprtext.splitlines() if ln.startswith("E ")]
            _messages[nodeid] = "\n".join(errors[:6])
        _outcomes[nodeid] = "failed"
    elif report.skipped and _outcomes.get(nodeid) != "failed":
        _outcomes[nodeid] = "skipped"
    elif report.when == "call" and _outcomes.get(nodeid) is None:
        _outcomes[nodeid] = "passed"


def pytest_unconfigure(config):
    sys.settrace(None)
    threading.settrace(None)
    lines = {
        key: {os.path.relpath(p, ROOT): sorted(ls) for p, ls in files.items()}
        for key, files in _lines.items()
    }
    record = {
        "outcomes": _outcomes,
        "messages": _messages,
        "collect_errors": _collect_errors[0],
        "lines": lines,
    }
    with open(os.path.join(ROOT, os.environ["GAGAR_MINE_OUT"]), "w") as f:
        json.dump(record, f)
