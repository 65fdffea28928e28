"""The sets of benchmarks/audit_figures.py for the new surfaces of the audit of 2026-12-01
(/work/shared/findings/audit-2026-12-01.md), built like audit_surfaces.py's: each case runs as
fresh processes in a scratch directory of its own (audit_harness.run_case), sorted OK / ERROR /
TRACEBACK / HANG, and its checks count the flaws.

    jobfile2         job files whose secrets:/envs: take values from a launching shell that
                     holds distinctive ones (a dry run, with and without -y, with and without
                     a terminal, the AWS backend's dry run), and F33's YAML again. Check: no
                     value reaches the output, the job's log or any file (secrets leaked)
    ckpt             damaged and code-carrying checkpoints through
                     recipes/common/checkpoint.load, and through resnet9's --resume true.
                     Check: no code ran; a step past the schedule is no success
    images           hostile image trees through `cloudtrain data prepare`. Check: no link
                     from SRC in DEST, no byte of the private key, nothing written outside
    forged records   forged attempts/<n>.json and final.json of a group job in moto, then
                     learn and release. Checks: instances terminated that were not the job's,
                     forged records taken, the job's own left billing
    regroup members  a hostile node's records while a node meets (the real host/regroup.py,
                     moto's server). Check: members accepted that EC2 does not list

The data is in audit_cases_1201.py, the programs in audit_drivers_1201.py.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import threading
import time
from pathlib import Path

import audit_cases_1201 as corpus
import audit_harness as harness
from audit_harness import (PYTHON, Case, Outcome, Scratch, check_markers, classify,
                           files_holding, kill_group, limited, write)

JOB = "code/repo/job.yaml"


def driver_flaws(s: Scratch) -> None:
    """`FLAW <kind>: ...` lines on a driver's stdout, as flaws of that kind."""
    for outcome in s.outcomes:
        for line in outcome.stdout.splitlines():
            kind, sep, text = line.removeprefix("FLAW ").partition(": ")
            if line.startswith("FLAW ") and sep and kind in harness.FLAW_KINDS:
                s.flaw(kind, text)


def setup(s: Scratch, argv: list[str]) -> None:
    """A driver run that builds the case (not an input): its failure is the harness's."""
    outcome = s.drive(argv)
    if outcome.returncode != 0:
        raise RuntimeError(f"{argv[0]}: exit {outcome.returncode}: {outcome.stderr[-300:]}")


# -- a terminal -----------------------------------------------------------------------------------


def in_terminal(s: Scratch, argv: list[str], answer: bytes) -> Outcome:
    """`cloudtrain argv` with a terminal (a pty for stdin, stdout and stderr), answering
    `answer` to the first [y/N] question; the terminal's text is the outcome's stderr."""
    argv = s.fill(argv)
    master, slave = pty.openpty()
    start = time.monotonic()
    proc = subprocess.Popen(limited([PYTHON, "-m", "cloudtrain", *argv]), env=s.env,
                            cwd=s.dir, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    out, answered, hung = bytearray(), False, False
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.1)
            chunk = b""
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every holder of the terminal's other side is gone
                    pass
                out += chunk
            if not chunk and proc.poll() is not None:
                break
            if not answered and b"[y/N]" in out:
                os.write(master, answer)
                answered = True
            if time.monotonic() - start > s.timeout:
                kill_group(proc.pid)
                hung = True
                break
    finally:
        os.close(master)
    code = None if hung else proc.wait()
    if hung:
        proc.wait()
    text = out.decode("utf-8", "replace").replace("\r\n", "\n")
    shown = ["(terminal)", *argv]
    kind = "HANG" if hung else classify(code, text.replace(_question(text), ""))
    return Outcome(kind, shown, code, text, time.monotonic() - start)


def _question(text: str) -> str:
    """The question's line (its prompt and the echoed answer), left out of the text that is
    classified: what follows it is the answer's outcome."""
    return next((line for line in text.splitlines() if "[y/N]" in line), "\0")


# -- jobfile2 (F39, F33) --------------------------------------------------------------------------

SECRET_MODES = {
    "dry run": ["launch", JOB, "--dry-run"],
    "aws dry run": ["launch", JOB, "-i", "g5.xlarge", "--dry-run"],
    "no terminal": ["launch", "-q", JOB],
    "no terminal, -y": ["launch", "-q", "-y", JOB],
    "terminal, Enter": (["launch", JOB], b"\n"),
    "terminal, -y, Enter": (["launch", "-y", JOB], b"\n"),
    "terminal, answered y": (["launch", JOB], b"y\n"),
}


