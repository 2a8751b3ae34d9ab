"""The test process of verification: pytest from the executor's environment, watched, and a
witness outside it.

``verify.py`` runs this file's source as ``python -I -B -c SOURCE RECORD SECRET ROOT -- ARGS``
inside the jail; it is never imported by gagar, and needs only the standard library and pytest.

- ``-I`` (isolated mode: no ``PYTHON*`` variables, no user site, neither the current directory nor
  a script's on ``sys.path``) and ``-B``: the interpreter, the standard library, site's ``.pth``
  files and ``sitecustomize`` all come from the executor's environment, never from the workspace.
- pytest, pluggy and every plugin (``-p``, entry points) are imported before the workspace joins
  ``sys.path``; the workspace is put first only when pytest loads the initial conftests, as
  ``python -m pytest`` would have it, so the code under test imports as it always did.
- Then the process makes itself undumpable and forks. The child is the test process: pytest runs
  there, beside the code under test. The parent is the witness: no code of the workspace ever
  runs in it, and the test process can neither trace it nor open its ``/proc/PID/mem`` or ``fd``.
- The secret file the host wrote (the nonce, and the marker paths and tokens of the planted tests,
  ``plant.py``) is opened and unlinked before the fork and read by the witness only, after it:
  the nonce is never in the test process's memory, so no frame walk or heap search there finds it.
- The test process sends each test's outcome through a pipe as pytest reports it (what was sent
  cannot be rewritten at the end), and at the end the facts the host checks: where pytest and the
  plugins were loaded from, which files the collected tests' modules and functions come from,
  which loaders loaded them, which modules of the standard library or the runner were executed
  from the workspace, which of pytest's and Python's functions were replaced during the run
  (checked after each test and at the end, and class attributes set at any time, through an audit
  hook the code cannot remove), and whether anything touched the record's path.
- The witness reads the pipe while the test process runs, waits for its exit (its status is the
  witness's own observation), reads and removes the planted tests' markers (their bodies write
  them: the witness sees which bodies ran), and writes the record with the nonce, exclusively,
  then leaves with 0 where pytest's status is the one the host expects of an honest run (the
  secret says which: 1 where canaries were planted), else with that status. ``verify.py``
  decides; neither process judges.

What the test process says about its tests is still its word: code running there can send forged
outcomes. It cannot know which of the ids are planted canaries (must fail) and controls (must
pass, their markers written) without inspecting the tests while they run, which is harness reach
the graders' tamper screen flags (docs/security.md, "What remains").
"""

import os
import sys

# Namespaces whose functions and classes no test run has a reason to replace.
GUARDED_MODULES = (
    "builtins",
    "_pytest.runner",
    "_pytest.reports",
    "_pytest.python",
    "_pytest.main",
    "_pytest.outcomes",
    "_pytest.skipping",
    "_pytest.nodes",
    "_pytest.assertion",
    "_pytest.assertion.rewrite",
    "_pytest.assertion.util",
    "_pytest.unittest",
    "_pytest.python_api",
    "_pytest.raises",
    "_pytest.fixtures",
    "pluggy._callers",
    "pluggy._hooks",
    "pluggy._manager",
    "unittest.case",
)
GUARDED_NAMES = {"sys": ("exit",), "os": ("_exit", "kill", "abort")}
# Imported before the workspace joins the path: what pytest and unittest-style tests load lazily.
PRELOAD = ("unittest", "doctest", "pdb", "bdb", "code", "decimal", "fractions", "difflib", "pprint")
RUNNER_DISTS = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py")


def _watched(value) -> bool:
    return callable(value) or isinstance(value, (property, classmethod, staticmethod, type))


MISSING = object()


def _origin(value):
    """The file a replacement's code comes from (None: unknown, e.g. a builtin)."""
    for attr in ("fget", "__func__", "func"):  # property, class/static/bound method, partial
        inner = getattr(value, attr, None)
        if inner is not None and inner is not value:
            return _origin(inner)
    code = getattr(value, "__code__", None)
    if code is not None:
        return code.co_filename
    if isinstance(value, type):
        return _file_of(value)
    return None


