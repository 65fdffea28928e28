"""cloudtrain/cli/launching.py (`launch`, its options) and the refusals shared by other commands.

What `launch` and the other commands refuse up front (F18, F23-F25): one designed line,
exit 2, flags named as they exist, and nothing created."""

from __future__ import annotations

import json

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from cloudtrain import config
from cloudtrain.errors import UsageError
from cloudtrain.launch_options import LaunchOptions
from cloudtrain.spec import build_spec


def _refused(cli, args, message, hint=None):
    proc = cli(*args)
    assert proc.returncode == 2, (args, proc.stderr)
    lines = proc.stderr.splitlines()
    assert lines[0] == f"Error: {message}", (args, proc.stderr)
    assert lines[1:] == ([f"Hint: {hint}"] if hint else []), (args, proc.stderr)


def _no_jobs(cli) -> bool:
    return json.loads(cli.ok("status", "--json").stdout) == []


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "soon", "2 hours", "-5"])
def test_F18_max_runtime_must_be_finite(cli, value):
    """F18, U17: what is not minutes or a duration is one line naming the flag."""
    _refused(cli, ["launch", "--max-runtime", value, "--", "true"],
             f"--max-runtime {config.shown(value)}: expected minutes, or a duration like 90m, "
             "2h, 1d")
    assert _no_jobs(cli)


@pytest.mark.parametrize("value, minutes", [("2h", 120), ("90m", 90), ("1d", 1440),
                                            ("45s", 0.75), ("30", 30), ("1.5h", 90)])
def test_U17_max_runtime_takes_the_job_files_durations(cli, value, minutes):
    """U17: `--max-runtime 2h` was refused as not a float, while a job file's max_runtime
    took it and the README maps one to the other: the same parser; a plain number stays
    minutes."""
    plan = cli.ok("launch", "--max-runtime", value, "--dry-run", "--", "true").stdout
    assert f"max runtime  {minutes:g} min" in plan, plan


def test_F18_max_runtime_is_bounded(cli):
    _refused(cli, ["launch", "--max-runtime", "20000", "--", "true"],
             "--max-runtime (minutes) must be at most 10080, got 20000.0")
    _refused(cli, ["launch", "--max-runtime", "0", "--", "true"],
             "--max-runtime (minutes) must be more than 0, got 0.0")


def test_F18_max_runtime_from_config_and_recipe(cli, ct_home, toy_recipes):
    with open(ct_home / "config.yaml", "a") as f:
        f.write("max_runtime_minutes: .nan\n")
    proc = cli("launch", "--", "true")
    assert proc.returncode == 2 and "'max_runtime_minutes' must be a finite number" in proc.stderr
    (ct_home / "config.yaml").write_text("")
    yml = toy_recipes / "toy" / "recipe.yaml"
    yml.write_text(yml.read_text().replace("max_runtime_minutes: 5", "max_runtime_minutes: .inf"))
    proc = cli("launch", "--recipe", "toy", "--dry-run")
    assert proc.returncode == 2
    assert "resources.max_runtime_minutes must be a finite number" in proc.stderr


@pytest.mark.parametrize("region", ["../../x", "us-east-1; id", "US-EAST-1", "nowhere", "",
                                    "us-east-1\n", "a" * 1000])
def test_F24_region_is_checked_before_boto(cli, region):
    for args in (["launch", "--instance", "g5.xlarge", "--region", region, "--", "true"],
                 ["estimate", "--recipe", "resnet9", "--region", region],
                 ["catalog", "--region", region]):
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("Error: "), (args, proc.stderr)
        first = proc.stderr.splitlines()[0]
        assert first.startswith("Error: unknown AWS region ") and "(from --region" in first or \
            first == "Error: --region needs a value, got ''", (args, proc.stderr)
        assert "internal error" not in proc.stderr
    assert _no_jobs(cli)


def test_F24_real_region_names_pass():
    for region in ("us-east-1", "eu-west-3", "ap-southeast-2", "us-gov-west-1", "il-central-1"):
        assert config.check_region(region, "--region") == region


