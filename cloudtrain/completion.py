"""Shell completion's answers (click's `shell_complete` callbacks): job ids and names,
recipes, their profiles and `--set` keys, instance types, GPU:N, job states, job files.

Enable it in bash, zsh or fish as the README says (`_CLOUDTRAIN_COMPLETE=bash_source
cloudtrain`, ...). Each callback runs at every Tab: it reads the local store and the bundled
files only (never the cloud), and answers nothing rather than raise, since anything it
printed would land in the user's command line. A candidate's help text (zsh and fish show
it) is one clean line: it may hold what a job file said.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Callable

from click.shell_completion import (BashComplete, CompletionItem, add_completion_class,
                                    split_arg_string)

MAX_JOBS = 200  # the most recent; more is not a menu anyone reads
MAX_FILES = 200  # job files offered from one folder
HELP_LEN = 60
# Of bash's default COMP_WORDBREAKS, the characters our candidates hold: KEY=VALUE, GPU:N.
WORDBREAKS = "=:"


class _BashLine(BashComplete):
    """click's bash completion, reading the line as it was typed. Bash splits the word
    being completed at COMP_WORDBREAKS: for `--set variant=da` COMP_WORDS holds `variant`,
    `=`, `da`, so click took `variant` for --set's value and completed nothing. The script
    also passes COMP_LINE and COMP_POINT; the words are split from those (as the shell will
    parse them), and each answer is cut to what bash replaces, the part after the word's last
    `=` or `:`. Without COMP_LINE (an older script), click's own way."""

    source_template = BashComplete.source_template.replace(
        "env COMP_WORDS=", 'env COMP_LINE="$COMP_LINE" COMP_POINT="$COMP_POINT" COMP_WORDS=')
    _replaced = ""  # the start of the word that bash keeps (up to its last `=` or `:`)

    def get_completion_args(self) -> tuple[list[str], str]:
        line = os.environ.get("COMP_LINE")
        if not line:
            return super().get_completion_args()
        try:
            point = min(int(os.environ.get("COMP_POINT") or len(line)), len(line))
        except ValueError:
            point = len(line)
        typed = line[:point]
        words = split_arg_string(typed)
        if not words or typed[-1:].isspace():
            args, incomplete = words[1:], ""
        else:
            args, incomplete = words[1:-1], words[-1]
        self._replaced = incomplete[:max(incomplete.rfind(c) for c in WORDBREAKS) + 1]
        return args, incomplete

    def format_completion(self, item: CompletionItem) -> str:
        if self._replaced and item.type == "plain" and item.value.startswith(self._replaced):
            item = CompletionItem(item.value[len(self._replaced):], type=item.type,
                                  help=item.help)
        return super().format_completion(item)


add_completion_class(_BashLine)


def _help(text: str) -> str:
    """A candidate's help: one line, no control characters."""
    from .hostdata import clean_text

    return clean_text(text, HELP_LEN)


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
            what = _help(f"{job.state}: {job.command}")
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
        return [CompletionItem(f"{name}=", help=_help(arg.help or ""))
                for name, arg in recipe.arguments.items() if name.startswith(key)]
    arg = recipe.arguments.get(key)
    if arg is None:
        return []
    options = [str(c) for c in arg.choices] if arg.choices else \
        ["true", "false"] if arg.type == "bool" else []
    return [CompletionItem(f"{key}={o}") for o in options if o.startswith(value)]


@_quiet
def instance_types(ctx, param, incomplete: str) -> list[CompletionItem]:
    """The catalog's GPU instance types, with their GPUs: those the Deep Learning AMI runs on
    (x86_64; an arm64 type is refused without an --ami built for it), all with --ami."""
    from . import catalog

    any_arch = bool((ctx.params or {}).get("ami"))
    return [CompletionItem(t.name, help=f"{t.gpus:g} x {t.gpu}")
            for t in sorted(catalog.load().values(), key=lambda t: t.name)
            if t.name.startswith(incomplete) and (any_arch or t.arch == catalog.DEFAULT_ARCH)]


@_quiet
def gpus(ctx, param, incomplete: str) -> list[CompletionItem]:
    """`GPU:N` for every GPU and whole count the catalog has on types --gpus may pick (the
    Deep Learning AMI's architecture, x86_64: T4g's arm64 g5g types are refused), with the
    types that have it."""
    from . import catalog

    found: dict[str, list[str]] = {}
    for t in catalog.load().values():
        if t.gpus >= 1 and t.gpus == int(t.gpus) and t.arch == catalog.DEFAULT_ARCH:
            found.setdefault(f"{t.gpu}:{t.gpus:g}", []).append(t.name)
    return [CompletionItem(key, help=_help(", ".join(sorted(names))))
            for key, names in sorted(found.items())
            if key.lower().startswith(incomplete.lower())]


@_quiet
def states(ctx, param, incomplete: str) -> list[CompletionItem]:
    """Job states; after a comma (`--state running,fa`), the next one."""
    from .state import ACTIVE_STATES, TERMINAL_STATES

    head, comma, last = incomplete.rpartition(",")
    before = head + comma
    return [CompletionItem(before + s) for s in (*ACTIVE_STATES, *TERMINAL_STATES)
            if s.startswith(last) and s not in head.split(",")]


@_quiet
def job_files(ctx, param, incomplete: str) -> list[CompletionItem]:
    """`launch`'s first word: the job files (*.yaml, *.yml) in the folder typed so far (this
    one by default). Later words are your command's: the shell's own file completion."""
    if ctx.params.get(param.name):
        return [CompletionItem(incomplete, type="file")]
    folder = incomplete[:incomplete.rfind("/") + 1]
    stem = incomplete[len(folder):]
    out = []
    with os.scandir(Path(folder or ".")) as entries:
        for entry in entries:
            name = entry.name
            if (name.startswith(stem) and (stem.startswith(".") or not name.startswith("."))
                    and name.endswith((".yaml", ".yml")) and entry.is_file()):
                out.append(CompletionItem(folder + name, help="job file"))
            if len(out) >= MAX_FILES:
                break
    return sorted(out, key=lambda item: item.value)