class Watch:
    """Identities of the guarded functions and classes, and what the audit hook saw. A change
    counts when the new value's code does not come from the executor's environment: pytest and
    its plugins patch their own classes while they run (``_pytest.legacypath``), the code under
    test has no business to."""

    def __init__(self, root, tokens):
        self.root, self.tokens = root, tokens
        self.flags, self.executed = [], set()
        self.entries, self.classes, self.owners = {}, {}, {}
        self.finishing = False

    def snapshot(self):
        for mod_name in GUARDED_MODULES:
            mod = sys.modules.get(mod_name)
            if mod is None:
                continue
            self._snapshot_ns(mod_name, vars(mod))
            for key, value in list(vars(mod).items()):
                if isinstance(value, type) and getattr(value, "__module__", "") == mod_name:
                    self.classes[id(value)] = (f"{mod_name}.{key}", value)
                    self._snapshot_ns(f"{mod_name}.{key}", vars(value), value)
        for mod_name, keys in GUARDED_NAMES.items():
            ns = vars(sys.modules[mod_name])
            for key in keys:
                self.entries[(mod_name, key)] = (ns, ns.get(key, MISSING))

    def _snapshot_ns(self, label, ns, owner=None):
        for key, value in list(ns.items()):
            if _watched(value):
                self.entries[(label, key)] = (ns, value)
                if owner is not None:
                    self.owners[label] = owner

    def _trusted(self, value):
        where = _origin(value)
        return where is not None and not _inside(where, self.root)

    def check(self, when):
        # builtins first, and put back: the rest of the check (and the record) needs them honest
        for (label, key), (ns, value) in self.entries.items():
            if label == "builtins" and ns.get(key, MISSING) is not value:
                self._flag(f"builtins.{key} replaced ({when})")
                ns[key] = value
        for (label, key), (ns, value) in self.entries.items():
            now = ns.get(key, MISSING)
            if now is not value and (now is MISSING or not self._trusted(now)):
                self._flag(f"{label}.{key} replaced ({when})")
        for label, cls in self.classes.values():
            for key, now in list(vars(cls).items()):
                if (label, key) not in self.entries and _watched(now) and not self._trusted(now):
                    self._flag(f"{label}.{key} added ({when})")

    def restore(self):
        """Everything guarded back as it was, so that the record can be written whatever the
        code did to ``builtins`` (after ``check``: what was changed is flagged already)."""
        for (label, key), (ns, value) in self.entries.items():
            if ns.get(key, MISSING) is value:
                continue
            owner = self.owners.get(label)
            if owner is not None:  # a class: its namespace is read-only, set the attribute
                setattr(owner, key, value)
            elif value is MISSING:
                ns.pop(key, None)
            else:
                ns[key] = value

    def _flag(self, text):
        what = text.split(" (", 1)[0]  # once per attribute, with the first moment it was seen
        if not any(f.split(" (", 1)[0] == what for f in self.flags):
            self.flags.append(text)

    def audit(self, event, args):
        if event == "exec":
            code = args[0]
            name = getattr(code, "co_filename", "")
            if getattr(code, "co_name", "") == "<module>" and _inside(name, self.root):
                self.executed.add(name)
        elif event in ("object.__setattr__", "object.__delattr__"):
            known = self.classes.get(id(args[0]))
            value = args[2] if len(args) > 2 else MISSING
            if known is not None and (value is MISSING or not self._trusted(value)):
                self._flag(f"{known[0]}.{args[1]} set while the tests ran")
        elif not self.finishing and event in (
            "open",
            "os.rename",
            "os.remove",
            "os.link",
            "os.symlink",
            "os.truncate",
            "shutil.move",
            "shutil.copyfile",
        ):
            text = " ".join(str(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike)))
            if any(t in text for t in self.tokens):
                self._flag(f"{event} on the verifier's record or nonce")


# The executor's own environment (its prefixes and the path it starts with): trusted even where
# it lies under /tmp, the rest of /tmp is the code's.
TRUSTED = tuple(
    {p.rstrip("/") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path) if p}
)


def _inside(path, root):
    """Under the workspace, or under /tmp outside the executor's environment: the code's."""
    path = str(path)
    if path == root or path.startswith(root + "/"):
        return True
    return path.startswith("/tmp/") and not any(path.startswith(t + "/") for t in TRUSTED)


def _file_of(obj):
    mod = sys.modules.get(getattr(obj, "__module__", None) or "")
    return getattr(obj, "__file__", None) or getattr(mod, "__file__", None)


