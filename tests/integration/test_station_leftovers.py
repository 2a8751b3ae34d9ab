"""Verification stations, second round (issue 45): what a candidate leaves besides files and
processes. Network state (a port in ``TIME_WAIT``, a daemon's listener) must not fail the next
candidate's correct fix in the same station; a client choosing many preload-and-limits keys must
not keep more idle stations than the global bound; two candidates with equal bytes and different
file times must not share a verdict that either could not get on its own."""

from __future__ import annotations

import os
import time

import pytest

from gagar.rollout.envs import synthetic
from gagar.rollout.envs.verify import SharedVerdicts, verify
from gagar.sandbox import warm
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.station import Stations
from gagar.sandbox.types import Limits
from gagar.sandbox.workspace import files_tarball

LIMITS = Limits(wall_time_s=30, cpu_time_s=20, memory_bytes=1 << 30, processes=32)
PORT = 8765

# The next candidate's test: it binds the port as most tests do, without SO_REUSEADDR.
BINDS = (
    "import socket\n"
    "for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):\n"
    "    s = socket.socket(family)\n"
    f"    s.bind((host, {PORT})); s.listen()\n"
    "    c = socket.create_connection((host, {PORT}))\n"
    "    a, _ = s.accept(); c.sendall(b'ok'); assert a.recv(2) == b'ok'\n"
    "    a.close(); c.close(); s.close()\n"
    "print('bound')\n"
).replace("{PORT}", str(PORT))

# What a hacked candidate's run leaves in the network: the closing side of a connection holds
# the port in TIME_WAIT for a minute; a daemon (killed with the run's cgroups) listened on it;
# an abstract Unix socket name, which lives in the network namespace too.
LEFTOVERS = {
    "time_wait": (
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', {PORT})); s.listen()\n"
        "c = socket.create_connection(('127.0.0.1', {PORT})); a, _ = s.accept()\n"
        "a.close(); c.recv(1); c.close(); s.close()\n"  # the server side closes first
    ),
    "daemon": (
        "import os, socket, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    s = socket.socket(); s.bind(('127.0.0.1', {PORT})); s.listen()\n"
        "    u = socket.socket(socket.AF_UNIX); u.bind('\\0gagar-left'); u.listen()\n"
        "    time.sleep(60)\n"
        "time.sleep(0.5)\n"
    ),
}


def _isolated(code: str) -> list[str]:
    return ["python", "-I", "-B", "-c", code.replace("{PORT}", str(PORT))]


@pytest.fixture(scope="module", autouse=True)
def _isolation() -> None:
    check_isolation()


@pytest.mark.parametrize("how", sorted(LEFTOVERS))
def test_network_state_of_one_candidate_never_fails_the_next(how: str) -> None:
    factory = LocalFactory(limits=LIMITS)
    factory.stations = Stations(idle=1)
    with LocalFactory(limits=LIMITS, warm=False).create(files={}) as cold:
        r = cold.exec(_isolated(BINDS))
        assert r.ok and r.stdout == "bound\n", (r.describe(), r.stderr)  # passes cold
    with factory.verification_session(files_tarball({"a.py": "A"})) as first:
        r = first.exec(_isolated(LEFTOVERS[how]))
        assert r.ok and r.warm, (r.describe(), r.stderr)
    with factory.verification_session(files_tarball({"b.py": "B"})) as second:
        r = second.exec(_isolated(BINDS))
        assert r.ok and r.warm and r.stdout == "bound\n", (r.describe(), r.stderr)
        r = second.exec(
            _isolated("import socket; socket.socket(socket.AF_UNIX).bind('\\0gagar-left')")
        )
        assert r.ok, (r.describe(), r.stderr)
    factory.stations.close()


