"""Issue 16: the job file's schema and parser (cloudtrain/jobfile.py), fuzzed."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain import job_template, jobfile
from cloudtrain.errors import UsageError
from cloudtrain.launch_options import LaunchOptions


def test_every_key_maps_to_a_launch_option_of_the_cli():
    """issue 16: one schema the flags share: each job file key sets a parameter `launch`
    has (or one the spec reads directly: run's command, regions)."""
    from cloudtrain.cli.launching import launch

    params = {p.name for p in launch.params}
    for key in jobfile.KEYS:
        assert key.option in params or key.option in ("run", "regions"), key
    assert len({k.option for k in jobfile.KEYS}) == len(jobfile.KEYS)


def test_a_complete_file_becomes_the_flags_own_values(tmp_path):
    """issue 16: every kind of value is turned into what the flag would give."""
    (tmp_path / "src").mkdir()
    text = """
name: full
workdir: src
setup: pip install -r requirements.txt
run: |
  python train.py
envs: {A: 1, B: true, C: text, D: null}
secrets: {TOKEN: null}
outputs: [results, model.pt]
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
    o = jobfile.parse(text, "job.yaml", tmp_path)
    assert o.command == ("python train.py\n",) and not hasattr(o, "run")
    assert o.workdir == str((tmp_path / "src").resolve())
    assert o.envs == ("A=1", "B=true", "C=text", "D") and o.secrets == ("TOKEN",)
    assert o.data == ("imagenet=s3://bkt/imagenet", "cifar10")
    assert o.max_runtime == 120.0 and o.disk_gb == 200 and o.spot is True
    assert o.regions == ("eu-west-1", "us-east-1") and o.fallback == "on-demand"
    assert o.instance_type == "g5.xlarge" and o.keep is False and o.nodes == 2


def test_merge_lets_typed_flags_win_and_repeated_ones_add_up():
    """issue 16: flags override the file; --set/--env/--data/... add to its lists."""
    from_file = LaunchOptions(name="a", sets=("seed=1", "epochs=2"), envs=("X=1",), spot=True)
    merged = LaunchOptions(name="b", sets=("seed=3",), spot=False).over(from_file)
    assert merged == LaunchOptions(name="b", sets=("seed=1", "epochs=2", "seed=3"),
                                   envs=("X=1",), spot=False)


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_text_is_a_job_file_or_one_line_error(text):
    """issue 16: whatever is in the file, the answer is options or a one-line UsageError."""
    try:
        options = jobfile.parse(text, "f.yaml")
    except UsageError as exc:
        assert "\n" not in exc.message and exc.message.startswith("f.yaml")
    else:
        assert isinstance(options, LaunchOptions)


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
        for option, value in options.given().items():
            assert option in {k.option for k in jobfile.KEYS} | {"command"}
            assert value is not None


def test_init_examples_are_valid_job_files():
    """issue 16: what `cloudtrain init` writes parses, for own code and each recipe."""
    from cloudtrain import recipes

    assert jobfile.parse(job_template.example()).command == ("python train.py\n",)
    for name in recipes.names():
        options = jobfile.parse(job_template.example(recipes.load(name)))
        assert options.recipe == name and options.command == ()


def test_the_readme_example_is_a_valid_job_file():
    """issue 16: the README documents the schema with a complete example: it parses, and it
    names every key the schema has (commented-out alternatives included)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("### Job files"):]
    block = section[section.index("```yaml\n") + 8:section.index("\n```", section.index(
        "```yaml\n"))]
    options = jobfile.parse(block, "README")
    assert options.command == ("python train.py --epochs 30\n",)
    for key in jobfile.KEYS:
        leaf = key.path.rsplit(".", 1)[-1]
        assert f"{leaf}:" in block, f"README's example does not show {key.path}"


