"""`cloudtrain check --launch --recovery`: the recovery path proved on your own account, for
cents, before a long spot run depends on it.

`check --launch` proves one launch. This proves what a spot job does when EC2 takes its
instance back with nobody watching: a tiny spot job launched into its own Auto Scaling group
(the path every recovering spot job takes), its first checkpoint streamed to the job store,
then a real spot interruption sent through AWS Fault Injection Service (EC2's own rebalance
recommendation and two-minute notice in the instance's metadata, then the interruption), the
group's replacement booting from the job store on its own, resuming from the checkpoint and
ending the job; then everything is taken down (instances, group, launch template, the job's
role, the experiment template, the job store's objects) and the bill is shown. Each step is
timed and judged on one line, as `check --launch`'s are.

    run(region=None, say=None, confirm=None) -> Report    (launch_check's report and text)

The job counts one step a second and keeps the count as its checkpoint
($CLOUDTRAIN_CHECKPOINT_DIR/count, with checkpoint-info.json naming the step); started afresh it would count for ten minutes, resumed it
ends three steps later, printing the step it resumed from, so its log tells whether the
replacement resumed and from where.

What it needs beyond `check --launch`: the job store, an instance profile (a group relaunches
with it; `per-job` best), infra/iam-policy-autoscaling.json, and the role FIS acts with
(`fis_role:`, cloudtrain-fis: infra/README.md section 2b). A missing one stops it at the step
that needs it, naming what to attach.

This module holds the recovery flow's steps; launch_check runs them between its resources
and its teardown.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

from . import config, state
from .errors import CloudtrainError
from .launch_check import JOB_END_WAIT_S, ended_job, run as run_check, wait_for_job
from .launch_check_steps import Check, Flow, Report, Step, Steps
from .lifecycle import watch

SCRIPT = "check-recovery.sh"
FIRST_RUN_STEPS = 600  # started afresh: ten minutes; the interruption comes long before
RESUMED_STEPS = 3  # resumed: three more, then the end
MAX_RUNTIME_MINUTES = 20
RESTARTS = 1
# A real first boot of the DLAMI, the bundle and the agent, then the first checkpoint; and
# after the interruption, the group's replacement doing all of it again.
CHECKPOINT_WAIT_S = 900.0
INTERRUPTED_WAIT_S = 300.0  # FIS's two minutes' notice, EC2's termination, with room
REPLACEMENT_WAIT_S = 900.0
RESUMED = re.compile(rb"^resumed from step (\d+)$", re.M)

_BODY = """#!/bin/sh
# cloudtrain check --launch --recovery: one step a second, the count kept as the checkpoint;
# resumed from one, three steps more, then the end.
set -eu
dir="${CLOUDTRAIN_CHECKPOINT_DIR:?}"
mkdir -p "$dir"
n=0
if [ -f "$dir/count" ]; then n=$(cat "$dir/count"); fi
case "$n" in ''|*[!0-9]*) n=0 ;; esac
if [ "$n" -gt 0 ]; then
  echo "resumed from step $n"
  end=$((n + RESUMED))
else
  end=FIRST
fi
while [ "$n" -lt "$end" ]; do
  n=$((n + 1))
  echo "$n" > "$dir/count.tmp"
  printf '{"step": %s}\\n' "$n" > "$dir/checkpoint-info.json.tmp"
  mv "$dir/count.tmp" "$dir/count"
  mv "$dir/checkpoint-info.json.tmp" "$dir/checkpoint-info.json"
  echo "step $n"
  sleep 1
