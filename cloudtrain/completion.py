"""Shell completion's answers (click's `shell_complete` callbacks): job ids and names,
recipes, their profiles and `--set` keys, instance types.

Enable it in bash, zsh or fish as the README says (`_CLOUDTRAIN_COMPLETE=bash_source
cloudtrain`, ...). Each callback runs at every Tab: it reads the local store and the bundled
files only (never the cloud), and answers nothing rather than raise, since anything it
printed would land in the user's command line.
"""

from __future__ import annotations

import functools
from typing import Callable

from click.shell_completion import CompletionItem

MAX_JOBS = 200  # the most recent; more is not a menu anyone reads


def _quiet(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(ctx, param, incomplete: str) -> list[CompletionItem]:
        try:
            return fn(ctx, param, incomplete or "")
        except Exception:  # noqa: BLE001 - completion never shows an error
            return []
    return wrapper


@_quiet
def jobs(ctx, param, incomplete: str) -> list[CompletionItem]:
    """Job ids and names, newest first, each with its state and what it runs."""
    from . import config
    from .state import open_store

    path = config.home() / "state.db"
    if not path.exists():
        return []
    out, seen = [], set()
    with open_store(config.home()) as store:
        for job in store.jobs(limit=MAX_JOBS):
            what = f"{job.state}: {job.command}"[:60]
            for word in (job.id, job.name):
                if word and word.startswith(incomplete) and word not in seen:
                    seen.add(word)
                    out.append(CompletionItem(word, help=what))
    return out


@_quiet
def recipes(ctx, param, incomplete: str) -> list[CompletionItem]:
    from . import recipes as recipes_

    return [CompletionItem(name) for name in recipes_.names() if name.startswith(incomplete)]


def _recipe(ctx):
    from . import recipes as recipes_

    name = ctx.params.get("recipe")
    return recipes_.load(name) if name else None


@_quiet
def profiles(ctx, param, incomplete: str) -> list[CompletionItem]:
    """The profiles of the --recipe given before it on the line."""
    recipe = _recipe(ctx)
    if recipe is None:
        return []
    return [CompletionItem(p) for p in sorted(recipe.profiles) if p.startswith(incomplete)]


@_quiet
def set_keys(ctx, param, incomplete: str) -> list[CompletionItem]:
    """`KEY=` for the --recipe's arguments; after the `=`, the argument's choices (or true
    and false for a flag)."""
    recipe = _recipe(ctx)
    if recipe is None:
        return []
    key, eq, value = incomplete.partition("=")
    if not eq:
        return [CompletionItem(f"{name}=", help=(arg.help or "")[:60])
                for name, arg in recipe.arguments.items() if name.startswith(key)]
    arg = recipe.arguments.get(key)
    if arg is None:
        return []
    options = [str(c) for c in arg.choices] if arg.choices else \
        ["true", "false"] if arg.type == "bool" else []
    return [CompletionItem(f"{key}={o}") for o in options if o.startswith(value)]


@_quiet
def instance_types(ctx, param, incomplete: str) -> list[CompletionItem]:
    """The catalog's GPU instance types, with their GPUs."""
    from . import catalog

    return [CompletionItem(t.name, help=f"{t.gpus:g} x {t.gpu}")
            for t in sorted(catalog.load().values(), key=lambda t: t.name)
            if t.name.startswith(incomplete)]