def test_envs_and_secrets_keep_their_values_as_written():
    """A job file's environment values are the text the file holds, not YAML 1.1's reading
    of it: a file mode, yes, a time of day and a version number reach the job as typed."""
    o = jobfile.parse("run: python train.py\n"
                      "envs: {MODE: 0755, FLAG: yes, AT: 12:30, V: 1.50, HEX: 0x1F, "
                      "Q: '007', T: True, N: 3, OFF: null}\n"
                      "secrets: {KEY: null, NO: null}\n")
    assert o.envs == ("MODE=0755", "FLAG=yes", "AT=12:30", "V=1.50", "HEX=0x1F", "Q=007",
                         "T=True", "N=3", "OFF")
    assert o.secrets == ("KEY", "NO")


@pytest.mark.parametrize("text, error", [
    ("envs: {PORT: 8080, <<: {MODE: off}}", "job.yaml:2: envs: a merge key"),
    ("resources:\n  <<: {spot: true}", "job.yaml:3: resources: a merge key"),
    ("envs: {A: 1, A: 0755}", "job.yaml:2: envs.A: given twice"),
])
def test_envs_that_would_not_line_up_with_the_file_are_refused(text, error):
    """A merge key or a name given twice in envs/secrets is one line naming it: the values
    as written could otherwise land on the wrong variable."""
    with pytest.raises(UsageError, match=re.escape(error)):
        jobfile.parse("run: python train.py\n" + text + "\n")


def test_a_date_in_envs_stays_as_typed():
    o = jobfile.parse("run: x\nenvs: {WHEN: 2001-12-14 21:59:43.10, DAY: 2001-12-14}\n")
    assert o.envs == ("WHEN=2001-12-14 21:59:43.10", "DAY=2001-12-14")


# -- F27: a job file is code from someone else's repository --------------------------------


