"""launch's command line when click finds an option it does not know: what the user most
likely meant, as a hint that never changes what runs.

`cloudtrain launch python train.py --epochs 1` is the user's own command given without `--`:
the hint puts `--` before the command and keeps launch's own options (`--dry-run`, `--spot`,
wherever they were typed) in front of it, so a dry run stays a dry run. With a recipe, an
unknown `--epochs 3` is a recipe argument: the hint is `--set epochs=3`, when the recipe has
that argument. An unknown option before any command word is just not an option of launch:
no `--` is suggested there; a script the command names that is here adds `--workdir .`.
Pure functions of the words; no click, no I/O but the recipe's arguments and what
the caller's `script_here` looks at.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex


@dataclasses.dataclass(frozen=True)
class Options:
    """launch's own option words: those that take a value, and flags."""
    valued: frozenset[str]
    flags: frozenset[str]

    def known(self, word: str) -> bool:
        return word.split("=", 1)[0] in self.valued | self.flags


@dataclasses.dataclass(frozen=True)
class Advice:
    message: str
    hint: str | None


def _command_start(words: list[str], options: Options) -> int | None:
    """The first word that is neither an option nor an option's value: where the user's own
    command (or a job file) starts."""
    i = 0
    while i < len(words):
        word = words[i]
        if word in options.valued:
            i += 2
            continue
        if not word.startswith("-") or word == "-":
            return i
        i += 1
    return None


def _split_launch_options(words: list[str], options: Options) -> tuple[list[str], list[str]]:
    """Words after the command starts, split into launch's own options (each with its value)
    and the rest, in order."""
    ours, theirs = [], []
    i = 0
    while i < len(words):
        word = words[i]
        if word in options.valued and i + 1 < len(words):
            ours += words[i:i + 2]
            i += 2
            continue
        if options.known(word) and (word in options.flags or "=" in word):
            ours.append(word)
        else:
            theirs.append(word)
        i += 1
    return ours, theirs


def _recipe_of(words: list[str]) -> str | None:
    for i, word in enumerate(words):
        if word in ("--recipe", "-r") and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--recipe="):
            return word.split("=", 1)[1]
    return None


def _recipe_argument(words: list[str], at: int, recipe: str) -> Advice:
    """An unknown `--key value` (or `--key=value`) given with --recipe: `--set key=value`."""
    word = words[at]
    name, eq, value = word.lstrip("-").partition("=")
    key = name.replace("-", "_")
    message = f"{word.split('=', 1)[0]} is not an option of cloudtrain launch"
    try:
        from . import recipes

        arguments = recipes.load(recipe).arguments
    except Exception:  # an unknown or broken recipe is said by the launch itself, later
        return Advice(message + "; a recipe argument is --set KEY=VALUE",
                      f"cloudtrain recipes {shlex.quote(recipe)} lists them")
    if key not in arguments:
        close = difflib.get_close_matches(key, list(arguments), n=1)
        return Advice(message + f", nor an argument of the {recipe} recipe"
                      + (f" (did you mean --set {close[0]}=...?)" if close else ""),
                      f"cloudtrain recipes {shlex.quote(recipe)} lists its arguments")
    rest = words[at + 1:]
    if not eq:
        if rest and not rest[0].startswith("-"):
            value, rest = rest[0], rest[1:]
        elif arguments[key].type == "bool":
            value = "true"
        else:
            return Advice(message + f"; the recipe's argument is --set {key}=VALUE", None)
    fixed = words[:at] + ["--set", f"{key}={value}"] + rest
    return Advice(message + "; a recipe argument is --set KEY=VALUE",
                  "cloudtrain launch " + shlex.join(fixed))


def unknown_option(words: list[str], option: str, options: Options,
                   is_job_file=lambda word: False, script_here=lambda words: None
                   ) -> Advice | None:
    """What to say of `option`, which click does not know, in launch's `words` (everything
    after `launch`, no `--` among them). None: click's own message is as good.
    `script_here(command)`: a script of the command that is in this directory
    (preflight.script_here), which the hint adds `--workdir .` for."""
    at = next((i for i, w in enumerate(words) if w == option or w.startswith(option + "=")),
              None)
    if at is None:
        return None
    start = _command_start(words, options)
    recipe = _recipe_of(words)
    job_file = start is not None and is_job_file(words[start])
    if recipe is not None and (start is None or at < start):
        return _recipe_argument(words, at, recipe)
    if start is None or at < start:
        close = difflib.get_close_matches(option, sorted(options.valued | options.flags), n=1)
        return Advice(f"{option} is not an option of cloudtrain launch"
                      + (f" (did you mean {close[0]}?)" if close else ""),
                      "cloudtrain launch --help lists them; your own command goes after --")
    if job_file:
        return Advice(f"{option} is not an option of cloudtrain launch",
                      "a recipe argument is --set KEY=VALUE; launch's options go before or "
                      "after the job file (cloudtrain launch --help)")
    ours, theirs = _split_launch_options(words[start:], options)
    given = words[:start] + ours
    if not any(w in ("--workdir", "-w") or w.startswith("--workdir=") for w in given) \
            and script_here(theirs):  # without it the job runs in an empty directory
        given += ["--workdir", "."]
    fixed = given + ["--"] + theirs
    return Advice(f"{option} is not an option of cloudtrain launch; your own command goes "
                  "after --", "cloudtrain launch " + shlex.join(fixed))
