"""Bad input and missing pieces: one clear line, the right exit code, nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, TOY_RECIPE

def _no_jobs(cli) -> bool:
    return json.loads(cli.ok("status", "--json").stdout) == []


def test_unknown_recipe_lists_the_known_ones(cli, toy_recipes):
    proc = cli("launch", "--recipe", "resnet99")
    assert proc.returncode == 2
    first = proc.stderr.splitlines()[0]
    assert first.startswith("Error: unknown recipe 'resnet99' (did you mean resnet9?); known "
                            "recipes: ")  # U11: the nearest name
    assert set(first.split("known recipes: ")[1].split(", ")) >= {"toy", "resnet9"}
    assert _no_jobs(cli)


def test_unknown_job_id(cli):
    for command in (["status", "nope"], ["logs", "nope"], ["down", "nope"], ["attach", "nope"]):
        proc = cli(*command)
        assert proc.returncode == 2, command
        assert proc.stderr.splitlines()[0] == "Error: no job 'nope'"


@pytest.mark.parametrize("setting, message", [
    ("epochz=3", "--set epochz: recipe toy has no argument 'epochz' (did you mean epochs?)"),
    ("epochs=three", "--set epochs: epochs must be an integer, got 'three'"),
    ("lr=fast", "--set lr: lr must be a number, got 'fast'"),
    ("mode=medium", "--set mode: mode must be one of fast, slow, got 'medium'"),
    ("resume=maybe", "--set resume: resume must be true or false, got 'maybe'"),
    ("epochs", "--set 'epochs': expected key=value"),
])
def test_invalid_set_is_refused_before_anything_starts(cli, toy_recipes, setting, message):
    proc = cli("launch", "--recipe", "toy", "--set", setting)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0].startswith("Error: " + message), proc.stderr
    assert _no_jobs(cli)


def test_unknown_profile(cli, toy_recipes):
    proc = cli("launch", "--recipe", "toy", "--profile", "huge")
    assert proc.returncode == 2
    assert "recipe toy has no profile 'huge' (profiles: smoke)" in proc.stderr


def test_recipe_arguments_reach_the_script_with_profile_and_set(cli, toy_recipes):
    proc = cli("launch", "--recipe", "toy", "--profile", "smoke", "--set", "lr=0.25",
               "--set", "resume=yes", "--set", "tag=a b", "--follow")
    assert proc.returncode == 0, proc.stderr
    assert ("args {'epochs': 1, 'lr': 0.25, 'mode': 'fast', 'resume': 'true', 'tag': 'a b'}"
            in proc.stdout)
    job = json.loads(cli.ok("status", "--json").stdout)[0]
    assert job["recipe"] == "toy" and job["command"] == "toy (smoke) lr=0.25 resume=true tag='a b'"
    assert job["metrics"]["epoch"] == 1
    assert job["spec"]["max_runtime_s"] == 300


def test_recipe_target_reached_shows_in_detail(cli, toy_recipes):
    cli.ok("launch", "--recipe", "toy", "--follow")
    job_id = json.loads(cli.ok("status", "--json").stdout)[0]["id"]
    detail = cli.ok("status", job_id).stdout
    assert "metrics   epoch 2, epochs 2, train_loss 0.5, test_acc 60.00%" in detail


def test_recipe_needing_a_missing_module_is_refused(cli, toy_recipes):
    text = (toy_recipes / "toy" / "recipe.yaml").read_text()
    (toy_recipes / "toy" / "recipe.yaml").write_text(
        text.replace("requires: [json]", "requires: [json, no_such_module_xyz]"))
    proc = cli("launch", "--recipe", "toy")
    assert proc.returncode == 1
    assert "needs the Python modules no_such_module_xyz" in proc.stderr.splitlines()[0]
    assert "Hint: pip install 'cloudtrain[recipes]'" in proc.stderr
    assert _no_jobs(cli)


def test_broken_recipe_yaml_is_named(cli, toy_recipes):
    (toy_recipes / "toy" / "recipe.yaml").write_text(TOY_RECIPE.replace("type: int", "type: integer"))
    proc = cli("launch", "--recipe", "toy")
    assert proc.returncode == 2
    assert "toy/recipe.yaml: argument 'epochs' needs a type" in proc.stderr


def test_missing_tmux_says_how_to_install_it(cli, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "mkdir", "cp", "cat", "env"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    proc = cli("launch", "--", "true", env={"PATH": str(bin_dir)})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0] == "Error: tmux is not installed on this machine"
    assert "apt-get install tmux" in proc.stderr
    assert _no_jobs(cli)


def test_usage_errors_exit_2(cli, tmp_path):
    cases = [
        (["launch"], "nothing to run"),
        (["launch", "--recipe", "x", "--", "true"], "--recipe and a command after --: a job "
                                                    "runs a recipe or your own command"),
        (["launch", "--set", "a=1", "--", "true"], "--set applies to recipes"),
        (["launch", "--workdir", str(tmp_path / "missing"), "--", "true"], "not a directory"),
        (["launch", "--backend", "gcp", "--", "true"], "unknown backend 'gcp'; known backends: local"),
        (["launch", "--max-runtime", "-1", "--", "true"], "--max-runtime '-1': expected minutes"),
        (["down"], "which jobs?"),
        (["frobnicate"], "No such command"),
        (["status", "--limit", "x"], "is not a valid integer"),
    ]
    for args, message in cases:
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
    assert _no_jobs(cli)


@pytest.mark.parametrize("args, error, hint", [
    (["cost-report", "--by", "week"], "Invalid value for '--by': 'week' is not one of 'job', "
                                      "'recipe', 'instance', 'day', 'month'.", "cost-report"),
    (["launch", "--nodes", "two"], "Invalid value for '--nodes': 'two' is not a valid integer.",
     "launch"),
    (["logs"], "Missing argument 'JOB'.", "logs"),
    (["estimate"], "Missing option '--recipe' / '-r'.", "estimate"),
    (["status", "--bogus"], "No such option '--bogus'.", "status"),
    (["data", "push", "--shard-mb", "x", "/d", "s3://b/p"],
     "Invalid value for '--shard-mb': 'x' is not a valid integer.", "data push"),
    (["frobnicate"], "No such command 'frobnicate'.", ""),
])
def test_u20_click_s_usage_errors_are_one_line_and_a_hint(cli, args, error, hint):
    """Click's own usage errors were four lines (Usage, Try, a blank line, Error); the README
    promises one line on stderr, as every error of ours is."""
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"Error: {error}",
                                        f"Hint: cloudtrain {hint + ' ' if hint else ''}--help"]
    assert proc.stdout == ""


def test_u20_an_unknown_instance_type_is_said_the_same_by_launch_and_estimate(cli):
    for typed, said in (("g5.xlarg", "unknown instance type 'g5.xlarg' (did you mean "
                                     "g5.xlarge?)"),
                        ("G5.xlarge", "unknown instance type 'G5.xlarge' (did you mean "
                                      "g5.xlarge?): EC2 type names are lower case"),
                        ("G5.XLARGE", "unknown instance type 'G5.XLARGE' (did you mean "
                                      "g5.xlarge?): EC2 type names are lower case")):
        for args in (("launch", "--recipe", "resnet9", "--dry-run"),
                     ("estimate", "--recipe", "resnet9")):
            proc = cli(*args, "--instance", typed, env={"AWS_ACCESS_KEY_ID": ""})
            assert proc.returncode == 2, proc.stderr
            assert proc.stderr.splitlines() == [f"Error: {said}",
                                                "Hint: cloudtrain catalog lists the GPU types"]


def test_u20_a_bad_region_is_said_the_same_by_launch_estimate_catalog_and_data_push(
        cli, tmp_path):
    for typed, said in (("mars-1", "unknown AWS region 'mars-1' (from --region)"),
                        ("useast-1", "unknown AWS region 'useast-1' (from --region; did you "
                                     "mean us-east-1?)"),
                        ("US-EAST-1", "unknown AWS region 'US-EAST-1' (from --region; did you "
                                      "mean us-east-1?)")):
        for args in (("launch", "--recipe", "resnet9", "--dry-run", "--region", typed),
                     ("estimate", "--recipe", "resnet9", "--region", typed),
                     ("catalog", "--region", typed),
                     ("data", "push", str(tmp_path), "s3://bkt/x", "--region", typed)):
            proc = cli(*args)
            assert proc.returncode == 2, proc.stderr
            # U21: the hint is no command's own: `data push` is not told about launch
            assert proc.stderr.splitlines() == [
                f"Error: {said}", "Hint: a region looks like us-east-1 or eu-west-2"], args


def test_corrupt_config_is_one_line(cli, ct_home):
    (ct_home / "config.yaml").write_text("stop_grace_seconds: [unclosed\n")
    proc = cli("launch", "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: ") and "config.yaml is not valid YAML: line 2" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    proc = cli("status")  # U7: status still works, on the defaults, and says why
    assert proc.returncode == 0 and proc.stderr.startswith("WARNING: ")
    assert "config.yaml is not valid YAML: line 2" in proc.stderr
    (ct_home / "config.yaml").write_text("no_such_setting: 1\n")
    proc = cli("launch", "--", "true")
    assert "unknown setting 'no_such_setting'" in proc.stderr and proc.returncode == 2


def test_status_and_help_never_import_heavy_modules(ct_home):
    code = textwrap.dedent("""
        import sys
        from cloudtrain.cli import main
        try:
            main(sys.argv[1:])
        except SystemExit:
            pass
        heavy = sorted(m for m in ("torch", "boto3", "botocore", "paramiko", "numpy")
                       if m in sys.modules)
        print("HEAVY", heavy, file=sys.stderr)
    """)
    for args in (["--help"], ["status"], ["status", "--json"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, cwd=REPO, env=os.environ)
        assert "HEAVY []" in proc.stderr, (args, proc.stderr)


def test_every_command_help_has_an_example(cli):
    from cloudtrain.cli import cli as group

    for name in group.commands:
        out = cli.ok(name, "--help").stdout
        assert "Example" in out and f"cloudtrain {name}" in out, name


def _commands(group=None, path=()):
    """Every command's words (`data push`, `supervisor start`, ...), groups included."""
    import click

    from cloudtrain.cli import cli as top

    group = group or top
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_u56_every_help_fits_80_columns(cli):
    """U56: example lines of 82-94 columns in `launch --help` and 83-90 in `estimate
    --help`. Every line of every command's help now fits an 80-column terminal."""
    too_wide = {}
    for words, _ in _commands():
        out = cli.ok(*words, "--help", env={"COLUMNS": "80"}).stdout
        wide = [line for line in out.splitlines() if len(line) > 80]
        if wide:
            too_wide[" ".join(words)] = wide
    assert not too_wide, too_wide


