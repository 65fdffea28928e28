"""Shared fixtures: every test gets its own CLOUDTRAIN_HOME; all tests share one private
tmux server (killed at the end), so a developer's own jobs are never touched."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from labs.polling import wait_for

REPO = Path(__file__).resolve().parent.parent
TMUX_SOCKET = f"cloudtrain-test-{os.getpid()}"

# Short timings so that lifecycle tests run in seconds; the mechanisms are the real ones.
TEST_CONFIG = {
    "stop_grace_seconds": 2.0,
    "heartbeat_seconds": 0.5,
    "stale_after_seconds": 5.0,
}


def _moto_with_its_default_images_only() -> None:
    """moto's EC2 builds each region's backend on its first request after every reset (once
    per test), and loading its images was nearly all of that: its 44 default AMIs plus about
    1,250 per region (the latest Amazon Linux and ECS-optimised images), each with a
    snapshot and a volume. A sweep of every region (`status --refresh`, `down --all`) then
    cost 4 to 5 s of moto per test on this machine, 0.5 s with the 44 alone. No test uses
    those per-region images (the labs register their own DLAMI; tests that take "an image
    owned by amazon" or ami-12c6146b get them from the 44). MOTO_AMIS_PATH (moto's own
    setting; read when moto.ec2 is imported, so here, before any test module imports moto)
    names a file of the 44, made from moto's bundled list."""
    if "MOTO_AMIS_PATH" in os.environ:
        return
    import tempfile

    from moto.utilities.utils import load_resource

    path = Path(tempfile.gettempdir()) / f"cloudtrain-tests-moto-amis-{os.getpid()}.json"
    path.write_text(json.dumps(load_resource("ec2/resources/amis.json")))
    os.environ["MOTO_AMIS_PATH"] = str(path)
    atexit.register(path.unlink, missing_ok=True)


_moto_with_its_default_images_only()


def _one_torch_thread_per_process() -> None:
    """Every torch in the suite (the workers' own, the jobs they start, the lab's hosts: see
    labs/cloud.py) runs one intra-op thread, and inductor compiles in its own process. The
    suite runs several workers on two cores, each starting trainings; torch's default is a thread
    per core in each process, and OpenMP's threads wait for each other at every operation, so
    a thread the kernel has put aside holds up the rest: the resnet9 compile test took 206 s in
    the suite against 39 s alone. A test that wants another count says so (monkeypatch)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"


_one_torch_thread_per_process()


# pytest-xdist's workers inherit COLUMNS=80 and LINES=24 from their pseudo-terminal; the
# commands under test size their tables by COLUMNS, so a test that wants a width says so.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _signals_as_a_shell_leaves_them():
    """Each test starts with Ctrl-C as a shell gives it: SIGINT raises KeyboardInterrupt and no
    signal is blocked, in this process and so in the processes it starts (which inherit an
    ignored or blocked SIGINT across exec). Under pytest-xdist the Ctrl-C tests failed after
    other tests had run in the same worker; serially they passed."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    yield


@pytest.fixture(autouse=True)
def _spot_placement_scores(monkeypatch):
    """moto answers EC2's GetSpotPlacementScores in every test, as EC2 does (labs/
    moto_spot_scores.py; moto has none): every AZ scores the same unless a test sets scores
    (its own SpotScores, installed after this one, answers instead)."""
    from labs.moto_spot_scores import SpotScores

    yield SpotScores().install(monkeypatch)


@pytest.fixture(scope="session", autouse=True)
def _tmux_server():
    os.environ["CLOUDTRAIN_TMUX_SOCKET"] = TMUX_SOCKET
    yield
    subprocess.run(["tmux", "-L", TMUX_SOCKET, "kill-server"], capture_output=True)