done
"""


def script(line: str) -> str:
    """The job's script; it ends by printing `line` (the check's own, a nonce)."""
    return (_BODY.replace("RESUMED", str(RESUMED_STEPS)).replace("FIRST", str(FIRST_RUN_STEPS))
            + f"echo '{line}'\n")


def run(region: str | None = None, say: Callable[[Step], None] | None = None,
        confirm: Callable[[str], None] | None = None) -> Report:
    return run_check(region=region, say=say, confirm=confirm, flow=Flow(
        name="recovery", spot=True, requires=_requires, job=_spec_args, steps=_steps,
        question=_question,
        leftovers=lambda c, job_id: c.provider.account.recovery_leftovers(c.region, job_id),
        left_words=", Auto Scaling group, launch template, job role or experiment template"))


def _requires(c: Check) -> str:
    """What the recovery path needs of the settings, checked before anything is made."""
    s = c.settings
    if not s.job_store:
        raise CloudtrainError("the recovery path needs the job store (job_store is false in "
                              "config.yaml)", hint="set job_store: true in config.yaml")
    if not s.instance_profile:
        raise CloudtrainError(
            "the recovery path needs an instance profile: AWS relaunches the job with it",
            hint="set instance_profile: per-job in config.yaml (infra/README.md section 2a)")
    return (f"job store on; instances run with {s.instance_profile}; FIS acts with role "
            f"{s.fis_role} (fis_role)")


def _question(c: Check, report: Report) -> str:
    return (f"This launches a spot {report.instance_type} in {c.region} in an Auto Scaling "
            f"group, has AWS FIS interrupt it, and lets the group's replacement finish the "
            f"job: two instances for a few minutes each, billed per second (60 s minimum) at "
            f"most ${report.price_per_hour:.4f}/h (the on-demand price; spot bills less); "
            f"each powers itself off after "
            f"{c.provider.power_off_minutes(MAX_RUNTIME_MINUTES * 60)} min at the latest.")


def _spec_args(c: Check) -> dict:
    """The job: the script, synced, run with sh; spot, recovered once by its group."""
    assert c.workdir is not None
    (Path(c.workdir) / SCRIPT).write_text(script(c.line))
    c.synced = SCRIPT
    return {"command": (f"sh {SCRIPT}",), "spot": True, "recover": True,
            "max_restarts": RESTARTS, "max_runtime": MAX_RUNTIME_MINUTES}


def _steps(c: Check, steps: Steps, job) -> state.Job:
    """After the launch: the group, the first checkpoint, the interruption, the
    replacement, the resumed end. Returns the job as it ended."""
    store = c.store
    with steps.step("auto scaling group") as s:
        job = store.job(job.id)
        if not job.facts.auto_scaling_group:
            notes = [e.detail for e in store.events(job.id) if e.phase == "recovery" and
                     e.detail]
            raise CloudtrainError(
                "the job was not launched into an Auto Scaling group" + (
                    f": {notes[-1]}" if notes else ""),
                hint="attach infra/iam-policy-autoscaling.json (infra/README.md section 2)")
        s.detail = (f"{job.facts.auto_scaling_group}: AWS relaunches the job without this "
                    "machine")
    with steps.step("first checkpoint") as s:
        plan = wait_for_job(
            lambda: _stepped(c.provider.checkpoint_plan(store, store.job(job.id), 60)),
            CHECKPOINT_WAIT_S, "the job's first checkpoint in the job store", c, job)
        first_step = plan["step"]
        s.detail = (f"step {first_step} streamed to s3://{c.bucket}/ (checkpoint "
                    f"{plan.get('seq')}, {len(plan.get('files') or [])} file(s))")
        s.data = {"step": first_step, "seq": plan.get("seq")}
    with steps.step("interruption") as s:
        instance = _running_instance(c, job)
        try:
            c.fis = c.provider.account.interrupt_spot(c.region, instance, job.id, c.owner)
        except CloudtrainError as exc:
            raise CloudtrainError(
                f"AWS FIS did not start the interruption: {exc.message}",
                hint=f"the role {c.settings.fis_role} (fis_role) must exist, trust "
                     "fis.amazonaws.com and allow ec2:SendSpotInstanceInterruptions "
                     "(infra/iam-role-fis-trust.json, infra/iam-policy-fis-role.json); you "
                     "need the fis: actions and iam:PassRole for it (infra/README.md section "
                     "2b)") from exc
        ended = wait_for_job(lambda: _ended(c, job, instance), INTERRUPTED_WAIT_S,
                      f"EC2 to interrupt {instance}", c, job)
        experiment = c.provider.account.interruption(c.region, c.fis[1])
        s.detail = (f"AWS FIS experiment {c.fis[1]} sent {instance} the rebalance "
                    f"recommendation and the two-minute notice; the instance ended "
                    f"({ended}); the experiment: {experiment['status']}")
        s.data = {"instance": instance, "experiment": c.fis[1], "ended": ended,
                  "experiment_state": experiment}
    with steps.step("replacement") as s:
        attempt = wait_for_job(lambda: _second_attempt(c, job), REPLACEMENT_WAIT_S,
                        "the group's replacement", c, job)
        s.detail = (f"attempt {attempt.n}: the group launched {attempt.instance_id or '?'}"
                    + (f" in {attempt.zone}" if getattr(attempt, "zone", None) else "")
                    + ", which started the job from the job store")
    with steps.step("resume") as s:
        job = wait_for_job(lambda: ended_job(c, job), JOB_END_WAIT_S, "the job's end", c, job)
        if job.state != state.SUCCEEDED:
            raise CloudtrainError(f"the replacement ran the job, and it {job.state}: "
                                  f"{job.reason or 'no reason given'}",
                                  hint=f"cloudtrain logs {job.id} shows its output")
        log = config.home() / "jobs" / job.id / "output.log"
        out = log.read_bytes() if log.exists() else b""
        found = RESUMED.findall(out)
        if not found or c.line.encode() not in out:
            raise CloudtrainError("the job ended, but its log does not show a resumed run "
                                  "that finished", hint=f"cloudtrain logs {job.id}")
        resumed = int(found[-1])
        if first_step is not None and resumed < int(first_step):
            raise CloudtrainError(f"the replacement resumed from step {resumed}, before the "
                                  f"checkpoint of step {first_step} the job store held")
        s.detail = (f"the replacement resumed from step {resumed} and ended the job "
                    f"succeeded ({len(store.attempts(job.id))} attempts)")
        s.data = {"resumed_from": resumed, "attempts": len(store.attempts(job.id))}
    return job


def _stepped(plan: dict | None) -> dict | None:
    """A stored checkpoint that names its step (a snapshot taken between the script's two
    renames has the count without checkpoint-info.json: the next one has both)."""
    return plan if plan and plan.get("step") is not None else None


def _running_instance(c: Check, job) -> str:
    states = c.provider.instance_states(c.store, c.store.job(job.id))
    running = sorted(i for i, s in states.items() if s.get("state") == "running")
    if not running:
        raise CloudtrainError(f"job {job.id} has no running instance to interrupt")
    return running[-1]


def _ended(c: Check, job, instance: str) -> str | None:
    got = c.provider.instance_states(c.store, c.store.job(job.id)).get(instance) or {}
    if got.get("state") in ("shutting-down", "terminated", "stopped"):
        return f"{got['state']}: {got.get('message') or got.get('reason') or 'no reason given'}"
    return None


def _second_attempt(c: Check, job):
    attempts = c.store.attempts(job.id)
    return next((a for a in attempts if a.n >= 2 and a.instance_id), None) if attempts \
        else None