def _repo(tmp_path):
    """A home directory with keys in it, and a cloned repository two levels below."""
    home = tmp_path / "victim"
    for rel in (".aws/credentials", ".ssh/id_ed25519", "code/repo/src/train.py"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(rel)
    return home, home / "code" / "repo"


@pytest.mark.parametrize("workdir", ["../..", "..", "~/", "/", "src/../..", "VICTIM"])
def test_F27_a_job_files_workdir_stays_in_its_directory(tmp_path, workdir):
    """Audit F27: `workdir:` is read from the job file's directory and may not leave it: a
    cloned repository's job file cannot send the home directory it was cloned into."""
    home, repo = _repo(tmp_path)
    workdir = workdir.replace("VICTIM", str(home))
    (repo / "job.yaml").write_text(f"name: innocent\nworkdir: {workdir}\nrun: ls\n")
    with pytest.raises(UsageError) as exc:
        jobfile.load(repo / "job.yaml")
    assert exc.value.message.startswith(f"{repo / 'job.yaml'}:2: workdir: "), exc.value.message
    assert "outside" in exc.value.message and "\n" not in exc.value.message
    assert "--workdir" in exc.value.hint


def test_F27_a_symlink_out_of_the_job_files_directory_is_refused(tmp_path):
    """Audit F27: a link in the repository pointing out of it is resolved before the check."""
    home, repo = _repo(tmp_path)
    (repo / "data").symlink_to(home)
    (repo / "job.yaml").write_text("workdir: data\nrun: ls\n")
    with pytest.raises(UsageError, match=r"job\.yaml:1: workdir: 'data' is outside"):
        jobfile.load(repo / "job.yaml")


def test_F27_workdir_is_relative_to_the_job_file_not_the_current_directory(tmp_path,
                                                                             monkeypatch):
    """Audit F27: the same file means the same directory wherever launch runs."""
    home, repo = _repo(tmp_path)
    (repo / "job.yaml").write_text("workdir: src\nrun: python train.py\n")
    monkeypatch.chdir(home)  # home has no src/: the file's directory decides
    assert jobfile.load(repo / "job.yaml").workdir == str((repo / "src").resolve())
    (repo / "job.yaml").write_text("workdir: nope\nrun: ls\n")
    with pytest.raises(UsageError, match=r"job\.yaml:1: workdir: 'nope' is not a directory"):
        jobfile.load(repo / "job.yaml")


def test_F27_a_typed_workdir_replaces_the_files_without_its_check(tmp_path):
    """Audit F27: the refusal's hint works: --workdir, typed by the user, may point anywhere,
    and the file's own workdir is then not read at all."""
    home, repo = _repo(tmp_path)
    (repo / "job.yaml").write_text("workdir: ../..\nrun: ls\n")
    assert jobfile.load(repo / "job.yaml", typed={"workdir"}).workdir is None


@pytest.mark.parametrize("include", ['[".aws/**", ".ssh/**"]', ".env", "'*'", "[notes.txt]"])
def test_F27_a_job_file_cannot_include_credentials(tmp_path, include):
    """Audit F27: only the --include flag sends a credential-looking file; `include:` in a
    job file is refused whatever it names (it has no other use)."""
    home, repo = _repo(tmp_path)
    (repo / "job.yaml").write_text(f"name: x\nworkdir: .\ninclude: {include}\nrun: ls\n")
    with pytest.raises(UsageError) as exc:
        jobfile.load(repo / "job.yaml")
    assert exc.value.message.startswith(f"{repo / 'job.yaml'}:3: include: "), exc.value.message
    assert "--include" in exc.value.hint


# -- F33, F38: hostile values ------------------------------------------------------------------


def _alias_bomb(key: str, levels: int = 9) -> str:
    """The audit's file: each level a list of ten aliases of the one before (10^9 items)."""
    rows = ['  - &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    rows += [f"  - &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return f"{key}:\n" + "\n".join(rows) + "\nrun: echo hi\n"


@pytest.mark.parametrize("key", ["name", "setup", "workdir", "outputs", "include",
                                 "resources:\n  nodes", "args"])
def test_F33_anchors_and_aliases_are_refused_before_anything_expands_them(key):
    """Audit F33: a 9-level alias bomb is one line naming the file and the line where the
    first anchor is, under a memory and time bound (it took 15 GB, or a MemoryError)."""
    import resource
    import subprocess
    import sys

    text = _alias_bomb(key.replace("resources:\n  nodes", "resources:\n  nodes"))
    limit = 512 << 20

    def bounded():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    code = ("import sys\nfrom cloudtrain import jobfile\nfrom cloudtrain.errors import "
            "UsageError\ntry:\n    jobfile.parse(sys.stdin.read(), 'bomb.yaml')\n"
            "except UsageError as exc:\n    print(exc.message)\n")
    proc = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True,
                          text=True, timeout=20, preexec_fn=bounded)
    assert proc.returncode == 0, proc.stderr
    line = 3 if key.startswith("resources") else 2
    assert proc.stdout == (f"bomb.yaml:{line}: YAML anchors and aliases (&name, *name) are not "
                           "supported in a job file; write the value out\n"), proc.stdout


def test_F33_an_alias_alone_is_refused_where_it_is():
    with pytest.raises(UsageError, match=r"^job\.yaml:1: YAML anchors"):
        jobfile.parse("name: &n x\nrun: *n\n")
    with pytest.raises(UsageError, match=r"^job\.yaml:1: YAML anchors"):
        jobfile.parse("name: *n\n")  # an alias of nothing: still the same line, not YAML's


def test_F33_a_wrong_type_shows_a_bounded_value():
    """Audit F33: the value a type error shows is cut (reprlib), never repr() whole."""
    with pytest.raises(UsageError) as exc:
        jobfile.parse("name: [" + ", ".join(["x" * 1000] * 1000) + "]\nrun: echo\n")
    assert len(exc.value.message) < 400, exc.value.message  # 1 MB of text in the file


@pytest.mark.parametrize("text, key", [
    ("run: x\nargs: {epochs: NUM}\n", "job.yaml:2: args.epochs"),
    ("run: x\nresources: {disk_gb: NUM}\n", "job.yaml:2: resources.disk_gb"),
    ("run: x\nresources:\n  max_price: NUM\n", "job.yaml:3: resources.max_price"),
    ("run: x\nenvs: {N: NUM}\n", "job.yaml:2: envs.N"),
    ("run: x\nname: NUM\n", "job.yaml:2: name"),
    ("run: x\nargs:\n  ? NUM\n  : 1\n", "job.yaml:3: args"),
])
@pytest.mark.parametrize("number", ["9" * 4301, "-" + "9" * 5000, "0x" + "f" * 4000])
def test_F38_an_integer_too_long_to_show_is_one_line(text, key, number):
    """Audit F38: an integer over 4300 digits (Python's limit for turning it into text) in
    args or a numeric key was a ValueError traceback; a hex one of 4000 digits is one too."""
    with pytest.raises(UsageError) as exc:
        jobfile.parse(text.replace("NUM", number))
    assert exc.value.message.startswith(key + ": a number of "), exc.value.message
    assert "no setting takes one" in exc.value.message


def test_F38_a_value_yaml_cannot_build_is_one_line():
    with pytest.raises(UsageError, match=r"^job\.yaml:2: envs\.WHEN: YAML cannot read "):
        jobfile.parse("run: x\nenvs: {WHEN: 2001-13-45}\n")


def test_F38_inline_secret_values_are_refused_and_never_shown():
    """Audit F38: a secret's value written into the job file travels with the workdir (it
    was found in jobs/<id>/work/job.yaml): refused, with the two ways to give it."""
    with pytest.raises(UsageError) as exc:
        jobfile.parse("run: x\nsecrets:\n  OK: null\n  TOKEN: hunter2-value\n")
    assert exc.value.message.startswith("job.yaml:4: secrets.TOKEN: a secret's value does not "
                                        "belong in a job file")
    assert "hunter2" not in exc.value.message + (exc.value.hint or "")
    assert "TOKEN: null" in exc.value.hint and "--secret TOKEN=VALUE" in exc.value.hint


@pytest.mark.parametrize("region", ["$(id)", "../x", "US-EAST-1", "us-east-1\n"])
def test_F38_regions_are_checked_as_region_names(region):
    """Audit F38: resources.regions passed --dry-run unchecked; checked as --region is."""
    with pytest.raises(UsageError) as exc:
        jobfile.parse("run: x\nresources:\n  regions: [us-east-1, " + json_str(region) + "]\n")
    assert exc.value.message.startswith("job.yaml:3: resources.regions: "), exc.value.message
    assert "unknown AWS region" in exc.value.message


def json_str(text: str) -> str:
    import json

    return json.dumps(text)


def test_U33_the_init_setup_line_neither_hides_failures_nor_logs_a_missing_file(tmp_path):
    """U33: `pip install -r requirements.txt || true` logged an ERROR in every project
    without one and hid real install failures: without the file the line does nothing,
    with a broken one it fails."""
    import subprocess
    import sys
    from pathlib import Path

    example = job_template.example()
    setup = example.split("setup: |")[1].splitlines()[1].strip()
    assert "|| true" not in setup and "requirements.txt" in setup
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    quiet = subprocess.run(["bash", "-c", setup], cwd=tmp_path, capture_output=True,
                           text=True, env=env, timeout=60)
    assert quiet.returncode == 0 and quiet.stdout == quiet.stderr == "", quiet
    (tmp_path / "requirements.txt").write_text("this is not !! a requirement\n")
    broken = subprocess.run(["bash", "-c", setup], cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=60)
    assert broken.returncode != 0, broken


def test_U34_init_for_a_recipe_says_the_profile_is_optional():
    """U34: the profile line `init --recipe` writes says how to leave it out."""
    from cloudtrain import recipes

    text = job_template.example(recipes.load("resnet9"))
    line = next(line for line in text.splitlines() if line.startswith("profile:"))
    assert line.startswith("profile: smoke") and "optional" in line and "--profile none" in line
