"""Commands that read jobs: status, logs, attach, ssh, forward, metrics, plot, ui.

Imports the terminal helpers and the shared options of this package; history, curves and the
lifecycle's inspect, watch and stop stages when a command runs."""

from __future__ import annotations

import os
import sys

import click

from .. import completion, config, errors, job_views
from .options import CONTEXT, NODE, WIDE
from .terminal import (colored, echo_bytes, follow_job, job_store, output_screen,
                       rows_that_fit, settings_whatever_config_says, table_width, watch_view)


@click.command()
@click.argument("job", required=False, shell_complete=completion.jobs)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every job the "
              "filters match, as -a).")
@click.option("--all", "-a", "all_", is_flag=True, help="Every job the filters match (default: "
              "jobs not finished, and at most 20 that finished in the last 7 days).")
@click.option("--state", "states", multiple=True, metavar="STATE",
              shell_complete=completion.states, help="Only jobs in this "
              "state (repeatable, or a,b): pending, running, succeeded, failed, cancelled, ...")
@click.option("--recipe", "recipes_", multiple=True, metavar="NAME",
              shell_complete=completion.recipes,
              help="Only jobs of this recipe (repeatable, or a,b).")
@click.option("--name", metavar="PATTERN", help="Only jobs of this name, or whose name this "
              "shell glob matches ('exp-*').")
@click.option("--since", metavar="AGE|DATE", help="Only jobs created since: 2h, 3d, 2w, or a "
              "date (2026-11-01).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Show at most this many jobs.")
@click.option("--refresh", is_flag=True, help="Also ask the cloud for every instance tagged as "
              "ours (one call per region) and show any the local store does not know.")
@WIDE
@click.option("--watch", "-w", is_flag=True, help="Keep the view up to date (Ctrl-C to stop); "
              "piped, the table is printed again every interval.")
@click.option("--interval", type=click.FloatRange(min=0.1, max=3600), default=2.0,
              show_default=True, metavar="SECONDS", help="With --watch: seconds between updates.")
def status(job: str | None, as_json: bool, all_: bool, states: tuple[str, ...],
           recipes_: tuple[str, ...], name: str | None, since: str | None, limit: int | None,
           refresh: bool, wide: bool, watch: bool, interval: float) -> None:
    """Show active and recent jobs (-a: all), or one job in detail with its timeline.

    \b
    Examples:
      cloudtrain status
      cloudtrain status -a --state failed --since 3d
      cloudtrain status --name 'exp-*' --recipe resnet9
      cloudtrain status 3f2a1b9c --json
      cloudtrain status --refresh
      cloudtrain status --watch --interval 5
    """
    from .. import history

    if watch and as_json:
        raise errors.UsageError("--watch redraws the table; --json prints once",
                                hint="drop one of them")
    filters = history.parse_filters(states, recipes_, name, since)
    if job is not None and (filters.any() or all_ or limit):
        raise errors.UsageError("-a, --state, --recipe, --name, --since and --limit choose "
                                "jobs for the list, not for one job's detail",
                                hint=f"cloudtrain status {job}")
    settings = settings_whatever_config_says()
    with job_store() as store:
        if refresh:
            from ..lifecycle import stop

            swept = stop.reconcile(store)
            text = job_views.cloud_instances(swept.found, width=table_width(wide), sweep=swept,
                                             listed=wide)
            if not as_json:
                click.echo(text)
            elif swept.unchecked:  # the JSON is the jobs; what was not checked goes to stderr
                click.echo("\n".join(l for l in text.splitlines() if "could not check" in l),
                           err=True)

        def view() -> str:
            from ..lifecycle import kept

            if job is not None:  # `status ''` is refused as `logs ''` is
                from ..lifecycle import inspect

                d = inspect.detail(store, settings, job)
                held = kept.survey(store, settings)  # a kept instance bills on
                if as_json:
                    return job_views.detail_json(d.job, d.phases, d.log_tail, d.target, d.runs,
                                              d.attempts, d.recovery, kept=held)
                return job_views.job_detail(d.job, d.phases, d.log_tail, d.target, runs=d.runs,
                                         attempts=d.attempts, recovery=d.recovery,
                                         width=table_width(wide), trend=d.trend,
                                         startup=d.startup, kept=held)
            active = store.jobs(active_only=True)
            if active:  # finished jobs need no refresh (nor the import of what does it)
                from ..lifecycle.watch import refresh_active

                refresh_active(store, settings, active)
            held = kept.survey(store, settings)  # kept instances, their queues
            # --json is for scripts: every job the filters match, as before issue 16
            shown, hidden = history.select(store, filters, all_=all_ or as_json,
                                           limit=rows_that_fit(limit) if watch else limit)
            if as_json:
                return job_views.jobs_json(shown, kept=held)
            if shown:
                text = job_views.status_table(shown, width=table_width(wide), color=colored(),
                                              kept=held)
                note = history.footer(hidden, filters, all_=all_)
                text += "\n" + note if note else ""
            else:  # what matched nothing, and how many jobs there are (no footer again)
                text = "\n".join([history.empty_view(store, filters)]
                                  + job_views.kept_lines(held, width=table_width(wide)))
            if active:
                from ..lifecycle import supervisor

                if supervisor.needed(store):
                    text += "\n" + job_views.supervisor_line(supervisor.state_of(config.home()))
            return text

        if watch:
            watch_view(view, interval)
        else:
            click.echo(view())
        if refresh and swept.unchecked:  # not every region could be asked: not all clear
            raise SystemExit(errors.EXIT_FAILED)


