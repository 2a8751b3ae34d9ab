"""The recipe of a mined dataset: pinned sdists (``name==version`` and sha256) and a seed.

``recipe.toml`` beside this module is the repository's dataset; ``gagar tasks build`` mines
every pin of a recipe into one folder (``make tasks``), so the repository holds the recipe, not
the sdists or the rows. Validated once, here: a pin without its sha256, a version range, a
package named twice or an unknown key is refused with one line naming the entry.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gagar.rollout.envs.mine.sdist import normalize
from gagar.rollout.envs.task import PLAIN_PYTEST

RECIPE = Path(__file__).with_name("recipe.toml")
# pytest options that choose among the tests: the miner lists tests itself, and verification
# plants its own tests, which a selection would leave out.
SELECTING = re.compile(r"^(-k|-m|--deselect|--lf|--last-failed|--co|--collect-only)")


class RecipeError(ValueError):
    """The recipe cannot be used: one line naming the entry and the field that is wrong."""


class Pin(BaseModel):
    """One package: a released sdist, pinned exactly and by its digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pin: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
    """``name==version``: one release, never a range."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The sdist's sha256 (lower-case hex): a different file under the same version is refused."""
    pytest_args: str = ""
    """Added to the test command (e.g. ``-o pythonpath=src`` for a ``src/`` layout)."""

    @field_validator("pytest_args")
    @classmethod
    def _no_selection(cls, value: str) -> str:
        if any(SELECTING.match(w) for w in shlex.split(value)):
            raise ValueError("must not select tests (-k, -m, --deselect, ...)")
        return value

    @property
    def name(self) -> str:
        return normalize(self.pin.split("==")[0])

    @property
    def test_command(self) -> str:
        return f"{PLAIN_PYTEST} {self.pytest_args}".strip()


class Recipe(BaseModel):
    """The dataset: its seed, the edits tried and the tasks kept per package, the packages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    max_edits: int = Field(default=100, ge=1)
    max_tasks: int | None = Field(default=None, ge=1)
    """Planted bugs kept per package at most (edits stop being tried then); None: no cap."""
    packages: list[Pin] = Field(min_length=1)

    @model_validator(mode="after")
    def _each_package_once(self) -> Recipe:
        names = [p.name for p in self.packages]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"packages named more than once: {', '.join(twice)}")
        return self


def load_recipe(path: Path = RECIPE) -> Recipe:
    """The recipe at ``path``, or a ``RecipeError`` naming the entry and field that is wrong."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RecipeError(f"{path}: {e}") from None
    try:
        return Recipe.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "recipe"
        entry = _entry(raw, err["loc"])
        raise RecipeError(f"{path}: {where}{entry}: {err['msg']}") from None


def _entry(raw: dict, loc: tuple) -> str:
    """`` (name==version)`` where the error is inside a package entry that has a pin."""
    if len(loc) >= 2 and loc[0] == "packages" and isinstance(loc[1], int):
        entries = raw.get("packages")
        if (
            isinstance(entries, list)
            and loc[1] < len(entries)
            and isinstance(entries[loc[1]], dict)
        ):
            pin = entries[loc[1]].get("pin")
            return f" ({pin})" if isinstance(pin, str) else ""
    return ""
