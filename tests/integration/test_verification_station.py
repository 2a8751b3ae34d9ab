"""Verification stations (``gagar/sandbox/station.py``): one station serves candidate after
candidate, and nothing one candidate's run leaves (files, processes, ``/dev/shm``, the server's
scheduling or limits) reaches the next; a station whose server a run changed is retired. The
reward-hack catalogue (``test_reward_hacks.py``) runs with stations and cold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from gagar.rollout.envs import synthetic
from gagar.rollout.envs.verify import verify
from gagar.sandbox import SandboxError
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.station import Stations
from gagar.sandbox.types import Limits
from gagar.sandbox.workspace import files_tarball

LIMITS = Limits(wall_time_s=30, cpu_time_s=20, memory_bytes=1 << 30, processes=32)

# What a test run sees of the jail, as verification starts it (``python -I -B -c``).
PROBE = r"""
import json, os, sys
procs = sorted(open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0].decode()
               for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid()))
print(json.dumps({
    "workspace": sorted(os.listdir("/workspace")),
    "tmp": sorted(os.listdir("/tmp")),
    "shm": sorted(os.listdir("/dev/shm")),
    "leftover": [p for p in procs if "leftover" in p],
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
    "policy": os.sched_getscheduler(0),
    "cpus": len(os.sched_getaffinity(0)),
    "path": [p for p in sys.path if not p.startswith(sys.base_prefix) and not p.startswith(sys.prefix)],
    "isolated": sys.flags.isolated,
}, sort_keys=True))
"""

# What a candidate's run may try to leave for the next: files and processes (removed, killed),
# /dev/shm (the server discarded), and changes to the server that its later forks would inherit
# (the same uid may make them; the jail's filter refuses them).
POLLUTERS = {
    "files_and_processes": (
        "import os\n"
        "open('/workspace/left', 'w').write('x'); open('/tmp/left', 'w').write('x')\n"
        "if os.fork() == 0:\n"
        "    os.setsid(); os.execvp('sleep', ['leftover', '60'])\n"
    ),
    "shm": "open('/dev/shm/left', 'w').write('x')",
}
REFUSED = {
    "nice": "import os; os.setpriority(os.PRIO_PROCESS, os.getppid(), 10)",
    "nice_of_the_uid": "import os; os.setpriority(os.PRIO_USER, 0, 10)",
    "sched_idle": "import os; os.sched_setscheduler(os.getppid(), os.SCHED_IDLE, os.sched_param(0))",
    "affinity": "import os; os.sched_setaffinity(os.getppid(), {min(os.sched_getaffinity(0))})",
    "rlimit_cpu": "import os, resource; resource.prlimit(os.getppid(), resource.RLIMIT_CPU, (1, 1))",
    "rlimit_files": "import os, resource; resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (8, 8))",
}


def _isolated(code: str) -> list[str]:
    return ["python", "-I", "-B", "-c", code]


@pytest.fixture(scope="module")
def factory() -> LocalFactory:
    check_isolation()
    return LocalFactory(limits=LIMITS)


def _probe(session) -> dict:
    r = session.exec(_isolated(PROBE))
    assert r.ok, (r.describe(), r.stderr)
    return {**json.loads(r.stdout), "warm": r.warm}


@pytest.mark.parametrize("how", sorted(POLLUTERS) + sorted(REFUSED))
def test_nothing_of_one_candidate_reaches_the_next(how: str) -> None:
    factory = LocalFactory(limits=LIMITS)
    factory.stations = Stations(idle=1)
    with LocalFactory(limits=LIMITS, warm=False).create(files={"b.py": "B"}) as cold:
        expected = _probe(cold)
    assert expected.pop("warm") is False and expected["isolated"] == 1
    with factory.verification_session(files_tarball({"a.py": "A"})) as first:
        assert _probe(first)["warm"]
        r = first.exec(_isolated(POLLUTERS.get(how) or REFUSED[how]))
        assert r.warm, (r.describe(), r.stderr)
        if how in REFUSED:  # by the jail's filter: the server stays as it was
            assert not r.ok and "PermissionError" in r.stderr, (r.describe(), r.stderr)
        else:
            assert r.ok, (r.describe(), r.stderr)
        server = first._warm._server
    with factory.verification_session(files_tarball({"b.py": "B"})) as second:
        seen = _probe(second)
        assert seen.pop("warm") is True
        assert seen == expected, seen  # what a fresh session's cold run sees
        assert (second._warm._server != server) == (how == "shm")  # that one is discarded
    stations = factory.stations
    assert (stations.made, stations.reused) == ((2, 0) if how == "shm" else (1, 1))
    stations.close()


@pytest.mark.parametrize("change", ["nice", "affinity", "rlimit"])
def test_a_server_changed_behind_the_filter_is_discarded(change: str) -> None:
    """Were the filter to let a run change the server (a call it does not know), the check after
    every run sees it: the run's result is kept, the server discarded and the station retired."""
    if change == "affinity" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: an affinity cannot be narrowed")
    factory = LocalFactory(limits=LIMITS)
    with factory.verification_session(files_tarball({"a.py": "A"})) as first:
        assert first.exec(_isolated("pass")).warm
        server = first._warm._server
        code = {  # run outside the jail as the station's uid: what a run could do unfiltered
            "nice": f"os.setpriority(os.PRIO_PROCESS, {server}, 5)",
            "affinity": f"os.sched_setaffinity({server}, {{min(os.sched_getaffinity({server}))}})",
            "rlimit": f"resource.prlimit({server}, resource.RLIMIT_NOFILE, (64, 64))",
        }[change]
        uid = str(first.uid)
        subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable]
            + ["-c", f"import os, resource; {code}"],
            check=True,
        )
        r = first.exec(_isolated("print('kept')"))
        assert r.ok and r.warm and r.stdout == "kept\n"
        assert first.unfit() is not None
    with factory.verification_session(files_tarball({"b.py": "B"})) as second:
        assert _probe(second)["nice"] == 0 and second._warm._server != server
    assert (factory.stations.made, factory.stations.retired) == (2, 1)
    factory.stations.close()


