"""cloudtrain/cmdline.py: what launch says of an option it does not know (U3, D15). The hint
is a command line that must not change what runs: launch's own options stay before `--`."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, strategies as st

from cloudtrain.cli.launching import launch
from cloudtrain.cmdline import Options, unknown_option
from cloudtrain.jobfile import is_job_file


def launch_options() -> Options:
    """launch's real options, as the CLI computes them."""
    import click

    opts = [p for p in launch.params if isinstance(p, click.Option)]
    return Options(valued=frozenset(o for p in opts if not p.is_flag for o in p.opts),
                   flags=frozenset(o for p in opts if p.is_flag
                                   for o in (*p.opts, *p.secondary_opts)) | {"-h", "--help"})


OPTIONS = launch_options()


def advise(line: str):
    words = shlex.split(line)
    unknown = next(w for w in words if w.startswith("-") and not OPTIONS.known(w))
    return unknown_option(words, unknown.split("=", 1)[0], OPTIONS, is_job_file)


def test_u3_launch_options_typed_after_the_command_stay_before_the_double_dash():
    advice = advise("--instance g5.xlarge --spot python train.py --epochs 1 --dry-run")
    assert advice.message == ("--epochs is not an option of cloudtrain launch; your own "
                              "command goes after --")
    # --dry-run stays launch's: the hint is still a dry run, not a real spot launch
    assert advice.hint == ("cloudtrain launch --instance g5.xlarge --spot --dry-run -- python "
                           "train.py --epochs 1")


def test_u3_d15_the_own_command_hint_as_before():
    advice = advise("-n x python train.py --epochs 1")
    assert advice.hint == "cloudtrain launch -n x -- python train.py --epochs 1"


def test_u3_a_recipe_argument_given_as_an_option_is_set_with_set():
    advice = advise("--recipe resnet9 --epochs 3 --dry-run")
    assert advice.message == ("--epochs is not an option of cloudtrain launch; a recipe "
                              "argument is --set KEY=VALUE")
    assert advice.hint == "cloudtrain launch --recipe resnet9 --set epochs=3 --dry-run"
    assert advise("-r resnet9 --epochs=3").hint == "cloudtrain launch -r resnet9 --set epochs=3"


def test_u3_an_option_the_recipe_does_not_have_either_is_said_without_a_wrong_hint():
    advice = advise("--recipe resnet9 --epoch 3")
    assert "nor an argument of the resnet9 recipe (did you mean --set epochs=...?)" in \
        advice.message
    assert advice.hint == "cloudtrain recipes resnet9 lists its arguments"


def test_u3_an_unknown_option_before_any_command_word_suggests_no_double_dash():
    advice = advise("-c mycluster proj/r9.yaml --dry-run")
    assert advice.message == "-c is not an option of cloudtrain launch"
    assert "--" not in advice.hint.replace("--help", "").replace("goes after --", "")
    plain = advise("--dryrun")
    assert plain.message == "--dryrun is not an option of cloudtrain launch (did you mean " \
                            "--dry-run?)"


def test_u3_after_a_job_file_options_stay_launchs():
    advice = advise("job.yaml --epochs 3")
    assert advice.message == "--epochs is not an option of cloudtrain launch"
    assert "--set KEY=VALUE" in advice.hint


WORD = st.sampled_from(["python", "train.py", "--epochs", "1", "--dry-run", "--spot", "-y",
                        "--instance", "g5.xlarge", "--lr=0.1", "--name", "x", "-q", "3"])


@given(st.lists(WORD, min_size=1, max_size=10))
def test_u3_the_hint_never_moves_a_launch_option_behind_the_double_dash(words):
    """Fuzzed: whatever the words, every launch option in the hint is before its `--`, and the
    command words keep their order after it."""
    words = ["python", *words, "--bogus"]
    if words[-2] in OPTIONS.valued:
        return  # click reads --bogus as that option's value: it is not unknown there
    advice = unknown_option(words, "--bogus", OPTIONS, is_job_file)
    assert advice is not None
    if advice.hint and advice.hint.startswith("cloudtrain launch ") and " -- " in advice.hint:
        hinted = shlex.split(advice.hint)[2:]
        cut = hinted.index("--")
        after = hinted[cut + 1:]
        assert not any(OPTIONS.known(w) and (w in OPTIONS.flags or "=" in w or
                                             w in OPTIONS.valued) for w in after), advice.hint
        assert sorted(hinted[:cut] + after) == sorted(words)  # nothing lost, nothing added


def test_u46_the_hint_adds_workdir_when_the_command_names_a_file_here(tmp_path, monkeypatch):
    """U46: `launch python train.py --lr 0.1` with train.py here hinted `cloudtrain launch
    -- python train.py --lr 0.1`, which then failed (`train.py is here, but without
    --workdir the job runs in an empty directory`). The hint now has `--workdir .`, unless
    a workdir is given already or the file is not here."""
    from cloudtrain.preflight import script_here

    monkeypatch.chdir(tmp_path)

    def hint(line: str) -> str:
        words = shlex.split(line)
        unknown = next(w for w in words if w.startswith("-") and not OPTIONS.known(w))
        return unknown_option(words, unknown, OPTIONS, is_job_file, script_here).hint

    assert hint("python train.py --lr 0.1") == "cloudtrain launch -- python train.py --lr 0.1"
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert hint("python train.py --lr 0.1") == \
        "cloudtrain launch --workdir . -- python train.py --lr 0.1"
    assert hint("--spot python train.py --lr 0.1 --dry-run") == \
        "cloudtrain launch --spot --dry-run --workdir . -- python train.py --lr 0.1"
    assert hint("-w src python train.py --lr 0.1") == \
        "cloudtrain launch -w src -- python train.py --lr 0.1"