@pytest.mark.parametrize("name, message", [
    ("a\nb", "--name 'a\\nb': use 1 to 64 letters, digits, '.', '_' or '-', starting with a "
             "letter or digit"),
    ("\x1b[31mred", "--name '\\x1b[31mred': use 1 to 64 letters"),
    ("evil\u202etxt", "--name 'evil\\u202etxt': use 1 to 64 letters"),
    ("x" * 65, "--name 'xxxxxxxxxxxx...xxxxxxxxxxxxx': use 1 to 64 letters"),
    ("-x", "--name '-x': use 1 to 64 letters"),
    ("1", "--name 1: a name of hex digits reads as a job id prefix"),
    ("deadbeef", "--name deadbeef: a name of hex digits reads as a job id prefix"),
])
def test_F25_names_that_break_the_table_or_read_as_ids(cli, name, message):
    proc = cli("launch", "--name", name, "--", "true")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[0].startswith(f"Error: {message}"), proc.stderr
    assert _no_jobs(cli)


def test_F25_good_names_pass(cli):
    for name in ("exp-1", "résumé.v2", "run_2026", "deadbeef0"):
        cli.ok("launch", "--name", name, "--dry-run", "--", "true")


@pytest.mark.parametrize("flag", ["--workdir", "--on", "--gpus", "--instance", "--recipe",
                                  "--resume-from", "--ami", "--region", "--name"])
def test_F25_empty_values_are_refused(cli, flag):
    _refused(cli, ["launch", flag, "", "--", "true"], f"{flag} needs a value, got ''")
    assert _no_jobs(cli)


@pytest.mark.parametrize("args, message", [  # with --backend local: alone they choose aws (D27)
    (["--backend", "local", "--spot"], "--spot applies to cloud backends, not local"),
    (["--backend", "local", "--on-demand"], "--on-demand applies to cloud backends, not local"),
    (["--backend", "local", "--ami", "ami-0123456789abcdef0"],
     "--ami applies to cloud backends, not local"),
    (["--backend", "local", "--disk-gb", "20"], "--disk-gb applies to cloud backends, not local"),
    (["--backend", "local", "--instance", "g5.xlarge"], "--instance applies to cloud backends, "
                                                        "not local"),
])
def test_F25_errors_name_flags_that_exist(cli, args, message):
    _refused(cli, ["launch", *args, "--", "true"], message)


@pytest.mark.parametrize("args, message", [
    (["status", "--limit", "0"], "0 is not in the range x>=1"),
    (["status", "--limit", "-1"], "-1 is not in the range x>=1"),
    (["launch", "--disk-gb", "100000000", "--", "true"], "is not in the range 8<=x<=65536"),
])
def test_F25_click_ranges(cli, args, message):
    proc = cli(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, message", [
    (["launch", "--procs", str(10 ** 20), "--recipe", "resnet9"],
     f"--procs must be between 1 and 1024, got {10 ** 20}"),
    (["launch", "--recipe", "resnet9", "--set", "gpus=0", "--dry-run"],
     "--set gpus: gpus must be at least 1, got 0"),
    (["launch", "--recipe", "resnet9", "--set", "gpus=100000", "--dry-run"],
     "--set gpus: gpus must be at most 64, got 100000"),
    (["launch", "--recipe", "resnet9", "--set", "epochs=-5", "--dry-run"],
     "--set epochs: epochs must be more than 0, got -5"),
    (["estimate", "--recipe", "airbench94", "--set", "epochs=nan"],
     "--set epochs: epochs must be a finite number, got 'nan'"),
    (["estimate", "--recipe", "airbench94", "--set", "epochs=inf"],
     "--set epochs: epochs must be a finite number, got 'inf'"),
    (["launch", "--recipe", "resnet9", "--set", "runs=-1", "--dry-run"],
     "--set runs: runs must be at least 1, got -1"),
    (["cost-report", "--since", "nand"], "--since nand: expected a number and a unit, e.g. "
                                         "30d, 12h, 2w"),
    (["cost-report", "--since", "-5d"], "--since '-5d' must be at least 0, got -432000.0"),
    (["cost-report", "--since", "5x"], "--since 5x: expected a number and a unit, e.g. 30d, "
                                       "12h, 2w"),
    (["down", "--grace", "nan", "x"], "--grace (seconds) must be a finite number, got nan"),
    (["launch", "--instance", "g5.xlarge", "--max-price", "nan", "--", "true"],
     "--max-price (USD per hour) must be a finite number, got nan"),
    (["launch", "--instance", "g5.xlarge", "--idle-minutes", "-1", "--", "true"],
     "--idle-minutes must be at least 0, got -1.0"),
    (["launch", "--instance", "../../x", "--", "true"],
     "unknown instance type '../../x': expected an EC2 instance type, e.g. g5.xlarge"),
    (["launch", "--gpus", "V100:nan", "--region", "us-east-1", "--", "true"],
     "--gpus V100:nan: the count must be a whole number of at least 1"),
    (["launch", "--include", ".env", "--", "true"],
     "--include applies to the files --workdir syncs; give --workdir too"),
    (["launch", "--dry-run", "--", "", "x"], "the command after -- starts with an empty word, ''"),
    (["estimate", "--recipe", "resnet9", "--gpus", ""], "--gpus needs a value, got ''"),
    (["estimate", "--recipe", "resnet9", "--instance", "g5.xlarge", "--instance", " "],
     "--instance needs a value, got ' '"),
    (["catalog", "--gpu", ""], "--gpu needs a value, got ''"),
])
def test_F25_numbers_and_values_are_checked(cli, args, message):
    proc = cli(*args)
    assert proc.returncode == 2, (args, proc.stderr)
    assert proc.stderr.splitlines()[0] == f"Error: {message}", (args, proc.stderr)
    assert _no_jobs(cli)