@pytest.fixture(autouse=True)
def ct_home(tmp_path, monkeypatch):
    home = tmp_path / "ct-home"
    home.mkdir()
    (home / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in TEST_CONFIG.items()))
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    monkeypatch.delenv("CLOUDTRAIN_BACKEND", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_RECIPES", raising=False)
    # botocore looks for credentials at the EC2 metadata address (169.254.169.254) when it
    # finds none: tests never send traffic off this machine.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield home
    kill_processes_under(tmp_path)


def kill_processes_under(folder: Path) -> list[int]:
    """SIGKILL every process whose command line names a path in `folder` (the test's own
    tmp_path): the agents, probes and jobs that fault-injection tests leave hanging on
    purpose must not outlive the test (they did: `agent.py probe` of F4/F26, after a run).
    Not the tmux server the whole session shares: it keeps the command line of the client
    that started it, which may name the test's job dir. It runs after every test: a process's
    name is read only where its command line matches (three times faster than reading both
    of every process, with a hundred or more running)."""
    mark = (str(folder) + "/").encode()
    me = os.getpid()
    killed = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mark not in f.read():
                    continue
            with open(f"/proc/{pid}/comm") as f:
                if f.read().startswith("tmux"):
                    continue
            os.kill(int(pid), signal.SIGKILL)
            killed.append(int(pid))
        except OSError:
            continue
    return killed


TOY_RECIPE = """\
name: toy
description: "A tiny recipe for tests: prints its arguments and writes metrics."
entry: train.py
requires: [json]
arguments:
  epochs: {type: int, default: 2, help: epochs to run}
  lr: {type: float, default: 0.5, help: learning rate}
  mode: {type: choice, choices: [fast, slow], default: fast, help: how}
  resume: {type: bool, default: false, help: continue}
  tag: {type: str, default: null, help: optional tag}
profiles:
  smoke:
    description: one epoch
    set: {epochs: 1}
resources: {gpus_per_node: 1, nodes: 1, disk_gb: 10, max_runtime_minutes: 5}
target: {metric: test_acc, value: 0.5}
published:
  - {result: "50% test accuracy", time: "1 s", hardware: "any CPU", source: "this test"}
"""

TOY_TRAIN = """\
import argparse, json, os
p = argparse.ArgumentParser()
p.add_argument('--epochs', type=int); p.add_argument('--lr', type=float)
p.add_argument('--mode'); p.add_argument('--resume'); p.add_argument('--tag')
a = p.parse_args()
print('args', vars(a))
job = os.environ['CLOUDTRAIN_JOB_DIR']
ckpt = os.path.join(job, 'checkpoints', 'last.json')
start = 1
if a.resume == 'true' and os.path.exists(ckpt):
    start = json.load(open(ckpt))['epoch'] + 1
    print('resuming from epoch', start - 1)
with open(os.path.join(job, 'metrics.jsonl'), 'a') as f:
    for e in range(start, a.epochs + 1):
        f.write(json.dumps({'epoch': e, 'epochs': a.epochs, 'train_loss': 1.0 / e,
                            'test_acc': 0.3 * e}) + '\\n')
        json.dump({'epoch': e}, open(ckpt, 'w'))
"""


@pytest.fixture
def toy_recipes(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "recipes"
    (root / "toy").mkdir(parents=True)
    (root / "toy" / "recipe.yaml").write_text(TOY_RECIPE)
    (root / "toy" / "train.py").write_text(TOY_TRAIN)
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(root))
    return root



class CLI:
    """The real `cloudtrain` command, run as a separate process."""

    def __init__(self, home: Path):
        self.home = home

    def __call__(self, *args: str, env: dict | None = None, timeout: float = 120,
                 input: str | None = None) -> subprocess.CompletedProcess:
        # PYTHONFAULTHANDLER: a command that outlives its timeout is sent SIGABRT and prints
        # where each of its threads stood, so a hang says where it hung.
        full_env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
        with subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], text=True,
                              env=full_env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              stdin=subprocess.PIPE if input is not None else None) as child:
            try:
                out, err = child.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGABRT)
                out, err = child.communicate()
                raise AssertionError(f"`cloudtrain {' '.join(args)}` still ran after {timeout} s"
                                     f"\n--- stdout\n{out}\n--- stderr\n{err}") from None
        proc = subprocess.CompletedProcess(child.args, child.returncode, out, err)
        # Whatever happened, the user never sees a traceback.
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def ok(self, *args: str, **kw) -> subprocess.CompletedProcess:
        proc = self(*args, **kw)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def launch(self, *args: str, **kw) -> str:
        """Launch and return the job id."""
        return self.ok("launch", "--quiet", *args, **kw).stdout.strip().splitlines()[-1]

    def job(self, job_id: str) -> dict:
        return json.loads(self.ok("status", job_id, "--json").stdout)

    def wait(self, job_id: str, states=("succeeded", "failed", "cancelled"), timeout=60,
             interval=0.2) -> dict:
        def ended():
            job = self.job(job_id)
            return job if job["state"] in states else None

        return wait_for(ended, timeout=timeout, interval=interval,
                        what=f"job {job_id} to be {' or '.join(states)}")


