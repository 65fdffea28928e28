"""What the CLI prints for its help and for the README's dry runs, written to a folder, or
compared with one written before: a restructuring (issue 26) must leave every byte as it was.

Every `--help` (the group's and each command's and subcommand's), and `launch ... --dry-run`
of the README's launch examples plus `estimate` of its examples, each run as a fresh
`python -m cloudtrain` in an empty CLOUDTRAIN_HOME at a fixed path, with no AWS
configuration (no credentials, us-east-1 by default), COLUMNS=100, so that two runs on this
machine print the same bytes.

Usage: python benchmarks/cli_outputs.py --write DIR
       python benchmarks/cli_outputs.py --compare DIR     (exit 1 and a diff on any change)
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOME = Path("/tmp/cloudtrain-cli-outputs-home")
WORK = Path("/tmp/cloudtrain-cli-outputs-work")

DRY_RUNS = [
    ["launch", "--recipe", "resnet9", "--dry-run"],
    ["launch", "--recipe", "resnet9", "--set", "variant=dawn", "--name", "dawn24", "--dry-run"],
    ["launch", "--workdir", ".", "--dry-run", "--", "python", "train.py", "--lr", "0.1"],
    ["launch", "--recipe", "resnet9", "--profile", "smoke", "--dry-run"],
    ["launch", "--recipe", "imagenet", "--profile", "smoke", "--dry-run"],
    ["launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--spot", "--dry-run"],
    ["launch", "--recipe", "resnet9", "--instance", "g6.xlarge", "--keep", "--dry-run"],
    ["launch", "--recipe", "imagenet", "--set", "variant=machines-4", "--instance",
     "p4d.24xlarge", "--spot", "--dry-run"],
    ["launch", "--recipe", "imagenet", "--set", "variant=machines-16", "--instance",
     "p4d.24xlarge", "--spot", "--dry-run"],
    ["launch", "--nodes", "2", "--instance", "g5.12xlarge", "--workdir", ".", "--dry-run", "--",
     "bash", "train.sh"],
    ["launch", "--recipe", "resnet9", "--gpus", "L4:1", "--spot", "--region", "us-east-1",
     "--dry-run"],
    ["launch", "--recipe", "resnet9", "--set", "gpus=8", "--gpus", "A100:8", "--dry-run"],
    ["launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--spot", "--max-restarts", "5",
     "--fallback", "on-demand", "--dry-run"],
    ["launch", "job.yaml", "--dry-run"],
    ["estimate", "--recipe", "resnet9"],
    ["estimate", "--recipe", "imagenet", "--instance", "g6e.48xlarge", "--instance",
     "p4d.24xlarge", "--spot"],
    ["estimate", "--recipe", "airbench94", "--gpus", "A10G:1", "--spot"],
    ["recipes"],
    ["recipes", "resnet9"],
    ["catalog", "--gpu", "A100"],
    ["status"],
    ["cost-report"],
]

JOB_FILE = """\
name: cifar-run
workdir: .
setup: pip install -r requirements.txt
run: python train.py --epochs 30
envs: {WANDB_PROJECT: cifar}
outputs: [results]
resources: {instance: g5.xlarge, spot: true, max_runtime: 2h}
"""


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CLOUDTRAIN_"))}
    # The checkout this script is in, not whatever `cloudtrain` the Python finds from the
    # scratch folder it runs in (an editable install of another checkout).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(CLOUDTRAIN_HOME=str(HOME), HOME=str(WORK), COLUMNS="100", NO_COLOR="1",
               AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE="/nonexistent",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent", LC_ALL="C.UTF-8", TZ="UTC")
    return env


def run(argv: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", *argv], capture_output=True,
                          text=True, env=environment(), cwd=WORK, timeout=120)
    return f"$ cloudtrain {' '.join(argv)}\n[exit {proc.returncode}]\n{proc.stdout}" \
           f"[stderr]\n{proc.stderr}"


def commands() -> list[list[str]]:
    """Every command path of the click tree, from the group down."""
    sys.path.insert(0, str(REPO))
    import click

    from cloudtrain.cli import cli

    out = []

    def walk(cmd, path):
        out.append(path)
        if isinstance(cmd, click.Group):
            for name in sorted(cmd.commands):
                if not cmd.commands[name].hidden:
                    walk(cmd.commands[name], path + [name])

    walk(cli, [])
    return out


def outputs() -> dict[str, str]:
    shutil.rmtree(HOME, ignore_errors=True)
    shutil.rmtree(WORK, ignore_errors=True)
    HOME.mkdir(parents=True)
    WORK.mkdir(parents=True)
    (WORK / "train.py").write_text("print('trained')\n")
    (WORK / "train.sh").write_text("python train.py\n")
    (WORK / "job.yaml").write_text(JOB_FILE)
    got = {}
    for path in commands():
        got["help " + " ".join(path)] = run([*path, "--help"])
    for argv in DRY_RUNS:
        got[" ".join(argv)] = run(argv)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--write", metavar="DIR")
    which.add_argument("--compare", metavar="DIR")
    args = parser.parse_args()
    got = outputs()
    if args.write:
        folder = Path(args.write)
        folder.mkdir(parents=True, exist_ok=True)
        for n, (name, text) in enumerate(sorted(got.items())):
            (folder / f"{n:03d}.txt").write_text(text)
        print(f"wrote {len(got)} outputs to {folder}")
        return
    before = {}
    for f in sorted(Path(args.compare).glob("*.txt")):
        text = f.read_text()
        before[text.splitlines()[0][len("$ cloudtrain "):]] = text
    now = {text.splitlines()[0][len("$ cloudtrain "):]: text for text in got.values()}
    changed = 0
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            changed += 1
            sys.stdout.writelines(difflib.unified_diff(
                (before.get(key) or "").splitlines(True), (now.get(key) or "").splitlines(True),
                f"before: {key}", f"now: {key}"))
    print(f"{len(now)} outputs, {changed} changed")
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
