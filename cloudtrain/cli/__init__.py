"""The `cloudtrain` command: parse, call one library function, render. No logic here.

This file holds the command group, the order of its commands and `main`, the one place where
errors become a line of text and an exit code; each command sits in the module of its concern
(launching, inspection, removal, data, planning, supervisor), each of which may import the
shared options and terminal helpers beside it, and the library below the CLI, never this file.
"""

from __future__ import annotations

import sys

import click

from .. import cells, config, errors
from . import data, inspection, launching, planning, removal, supervisor
from .options import CONTEXT


# What SkyPilot, dstack and docker users type first, and what does it here.
OTHER_TOOLS_VERBS = {
    "queue": "cloudtrain status (a job queued on a kept instance shows as queued; "
             "`cloudtrain launch --on JOB` queues one)",
    "ps": "cloudtrain status", "ls": "cloudtrain status",
    "list": "cloudtrain status", "jobs": "cloudtrain status",
    "cancel": "cloudtrain down JOB", "stop": "cloudtrain down JOB",
    "kill": "cloudtrain down JOB", "terminate": "cloudtrain down JOB",
    "exec": "cloudtrain launch --on JOB -- CMD (a job on JOB's kept instance, queued behind "
            "the one running there); one command now: cloudtrain ssh JOB -- CMD",
    "port-forward": "cloudtrain forward JOB PORT[:LOCAL]",
    "tunnel": "cloudtrain forward JOB PORT[:LOCAL]",
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
        from ..lifecycle import supervisor

        line = supervisor.watchdog()  # recovering jobs need it running
        if line:
            click.echo(line, err=True)


# `cloudtrain --help` lists them by name; the order here is the modules'.
for command in (launching.launch, inspection.status, inspection.logs, inspection.attach,
                inspection.ssh, inspection.forward, inspection.metrics, inspection.plot, inspection.ui,
                removal.down, removal.rm,
                removal.prune, planning.recipes, planning.catalog, planning.estimate,
                planning.cost_report, planning.check, planning.init, data.data,
                supervisor.supervisor_group):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one place where errors become a line of text and an exit code."""
    argv = sys.argv[1:] if argv is None else argv
    argv, debug = _debug_first(argv)
    if debug:  # libraries' logs too (paramiko's handshake failures), else kept quiet
        import logging

        logging.basicConfig(level=logging.INFO, format="%(name)s: %(levelname)s: %(message)s")
    try:
        cli.main(args=argv, prog_name="cloudtrain", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:  # `cloudtrain data`: its help
        exc.show()
        sys.exit(errors.EXIT_USAGE)
    except click.UsageError as exc:  # one line, as every error of ours, not click's four
        command = exc.ctx.command_path if exc.ctx is not None else "cloudtrain"
        _fail(errors.UsageError(" ".join(exc.format_message().split()),
                                hint=f"{command} --help"))
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        # click turns a KeyboardInterrupt into Abort (after a newline of its own)
        cause = exc.__cause__ if isinstance(exc, click.exceptions.Abort) else exc
        if isinstance(cause, errors.Interrupted):  # what it left behind
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
    """--debug anywhere before `--` (`cloudtrain ssh JOB --debug`, as the internal-error
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
        from ..state import database_error

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