class Recorder:
    """A pytest plugin of the bootstrap: puts the workspace on the path at the right moment,
    sends each test's outcome to the witness as it is reported, records where each collected
    test came from."""

    def __init__(self, watch, root, send):
        self.watch, self.root, self.send = watch, root, send
        self.items, self.plugins = [], []

    def pytest_load_initial_conftests(self, early_config, parser, args):
        sys.path.insert(0, self.root)  # every plugin is loaded now; no code of the workspace ran

    def pytest_collection_finish(self, session):
        for item in session.items:
            mod = getattr(item, "module", None)
            fn = getattr(item, "obj", None)
            code = getattr(fn, "__code__", None)
            loader = getattr(mod, "__loader__", None)
            self.items.append(
                {
                    "nodeid": item.nodeid,
                    "path": str(item.path),
                    "module_file": getattr(mod, "__file__", None),
                    "code_file": getattr(code, "co_filename", None),
                    "loader_file": _file_of(type(loader)) if loader is not None else None,
                }
            )

    def pytest_runtest_logreport(self, report):
        ok = report.passed and not hasattr(report, "wasxfail")
        self.send({"test": report.nodeid, "ok": bool(ok)})
        if report.when == "call":
            self.watch.check(f"by the end of {report.nodeid}")

    def pytest_collectreport(self, report):
        if report.failed:
            self.send({"test": report.nodeid or "<collection>", "ok": False})

    def pytest_sessionfinish(self, session):
        for _name, plugin in session.config.pluginmanager.list_name_plugin():
            if plugin is self or plugin is None:
                continue
            where = _file_of(plugin) or _file_of(type(plugin))
            if where and _inside(where, self.root):
                self.plugins.append(where)


def _shadowed(executed, root, protected):
    """Modules of the standard library or the runner that were executed from the workspace."""
    out = set()
    for name, mod in list(sys.modules.items()):
        where = getattr(mod, "__file__", None)
        if where and _inside(where, root) and name.split(".")[0] in protected:
            out.add(where)
    bases = [p for p in sys.path if isinstance(p, str) and _inside(p, root)] + [root]
    for path in executed:
        for base in bases:
            if path.startswith(base.rstrip("/") + "/"):
                top = path[len(base.rstrip("/")) + 1 :].split("/")[0]
                if top.removesuffix(".py") in protected:
                    out.add(path)
    return sorted(out)


class Stream:
    """The test process's end of the pipe to the witness: one JSON line per message, written as
    it happens (what was sent cannot be taken back later). A pipe the code closed or filled with
    its own lines only costs the run its record (``_outcomes``)."""

    def __init__(self, fd, dumps):
        self.fd, self.dumps, self.write = fd, dumps, os.write

    def __call__(self, message):
        data = self.dumps(message).encode() + b"\n"
        try:
            while data:
                data = data[self.write(self.fd, data) :]
        except OSError:
            pass


def _set_dumpable(value):
    """``prctl(PR_SET_DUMPABLE)``: a process that is not dumpable cannot be traced, nor its
    ``/proc/PID/mem`` or ``fd`` opened, by a process of the same uid. False where it failed."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, value, 0, 0, 0) == 0
    except Exception:
        return False


def _test_process(send, root, args, tokens, protected):
    """The child: pytest runs here, beside the code under test; its facts go to the witness."""
    import pytest

    watch = Watch(root, tokens)
    watch.snapshot()
    sys.addaudithook(watch.audit)
    recorder = Recorder(watch, root, send)
    try:
        code = int(pytest.main(args, plugins=[recorder]))
    except BaseException as e:  # the run ended by something pytest did not catch
        code = 99
        watch.flags.append(f"pytest.main raised {type(e).__name__}")
    watch.check("after the run")
    watch.restore()
    runner = {n: _file_of(sys.modules.get(n)) for n in ("pytest", "_pytest", "pluggy")}
    for name, where in runner.items():
        if where and _inside(where, root):  # /tmp outside the executor's environment
            watch.flags.append(f"the test runner's {name} was loaded from {where!r}")
    watch.finishing = True
    facts = {
        "exit": code,
        "items": recorder.items,
        "runner": runner,
        "plugins": recorder.plugins,
        "shadowed": _shadowed(watch.executed, root, protected),
        "flags": watch.flags,
    }
    send({"facts": facts})
    return code


def _witness(fd, pid, limit):
    """Everything the test process sent until it ended (read while it runs: a full pipe never
    blocks it), whether it sent more than ``limit`` bytes, and its wait status. Stops at its
    exit, not at the pipe's end: a child it left holding the pipe cannot keep the witness."""
    import select

    chunks, size, status = [], 0, None
    while status is None:
        if select.select([fd], [], [], 0.05)[0]:
            data = os.read(fd, 1 << 16)
            if not data:
                status = os.waitpid(pid, 0)[1]
            size += len(data)
            if size <= limit:
                chunks.append(data)
        else:
            done, st = os.waitpid(pid, os.WNOHANG)
            status = st if done else None
    os.set_blocking(fd, False)
    try:
        while size <= limit and (data := os.read(fd, 1 << 16)):
            size += len(data)
            chunks.append(data)
    except BlockingIOError:
        pass
    code = os.waitstatus_to_exitcode(status)
    return b"".join(chunks)[:limit], size > limit, 128 - code if code < 0 else code