@pytest.fixture
def cli(ct_home) -> CLI:
    return CLI(ct_home)


def error_line(stderr: str) -> str:
    """The `Error: ...` line of a command's stderr (a launch says its phases first, D3)."""
    return next((line for line in stderr.splitlines() if line.startswith("Error: ")), "")


def wait_for_job_state(ct_home: Path, wanted: str, timeout: float = 60) -> str:
    """The id of the newest job once it is in state `wanted` (read from the store directly,
    so as to catch a launch in the middle of a phase)."""
    import sqlite3

    def current():
        try:
            db = sqlite3.connect(ct_home / "state.db")
            row = db.execute("SELECT id, state FROM jobs ORDER BY created_at DESC").fetchone()
            db.close()
        except sqlite3.OperationalError:
            return None
        return row[0] if row and row[1] == wanted else None

    return wait_for(current, timeout=timeout, interval=0.01, what=f"a job in state {wanted}")


@pytest.fixture
def big_workdir(tmp_path) -> Path:
    """A work directory of 10,000 small files: its sync takes long enough that a launch can
    be caught (and interrupted) while syncing."""
    work = tmp_path / "big"
    for d in range(40):
        sub = work / f"d{d}"
        sub.mkdir(parents=True)
        for f in range(250):
            (sub / f"f{f}.txt").write_text("x")
    return work


