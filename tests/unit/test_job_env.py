"""A job's environment variables (cloudtrain/job_env.py): the words of --env / --secret and
a job file's envs: / secrets:, and what a job file may take from this shell (audit F39)."""

from __future__ import annotations

import pytest

from cloudtrain import job_env, jobfile
from cloudtrain.errors import UsageError
from cloudtrain.launch_options import LaunchOptions


def test_environment_words():
    """issue 16: --env KEY=VALUE, KEY from this shell, and the refusals."""
    env = {"HOME_ISH": "/h"}
    assert job_env.environment(["A=1", "A=2", "HOME_ISH", "E="], "--env", env) == \
        {"A": "2", "HOME_ISH": "/h", "E": ""}
    # a file's `KEY: null` (this shell's value) filled in by a later flag's KEY=VALUE
    assert job_env.environment(["TOKEN", "TOKEN=x"], "--secret", env) == {"TOKEN": "x"}
    with pytest.raises(UsageError) as exc:
        job_env.environment(["BAD-NAME=hunter2"], "--secret", env)
    assert "hunter2" not in exc.value.message and "BAD-NAME" in exc.value.message
    for word, part in [("1A=x", "expected KEY=VALUE"), ("UNSET_ONE", "is not set here"),
                       ("CLOUDTRAIN_JOB_DIR=x", "set by cloudtrain"), ("A=\0", "NUL")]:
        with pytest.raises(UsageError) as exc:
            job_env.environment([word], "--env", env)
        assert part in exc.value.message


@pytest.mark.parametrize("name", [
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "aws_secret_access_key", "AZURE_CLIENT_SECRET",
    "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING", "ARM_CLIENT_SECRET",
    "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_AUTH_ACCESS_TOKEN", "OS_PASSWORD",
    "DIGITALOCEAN_ACCESS_TOKEN", "ALIBABA_CLOUD_ACCESS_KEY_SECRET", "HCLOUD_TOKEN"])
def test_F39_cloud_credentials_are_known(name):
    """F39: each cloud's credential variables (and those that point at a credential file)."""
    assert job_env.cloud_credential(name) and job_env.credential_like(name)


@pytest.mark.parametrize("name, credential_like", [
    ("AWS_REGION", False), ("AWS_DEFAULT_REGION", False), ("AWS_PROFILE", False),
    ("AZURE_CLIENT_ID", False), ("WANDB_API_KEY", True), ("GITHUB_TOKEN", True),
    ("HF_TOKEN", True), ("PGPASSWORD", True), ("DB_PASSWORD", True), ("MY_SECRET_THING", True),
    ("NPM_CONFIG_CREDENTIALS", True), ("WANDB_PROJECT", False), ("PYTHONHASHSEED", False)])
def test_F39_other_names_are_not_cloud_credentials(name, credential_like):
    """F39: a region, a profile's name or another service's token is not a cloud credential
    (asked, not refused); the credential-like ones are said as such in the question."""
    assert not job_env.cloud_credential(name)
    assert job_env.credential_like(name) is credential_like


def _taken(text: str, **typed) -> list[job_env.Taken]:
    options = LaunchOptions.of(typed).over(jobfile.parse(text, "job.yaml"))
    return job_env.taken(options.envs, options.secrets, options.origins)


def test_F39_taken_names_what_comes_from_this_shell_and_where():
    """F39: the null values of a job file are taken from this shell with their file:line;
    a typed word replaces the file's (its place goes), a typed value is not taken."""
    text = ("run: x\nenvs:\n  MODE: fast\n  WANDB_PROJECT: null\n"
            "secrets:\n  WANDB_API_KEY: null\n  GITHUB_TOKEN: ~\n")
    assert _taken(text) == [
        job_env.Taken("WANDB_PROJECT", "envs", "job.yaml:4: envs.WANDB_PROJECT"),
        job_env.Taken("WANDB_API_KEY", "secrets", "job.yaml:6: secrets.WANDB_API_KEY"),
        job_env.Taken("GITHUB_TOKEN", "secrets", "job.yaml:7: secrets.GITHUB_TOKEN")]
    assert _taken(text, secrets=("GITHUB_TOKEN", "WANDB_API_KEY=v"), envs=("EXTRA",)) == [
        job_env.Taken("WANDB_PROJECT", "envs", "job.yaml:4: envs.WANDB_PROJECT"),
        job_env.Taken("EXTRA", "envs", None),
        job_env.Taken("GITHUB_TOKEN", "secrets", None)]