@click.command()
@click.argument("job", shell_complete=completion.jobs)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option("--tail", "-n", type=click.IntRange(min=0), default=None,
              help="Only the last N lines (then follow from there with -f).")
@click.option("--raw", is_flag=True, help="The output's bytes as they are, escape sequences "
              "included (on a terminal they are dropped, colours kept; piped, they are kept).")
@NODE
def logs(job: str, follow: bool, tail: int | None, raw: bool, node: int) -> None:
    """Print a job's output (node 0's for a job on several machines: rank 0's). With
    --follow, exit with the job's outcome (1: it did not succeed), as `launch --follow`
    does.

    \b
    Examples:
      cloudtrain logs 3f2a1b9c --tail 20
      cloudtrain logs 3f2a1b9c --follow
      cloudtrain logs 3f2a1b9c --node 2
      cloudtrain logs 3f2a1b9c --raw > output.log
    """
    from ..lifecycle import inspect

    settings = settings_whatever_config_says()
    screen = output_screen(raw)
    with job_store() as store:
        record = inspect.for_logs(store, settings, job)
        offset = 0
        if tail is not None:
            data, offset = inspect.tail_log(record, tail, node)
            echo_bytes(data, screen, last=not follow)
        elif not follow:
            echo_bytes(inspect.read_log(record, node=node), screen, last=True)
        if follow:
            follow_job(store, settings, record, offset, node, screen)


@click.command()
@click.argument("job", shell_complete=completion.jobs)
@NODE
def attach(job: str, node: int) -> None:
    """Attach to a running job's tmux session (detach with Ctrl-b d); after the job, on its
    kept instance (--keep), to a tmux session there of its own.

    \b
    Example:
      cloudtrain attach 3f2a1b9c
    """
    from ..lifecycle import inspect

    settings = config.Settings.load()
    terminal = sys.stdin.isatty() and sys.stdout.isatty()
    with job_store() as store:
        reach = inspect.attach_argv(store, settings, store.find_job(job), terminal, node)
    if reach.kept is not None:  # its job has ended, the instance bills on
        click.echo(job_views.kept_note(reach.kept), err=True)
    os.execvp(reach.argv[0], reach.argv)


@click.command(context_settings=CONTEXT)
@click.argument("job", shell_complete=completion.jobs)
@NODE
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(job: str, node: int, command: tuple[str, ...]) -> None:
    """Open a shell on a job's instance (with its pinned host key), or run one command there
    (after --; its exit code is ssh's). A kept instance (--keep) is reached after its job
    ended, until it powers itself off or `cloudtrain down JOB`.

    \b
    Examples:
      cloudtrain ssh 3f2a1b9c
      cloudtrain ssh 3f2a1b9c --node 1
      cloudtrain ssh 3f2a1b9c -- nvidia-smi
      cloudtrain ssh 3f2a1b9c -- 'du -sh ~/.cloudtrain/jobs/*'
    """
    from ..lifecycle import inspect

    settings = config.Settings.load()
    with job_store() as store:
        reach = inspect.ssh_argv(store, settings, store.find_job(job), node, command,
                                 tty=sys.stdin.isatty())
    if reach.kept is not None:  # its job has ended, the instance bills on
        click.echo(job_views.kept_note(reach.kept), err=True)
    os.execvp(reach.argv[0], reach.argv)


