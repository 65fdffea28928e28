"""cloudtrain/lifecycle/inspect.py: what the inspecting commands read of a job."""

from __future__ import annotations

from cloudtrain.lifecycle.inspect import recipe_target
from cloudtrain.state import Job


def _job(recipe, args) -> Job:
    return Job(id="a1b2c3d4", name=None, kind="recipe", recipe=recipe, command="",
               backend="local", state="running", created_at=0.0, started_at=None,
               ended_at=None, exit_code=None, reason=None, spec={"args": args}, host=None,
               jobdir=None, metrics=None, cost=None)


def test_a_variant_with_its_own_target_is_held_to_it():
    """imagenet's ffcv-rn50-* variants are held to FFCV's top-1 (recipe.yaml's
    target.per_variant), the others to DAWNBench's 93% top-5; a job without a recipe has
    none."""
    assert recipe_target(_job("imagenet", {"variant": "ffcv-rn50-32"})) == (0.766, "top1")
    assert recipe_target(_job("imagenet", {"variant": "dawn-1x8"})) == (0.93, "top5")
    assert recipe_target(_job("imagenet", {})) == (0.93, "top5")
    assert recipe_target(_job(None, {})) == (None, None)
