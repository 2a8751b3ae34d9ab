"""The session's warm test runner (``gagar/sandbox/warm.py``): what a run leaves never reaches the
next one, the policy cannot steer the fork server, and where the server cannot start or is broken
the command runs cold, saying so. The hostile suites (``test_sandbox_hostile.py``,
``test_sandbox_adversarial.py``) run every promise in the ``warm`` mode too."""

from __future__ import annotations

import json

import pytest

from gagar.rollout.envs import synthetic
from gagar.rollout.envs.verify import verify
from gagar.sandbox import warm
from gagar.sandbox.local import LocalFactory, check_isolation, python_paths
from gagar.sandbox.types import Limits

LIMITS = Limits(wall_time_s=30, cpu_time_s=20, memory_bytes=1 << 30, processes=32)
PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider"

# What a fresh interpreter shows of itself; printed by a run after another tried to leave state.
PROBE = r"""
import builtins, json, os, signal, sys, threading
fds = sorted(os.listdir("/proc/self/fd"))
kids = [p for p in os.listdir("/proc") if p.isdigit()
        and b"gagar-leftover" in open(f"/proc/{p}/cmdline", "rb").read()]
print(json.dumps({
    "polluted_module": "gagar_polluted" in sys.modules,
    "json_dumps": json.dumps.__module__,
    "print": type(builtins.print).__name__,
    "leaked_builtin": hasattr(builtins, "gagar_leak"),
    "os_attr": hasattr(os, "gagar_leak"),
    "env": os.environ.get("GAGAR_LEAK"),
    "cwd": os.getcwd(),
    "umask": os.umask(0),
    "signals": {s.name: str(signal.getsignal(s)) for s in
                (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGPIPE, signal.SIGALRM)},
    "mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "fds": fds,
    "threads": threading.active_count(),
    "leftover_processes": kids,
    "shm": sorted(os.listdir("/dev/shm")),
    "path0": sys.path[0],
}, sort_keys=True))
"""

POLLUTE = r"""
import builtins, json, os, signal, sys, threading, time, types
sys.modules["gagar_polluted"] = types.ModuleType("gagar_polluted")
json.dumps = lambda *a, **k: "forged"
builtins.print = lambda *a, **k: None
builtins.gagar_leak = os.gagar_leak = 1
os.environ["GAGAR_LEAK"] = "1"
os.chdir("/tmp")
os.umask(0o077)
signal.signal(signal.SIGTERM, lambda *a: None)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.alarm(100)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
keep = [os.open("/workspace/probe.py", os.O_RDONLY) for _ in range(5)]
os.set_inheritable(keep[0], True)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if os.fork() == 0:
    os.setsid()
    os.execvp("sleep", ["gagar-leftover", "60"])
sys.stdout.write("polluted\n")
"""


@pytest.fixture(scope="module")
def factory() -> LocalFactory:
    check_isolation()
    return LocalFactory(limits=LIMITS)


@pytest.fixture
def session(factory: LocalFactory):
    with factory.create(files={"probe.py": PROBE, "pollute.py": POLLUTE}) as s:
        yield s


def _probe(s) -> dict:
    r = s.exec(["python3", "probe.py"])
    assert r.ok, (r.describe(), r.stderr)
    return {**json.loads(r.stdout), "warm": r.warm}


def test_nothing_of_a_run_reaches_the_next(factory: LocalFactory, session) -> None:
    cold_factory = LocalFactory(limits=LIMITS, warm=False)
    with cold_factory.create(files={"probe.py": PROBE}) as cold:
        expected = _probe(cold)
    assert expected.pop("warm") is False
    first = _probe(session)
    server = session._warm._server
    r = session.exec(["python3", "pollute.py"])
    assert r.ok and r.warm and r.stdout == "polluted\n", (r.describe(), r.stderr)
    after = _probe(session)
    assert after.pop("warm") and first.pop("warm")
    assert session._warm._server == server  # the same server: isolation by fork, not restart
    for state in (first, after):
        assert state == expected, state  # a fresh interpreter's, as a cold run sees it


