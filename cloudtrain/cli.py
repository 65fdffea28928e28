"""The `cloudtrain` command: parse, call one library function, render. No logic here."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys

import click

from . import catalog_views, cells, completion, config, errors, job_views

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _store():
    from .state import open_store

    return open_store(config.home())


def _echo_bytes(data: bytes, screen=None, last: bool = False) -> None:
    """A job's output to stdout: through `screen` (a hostdata.TerminalText) when given;
    `last`: the end of it (a character cut short there is shown too)."""
    if screen is not None:
        data = screen.feed(data) + (screen.flush() if last else b"")
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def _screen(raw: bool = False):
    """F36: on a terminal a job's output goes through hostdata.TerminalText (its escapes
    dropped, colours kept); piped, or with --raw, it is the bytes as they are."""
    if raw or not sys.stdout.isatty():
        return None
    from .hostdata import TerminalText

    return TerminalText()


def _region(ctx, param, value: str | None) -> str | None:
    """--region of commands that only read prices: refused early if it is not a region name."""
    return None if value is None else config.check_region(value, "--region")


def _given(ctx, param, value):
    """An option that, given, needs a value: `--gpus ''` is not the same as no --gpus."""
    for v in value if isinstance(value, tuple) else (value,):
        if v is not None and not v.strip():
            raise errors.UsageError(f"{param.opts[0]} needs a value, got {v!r}")
    return value


def _since(ctx, param, value: str | None) -> str | None:
    """--since: a finite, non-negative age (`nan` would match nothing and say "no jobs")."""
    if value is not None:
        import time

        from .ledger import parse_since

        now = time.time()
        start = parse_since(value, now)
        if start is not None:
            config.finite(now - start, f"--since {config.shown(value)}", low=0)
    return value


def _width(wide: bool) -> int | None:
    """How wide tables may be: everything with --wide; else COLUMNS where it is set, the
    terminal's width where stdout is one, and unlimited when piped (scripts get every cell)."""
    if wide:
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        import shutil

        return shutil.get_terminal_size().columns
    return None


def _rows_that_fit(limit: int | None) -> int | None:
    """status --watch in a terminal: at most the jobs that fit its height (U31: a 20-line
    terminal got 23 lines and scrolled), with the header, the footer and the supervisor's
    line; piped, `limit` as given."""
    if not sys.stdout.isatty():
        return limit
    import shutil

    fit = max(1, shutil.get_terminal_size().lines - 4)
    return fit if limit is None else min(limit, fit)


def _color() -> bool:
    """Colours (job states) only in a terminal, and never with NO_COLOR set (no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") \
        and os.environ.get("TERM") != "dumb"


_WIDE = click.option("--wide", is_flag=True, help="Every column at full length. Without it, "
                     "tables fit COLUMNS or the terminal (cut text ends in an ellipsis, optional "
                     "columns go); output piped to another program is never cut.")


def _duration(ctx, param, value: str | None) -> float | None:
    """--max-runtime: minutes, or 90m, 2h, 1d, 45s, read as a job file's max_runtime (U17)."""
    if value is None:
        return None
    from .jobfile import flag_minutes

    return flag_minutes(value, param.opts[0])


def _settings_whatever_config_says():
    """The settings for a command that must work whatever config.yaml says (down, status,
    logs; U7): a mistake there is a WARNING line on stderr, once, and that setting keeps its
    default."""
    click.get_current_context().with_resource(
        config.tolerating(lambda line: click.echo(line, err=True)))
    return config.Settings.load()


def _grace(ctx, param, value: float | None) -> float | None:
    return None if value is None else config.finite(value, "--grace (seconds)", low=0, high=3600)


# U32: what SkyPilot, dstack and docker users type first, and what does it here.
OTHER_TOOLS_VERBS = {
    "queue": "cloudtrain status", "ps": "cloudtrain status", "ls": "cloudtrain status",
    "list": "cloudtrain status", "jobs": "cloudtrain status",
    "cancel": "cloudtrain down JOB", "stop": "cloudtrain down JOB",
    "kill": "cloudtrain down JOB", "terminate": "cloudtrain down JOB",
    "exec": "cloudtrain ssh JOB -- CMD; a new job on a kept instance: cloudtrain launch --on JOB",
    "run": "cloudtrain launch -- CMD, or cloudtrain launch job.yaml",
    "apply": "cloudtrain launch job.yaml", "start": "cloudtrain launch job.yaml",
    "show-gpus": "cloudtrain catalog", "gpus": "cloudtrain catalog",
    "cost": "cloudtrain cost-report", "log": "cloudtrain logs JOB",
    "rm-all": "cloudtrain prune --older-than 30d",
}


class _Group(click.Group):
    """The command group: a verb from another tool says which command does it here."""

    def resolve_command(self, ctx, args):
        if args and args[0] in OTHER_TOOLS_VERBS and self.get_command(ctx, args[0]) is None:
            raise errors.UsageError(f"cloudtrain has no {args[0]} command",
                                    hint=f"use {OTHER_TOOLS_VERBS[args[0]]}")
        return super().resolve_command(ctx, args)


@click.group(cls=_Group, context_settings=CONTEXT)
@click.option("--debug", is_flag=True, help="Show tracebacks for unexpected errors.")
@click.version_option(package_name="cloudtrain")
@click.pass_context
def cli(ctx, debug: bool) -> None:
    """Run fast training recipes and your own training code on cheap GPUs.

    \b
    Example:
      cloudtrain launch --recipe resnet9 --profile smoke --follow
    """
    if ctx.invoked_subcommand not in (None, "supervisor") and "--help" not in sys.argv \
            and "-h" not in sys.argv:
        from .lifecycle import supervisor

        line = supervisor.watchdog()  # recovering jobs need it running
        if line:
            click.echo(line, err=True)


