"""`cloudtrain init`: the commented job file it writes, for a recipe or for your own code.

Every key the example shows is one jobfile.KEYS knows (a test loads what it writes). Imports
the job file's reader and errors; recipes when it writes one for a recipe.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from .errors import UsageError
from .jobfile import is_job_file


def example(recipe=None, filename: str = "cloudtrain.yaml") -> str:
    """A commented job file: for `recipe` (a recipes.Recipe) its profiles and arguments; else
    for your own code. Every key it shows is in KEYS (a test loads what it writes)."""
    if recipe is not None:
        profiles = ", ".join(sorted(recipe.profiles)) or "none"
        profile = "smoke" if "smoke" in recipe.profiles else None
        args = []
        for name, arg in recipe.arguments.items():
            default = arg.render(arg.default) if arg.default is not None else None
            help_text = textwrap.shorten(str(arg.help or ""), 60, placeholder="...")
            args.append(f"  # {name}: {default if default not in (None, '') else '...'}"
                        + (f"    # {help_text}" if help_text else ""))
        head = (f"# cloudtrain job file: the {recipe.name} recipe. Run it with\n"
                f"#   cloudtrain launch {{file}}            (flags override it: --set, --spot, ...)\n"
                f"#   cloudtrain launch {{file}} --dry-run  (the plan and its price)\n"
                f"name: {recipe.name}-run\n"
                f"recipe: {recipe.name}\n"
                f"# profiles: {profiles}\n"
                + (f"profile: {profile}            # optional: leave it out (or --profile none) "
                   "for the full run\n" if profile else "")
                + "# args: the recipe's arguments (cloudtrain recipes "
                  f"{recipe.name}); uncomment to set\n"
                + "args:\n" + "\n".join(args) + "\n")
    else:
        head = ("# cloudtrain job file: your own code. Run it with\n"
                "#   cloudtrain launch {file}            (flags override it: --spot, --env, ...)\n"
                "#   cloudtrain launch {file} --dry-run  (the plan and its price)\n"
                "name: my-training-run\n"
                "workdir: .               # this file's directory (or one below it), synced "
                "(.gitignore honoured)\n"
                "setup: |                 # once per instance, before run, in the workdir\n"
                "  if [ -f requirements.txt ]; then python -m pip install -q -r requirements.txt; "
                "fi\n"
                "run: |                   # the job: $CLOUDTRAIN_JOB_DIR/metrics.jsonl rows "
                "show in status and plot\n"
                "  python train.py\n"
                "envs:                    # the job's environment (null: this shell's value)\n"
                "  PYTHONHASHSEED: 0\n"
                "# secrets:               # like envs, but never written to any file cloudtrain "
                "keeps\n"
                "#   WANDB_API_KEY: null\n"
                "# outputs: [results]     # files your code writes, brought home after the job\n")
    resources = ("resources:               # where it runs (default: this machine)\n"
                 "  # backend: aws         # implied by instance, gpus, spot or region\n"
                 "  # instance: g5.xlarge\n"
                 "  # gpus: A10G:1         # instead of instance: the cheapest type with these\n"
                 "  # spot: true\n"
                 "  # region: us-east-1\n"
                 "  # disk_gb: 100\n"
                 "  # nodes: 1\n"
                 + ("  # max_runtime: 2h      # default: the recipe's\n" if recipe is not None
                    else "  max_runtime: 2h\n"))
    return (head + resources).replace("{file}", filename)


def write_example(path: str, recipe_name: str | None = None, force: bool = False) -> str:
    """`cloudtrain init`: the example for a recipe (by name) or for your own code, written to
    `path` (never over an existing file without `force`); "-" returns the text instead."""
    recipe = None
    if recipe_name is not None:
        from . import recipes

        recipe = recipes.load(recipe_name)
    name = "cloudtrain.yaml" if path == "-" else Path(path).name
    text = example(recipe, name)
    if path == "-":
        return text
    if not is_job_file(path):
        raise UsageError(f"{path}: a job file's name ends in .yaml or .yml")
    target = Path(path)
    if target.exists() and not force:
        raise UsageError(f"{path} exists: not overwritten", hint="--force to replace it, or "
                                                                 "-o another.yaml")
    try:
        target.write_text(text)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    return ""
