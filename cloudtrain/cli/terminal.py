"""What the commands need of the terminal: table width, colours, asking, following output.

Imports click and the settings; the store, the lifecycle and rich when a command uses them."""

from __future__ import annotations

import os
import sys

import click

from .. import config, errors


def job_store():
    from ..state import open_store

    return open_store(config.home())


def echo_bytes(data: bytes, screen=None, last: bool = False) -> None:
    """A job's output to stdout: through `screen` (a hostdata.TerminalText) when given;
    `last`: the end of it (a character cut short there is shown too)."""
    if screen is not None:
        data = screen.feed(data) + (screen.flush() if last else b"")
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def output_screen(raw: bool = False):
    """On a terminal a job's output goes through hostdata.TerminalText (its escapes
    dropped, colours kept); piped, or with --raw, it is the bytes as they are."""
    if raw or not sys.stdout.isatty():
        return None
    from ..hostdata import TerminalText

    return TerminalText()


def table_width(wide: bool) -> int | None:
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


def rows_that_fit(limit: int | None) -> int | None:
    """status --watch in a terminal: at most the jobs that fit its height (a 20-line
    terminal got 23 lines and scrolled), with the header, the footer and the supervisor's
    line; piped, `limit` as given."""
    if not sys.stdout.isatty():
        return limit
    import shutil

    fit = max(1, shutil.get_terminal_size().lines - 4)
    return fit if limit is None else min(limit, fit)


def colored() -> bool:
    """Colours (job states) only in a terminal, and never with NO_COLOR set (no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") \
        and os.environ.get("TERM") != "dumb"


def settings_whatever_config_says():
    """The settings for a command that must work whatever config.yaml says (down, status,
    logs): a mistake there is a WARNING line on stderr, once, and that setting keeps its
    default."""
    click.get_current_context().with_resource(
        config.tolerating(lambda line: click.echo(line, err=True)))
    return config.Settings.load()


def confirm(question, yes: bool) -> None:
    """The warnings, on stderr whether or not anyone is there; then, ask in a
    terminal (unless --yes); without one (scripts, CI) go on."""
    for warning in question.warnings:
        click.echo(said(f"WARNING: {warning}"), err=True)
    if yes or not (sys.stdin.isatty() and sys.stderr.isatty()):
        return
    if not click.confirm(said(" ".join(filter(None, [question.text, "Proceed?"])),
                              room=len(" [Y/n]: ")), default=question.default, err=True):
        raise errors.CloudtrainError("not launched: nothing was created", exit_code=1)


def said(text: str, room: int = 0) -> str:
    """A line said on stderr before a launch (its estimate, a warning, the question): in a
    terminal, wrapped at its width with later lines indented (a 500-character question
    split words at the terminal's edge), `room` left for what follows (click's ` [Y/n]: `);
    piped, one line as it is."""
    if not sys.stderr.isatty():
        return text
    import shutil

    from ..cells import wrapped

    columns = os.environ.get("COLUMNS", "").strip()
    width = int(columns) if columns.isdigit() and int(columns) > 0 else \
        shutil.get_terminal_size().columns
    return "\n".join(wrapped(text, width - room, "", "  "))


def confirm_text(text: str) -> None:
    """A question in words (check --launch's): asked in a terminal, as a launch's is."""
    from ..providers.base import Question

    confirm(Question(text=text), yes=False)


def follow_job(store, settings, job, offset: int = 0, node: int = 0, screen=None) -> None:
    from ..lifecycle import inspect

    screen = screen or output_screen()
    try:
        for chunk in inspect.follow(store, settings, job, offset, node):
            echo_bytes(chunk, screen)
        echo_bytes(b"", screen, last=True)
    except KeyboardInterrupt:
        click.echo(f"\ndetached; job {job.id} keeps running. "
                   f"Stop it with: cloudtrain down {job.id}", err=True)
        raise SystemExit(errors.EXIT_INTERRUPTED)
    job = store.job(job.id)
    for line in inspect.ending(store, job):  # the outcome, a declared output not found
        click.echo(line, err=True)
    if job.state != "succeeded":
        raise SystemExit(errors.EXIT_FAILED)


def can_ask() -> bool:
    """Whether someone can answer a question: stdin and stderr (where it is asked) are a
    terminal."""
    return sys.stdin.isatty() and sys.stderr.isatty()


def nobody_to_ask(what: str, example: str) -> errors.UsageError:
    """What destroys is refused without a terminal to ask, unless -y says go on."""
    return errors.UsageError(f"{what} and there is no terminal to ask",
                             hint=f"add -y to go on without asking: {example}")


def watch_view(view, interval: float) -> None:
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
