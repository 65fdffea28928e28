"""The recipe catalogue (cloudtrain/recipes.py) through the `recipes` command: what a
recipe.yaml may say is listed as it says it (F23: published results given as numbers)."""

from __future__ import annotations


def test_F23_published_results_given_as_numbers_are_listed(cli, tmp_path, monkeypatch):
    root = tmp_path / "recipes" / "numbers"
    root.mkdir(parents=True)
    (root / "train.py").write_text("print('x')\n")
    (root / "recipe.yaml").write_text(
        "name: numbers\ndescription: d\nentry: train.py\narguments: {}\n"
        "published: [{result: 1, time: 2, hardware: 3}]\n")
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(tmp_path / "recipes"))
    proc = cli.ok("recipes")
    assert "numbers" in proc.stdout and "1 / 2 / 3" in proc.stdout
