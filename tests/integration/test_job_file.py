"""Issue 16: job files (`cloudtrain launch job.yaml`), setup, envs and secrets, outputs,
`ssh JOB -- CMD` and `init`, through the real CLI: the local backend, and moto with a real
sshd standing in for the instance."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from conftest import REPO
from labs.polling import wait_for

SECRET = "s3cr3t-7f1e9a-never-on-disk"

OWN_CODE = """\
name: {name}
workdir: proj
setup: |
  echo installing-deps
  touch setup-ran
run: python3 train.py
envs: {{GREETING: hello, COUNT: 3}}
secrets: {{API_TOKEN: null}}
outputs: [results, model.bin, missing-file]
resources:
  max_runtime: 10m
"""

TRAIN = """\
import os
os.makedirs("results", exist_ok=True)
with open("results/summary.txt", "w") as f:
    f.write("greeting=%s count=%s token_len=%d\\n" % (
        os.environ.get("GREETING"), os.environ.get("COUNT"), len(os.environ.get("API_TOKEN", ""))))
with open("model.bin", "wb") as f:
    f.write(os.urandom(5000))
print("setup ran before:", os.path.exists("setup-ran"), flush=True)
"""


def _project(tmp_path: Path, name: str = "own-1", text: str = OWN_CODE) -> Path:
    (tmp_path / "proj").mkdir(exist_ok=True)
    (tmp_path / "proj" / "train.py").write_text(TRAIN)
    (tmp_path / "job.yaml").write_text(text.format(name=name))
    return tmp_path / "job.yaml"


def _run(args, cwd, env=None, timeout=180):
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_u53_launch_follow_says_a_declared_output_it_could_not_find(ct_home, tmp_path):
    """U53: a job file with `outputs: [results, model.bin, missing-file]` ended `launch -f`
    with only `job ... succeeded`; `not found: work/missing-file` was only in `status JOB`'s
    timeline, whose `outputs` event after `succeeded` showed `(now)` as its duration."""
    _project(tmp_path, name="own-u53")
    proc = _run(["launch", "job.yaml", "--secret", "API_TOKEN", "--follow"], tmp_path,
                {"API_TOKEN": SECRET})
    assert proc.returncode == 0, proc.stderr
    job = json.loads(_run(["status", "own-u53", "--json"], tmp_path).stdout)
    assert proc.stderr.splitlines()[-2:] == [
        f"job {job['id']} succeeded",
        f"outputs: in {job['jobdir']}; not found: work/missing-file"], proc.stderr
    detail = _run(["status", "own-u53"], tmp_path).stdout
    line = next(l for l in detail.splitlines() if l.strip().startswith("outputs "))
    assert "(now)" not in line, line
    (tmp_path / "job.yaml").write_text(OWN_CODE.format(name="own-u53b").replace(
        "outputs: [results, model.bin, missing-file]", "outputs: [results, model.bin]"))
    proc = _run(["launch", "job.yaml", "--secret", "API_TOKEN", "--follow"], tmp_path,
                {"API_TOKEN": SECRET})
    # every output found: nothing more is said than the outcome
    assert proc.returncode == 0 and proc.stderr.splitlines()[-1].endswith(" succeeded"), \
        proc.stderr


def _files_holding(root: Path, needle: bytes) -> list[str]:
    """Every file below root whose bytes contain `needle` (the store's -wal too)."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                pass
    return found


def test_own_code_job_file_runs_setup_envs_secrets_and_outputs_locally(ct_home, tmp_path):
    """issue 16: a job file of own code (workdir, setup, run, envs, secrets, outputs) runs
    on the local backend: setup first, in the workdir, its output in the log; the envs and
    the secret in the job's environment; the secret in no file cloudtrain writes."""
    _project(tmp_path)
    proc = _run(["launch", "job.yaml", "--secret", "API_TOKEN", "--follow"], tmp_path,
                {"API_TOKEN": SECRET})
    assert proc.returncode == 0, proc.stderr
    log = proc.stdout
    assert log.index("cloudtrain: setup started") < log.index("installing-deps") < \
        log.index("cloudtrain: setup done") < log.index("setup ran before: True")
    job = json.loads(_run(["status", "own-1", "--json"], tmp_path).stdout)
    assert job["state"] == "succeeded" and job["name"] == "own-1"
    assert job["spec"]["secrets"] == ["API_TOKEN"] and job["spec"]["envs"] == \
        {"GREETING": "hello", "COUNT": "3"} and "secret_values" not in job["spec"]
    summary = Path(job["jobdir"]) / "work" / "results" / "summary.txt"
    assert summary.read_text() == f"greeting=hello count=3 token_len={len(SECRET)}\n"
    said = [p.get("detail") or "" for p in job["timeline"] if p["name"] == "outputs"]
    assert said == [f"outputs: in {job['jobdir']}; not found: work/missing-file"], said
    # issue 16: secrets absent from every file cloudtrain writes: the job dir, the store
    assert _files_holding(ct_home, SECRET.encode()) == []
    db = sqlite3.connect(ct_home / "state.db")
    dump = "\n".join(db.iterdump())
    db.close()
    assert SECRET not in dump and "API_TOKEN" in dump
    assert not (ct_home / "secrets").exists() or not any((ct_home / "secrets").iterdir())


def test_a_failing_setup_fails_the_job_and_says_so(ct_home, tmp_path):
    """issue 16: setup's exit code ends the job before the command runs, with its reason."""
    _project(tmp_path, "own-2", OWN_CODE.replace("touch setup-ran", "exit 7"))
    proc = _run(["launch", "job.yaml", "--secret", "API_TOKEN", "--follow"], tmp_path,
                {"API_TOKEN": SECRET})
    assert proc.returncode == 1
    assert "setup ran before" not in proc.stdout and "setup failed (exit code 7)" in proc.stdout
    job = json.loads(_run(["status", "own-2", "--json"], tmp_path).stdout)
    assert job["state"] == "failed" and job["reason"].startswith("setup failed (exit code 7")


def test_flags_override_the_file_and_repeated_flags_add_to_it(ct_home, tmp_path):
    """issue 16: --name, --env, --set and --max-runtime given on the command line win over
    the file's values; the file's other values stay."""
    (tmp_path / "job.yaml").write_text(
        "name: from-file\nrecipe: resnet9\nprofile: smoke\n"
        "args: {seed: 1, synthetic_train: 256, synthetic_test: 128, epochs: 1}\n"
        "envs: {A: file, B: file}\nresources: {max_runtime: 30m}\n")
    proc = _run(["launch", "job.yaml", "--name", "from-flag", "--set", "seed=2", "--env",
                 "B=flag", "--max-runtime", "20", "--follow", "--quiet"], tmp_path,
                {"OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    job = json.loads(_run(["status", "from-flag", "--json"], tmp_path).stdout)
    spec = job["spec"]
    assert job["state"] == "succeeded" and spec["recipe"] == "resnet9"
    assert spec["args"]["seed"] == 2 and spec["args"]["synthetic_train"] == 256
    assert spec["envs"] == {"A": "file", "B": "flag"} and spec["max_runtime_s"] == 1200
    assert _run(["status", "from-file", "--json"], tmp_path).returncode == 2


@pytest.mark.parametrize("text, expected", [
    ("name: x\nrun: [a\n", "job.yaml:3: not valid YAML"),
    ("name: x\nresources:\n  spott: true\n", "job.yaml:3: resources.spott: unknown key; did "
                                             "you mean spot?"),
    ("name: x\nspot: true\n", "job.yaml:2: spot: unknown key; spot belongs at resources.spot"),
    ("name: x\nrecipie: resnet9\n", "job.yaml:2: recipie: unknown key; did you mean recipe?"),
    ("name: x\nresources:\n  disk_gb: lots\n", "job.yaml:3: resources.disk_gb: expected a "
                                               "whole number, got text 'lots'"),
    ("name: x\nresources:\n  spot: yes please\n", "job.yaml:3: resources.spot: expected true "
                                                  "or false"),
    ("name: x\nresources:\n  max_runtime: soon\n", "job.yaml:3: resources.max_runtime: "
                                                   "expected minutes, or a duration"),
    ("name: x\nresources:\n  disk_gb: 4\n", "job.yaml:3: resources.disk_gb: 4 is out of range"),
    # U23: not "0 is out of range (0 to 10080)"
    ("name: x\nresources:\n  max_runtime: 0\n", "job.yaml:3: resources.max_runtime: must be "
                                                "more than 0 minutes, got 0"),
    ("name: x\nresources:\n  max_runtime: -5\n", "job.yaml:3: resources.max_runtime: must "
                                                 "be more than 0 minutes, got -5"),
    ("name: a\nname: b\nrun: echo hi\n", "job.yaml:2: name: given twice (first on line 1)"),
    ("- a\n- b\n", "job.yaml:1: a job file is a mapping of keys"),
    ("", "job.yaml: empty job file"),
    ("recipe: resnet9\nrun: python x.py\n", "job.yaml:2: run: a job runs a recipe or your "
                                            "own code, not both"),
    ("run: echo hi\nenvs: {1BAD: x}\n", "job.yaml:2: envs.1BAD: not an environment variable "
                                     "name"),
    ("run: echo hi\nenvs: {CLOUDTRAIN_JOB_ID: x}\n", "job.yaml:2: envs.CLOUDTRAIN_JOB_ID: "
                                                  "CLOUDTRAIN_* variables are set by cloudtrain"),
    ("run: echo hi\nsecrets: {NOT_SET_ANYWHERE_XYZ: null}\n",
     "job.yaml:2: secrets.NOT_SET_ANYWHERE_XYZ: no value given and NOT_SET_ANYWHERE_XYZ is not "
     "set here"),
    ("run: echo hi\noutputs: [../escape]\n", "job.yaml:2: outputs '../escape': expected a path "
                                             "relative"),
    ("run: true\n", "job.yaml:1: run: expected text, got true/false"),  # YAML's bool
    ("run: echo hi\nresources: {fallback: cheapest}\n", "job.yaml:2: resources.fallback: "
                                                     "expected one of on-demand"),
])
def test_malformed_files_are_one_line_naming_the_key_and_line(ct_home, tmp_path, text,
                                                               expected):
    """issue 16: malformed YAML, unknown keys, wrong types: one line with the key and the
    line number, exit 2, nothing created."""
    (tmp_path / "job.yaml").write_text(text)
    proc = _run(["launch", "job.yaml"], tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    first = proc.stderr.splitlines()[0]
    assert first.startswith("Error: ") and expected in first, proc.stderr
    assert json.loads(_run(["status", "--json"], tmp_path).stdout) == []


def test_a_missing_job_file_and_one_given_after_double_dash(ct_home, tmp_path):
    """issue 16: a job file that is not there is said as such, with `init` as the way."""
    proc = _run(["launch", "nothere.yaml"], tmp_path)
    assert proc.returncode == 2 and "nothere.yaml: no such job file" in proc.stderr
    assert "cloudtrain init" in proc.stderr


def test_init_writes_files_that_launch_reads(ct_home, tmp_path):
    """issue 16: `cloudtrain init` writes a commented job file, for own code and for each
    recipe, that `launch --dry-run` accepts; it never overwrites one without --force."""
    assert _run(["init"], tmp_path).returncode == 0
    text = (tmp_path / "cloudtrain.yaml").read_text()
    assert text.startswith("# cloudtrain job file") and "setup: |" in text
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "requirements.txt").write_text("")
    plan = _run(["launch", "cloudtrain.yaml", "--dry-run"], tmp_path)
    assert plan.returncode == 0, plan.stderr
    again = _run(["init"], tmp_path)
    assert again.returncode == 2 and "cloudtrain.yaml exists: not overwritten" in again.stderr
    recipes = json.loads(_run(["recipes", "--json"], tmp_path).stdout)
    for r in recipes:
        name = r["name"]
        proc = _run(["init", "--recipe", name, "-o", f"{name}.yaml"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        plan = _run(["launch", f"{name}.yaml", "--dry-run"], tmp_path)
        assert plan.returncode == 0, (name, plan.stderr)
        assert name in plan.stdout


def test_aws_resources_of_a_job_file_reach_the_dry_run_and_flags_override_them(
        cli, aws, ct_home, tmp_path):
    """issue 16: the AWS fields of a job file (instance, spot, region, disk, runtime, max
    price, recovery) make the plan moto's dry run shows; a flag overrides the file."""
    (tmp_path / "job.yaml").write_text(
        "name: cloud-1\nrun: nvidia-smi\nresources:\n  instance: g5.xlarge\n  spot: true\n"
        "  region: us-east-1\n  disk_gb: 123\n  max_runtime: 1.5h\n  max_price: 0.9\n"
        "  max_restarts: 2\n")
    proc = _run(["launch", "job.yaml", "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = proc.stdout
    assert "g5.xlarge" in plan and "spot" in plan and "123 GB" in plan, plan
    assert "1h30m" in plan or "1.5 h" in plan or "90 min" in plan, plan
    proc = _run(["launch", "job.yaml", "--dry-run", "--instance", "g5.2xlarge"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "g5.2xlarge" in proc.stdout and "g5.xlarge " not in proc.stdout
    # the flag wins, and the file's recovery settings are then checked against it (U11:
    # named where they are)
    proc = _run(["launch", "job.yaml", "--dry-run", "--on-demand"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(
        "Error: job.yaml:10: resources.max_restarts applies to a recovering --spot job"), \
        proc.stderr


def _sleeping_job(tmp_path: Path, extra: str = "") -> None:
    (tmp_path / "proj").mkdir(exist_ok=True)
    (tmp_path / "proj" / "train.py").write_text(TRAIN)
    (tmp_path / "job.yaml").write_text(
        "name: remote-1\nworkdir: proj\nsetup: echo remote-setup\n"
        "run: |\n  python3 train.py\n  echo ready\n  sleep 60\n"
        "secrets: {API_TOKEN: null}\noutputs: [results, missing-file, model.bin, late]\n"
        "resources: {instance: g5.xlarge}\n" + extra)


def test_on_an_instance_secrets_stay_off_disk_ssh_runs_commands_and_outputs_come_home(
        cli, aws, ct_home, tmp_path):
    """issue 16: on an instance (moto + a real sshd) the secret reaches the job and no file
    on either side; `ssh JOB -- CMD` runs one command and returns its exit code; named
    outputs come home with the logs, a missing one and the size limit said (D39)."""
    aws.write_config(collect_checkpoints_mb=0.004)  # 4 kB: model.bin (5 kB) passes it
    _sleeping_job(tmp_path)
    proc = _run(["launch", "job.yaml", "--secret", "API_TOKEN", "--quiet", "--yes"], tmp_path,
                {"API_TOKEN": SECRET})
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    wait_for(lambda: "ready" in cli.ok("logs", job_id).stdout, timeout=60, what="the job")
    out = cli("ssh", job_id, "--", "echo", "$((6*7))")  # several words: each one quoted
    assert out.returncode == 0 and out.stdout.strip() == "$((6*7))", out.stderr
    out = cli("ssh", job_id, "--", "echo $((6*7)) && cat results/summary.txt 2>/dev/null; "
                                   "exit 3")
    assert out.returncode == 3 and out.stdout.splitlines()[0] == "42", (out.stdout, out.stderr)
    remote = aws.work / "remote"
    assert _files_holding(remote, SECRET.encode()) == []
    assert _files_holding(ct_home, SECRET.encode()) == []
    assert "remote-setup" in cli.ok("logs", job_id).stdout
    cli.ok("down", job_id)
    job = cli.job(job_id)
    local = Path(job["jobdir"])
    summary = (local / "work" / "results" / "summary.txt").read_text()
    assert summary == f"greeting=None count=None token_len={len(SECRET)}\n"
    assert not (local / "work" / "model.bin").exists()  # over the 4 kB limit
    said = [p.get("detail") or "" for p in job["timeline"] if p["name"] == "outputs"]
    assert said and "1 files" in said[0] and "passed collect_checkpoints_mb" in said[0], said
    assert "missing-file (not found)" in said[0] and "late (the limit was reached" in said[0]
    assert _files_holding(ct_home, SECRET.encode()) == []


def test_setup_is_skipped_on_a_kept_instance_when_unchanged(cli, aws, ct_home, tmp_path):
    """issue 16: setup runs once per instance: a job --on a kept instance skips it while it
    is unchanged, and runs it again once it changes."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "x.py").write_text("print('job ran')\n")
    (tmp_path / "job.yaml").write_text(
        "workdir: proj\nsetup: echo setup-one\nrun: python3 x.py\n"
        "resources: {instance: g5.xlarge, keep: true}\n")
    first = _run(["launch", "job.yaml", "--follow", "--quiet"], tmp_path)
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.splitlines()[0]
    assert "setup-one" in first.stdout
    again = _run(["launch", "--on", first_id, "--workdir", "proj", "--setup", "echo setup-one",
                  "--keep", "--follow", "--quiet", "--", "python3", "x.py"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert "setup skipped: it ran unchanged on this instance" in again.stdout
    assert "setup-one" not in again.stdout and "job ran" in again.stdout
    second_id = again.stdout.splitlines()[0]
    changed = _run(["launch", "--on", second_id, "--workdir", "proj", "--setup",
                    "echo setup-two", "--follow", "--quiet", "--", "python3", "x.py"], tmp_path)
    assert changed.returncode == 0, changed.stderr
    assert "setup-two" in changed.stdout and "skipped" not in changed.stdout
    assert len(aws.instances()) == 1


# -- F27: a job file from someone else's repository ------------------------------------------

HOME_TOKENS = [".aws/credentials", ".ssh/id_ed25519",
               ".config/gcloud/application_default_credentials.json", ".huggingface/token",
               ".kaggle/kaggle.json", ".bash_history", ".npmrc"]
REPO_TOKENS = [".env", "service-account.json", "deploy.key", ".npmrc"]


def _victim(tmp_path: Path) -> tuple[Path, Path]:
    """A home directory with keys and tokens, and a repository cloned two levels below it
    that keeps a few token files of its own."""
    home = tmp_path / "victim"
    repo = home / "code" / "repo"
    for rel in HOME_TOKENS + [f"code/repo/{t}" for t in REPO_TOKENS] + ["code/repo/train.py"]:
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(f"SECRET {rel}\n" if "train.py" not in rel else "print(1)\n")
    return home, repo


def _work_files(ct_home: Path, job_id: str) -> list[str]:
    work = ct_home / "jobs" / job_id / "work"
    return sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())


def test_F27_credentials_never_reach_the_jobs_work_dir(ct_home, tmp_path):
    """Audit F27 through the real CLI on the local backend: the audit's job file (workdir
    ../.., include .aws and .ssh) is refused before anything is created; the repository's own
    job file syncs its code and none of its token files, and says it held them back; a
    workdir that is the home directory is warned about with what is sent and held back."""
    home, repo = _victim(tmp_path)
    env = {"HOME": str(home)}
    (repo / "job.yaml").write_text('name: innocent-training\nworkdir: ../..\n'
                                   'include: [".aws/**", ".ssh/**"]\nrun: cat .aws/credentials\n')
    proc = _run(["launch", "-y", "job.yaml"], repo, env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("Error: job.yaml:2: workdir: '../..' is outside "), proc.stderr
    (repo / "job.yaml").write_text('workdir: .\ninclude: [".aws/**"]\nrun: ls\n')
    proc = _run(["launch", "-y", "job.yaml"], repo, env)
    assert proc.returncode == 2 and proc.stderr.startswith("Error: job.yaml:2: include: ")
    assert json.loads(_run(["status", "--json"], repo).stdout) == []

    (repo / "job.yaml").write_text("name: repo-run\nworkdir: .\nrun: python3 train.py\n")
    proc = _run(["launch", "repo/job.yaml", "--follow", "--quiet"], repo / "..", env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    assert _work_files(ct_home, job_id) == ["job.yaml", "train.py"]
    assert "4 credential-looking files held back (.env, .npmrc, deploy.key, " \
           "service-account.json) from the workdir" in proc.stderr, proc.stderr

    (home / "job.yaml").write_text("name: home-run\nworkdir: .\nrun: ls -a\n")
    proc = _run(["launch", "job.yaml", "--follow", "--quiet"], home, env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    sent = _work_files(ct_home, job_id)
    assert sent == ["code/repo/job.yaml", "code/repo/train.py", "job.yaml"], sent
    held = len(HOME_TOKENS) + len(REPO_TOKENS)
    warning = next(line for line in proc.stderr.splitlines() if line.startswith("WARNING"))
    assert f"{home} is your home directory" in warning, warning
    assert "3 files" in warning and f"{held} credential-looking files held back" in warning


def test_F27_only_a_typed_include_sends_a_token_and_it_is_said_or_asked(ct_home, tmp_path):
    """Audit F27: --include, typed, still sends what it names: without a terminal with a
    WARNING naming each file; in a terminal only after a [y/N] question that -y does not
    skip (answered no: nothing is created)."""
    from labs.terminal import run_in_terminal

    home, repo = _victim(tmp_path)
    (repo / "job.yaml").write_text("workdir: .\nrun: python3 train.py\n")
    proc = _run(["launch", "job.yaml", "-y", "--include", ".npmrc", "--include", "*.key",
                 "--follow", "--quiet"], repo)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: --include sends 2 credential-looking files to the host: .npmrc, "\
           "deploy.key" in proc.stderr or "WARNING: --include sends 2 credential-looking "\
           "files to the host: deploy.key, .npmrc" in proc.stderr, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    assert _work_files(ct_home, job_id) == [".npmrc", "deploy.key", "job.yaml", "train.py"]

    code, out = run_in_terminal(["launch", "job.yaml", "-y", "--include", ".env"],
                                answer="n", when=b"[y/N]", cwd=repo)
    assert code == 1 and "credential-looking file to the host: .env" in out, out
    assert "not launched: nothing was created" in out
    assert len(json.loads(_run(["status", "--json"], repo).stdout)) == 1


# -- F39: a job file takes values from the launching shell --------------------------------------

VICTIM_ENV = {"AWS_SECRET_ACCESS_KEY": "VICTIMENVSECRET1201", "AWS_SESSION_TOKEN":
              "VICTIMSESSION1201", "GITHUB_TOKEN": "ghp_VICTIM1201",
              "WANDB_API_KEY": "wandb-VICTIM-1201"}
ENVSTEAL = ('name: envsteal\nrun: echo "got $AWS_SECRET_ACCESS_KEY|$AWS_SESSION_TOKEN|'
            '$GITHUB_TOKEN"\nsecrets:\n  AWS_SECRET_ACCESS_KEY: null\n  AWS_SESSION_TOKEN: ~\n'
            '  GITHUB_TOKEN: ~\n')


def _said_nothing_of(proc_or_text, values=VICTIM_ENV.values()) -> bool:
    text = proc_or_text if isinstance(proc_or_text, str) else \
        proc_or_text.stdout + proc_or_text.stderr
    return not any(v in text for v in values)


def test_F39_the_audits_job_file_is_refused_before_anything_runs(ct_home, tmp_path):
    """Audit F39 through the real CLI: the audit's `envsteal` job file, launched in a shell
    holding AWS keys and a GitHub token, took them into its own `run:` without a word. Its
    cloud credentials are now refused in one line naming the file, line and key, -y or not,
    dry run or not: nothing is created, no value is shown. Typed on the command line, the
    same names are the user's to send."""
    (tmp_path / "job.yaml").write_text(ENVSTEAL)
    for args in (["-y", "--follow"], ["--dry-run"]):
        proc = _run(["launch", "job.yaml", *args], tmp_path, VICTIM_ENV)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert proc.stderr.splitlines()[0] == (
            "Error: job.yaml:4: secrets.AWS_SECRET_ACCESS_KEY: a job file cannot take your "
            "cloud credentials from this shell's environment (it may come from someone "
            "else's repository)"), proc.stderr
        assert "type --secret AWS_SECRET_ACCESS_KEY on the command line" in proc.stderr
        assert _said_nothing_of(proc)
    assert json.loads(_run(["status", "--json"], tmp_path).stdout) == []
    assert not (ct_home / "jobs").exists() or not any((ct_home / "jobs").iterdir())

    typed = ["--secret", "AWS_SECRET_ACCESS_KEY", "--secret", "AWS_SESSION_TOKEN", "--secret",
             "GITHUB_TOKEN"]
    proc = _run(["launch", "job.yaml", *typed, "--follow", "--quiet"], tmp_path, VICTIM_ENV)
    assert proc.returncode == 0, proc.stderr
    assert "got VICTIMENVSECRET1201|VICTIMSESSION1201|ghp_VICTIM1201" in proc.stdout


def test_F39_what_a_job_file_takes_from_this_shell_is_asked_whatever_y_says(ct_home,
                                                                           tmp_path):
    """Audit F39: any other value a job file takes from this shell (the documented
    `secrets: {WANDB_API_KEY: null}`, a GitHub token, a null env) is named in a [y/N]
    question that -y does not skip: answered no, nothing runs and the value reaches no
    `run:`; answered yes, it does. Without a terminal the launch is refused in one line
    whose hint is the command that sends them, and that command runs."""
    from labs.terminal import run_in_terminal

    (tmp_path / "job.yaml").write_text(
        'name: wandb-run\nrun: echo "got $WANDB_API_KEY|$GITHUB_TOKEN|$WANDB_PROJECT"\n'
        "envs: {WANDB_PROJECT: null}\nsecrets:\n  WANDB_API_KEY: null\n  GITHUB_TOKEN: ~\n")
    env = {**VICTIM_ENV, "WANDB_PROJECT": "proj-1201"}
    proc = _run(["launch", "job.yaml", "-y", "--follow"], tmp_path, env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    error, hint = proc.stderr.splitlines()[:2]
    assert error == ("Error: job.yaml:3: envs.WANDB_PROJECT: job.yaml takes 3 values from your "
                     "environment (WANDB_PROJECT, WANDB_API_KEY, GITHUB_TOKEN) and there is no "
                     "terminal to ask"), proc.stderr
    command = ("cloudtrain launch job.yaml --env WANDB_PROJECT --secret WANDB_API_KEY "
               "--secret GITHUB_TOKEN")
    assert hint == f"Hint: to send them, type them: {command}", proc.stderr
    assert _said_nothing_of(proc) and "proj-1201" not in proc.stderr
    assert json.loads(_run(["status", "--json"], tmp_path).stdout) == []

    full = {k: v for k, v in env.items()}
    code, out = run_in_terminal(["launch", "job.yaml", "-y", "--follow"], env=full,
                                answer="n", when=b"[y/N]", cwd=tmp_path)
    assert code == 1 and "not launched: nothing was created" in out, out
    asked = " ".join(out.split())
    assert ("job.yaml takes 3 values from your environment into the job: WANDB_PROJECT (envs, "
            "line 3), WANDB_API_KEY (secrets, line 5, credential-like), GITHUB_TOKEN (secrets, "
            "line 6, credential-like). Send them? [y/N]") in asked, out
    assert _said_nothing_of(out)
    assert json.loads(_run(["status", "--json"], tmp_path).stdout) == []

    code, out = run_in_terminal(["launch", "job.yaml", "-y", "--follow"], env=full,
                                answer="y", when=b"[y/N]", cwd=tmp_path)
    assert code == 0 and "got wandb-VICTIM-1201|ghp_VICTIM1201|proj-1201" in out, out
    proc = _run(command.split()[1:] + ["--follow", "--quiet"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "got wandb-VICTIM-1201|ghp_VICTIM1201|proj-1201" in proc.stdout


def test_U34_profile_none_drops_the_files_profile(ct_home, tmp_path):
    """U34: a job file's `profile: smoke` can be dropped from the command line (`--profile ''`
    was refused as needing a value), and --help says how."""
    (tmp_path / "job.yaml").write_text("recipe: resnet9\nprofile: smoke\n")
    with_file = _run(["launch", "job.yaml", "--dry-run"], tmp_path)
    assert with_file.returncode == 0 and "resnet9 (smoke)" in with_file.stdout, with_file.stderr
    dropped = _run(["launch", "job.yaml", "--profile", "none", "--dry-run"], tmp_path)
    assert dropped.returncode == 0, dropped.stderr
    job = next(line for line in dropped.stdout.splitlines() if line.strip().startswith("job "))
    assert job.split()[1:] == ["resnet9"], dropped.stdout
    assert "--profile none" in " ".join(_run(["launch", "--help"], tmp_path).stdout.split())


@pytest.mark.parametrize("text, args, expected", [
    ("recipe: resnet9\nargs:\n  seed: 1\n  epochs: ten\n", [],
     "job.yaml:4: args.epochs: epochs must be an integer, got 'ten'"),
    ("recipe: resnet9\nargs: {colour: red}\n", [],
     "job.yaml:2: args.colour: recipe resnet9 has no argument 'colour'"),
    ("recipe: resnet9\nprofile: quick\n", [],
     "job.yaml:2: profile: recipe resnet9 has no profile 'quick'"),
    ("run: echo hi\nresources: {keep: true}\n", [],
     "job.yaml:2: resources.keep applies to cloud backends, not local"),
    ("run: echo hi\nresources:\n  backend: local\n  idle_minutes: 5\n", [],
     "job.yaml:4: resources.idle_minutes applies to cloud backends, not local"),
    ("run: echo hi\nenvs:\n  A: 1\n  MODE_U11_UNSET: null\n", [],
     "job.yaml:4: envs.MODE_U11_UNSET: no value given and MODE_U11_UNSET is not set here"),
    ("run: echo hi\nworkdir: ./nope\n", [], "job.yaml:2: workdir: './nope' is not a directory"),
    ("name: only-a-name\n", [], "job.yaml: nothing to run: give it run: (your own code) or "
                               "recipe: (a bundled recipe)"),
    ("recipe: resnet9\n", ["--", "echo", "hi"],
     "job.yaml:1: recipe and a command after --: a job runs a recipe or your own command, "
     "not both"),
    ("run: echo hi\nprofile: smoke\n", [], "job.yaml:2: profile applies to recipes"),
    ("name: 12ab\nrun: echo hi\n", [], "job.yaml:1: name: a name of hex digits reads as a job "
                                       "id prefix"),
    ("run: echo hi\nresources: {nodes: 2, backend: local}\n", [],
     "job.yaml:2: resources.nodes: the local backend runs node 0 here"),
    ("run: bash notes.txt\nworkdir: .\noutputs: [ok, /abs]\n", [],
     "job.yaml:3: outputs '/abs': expected a path relative"),
    ("run: echo hi\ndatasets: {'bad name': null}\n", [],
     "job.yaml:2: datasets.bad name: 'bad name' is not a dataset name"),
    # U11 (2026-12-01): still without file:line, naming the flag
    ("name: x\nrecipe: resnet\n", [],
     "job.yaml:2: recipe: unknown recipe 'resnet' (did you mean resnet9?); known recipes: "),
    ("run: echo hi\nresources:\n  instance: g5.xlarg\n", [],
     "job.yaml:3: resources.instance: unknown instance type 'g5.xlarg' (did you mean "
     "g5.xlarge?)"),
    ("run: echo hi\nresources:\n  region: us-east-1\n  gpus: A100:1\n", [],
     "job.yaml:4: resources.gpus: no instance type with 1x A100 in us-east-1: A100 comes only "
     "in 8-GPU types here"),
    ("run: echo hi\nresources:\n  region: us-east-1\n  gpus: Z100:1\n", [],
     "job.yaml:4: resources.gpus: Z100: no instance type in the catalog has a GPU named 'Z100' "
     "(did you mean V100?)"),
    ("recipe: resnet9\ndatasets: {imagenet: null}\n", [],
     "job.yaml:2: datasets.imagenet: recipe resnet9 with these arguments reads cifar10"),
    ("run: echo hi\ndatasets:\n  imagenet: null\n", [],
     "job.yaml:3: datasets.imagenet: no source is declared for imagenet"),
])
def test_U11_errors_from_job_file_values_name_the_file_line_and_key(ct_home, tmp_path, text,
                                                                      args, expected):
    """U11: an error that comes from a job file's value names the file, the line and the key
    (README: "one line naming the file, the line and the key"), not the flag that was never
    typed; the same check on a typed flag still names the flag."""
    (tmp_path / "notes.txt").write_text("hi\n")
    (tmp_path / "job.yaml").write_text(text)
    proc = _run(["launch", "job.yaml", "--dry-run", *args], tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    first = proc.stderr.splitlines()[0]
    assert first.startswith("Error: " + expected), proc.stderr


@pytest.mark.parametrize("text, error, hint", [
    ("run: echo hi\nresources:\n  region: us-east-1\n  gpus: A100:1\n",
     "job.yaml:4: resources.gpus: no instance type with 1x A100", "Hint: resources.gpus: A100:8"),
    ("name: x\nrun: python train.py\n",
     "job.yaml:2: run: train.py: no such file, and without workdir: the job runs in an empty "
     "directory", "Hint: add workdir: DIR (job.yaml's directory or one below it) with your "
                  "code in it"),
    ("name: x\nrun: python here.py\n",
     "job.yaml:2: run: here.py is here, but without workdir: the job runs in an empty directory",
     "Hint: add `workdir: .` to job.yaml to sync its directory (.gitignore honoured)"),
    ("name: x\nworkdir: sub\nrun: python here.py\n",
     "job.yaml:3: run: here.py is not in workdir: sub: the job runs there",
     "Hint: write `workdir: .` (job.yaml's directory has it)"),
    ("name: x\nworkdir: sub\nrun: python nowhere.py\n",
     "job.yaml:3: run: nowhere.py is not in workdir: sub: the job runs there",
     "Hint: check the path, relative to workdir:"),
])
def test_U11_hints_name_the_key_not_the_flag(ct_home, tmp_path, text, error, hint):
    """U11: a job file's `gpus: A100:1` was refused with the hint `--gpus A100:8`, and a `run:`
    naming a script not synced with `add --workdir DIR`: a job file's user is told the key
    to write, at the file's line."""
    (tmp_path / "here.py").write_text("print(1)\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "job.yaml").write_text(text)
    proc = _run(["launch", "job.yaml", "--dry-run"], tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("Error: " + error), proc.stderr
    assert lines[1] == hint, proc.stderr


def test_U11_a_typed_flag_over_the_file_is_named_as_the_flag(ct_home, tmp_path):
    """U11: what the flag typed replaced is not the file's: its error names the flag."""
    (tmp_path / "job.yaml").write_text("recipe: resnet9\nargs: {epochs: 2}\n")
    proc = _run(["launch", "job.yaml", "--dry-run", "--set", "epochs=ten"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: --set epochs: epochs must be an integer"), proc.stderr
    (tmp_path / "job.yaml").write_text("run: echo hi\nenvs: {MODE_U11_UNSET: null}\n")
    proc = _run(["launch", "job.yaml", "--dry-run", "--env", "MODE_U11_UNSET=x", "--keep"],
                tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(
        "Error: --keep applies to cloud backends, not local"), proc.stderr


def test_U12_the_dry_run_shows_every_key_the_file_adds(ct_home, tmp_path):
    """U12: `launch job.yaml --dry-run` showed only job, backend, runs, max runtime and cost:
    now the name, the workdir (files to sync, their size, what was held back), setup's first
    line, the env and secret names (never a secret's value), outputs and datasets; `run: |`
    keeps no trailing newline in the plan, the launched line or `status JOB`."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('x' * 10)\n")
    (tmp_path / "proj" / "notes.md").write_text("n" * 3000)
    (tmp_path / "proj" / ".env").write_text("TOKEN=1\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "job.yaml").write_text(
        "name: full-plan\nworkdir: proj\nsetup: |\n  echo one\n  echo two\n"
        "run: |\n  python3 train.py\nenvs: {MODE: fast, LEVEL: 3}\n"
        "secrets: {API_TOKEN: null}\noutputs: [results, model.pt]\n"
        f"datasets: {{cifar: {tmp_path / 'data'}}}\n")
    proc = _run(["launch", "job.yaml", "--dry-run"], tmp_path, {"API_TOKEN": SECRET})
    assert proc.returncode == 0, proc.stderr
    plan = proc.stdout
    rows = {line.split()[0]: line.split(None, 1)[1] for line in plan.splitlines()[1:]}
    assert rows["job"] == "python3 train.py" and rows["runs"] == "python3 train.py", plan
    assert "\n\n" not in plan
    assert rows["name"] == "full-plan"
    assert rows["workdir"].startswith(str((tmp_path / "proj").resolve())), rows
    assert "2 files, 3.0 kB to sync" in rows["workdir"], rows
    assert "1 credential-looking file held back (.env)" in rows["workdir"], rows
    assert rows["setup"] == "echo one (and 1 more line)", rows
    assert rows["env"] == "LEVEL, MODE", rows
    # F39: which value comes from your environment, by name only
    assert rows["secrets"] == "API_TOKEN (from your environment: the launch asks first)", rows
    assert SECRET not in plan
    assert rows["outputs"] == "results, model.pt" and "cifar" in rows["data"], rows
    assert SECRET not in plan + proc.stderr

    (tmp_path / "job.yaml").write_text("name: newline-run\nrun: |\n  echo hi\n")
    proc = _run(["launch", "job.yaml"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "launched job " in proc.stdout and ": echo hi on local\n" in proc.stdout, proc.stdout
    detail = _run(["status", "newline-run"], tmp_path).stdout
    what = next(line for line in detail.splitlines() if line.strip().startswith("what"))
    assert what.split(None, 1)[1] == "echo hi", detail
