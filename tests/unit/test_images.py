"""Container recipes: every Dockerfile parses strictly, and every image gagar refers to has one.

No Docker engine here, so the Dockerfiles are parsed (``dockerfile-parse``) and checked for what
makes them buildable and safe: known instructions only, JSON-form ENTRYPOINT/CMD, COPY sources
that exist in the build context (the repository root), gagar installed with the right extra, and a
non-root numeric USER in the final stage.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from gagar import __version__
from gagar.chart_values import OPERATOR_IMAGE
from gagar.spec import GraderSpec, RolloutSpec, SandboxSpec, TrainerSpec

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
REGISTRY = "ghcr.io/gagar-dev/"
IMAGE_REF = re.compile(r"ghcr\.io/gagar-dev/gagar-([a-z0-9-]+)(?::([\w.-]+))?")
INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "COMMENT",
}  # fmt: skip
# what `pip install` each image runs: the extra that matches its workload
EXPECTED_INSTALL = {
    "operator": '".[operator]"',
    "trainer": '".[train,trackers]"',  # spec.observability.trackers run in the trainer
    "rollout": ".",  # vLLM comes with the base image, pinned by it
    "grader": ".",
    "sandbox": ".",
}
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))


def parse(path: Path) -> list[dict]:
    return DockerfileParser(str(path)).structure


def final_stage(structure: list[dict]) -> list[dict]:
    starts = [i for i, ins in enumerate(structure) if ins["instruction"] == "FROM"]
    return structure[starts[-1] :]


def test_every_component_has_a_recipe() -> None:
    assert {p.parent.name for p in DOCKERFILES} == set(EXPECTED_INSTALL)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_parses_strictly(path: Path) -> None:
    structure = parse(path)
    instructions = [ins["instruction"] for ins in structure]
    assert set(instructions) <= INSTRUCTIONS, set(instructions) - INSTRUCTIONS
    real = [i for i in instructions if i != "COMMENT"]
    assert real[0] in ("ARG", "FROM") and "FROM" in real
    assert real.index("FROM") == next(i for i, x in enumerate(real) if x != "ARG")
    for ins in structure:
        if ins["instruction"] in ("ENTRYPOINT", "CMD"):
            assert isinstance(json.loads(ins["value"]), list), "exec (JSON) form only"
        assert not ins["value"].rstrip().endswith("\\"), f"dangling continuation: {ins['content']}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_copy_sources_exist_in_the_context(path: Path) -> None:
    ignore = (path.parent / "Dockerfile.dockerignore").read_text().splitlines()
    sent = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for ins in parse(path):
        if ins["instruction"] not in ("COPY", "ADD") or "--from=" in ins["value"]:
            continue
        *sources, _dest = ins["value"].split()
        for src in sources:
            assert (ROOT / src).exists(), f"{path}: COPY {src} is not in the repository"
            assert src.rstrip("/") in sent, f"{path}: {src} is excluded by its .dockerignore"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_installs_gagar_with_its_extra(path: Path) -> None:
    runs = " ".join(ins["value"] for ins in parse(path) if ins["instruction"] == "RUN")
    installs = re.findall(r"pip install (?:--no-cache-dir )?(?:-c \S+ )?(\S+)", runs)
    assert EXPECTED_INSTALL[path.parent.name] in installs, installs


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_final_stage_runs_as_non_root(path: Path) -> None:
    users = [ins["value"] for ins in final_stage(parse(path)) if ins["instruction"] == "USER"]
    assert users, "the final stage must set USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric non-root uid (runAsNonRoot needs a number)"
    assert not gid or (gid.isdigit() and int(gid) != 0)


def referenced_images() -> set[str]:
    """Every gagar image reference: spec defaults, chart values, manifests, examples, docs, code."""
    refs = {
        TrainerSpec().image,
        RolloutSpec(replicas=1).image,
        GraderSpec(replicas=1).image,
        SandboxSpec().image,
        f"{OPERATOR_IMAGE}:{yaml.safe_load((ROOT / 'charts/gagar/Chart.yaml').read_text())['appVersion']}",
    }
    for folder in ("gagar", "charts", "manifests", "examples", "docs", "tests"):
        refs |= scan(ROOT / folder)
    return refs


def scan(folder: Path) -> set[str]:
    refs = set()
    for path in folder.rglob("*"):
        if path.suffix in (".py", ".yaml", ".yml", ".md", ".json", ".tpl") and path.is_file():
            refs |= {m.group(0) for m in IMAGE_REF.finditer(path.read_text())}
    return refs


def missing_recipes(refs: set[str]) -> list[str]:
    return sorted(
        r for r in refs if not (IMAGES / IMAGE_REF.match(r).group(1) / "Dockerfile").exists()
    )


def test_every_referenced_image_has_a_recipe() -> None:
    refs = referenced_images()
    assert len({IMAGE_REF.match(r).group(1) for r in refs}) >= 5
    assert missing_recipes(refs) == []
    for ref in refs:
        tag = IMAGE_REF.match(ref).group(2)
        if tag and tag != "dev":
            assert tag == __version__, f"{ref}: tag should be the package version {__version__}"


def test_reference_scan_finds_unknown_images(tmp_path: Path) -> None:
    (tmp_path / "values.yaml").write_text("image: " + REGISTRY + "gagar-nonexistent:0.1.0\n")
    (tmp_path / "builder.py").write_text(f'IMAGE = "{TrainerSpec().image}"\n')
    refs = scan(tmp_path)
    assert len(refs) == 2
    assert missing_recipes(refs) == [REGISTRY + "gagar-nonexistent:0.1.0"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned(path: Path) -> None:
    parents = DockerfileParser(str(path)).parent_images
    assert parents
    for image in parents:
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "$" not in image, (
            f"{path}: unpinned base {image}"
        )


def test_trainer_is_cuda_and_rollout_is_vllm() -> None:
    assert (
        DockerfileParser(str(IMAGES / "trainer/Dockerfile"))
        .parent_images[-1]
        .startswith("nvidia/cuda:")
    )
    assert (
        DockerfileParser(str(IMAGES / "rollout/Dockerfile"))
        .parent_images[-1]
        .startswith("vllm/vllm-openai:")
    )
