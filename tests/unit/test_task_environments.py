"""Task environments in the spec and the rows: a source or a row names one of
``spec.sandbox.environments``, a name that is not there is refused in one line naming the field
(``gagar validate``, the trainer's setup), a source's environment reaches its rows (a row's own
wins), and the environment cache's key and relocation. Sessions in environments, their
read-only mount and the warm runner per environment: tests/integration/test_task_environments.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gagar.cli import main
from gagar.driver.components import SetupError, load_sources
from gagar.rollout.envs.task import Task, scan_tasks
from gagar.sandbox import venvs
from gagar.spec import DatasetSpec, GagarRunSpec, SandboxSpec

ENVS = [{"name": "web", "lock": "/locks/web.txt"}, {"name": "db", "lock": "/locks/db.txt"}]


def _row(instance_id: str, **extra: object) -> str:
    files = {"calc.py": "def f():\n    return 1\n", "test_calc.py": "def test_f():\n    pass\n"}
    row = {"instance_id": instance_id, "problem_statement": "p", "files": files}
    return json.dumps({**row, "FAIL_TO_PASS": ["test_calc.py::test_f"], **extra})


def _spec(sources: list[dict], envs: list[dict] = ENVS) -> dict:
    return {
        "model": {"preset": "tiny"},
        "rollout": {"replicas": 1},
        "sandbox": {"environments": envs},
        "dataset": {"sources": sources, "heldOutFraction": 0},
    }


def test_a_source_naming_an_unknown_environment_is_refused() -> None:
    GagarRunSpec.model_validate(_spec([{"kind": "synthetic", "environment": "web"}]))
    with pytest.raises(ValidationError, match=r"one of spec\.sandbox\.environments"):
        GagarRunSpec.model_validate(_spec([{"kind": "synthetic", "environment": "cache"}]))
    with pytest.raises(ValidationError, match=r"one of spec\.sandbox\.environments"):
        GagarRunSpec.model_validate(_spec([{"kind": "synthetic", "environment": "web"}], []))


def test_environments_are_unique_by_name_and_name_what_their_backend_uses() -> None:
    """A lock on backend local, an image on backend pods, each refused in the other backend (a
    field that would not act there), and no environment with agent-sandbox's one warm pool."""
    with pytest.raises(ValidationError, match=r"environments\[1\].name: web twice"):
        SandboxSpec.model_validate({"environments": [ENVS[0], ENVS[0]]})
    with pytest.raises(ValidationError, match="names its lock"):
        SandboxSpec.model_validate({"environments": [{"name": "web"}]})
    with pytest.raises(ValidationError, match=r"names its lock .* and no image"):
        SandboxSpec.model_validate({"environments": [{**ENVS[0], "image": "reg/web:1"}]})
    with pytest.raises(ValidationError, match=r"names its image .* and no lock"):
        SandboxSpec.model_validate({"backend": "pods", "environments": ENVS})
    image = [{"name": "web", "image": "reg/web:1"}]
    with pytest.raises(ValidationError, match="names its image"):
        SandboxSpec.model_validate({"backend": "pods", "environments": [{"name": "web"}]})
    SandboxSpec.model_validate({"backend": "pods", "environments": image})
    pool = {"backend": "pods", "isolation": "agent-sandbox", "environments": image}
    with pytest.raises(ValidationError, match="one SandboxWarmPool"):
        SandboxSpec.model_validate(pool)


def test_a_row_names_its_environment_and_an_unknown_one_is_one_line(tmp_path: Path) -> None:
    rows = tmp_path / "t.jsonl"
    rows.write_text("\n".join([_row("a", environment="web"), _row("b", environment="gpu")]))
    tasks, bad = scan_tasks(rows, None, ["web", "db"])
    assert [t.environment for t in tasks] == ["web"]
    assert bad == [
        f"{rows}:2 (b): environment: 'gpu' is not one of spec.sandbox.environments (db, web)"
    ]
    assert len(scan_tasks(rows)[0]) == 2  # no names given: not checked


def test_a_source_environment_reaches_its_rows_and_a_row_keeps_its_own(tmp_path: Path) -> None:
    rows = tmp_path / "t.jsonl"
    rows.write_text("\n".join([_row("a"), _row("b", environment="db")]))
    spec = DatasetSpec.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(rows), "environment": "web"}],
            "heldOutFraction": 0,
        }
    )
    [tasks], _ = load_sources(spec, ["web", "db"])
    assert {t.instance_id: t.environment for t in tasks} == {"a": "web", "b": "db"}
    with pytest.raises(SetupError, match=r"sources\[0\] \(b\): environment: 'db' is not one of"):
        load_sources(spec, ["web"])


