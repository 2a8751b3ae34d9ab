"""The cluster trainer's boundary: its config directory, its environment, its exit codes.

The config directory and the environment come from the operator's own builders here (the
ConfigMap data and the trainer container's env), so the trainer and the operator agree on file
names, variables and Service names. Configuration errors end with the permanent exit code and a
message naming the file, variable or field, before any torch or Megatron import.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gagar import RUN_FILE
from gagar.driver import launch, worker
from gagar.driver.cluster import (
    Cluster,
    ProgressReporter,
    ReplicaSync,
    discover_replicas,
    exit_permanent,
    progress_data,
    replica_urls,
    resolve,
    serve_weights,
)
from gagar.manifest import ConfigError
from gagar.manifest import load_config_dir as load_config
from gagar.operator.builders import build_all
from gagar.operator.builders.config import PROGRESS_KEYS, config_data
from gagar.operator.builders.trainer import EXIT_PERMANENT
from gagar.operator.observe import parse_progress
from gagar.rollout.engines.server import free_port
from gagar.sandbox.client import HttpPoolFactory
from gagar.spec import GagarRun
from tests.unit.test_builders import example


def write_config(run: GagarRun, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for key, text in config_data(run).items():
        (folder / key).write_text(text)
    return folder


def trainer_env(run: GagarRun) -> dict[str, str]:
    """The trainer container's literal env (fieldRefs are filled in by the kubelet, not here)."""
    (job,) = [o for o in build_all(run) if o["kind"] == "Job"]
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def test_config_round_trips_through_the_operator_configmap(tmp_path: Path) -> None:
    run = example("local")
    loaded = load_config(write_config(run, tmp_path))
    assert loaded.spec == run.spec and loaded.metadata.name == "local"
    assert RUN_FILE in config_data(run)


def test_missing_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run\.json is missing: is the run's ConfigMap mounted"):
        load_config(tmp_path)


def test_invalid_run_names_the_field(tmp_path: Path) -> None:
    cfg = write_config(example("local"), tmp_path)
    text = (cfg / RUN_FILE).read_text().replace('"groupSize": 4', '"groupSize": 0')
    (cfg / RUN_FILE).write_text(text)
    with pytest.raises(ConfigError, match=r"spec\.algorithm\.groupSize"):
        load_config(cfg)


def test_builder_env_resolves_to_the_run_services() -> None:
    run = example("local", **{"sandbox.backend": "pods"})
    cluster = resolve(trainer_env(run), run)
    assert cluster == Cluster(
        run_dir=Path("/gagar/checkpoints"),
        checkpoint_uri="pvc://local-checkpoints",
        rollout_url="http://local-rollout:8000",
        rollout_service="local-rollout",
        grader_url="http://local-grader:8080",
        sandbox_url="http://local-sandbox:8090",
        progress_configmap="local-progress",
        metrics_port=9400,
        weights_url="http://local-trainer-0.local-trainer-rdzv:8600",  # rank 0 serves the pool
    )


@pytest.mark.parametrize(
    ("changes", "env", "message"),
    [
        ({}, {"GAGAR_RUN_DIR": None}, "GAGAR_RUN_DIR is not set"),
        ({"sandbox.backend": "pods"}, {"GAGAR_SANDBOX_URL": None}, "GAGAR_SANDBOX_URL is not set"),
        ({}, {"GAGAR_ROLLOUT_URL": None}, "GAGAR_ROLLOUT_URL is not set"),
        ({}, {"GAGAR_WEIGHT_TRANSPORT": "nccl"}, r"GAGAR_WEIGHT_TRANSPORT is 'nccl'"),
        ({}, {"GAGAR_METRICS_PORT": "http"}, "GAGAR_METRICS_PORT"),
    ],
)  # fmt: skip
def test_unusable_configuration_is_a_config_error(
    changes: dict[str, Any], env: dict[str, str | None], message: str
) -> None:
    run = example("local", **changes)
    merged = {**trainer_env(run), **env}
    with pytest.raises(ConfigError, match=message):
        resolve({k: v for k, v in merged.items() if v is not None}, run)