def values_found(s: Scratch) -> list[tuple[str, str]]:
    """(where, the variable) for every copy of a launching shell's value: in what a command
    said, in any file of the case's directory (its home, job dirs and logs)."""
    found = []
    for name, value in corpus.MARKERS.items():
        for outcome in s.outcomes:
            if value in outcome.stdout + outcome.stderr:
                found.append((f"the output of {' '.join(outcome.argv[:3])}", name))
        for rel in files_holding(s.dir, value):
            found.append((rel, name))
    return found


def secret_case(label: str, text: str, mode: str) -> Case:
    sent = label.endswith("(by design)") or mode == "terminal, answered y"
    command = SECRET_MODES[mode]
    run = (lambda s: in_terminal(s, *command)) if isinstance(command, tuple) else command

    def prepare(s: Scratch) -> None:
        s.env.update(corpus.MARKERS)
        write(s.dir / JOB, "\n".join(s.fill(text.split("\n"))))

    def check(s: Scratch) -> None:
        check_markers(s)
        found = values_found(s)
        if not sent:
            for where, name in found:
                s.flaw("leak", f"{name}'s value is in {where}")
            return
        # sent by the user's consent: the job's log holds it, and nothing else may
        if not any(where.endswith("output.log") for where, _ in found):
            s.flaw("broken", "the value sent with consent did not reach the job's log")
        for where, name in found:
            if not where.endswith("output.log") and not where.startswith("the output of"):
                s.flaw("leak", f"{name}'s value is in {where}")

    return Case("jobfile2", f"{label} [{mode}]", [run, ["@wait-jobs"]], prepare, check=check,
                template=False)


def yaml_case(label: str, text: str | bytes) -> Case:
    def prepare(s: Scratch) -> None:
        data = text if isinstance(text, bytes) else "\n".join(s.fill(text.split("\n"))).encode()
        write(s.dir / JOB, data)

    return Case("jobfile2", f"YAML: {label}", [
        ["launch", JOB, "--dry-run"], ["@if-local", "launch", "-q", JOB], ["@wait-jobs"]],
        prepare, check=check_markers, template=False)


def jobfile2_cases() -> list[Case]:
    cases = [secret_case(label, text, mode)
             for label, (text, modes) in corpus.SECRET_FILES.items() for mode in modes]
    return cases + [yaml_case(label, text) for label, text in corpus.YAML_ODDITIES.items()]


# -- ckpt (F32, F46) ------------------------------------------------------------------------------

# torch's libraries alone map more than the 2 GB the other programs get (its import fails)
TORCH_MEMORY = 6 << 30
_BASE: dict[str, bytes] = {}
_BASE_LOCK = threading.Lock()


def recipe_argv(s: Scratch, *extra: str, job: str = "job") -> list[str]:
    return [PYTHON, str(harness.TREE / "recipes" / "resnet9" / "train.py"),
            *corpus.RESNET9_TINY, "--job-dir", str(s.dir / job), "--data-dir",
            str(s.dir / "data"), *extra]


def base_checkpoint(s: Scratch) -> bytes:
    """A real resnet9 checkpoint (its run stopped at step 1, exit 143), made once per run of
    the benchmark."""
    with _BASE_LOCK:
        if "bytes" not in _BASE:
            out = harness.run_process(recipe_argv(s, "--stop-at-step", "1", job="base-run"),
                                      s.env, s.dir, max(s.timeout, 180), memory=s.memory)
            made = s.dir / "base-run" / "checkpoints" / "last.pt"
            if out.returncode != 143 or not made.exists():
                raise RuntimeError(f"the base checkpoint: exit {out.returncode}: "
                                   f"{out.stderr[-300:]}")
            _BASE["bytes"] = made.read_bytes()
        return _BASE["bytes"]


def ckpt_load_case(case: str) -> Case:
    def prepare(s: Scratch) -> None:
        setup(s, ["ckpt-make", case, "{dir}/ck/last.pt", "{M}"])

    return Case("ckpt", f"load: {case}", [["@drive", "ckpt-load", "{dir}/ck/last.pt"]],
                prepare, check=check_markers, template=False, memory=TORCH_MEMORY)


