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


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.replace("  smoke: {description: s, set: {n: 2}}", "  - smoke"),
     "'profiles' must be a mapping of profile: settings"),
    (lambda t: t.replace("{description: s, set: {n: 2}}", "just words"),
     "profile 'smoke' must be a mapping"),
    (lambda t: t.replace("set: {n: 2}", "set: [n, 2]"), "must be a mapping of argument: value"),
    (lambda t: t + "requires: 5\n", "'requires' must be a list of module names, got 5"),
    (lambda t: t + "requires: [torch, 5]\n", "'requires' lists module names, got 5"),
    (lambda t: t.replace("{type: str, default: null}", "{type: choice, choices: 3}"),
     "choices must be a list of words or numbers, got 3"),
    (lambda t: t + "published: a string\n", "'published' must be a list of results"),
    (lambda t: t + "published: [a string]\n", "each entry of 'published' must be a mapping"),
    (lambda t: t + "published: [{seconds: abc}]\n", r"published\[0\].seconds must be a finite"),
    (lambda t: t + "resources: [1]\n", "'resources' must be a mapping"),
    (lambda t: t + "resources: {gpus_per_node: many}\n", "resources.gpus_per_node must be a finite"),
    (lambda t: t + "resources: {gpus_per_node: 1000}\n", "resources.gpus_per_node must be at most 64"),
    (lambda t: t + "resources: {max_runtime_minutes: .nan}\n",
     "resources.max_runtime_minutes must be a finite number"),
    (lambda t: t + "resources: {disk_gb: 1.5}\n", "resources.disk_gb must be at least 8"),
    (lambda t: t + "resources: {gpus_per_variant: {a: 0}}\n",
     r"resources.gpus_per_variant.a must be at least 1"),
    (lambda t: t + "resources: {nodes_per_variant: {a: 100}}\n",
     r"resources.nodes_per_variant.a must be at most 64"),
    (lambda t: t + "resources: {nodes_per_variant: [4]}\n",
     r"must be a mapping of variant: machines \(resources.nodes_per_variant\)"),
    (lambda t: t + "target: 0.94\n", "'target' must be a mapping"),
    (lambda t: t + "target: {metric: top5, value: 0.93, per_variant: {a: 0.7}}\n",
     r"target.per_variant maps a variant to its own target"),
    (lambda t: t + "target: {metric: top5, value: 0.93, per_variant: {a: {metric: top1, "
                   "value: x}}}\n", r"target.per_variant.a.value must be a finite number"),
    (lambda t: t + "data: {name: x}\n", "'data' must be a list of datasets"),
    (lambda t: t + "data: [{name: x, reads: {by: nope, folders: {}}}]\n",
     r"data\[0\]: reads.by must name an argument"),
    (lambda t: t + "data: [{name: x, reads: {by: n, folders: {1: [../up]}}}]\n",
     r"data\[0\]: reads.folders must map each value of n"),
    (lambda t: t + "data: [{name: x, reads: {by: n, folders: {}, more: 1}}]\n",
     r"data\[0\]: reads must be a mapping of by, folders, within and prepare"),
    (lambda t: t.replace("set: {n: 2}", "set: {n: 2}, resources: {gpus_per_node: 2}"),
     "profile 'smoke': resources may set disk_gb and max_runtime_minutes, not gpus_per_node"),
    (lambda t: t.replace("set: {n: 2}", "set: {n: 2}, resources: {disk_gb: 4}"),
     "profiles.smoke.resources.disk_gb must be at least 8"),
    (lambda t: t.replace("  n: {", "  'bad name': {"), "argument name 'bad name' must be a word"),
    (lambda t: t.replace("entry: train.py", "entry: ../../../../etc/hostname"),
     "entry '../../../../etc/hostname' is outside the recipe folder"),
    (lambda t: t.replace("entry: train.py", "entry: /etc/hostname"),
     "entry '/etc/hostname' is outside the recipe folder"),
])
def test_F23_recipe_shapes_are_checked(tmp_path, mutate, message):
    """Each of these was an AttributeError or TypeError (or, for `entry`, accepted)."""
    with pytest.raises(ConfigError, match=message):
        recipes.parse_recipe(_write(tmp_path, mutate(BASE)))


