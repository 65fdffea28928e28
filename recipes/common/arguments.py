"""The command-line convention of the bundled recipes, stdlib only (a recipe parses its
arguments and prints its first line before importing torch).

Every recipe.yaml argument `name` is accepted as `--name` and, when it has an underscore, as
`--name-with-dashes` too; booleans are written true/false (also yes/no, 1/0, on/off), as the
orchestrator renders them.
"""
from __future__ import annotations

import argparse

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def adder(parser: argparse.ArgumentParser):
    """`arg(name, **kw)`: add `--name` (and `--name-with-dashes`) with dest `name`."""
    def arg(name: str, **kw) -> None:
        flags = [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])
        parser.add_argument(*flags, dest=name, **kw)
    return arg