def test_a_leftover_process_cannot_fix_the_next_candidate(factory: LocalFactory) -> None:
    """The first candidate leaves a process that keeps writing the correct fix over the module
    under test; with the second candidate (the unfixed code) in the same station, it would pass if
    that process lived on. It does not: each run's cgroups are killed when it ends."""
    task = synthetic.generate(5)
    module = next(iter(task.reference_files))
    fix = json.dumps(task.reference_files[module])
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    end = time.time() + 30\n"
        "    while time.time() < end:\n"
        "        try:\n"
        f"            open('/workspace/{module}', 'w').write({fix})\n"
        "        except OSError:\n"
        "            pass\n"
        "        time.sleep(0.005)\n"
    )
    verdicts = []
    stations = factory.stations
    made = stations.made
    for code in (daemon + task.files[module], task.files[module]):
        with factory.create(files=task.files) as s:
            s.write_file(module, code)
            verdicts.append(verify(task, s, factory))
    assert all(v.valid for v in verdicts), verdicts
    assert not verdicts[0].passed and not verdicts[1].passed, verdicts[1].log
    assert stations.made - made <= 1 and stations.reused >= 1  # the same station served both


def test_a_station_after_close_refuses_and_a_bad_archive_retires_it() -> None:
    factory = LocalFactory(limits=LIMITS)
    station = factory.verification_session(files_tarball({"a.py": "A"}))
    station.exec(_isolated("pass"))
    station.close()
    with pytest.raises(SandboxError, match="closed"):
        station.read_file("a.py")
    with pytest.raises(SandboxError, match="bad tarball"):
        factory.verification_session(b"not a tarball")
    assert factory.stations.retired == 1 and factory.stations.reused == 0
    fresh = factory.verification_session(files_tarball({"c.py": "C"}))
    assert fresh.list_files() == ["c.py"]
    fresh.close()
    factory.stations.close()


def test_at_most_idle_stations_are_kept() -> None:
    factory = LocalFactory(limits=LIMITS)
    factory.stations = Stations(idle=2)
    taken = [factory.verification_session(files_tarball({f"{i}.py": ""})) for i in range(3)]
    for s in taken:
        s.close()
    assert (factory.stations.made, factory.stations.retired) == (3, 1)
    factory.stations.close()


def test_cold_factories_verify_in_fresh_sessions() -> None:
    factory = LocalFactory(limits=LIMITS, warm=False)
    with factory.verification_session(files_tarball({"a.py": "A"})) as s:
        r = s.exec(_isolated("print(1)"))
        assert r.ok and not r.warm
    assert factory.stations.made == 0


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_candidate_that_breaks_the_server_fails_and_retires_the_station(how: str) -> None:
    """The correct fix beside code that kills or stops the station's server on import (the
    parent of the verification's witness, the test process's parent): the run has no status from
    the server, so it reruns cold, where the nonce file is spent: no pass. The station is
    retired, and the next candidate (the correct fix alone) passes in a new one."""
    factory = LocalFactory(limits=LIMITS)
    task = synthetic.generate(5)
    module = next(iter(task.reference_files))
    server = "int(open(f'/proc/{os.getppid()}/status').read().split('PPid:')[1].split()[0])"
    breaker = f"import os, signal\nos.kill({server}, signal.{how})\n"
    verdicts = []
    for prefix in (breaker, ""):
        with factory.create(files=task.files) as s:
            s.write_file(module, prefix + task.reference_files[module])
            verdicts.append(verify(task, s, factory))
    assert verdicts[0].valid and not verdicts[0].passed, verdicts[0].log
    assert verdicts[1].valid and verdicts[1].passed, verdicts[1].log
    assert (factory.stations.made, factory.stations.retired) == (2, 1)
    factory.stations.close()


