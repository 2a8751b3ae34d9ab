"""The ``agent-sandbox`` isolation mode against the API emulator serving agent-sandbox's CRDs
(``tests/kube_emulator/crds/agent-sandbox.yaml``), the test playing agent-sandbox's controller
as the Kueue tests play Kueue.

The controller (``tests/kube_emulator/agent_sandbox.py``) backs each warm Sandbox with a real
executor on a loopback address of its own, binds a claim to a free Sandbox and deletes the
Sandbox when its claim goes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gagar.sandbox.agent import AgentSandboxFactory
from gagar.sandbox.types import Limits, SandboxInfraError, SandboxUnavailable
from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.agent_sandbox import (
    EXT,
    NS,
    POOL,
    SANDBOX,
    Controller,
    free_port,
    install,
    ready_condition,
)
from tests.kube_emulator.fixtures import kube  # noqa: F401

LIMITS = Limits(wall_time_s=20, cpu_time_s=10, memory_bytes=512 << 20)


@pytest.fixture
def controller(kube: KubeEmulator) -> Iterator[Controller]:  # noqa: F811
    install(kube)
    ctl = Controller(kube, free_port(), limits=LIMITS)
    thread = threading.Thread(target=ctl.loop, daemon=True)
    thread.start()
    yield ctl
    ctl.close()
    thread.join(5)


def _factory(kube: KubeEmulator, ctl: Controller, **kw: Any) -> AgentSandboxFactory:  # noqa: F811
    return AgentSandboxFactory(
        POOL, NS, api_client=kube.api_client(), run="run1", port=ctl.port, limits=LIMITS, **kw
    )


def test_a_session_claims_a_sandbox_runs_in_it_and_releases_it(
    kube: KubeEmulator,  # noqa: F811
    controller: Controller,
) -> None:
    controller.warm(2)
    factory = _factory(kube, controller)
    with factory.create(files={"m.py": "X = 41\n"}) as one, factory.create() as two:
        claims = {c["metadata"]["name"]: c for c in kube.list(EXT, "SandboxClaim", NS)}
        assert set(claims) == {one.claim, two.claim}
        assert claims[one.claim]["spec"]["warmPoolRef"] == {"name": POOL}
        assert claims[one.claim]["metadata"]["labels"]["gagar.dev/run"] == "run1"
        assert controller.bound[one.claim] != controller.bound[two.claim]  # a pod each
        r = one.exec(["python3", "-c", "import m; print(m.X + 1)"])
        assert r.ok and r.stdout == "42\n", r
        assert two.exec(["ls"]).stdout == ""  # the other session's files are not there
        one.write_file("n.txt", "hi")
        assert one.read_file("n.txt") == b"hi" and one.list_files() == ["m.py", "n.txt"]
        sandbox = controller.bound[one.claim]
    # released: the claims are deleted, and with them (the controller) the Sandboxes
    kube.wait_for(lambda: kube.list(EXT, "SandboxClaim", NS) == [], timeout=5)
    kube.wait_for(lambda: kube.find(SANDBOX, "Sandbox", sandbox, NS) is None, timeout=5)
    factory.close()


def test_without_the_crds_the_mode_is_unavailable_and_says_what_to_install(
    kube: KubeEmulator,  # noqa: F811
) -> None:
    factory = AgentSandboxFactory(POOL, NS, api_client=kube.api_client(), ready_timeout_s=2)
    with pytest.raises(SandboxUnavailable, match=r"agent-sandbox CRDs are not served.*auto or pod"):
        factory.create()


def test_a_claim_never_ready_times_out_with_a_clear_error_and_is_deleted(
    kube: KubeEmulator,  # noqa: F811
    controller: Controller,
) -> None:
    controller.bind = False
    factory = _factory(kube, controller, ready_timeout_s=1)
    start = time.monotonic()
    with pytest.raises(SandboxInfraError, match=rf"no sandbox of warm pool {NS}/{POOL} was Ready"):
        factory.create()
    assert time.monotonic() - start < 10
    assert kube.list(EXT, "SandboxClaim", NS) == []  # rolled back: nothing left claimed


def test_a_terminal_claim_failure_is_reported_at_once(
    kube: KubeEmulator,  # noqa: F811
    controller: Controller,
) -> None:
    """A warm pool that does not exist: agent-sandbox's controller says so on the claim, and the
    session fails with its words instead of waiting out the timeout."""
    controller.bind = False

    def refuse() -> None:
        def reason(o: dict[str, Any]) -> dict[str, Any]:
            return {**o, "status": {"conditions": ready_condition("False", "WarmPoolNotFound")}}

        claims = kube.wait_for(lambda: kube.list(EXT, "SandboxClaim", NS), timeout=10)
        kube.patch(EXT, "SandboxClaim", claims[0]["metadata"]["name"], reason, NS,
                   subresource="status")  # fmt: skip

    threading.Thread(target=refuse, daemon=True).start()
    factory = _factory(kube, controller, ready_timeout_s=30)
    start = time.monotonic()
    with pytest.raises(SandboxInfraError, match="WarmPool"):
        factory.create()
    assert time.monotonic() - start < 15


def test_a_sandbox_pod_dying_mid_session_is_an_infrastructure_error(
    kube: KubeEmulator,  # noqa: F811
    controller: Controller,
) -> None:
    controller.warm(1)
    factory = _factory(kube, controller)
    session = factory.create()
    assert session.exec(["true"]).ok
    controller.kill(controller.bound[session.claim])
    r = session.exec(["python3", "-c", "print(1)"])
    assert r.infra_error is not None and session.claim in r.infra_error, r
    assert not r.ok
    with pytest.raises(SandboxInfraError, match=session.claim):
        session.read_file("m.py")
    session.close()  # the claim goes although its pod is gone
    kube.wait_for(lambda: kube.list(EXT, "SandboxClaim", NS) == [], timeout=5)
