"""Issue 16: the job file's schema and parser (cloudtrain/jobfile.py), fuzzed."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain import jobfile
from cloudtrain.errors import UsageError


def test_every_key_maps_to_a_launch_option_of_the_cli():
    """issue 16: one schema the flags share: each job file key sets a parameter `launch`
    has (or one the spec reads directly: run's command, regions)."""
    from cloudtrain.cli import launch

    params = {p.name for p in launch.params}
    for key in jobfile.KEYS:
        assert key.option in params or key.option in ("run", "regions"), key
    assert len({k.option for k in jobfile.KEYS}) == len(jobfile.KEYS)


def test_a_complete_file_becomes_the_flags_own_values():
    """issue 16: every kind of value is turned into what the flag would give."""
    text = """
name: full
workdir: src
setup: pip install -r requirements.txt
run: |
  python train.py
envs: {A: 1, B: true, C: text, D: null}
secrets: {TOKEN: null}
outputs: [results, model.pt]
include: [.env]
datasets: {imagenet: "s3://bkt/imagenet", cifar10: null}
resources:
  backend: aws
  instance: g5.xlarge
  spot: true
  region: eu-west-1
  regions: [eu-west-1, us-east-1]
  disk_gb: 200
  max_runtime: 2h
  max_price: 1.5
  nodes: 2
  keep: false
  idle_minutes: 10
  recover: true
  max_restarts: 4
  fallback: on-demand
"""
    o = jobfile.parse(text)
    assert o["command"] == ("python train.py\n",) and "run" not in o
    assert o["envs"] == ("A=1", "B=true", "C=text", "D") and o["secrets"] == ("TOKEN",)
    assert o["data"] == ("imagenet=s3://bkt/imagenet", "cifar10")
    assert o["max_runtime"] == 120.0 and o["disk_gb"] == 200 and o["spot"] is True
    assert o["regions"] == ("eu-west-1", "us-east-1") and o["fallback"] == "on-demand"
    assert o["instance_type"] == "g5.xlarge" and o["keep"] is False and o["nodes"] == 2


def test_merge_lets_typed_flags_win_and_repeated_ones_add_up():
    """issue 16: flags override the file; --set/--env/--data/... add to its lists."""
    from_file = {"name": "a", "sets": ("seed=1", "epochs=2"), "envs": ("X=1",), "spot": True}
    merged = jobfile.merge(from_file, {"name": "b", "sets": ("seed=3",), "spot": False})
    assert merged == {"name": "b", "sets": ("seed=1", "epochs=2", "seed=3"),
                      "envs": ("X=1",), "spot": False}


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_text_is_a_job_file_or_one_line_error(text):
    """issue 16: whatever is in the file, the answer is options or a one-line UsageError."""
    try:
        options = jobfile.parse(text, "f.yaml")
    except UsageError as exc:
        assert "\n" not in exc.message and exc.message.startswith("f.yaml")
    else:
        assert isinstance(options, dict)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=True), st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)
KEY_NAMES = st.sampled_from([k.path.split(".")[-1] for k in jobfile.KEYS] +
                            ["resources", "spott", "cloud", "Name", ""])


@given(st.dictionaries(KEY_NAMES, st.one_of(VALUES, st.dictionaries(KEY_NAMES, VALUES,
                                                                    max_size=4)), max_size=8))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_structure_is_checked_without_a_traceback(data):
    """issue 16: wrong types anywhere (lists for names, mappings for numbers, NaN, nested
    junk) give one line naming the key, never another exception."""
    text = yaml.safe_dump(data, allow_unicode=True)
    try:
        options = jobfile.parse(text, "f.yaml")
    except UsageError as exc:
        assert "\n" not in exc.message and exc.message.startswith("f.yaml")
    else:
        for option, value in options.items():
            assert option in {k.option for k in jobfile.KEYS} | {"command"}
            assert value is not None