def test_F25_status_limit_shows_that_many(cli):
    for _ in range(3):
        cli.ok("launch", "--dry-run", "--", "true")  # creates nothing
    assert _no_jobs(cli)
    assert "no jobs yet" in cli.ok("status", "--limit", "1").stdout


def test_include_is_stored_on_the_spec(tmp_path):
    spec = build_spec(LaunchOptions(command=("true",), workdir=str(tmp_path),
                                    include=(".env", ".aws/config")), config.Settings())
    assert spec.include == [".env", ".aws/config"]
    assert spec.to_dict()["include"] == [".env", ".aws/config"]
    assert build_spec(LaunchOptions(command=("true",)), config.Settings()).include == []
    with pytest.raises(UsageError, match="--include '': expected a path pattern"):
        build_spec(LaunchOptions(command=("true",), workdir=str(tmp_path), include=("",)),
                   config.Settings())


def test_F23_recipes_lists_the_good_ones_and_names_the_broken_one(cli, toy_recipes):
    bad = toy_recipes / "r_entry_dir"
    bad.mkdir()
    (bad / "recipe.yaml").write_text("name: r_entry_dir\ndescription: d\n"
                                     "entry: ../../../../etc/hostname\narguments: {}\n")
    proc = cli.ok("recipes")
    assert "toy" in proc.stdout and "resnet9" in proc.stdout
    assert proc.stdout.rstrip().endswith(
        f"broken (fix or remove them):\n  {bad}/recipe.yaml: entry '../../../../etc/hostname' "
        "is outside the recipe folder")
    proc = cli("recipes", "r_entry_dir")
    assert proc.returncode == 2 and "is outside the recipe folder" in proc.stderr
    proc = cli("recipes", "")  # not the list
    assert proc.returncode == 2 and proc.stderr.startswith("Error: unknown recipe ''")
    cli.ok("recipes", "toy")


def test_u45_launch_quiet_prints_only_the_job_id_on_aws_too(cli, aws):
    """U45: `launch -q --instance g5.xlarge -- ...` printed the id and then, on stderr,
    `results: s3://cloudtrain-.../jobs/.../ when the job ends, whoever is watching`; the
    help says "Print only the job id", as it is on the local backend. Without -q the line
    is still said, and the timeline keeps it."""
    proc = cli("launch", "-q", "--instance", "g5.xlarge", "--", "true", timeout=120)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert len(job_id) == 8 and proc.stdout == job_id + "\n", proc.stdout
    assert "results: s3://" not in proc.stderr and proc.stderr == "", proc.stderr
    stored = [p for p in cli.job(job_id)["timeline"] if p["name"] == "results-store"]
    assert stored and stored[0]["detail"].startswith("results: s3://"), stored
    loud = cli("launch", "--instance", "g5.xlarge", "--", "true", timeout=120)
    assert loud.returncode == 0 and "results: s3://" in loud.stderr, loud.stderr