def test_a_module_changed_by_one_pytest_run_is_pristine_in_the_next(session) -> None:
    session.write_file(
        "test_pollute.py",
        "import _pytest.python, os, sys\n"
        "def test_pollute():\n"
        "    sys.modules['_pytest.python'].gagar_leak = 1\n"
        "    os.environ['GAGAR_LEAK'] = '1'\n",
    )
    session.write_file(
        "test_check.py",
        "import _pytest.python, os\n"
        "def test_check():\n"
        "    assert not hasattr(_pytest.python, 'gagar_leak')\n"
        "    assert 'GAGAR_LEAK' not in os.environ\n",
    )
    first = session.exec(PYTEST + " test_pollute.py")
    second = session.exec(PYTEST + " test_check.py")
    assert first.ok and first.warm and "1 passed" in first.stdout, first.stdout
    assert second.ok and second.warm and "1 passed" in second.stdout, second.stdout


def test_files_in_tmp_are_the_sessions_in_both_modes(factory: LocalFactory) -> None:
    """``/tmp`` is the session's (a cold command's file there is seen by the next, too); the
    jail's own ``/dev/shm``, which outlives a warm run, makes the server go: the next is fresh."""
    with factory.create(files={}) as s:
        r = s.exec(["python3", "-c", "open('/tmp/kept', 'w').write('1'); open('/dev/shm/x', 'w')"])
        assert r.ok and r.warm
        # (an environment under /tmp, as in a clone there, is bound read-only over the session's
        # /tmp: its mount point's top folder is seen there too)
        mounts = sorted({p.split("/")[2] for p in python_paths() if p.startswith("/tmp/")})
        shown = f"print(sorted(set(os.listdir('/tmp')) - set({mounts!r})), os.listdir('/dev/shm'))"
        r = s.exec(["python3", "-c", "import os; " + shown])
        assert r.ok and r.warm and r.stdout == "['kept'] []\n", r.stdout


def test_per_run_timeout_and_output_cap(factory: LocalFactory) -> None:
    small = LocalFactory(limits=LIMITS.model_copy(update={"output_bytes": 4096}))
    with small.create(files={}) as s:
        r = s.exec(["python3", "-c", "import time; print('x', flush=True); time.sleep(60)"], 2)
        assert r.warm and r.timed_out and r.limit_hit == "wall_time" and r.stdout == "x\n"
        r = s.exec(["python3", "-c", "print('y' * 100000)"])
        assert r.warm and r.ok and r.truncated and len(r.stdout) == 4096
        server = s._warm._server
        r = s.exec(["python3", "-c", "print('z')"])
        assert r.warm and r.stdout == "z\n" and s._warm._server == server


def test_the_server_refuses_to_be_inspected_or_signalled(session) -> None:
    code = (
        "import os, signal\n"
        "p = os.getppid()\n"
        "for what in ('mem', 'fd', 'environ'):\n"
        "    try:\n"
        "        open(f'/proc/{p}/{what}', 'rb').read(1) if what != 'fd' else os.listdir(f'/proc/{p}/fd')\n"
        "        print(what, 'open')\n"
        "    except OSError as e:\n"
        "        print(what, 'refused', e.errno)\n"
        "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGALRM):\n"
        "    os.kill(p, s)\n"
        "print(sorted(os.listdir('/proc/self/fd')))\n"
    )
    r = session.exec(["python3", "-c", code])
    assert r.ok and r.warm, (r.describe(), r.stderr)
    assert "open" not in r.stdout.replace("'", ""), r.stdout  # nothing of the server's readable
    assert r.stdout.splitlines()[-1] in ("['0', '1', '2', '3']", "['0', '1', '2']")
    server = session._warm._server
    again = session.exec(["python3", "-c", "print('still')"])
    assert again.warm and again.stdout == "still\n" and session._warm._server == server


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_broken_server_means_a_cold_rerun_then_a_fresh_server(session, how: str) -> None:
    code = (
        "import os, signal\n"
        "if os.path.exists('/tmp/once'): print('ran cold')\n"
        f"else: open('/tmp/once', 'w'); os.kill(os.getppid(), signal.{how}); print('broke it')\n"
    )
    session.exec(["python3", "-c", "pass"])
    server = session._warm._server
    r = session.exec(["python3", "-c", code])
    assert r.ok and not r.warm and r.stdout == "ran cold\n", (r, r.stderr)
    assert "did not report" in (r.warm_fallback or ""), r.warm_fallback
    r = session.exec(["python3", "-c", "print('back')"])
    assert r.warm and r.stdout == "back\n" and session._warm._server not in (0, server)


