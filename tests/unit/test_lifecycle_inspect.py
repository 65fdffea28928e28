"""cloudtrain/lifecycle/inspect.py: what the inspecting commands read of a job."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from cloudtrain import config, state
from cloudtrain.lifecycle.inspect import detail, recipe_target
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


@pytest.mark.parametrize("phase", [state.SYNCING, state.SETTING_UP, state.RECOVERING])
def test_F13_a_status_during_a_launch_writes_nothing_on_its_host(ct_home, phase):
    """F13: `status <id>` while a launcher (or a relaunch) is still copying and setting up
    the job's directory must only read: probing it then found no status.json and no agent,
    wrote "the agent never started" into the directory, and the agent started a moment later
    into a job already failed (the e2e termination-without-notice run ended that way under
    load)."""
    settings = config.Settings.load()
    with state.open_store(config.home()) as store:
        job = store.create_job(name=None, kind="command", recipe=None, command="true",
                               backend="local", spec={},
                               launcher=f"{socket.gethostname()}:{os.getpid()}")
        jobdir = ct_home / "jobs" / job.id
        (jobdir / "work").mkdir(parents=True)
        store.update_job(job.id, jobdir=str(jobdir), host={"kind": "LocalHost"},
                         lease_until=time.time() + 60)
        store.set_state(job.id, state.SYNCING)
        if phase != state.SYNCING:
            store.set_state(job.id, phase)
        seen = detail(store, settings, job.id)
        assert not (jobdir / "status.json").exists()
        assert seen.job.state == phase and store.job(job.id).state == phase
        # Once the job runs there, the same call reads (and reaps) what is on the host.
        store.update_job(job.id, lease_until=None)
        store.set_state(job.id, state.RUNNING)
        assert detail(store, settings, job.id).job.state == state.FAILED
        assert json.loads((jobdir / "status.json").read_text())["reason"] == \
            "the agent never started"
