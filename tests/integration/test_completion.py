"""Issue 16: shell completion, through the installed `cloudtrain` script and real bash."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = Path(sys.executable).parent / "cloudtrain"


def _env() -> dict:
    """This process's environment (CLOUDTRAIN_HOME is the test's), and the installed script
    importing this checkout, not the one it was installed from."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def _complete(line: str, env: dict | None = None) -> list[str]:
    """What click's bash completion answers for `line` (the cursor at its end)."""
    words = line.split(" ")
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60, env={
        **_env(), **(env or {}), "_CLOUDTRAIN_COMPLETE": "bash_complete",
        "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)})
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return [row.split(",", 1)[1] for row in proc.stdout.splitlines() if row]


@pytest.fixture
def two_jobs(cli):
    first = cli.launch("--name", "alpha-run", "--", "true")
    second = cli.launch("--name", "beta-run", "--", "true")
    cli.wait(first)
    cli.wait(second)
    return first, second


def test_job_ids_and_names_complete_for_every_job_argument(cli, two_jobs):
    """issue 16: job ids and names complete wherever a JOB is asked for."""
    first, second = two_jobs
    for line in ("cloudtrain status ", "cloudtrain logs ", "cloudtrain down ",
                 "cloudtrain launch --resume-from "):
        got = _complete(line)
        assert {first, second, "alpha-run", "beta-run"} <= set(got), (line, got)
    assert _complete("cloudtrain status al") == ["alpha-run"]
    assert _complete(f"cloudtrain status {second[:4]}") == [second]


def test_recipes_profiles_set_keys_and_instance_types_complete():
    """issue 16: recipes, the recipe's profiles and `--set` keys (then their choices), and
    the catalog's instance types."""
    assert _complete("cloudtrain launch --recipe air") == ["airbench94", "airbench95",
                                                          "airbench96"]
    assert "smoke" in _complete("cloudtrain launch --recipe resnet9 --profile ")
    keys = _complete("cloudtrain launch --recipe resnet9 --set ")
    assert "epochs=" in keys and "variant=" in keys and all(k.endswith("=") for k in keys)
    assert _complete("cloudtrain launch --recipe resnet9 --set device=c") == ["device=cpu",
                                                                              "device=cuda"]
    assert _complete("cloudtrain launch --set ep") == []  # no recipe: nothing to offer
    types = _complete("cloudtrain launch --instance p4")
    assert types and all(t.startswith("p4") for t in types)
    assert "resnet9" in _complete("cloudtrain recipes ")


def test_u55_gpus_and_instance_types_complete_only_what_launch_accepts(cli):
    """U55: `--gpus <Tab>` offered T4g:1 and T4g:2, whose g5g types are arm64: launch refuses
    them (the Deep Learning AMI is x86_64). Only what launch takes is offered; `--instance`
    offers the arm64 types once an --ami is given (one built for them may run there)."""
    offered = _complete("cloudtrain launch --gpus ")
    assert "A10G:1" in offered and "V100:8" in offered
    assert not [g for g in offered if g.startswith("T4g")], offered
    assert _complete("cloudtrain estimate --gpus T4") == ["T4:1", "T4:4", "T4:8"]
    types = _complete("cloudtrain launch --instance g5")
    assert "g5.xlarge" in types and not [t for t in types if t.startswith("g5g.")], types
    refused = cli("launch", "--gpus", "T4g:1", "--dry-run", "--", "true")
    assert refused.returncode == 2 and "arm64" in refused.stderr
    mine = _complete("cloudtrain launch --ami ami-0123456789abcdef0 --instance g5g.")
    assert "g5g.xlarge" in mine


def test_completion_of_a_broken_store_answers_nothing(ct_home):
    """issue 16: completion never prints an error into the command line."""
    (ct_home / "state.db").write_bytes(b"not a database" * 100)
    assert _complete("cloudtrain status ") == []


def test_bash_sources_the_script_and_completes(cli, two_jobs, tmp_path):
    """issue 16: the README's bash line works in a real bash: COMPREPLY gets the names."""
    rc = tmp_path / "rc.bash"
    script = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60,
                            env={**_env(), "_CLOUDTRAIN_COMPLETE": "bash_source"}).stdout
    assert "complete " in script
    rc.write_text(script + "\nCOMP_WORDS=(cloudtrain status al); COMP_CWORD=2\n"
                  "_cloudtrain_completion cloudtrain status al\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    proc = subprocess.run(["bash", str(rc)], capture_output=True, text=True, timeout=60,
                          env={**_env(), "PATH": f"{SCRIPT.parent}:{os.environ['PATH']}"})
    assert proc.stdout.split() == ["alpha-run"], (proc.stdout, proc.stderr)


# -- real bash at a terminal: what Tab does (U16), and what the help carries (F35) -------------