def test_init_examples_are_valid_job_files():
    """issue 16: what `cloudtrain init` writes parses, for own code and each recipe."""
    from cloudtrain import recipes

    assert jobfile.parse(jobfile.example())["command"] == ("python train.py\n",)
    for name in recipes.names():
        options = jobfile.parse(jobfile.example(recipes.load(name)))
        assert options["recipe"] == name and "command" not in options


def test_environment_words():
    """issue 16: --env KEY=VALUE, KEY from this shell, and the refusals."""
    env = {"HOME_ISH": "/h"}
    assert jobfile.environment(["A=1", "A=2", "HOME_ISH", "E="], "--env", env) == \
        {"A": "2", "HOME_ISH": "/h", "E": ""}
    # a file's `KEY: null` (this shell's value) filled in by a later flag's KEY=VALUE
    assert jobfile.environment(["TOKEN", "TOKEN=x"], "--secret", env) == {"TOKEN": "x"}
    try:
        jobfile.environment(["BAD-NAME=hunter2"], "--secret", env)
    except UsageError as exc:
        assert "hunter2" not in exc.message and "BAD-NAME" in exc.message
    else:
        raise AssertionError("a bad name was taken")
    for word, part in [("1A=x", "expected KEY=VALUE"), ("UNSET_ONE", "is not set here"),
                       ("CLOUDTRAIN_JOB_DIR=x", "set by cloudtrain"), ("A=\0", "NUL")]:
        try:
            jobfile.environment([word], "--env", env)
        except UsageError as exc:
            assert part in exc.message
        else:
            raise AssertionError(word)


def test_the_readme_example_is_a_valid_job_file():
    """issue 16: the README documents the schema with a complete example: it parses, and it
    names every key the schema has (commented-out alternatives included)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("### Job files"):]
    block = section[section.index("```yaml\n") + 8:section.index("\n```", section.index(
        "```yaml\n"))]
    options = jobfile.parse(block, "README")
    assert options["command"] == ("python train.py --epochs 30\n",)
    for key in jobfile.KEYS:
        leaf = key.path.rsplit(".", 1)[-1]
        assert f"{leaf}:" in block, f"README's example does not show {key.path}"


def test_envs_and_secrets_keep_their_values_as_written():
    """A job file's environment values are the text the file holds, not YAML 1.1's reading
    of it: a file mode, yes, a time of day and a version number reach the job as typed."""
    o = jobfile.parse("run: python train.py\n"
                      "envs: {MODE: 0755, FLAG: yes, AT: 12:30, V: 1.50, HEX: 0x1F, "
                      "Q: '007', T: True, N: 3, OFF: null}\n"
                      "secrets: {PIN: 0123, KEY: null}\n")
    assert o["envs"] == ("MODE=0755", "FLAG=yes", "AT=12:30", "V=1.50", "HEX=0x1F", "Q=007",
                         "T=True", "N=3", "OFF")
    assert o["secrets"] == ("PIN=0123", "KEY")


@pytest.mark.parametrize("text, error", [
    ("envs: {PORT: 8080, <<: {MODE: off}}", "job.yaml:2: envs: a merge key"),
    ("secrets: &s {K: 0755}\nenvs: {A: 010, <<: *s}", "job.yaml:3: envs: a merge key"),
    ("envs: {A: 1, A: 0755}", "job.yaml:2: envs.A: given twice"),
])
def test_envs_that_would_not_line_up_with_the_file_are_refused(text, error):
    """A merge key or a name given twice in envs/secrets is one line naming it: the values
    as written could otherwise land on the wrong variable."""
    with pytest.raises(UsageError, match=re.escape(error)):
        jobfile.parse("run: python train.py\n" + text + "\n")


def test_a_date_in_envs_stays_as_typed():
    o = jobfile.parse("run: x\nenvs: {WHEN: 2001-12-14 21:59:43.10, DAY: 2001-12-14}\n")
    assert o["envs"] == ("WHEN=2001-12-14 21:59:43.10", "DAY=2001-12-14")