def test_u56_the_region_default_is_told_one_way_in_its_resolution_order(cli, ct_home):
    """U56: `launch --region` said "the AWS configuration's", catalog and estimate
    "config.yaml, AWS_REGION, the AWS profile, else us-east-1", data push "the AWS
    profile's, or config.yaml's". Every --region now says the one order the commands
    follow, which this checks against what `catalog` takes."""
    import click

    said = {" ".join(words): p.help for words, command in _commands()
            for p in command.params if isinstance(p, click.Option) and p.name == "region"}
    assert {"launch", "catalog", "estimate", "check", "data push"} <= set(said), said
    defaults = {help.split("(default: ", 1)[1] for help in said.values()}
    assert defaults == {"`region:` in config.yaml, then AWS_REGION, AWS_DEFAULT_REGION, the "
                        "AWS profile's, else us-east-1)."}, said
    clean = {k: None for k in os.environ if k.startswith("AWS_")}

    def region(config_region=None, **env):
        (ct_home / "config.yaml").write_text(f"region: {config_region}\n" if config_region
                                             else "")
        full = {k: v for k, v in {**os.environ, **clean, **env}.items() if v is not None}
        full.update(AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
        proc = subprocess.run([sys.executable, "-m", "cloudtrain", "catalog", "--json"],
                              capture_output=True, text=True, cwd=REPO, env=full)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["region"]

    assert region("eu-west-1", AWS_REGION="us-west-2", AWS_DEFAULT_REGION="us-east-2") == \
        "eu-west-1"
    assert region(None, AWS_REGION="us-west-2", AWS_DEFAULT_REGION="us-east-2") == "us-west-2"
    assert region(None, AWS_DEFAULT_REGION="us-east-2") == "us-east-2"
    assert region(None) == "us-east-1"


def test_u56_recover_says_who_relaunches(cli):
    """U56: `--recover`'s help said "a supervisor on this machine does it", untrue with
    `instance_profile:` set (AWS Auto Scaling relaunches then)."""
    text = " ".join(cli.ok("launch", "--help").stdout.split())
    recover = text[text.index("--recover / --no-recover"):text.index("--max-restarts")]
    assert "AWS Auto Scaling relaunches it where `instance_profile:` is set" in recover
    assert "else a supervisor on this machine does, only while this machine is on" in recover


def test_resume_from_continues_from_the_last_checkpoint(cli, toy_recipes, ct_home):
    first = cli("launch", "--recipe", "toy", "--set", "epochs=2", "--follow", "--quiet")
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.splitlines()[0]
    proc = cli("launch", "--recipe", "toy", "--set", "epochs=4", "--resume-from", first_id,
               "--follow")
    assert proc.returncode == 0, proc.stderr
    assert "'resume': 'true'" in proc.stdout and "resuming from epoch 2" in proc.stdout
    second = json.loads(cli.ok("status", "--json").stdout)[0]
    lines = (ct_home / "jobs" / second["id"] / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [3, 4]
    # The first job's checkpoint was copied, not moved.
    assert (ct_home / "jobs" / first_id / "checkpoints" / "last.json").exists()


def test_resume_from_refuses_what_cannot_resume(cli, toy_recipes):
    running = cli.launch("--", "sleep", "30")
    cases = [
        (["--recipe", "toy", "--resume-from", "nope"], "no job 'nope'"),
        (["--resume-from", running, "--", "true"], "give --recipe too"),
        (["--recipe", "toy", "--resume-from", running], "the job is still running"),
    ]
    for args, message in cases:
        proc = cli("launch", *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    cli.ok("down", running)
    proc = cli("launch", "--recipe", "toy", "--resume-from", running)
    assert proc.returncode == 2 and "not recipe toy" in proc.stderr


@pytest.mark.parametrize("exc, code, line", [
    (OSError(28, "No space left on device", "/home/u/.cloudtrain/state.db"), 1,
     "Error: No space left on device: /home/u/.cloudtrain/state.db"),
    (PermissionError(13, "Permission denied", "/home/u/.cloudtrain/jobs/x/output.log"), 1,
     "Error: Permission denied: /home/u/.cloudtrain/jobs/x/output.log"),
    (RecursionError("maximum recursion depth exceeded"), 2,
     "Error: an input is nested too deeply to read (a YAML or JSON file, or an argument)"),
    # C2: move-it-aside advice only where a check finds the file unusable (test_state_cli)
    (sqlite3.DatabaseError("database disk image is malformed"), 1,
     "Error: {home}/state.db failed (database disk image is malformed), and it could not be "
     "checked: there is no such file"),
    (sqlite3.OperationalError("database is locked"), 1,
     "Error: {home}/state.db is locked by another cloudtrain process (database is locked)"),
])
def test_catch_all_maps_environment_failures_to_designed_errors(ct_home, monkeypatch, capsys,
                                                                exc, code, line):
    """The environment's failures (a full disk, a file not ours to write, a database that went
    bad mid-command, input nested too deeply) are one designed line, not "internal error";
    a bug of ours still is one."""
    from cloudtrain import cli, config

    def fail():
        raise exc

    monkeypatch.setattr(config.Settings, "load", staticmethod(fail))
    with pytest.raises(SystemExit) as info:
        cli.main(["status"])
    err = capsys.readouterr().err
    assert info.value.code == code, err
    assert err.splitlines()[0] == line.format(home=ct_home), err
    assert "internal error" not in err


def test_catch_all_still_reports_our_bugs(ct_home, monkeypatch, capsys):
    from cloudtrain import cli, config

    def fail():
        raise KeyError("first line\nsecond line")

    monkeypatch.setattr(config.Settings, "load", staticmethod(fail))
    with pytest.raises(SystemExit) as info:
        cli.main(["status"])
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert err == ("Error: internal error: KeyError: 'first line\\nsecond line' (run again with "
                   "--debug for the traceback)\n")


@pytest.mark.parametrize("verb, points_to", [
    ("queue", "cloudtrain status"), ("ps", "cloudtrain status"), ("cancel", "cloudtrain down JOB"),
    ("stop", "cloudtrain down JOB"), ("exec", "cloudtrain launch --on JOB -- CMD"),
    ("tunnel", "cloudtrain forward JOB PORT"),
    ("apply", "cloudtrain launch job.yaml")])
def test_u32_other_tools_verbs_point_to_ours(cli, verb, points_to):
    """U32: SkyPilot's and dstack's verbs got click's `No such command` with no pointer."""
    proc = cli(verb, "x")
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[0] == f"Error: cloudtrain has no {verb} command"
    assert lines[1].startswith(f"Hint: use {points_to}")


CTRL_C_ON_IMPORT = """
import os, signal, sys

class CtrlC:
    # Ctrl-C exactly while the CLI loads: when `{module}` is first imported
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
"""


@pytest.mark.parametrize("module", ["click", "cloudtrain.job_views"])
def test_U30_ctrl_c_while_the_command_loads_is_one_line(ct_home, tmp_path, module):
    """U30: The first fraction of a second goes to importing the CLI: a Ctrl-C then is the same
    one line as later, never a traceback."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(CTRL_C_ON_IMPORT.format(module=module))
    env = {**os.environ, "PYTHONPATH": str(hook)}
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "status"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "interrupted"


@pytest.mark.parametrize("args, text", [
    (("launch", "job.yaml", "--dry-run"), 'envs: {"A\\ntouch /tmp/x": 1}\nrun: echo ok\n'),
    (("launch", "job.yaml", "--dry-run"), 'recipe: resnet9\nargs: {"a\\nb": 1}\n'),
    (("launch", "job.yaml", "--dry-run"), 'recipe: resnet9\nprofile: "a\\nb\\u001b[2J"\n'),
    (("launch", "--recipe", "resnet9", "--set", "a\nb=1", "--dry-run"), None),
    (("launch", "--recipe", "resnet9", "--profile", "a\nb", "--dry-run"), None),
])
def test_B2_an_error_quoting_a_newline_of_the_input_is_still_one_line(cli, tmp_path, args,
                                                                      text):
    """Found by benchmarks/audit_figures.py (injection launches): an env name, a recipe
    argument or a profile holding a newline (or an escape) was quoted as it was, and the
    error went on over a second line that began with the rest of the input. Every error is
    one line: what it quotes shows its newlines as \\n and its escapes as \\x1b."""
    if text is not None:
        (tmp_path / "job.yaml").write_text(text)
        args = tuple(str(tmp_path / a) if a == "job.yaml" else a for a in args)
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("Error: ") and all(l.startswith("Hint: ") for l in lines[1:]), \
        proc.stderr
    assert "\\n" in lines[0] and "\x1b" not in proc.stderr


def test_B2_a_hint_laid_out_on_lines_of_ours_keeps_them(cli):
    """B2 escapes what an error quotes from the input; a hint that shows a config.yaml example
    on lines of its own keeps them (it had become one line with literal \\n in it)."""
    proc = cli("launch", "--recipe", "imagenet", "--set", "variant=machines-4", "--instance",
               "p3.16xlarge", "--spot", "--dry-run")
    assert proc.returncode == 2
    assert "Hint: declare it once in config.yaml, e.g.\n  datasets:\n    imagenet: " \
           "s3://my-bucket/imagenet\n" in proc.stderr, proc.stderr


def test_a_job_reference_that_is_not_utf8_is_no_job(cli):
    for command in ("status", "logs", "down"):
        proc = cli(command, "\udcff")  # what Python makes of a lone 0xff byte in argv
        assert proc.returncode == 2 and "no job" in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr


def test_a_workdir_name_too_long_is_a_usage_error(cli):
    proc = cli("launch", "-q", "--workdir", "a" * 100_000, "--", "true")
    assert proc.returncode == 2 and "File name too long" in proc.stderr, proc.stderr
