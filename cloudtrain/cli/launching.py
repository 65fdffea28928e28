"""`cloudtrain launch`: the options as one LaunchOptions, its plan or its launch, rendered.

Imports the terminal helpers and the shared options of this package; the job file, the spec
and the lifecycle's plan and launch stages when it runs."""

from __future__ import annotations

import sys

import click

from .. import catalog_views, completion, config, errors, job_views
from .options import CONTEXT, duration, money, when
from .terminal import confirm, follow_job, job_store, said, table_width


class _LaunchCommand(click.Command):
    """`launch`: an option click does not know, after words of a command given without `--`
    (`cloudtrain launch python train.py --epochs 1`), is the user's own option."""

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
            from ..cmdline import Options, unknown_option
            from ..jobfile import is_job_file
            from ..preflight import script_here

            opts = [p for p in self.params if isinstance(p, click.Option)]
            options = Options(
                valued=frozenset(o for p in opts if not p.is_flag for o in p.opts),
                flags=frozenset(o for p in opts if p.is_flag
                                for o in (*p.opts, *p.secondary_opts)) | {"-h", "--help"})
            advice = unknown_option(typed, exc.option_name, options, is_job_file, script_here)
            if advice is None:
                raise
            raise errors.UsageError(advice.message, hint=advice.hint) from None


@click.command(cls=_LaunchCommand, context_settings={**CONTEXT, "ignore_unknown_options": False})
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
@click.option("--max-runtime", metavar="DURATION", callback=duration,
              help="Stop the job after this long: minutes, or 90m, 2h, 1d, 45s (default: the "
              "recipe's, else config).")
@click.option("--instance", "-i", "instance_type", metavar="TYPE",
              shell_complete=completion.instance_types,
              help="EC2 instance type, e.g. g5.xlarge (implies --backend aws).")
@click.option("--gpus", metavar="GPU:N", shell_complete=completion.gpus,
              help="Instead of --instance: the cheapest type with N of "
              "that GPU (e.g. A10G:1, A100:8) in the allowed regions.")
@click.option("--procs", type=int, metavar="N", help="Processes per host for torchrun recipes "
              "(default: one per GPU on the host, one without GPUs).")
@click.option("--nodes", type=int, metavar="N", help="Machines the job spans: one torchrun job "
              "over N instances in one AZ and placement group (default: the recipe variant's "
              "published count on a cloud, else 1).")
@click.option("--spot/--on-demand", "spot", default=None,
              help="Spot (one-time, terminated on interruption) or on-demand (default).")
@click.option("--recover/--no-recover", "recover", default=None,
              help="Spot: on an interruption, continue on a new instance from the last "
              "checkpoint (default for --spot). AWS Auto Scaling relaunches it where "
              "`instance_profile:` is set in config.yaml; else a supervisor on this machine "
              "does, only while this machine is on.")
@click.option("--max-restarts", type=int, metavar="N",
              help="Spot recovery: relaunch at most N times (default 3).")
@click.option("--fallback", type=click.Choice(["on-demand"]),
              help="Spot recovery: take an on-demand instance when no spot capacity is left.")
@click.option("--region", help=f"AWS region (default: {config.REGION_DEFAULT}).")
@click.option("--ami", help="AMI id (default: the current AWS Deep Learning PyTorch AMI).")
@click.option("--disk-gb", type=click.IntRange(min=8, max=config.GP3_MAX_GB),
              help="Root volume size (default: the recipe's).")
@click.option("--max-price", type=float, metavar="USD", help="Spot: the most to pay per hour.")
@click.option("--reservation", metavar="CR-ID", help="Launch into capacity you hold: an "
              "On-Demand Capacity Reservation (priced on-demand) or a Capacity Block for ML "
              "(priced from its fee; its instances end 30 min before the block does), cr-…; "
              "its type unless --instance.")
@click.option("--block-fee", callback=money, metavar="USD", help="What that Capacity Block "
              "cost (EC2 does not show it after the purchase; else today's offering is used).")
@click.option("--budget", callback=money, metavar="USD", help="The most the job may "
              "cost, every attempt, volume and staging included (25 or $25). Its own "
              "instances keep it, laptop closed or not: before the next checkpoint would cross "
              "it they save, upload and end the job (stopped: budget); no replacement starts.")
@click.option("--deadline", callback=when, metavar="TIME", help="When the job must have "
              "finished: '2026-12-05 09:00' (local), 2026-12-05T09:00Z, or +6h. A spot job "
              "stays on spot while its work left fits before it, then goes on-demand; the "
              "plan says when and why.")