def test_a_server_that_cannot_start_falls_back_cold() -> None:
    broken = LocalFactory(limits=LIMITS, warm=("gagar_no_such_module",))
    with broken.create(files={"test_a.py": "def test_a():\n    pass\n"}) as s:
        r = s.exec(PYTEST)
        assert r.ok and not r.warm and "1 passed" in r.stdout
        assert "did not start" in r.warm_fallback and "gagar_no_such_module" in r.warm_fallback
        for _ in range(warm.MAX_RESTARTS):
            r = s.exec(PYTEST)
        assert r.ok and not r.warm and "discarded" in r.warm_fallback  # cold for good now


def test_a_shadow_in_place_before_the_first_run_keeps_it_cold(factory: LocalFactory) -> None:
    with factory.create(files={"pytest.py": "print('a shadow')\n"}) as s:
        r = s.exec(PYTEST)
        assert not r.warm and "shadows" in r.warm_fallback and "a shadow" in r.stdout


def test_shadowing_a_preloaded_module_or_other_forms_run_cold(session) -> None:
    session.write_file("test_a.py", "def test_a():\n    pass\n")
    assert session.exec(PYTEST).warm
    assert session.exec("python -m pytest -q -p no:cacheprovider | cat").warm_fallback is None
    assert not session.exec("PYTHONHASHSEED=1 " + PYTEST.split(" ", 1)[1]).warm
    session.write_file("pytest.py", "print('a shadow'); raise SystemExit(0)\n")
    r = session.exec(PYTEST)
    assert (
        not r.warm and "shadows" in r.warm_fallback and "a shadow" in r.stdout
    )  # as cold: its own


@pytest.mark.parametrize(
    "cmd,kind",
    [
        ("python -m pytest -q", "module"),
        ("A=1 PYTHONPATH=src python3 -m pytest 'x y'", "module"),
        (["env", "K=v", "python3", "-c", "print(1)"], "code"),
        ("python t.py a", "script"),
        ("python -m pytest; rm -rf x", None),
        ("python -m pytest $(echo x)", None),
        ('python -m pytest "$HOME"', None),
        ("python -X dev -m pytest", None),
        ("PYTHONHASHSEED=0 python -m pytest", None),
        ("LD_PRELOAD=x.so python -m pytest", None),
        ("cd sub && python -m pytest", None),
        ("python -m pytest t.py::test[1]", None),
        ("pytest -q", None),
        # -I and -B (what the server runs with): verification's `python -I -B -c BOOT`
        ("python -I -B -c x", "code"),
        ("PYTHONHASHSEED=0 python -I -m pytest", "module"),
        ("python -IB t.py", "script"),
        ("python -B -m pytest", "module"),
        ("LD_PRELOAD=x python -I -m pytest", None),
        ("python -I -X dev -m pytest", None),
        ("python -Iu -c x", None),
    ],
)
def test_which_commands_run_warm(cmd, kind) -> None:
    req = warm.parse(cmd)
    assert (req.kind if req else None) == kind


def test_only_dash_i_makes_an_isolated_request() -> None:
    assert warm.parse("python -I -c x").isolated and not warm.parse("python -B -c x").isolated


def test_a_tampered_server_cannot_make_verification_pass(factory: LocalFactory) -> None:
    """The agent's session breaks its server every way it can reach; verification, in a fresh
    session run cold (``python -I -B``), still fails the unfixed code."""
    task = synthetic.generate(5)
    with factory.create(files=task.files) as s:
        s.write_file("pytest.py", "raise SystemExit(0)\n")
        s.write_file("_pytest.py", "raise SystemExit(0)\n")
        stop = "import os, signal\nif not os.path.exists('/tmp/once'):\n    open('/tmp/once', 'w')\n    os.kill(os.getppid(), signal.SIGSTOP)"
        r = s.exec(["python3", "-c", stop])
        assert not r.warm and r.warm_fallback
        s.exec(["python3", "-c", "open('/dev/shm/gagar', 'w')"])
        verdict = verify(task, s, factory)
    assert verdict.valid and not verdict.passed, verdict