@cli.command()
@click.argument("name", required=False, shell_complete=completion.recipes)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_WIDE
def recipes(name: str | None, as_json: bool, wide: bool) -> None:
    """List the bundled recipes, or show one recipe's arguments and sources.

    \b
    Examples:
      cloudtrain recipes
      cloudtrain recipes resnet9
      cloudtrain recipes resnet9 --json
    """
    from . import recipes as recipes_module

    if name is not None:
        recipe = recipes_module.load(name)
        click.echo(catalog_views.recipe_json(recipe) if as_json else
                   catalog_views.recipe_detail(recipe, width=_width(wide)))
        return
    found, broken = recipes_module.survey()
    if as_json:
        click.echo(catalog_views.recipes_json(found))
        return
    click.echo(catalog_views.recipes_table(found, width=_width(wide)))
    if broken:
        click.echo("\nbroken (fix or remove them):\n" + "\n".join(f"  {exc.message}"
                                                               for exc in broken))


class _LaunchCommand(click.Command):
    """`launch`: an option click does not know, after words of a command given without `--`
    (`cloudtrain launch python train.py --epochs 1`), is the user's own option (D15)."""

    def parse_args(self, ctx, args):
        typed = list(args)  # click consumes the list it parses
        # A job file is a word before any `--` (after it, words are the user's command).
        ctx.meta["cloudtrain.before_dashdash"] = typed[:typed.index("--")] if "--" in typed \
            else typed
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if "--" in typed:
                raise
            from .cmdline import Options, unknown_option
            from .jobfile import is_job_file

            opts = [p for p in self.params if isinstance(p, click.Option)]
            options = Options(
                valued=frozenset(o for p in opts if not p.is_flag for o in p.opts),
                flags=frozenset(o for p in opts if p.is_flag
                                for o in (*p.opts, *p.secondary_opts)) | {"-h", "--help"})
            advice = unknown_option(typed, exc.option_name, options, is_job_file)
            if advice is None:
                raise
            raise errors.UsageError(advice.message, hint=advice.hint) from None


@cli.command(cls=_LaunchCommand, context_settings={**CONTEXT, "ignore_unknown_options": False})
@click.option("--recipe", "-r", metavar="NAME", shell_complete=completion.recipes,
              help="A bundled recipe (see `cloudtrain recipes`).")
@click.option("--profile", "-p", metavar="NAME", shell_complete=completion.profiles,
              help="A recipe profile, e.g. smoke; --profile none for the full run (drops a "
              "job file's profile).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              shell_complete=completion.set_keys,
              help="Set a recipe argument (repeatable); checked against the recipe.")
@click.option("--name", "-n", help="A name to refer to the job by.")
@click.option("--backend", "-b", help="Where to run: local (default when no cloud is configured).")
@click.option("--workdir", "-w", type=click.Path(), help="Directory synced into the job "
              "(honours .gitignore); your command runs there.")
@click.option("--max-runtime", metavar="DURATION", callback=_duration,
              help="Stop the job after this long: minutes, or 90m, 2h, 1d, 45s (default: the "
              "recipe's, else config).")
@click.option("--instance", "-i", "instance_type", metavar="TYPE",
              shell_complete=completion.instance_types,
              help="EC2 instance type, e.g. g5.xlarge (implies --backend aws).")
@click.option("--gpus", metavar="GPU:N", shell_complete=completion.gpus,
              help="Instead of --instance: the cheapest type with N of "
              "that GPU (e.g. V100:1, A100:8) in the allowed regions.")
@click.option("--procs", type=int, metavar="N", help="Processes per host for torchrun recipes "
              "(default: one per GPU on the host, one without GPUs).")
@click.option("--nodes", type=int, metavar="N", help="Machines the job spans: one torchrun job "
              "over N instances in one AZ and placement group (default: the recipe variant's "
              "published count on a cloud, else 1).")
@click.option("--spot/--on-demand", "spot", default=None,
              help="Spot (one-time, terminated on interruption) or on-demand (default).")
@click.option("--recover/--no-recover", "recover", default=None,
              help="Spot: on an interruption, continue on a new instance from the last "
              "checkpoint (default for --spot; a supervisor on this machine does it).")
@click.option("--max-restarts", type=int, metavar="N",
              help="Spot recovery: relaunch at most N times (default 3).")
@click.option("--fallback", type=click.Choice(["on-demand"]),
              help="Spot recovery: take an on-demand instance when no spot capacity is left.")
@click.option("--region", help="AWS region (default: the AWS configuration's).")
@click.option("--ami", help="AMI id (default: the current AWS Deep Learning PyTorch AMI).")
@click.option("--disk-gb", type=click.IntRange(min=8, max=config.GP3_MAX_GB),
              help="Root volume size (default: the recipe's).")
@click.option("--max-price", type=float, metavar="USD", help="Spot: the most to pay per hour.")
@click.option("--keep", is_flag=True, default=None, help="Keep the instance after the job (stop it "
              "with `cloudtrain down`).")
@click.option("--idle-minutes", type=float, help="Power the instance off this long after the job.")
@click.option("--on", "on_job", metavar="JOB", shell_complete=completion.jobs,
              help="Run on that job's kept instance (--keep): "
              "no provisioning, only changed files synced.")
@click.option("--include", "include", multiple=True, metavar="PATTERN", help="Sync these workdir "
              "paths too, though they look like credentials (.aws/, .ssh/, .env, *.pem), which "
              "are otherwise never synced (repeatable); asks first in a terminal, even with -y. "
              "A job file cannot do this.")
@click.option("--data", "data", multiple=True, metavar="NAME[=SOURCE]", help="Stage dataset NAME "
              "before the job starts: from SOURCE (s3://BUCKET/PREFIX, snap-ID, or /path on "
              "the host), or from config.yaml's `datasets:` (repeatable).")
@click.option("--cpu-only", is_flag=True, default=None, help="Allow an instance type without a "
              "GPU (refused otherwise: a GPU type is what a training job needs).")
@click.option("--dry-run", is_flag=True, help="Show the plan and its price; create nothing "
              "(makes the same checks as the launch).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before creating paid resources "
              "(nothing is asked without a terminal either).")
