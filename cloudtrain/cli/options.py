"""Options and checks that several commands share: --wide, --node, --region, ...

Imports click and the settings (config, errors) only; a check that reads more imports it
when it runs."""

from __future__ import annotations

import click

from .. import config, errors


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def region_name(ctx, param, value: str | None) -> str | None:
    """--region of commands that only read prices: refused early if it is not a region name."""
    return None if value is None else config.check_region(value, "--region")


def given(ctx, param, value):
    """An option that, given, needs a value: `--gpus ''` is not the same as no --gpus."""
    for v in value if isinstance(value, tuple) else (value,):
        if v is not None and not v.strip():
            raise errors.UsageError(f"{param.opts[0]} needs a value, got {v!r}")
    return value


def since_age(ctx, param, value: str | None) -> str | None:
    """--since: a finite, non-negative age (`nan` would match nothing and say "no jobs")."""
    if value is not None:
        import time

        from ..ledger import parse_since

        now = time.time()
        start = parse_since(value, now)
        if start is not None:
            config.finite(now - start, f"--since {config.shown(value)}", low=0)
    return value


WIDE = click.option("--wide", is_flag=True, help="Every column at full length. Without it, "
                     "tables fit COLUMNS or the terminal (cut text ends in an ellipsis, optional "
                     "columns go); output piped to another program is never cut.")


def duration(ctx, param, value: str | None) -> float | None:
    """--max-runtime: minutes, or 90m, 2h, 1d, 45s, read as a job file's max_runtime."""
    if value is None:
        return None
    from ..jobfile import flag_minutes

    return flag_minutes(value, param.opts[0])


def money(ctx, param, value: str | None) -> float | None:
    """--budget: US dollars, 25 or $25, read as a job file's budget."""
    if value is None:
        return None
    from ..jobfile import flag_dollars

    return flag_dollars(value, param.opts[0])


def when(ctx, param, value: str | None) -> float | None:
    """--deadline: a time, read as a job file's deadline."""
    if value is None:
        return None
    from ..jobfile import flag_deadline

    return flag_deadline(value, param.opts[0])


def grace(ctx, param, value: float | None) -> float | None:
    return None if value is None else config.finite(value, "--grace (seconds)", low=0, high=3600)


NODE = click.option("--node", type=click.IntRange(min=0), default=0, show_default=True,
                     metavar="I", help="Which node of a job on several machines (0: the "
                     "rendezvous, where rank 0 runs).")