def test_the_environment_is_part_of_what_makes_a_task_itself() -> None:
    plain = Task.model_validate(json.loads(_row("a")))
    assert plain.content_key() != plain.model_copy(update={"environment": "web"}).content_key()
    with pytest.raises(ValidationError, match="environment"):
        Task.model_validate(json.loads(_row("a", environment="Not A Name")))


def test_validate_names_the_field_of_an_unknown_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "t.jsonl"
    rows.write_text(_row("a", environment="gpu") + "\n")
    doc = {"apiVersion": "gagar.dev/v1alpha1", "kind": "GagarRun", "metadata": {"name": "envs"}}
    doc["spec"] = _spec([{"kind": "jsonl", "path": str(rows)}])
    manifest = tmp_path / "run.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(manifest)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith(
        f"spec.dataset.sources[0]: {rows}:1 (a): environment: 'gpu' is not one of "
        "spec.sandbox.environments (db, web)"
    )
    doc["spec"] = _spec([{"kind": "synthetic", "environment": "gpu"}])
    manifest.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(manifest)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "spec.dataset.sources" in line and "one of spec.sandbox.environments" in line


def test_the_cache_key_follows_the_lock_and_the_interpreter() -> None:
    python = venvs.interpreter()
    assert venvs.key(b"a==1", python) == venvs.key(b"a==1", python)
    assert venvs.key(b"a==1", python) != venvs.key(b"a==2", python)
    assert venvs.key(b"a==1", python) != venvs.key(b"a==1", python + "-other")
    assert Path(python).is_file() and Path(sys.base_prefix) in Path(python).parents


def test_a_lock_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(venvs.VenvError, match=r"lock .*absent\.txt"):
        venvs.ensure(tmp_path / "absent.txt", tmp_path / "cache")


def test_a_cache_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    lock, blocker = tmp_path / "lock.txt", tmp_path / "file"
    lock.write_text("pytest==8.0.0 --hash=sha256:00\n")
    blocker.write_text("not a folder")
    with pytest.raises(venvs.VenvError, match=r"cache .*file/envs: Not a directory"):
        venvs.ensure(lock, blocker / "envs")


def test_relocating_rewrites_the_scripts_that_name_the_build_directory(tmp_path: Path) -> None:
    tmp, dest = tmp_path / ".build-env-x-1", tmp_path / "env-x"
    (tmp / "bin").mkdir(parents=True)
    (tmp / "bin" / "pytest").write_text(f"#!{tmp}/bin/python\nimport sys\n")
    (tmp / "bin" / "python").symlink_to("/usr/bin/python3")
    (tmp / "pyvenv.cfg").write_text("home = /usr/bin\n")
    venvs._relocate(tmp, dest)
    assert (tmp / "bin" / "pytest").read_text().startswith(f"#!{dest}/bin/python\n")
    assert (tmp / "bin" / "python").is_symlink()


PIP_COMPILED = """# This file is autogenerated by pip-compile
--index-url https://pypi.org/simple

iniconfig==2.0.0 \\
    --hash=sha256:aaaa \\
    --hash=sha256:bbbb
    # via pytest
pytest==8.0.0 \\
    --hash=sha256:cccc
envonly==1.0  # pinned, but no hash
-e ./local
"""


def test_a_requirement_without_a_hash_is_named_by_its_line() -> None:
    assert venvs.unhashed(PIP_COMPILED) == [
        "line 10: envonly==1.0 has no --hash (pip --require-hashes)"
    ]
    assert venvs.unhashed(PIP_COMPILED.replace("envonly==1.0", "# envonly==1.0")) == []


def test_validate_checks_the_locks_it_can_read_and_notes_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "web.txt"
    lock.write_text(PIP_COMPILED)
    envs = [{"name": "web", "lock": str(lock)}, {"name": "db", "lock": str(tmp_path / "no.txt")}]
    doc = {"apiVersion": "gagar.dev/v1alpha1", "kind": "GagarRun", "metadata": {"name": "envs"}}
    doc["spec"] = _spec([{"kind": "synthetic", "environment": "web"}], envs)
    manifest = tmp_path / "run.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(manifest)]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"{manifest}[0]: spec.sandbox.environments[0].lock: {lock}: line 10: envonly==1.0 has "
        "no --hash (pip --require-hashes)"
    ]
    assert "spec.sandbox.environments[1].lock: not on this machine" in out
