"""The recipe loader and argument validation (the bundled recipes must all load)."""

from __future__ import annotations

import pytest

from cloudtrain import recipes
from cloudtrain.errors import ConfigError, NotFound, UsageError


def test_every_bundled_recipe_loads_and_has_a_smoke_profile():
    loaded = recipes.load_all()
    assert "resnet9" in [r.name for r in loaded]
    for r in loaded:
        assert "smoke" in r.profiles, r.name
        assert r.published and all(p.get("source") for p in r.published), r.name
        r.resolve("smoke")  # the profile's values are valid arguments


def test_unknown_recipe():
    with pytest.raises(NotFound, match="unknown recipe 'nope'; known recipes: .*resnet9"):
        recipes.load("nope")


def _write(tmp_path, yaml_text, entry="train.py"):
    d = tmp_path / "r"
    d.mkdir(exist_ok=True)
    (d / "recipe.yaml").write_text(yaml_text)
    (d / entry).write_text("print(1)\n")
    return d / "recipe.yaml"


BASE = """name: r
description: d
entry: train.py
arguments:
  n: {type: int, default: 1}
  flag: {type: bool, default: false}
  opt: {type: str, default: null}
profiles:
  smoke: {description: s, set: {n: 2}}
"""


def test_resolution_order_and_rendering(tmp_path):
    r = recipes.parse_recipe(_write(tmp_path, BASE))
    assert r.resolve() == {"n": 1, "flag": False}
    assert r.resolve("smoke") == {"n": 2, "flag": False}
    values = r.resolve("smoke", ("n=5", "flag=on", "opt=x y"))
    assert values == {"n": 5, "flag": True, "opt": "x y"}
    assert r.script_args(values) == ["--n", "5", "--flag", "true", "--opt", "x y"]
    assert r.resolve(None, ("n = 3",)) == {"n": 3, "flag": False}


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.replace("name: r", "name: other"), "differs from its folder"),
    (lambda t: t.replace("entry: train.py", "entry: missing.py"), "entry 'missing.py' does not exist"),
    (lambda t: t.replace("{type: int, default: 1}", "{type: int, default: one}"), "must be an integer"),
    (lambda t: t.replace("set: {n: 2}", "set: {m: 2}"), "sets unknown argument 'm'"),
    (lambda t: t.replace("description: d\n", ""), "missing 'description'"),
    (lambda t: t + "  bad: [\n", "invalid YAML at line"),
])
def test_invalid_recipe_files(tmp_path, mutate, message):
    with pytest.raises(ConfigError, match=message):
        recipes.parse_recipe(_write(tmp_path, mutate(BASE)))


def test_bool_is_not_an_int(tmp_path):
    r = recipes.parse_recipe(_write(tmp_path, BASE))
    with pytest.raises(UsageError, match="must be an integer"):
        r.resolve(None, ("n=1.5",))