def ckpt_resume_case(case: str) -> Case:
    def prepare(s: Scratch) -> None:
        write(s.dir / "base.pt", base_checkpoint(s))
        setup(s, ["ckpt-make", case, "{dir}/job/checkpoints/last.pt", "{M}", "{dir}/base.pt"])
        (s.dir / "job" / "checkpoints" / "checkpoint-info.json").unlink(missing_ok=True)

    def check(s: Scratch) -> None:
        check_markers(s)
        if "(control)" not in case and s.outcomes and s.outcomes[-1].kind == "ok":
            s.flaw("broken", f"resnet9 resumed from a checkpoint with {case} and succeeded")

    return Case("ckpt", f"resnet9 --resume: {case}",
                [lambda s: s.run_any(recipe_argv(s, "--resume", "true"))], prepare,
                check=check, template=False, timeout=180.0, memory=TORCH_MEMORY)


def ckpt_cases() -> list[Case]:
    return [ckpt_load_case(c) for c in corpus.CKPT_LOAD_CASES] + \
        [ckpt_resume_case(c) for c in corpus.CKPT_RESUME_CASES]


# -- images (F48) ---------------------------------------------------------------------------------

PREPARE = ["data", "prepare", "imagenet", "{dir}/src", "{dir}/dest", "--sizes", "20",
           "--max-sides", "32", "--workers", "2"]


def check_dest(s: Scratch) -> None:
    """Nothing in DEST is a link, holds the private key's bytes or is a file of ~/photos."""
    key = s.dir / ".ssh" / "id_ed25519"
    photo = s.dir / "photos" / "me.JPEG"
    needle = corpus.PRIVATE_KEY.splitlines()[1]
    for top, dirs, files in os.walk(s.dir / "dest"):
        for name in dirs + files:
            path = Path(top, name)
            rel = path.relative_to(s.dir)
            if path.is_symlink():
                target = os.path.realpath(path)
                kind = "leak" if target == str(key.resolve()) else "broken"
                s.flaw(kind, f"a link from SRC is in DEST: {rel} -> {os.readlink(path)}")
            elif path.is_file():
                if os.path.samefile(path, photo):
                    s.flaw("broken", f"{rel} is ~/photos/me.JPEG (outside SRC), linked")
                elif path.stat().st_size < 1 << 20 and needle.encode() in path.read_bytes():
                    s.flaw("leak", f"{rel} holds the private key's bytes")


def image_case(case: str) -> Case:
    runs = [PREPARE, PREPARE] if case == corpus.IMAGE_RERUN else [PREPARE]

    def prepare(s: Scratch) -> None:
        setup(s, ["images-tree", case, "{dir}/src", "{dir}"])

    def check(s: Scratch) -> None:
        check_markers(s)
        check_dest(s)

    return Case("images", case, list(runs), prepare, check=check, allowed=("dest", "home"),
                template=False)


def image_cases() -> list[Case]:
    return [image_case(c) for c in [*corpus.IMAGE_CASES, corpus.IMAGE_ALL, corpus.IMAGE_RERUN]]


# -- forged records (F41) and regroup members (F42, F43) ---------------------------------------


def forged_cases() -> list[Case]:
    return [Case("forged records", case, [["@drive", "forged", case, "{home}"]],
                 check=driver_flaws, template=False) for case in corpus.FORGED_CASES]


def regroup_cases() -> list[Case]:
    def check(s: Scratch) -> None:
        driver_flaws(s)
        check_markers(s)

    # F43's writer never stops: a meeting that does not end is the HANG, after 30 s
    return [Case("regroup members", case, [["@drive", "regroup", case, "{M}"]], check=check,
                 template=False, timeout=30.0 if "(F43)" in case else None)
            for case in corpus.REGROUP_CASES]


# The rows of the audit's table, in its order, and --only's names
TABLE = ["jobfile2", "ckpt", "images", "forged records", "regroup members"]


def case_sets(timeout: float) -> dict:
    """{--only name: builder} for the sets of the 2026-12-01 audit's new surfaces."""
    return {"jobfile2": jobfile2_cases, "ckpt": ckpt_cases, "images": image_cases,
            "forged": forged_cases, "regroup": regroup_cases}