EXAMPLES = sorted(p.stem for p in (Path(__file__).parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_passes_the_trainers_start_up_checks(name: str, tmp_path: Path) -> None:
    """What the CRD accepts the trainer starts: each example, through the operator's ConfigMap and
    trainer env, loads, resolves its endpoints and lays out its ranks without a ConfigError (the
    GPU examples included: their GPUs are never allocated for a run that fails at start)."""
    run = example(name)  # valid for pydantic and the CRD: tests/unit/test_spec.py
    env = trainer_env(run)
    assert env["GAGAR_WEIGHT_TRANSPORT"] == "gagar-cpu"
    loaded = load_config(write_config(run, tmp_path))
    resolve(env, loaded)
    parallel = worker.layout(loaded)
    p = run.spec.trainer.parallelism
    assert (parallel.tp, parallel.ep, parallel.pp) == (p.tensor, p.expert, 1)


def test_worker_exits_permanently_on_an_invalid_run(tmp_path: Path, caplog, monkeypatch) -> None:
    cfg = write_config(example("local"), tmp_path / "config")
    (cfg / RUN_FILE).write_text('{"apiVersion": "gagar.dev/v1alpha1", "kind": "GagarRun"}')
    monkeypatch.setenv("GAGAR_EXIT_PERMANENT", str(EXIT_PERMANENT))
    marker = tmp_path / "permanent"
    monkeypatch.setenv("GAGAR_PERMANENT_MARKER", str(marker))
    with caplog.at_level(logging.ERROR, logger="gagar"):
        assert worker.main([f"--config-dir={cfg}"]) == EXIT_PERMANENT == 3
    assert "the run cannot go on (exit 3, not retried): invalid configuration" in caplog.text
    assert "metadata: Field required" in caplog.text and "spec: Field required" in caplog.text
    assert "spec: Field required" in marker.read_text()  # for the launcher, whatever torchrun saw


def test_worker_uses_the_exit_code_it_is_given(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GAGAR_EXIT_PERMANENT", "42")
    assert worker.main([f"--config-dir={tmp_path}"]) == 42
    assert exit_permanent({"GAGAR_EXIT_PERMANENT": "x"}) == 3


def test_launcher_checks_the_config_before_starting_workers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GAGAR_EXIT_PERMANENT", "3")
    run = example("local")
    cfg = write_config(run, tmp_path)
    for key, value in trainer_env(run).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GAGAR_RUN_DIR")
    argv = ["--nproc-per-node=2", "-m", "gagar.driver.worker", f"--config-dir={cfg}"]
    assert launch.main(argv) == 3  # returns before torchrun starts anything
    assert launch.config_dir(["-m", "x", "--config-dir", "/etc/c"]) == Path("/etc/c")
    assert launch.config_dir(["-m", "x"]) is None


def test_launcher_passes_the_permanent_code_through_torchrun() -> None:
    assert launch.exit_code([3, -15], 3) == 3  # one worker gave up, torchrun stopped the other
    assert launch.exit_code([1, -15], 3) == 1
    assert launch.exit_code([-9], 3) == 1
    # the rank that gave up was stopped by torchrun after its peer's broken collective failed
    assert launch.exit_code([1, -15], 3, marked=True) == 3


def test_progress_is_what_the_operator_reads() -> None:
    data = progress_data(
        7,
        8,
        7,
        (6, "pvc://c/checkpoints/step_00000006", "2026-01-01T00:00:00Z"),
        "2026-01-01T00:00:00Z",
    )
    assert set(data) <= set(PROGRESS_KEYS) and all(isinstance(v, str) for v in data.values())
    progress = parse_progress(data)
    assert (progress.step, progress.policy_version, progress.rollout_policy_version) == (7, 8, 7)
    assert (progress.checkpoint_step, progress.checkpoint_uri) == (
        6,
        "pvc://c/checkpoints/step_00000006",
    )
    assert set(progress_data(0, 0, None, None, "t")) == {"step", "policyVersion", "startTime"}


class FakeCore:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.fail = fail

    def patch_namespaced_config_map(self, name: str, namespace: str, body: dict) -> None:
        if self.fail:
            raise RuntimeError("403 forbidden")
        self.calls.append((name, namespace, body))


def test_progress_reporter_patches_data_and_never_raises(caplog) -> None:
    core = FakeCore()
    ProgressReporter(core, "r-progress", "ns").report({"step": "1"})
    assert core.calls == [("r-progress", "ns", {"data": {"step": "1"}})]
    with caplog.at_level(logging.WARNING, logger="gagar"):
        ProgressReporter(FakeCore(fail=True), "r-progress", "ns").report({"step": "2"})
    assert "cannot patch ConfigMap ns/r-progress: 403 forbidden" in caplog.text


def test_progress_is_skipped_with_a_reason_outside_a_cluster(caplog) -> None:
    base = Cluster(Path("/r"), "pvc://c", "http://r:8000", namespace="ns")
    with caplog.at_level(logging.INFO, logger="gagar"):
        assert ProgressReporter.from_cluster(base, None) is None
        named = Cluster(
            Path("/r"), "pvc://c", "http://r:8000", progress_configmap="p", namespace="ns"
        )
        assert ProgressReporter.from_cluster(named, None) is None
    assert "GAGAR_PROGRESS_CONFIGMAP is not set" in caplog.text
    assert "no in-cluster API access: progress is not reported to p" in caplog.text


def test_replicas_from_endpoint_slices() -> None:
    slices = [
        {
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.1"], "conditions": {}},
                {"addresses": ["10.0.0.9"], "conditions": {"ready": False}},
            ],
        },
        {"ports": [{"name": "http", "port": 8000}], "endpoints": [{"addresses": ["fd00::5"]}]},
        {"ports": [{"name": "metrics", "port": 9400}], "endpoints": [{"addresses": ["10.0.0.3"]}]},
    ]
    assert replica_urls(slices) == [
        "http://10.0.0.1:8000",
        "http://10.0.0.2:8000",
        "http://[fd00::5]:8000",
    ]
    fixed = Cluster(Path("/r"), "u", "http://svc:8000", rollout_replicas=("http://a:1",))
    assert discover_replicas(fixed, None) == ["http://a:1"]
    assert discover_replicas(Cluster(Path("/r"), "u", "http://svc:8000"), None) == [
        "http://svc:8000"
    ]


def test_without_api_access_weights_go_through_the_service_with_a_warning(caplog) -> None:
    pool = Cluster(Path("/r"), "u", "http://svc:8000", rollout_service="svc", namespace="ns")
    with caplog.at_level(logging.WARNING, logger="gagar"):
        assert discover_replicas(pool, None) == ["http://svc:8000"]
    assert "cannot list the replicas of svc" in caplog.text


def test_rank_0_serves_its_weights_and_every_replica_fetches_them(tmp_path: Path) -> None:
    """The cluster's weight sync end to end on loopback: the server on ``GAGAR_WEIGHTS_URL``'s
    port, each replica (the fake vLLM) told that URL and fetching each version's file from it;
    a replica restarted in place (its state lost) is initialised again."""
    import torch

    from tests.support.fake_vllm import FakeOpenAIServer

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    url = f"http://127.0.0.1:{free_port()}"
    root = tmp_path / "run" / "published"
    with FakeOpenAIServer() as a, FakeOpenAIServer() as b:
        cluster = Cluster(tmp_path / "run", "u", a.base_url,
                          rollout_replicas=(a.base_url, b.base_url), weights_url=url)  # fmt: skip
        server = serve_weights(cluster, root)
        assert server is not None and server.port == int(url.rsplit(":", 1)[1])
        try:
            sync = ReplicaSync(cluster, None, root, base)
            w = {"x.weight": torch.ones(3), "y.weight": torch.zeros(2, 2)}
            sync.sync(w.items(), 1)
            b.state.url = None  # restarted in place: it forgot where weights come from
            sync.sync({k: 2 * v for k, v in w.items()}.items(), 2)
        finally:
            server.close()
        for fake in (a, b):
            assert fake.state.url == url and fake.state.version == "2"
            assert fake.state.fetched[-1] == f"{url}/versions/2/model.safetensors"
            assert set(fake.state.loaded) == set(w)
        assert sync.rollout_version == 2
    assert serve_weights(Cluster(tmp_path, "u", "http://svc:8000"), root) is None  # no pool
    with pytest.raises(ConfigError, match="names no port"):
        serve_weights(Cluster(tmp_path, "u", "http://svc:8000", weights_url="http://t"), root)


def test_sandbox_sessions_spread_over_the_executor_pods() -> None:
    pods = ["10.0.0.1", "10.0.0.2"]
    pool = HttpPoolFactory("http://run-sandbox:8090", resolve=lambda host, port: list(pods))
    picked = [str(pool._pick().client.base_url) for _ in range(4)]
    assert picked == ["http://10.0.0.1:8090", "http://10.0.0.2:8090"] * 2
    pods.append("10.0.0.3")  # a new pod joins: resolved again for the next session
    assert {str(pool._pick().client.base_url) for _ in range(3)} == {
        f"http://10.0.0.{i}:8090" for i in (1, 2, 3)
    }
    pool.close()


def test_worker_takes_its_log_level_from_the_run(tmp_path: Path, monkeypatch) -> None:
    """The log level is no variable of the (immutable) Job template: the worker reads it from the
    run's ConfigMap when it starts."""
    run = example("local", **{"observability.logLevel": "debug"})
    cfg = write_config(run, tmp_path / "config")
    monkeypatch.delenv("GAGAR_LOG_LEVEL", raising=False)
    monkeypatch.setenv("GAGAR_PERMANENT_MARKER", str(tmp_path / "permanent"))
    logger = logging.getLogger("gagar")
    before = logger.level
    try:
        assert worker.main([f"--config-dir={cfg}"]) == EXIT_PERMANENT  # no cluster env: stops
        assert logger.level == logging.DEBUG
    finally:
        logger.setLevel(before)
