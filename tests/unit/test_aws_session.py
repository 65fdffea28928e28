"""AwsSession (cloudtrain/providers/aws/session.py): boto3 sessions and clients of one user."""

from __future__ import annotations

import re

import botocore.loaders
import pytest

from cloudtrain.config import Settings
from cloudtrain.providers.aws import AWSProvider


@pytest.fixture
def two_profiles(tmp_path, monkeypatch):
    """An AWS config with two profiles of their own keys and regions, and nothing else of
    this machine's (no environment credentials, no ~/.aws)."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_DATA_PATH"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "credentials").write_text(
        "[alice]\naws_access_key_id = AKIAALICE\naws_secret_access_key = a\n"
        "[bob]\naws_access_key_id = AKIABOB\naws_secret_access_key = b\n")
    (tmp_path / "config").write_text("[profile alice]\nregion = eu-west-1\n"
                                     "[profile bob]\nregion = us-west-2\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))


def test_a_second_provider_parses_no_service_model_again(two_profiles, monkeypatch):
    """`status` asks one provider per AWS job, and each made its own boto3 session, which
    parsed EC2's, S3's and Auto Scaling's service models again: 0.33 s of CPU per job here,
    0.08 s with the models shared. The parsed models are shared by every session of the
    process; nothing else is."""
    read: list[str] = []
    real = botocore.loaders.JSONFileLoader.load_file

    def counting(self, file_path):
        read.append(file_path)
        return real(self, file_path)

    monkeypatch.setattr(botocore.loaders.JSONFileLoader, "load_file", counting)
    first = AWSProvider(Settings(aws_profile="alice")).aws
    for service in ("ec2", "s3", "autoscaling"):
        first.client(service, "eu-west-1")
    read.clear()  # (the first read them, unless an earlier test of this process did)
    second = AWSProvider(Settings(aws_profile="alice")).aws
    for service in ("ec2", "s3", "autoscaling"):
        second.client(service, "eu-west-1")
        second.client(service, "us-east-1")
    assert read == []


def test_sessions_keep_their_own_profile_credentials_and_region(two_profiles):
    """What is shared is parsed JSON only: each provider's profile, keys and default region
    stay its own, whichever was made first."""
    alice = AWSProvider(Settings(aws_profile="alice")).aws
    bob = AWSProvider(Settings(aws_profile="bob")).aws
    assert alice.session().region_name == "eu-west-1"
    assert bob.session().region_name == "us-west-2"
    assert alice.session().get_credentials().access_key == "AKIAALICE"
    assert bob.session().get_credentials().access_key == "AKIABOB"
    assert alice.client("s3", "eu-west-1")._request_signer._credentials.access_key == "AKIAALICE"
    assert bob.client("s3", "eu-west-1")._request_signer._credentials.access_key == "AKIABOB"
    assert alice.session("ap-south-1").region_name == "ap-south-1"
    assert alice.session().region_name == "eu-west-1"  # a region's session moved no other
    # the loader's search path does not grow with each session made
    paths = alice.session()._loader.search_paths
    assert len(paths) == len(set(paths))


def test_RE2_every_role_arn_profile_without_a_session_name_gets_the_stable_one():
    """RE2: name_role_sessions names the sessions botocore would name after their start time,
    and leaves every other profile (and a session name the user chose) as it is."""
    from cloudtrain.providers.aws.session import name_role_sessions, stable_session_name

    config = {"profiles": {
        "ci": {"role_arn": "arn:aws:iam::1:role/r", "source_profile": "base"},
        "named": {"role_arn": "arn:aws:iam::1:role/r", "role_session_name": "jane"},
        "base": {"aws_access_key_id": "AKIA"},
        "chained": {"role_arn": "arn:aws:iam::1:role/s", "source_profile": "ci"}}}
    assert name_role_sessions(config) == ["ci", "chained"]
    assert config["profiles"]["ci"]["role_session_name"] == stable_session_name()
    assert config["profiles"]["chained"]["role_session_name"] == stable_session_name()
    assert config["profiles"]["named"]["role_session_name"] == "jane"
    assert "role_session_name" not in config["profiles"]["base"]
    assert name_role_sessions({}) == []
    assert re.fullmatch(r"cloudtrain-[\w+=,.@-]{1,53}", stable_session_name(), re.ASCII)