def test_F23_entry_symlink_out_of_the_folder_is_refused(tmp_path):
    path = _write(tmp_path, BASE.replace("entry: train.py", "entry: link.py"))
    outside = tmp_path / "outside.py"
    outside.write_text("print(1)\n")
    (path.parent / "link.py").symlink_to(outside)
    with pytest.raises(ConfigError, match="is outside the recipe folder"):
        recipes.parse_recipe(path)


NUMBERS = """name: r
description: d
entry: train.py
arguments:
  gpus: {type: int, default: 1}
  epochs: {type: float, default: 2}
  runs: {type: int, default: 1}
  lr: {type: float, default: 0.1}
  seed: {type: int, default: 0}
"""


@pytest.mark.parametrize("setting, message", [
    ("gpus=0", "gpus must be at least 1"),
    ("gpus=-1", "gpus must be at least 1"),
    ("gpus=100000", "gpus must be at most 64"),
    ("epochs=-5", "epochs must be more than 0"),
    ("epochs=0", "epochs must be more than 0"),
    ("epochs=nan", "epochs must be a finite number"),
    ("epochs=inf", "epochs must be a finite number"),
    ("epochs=1e30", "epochs must be at most 100000"),
    ("runs=-1", "runs must be at least 1"),
    ("lr=nan", "lr must be a finite number"),
    ("lr=-inf", "lr must be a finite number"),
    ("seed=" + "9" * 30, "seed must be an integer of at most 19 digits"),
])
def test_F25_recipe_numbers_are_range_checked(tmp_path, setting, message):
    r = recipes.parse_recipe(_write(tmp_path, NUMBERS))
    with pytest.raises(UsageError, match=message):
        r.resolve(None, (setting,))


def test_F25_recipe_number_defaults_are_checked_too(tmp_path):
    with pytest.raises(ConfigError, match="gpus must be at least 1"):
        recipes.parse_recipe(_write(tmp_path, NUMBERS.replace("default: 1}", "default: 0}", 1)))


def test_F23_one_broken_recipe_does_not_hide_the_others(tmp_path, monkeypatch):
    good = _write(tmp_path, BASE)
    bad = tmp_path / "broken" / "recipe.yaml"
    bad.parent.mkdir()
    bad.write_text("name: broken\ndescription: d\nentry: train.py\narguments: {}\nprofiles: [x]\n")
    (bad.parent / "train.py").write_text("")
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(tmp_path))
    found, broken = recipes.survey()
    assert "r" in [r.name for r in found] and "resnet9" in [r.name for r in found]
    assert [e.message for e in broken] == [f"{bad}: 'profiles' must be a mapping of profile: "
                                           "settings, got ['x']"]
    assert good.exists()


def test_u58_a_profile_is_planned_with_its_own_disk_and_runtime(tmp_path):
    """U58: the imagenet smoke profile (seconds on generated images) was planned with the
    full run's 400 GB disk and 360-minute max runtime. A profile's `resources:` are its own;
    without them a profile plans as the recipe does."""
    r = recipes.parse_recipe(_write(tmp_path, BASE.replace(
        "set: {n: 2}", "set: {n: 2}, resources: {disk_gb: 30, max_runtime_minutes: 15}")
        + "resources: {gpus_per_node: 1, disk_gb: 400, max_runtime_minutes: 360}\n"))
    assert r.resources_for("smoke") == {"gpus_per_node": 1, "disk_gb": 30,
                                        "max_runtime_minutes": 15}
    assert r.resources_for(None) == r.resources == {"gpus_per_node": 1, "disk_gb": 400,
                                                    "max_runtime_minutes": 360}
    imagenet = recipes.load("imagenet")
    assert imagenet.resources["disk_gb"] == 400
    smoke = imagenet.resources_for("smoke")
    assert (smoke["disk_gb"], smoke["max_runtime_minutes"]) == (100, 20)
    for rec in recipes.load_all():  # every smoke run plans for minutes, not the full run
        assert rec.resources_for("smoke")["max_runtime_minutes"] <= 20, rec.name
