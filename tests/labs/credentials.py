"""The one fake AWS account every lab and test uses: moto accepts any keys, and these never
reach a real endpoint (AWS_EC2_METADATA_DISABLED and the absent config files keep botocore
from finding real ones)."""

from __future__ import annotations

REGION = "us-east-1"
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"

# as boto3.client(...) keyword arguments
CLIENT_CREDS = {"aws_access_key_id": ACCESS_KEY_ID, "aws_secret_access_key": SECRET_ACCESS_KEY}
# as a process's environment: the keys only
KEYS_ENV = {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY}
# no ~/.aws files: a developer's own profile never leaks into a test
NO_AWS_FILES = {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}


def aws_env(region: str = REGION) -> dict[str, str]:
    """The environment of a process that talks to the lab's AWS in `region` (add
    AWS_ENDPOINT_URL)."""
    return {**KEYS_ENV, "AWS_DEFAULT_REGION": region, "AWS_REGION": region, **NO_AWS_FILES,
            "AWS_EC2_METADATA_DISABLED": "true"}


AWS_ENV = aws_env(REGION)


def in_moto(monkeypatch, lab):
    """A lab installed on in-process moto (`mock_aws`) under the fake account's keys, for a
    lab's own tests: yields `lab` (an object with install(monkeypatch)), installed."""
    from moto import mock_aws

    for name, value in KEYS_ENV.items():
        monkeypatch.setenv(name, value)
    installed = lab.install(monkeypatch)
    with mock_aws():
        yield installed
