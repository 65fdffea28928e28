"""`cloudtrain supervisor`: the recovery supervisor's status, start, stop and hidden loop.

Imports the terminal helpers; the lifecycle's supervisor and recovery stages when a command
runs."""

from __future__ import annotations

import click

from .. import config, job_views
from .terminal import job_store


@click.group(name="supervisor")
def supervisor_group() -> None:
    """The recovery supervisor: relaunches interrupted spot jobs (started on demand).

    \b
    Examples:
      cloudtrain supervisor status
      cloudtrain supervisor stop
    """


@supervisor_group.command(name="status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def supervisor_status(as_json: bool) -> None:
    """Whether the supervisor runs, and what it watches."""
    from ..lifecycle import supervisor

    info = supervisor.state_of(config.home())
    with job_store() as store:
        needed = supervisor.needed(store)
    click.echo(job_views.supervisor_json(info) if as_json else
               job_views.supervisor_line(info, needed=needed))


@supervisor_group.command(name="start")
def supervisor_start() -> None:
    """Start it now (any command starts it when a recovering job needs it)."""
    from ..lifecycle import supervisor

    with job_store() as store:
        line = supervisor.ensure(store)
        needed = supervisor.needed(store)
    info = supervisor.state_of(config.home())
    click.echo(line or job_views.supervisor_line(info, needed=needed))


@supervisor_group.command(name="stop")
def supervisor_stop() -> None:
    """Stop it (the next command restarts it while recovering jobs need it)."""
    from ..lifecycle import supervisor

    click.echo("stopped" if supervisor.stop(config.home()) else "not running")


@supervisor_group.command(name="run", hidden=True)
@click.option("--home", type=click.Path(), required=True)
@click.option("--handover", type=click.Path(), default=None)
def supervisor_run(home: str, handover: str | None) -> None:
    """The supervisor's loop (started inside tmux by `start`)."""
    from pathlib import Path

    from ..lifecycle import recovery

    recovery.supervise(Path(home), Path(handover) if handover else None)
