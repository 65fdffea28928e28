"""cloudtrain/config.py (settings, CLOUDTRAIN_HOME, private files) through the real CLI.

config.yaml and CLOUDTRAIN_HOME: whatever is in them, one designed line and exit 2 (F21),
and the state directory and database are the user's alone (F7)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from conftest import REPO

from labs.polling import wait_for


def _one_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert lines and lines[0].startswith("Error: "), proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    assert all(line.startswith("Hint: ") for line in lines[1:]), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, proc.stderr)


@pytest.mark.parametrize("text, fragment", [
    ("1: 2\n", "setting names are words, got 1"),
    ("~: 1\n", "setting names are words, got None"),
    ("1.5: x\n", "setting names are words, got 1.5"),
    ("stale_after_seconds: -1\n", "'stale_after_seconds' must be more than 0"),
    ("stale_after_seconds: 0.4\nheartbeat_seconds: 0.5\n",
     "'stale_after_seconds' (0.4) must be more than 'heartbeat_seconds' (0.5)"),
    ("heartbeat_seconds: 0\n", "'heartbeat_seconds' must be more than 0"),
    ("max_runtime_minutes: -5\n", "'max_runtime_minutes' must be more than 0"),
    ("max_runtime_minutes: .nan\n", "'max_runtime_minutes' must be a finite number"),
    ("max_runtime_minutes: .inf\n", "'max_runtime_minutes' must be a finite number"),
    ("max_runtime_minutes: 20000\n", "'max_runtime_minutes' must be at most 10080"),
    ("stop_grace_seconds: -1\n", "'stop_grace_seconds' must be at least 0"),
    ("stop_grace_seconds: .nan\n", "'stop_grace_seconds' must be a finite number"),
    ("ssh_port: 70000\n", "'ssh_port' must be at most 65535"),
    ("ssh_port: 0\n", "'ssh_port' must be at least 1"),
    ("ssh_port: 22.5\n", "'ssh_port' must be a whole number"),
    ("imds_hop_limit: 0\n", "'imds_hop_limit' must be at least 1"),  # RH1: EC2's 1-64
    ("imds_hop_limit: 65\n", "'imds_hop_limit' must be at most 64"),
    ("ssh_cidr: 10.0.0.0/8, my-office\n", "'ssh_cidr' must be CIDRs"),  # RH3: a list
    ("ssh_cidr: 2001:db8::/129\n", "'2001:db8::/129' is not one"),
    ("poll_seconds: 0\n", "'poll_seconds' must be more than 0"),
    ("collect_checkpoints_mb: -1\n", "'collect_checkpoints_mb' must be at least 0"),
    ("disk_gb: 3\n", "'disk_gb' must be 0 (the recipe's) or at least 8"),
    ("stop_grace_seconds: true\n", "'stop_grace_seconds' must be a number, got True"),
    ("stop_grace_seconds: [1, 2]\n", "'stop_grace_seconds' must be a number"),
    ("region: [us-east-1]\n", "'region' must be text"),
    ("region: ../../x\n", "unknown AWS region '../../x' (from `region:`)"),
    ("regions: us-east-1, nowhere\n", "unknown AWS region 'nowhere' (from `regions:`)"),
    ("market: cheap\n", "'market' must be one of on-demand, spot"),
    ("backend: gcp\n", "'backend' must be one of local, aws"),
    ("instance_type: ../x\n", "'instance_type' must be an EC2 instance type"),
    ("remote_root: jobs\n", "'remote_root' must be an absolute path or start with ~"),
    ("a: &a [x, x, x, x]\nb: &b [*a, *a, *a, *a]\nregion: [*b, *b, *b, *b]\n", "unknown setting 'a'"),
])
def test_F21_bad_config_values_are_one_line_config_errors(cli, ct_home, text, fragment):
    (ct_home / "config.yaml").write_text(text)
    _one_error(cli("launch", "--dry-run", "--", "true"), "config.yaml", fragment)
    # U7: what stops or shows jobs still works: the same words, as a warning, and exit 0
    proc = cli("status")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("WARNING: ") and fragment in proc.stderr, proc.stderr


def test_U7_a_typo_in_config_yaml_never_blocks_down_status_or_logs(cli, ct_home):
    job_id = cli.launch("--", "bash", "-c", "echo started; sleep 60")
    wait_for(lambda: "started" in cli.ok("logs", job_id).stdout, what="job start")
    path = ct_home / "config.yaml"
    path.write_text(path.read_text() + "regoin: us-east-1\nstop_grace_seconds_: 1\n")
    line = (f"WARNING: {path} line 4: unknown setting 'regoin' (did you mean region?); "
            "ignored")
    for args in (("status",), ("status", job_id), ("logs", job_id)):
        proc = cli.ok(*args)
        assert proc.stderr.splitlines()[0] == line, (args, proc.stderr)
        assert proc.stderr.count(line) == 1, proc.stderr  # once, however often it is read
        assert "line 5: unknown setting 'stop_grace_seconds_' (did you mean " \
               "stop_grace_seconds?)" in proc.stderr
    down = cli.ok("down", job_id)
    assert f"{job_id}: cancelled" in down.stdout and down.stderr.count(line) == 1
    # a command that starts something still refuses, naming the line and the likely setting
    proc = cli("launch", "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == (f"Error: {path} line 4: unknown setting 'regoin' "
                                           "(did you mean region?)")
    assert proc.stderr.splitlines()[1].startswith("Hint: fix or remove line 4")
    # a file that is no mapping at all: every setting at its default, said once
    path.write_text("- just\n- a list\n")
    proc = cli.ok("status")
    assert proc.stderr == (f"WARNING: {path} must be a mapping of setting: value; using the "
                           "built-in defaults\n")


def test_F21_yaml_booleans_are_not_truthy_strings(ct_home):
    """A flag is YAML true/false, never `bool("false")` (True): the type check refuses a
    quoted "false" where a number or flag is expected rather than guessing."""
    from cloudtrain import config
    from cloudtrain.errors import ConfigError

    with pytest.raises(ConfigError, match="must be true or false, got 'false'"):
        config._typed(ct_home / "config.yaml", "flag", "false", bool)
    assert config._typed(ct_home / "config.yaml", "flag", False, bool) is False


def test_F21_quoted_numbers_and_empty_values(cli, ct_home):
    (ct_home / "config.yaml").write_text("stop_grace_seconds: '3'\nregion:\nheartbeat_seconds: 1\n")
    cli.ok("status")


def test_F21_config_that_is_not_utf8_a_directory_or_unreadable(cli, ct_home):
    path = ct_home / "config.yaml"
    launch = ("launch", "--dry-run", "--", "true")
    path.write_bytes(b"backend: \xff\xfe\n")
    _one_error(cli(*launch), f"{path} is not UTF-8 text (byte 9)")
    path.unlink()
    path.mkdir()
    _one_error(cli(*launch), f"{path} is a directory, not a settings file")
    path.rmdir()
    path.write_text("backend: local\n")
    path.chmod(0)
    if os.access(path, os.R_OK):
        pytest.skip("running as root: every file is readable")
    _one_error(cli(*launch), f"{path} cannot be read: Permission denied")


@pytest.mark.parametrize("value, fragment", [
    ("/dev/null", "/dev/null exists and is not a directory"),
    ("{file}/below", "{file}/below is below {file}, which exists and is not a directory"),
    ("{file}", "{file} exists and is not a directory"),
])
def test_F21_cloudtrain_home_that_cannot_be_the_state_directory(cli, tmp_path, value, fragment):
    file = tmp_path / "a-file"
    file.write_text("x")
    value, fragment = value.format(file=file), fragment.format(file=file)
    proc = cli("status", env={"CLOUDTRAIN_HOME": value})
    _one_error(proc, f"CLOUDTRAIN_HOME={value}", fragment)


def test_F21_cloudtrain_home_not_writable(cli, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("running as root: every directory is writable")
    _one_error(cli("status", env={"CLOUDTRAIN_HOME": str(locked)}), "is not writable")
    _one_error(cli("status", env={"CLOUDTRAIN_HOME": str(locked / "sub")}),
               "cannot create", "Permission denied")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_F7_home_is_0700_and_state_files_0600_whatever_the_umask(tmp_path):
    """Run the real CLI under umask 000: the state directory it creates is 0700, state.db and
    its -wal/-shm files 0600."""
    home = tmp_path / "fresh" / "ct"
    code = "import os, sys; os.umask(0); from cloudtrain.cli import main; main(sys.argv[1:])"
    env = {**os.environ, "CLOUDTRAIN_HOME": str(home)}
    # Two commands: the second opens an existing database (WAL files exist while it runs).
    for args in (["status"], ["launch", "--dry-run", "--", "true"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, cwd=REPO, env=env)
        assert proc.returncode == 0, proc.stderr
    assert _mode(home) == 0o700
    assert _mode(home / "state.db") == 0o600
    from cloudtrain.state import Store

    old = os.umask(0)
    try:
        store = Store(home / "state.db")
        store.create_job(name=None, kind="command", recipe=None, command="true",
                         backend="local", spec={})
        for suffix in ("", "-wal", "-shm"):
            assert _mode(f"{home}/state.db{suffix}") == 0o600, suffix
        store.close()
    finally:
        os.umask(old)


def test_F7_an_existing_world_readable_state_db_is_made_private(ct_home, cli):
    cli.ok("status")
    db = ct_home / "state.db"
    db.chmod(0o644)
    cli.ok("status")
    assert _mode(db) == 0o600


def test_F7_write_private_and_private_file(tmp_path):
    from cloudtrain.config import private_file, write_private

    tmp_path = tmp_path / "files"
    tmp_path.mkdir()
    old = os.umask(0)
    try:
        write_private(tmp_path / "cache.json", '{"key": "AKIA"}')
        assert (tmp_path / "cache.json").read_text() == '{"key": "AKIA"}'
        assert _mode(tmp_path / "cache.json") == 0o600
        log = tmp_path / "output.log"
        log.write_text("token")
        log.chmod(0o666)
        private_file(log)
        assert _mode(log) == 0o600 and log.read_text() == "token"
        # No temporary file is left behind.
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", "output.log"]
    finally:
        os.umask(old)