class _Bash:
    """An interactive bash on a pseudo-terminal with the README's completion line sourced:
    `tab(line)` types the line and Tab twice, and returns what bash then shows (a unique
    answer is put on the line; several are listed). Readline handles keys in order and runs
    the completion before the next key, so a key bound to print a marker, typed after the
    Tabs, says when bash has shown everything: no waiting for the terminal to go quiet."""

    MARK = b"<tab-done>"  # printf's output only: the typed command does not contain it

    def __init__(self, cwd: Path):
        import pty

        self.master, slave = pty.openpty()
        env = {**_env(), "PATH": f"{SCRIPT.parent}:{os.environ['PATH']}", "TERM": "dumb",
               "PS1": "$ ", "INPUTRC": "/dev/null"}
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], stdin=slave,
                                     stdout=slave, stderr=slave, cwd=cwd, env=env,
                                     start_new_session=True)
        os.close(slave)
        self.send(b'eval "$(_CLOUDTRAIN_COMPLETE=bash_source cloudtrain)"; '
                  b"bind -x '\"\\C-t\": printf \"<tab-%s>\\n\" done'; printf '<%s>\\n' sourced\n",
                  until=b"<sourced>\r\n$ ")

    def send(self, data: bytes, until: bytes) -> str:
        """Write `data`; read until `until` shows (a minute at most)."""
        import select
        import time

        os.write(self.master, data)
        out, deadline = b"", time.monotonic() + 60
        while until not in out:
            assert time.monotonic() < deadline, f"no {until!r} from bash in 60 s: {out!r}"
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                out += os.read(self.master, 65536)
        return out.decode("utf-8", "replace")

    def tab(self, line: str) -> str:
        shown = self.send(line.encode() + b"\t\t\x14", until=self.MARK)  # Ctrl-T: the marker
        self.send(b"\x15\x14", until=self.MARK)  # Ctrl-U: an empty line for the next one
        return shown[:shown.index(self.MARK.decode())]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self.master)


@pytest.fixture
def bash(tmp_path):
    shell = _Bash(tmp_path)
    yield shell
    shell.close()


def test_U16_set_completes_after_the_equals_sign_in_real_bash(bash):
    """U16: bash splits `variant=` at `=` (COMP_WORDBREAKS): the value after it completes."""
    assert "variant=dawn " in bash.tab("cloudtrain launch --recipe resnet9 --set variant=da")
    shown = bash.tab("cloudtrain launch --recipe resnet9 --set variant=")
    assert "bag-of-tricks" in shown and "dawn" in shown
    assert "device=cuda " in bash.tab("cloudtrain launch --recipe resnet9 --set device=cu")


def test_U16_launch_job_files_gpus_states_and_plot_output_complete_in_real_bash(bash, tmp_path):
    (tmp_path / "train-job.yaml").write_text("run: echo hi\n")
    (tmp_path / "other.yml").write_text("run: echo hi\n")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.yaml").write_text("run: echo hi\n")
    shown = bash.tab("cloudtrain launch ")
    assert "train-job.yaml" in shown and "other.yml" in shown and "notes.txt" not in shown
    assert "cloudtrain launch train-job.yaml " in bash.tab("cloudtrain launch tr")
    assert "cloudtrain launch sub/deep.yaml " in bash.tab("cloudtrain launch sub/d")
    shown = bash.tab("cloudtrain estimate --recipe resnet9 --gpus A100")
    assert "A100:8" in shown, shown
    shown = bash.tab("cloudtrain launch --gpus V100:")  # bash lists what follows the `:`
    assert re.search(r"\r\n1 +4 +8 *\r\n", shown), shown
    shown = bash.tab("cloudtrain status --state ")
    assert all(s in shown for s in ("running", "succeeded", "failed", "recovering")), shown
    assert "cloudtrain status --state running,failed " in bash.tab(
        "cloudtrain status --state running,fa")
    (tmp_path / "curves-old.png").write_bytes(b"")
    assert "curves-old.png" in bash.tab("cloudtrain plot abc -o cu")


def test_F35_a_jobs_command_is_one_clean_line_in_the_completion_help(cli, tmp_path):
    """F35: a job whose command has newlines and escapes: each candidate is one triplet in
    zsh's protocol, its help one line without control characters."""
    job_file = tmp_path / "multi.yaml"
    job_file.write_text("name: multi\nrun: |\n  echo one\n  plain\n  printf '\\033]0;t\\007'\n")
    job_id = cli.launch(str(job_file))
    cli.wait(job_id)
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60, env={
        **_env(), "_CLOUDTRAIN_COMPLETE": "zsh_complete",
        "COMP_WORDS": "cloudtrain status ", "COMP_CWORD": "2"})
    lines = proc.stdout.split("\n")
    assert lines[-1] == "" and (len(lines) - 1) % 3 == 0, lines
    triplets = [lines[i:i + 3] for i in range(0, len(lines) - 1, 3)]
    assert {t[1] for t in triplets} == {job_id, "multi"}, triplets
    for kind, _, help_text in triplets:
        assert kind == "plain" and "echo one" in help_text
        assert not any(unicodedata.category(c) == "Cc" for c in help_text), repr(help_text)
