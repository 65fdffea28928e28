"""cloudtrain/cli/__init__.py (main: exit statuses, one designed error) end to end.

Property-based fuzzing of what users type and what lies on disk (audit area 6, F21-F25):
command-line arguments, config.yaml and the rows of state.db. Whatever the input, the CLI
ends with exit status 0, 1 or 2, and a failure is a designed `Error: ...` line (or click's
usage message), never a traceback or "internal error".

The CLI runs in-process (`cloudtrain.cli.main`) against a real CLOUDTRAIN_HOME and a real
SQLite database. Bounded and reproducible: derandomized, a fixed number of examples each, the
whole file in well under a minute on two cores. Commands that would reach a cloud or start a
job (`--refresh`, `down JOB`, `attach`, `ssh`, `launch` without `--dry-run`) are left out.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from datetime import timedelta

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from cloudtrain import config
from conftest import TOY_RECIPE
from test_state_cli import ended_job, readers, run


def fuzz(examples: int) -> settings:
    """Bounded and reproducible: the same `examples` inputs on every run."""
    return settings(max_examples=examples, deadline=timedelta(seconds=5), derandomize=True,
                    database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                          HealthCheck.too_slow])


def assert_designed(argv: list[str], code: int, stderr: str) -> None:
    assert "Traceback" not in stderr and "internal error" not in stderr, (argv, stderr)
    assert code in (0, 1, 2), (argv, code, stderr)
    if code:
        first = stderr.lstrip("\n").splitlines()[0] if stderr.strip() else ""
        assert first.startswith("Error: "), (argv, stderr)  # click's usage errors too (U20)


# -- command-line arguments ----------------------------------------------------------------

NASTY = ["", " ", "-", "--", "nan", "-nan", "inf", "-inf", "1e400", "-1", "0", "1", "0.5",
         str(10 ** 20), "9" * 5000, "a" * 100_000, "\n", "a\nb", "\x00", "\x1b[31mred",
         "evil\u202etxt", "é", "%", "_", "\\", "'", '"', "$(id)", "; id", "../../x", "/",
         "~nobody_such_user/x", "us-east-1", "us-gov-west-1", "US-EAST-1", "us-east-1; id",
         "g5.xlarge", "p3.2xlarge", "ami-0123456789abcdef0", "V100:1", "V100:nan", "V100:0",
         "V100:-1", "A100:1e9", "30d", "5x", "nand", "-5d", "infd", "1e400d", "job", "recipe",
         "instance", "day", "month", "resnet9", "airbench94", "smoke", "deadbeef", "spot"]
SET_KEYS = ["epochs", "gpus", "runs", "lr", "variant", "batch_size", "seed", "tta_level",
            "data", "x", ""]

VALUES = st.one_of(st.sampled_from(NASTY), st.text(max_size=12),
                   st.integers().map(str), st.floats().map(repr))
SETS = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(SET_KEYS), VALUES) | VALUES

# command: (options taking a value, flags, whether it takes positional arguments)
COMMANDS = {
    "launch": (["--recipe", "--profile", "--set", "--name", "--backend", "--workdir",
                "--max-runtime", "--instance", "--gpus", "--procs", "--region", "--ami",
                "--disk-gb", "--max-price", "--idle-minutes", "--on", "--resume-from",
                "--include"], ["--spot", "--on-demand", "--keep", "--quiet"], True),
    "status": (["--limit"], ["--json"], True),
    "logs": (["--tail"], [], True),
    "estimate": (["--recipe", "--profile", "--set", "--instance", "--gpus", "--region",
                  "--disk-gb"], ["--spot", "--json"], False),
    "cost-report": (["--since", "--by"], ["--json", "--csv"], False),
    "catalog": (["--gpu", "--region"], ["--json"], False),
    "recipes": ([], [], True),
    "down": (["--grace"], [], False),
}
RECIPES = st.sampled_from(["resnet9", "airbench94", "wide-resnet34"]) | VALUES


@st.composite
def command_lines(draw) -> list[str]:
    name = draw(st.sampled_from(sorted(COMMANDS)))
    options, flags, positional = COMMANDS[name]
    argv = [name]
    for option in draw(st.lists(st.sampled_from(options), max_size=4)) if options else []:
        value = draw(RECIPES if option == "--recipe" else SETS if option == "--set" else VALUES)
        argv += [option, value]
    argv += draw(st.lists(st.sampled_from(flags), max_size=2, unique=True)) if flags else []
    if name == "launch":
        argv.append("--dry-run")  # validate and plan; never start a job
        if draw(st.booleans()):
            argv += ["--", *draw(st.lists(VALUES, min_size=1, max_size=3))]
    elif positional and draw(st.booleans()):
        argv.append(draw(VALUES))
    return argv


@fuzz(600)
@given(argv=command_lines())
def test_fuzz_command_line_arguments(ct_home, argv):
    code, stderr = run(argv)
    assert_designed(argv, code, stderr)


# -- config.yaml ------------------------------------------------------------------------------

SETTING_NAMES = [f.name for f in dataclasses.fields(config.Settings)]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10),
                    st.sampled_from(NASTY[:40]))
YAML_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
KEYS = st.one_of(st.sampled_from(SETTING_NAMES), st.sampled_from(SETTING_NAMES).map(
    lambda k: k.replace("_", "-")), st.integers(), st.none(), st.floats(), st.text(max_size=8))
CONFIGS = st.one_of(
    st.dictionaries(KEYS, YAML_VALUES, max_size=5).map(
        lambda d: yaml.safe_dump(d, allow_unicode=True).encode()),
    st.dictionaries(st.sampled_from(SETTING_NAMES), SCALARS, min_size=1, max_size=4).map(
        lambda d: yaml.safe_dump(d).encode()),
    st.text(max_size=60).map(str.encode),
    st.binary(max_size=60),
)


@fuzz(300)
@given(text=CONFIGS)
def test_fuzz_config_yaml(ct_home, text):
    (ct_home / "config.yaml").write_bytes(text)
    for argv in (["status"], ["launch", "--dry-run", "--", "true"]):
        code, stderr = run(argv)
        assert_designed(argv, code, stderr)
        assert code in (0, 2), (text, argv, stderr)


# -- state.db rows ----------------------------------------------------------------------------

COLUMNS = {
    "jobs": ["spec", "host", "metrics", "cost_detail", "created_at", "started_at", "ended_at",
             "cost", "cost_settled", "exit_code", "state", "name", "command", "kind", "backend",
             "recipe", "reason", "jobdir", "launcher", "lease_until"],
    # Not launched_at, terminated_at, price_per_hour, market, instance_type: whether an
    # instance's times and prices agree is cost.py's to judge (it raises ValueError on a run
    # that ends before it starts), and the ledger's to report as "cost unknown".
    "instances": ["details", "state", "region", "zone", "provider"],
    "events": ["phase", "at", "detail"],
}
JSON_KEYS = ["train_loss", "test_acc", "epoch", "epochs", "loss", "time", "kind", "phases",
             "to_target", "notes", "remote_jobdir", "tmux_socket", "spot_history", "disk_gb",
             "gp3_per_gb_month", "expected", "recipe", "target", "metric", "x"]
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 63 - 1), st.floats(),
              st.text(max_size=8)),
    lambda inner: st.lists(inner, max_size=3) |
    st.dictionaries(st.sampled_from(JSON_KEYS), inner, max_size=3), max_leaves=6)
CELLS = st.one_of(
    st.none(), st.integers(-2 ** 63, 2 ** 63 - 1), st.floats(), st.text(max_size=20),
    st.binary(max_size=20), st.sampled_from(["{not json", "[1, 2]", "null", '"s"', "NaN"]),
    st.dictionaries(st.sampled_from(JSON_KEYS), JSON_VALUES, max_size=4).map(json.dumps),
)
EDITS = st.lists(st.tuples(st.sampled_from(sorted(COLUMNS)), st.data()), min_size=1, max_size=3)


@fuzz(150)
@given(edits=st.lists(st.tuples(st.sampled_from(sorted(COLUMNS)), st.integers(0, 99), CELLS),
                      min_size=1, max_size=3))
def test_fuzz_state_db_rows(ct_home, edits):
    db_path = ct_home / "state.db"
    for suffix in ("", "-wal", "-shm"):
        (ct_home / f"state.db{suffix}").unlink(missing_ok=True)
    job_id = ended_job(ct_home)
    db = sqlite3.connect(db_path)
    for table, pick, value in edits:
        column = COLUMNS[table][pick % len(COLUMNS[table])]
        key = "id" if table == "jobs" else "job_id"
        try:
            db.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (value, job_id))
        except sqlite3.IntegrityError:
            pass  # NOT NULL: a state SQLite itself refuses to hold
    db.commit()
    db.close()
    for argv in readers(job_id):
        code, stderr = run(argv)
        assert_designed(argv, code, stderr)


# -- recipe.yaml (a user's recipe on CLOUDTRAIN_RECIPES) ------------------------------------

TOY = yaml.safe_load(TOY_RECIPE)
PLACES = [(), ("arguments",), ("arguments", "epochs"), ("arguments", "mode"), ("profiles",),
          ("profiles", "smoke"), ("profiles", "smoke", "set"), ("resources",), ("published",)]
RECIPE_KEYS = st.sampled_from(["name", "description", "entry", "requires", "arguments",
                               "profiles", "resources", "data", "target", "published", "type",
                               "default", "choices", "set", "gpus_per_node", "nodes", "disk_gb",
                               "max_runtime_minutes", "launcher", "gpus_per_variant", "epochs",
                               "mode", "smoke", "seconds", "gpu"]) | st.text(max_size=5)


@fuzz(80)
@given(edits=st.lists(st.tuples(st.sampled_from(PLACES), RECIPE_KEYS, YAML_VALUES),
                      min_size=1, max_size=3))
def test_fuzz_recipe_yaml(toy_recipes, edits):
    doc = json.loads(json.dumps(TOY))
    for place, key, value in edits:
        target = doc
        for step in place:
            target = target.get(step) if isinstance(target, dict) else None
        if isinstance(target, dict):
            target[key] = value
    (toy_recipes / "toy" / "recipe.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True))
    for argv in (["recipes"], ["recipes", "toy"],
                 ["launch", "--recipe", "toy", "--profile", "smoke", "--dry-run"]):
        code, stderr = run(argv)
        assert_designed(argv, code, stderr)
