"""The recipe of the mined dataset: the repository's loads and pins every package exactly and by
its digest; a recipe that does not is refused in one line naming the entry, by the loader and by
``gagar tasks build``; ``make tasks`` builds from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gagar.cli import main
from gagar.rollout.envs.mine.recipe import RECIPE, RecipeError, load_recipe
from gagar.rollout.envs.task import PLAIN_PYTEST

ROOT = Path(__file__).resolve().parents[2]
GOOD = """seed = 3
max_edits = 20

[[packages]]
pin = "parse==1.20.2"
sha256 = "{sha}"

[[packages]]
pin = "semver==3.0.4"
sha256 = "{sha}"
pytest_args = "-o pythonpath=src"
"""
SHA = "ab" * 32


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path


def test_the_repository_recipe_pins_six_packages_or_more_by_digest() -> None:
    recipe = load_recipe()
    assert recipe == load_recipe(RECIPE)
    assert len(recipe.packages) >= 6
    for pin in recipe.packages:
        assert re.fullmatch(r"[a-z0-9-]+==[0-9][0-9a-z.]*", pin.pin.lower()), pin
        assert re.fullmatch(r"[0-9a-f]{64}", pin.sha256), pin
        assert pin.test_command.startswith(PLAIN_PYTEST)
    assert len({p.name for p in recipe.packages}) == len(recipe.packages)


def test_a_recipe_is_read_as_written(tmp_path: Path) -> None:
    recipe = load_recipe(_write(tmp_path, GOOD.format(sha=SHA)))
    assert (recipe.seed, recipe.max_edits, recipe.max_tasks) == (3, 20, None)
    capped = load_recipe(_write(tmp_path, "max_tasks = 7\n" + GOOD.format(sha=SHA)))
    assert capped.max_tasks == 7
    assert load_recipe().max_tasks  # the repository's recipe caps the tasks per package
    assert [p.name for p in recipe.packages] == ["parse", "semver"]
    assert recipe.packages[1].test_command == f"{PLAIN_PYTEST} -o pythonpath=src"
    assert recipe.packages[0].test_command == PLAIN_PYTEST


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (GOOD.format(sha=SHA).replace(f'sha256 = "{SHA}"\npytest', "pytest"), "packages.1.sha256"),
        (GOOD.format(sha="AB" * 32), "packages.0.sha256 (parse==1.20.2)"),
        (GOOD.format(sha="ab" * 31), "packages.0.sha256 (parse==1.20.2)"),
        (GOOD.format(sha=SHA).replace("==1.20.2", ">=1.20"), "packages.0.pin (parse>=1.20)"),
        (GOOD.format(sha=SHA).replace("semver==3.0.4", "Parse==1.20.1"), "more than once: parse"),
        (GOOD.format(sha=SHA).replace("pythonpath=src", "x -k slow"), "packages.1.pytest_args"),
        (GOOD.format(sha=SHA).replace("seed = 3", "sed = 3"), "sed"),
        ("seed = 1\n", "packages"),
        ("[[packages]\n", "recipe.toml"),
    ],
)
def test_a_recipe_that_does_not_pin_is_refused_in_one_line(
    tmp_path: Path, text: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(RecipeError, match=re.escape(said)) as err:
        load_recipe(path)
    assert "\n" not in str(err.value)
    assert main(["tasks", "build", str(path), "--out", str(tmp_path / "out")]) == 2
    printed = capsys.readouterr().err
    assert said in printed and printed.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_build_refuses_a_package_not_in_the_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, GOOD.format(sha=SHA))
    argv = ["tasks", "build", str(path), "--out", str(tmp_path / "out"), "--only", "toolz"]
    assert main(argv) == 2
    assert "not in the recipe: toolz" in capsys.readouterr().err


def test_make_tasks_builds_from_the_repository_recipe() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^tasks:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None, "no `tasks` target"
    assert "gagar tasks build" in recipe.group(1)
    assert "--jobs $(TASKS_JOBS)" in recipe.group(1)  # packages mined in parallel