@click.option("--env", "envs", multiple=True, metavar="KEY[=VALUE]", help="An environment "
              "variable for the job (repeatable); KEY alone takes this shell's value.")
@click.option("--secret", "secrets", multiple=True, metavar="KEY[=VALUE]", help="Like --env, "
              "but the value is written to no file cloudtrain keeps (job.json, the store, logs).")
@click.option("--setup", metavar="SCRIPT", help="Shell code run once per instance before the "
              "job, in its working directory (e.g. 'pip install -r requirements.txt').")
@click.option("--output", "outputs", multiple=True, metavar="PATH", help="A file or directory "
              "the job writes (relative to its working directory) to bring home after it "
              "(repeatable).")
@click.option("--resume-from", metavar="JOB", shell_complete=completion.jobs,
              help="Start from that job's last checkpoint "
              "(same recipe; sets resume=true).")
@click.option("--follow", "-f", is_flag=True, help="Stream the log; exit with the job's outcome.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the job id.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED,
                shell_complete=completion.job_files)
def launch(recipe, profile, sets, name, backend, workdir, max_runtime, instance_type, gpus, procs,
           nodes, spot, recover, max_restarts, fallback, region, ami, disk_gb, max_price, keep,
           idle_minutes, on_job, include, data, cpu_only, envs, secrets, setup, outputs,
           dry_run, yes, resume_from, follow, quiet, command):
    """Launch a recipe, or your own command after --, or a job file (job.yaml), and return
    with its job id.

    \b
    Examples:
      cloudtrain launch job.yaml
      cloudtrain launch job.yaml --spot --set epochs=30    (flags override the file)
      cloudtrain launch --recipe resnet9 --profile smoke --follow
      cloudtrain launch --recipe resnet9 --set variant=dawn --set epochs=30
      cloudtrain launch --recipe resnet9 --resume-from 3f2a1b9c
      cloudtrain launch --workdir . -- python train.py --lr 0.1
      cloudtrain launch --recipe resnet9 --instance g5.xlarge --spot --dry-run
      cloudtrain launch --recipe resnet9 --set gpus=8 --gpus V100:8
      cloudtrain launch --recipe imagenet --gpus V100:8 --data imagenet=s3://bkt/imagenet
      cloudtrain launch --recipe imagenet --set variant=machines-4 --instance p3.16xlarge --spot
      cloudtrain launch --nodes 2 --instance g5.12xlarge --workdir . -- bash train.sh
      cloudtrain launch --workdir . --setup 'pip install -r requirements.txt' \\
          --env WANDB_PROJECT=cifar --secret WANDB_API_KEY --output results -- python train.py

    \b
    A job file (cloudtrain init writes a commented one):
      name: cifar-run
      workdir: .
      setup: pip install -r requirements.txt
      run: python train.py --epochs 30
      envs: {WANDB_PROJECT: cifar}
      secrets: {WANDB_API_KEY: null}     # null: this shell's value
      outputs: [results]
      resources: {instance: g5.xlarge, spot: true, max_runtime: 2h}
    """
    from . import jobfile
    from .lifecycle import launch as launching
    from .lifecycle import plan
    from .spec import from_options

    ctx = click.get_current_context()
    settings = config.Settings.load()
    options = {k: v for k, v in ctx.params.items()
               if k not in ("dry_run", "yes", "follow", "quiet")}
    options.update(max_runtime=max_runtime, command=command)
    path = command[0] if command and jobfile.is_job_file(command[0]) and \
        command[0] in ctx.meta.get("cloudtrain.before_dashdash", ()) else None
    if path is not None:
        typed = {k: v for k, v in options.items() if k != "command" and
                 ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}
        if command[1:]:
            typed["command"] = command[1:]
        options = jobfile.merge(jobfile.load(path, typed), typed)
    spec = from_options(options, settings)
    with _store() as store:
        if dry_run:
            click.echo(catalog_views.plan(plan.plan(spec, store, settings)))
            return
        found = plan.read_datasets(spec, settings)  # a missing dataset stops the launch here
        row = plan.expected(spec, store)
        if row is not None and not quiet:
            click.echo(catalog_views.estimate_line(row, spec.market), err=True)
        question = plan.question(spec, warn=lambda line: click.echo(f"WARNING: {line}",
                                                                    err=True))
        if question:
            _confirm(question, yes)
        sending = plan.credentials_sent(spec)
        if sending:
            _confirm_sending(sending)
        from .progress import for_launch  # each phase on stderr as it happens

        with for_launch(quiet, lambda line: click.echo(line, err=True)) as report:
            job = launching.launch(store, settings, spec, say=report, found=found)
        if quiet:
            click.echo(job.id)
        else:
            click.echo(f"launched job {job.id}: {job.command} on {job.backend}", err=follow)
        if not follow:
            if not quiet:
                click.echo(f"  follow:  cloudtrain logs {job.id} --follow\n"
                           f"  attach:  cloudtrain attach {job.id}\n"
                           f"  stop:    cloudtrain down {job.id}")
            return
        _follow(store, settings, job)


def _confirm(question, yes: bool) -> None:
    """The warnings, on stderr whether or not anyone is there (U15); then, D26: ask in a
    terminal (unless --yes); without one (scripts, CI) go on."""
    for warning in question.warnings:
        click.echo(f"WARNING: {warning}", err=True)
    if yes or not (sys.stdin.isatty() and sys.stderr.isatty()):
        return
    if not click.confirm(" ".join(filter(None, [question.text, "Proceed?"])),
                         default=question.default, err=True):
        raise errors.CloudtrainError("not launched: nothing was created", exit_code=1)


def _confirm_text(text: str) -> None:
    """A question in words (check --launch's): asked in a terminal, as a launch's is."""
    from .providers.base import Question

    _confirm(Question(text=text), yes=False)