def test_F39_a_job_file_naming_cloud_credentials_is_refused_a_typed_one_is_not():
    """F39: the audit's job file (AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, GITHUB_TOKEN)
    is refused in one line naming the file, the line and the key, with the flag that sends
    it; the same names typed are the user's."""
    text = ("run: echo got\nsecrets:\n  AWS_SECRET_ACCESS_KEY: null\n  AWS_SESSION_TOKEN: ~\n"
            "  GITHUB_TOKEN: ~\n")
    with pytest.raises(UsageError) as exc:
        job_env.refuse_cloud_credentials(_taken(text))
    assert exc.value.message.startswith("job.yaml:3: secrets.AWS_SECRET_ACCESS_KEY: a job "
                                        "file cannot take your cloud credentials")
    assert "\n" not in exc.value.message
    assert exc.value.hint == ("to send AWS_SECRET_ACCESS_KEY to the job, type --secret "
                              "AWS_SECRET_ACCESS_KEY on the command line")
    with pytest.raises(UsageError, match=r"job.yaml:2: envs.AWS_ACCESS_KEY_ID"):
        job_env.refuse_cloud_credentials(_taken("run: x\nenvs: {AWS_ACCESS_KEY_ID: null}\n"))
    job_env.refuse_cloud_credentials(_taken(text, secrets=("AWS_SECRET_ACCESS_KEY",
                                                           "AWS_SESSION_TOKEN")))
    # a value the file writes itself is not this shell's
    job_env.refuse_cloud_credentials(_taken("run: x\nenvs: {AWS_ACCESS_KEY_ID: AKIAFAKE}\n"))


def test_F39_the_question_names_each_value_and_the_refusal_the_command_that_sends_them():
    """F39: what a job file takes from this shell is one question naming each value, its
    key and line (credential-like ones said as such); without a terminal one line whose
    hint is the command that sends them; nothing to ask for what was typed."""
    text = "run: x\nenvs: {WANDB_PROJECT: null}\nsecrets: {WANDB_API_KEY: null}\n"
    asked = job_env.consent(_taken(text), "sub/job.yaml")
    assert asked.said == ("sub/job.yaml takes 2 values from your environment into the job: "
                          "WANDB_PROJECT (envs, line 2), WANDB_API_KEY (secrets, line 3, "
                          "credential-like)")
    assert asked.ask == "Send them?"
    assert asked.refusal.message == ("job.yaml:2: envs.WANDB_PROJECT: sub/job.yaml takes 2 "
                                     "values from your environment (WANDB_PROJECT, "
                                     "WANDB_API_KEY) and there is no terminal to ask")
    assert asked.refusal.hint == ("to send them, type them: cloudtrain launch sub/job.yaml "
                                  "--env WANDB_PROJECT --secret WANDB_API_KEY")
    one = job_env.consent(_taken(text, envs=("WANDB_PROJECT",)), "job.yaml")
    assert one.said.endswith("a value from your environment into the job: WANDB_API_KEY "
                             "(secrets, line 3, credential-like)") and one.ask == "Send it?"
    assert one.refusal.hint == "to send it, type it: cloudtrain launch job.yaml --secret " \
                               "WANDB_API_KEY"
    assert job_env.consent(_taken(text, envs=("WANDB_PROJECT",),
                                  secrets=("WANDB_API_KEY",)), "job.yaml") is None