def import_recipe_file(recipe: str, filename: str = "train.py", name: str | None = None):
    """A bundled recipe's script (or another of its files) imported as a module, without
    running its command line: recipes/<recipe>/<filename>."""
    import importlib.util

    path = REPO / "recipes" / recipe / filename
    spec = importlib.util.spec_from_file_location(
        name or f"{recipe.replace('-', '_')}_{Path(filename).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test: on a shared 2-core machine two OpenMP threads that
    wait for each other made a tiny training step 10 to 30 times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def recipe_command(recipe: str, profile: str = "smoke") -> list[str]:
    """A bundled recipe's command line exactly as `cloudtrain launch` writes it into run.sh
    (the project's own resolve/script_args), run from a job dir made by recipe_job_dir."""
    from cloudtrain import recipes

    rec = recipes.load(recipe)
    return [sys.executable, rec.entry_path(), *rec.script_args(rec.resolve(profile))]


def recipe_job_dir(tmp_path: Path, recipe: str) -> Path:
    """A job dir as launch syncs it: recipes/<recipe> and recipes/common."""
    import shutil

    job = tmp_path / "job"
    for part in (recipe, "common"):
        shutil.copytree(REPO / "recipes" / part, job / "recipes" / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return job


def resume_refusals(resume, path: Path, checkpoints: list[dict]) -> list[str]:
    """F46: what a recipe's `resume()` ends with (its SystemExit's one line) from each of
    `checkpoints` written at `path` in turn, and last from an empty file there."""
    import torch

    said = []
    for checkpoint in [*checkpoints, None]:
        if checkpoint is None:
            path.write_bytes(b"")
        else:
            torch.save(checkpoint, path)
        with pytest.raises(SystemExit) as stopped:
            resume()
        said.append(str(stopped.value.code))
    return said


# Rows of the fault-injection table (tests/integration/test_faults.py): scenario, instances
# billing right after the fault, the documented cleanup run, what still bills after it.
FAULT_TABLE: list[tuple[str, int, str, int]] = []


def slow_seconds(item) -> float:
    """About how long a test runs on the 2-core CI machine: `pytest.mark.slow(seconds=N)`, a
    plain `slow` mark 20 s, any other test 0."""
    mark = item.get_closest_marker("slow")
    return 0.0 if mark is None else float(mark.kwargs.get("seconds", 20))


def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker, the slow tests first, longest first (a stable sort: the rest
    keep their order). The scheduler hands out units in this order, so the workers start
    on the long trainings and end on short tests together; before, the last tests collected
    (tests/unit/test_wide_resnet.py's compile and torchrun runs) left one worker training for
    a minute or more while the other had nothing left. A serial run keeps the file order."""
    if hasattr(config, "workerinput"):
        items.sort(key=slow_seconds, reverse=True)


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (.ci/run: three workers), the end-to-end tests go to one worker as
    one unit, one lab after another. (Each worker's labs have a subnet of their own, labs/
    netns.py's lab_net, so files can run side by side: `-n 3 tests/e2e` passes in 510 s
    against about 20 minutes in one worker. In the whole suite that brought it to about 19
    minutes, but a 3-node relaunch there hung once past its 8 minutes (test_multinode.py's
    spot node test) with two other labs and the unit tests' compiles on two cores; until
    that is understood the suite keeps them in one worker.) Every other test is a unit of
    its own, handed out in the workers' collection order (units of one test keep it:
    pytest_collection_modifyitems puts the slow ones first). (Our own scheduler, not
    `--dist loadgroup`: that one marks groups by rewriting Item._nodeid, which pytest 9 no
    longer reads, so groups were ignored.)"""
    from xdist.scheduler import LoadScopeScheduling

    class EndToEndTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/e2e" if nodeid.startswith("tests/e2e/") else nodeid

    return EndToEndTogether(config, log)


def fault_rows(terminalreporter) -> list:
    """FAULT_TABLE's rows as the tests' reports carry them (from any xdist worker)."""
    rows, seen = [], set()
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for name, value in getattr(rep, "user_properties", None) or []:
                key = (getattr(rep, "nodeid", ""), tuple(value))
                if name == "fault_table" and key not in seen:
                    seen.add(key)
                    rows.append(tuple(value))
    return rows


def pytest_terminal_summary(terminalreporter):
    rows = fault_rows(terminalreporter)
    if not rows:
        return
    write = terminalreporter.write_line
    write("")
    write("fault injection over the AWS path (moto + sshd): what bills after each fault")
    write(f"{'scenario':52} {'after fault':>11}  {'cleanup':12} {'left':>4}")
    for scenario, after_fault, cleanup, left in rows:
        write(f"{scenario:52} {after_fault:>11}  {cleanup:12} {left:>4}")
    write(f"{len(rows)} scenarios, {sum(1 for *_, left in rows if left)} left "
          "anything billing")


def store_of_version(path: Path, version: int, job_row: str, *params):
    """A cloudtrain store at schema `version` (its first migrations only) holding one job,
    inserted by the SQL `job_row` with `params`: what an earlier cloudtrain left."""
    import sqlite3

    from cloudtrain import state_schema

    db = sqlite3.connect(path, isolation_level=None)
    for migration in state_schema.MIGRATIONS[:version]:
        migration(db)
    db.execute(f"PRAGMA user_version = {int(version)}")
    db.execute(job_row, params)
    db.close()
    return path


def unix_time(text: str) -> float:
    """Unix seconds of a moment as every --json output gives it (ISO 8601 in UTC, `...Z`)."""
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def tiny_prepared_imagenet(base: Path, seed: int, sizes=(40, 88), classes: int = 3) -> Path:
    """A small ImageNet tree in the prepared layout (train/, val/, sz/40/, sz/88/: what the
    imagenet recipe's tiny variant reads), made with the real prepare code: base/imagenet,
    from the official layout in base/src. `sizes`: the resized copies (data prepare's
    default is 160 and 352, which the tiny variant does not read)."""
    sys.path.insert(0, str(REPO / "recipes"))
    from common import imagenet_files

    imagenet_files.write_synthetic_official(base / "src", classes=classes, train_per_class=6,
                                            val_per_class=2, seed=seed)
    imagenet_files.prepare_imagenet(base / "src", base / "imagenet", sizes=sizes, workers=1)
    return base / "imagenet"


def lying_manifest(entries: int, size: int, shard_bytes: int | None = None) -> bytes:
    """A dataset manifest whose every field parses and whose sums agree, for `entries` shards
    of `size` bytes (one member each), sha256 all zeros: what anyone who can write a bucket
    can put there, with or without shard objects behind it (the audit's F29)."""
    from cloudtrain.host import shards

    return shards.Manifest.build(shard_bytes or size, [shards.ShardEntry(
        shards.shard_name(i), 1, size, size - 3 * shards.BLOCK, "0" * 64)
        for i in range(entries)]).to_json().encode()