def _outcomes(data, json):
    """Per node id, passed in every phase (from the test process's lines, in order), its final
    facts (None: it ended before sending them) and how many lines were not its messages."""
    outcomes: dict = {}
    facts, bad = None, 0
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            msg = json.loads(line)
            if "test" in msg:
                tid, ok = str(msg["test"]), msg["ok"] is True
                outcomes[tid] = outcomes.get(tid, True) and ok
            elif facts is None and isinstance(msg.get("facts"), dict):
                facts = msg["facts"]
            else:
                raise ValueError(line[:80])
        except (ValueError, TypeError, KeyError, AttributeError):
            bad += 1
    return outcomes, facts, bad


def _markers(wanted):
    """Which of the planted tests' marker files hold their token (each read and removed; never
    a link followed). The planted tests' bodies write them: a body that never ran left none."""
    seen = {}
    for path, token in wanted.items():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                seen[path] = os.read(fd, 4096).decode(errors="replace") == token
            finally:
                os.close(fd)
            os.unlink(path)
        except OSError:
            seen[path] = False
    return seen


STREAM_LIMIT = 64 << 20


def main():
    _exit, _open, _write = os._exit, os.open, os.write
    record, secret_file, root = sys.argv[1:4]
    root = os.path.abspath(root)
    args = [*sys.argv[5:], f"--rootdir={root}", "-p", "no:cacheprovider"]
    # The secret (the nonce, the planted tests' markers) is read by the witness only, after the
    # fork: it is never in the test process's memory, and its file is gone before the fork.
    secret_fd = os.open(secret_file, os.O_RDONLY | os.O_NOFOLLOW)
    os.unlink(secret_file)
    sys.argv = ["pytest"]
    tokens = (os.path.basename(record), os.path.basename(secret_file))
    import gc
    import importlib
    import json

    import pytest  # noqa: F401

    for name in (*PRELOAD, *GUARDED_MODULES):
        try:
            importlib.import_module(name)
        except Exception:
            continue
    loaded_before = {n.split(".")[0] for n in sys.modules}
    protected = (set(sys.stdlib_module_names) | loaded_before | set(RUNNER_DISTS)) - {"__main__"}
    guarded = _set_dumpable(0)
    theirs, ours = os.pipe()
    gc.freeze()  # what is loaded now is never collected: the child's collections copy no page
    pid = os.fork()
    if pid == 0:  # the test process: nothing of the secret, nothing of the witness's pipe end
        os.close(secret_fd)
        os.close(theirs)
        _set_dumpable(1)
        _exit(_test_process(Stream(ours, json.dumps), root, args, tokens, protected))
    os.close(ours)
    secret = json.loads(os.read(secret_fd, 1 << 20))
    os.close(secret_fd)
    data, overflow, code = _witness(theirs, pid, STREAM_LIMIT)
    outcomes, facts, bad = _outcomes(data, json)
    rec = {
        **(facts or {}),
        "nonce": secret["nonce"],
        "root": root,
        "exit": code,
        "claimed_exit": (facts or {}).get("exit"),
        "finished": facts is not None,
        "outcomes": outcomes,
        "markers": _markers(secret.get("markers") or {}),
        "stream": {"bad_lines": bad, "overflow": overflow, "witness_guarded": guarded},
    }
    out = json.dumps(rec).encode()
    try:
        fd = _open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        _write(2, f"gagar verify: cannot create the record: {e}\n".encode())
        _exit(3)
    while out:
        out = out[_write(fd, out) :]
    # pytest's status is in the record; the process's is 0 only where it is the one an honest
    # run has (1 where canaries were planted), so that no other run (a crash's 1) reads as one.
    _exit(0 if code == secret.get("expect", 0) else code or 1)


if __name__ == "__main__":
    main()
