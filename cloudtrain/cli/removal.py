"""Commands that stop and remove: down, rm, prune.

Imports the terminal helpers and the shared options of this package; history and the
lifecycle's stop stage when a command runs."""

from __future__ import annotations

import shlex
import sys

import click

from .. import completion, errors, job_views
from .options import grace
from .terminal import can_ask, job_store, nobody_to_ask, settings_whatever_config_says


@click.command()
@click.argument("jobs_", metavar="JOB...", nargs=-1, shell_complete=completion.jobs)
@click.option("--all", "every", is_flag=True, help="Stop every active job.")
@click.option("--grace", type=float, default=None, metavar="SECONDS", callback=grace,
              help="Time between SIGTERM and SIGKILL (default from config, 30 s).")
@click.option("--yes", "-y", is_flag=True, help="--all: do not ask first (needed without a "
              "terminal to ask).")
@click.option("--wide", is_flag=True, help="Name every region the cloud was checked in "
              "(default: how many).")
def down(jobs_: tuple[str, ...], every: bool, grace: float | None, yes: bool,
         wide: bool) -> None:
    """Stop jobs: SIGTERM to the job, SIGKILL after a grace period; release their hosts.
    --all stops every active job, terminates instances tagged as ours that no job here
    holds (in every region), and removes the unused security group and key pair; in a
    terminal it lists the jobs and asks first (without one it needs -y).

    \b
    Examples:
      cloudtrain down 3f2a1b9c
      cloudtrain down --all --yes
      cloudtrain down 3f2a1b9c --grace 120
    """
    from ..lifecycle import stop

    if every and not jobs_ and not yes and not can_ask():
        raise nobody_to_ask("down --all stops every job and terminates every instance tagged "
                             "as yours that no job here holds", "cloudtrain down --all -y")
    settings = settings_whatever_config_says()
    with job_store() as store:
        if every and not jobs_ and not yes:
            targets = stop.down_targets(store)
            if targets:  # it destroys: the default answer is no
                click.echo(f"down --all stops these {len(targets)} job(s) and terminates "
                           f"their instances:", err=True)
                click.echo(job_views.status_table(targets), err=True)
                if not click.confirm("Proceed?", default=False, err=True):
                    click.echo("nothing stopped", err=True)
                    raise SystemExit(errors.EXIT_FAILED)
        outcomes = stop.cancel(store, settings, jobs_, every, grace,
                               say=lambda line: click.echo(line, err=True))
    click.echo(job_views.stop_outcomes(outcomes, listed=wide))
    if any(not o.ok for o in outcomes):  # something may still be running: say so in the code
        raise SystemExit(errors.EXIT_FAILED)


def remove_jobs(plan_of, dry_run: bool, yes: bool, command: str) -> None:
    """rm and prune: say what goes and what stays (and why), ask in a terminal (without one,
    -y is needed), remove."""
    from .. import history

    with job_store() as store:
        plan = plan_of(store)
        click.echo(job_views.removal_plan(plan), err=True)
        if dry_run or not plan.removals:
            sys.exit(errors.EXIT_FAILED if plan.refused else 0)
        if not yes and not can_ask():
            raise nobody_to_ask(f"{command.split()[0]} removes {len(plan.removals)} finished "
                                 "job(s)", f"cloudtrain {command} -y")
        if not yes and not click.confirm("Remove them?", default=False, err=True):
            raise errors.CloudtrainError("nothing removed", exit_code=errors.EXIT_FAILED)
        summary = history.remove(store, plan)
        click.echo(job_views.removal_summary(summary))
        if summary.refused or plan.refused:
            sys.exit(errors.EXIT_FAILED)


@click.command()
@click.argument("refs", metavar="JOB...", nargs=-1, required=True,
                shell_complete=completion.jobs)
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask first (needed without a terminal "
              "to ask).")
def rm(refs: tuple[str, ...], dry_run: bool, yes: bool) -> None:
    """Remove finished jobs: their records and $CLOUDTRAIN_HOME/jobs/<id>/. A job not
    finished, or whose instance may still bill, is kept (stop it: cloudtrain down JOB).

    \b
    Examples:
      cloudtrain rm 3f2a1b9c exp-2 --dry-run
      cloudtrain rm 3f2a -y
    """
    from .. import history

    remove_jobs(lambda store: history.plan_removal(store, refs), dry_run, yes,
            "rm " + shlex.join(refs))


@click.command()
@click.option("--older-than", metavar="AGE|DATE", required=True, help="Jobs that finished "
              "before then: 90min, 30d, 2w, 6mo, or a date (2026-01-01); not 6m (minutes or "
              "months?).")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask first (needed without a terminal "
              "to ask).")
def prune(older_than: str, dry_run: bool, yes: bool) -> None:
    """Remove the finished jobs that ended before --older-than: their records and files.
    Jobs not finished, and jobs whose instance may still bill, are never touched.

    \b
    Examples:
      cloudtrain prune --older-than 30d --dry-run
      cloudtrain prune --older-than 2026-01-01 -y
    """
    from .. import history

    remove_jobs(lambda store: history.plan_removal(store, older_than=older_than), dry_run, yes,
            "prune --older-than " + shlex.quote(older_than))