def test_where_runs_share_the_servers_network_its_residue_retires_the_station(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a namespace per run (a kernel that refuses user namespaces; here the server's
    filter refuses them), a socket left in the server's namespace is seen after the run: the
    result is kept, the server discarded, and the next candidate gets a fresh station."""
    monkeypatch.setattr(warm, "RUN_NETNS", False)
    factory = LocalFactory(limits=LIMITS)
    with factory.verification_session(files_tarball({"a.py": "A"})) as first:
        r = first.exec(_isolated("print('clean')"))
        assert r.ok and r.warm and not first._warm._netns
        assert first.unfit() is None  # nothing left: the station may serve again
        r = first.exec(_isolated(LEFTOVERS["time_wait"] + "print('left')"))
        assert r.ok and r.warm and r.stdout == "left\n", (r.describe(), r.stderr)
        assert first.unfit() is not None
    with factory.verification_session(files_tarball({"b.py": "B"})) as second:
        r = second.exec(_isolated(BINDS))
        assert r.ok and r.warm and r.stdout == "bound\n", (r.describe(), r.stderr)
    # the second's own connections leave TIME_WAIT too: in this mode, network use costs a station
    assert (factory.stations.made, factory.stations.retired) == (2, 2)
    factory.stations.close()


def test_each_run_has_a_network_of_its_own_and_no_more_power() -> None:
    """Each warm run gets a fresh network namespace (a loopback of its own, up), as a cold
    command does; what made it gives the run no capability and no way to make another."""
    factory = LocalFactory(limits=LIMITS)
    probe = (
        "import ctypes, os, socket\n"
        "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('Cap')]\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "refused = [libc.unshare(f) != 0 and ctypes.get_errno() for f in (0x40000000, 0x10000000)]\n"
        "print(os.readlink('/proc/self/ns/net'), caps, refused, os.getuid() == {uid})\n"
    )
    with factory.verification_session(files_tarball({})) as s:
        seen = set()
        for _ in range(2):
            r = s.exec(_isolated(probe.replace("{uid}", str(s.uid))))
            assert r.ok and r.warm, (r.describe(), r.stderr)
            net, *rest = r.stdout.split(" ", 1)
            seen.add(net)
            assert rest == [
                "['0000000000000000', '0000000000000000', '0000000000000000', "
                "'0000000000000000', '0000000000000000'] [1, 1] True\n"
            ], r.stdout
        assert len(seen) == 2, seen  # a namespace per run
    factory.stations.close()


def test_the_idle_bound_holds_across_keys() -> None:
    """The bound is global: a client that picks a new preload or limits per verification (the
    key is the client's to choose) still leaves at most ``idle`` stations, the least recently
    used closed first."""
    factory = LocalFactory(limits=LIMITS)
    factory.stations = stations = Stations(idle=2)

    def verify_with(key: int) -> None:  # wall time as the key: the client's choice
        limits = LIMITS.model_copy(update={"wall_time_s": 30 + key})
        factory.verification_session(files_tarball({f"{key}.py": ""}), limits=limits).close()

    for key in range(4):
        verify_with(key)
    assert (stations.made, stations.reused, stations.retired) == (4, 0, 2)
    verify_with(3)  # kept: the most recent
    assert (stations.made, stations.reused, stations.retired) == (4, 1, 2)
    verify_with(0)  # closed: the least recent
    assert (stations.made, stations.reused, stations.retired) == (5, 1, 3)
    stations.close()


def test_equal_bytes_with_other_file_times_get_one_outcome() -> None:
    """File times are not in the shared-verdict digest; a test that reads them would pass one
    twin and fail the other, and the two would share the first one's verdict. The times are set
    when a repository is unpacked, so equal bytes make equal workspaces: each twin verified on
    its own gets the verdict they share."""
    task = synthetic.generate(5)
    module = next(iter(task.reference_files))
    fix = task.reference_files[module]
    # a wrong-on-purpose gate: the fix applies only to a module file older than 2001
    gated = f"import os as _os\nif _os.path.getmtime(__file__) > 978307200:\n    raise ImportError('late')\n{fix}"
    factory = LocalFactory(limits=LIMITS)
    own, shared = [], SharedVerdicts()
    for when in (946684800, time.time()):  # 2000, now
        with factory.create(files=task.files) as s:
            s.write_file(module, gated)
            os.utime(s.workspace / module, (when, when))
            own.append(verify(task, s, factory))
            shared.verify(task, s, factory)
    assert all(v.valid for v in own), own
    assert own[0].passed == own[1].passed, [v.log[-400:] for v in own]
    assert shared.runs == 1 and shared.shared == 1
    factory.stations.close()