def _confirm_sending(line: str) -> None:
    """F27: credential-looking files that --include sends: asked in a terminal whatever -y
    says (default no); said in a WARNING without one."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        click.echo(f"WARNING: {line}", err=True)
        return
    if not click.confirm(line + ". Send them?", default=False, err=True):
        raise errors.CloudtrainError("not launched: nothing was created", exit_code=1)


def _follow(store, settings, job, offset: int = 0, node: int = 0, screen=None) -> None:
    from .lifecycle import inspect

    screen = screen or _screen()
    try:
        for chunk in inspect.follow(store, settings, job, offset, node):
            _echo_bytes(chunk, screen)
        _echo_bytes(b"", screen, last=True)
    except KeyboardInterrupt:
        click.echo(f"\ndetached; job {job.id} keeps running. "
                   f"Stop it with: cloudtrain down {job.id}", err=True)
        raise SystemExit(errors.EXIT_INTERRUPTED)
    job = store.job(job.id)
    summary = f"job {job.id} {job.state}"
    if job.reason:
        summary += f": {job.reason}"
    click.echo(summary, err=True)  # the one line on the outcome (D38): the exit code says the rest
    if job.state != "succeeded":
        raise SystemExit(errors.EXIT_FAILED)


@cli.command()
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
@_WIDE
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
    from . import history

    if watch and as_json:
        raise errors.UsageError("--watch redraws the table; --json prints once",
                                hint="drop one of them")
    filters = history.parse_filters(states, recipes_, name, since)
    if job is not None and (filters.any() or all_ or limit):
        raise errors.UsageError("-a, --state, --recipe, --name, --since and --limit choose "
                                "jobs for the list, not for one job's detail",
                                hint=f"cloudtrain status {job}")
    settings = _settings_whatever_config_says()
    with _store() as store:
        if refresh:
            from .lifecycle import stop

            swept = stop.reconcile(store)
            text = job_views.cloud_instances(swept.found, width=_width(wide), sweep=swept)
            if not as_json:
                click.echo(text)
            elif swept.unchecked:  # the JSON is the jobs; what was not checked goes to stderr
                click.echo("\n".join(l for l in text.splitlines() if "could not check" in l),
                           err=True)

        def view() -> str:
            if job is not None:  # U36: `status ''` is refused as `logs ''` is
                from .lifecycle import inspect

                d = inspect.detail(store, settings, job)
                if as_json:
                    return job_views.detail_json(d.job, d.phases, d.log_tail, d.target, d.runs,
                                              d.attempts, d.recovery)
                return job_views.job_detail(d.job, d.phases, d.log_tail, d.target, runs=d.runs,
                                         attempts=d.attempts, recovery=d.recovery,
                                         width=_width(wide), trend=d.trend,
                                         startup=d.startup)
            active = store.jobs(active_only=True)
            if active:  # finished jobs need no refresh (nor the import of what does it)
                from .lifecycle.watch import refresh_active

                refresh_active(store, settings, active)
            # --json is for scripts: every job the filters match, as before issue 16
            shown, hidden = history.select(store, filters, all_=all_ or as_json,
                                           limit=_rows_that_fit(limit) if watch else limit)
            if as_json:
                return job_views.jobs_json(shown)
            if shown:
                text = job_views.status_table(shown, width=_width(wide), color=_color())
                note = history.footer(hidden, filters, all_=all_)
                text += "\n" + note if note else ""
            else:  # U6: what matched nothing, and how many jobs there are (no footer again)
                text = history.empty_view(store, filters)
            if active:
                from .lifecycle import supervisor

                if supervisor.needed(store):
                    text += "\n" + job_views.supervisor_line(supervisor.state_of(config.home()))
            return text

        if watch:
            _watch(view, interval)
        else:
            click.echo(view())
        if refresh and swept.unchecked:  # not every region could be asked: not all clear
            raise SystemExit(errors.EXIT_FAILED)


@cli.command()
@click.argument("refs", metavar="JOB...", nargs=-1, required=True,
                shell_complete=completion.jobs)
@click.option("--csv", "as_csv", is_flag=True, help="Comma-separated rows, a job column first.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_WIDE
def metrics(refs: tuple[str, ...], as_csv: bool, as_json: bool, wide: bool) -> None:
    """Each job's metrics.jsonl as a per-epoch table (a running job's, read from its host).

    \b
    Examples:
      cloudtrain metrics 3f2a1b9c
      cloudtrain metrics 3f2a 19a3 --csv > curves.csv
    """
    from . import curves

    if as_csv and as_json:
        raise errors.UsageError("give --csv or --json, not both")
    data = [curves.read_job(j.id, j.name, path, started_at=j.started_at, finished=not j.active)
            for j, path, _ in _metric_jobs(refs)]
    click.echo(curves.to_csv(data) if as_csv else curves.to_json(data) if as_json else
               curves.table(data, width=_width(wide)), nl=not as_csv)


@cli.command()
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
    from . import curves, plots

    found = _metric_jobs(refs)
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


def _metric_jobs(refs: tuple[str, ...]) -> list:
    """(job, its metrics.jsonl here, its recipe's (target, metric)) for each JOB given."""
    from .lifecycle import inspect

    with _store() as store:
        found = [store.find_job(r) for r in refs]
    return [(j, inspect.metrics_file(j), inspect.recipe_target(j)) for j in found]


def _can_ask() -> bool:
    """Whether someone can answer a question: stdin and stderr (where it is asked) are a
    terminal."""
    return sys.stdin.isatty() and sys.stderr.isatty()


def _nobody_to_ask(what: str, example: str) -> errors.UsageError:
    """U13: what destroys is refused without a terminal to ask, unless -y says go on."""
    return errors.UsageError(f"{what} and there is no terminal to ask",
                             hint=f"add -y to go on without asking: {example}")


def _remove(plan_of, dry_run: bool, yes: bool, command: str) -> None:
    """rm and prune: say what goes and what stays (and why), ask in a terminal (without one,
    -y is needed), remove."""
    from . import history

    with _store() as store:
        plan = plan_of(store)
        click.echo(job_views.removal_plan(plan), err=True)
        if dry_run or not plan.removals:
            sys.exit(errors.EXIT_FAILED if plan.refused else 0)
        if not yes and not _can_ask():
            raise _nobody_to_ask(f"{command.split()[0]} removes {len(plan.removals)} finished "
                                 "job(s)", f"cloudtrain {command} -y")
        if not yes and not click.confirm("Remove them?", default=False, err=True):
            raise errors.CloudtrainError("nothing removed", exit_code=errors.EXIT_FAILED)
        summary = history.remove(store, plan)
        click.echo(job_views.removal_summary(summary))
        if summary.refused or plan.refused:
            sys.exit(errors.EXIT_FAILED)


@cli.command()
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
    from . import history

    _remove(lambda store: history.plan_removal(store, refs), dry_run, yes,
            "rm " + shlex.join(refs))


@cli.command()
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
    from . import history

    _remove(lambda store: history.plan_removal(store, older_than=older_than), dry_run, yes,
            "prune --older-than " + shlex.quote(older_than))


def _watch(view, interval: float) -> None:
    """`status --watch`: in a terminal a rich Live view redrawn every `interval` seconds;
    piped, the view printed again every interval after a blank line. Ctrl-C ends it, exit 0."""
    import time

    try:
        if not sys.stdout.isatty():
            while True:
                click.echo(view() + "\n", nl=True)
                time.sleep(interval)
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        with Live(Text.from_ansi(view()), console=Console(), auto_refresh=False,
                  vertical_overflow="visible") as live:
            while True:
                time.sleep(interval)
                live.update(Text.from_ansi(view()), refresh=True)
    except KeyboardInterrupt:
        return


_NODE = click.option("--node", type=click.IntRange(min=0), default=0, show_default=True,
                     metavar="I", help="Which node of a job on several machines (0: the "
                     "rendezvous, where rank 0 runs).")


@cli.command()
@click.argument("job", shell_complete=completion.jobs)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option("--tail", "-n", type=click.IntRange(min=0), default=None,
              help="Only the last N lines (then follow from there with -f).")
@click.option("--raw", is_flag=True, help="The output's bytes as they are, escape sequences "
              "included (on a terminal they are dropped, colours kept; piped, they are kept).")
@_NODE
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
    from .lifecycle import inspect

    settings = _settings_whatever_config_says()
    screen = _screen(raw)
    with _store() as store:
        record = inspect.for_logs(store, settings, job)
        offset = 0
        if tail is not None:
            data, offset = inspect.tail_log(record, tail, node)
            _echo_bytes(data, screen, last=not follow)
        elif not follow:
            _echo_bytes(inspect.read_log(record, node=node), screen, last=True)
        if follow:
            _follow(store, settings, record, offset, node, screen)


@cli.command()
@click.argument("job", shell_complete=completion.jobs)
@_NODE
def attach(job: str, node: int) -> None:
    """Attach to a running job's tmux session (detach with Ctrl-b d).

    \b
    Example:
      cloudtrain attach 3f2a1b9c
    """
    from .lifecycle import inspect

    settings = config.Settings.load()
    terminal = sys.stdin.isatty() and sys.stdout.isatty()
    with _store() as store:
        argv = inspect.attach_argv(store, settings, store.find_job(job), terminal, node)
    os.execvp(argv[0], argv)


@cli.command()
@click.option("--gpu", callback=_given,
              help="Only types with this GPU (V100, A100, H100, A10G, T4, L4, ...).")
@click.option("--region", callback=_region, help="Prices of this region (default: the one "
              "launch uses: config.yaml, AWS_REGION, the AWS profile, else us-east-1).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--refresh", is_flag=True, help="Fetch the region's on-demand and gp3 prices from "
              "the AWS price list and its spot prices from EC2 (kept under $CLOUDTRAIN_HOME).")
@_WIDE
def catalog(gpu: str | None, region: str, as_json: bool, refresh: bool, wide: bool) -> None:
    """AWS GPU instance types with on-demand and spot prices per hour (bundled snapshot).

    \b
    Examples:
      cloudtrain catalog --gpu V100
      cloudtrain catalog --region eu-west-1 --json
      cloudtrain catalog --refresh --region us-east-1
    """
    from . import catalog as catalog_module, providers

    # --region, else the region launch resolves (config.yaml, AWS_REGION, AWS_DEFAULT_REGION,
    # the AWS profile), else us-east-1: the same for every command
    region = region or providers.get("aws").region()
    if refresh:
        provider = providers.get("aws")
        click.echo(provider.refresh_list_prices(region), err=True)
        click.echo(provider.refresh_spot(region), err=True)

    types = catalog_module.matching(gpu, None, region)
    if as_json:
        click.echo(catalog_views.catalog_json(types, region, catalog_module.SNAPSHOT,
                                       catalog_module.on_demand_source(region),
                                       catalog_module.spot_source(region)))
    else:
        unpriced = catalog_module.no_prices(region)
        click.echo(catalog_views.catalog_table(types, region, width=_width(wide), unpriced=unpriced))
        if unpriced is None:
            click.echo(catalog_views.catalog_sources(region, catalog_module.on_demand_source(region),
                                              catalog_module.spot_source(region),
                                              width=_width(wide)))


@cli.command()
@click.option("--recipe", "-r", required=True, metavar="NAME", shell_complete=completion.recipes,
              help="A bundled recipe.")
@click.option("--profile", "-p", metavar="NAME", callback=_given,
              shell_complete=completion.profiles, help="A recipe profile.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              shell_complete=completion.set_keys, help="A recipe argument.")
@click.option("--instance", "-i", "types", multiple=True, metavar="TYPE", callback=_given,
              shell_complete=completion.instance_types,
              help="Only these instance types (repeatable).")
@click.option("--gpus", metavar="GPU:N", callback=_given, shell_complete=completion.gpus,
              help="Only types with N of this GPU, e.g. A10G:1 or A100:8.")
@click.option("--spot", is_flag=True, help="Mark the cheapest by spot price.")
@click.option("--region", callback=_region,
              help="Prices of this region (default: the one launch uses: config.yaml, "
              "AWS_REGION, the AWS profile, else us-east-1).")
@click.option("--disk-gb", type=click.IntRange(min=8, max=config.GP3_MAX_GB),
              help="Root volume (default: the recipe's).")
@click.option("--nodes", type=int, metavar="N", help="Instances per run (default: the "
              "machines the recipe variant was published on).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_WIDE
def estimate(recipe, profile, sets, types, gpus, spot, region, disk_gb, nodes, as_json,
             wide) -> None:
    """Expected time and cost per run of a recipe on each instance type, before launching.

    \b
    Examples:
      cloudtrain estimate --recipe resnet9
      cloudtrain estimate --recipe airbench94 --gpus A10G:1 --spot
      cloudtrain estimate --recipe resnet9 --instance p3.2xlarge --instance g5.xlarge
      cloudtrain estimate --recipe imagenet --set variant=machines-16 --instance p3.16xlarge
    """
    from . import estimate as estimate_module

    with _store() as store:
        est = estimate_module.for_recipe(recipe, profile, sets, region,
                                         market="spot" if spot else "on-demand",
                                         types=list(types), gpu_request=gpus, disk_gb=disk_gb,
                                         store=store, nodes=nodes)
    if as_json:
        import dataclasses
        import json

        click.echo(json.dumps(dataclasses.asdict(est), indent=1))
    else:
        click.echo(catalog_views.estimate_table(est, width=_width(wide)))


@cli.command("cost-report")
@click.option("--since", metavar="AGE", callback=_since,
              help="Only jobs created in this period: 30d, 12h, 2w.")
@click.option("--by", type=click.Choice(["job", "recipe", "instance", "day", "month"]),
              default="job", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
@click.option("--refresh", is_flag=True, help="Settle estimates first (asks EC2 for termination "
              "times and spot price history).")
@_WIDE
def cost_report(since: str | None, by: str, as_json: bool, as_csv: bool, refresh: bool,
                wide: bool) -> None:
    """What jobs cost: per job, recipe, instance, day or month, with totals. Offline.

    \b
    Examples:
      cloudtrain cost-report --since 30d
      cloudtrain cost-report --by recipe --csv
    """
    from . import ledger
    from .lifecycle import collect

    with _store() as store:
        if refresh:
            collect.settle_all(store)
        rows, total = ledger.report(store, by, since)
    if as_json:
        click.echo(ledger.report_json(rows, total, by))
    elif as_csv:
        click.echo(ledger.report_csv(rows, total, by), nl=False)
    else:
        click.echo(catalog_views.cost_report(rows, total, by, width=_width(wide)))


@cli.command()
@click.option("--region", callback=_region, help="Check this region (default: the one launch "
              "uses: config.yaml, AWS_REGION, AWS_DEFAULT_REGION, the AWS profile).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_WIDE
@click.option("--launch", is_flag=True, help="Also launch once, for real and small: a t3.micro "
              "runs a tiny job through the whole path (key pair, security group, AMI, "
              "RunInstances, SSH, sync, agent, job store, collection), then everything is "
              "terminated and the bill shown (a cent or less).")
@click.option("--gpu", is_flag=True, help="With --launch: on the region's cheapest GPU type "
              "instead (g4dn.xlarge: a few cents).")
@click.option("--yes", "-y", is_flag=True, help="With --launch: do not ask before launching.")
def check(region: str | None, as_json: bool, wide: bool, launch: bool, gpu: bool,
          yes: bool) -> None:
    """Every setting and where it came from, and whether AWS is ready: credentials, account,
    region, Deep Learning AMI, GPU quotas for the recipes' instance types. Exit code 1 when
    a launch would fail. With --launch, one real launch, each step on one line with its
    time and verdict; a failure names the permission, quota or setting that is missing.

    \b
    Examples:
      cloudtrain check
      cloudtrain check --region eu-west-1 --json
      cloudtrain check --launch
      cloudtrain check --launch --gpu --region us-west-2
    """
    if (gpu or yes) and not launch:
        raise errors.UsageError(f"{'--gpu' if gpu else '--yes'} applies to --launch",
                                hint="cloudtrain check --launch" + (" --gpu" if gpu else ""))
    if launch:
        from . import launch_check

        report = launch_check.run(
            region=region, gpu=gpu, confirm=None if yes else _confirm_text,
            say=None if as_json else lambda step: click.echo(launch_check.render_step(step)))
        click.echo(launch_check.to_json(report) if as_json else launch_check.render_end(report))
        sys.exit(launch_check.exit_code(report))
    from . import check as checks

    report = checks.run(region=region)
    click.echo(checks.to_json(report) if as_json else
               checks.render(report, width=_width(wide), color=_color()))
    sys.exit(checks.exit_code(report))


@cli.command()
@click.option("--recipe", "-r", metavar="NAME", shell_complete=completion.recipes,
              help="A job file for this bundled recipe "
              "(default: for your own code).")
@click.option("--output", "-o", "path", default="cloudtrain.yaml", show_default=True,
              metavar="FILE", help="Where to write it (- prints it).")
@click.option("--force", is_flag=True, help="Replace the file if it exists.")
def init(recipe: str | None, path: str, force: bool) -> None:
    """Write a commented job file to edit and run with `cloudtrain launch FILE`.

    \b
    Examples:
      cloudtrain init
      cloudtrain init --recipe resnet9 -o resnet9.yaml
    """
    from . import jobfile

    text = jobfile.write_example(path, recipe, force)
    if text:
        click.echo(text, nl=False)
    else:
        click.echo(f"wrote {path}: edit it, then `cloudtrain launch {shlex.quote(path)}` "
                   f"(--dry-run shows the plan and its price)")


@cli.command(context_settings=CONTEXT)
@click.argument("job", shell_complete=completion.jobs)
@_NODE
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(job: str, node: int, command: tuple[str, ...]) -> None:
    """Open a shell on a job's instance (with its pinned host key), or run one command there
    (after --; its exit code is ssh's).

    \b
    Examples:
      cloudtrain ssh 3f2a1b9c
      cloudtrain ssh 3f2a1b9c --node 1
      cloudtrain ssh 3f2a1b9c -- nvidia-smi
      cloudtrain ssh 3f2a1b9c -- 'du -sh ~/.cloudtrain/jobs/*'
    """
    from .lifecycle import inspect

    settings = config.Settings.load()
    with _store() as store:
        argv = inspect.ssh_argv(store, settings, store.find_job(job), node, command,
                                tty=sys.stdin.isatty())
    os.execvp(argv[0], argv)


@cli.command()
@click.argument("jobs_", metavar="JOB...", nargs=-1, shell_complete=completion.jobs)
@click.option("--all", "every", is_flag=True, help="Stop every active job.")
@click.option("--grace", type=float, default=None, metavar="SECONDS", callback=_grace,
              help="Time between SIGTERM and SIGKILL (default from config, 30 s).")
@click.option("--yes", "-y", is_flag=True, help="--all: do not ask first (needed without a "
              "terminal to ask).")
def down(jobs_: tuple[str, ...], every: bool, grace: float | None, yes: bool) -> None:
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
    from .lifecycle import stop

    if every and not jobs_ and not yes and not _can_ask():
        raise _nobody_to_ask("down --all stops every job and terminates every instance tagged "
                             "as yours that no job here holds", "cloudtrain down --all -y")
    settings = _settings_whatever_config_says()
    with _store() as store:
        if every and not jobs_ and not yes:
            targets = stop.down_targets(store)
            if targets:  # it destroys: the default answer is no
                click.echo(f"down --all stops these {len(targets)} job(s) and terminates "
                           f"their instances:", err=True)
                click.echo(job_views.status_table(targets), err=True)
                if not click.confirm("Proceed?", default=False, err=True):
                    click.echo("nothing stopped", err=True)
                    raise SystemExit(errors.EXIT_FAILED)
        outcomes = stop.cancel(store, settings, jobs_, every, grace)
    click.echo(job_views.stop_outcomes(outcomes))
    if any(not o.ok for o in outcomes):  # something may still be running: say so in the code
        raise SystemExit(errors.EXIT_FAILED)


@contextlib.contextmanager
def _progress_bars():
    """A `progress(done, total, stage)` callback drawing one rich bar per stage on stderr when
    it is a terminal (drawn from the caller's thread: no refresh thread beside worker forks)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    console = Console(stderr=True)
    bars = Progress("{task.description}", BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), console=console, auto_refresh=False,
                    disable=not console.is_terminal)
    tasks: dict[str, int] = {}

    def progress(done: int, total: int, stage: str) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total)
        bars.update(tasks[stage], completed=done, total=total, refresh=True)

    with bars:
        yield progress


@cli.group()
def data() -> None:
    """Datasets: turn the official archives into the layout the recipes read, and upload it.

    \b
    Examples:
      cloudtrain data prepare imagenet ~/ILSVRC2012 /data/imagenet
      cloudtrain data push /data/imagenet s3://my-bucket/imagenet
      cloudtrain data ls
    """


@data.command("ls")
@click.option("--check", is_flag=True, help="Read each S3 dataset's manifest (or listing) now "
              "for its size, with your AWS credentials.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_WIDE
def data_ls(check, as_json, wide) -> None:
    """List the datasets declared in config.yaml: source, size, and where each was last staged."""
    from . import datasets, providers

    settings = config.Settings.load()
    with _store() as store:
        rows = datasets.listing(store, settings, providers.get("aws", settings) if check else None)
    click.echo(catalog_views.datasets_json(rows) if as_json else
               catalog_views.datasets_table(rows, width=_width(wide)))


@data.command("prepare")
@click.argument("dataset", metavar="DATASET")
@click.argument("src", type=click.Path(file_okay=False, path_type=str))
@click.argument("dest", type=click.Path(file_okay=False, path_type=str))
@click.option("--sizes", default="160,352", show_default=True, metavar="N,N",
              help="Also write copies with the shorter side resized to each N ('' for none).")
@click.option("--quality", type=click.IntRange(1, 100), default=90, show_default=True,
              help="JPEG quality of the resized copies (full-size files are linked, not "
                   "re-encoded).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes (default: one per CPU).")
@click.option("--blacklist", metavar="FILE", help="The devkit's "
              "ILSVRC2012_validation_blacklist.txt: leave those validation images out.")
@click.option("--labels", metavar="FILE", help="Validation labels for a flat val/ folder: "
              "LOC_val_solution.csv or '<image> <wnid>' lines (default: SRC/LOC_val_solution.csv).")
def data_prepare(dataset, src, dest, sizes, quality, workers, blacklist, labels) -> None:
    """Prepare DATASET from its extracted archives in SRC into DEST (resumable).

    For imagenet, SRC holds train/<wnid>/ (or the per-class train/<wnid>.tar files) and val/
    (flat with LOC_val_solution.csv, or sorted by wnid). DEST gets train/<wnid>/ and
    val/<wnid>/ at full size plus sz/<N>/train and sz/<N>/val for each --sizes N. Run it again
    after an interruption: it writes only what is missing.

    \b
    Examples:
      cloudtrain data prepare imagenet ~/ILSVRC2012 /data/imagenet
      cloudtrain data prepare imagenet ~/ILSVRC2012 /data/imagenet --sizes 160 \\
          --blacklist ~/devkit/data/ILSVRC2012_validation_blacklist.txt
    """
    from . import dataprep

    with _progress_bars() as progress:
        report = dataprep.prepare(dataset, src, dest, sizes=dataprep.parse_sizes(sizes),
                                  quality=quality, workers=workers, blacklist=blacklist,
                                  labels=labels, progress=progress)
    click.echo(catalog_views.prepare_report(report))



@data.command("push")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=str))
@click.argument("url", metavar="s3://BUCKET/PREFIX")
@click.option("--shard-mb", type=int, default=256, show_default=True,
              help="Target size of each tar shard (a larger file is a shard of its own).")
@click.option("--workers", type=int, default=8, show_default=True,
              help="Shards made and uploaded at a time (each a temporary file while it goes).")
@click.option("--region", callback=_region, help="The bucket's AWS region (default: the AWS "
              "profile's, or config.yaml's).")
def data_push(directory, url, shard_mb, workers, region) -> None:
    """Upload the prepared tree DIR to S3 as tar shards plus a manifest (resumable).

    Shards go to PREFIX/shards/shard-NNNNN.tar, each with its sha256, and PREFIX/manifest.json
    is written last: its presence means the dataset is complete. Run it again after an
    interruption, or after changing the tree: shards already stored with the same sha256 are
    not uploaded again. Hidden files and folders (.prepare/) are left out.

    \b
    Example:
      cloudtrain data push /data/imagenet s3://my-bucket/imagenet
    """
    from . import datasets, providers

    with _progress_bars() as progress:
        root, bucket, prefix = datasets.check_push(directory, url, shard_mb, workers, region)
        report = providers.get("aws").push_dataset(root, bucket, prefix, shard_mb=shard_mb,
                                                   workers=workers, region=region,
                                                   progress=progress)
    click.echo(catalog_views.push_report(report))

@cli.group(name="supervisor")
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
    from .lifecycle import supervisor

    info = supervisor.state_of(config.home())
    with _store() as store:
        needed = supervisor.needed(store)
    click.echo(job_views.supervisor_json(info) if as_json else
               job_views.supervisor_line(info, needed=needed))


@supervisor_group.command(name="start")
def supervisor_start() -> None:
    """Start it now (any command starts it when a recovering job needs it)."""
    from .lifecycle import supervisor

    with _store() as store:
        line = supervisor.ensure(store)
    info = supervisor.state_of(config.home())
    click.echo(line or job_views.supervisor_line(info))


@supervisor_group.command(name="stop")
def supervisor_stop() -> None:
    """Stop it (the next command restarts it while recovering jobs need it)."""
    from .lifecycle import supervisor

    click.echo("stopped" if supervisor.stop(config.home()) else "not running")


@supervisor_group.command(name="run", hidden=True)
@click.option("--home", type=click.Path(), required=True)
@click.option("--handover", type=click.Path(), default=None)
def supervisor_run(home: str, handover: str | None) -> None:
    """The supervisor's loop (started inside tmux by `start`)."""
    from pathlib import Path

    from .lifecycle import recovery

    recovery.supervise(Path(home), Path(handover) if handover else None)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one place where errors become a line of text and an exit code."""
    argv = sys.argv[1:] if argv is None else argv
    argv, debug = _debug_first(argv)
    if debug:  # libraries' logs too (paramiko's handshake failures, D4), else kept quiet
        import logging

        logging.basicConfig(level=logging.INFO, format="%(name)s: %(levelname)s: %(message)s")
    try:
        cli.main(args=argv, prog_name="cloudtrain", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:  # `cloudtrain data`: its help
        exc.show()
        sys.exit(errors.EXIT_USAGE)
    except click.UsageError as exc:  # U20: one line, as every error of ours, not click's four
        command = exc.ctx.command_path if exc.ctx is not None else "cloudtrain"
        _fail(errors.UsageError(" ".join(exc.format_message().split()),
                                hint=f"{command} --help"))
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        # click turns a KeyboardInterrupt into Abort (after a newline of its own)
        cause = exc.__cause__ if isinstance(exc, click.exceptions.Abort) else exc
        if isinstance(cause, errors.Interrupted):  # what it left behind (U30)
            click.echo(f"interrupted: {cause.message}", err=True)
        else:
            click.echo("\ninterrupted", err=True)
        sys.exit(errors.EXIT_INTERRUPTED)
    except errors.CloudtrainError as exc:
        _fail(exc)
    except Exception as exc:
        if debug:
            raise
        known = _environment_error(exc)
        if known is not None:
            _fail(known)
        # a bug of ours: one line, and the traceback on request
        text = (str(exc).splitlines() or [""])[0][:300]
        click.echo(f"Error: internal error: {type(exc).__name__}: {text} "
                   "(run again with --debug for the traceback)", err=True)
        sys.exit(errors.EXIT_FAILED)
    sys.exit(errors.EXIT_OK)


def _debug_first(argv: list[str]) -> tuple[list[str], bool]:
    """--debug anywhere before `--` (D32: `cloudtrain ssh JOB --debug`, as the internal-error
    line suggests) moved to where the group's option is parsed; after `--` it is the job's."""
    end = argv.index("--") if "--" in argv else len(argv)
    if "--debug" not in argv[:end]:
        return argv, False
    return ["--debug", *(a for a in argv[:end] if a != "--debug"), *argv[end:]], True


def _fail(exc: errors.CloudtrainError) -> None:
    click.echo(f"Error: {cells.error_line(exc.message)}", err=True)
    if exc.hint:  # a hint may be laid out on several lines of ours (a config.yaml example)
        click.echo("Hint: " + "\n".join(cells.error_line(line)
                                        for line in exc.hint.split("\n")), err=True)
    sys.exit(exc.exit_code)


def _environment_error(exc: Exception) -> errors.CloudtrainError | None:
    """Failures that are the environment's, not a bug of ours, as designed errors: the state
    database unusable mid-command, the disk full or a file of ours not ours to write, input
    nested too deeply to read."""
    import errno
    import sqlite3

    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.ProgrammingError):
        from .state import database_error

        try:
            path = config.home() / "state.db"
        except errors.CloudtrainError as home_error:
            return home_error
        return database_error(path, exc)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS,
                                                  errno.EACCES, errno.EPERM):
        where = f": {exc.filename}" if exc.filename else ""
        return errors.CloudtrainError(f"{exc.strerror or exc}{where}",
                                      hint="free some space or fix the permissions, then run "
                                           "the command again")
    if isinstance(exc, RecursionError):
        return errors.UsageError("an input is nested too deeply to read (a YAML or JSON file, "
                                 "or an argument)")
    return None