@click.command()
@click.argument("job", shell_complete=completion.jobs)
@click.argument("ports", metavar="PORT[:LOCAL]...", nargs=-1, required=True)
def forward(job: str, ports: tuple[str, ...]) -> None:
    """Open ports of a job's instance on this machine (localhost only), over the job's SSH
    connection with its pinned host key, until Ctrl-C: TensorBoard, Jupyter, a dashboard.
    PORT is the port on the instance; LOCAL, the one here (default: the same).

    \b
    Examples:
      cloudtrain forward 3f2a1b9c 6006        TensorBoard: http://localhost:6006
      cloudtrain forward 3f2a1b9c 8888:18888  Jupyter: http://localhost:18888
    """
    import threading

    from .. import port_forward
    from ..lifecycle import inspect

    wanted = [port_forward.parse(p) for p in ports]
    settings = config.Settings.load()
    with job_store() as store:
        forwarder, where, held = inspect.forward(store, settings, store.find_job(job), wanted)
    if held is not None:
        click.echo(job_views.kept_note(held), err=True)
    for f in forwarder.forwards:
        click.echo(f"forwarding http://localhost:{f.local} to port {f.remote} on {where}")
    click.echo("Ctrl-C stops", err=True)
    stop = threading.Event()
    try:
        forwarder.serve(stop)
    except KeyboardInterrupt:  # the way to stop it: not an interruption of something half done
        stop.set()
        click.echo("stopped forwarding", err=True)


@click.command()
@click.argument("refs", metavar="JOB...", nargs=-1, required=True,
                shell_complete=completion.jobs)
@click.option("--csv", "as_csv", is_flag=True, help="Comma-separated rows, a job column first.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@WIDE
def metrics(refs: tuple[str, ...], as_csv: bool, as_json: bool, wide: bool) -> None:
    """Each job's metrics.jsonl as a per-epoch table (a running job's, read from its host).

    \b
    Examples:
      cloudtrain metrics 3f2a1b9c
      cloudtrain metrics 3f2a 19a3 --csv > curves.csv
    """
    from .. import curves

    if as_csv and as_json:
        raise errors.UsageError("give --csv or --json, not both")
    data = [curves.read_job(j.id, j.name, path, started_at=j.started_at, finished=not j.active)
            for j, path, _ in metric_jobs(refs)]
    click.echo(curves.to_csv(data) if as_csv else curves.to_json(data) if as_json else
               curves.table(data, width=table_width(wide)), nl=not as_csv)


@click.command()
@click.argument("refs", metavar="JOB...", nargs=-1, required=True,
                shell_complete=completion.jobs)
@click.option("--output", "-o", default="curves.png", show_default=True, metavar="FILE",
              type=click.Path(dir_okay=False), help="The picture: .png, .svg or .pdf.")
@click.option("--target", type=float, default=None, metavar="ACC",
              help="The target accuracy line, 0.94 or 94 (default: the jobs' recipe's).")
@click.option("--title", default=None, help="A title over the plots.")
def plot(refs: tuple[str, ...], output: str, target: float | None, title: str | None) -> None:
    """Loss and accuracy against epoch and against wall time, several jobs overlaid, the
    recipe's target as a line (matplotlib; no display needed).

    \b
    Examples:
      cloudtrain plot 3f2a1b9c -o curves.png
      cloudtrain plot 3f2a 19a3 7c0d -o compare.svg
    """
    from .. import curves, plots

    found = metric_jobs(refs)
    targets = {t for _, _, t in found}
    if target is None and len(targets) == 1:
        target, metric = next(iter(targets))
    else:
        metric = next(iter(targets))[1] if len({m for _, m in targets}) == 1 else None
    data = [curves.read_job(j.id, j.name, path, started_at=j.started_at, finished=not j.active)
            for j, path, _ in found]
    for note in plots.plot(data, output, target=target, metric=metric, title=title):
        click.echo(note, err=True)
    click.echo(f"wrote {output}")


def metric_jobs(refs: tuple[str, ...]) -> list:
    """(job, its metrics.jsonl here, its recipe's (target, metric)) for each JOB given."""
    from ..lifecycle import inspect

    with job_store() as store:
        found = [store.find_job(r) for r in refs]
    return [(j, inspect.metrics_file(j), inspect.recipe_target(j)) for j in found]


@click.command()
@click.option("--port", type=click.IntRange(min=0, max=65535), default=0,
              help="The port to listen on (default: a free one, printed).")
@click.option("--no-browser", is_flag=True, help="Print the address only; open no browser.")
def ui(port: int, no_browser: bool) -> None:
    """A page in the browser with every job, its curves, cost and log, live (Ctrl-C stops).

    Served on 127.0.0.1 only, from the state `status` reads; the address it prints holds a
    token that every request needs, so other users of this machine cannot read it.

    \b
    Examples:
      cloudtrain ui
      cloudtrain ui --port 8765 --no-browser
    """
    from .. import dashboard

    def ready(url: str) -> None:
        click.echo(f"cloudtrain ui: {url}  (Ctrl-C stops it)", err=True)
        if not no_browser:
            import webbrowser

            try:
                webbrowser.open(url)
            except Exception:  # noqa: BLE001  (no browser here: the address is printed)
                pass

    try:
        dashboard.serve(config.home(), settings_whatever_config_says(), port=port, ready=ready)
    except KeyboardInterrupt:
        click.echo("cloudtrain ui: stopped", err=True)