@click.option("--keep/--no-keep", "keep", default=None, help="Keep the instance after the job "
              "for `ssh` and `launch --on` (--on keeps by default): it bills until it powers "
              "itself off after --idle-minutes idle (keep_idle_minutes: 60), or `cloudtrain "
              "down JOB`. --no-keep: power it off after the job.")
@click.option("--idle-minutes", type=float, help="A kept instance: power it off after this "
              "many minutes with no job (each `launch --on` job re-arms it); else: wait this "
              "long after the job before powering off.")
@click.option("--on", "on_job", metavar="JOB", shell_complete=completion.jobs,
              help="Run on that job's kept instance (--keep): no provisioning, only changed "
              "files synced; queued behind the job running there, if any.")
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
def launch(dry_run: bool, yes: bool, follow: bool, quiet: bool, **flags) -> None:
    """Launch a recipe, or your own command after --, or a job file (job.yaml), and return
    with its job id.

    \b
    Examples:
      cloudtrain launch job.yaml
      cloudtrain launch job.yaml --spot --set epochs=30  (flags override it)
      cloudtrain launch --recipe resnet9 --profile smoke --follow
      cloudtrain launch --recipe resnet9 --set variant=dawn --set epochs=30
      cloudtrain launch --recipe resnet9 --resume-from 3f2a1b9c
      cloudtrain launch --workdir . -- python train.py --lr 0.1
      cloudtrain launch --recipe resnet9 --instance g5.xlarge --spot --dry-run
      cloudtrain launch --recipe resnet9 --set gpus=8 --gpus A100:8
      cloudtrain launch --recipe imagenet --gpus A100:8 \\
          --data imagenet=s3://bkt/imagenet
      cloudtrain launch --recipe imagenet --set variant=machines-4 \\
          --instance p4d.24xlarge --spot
      cloudtrain launch --nodes 2 --instance g5.12xlarge --workdir . \\
          -- bash train.sh
      cloudtrain launch --workdir . --setup 'pip install -r requirements.txt' \\
          --env WANDB_PROJECT=cifar --secret WANDB_API_KEY --output results \\
          -- python train.py

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
    from ..jobfile import for_launch
    from ..lifecycle import launch as launching
    from ..lifecycle import plan
    from ..progress import for_launch as phases
    from ..spec import build_spec

    ctx = click.get_current_context()
    settings = config.Settings.load()
    typed = {k for k in ctx.params
             if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}
    options = for_launch(flags, typed, ctx.meta.get("cloudtrain.before_dashdash", ()))
    spec = build_spec(options, settings)
    with job_store() as store:
        if dry_run:
            click.echo(catalog_views.plan(plan.plan(spec, store, settings),
                                          width=table_width(False)))
            return
        spec, found = plan.read_datasets(spec, settings)  # a missing dataset stops it here
        spec = ask_first(spec, store, yes, quiet)
        with phases(quiet, lambda line: click.echo(line, err=True)) as report:  # on stderr
            job = launching.launch(store, settings, spec, say=report, found=found)
        if quiet:
            click.echo(job.id)
        else:
            click.echo(job_views.launched_line(job), err=follow)
        if follow:
            follow_job(store, settings, job)
        elif not quiet:
            click.echo(f"  follow:  cloudtrain logs {job.id} --follow\n"
                       f"  attach:  cloudtrain attach {job.id}\n"
                       f"  stop:    cloudtrain down {job.id}")


def ask_first(spec, store, yes: bool, quiet: bool):
    """Before a launch: its expected time and cost, its warnings, and the questions a
    terminal is asked (a price, the values a job file takes from this shell, the
    credential-looking files --include sends). Returns the spec that keeps the estimate."""
    from ..lifecycle import plan

    spec, row = plan.expected(spec, store)
    if row is not None and not quiet:
        click.echo(said(catalog_views.estimate_line(row, spec.placement.market)), err=True)
    question = plan.question(spec, warn=lambda line: click.echo(said(f"WARNING: {line}"),
                                                                err=True))
    taking = plan.taken_from_shell(spec)
    if taking:
        confirm_sending(taking.said, taking.ask, refusal=taking.refusal)
    if question:
        confirm(question, yes)
    sending = plan.credentials_sent(spec)
    if sending:
        confirm_sending(sending)
    return spec


def confirm_sending(line: str, ask: str = "Send them?",
                    refusal: errors.UsageError | None = None) -> None:
    """What would send credentials (files --include sends, values a job file takes
    from this shell): asked in a terminal whatever -y says (default no); without one, the
    `refusal`, or else said in a WARNING."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        if refusal is not None:
            raise refusal
        click.echo(f"WARNING: {line}", err=True)
        return
    if not click.confirm(said(f"{line}. {ask}", room=len(" [y/N]: ")), default=False,
                         err=True):
        raise errors.CloudtrainError("not launched: nothing was created", exit_code=1)