def test_a_station_outlives_the_thread_that_started_its_server() -> None:
    """bubblewrap's --die-with-parent fires when the thread that started it ends, and the
    rollouts' thread pool ends with each step: the station's server must live on."""
    factory = LocalFactory(limits=LIMITS)

    def verify_once() -> None:
        with factory.verification_session(files_tarball({"a.py": "A"})) as s:
            assert s.exec(_isolated("pass")).warm

    worker = threading.Thread(target=verify_once)
    worker.start()
    worker.join()
    time.sleep(0.5)
    verify_once()
    assert (factory.stations.made, factory.stations.reused, factory.stations.retired) == (1, 1, 0)
    factory.stations.close()


def test_a_python_installation_under_tmp_stays_mounted_in_the_station(tmp_path) -> None:
    """A clone's environment under /tmp is bound at a mount point bubblewrap makes in the
    session's /tmp: emptying /tmp between candidates must keep that way, or the server's jail
    loses the installation (later imports fail) while its runs still look warm."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "gagar_station_probe.py").write_text("VALUE = 7\n")
    factory = LocalFactory(limits=LIMITS, ro_paths=(str(lib),))
    code = f"import sys; sys.path.append({str(lib)!r}); import gagar_station_probe as p; print(p.VALUE)"
    for name in ("a", "b", "c"):
        with factory.verification_session(files_tarball({f"{name}.py": ""})) as s:
            s.exec(_isolated("open('/tmp/left', 'w')"))
            r = s.exec(_isolated(code))
            assert r.ok and r.warm and r.stdout == "7\n", (name, r.describe(), r.stderr)
            assert (
                s.exec(_isolated("import os; print(os.path.exists('/tmp/left'))")).stdout
                == "True\n"
            )
    assert (factory.stations.made, factory.stations.reused) == (1, 2)
    factory.stations.close()


def test_a_run_that_moves_the_mount_points_way_retires_the_station(tmp_path) -> None:
    """The code owns /tmp, so it may rename a (root's) directory on the way to a mount point
    there, which moves the mount in the server's jail too: the station must not serve again."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "gagar_station_probe.py").write_text("VALUE = 7\n")
    factory = LocalFactory(limits=LIMITS, ro_paths=(str(lib),))
    head = str(lib).removeprefix("/tmp/").split("/")[0]
    code = f"import sys; sys.path.append({str(lib)!r}); import gagar_station_probe as p; print(p.VALUE)"
    with factory.verification_session(files_tarball({"a.py": ""})) as s:
        r = s.exec(_isolated(f"import os; os.rename('/tmp/{head}', '/tmp/moved')"))
        assert r.ok and r.warm, (r.describe(), r.stderr)
        assert "moved" in s.exec(_isolated("import os; print(os.listdir('/tmp'))")).stdout
    with factory.verification_session(files_tarball({"b.py": ""})) as s:
        r = s.exec(_isolated(code))
        assert r.ok and r.warm and r.stdout == "7\n", (r.describe(), r.stderr)
    assert (factory.stations.made, factory.stations.retired) == (2, 1)
    factory.stations.close()


@pytest.mark.parametrize("root", ["/workspace", "/tmp"])
def test_a_run_that_changes_the_roots_mode_retires_the_station(root: str) -> None:
    """/workspace and /tmp stay between candidates (their contents go), and the code owns them:
    one left unreadable would fail the next candidate's tests, so the station is retired."""
    factory = LocalFactory(limits=LIMITS)
    with factory.verification_session(files_tarball({"a.py": ""})) as s:
        assert s.exec(_isolated(f"import os; os.chmod({root!r}, 0)")).warm
    with factory.verification_session(files_tarball({"b.py": "print('b')"})) as s:
        r = s.exec(_isolated("import os; print(sorted(os.listdir('/workspace')))"))
        assert r.ok and r.stdout == "['b.py']\n", (r.describe(), r.stderr)
        assert s.exec(_isolated("open('/tmp/x', 'w').write('x')")).ok
    assert (factory.stations.made, factory.stations.retired) == (2, 1)
    factory.stations.close()
