"""providers/aws/images.py against moto in this process: which Deep Learning AMI a launch
takes (RA1)."""

from __future__ import annotations

import boto3
import pytest

from labs.aws import ec2_provider, publish_parameter  # noqa: F401  (fixture)
from labs.credentials import REGION
from test_aws_errors import _refuse
from cloudtrain.providers.aws import images

PATH = images.DLAMI_PATH


def _image(name: str) -> str:
    return boto3.client("ec2", region_name=REGION).register_image(
        Name=name, RootDeviceName="/dev/sda1")["ImageId"]


@pytest.fixture
def published(ec2_provider):  # noqa: F811
    """The DLAMIs of PyTorch 2.9, 2.10 and 2.12 (Ubuntu 24.04, x86_64), and parameters under
    the same path that are not one: another OS, the base AMI, an Arm image, a value that is
    not an AMI id."""
    amis = {}
    for version in ("2.9", "2.10", "2.12"):
        amis[version] = _image(f"Deep Learning OSS Nvidia Driver AMI GPU PyTorch {version} "
                               "(Ubuntu 24.04) 20261101")
        publish_parameter(f"{PATH}oss-nvidia-driver-gpu-pytorch-{version}-ubuntu-24.04/latest/ami-id",
                 amis[version])
    publish_parameter(f"{PATH}oss-nvidia-driver-gpu-pytorch-2.13-amazon-linux-2023/latest/ami-id",
             _image("al2023"))
    publish_parameter(f"{PATH}base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id", _image("base"))
    publish_parameter("/aws/service/deeplearning/ami/arm64/oss-nvidia-driver-gpu-pytorch-2.14-ubuntu-"
             "24.04/latest/ami-id", _image("arm"))
    publish_parameter(f"{PATH}oss-nvidia-driver-gpu-pytorch-3.0-ubuntu-24.04/latest/ami-id", "not-an-ami")
    return ec2_provider, amis


def test_RA1_the_launch_takes_the_newest_pytorch_dlami_published(published):
    """RA1: the image was the PyTorch 2.9 DLAMI, pinned by its parameter's name; 2.9's patches
    ended on 2026-10-15 while 2.10 to 2.12 were published. The newest version under the
    DLAMI path wins, compared as numbers (2.10 after 2.9), and only Ubuntu 24.04 x86_64
    PyTorch images with an AMI id count."""
    p, amis = published
    name, ami = images.newest_dlami(p.aws, REGION)
    assert (name, ami) == (f"{PATH}oss-nvidia-driver-gpu-pytorch-2.12-ubuntu-24.04/latest/"
                           "ami-id", amis["2.12"])
    assert images.resolve_ami(p.aws, REGION) == amis["2.12"]
    assert images.resolve_ami(p.aws, REGION, "ami-0123456789abcdef0") == "ami-0123456789abcdef0"


def test_RA1_a_policy_without_the_listing_falls_back_to_the_2_9_parameter(published):
    p, amis = published
    _refuse(p.aws.client("ssm", REGION), "GetParametersByPath", "AccessDeniedException",
            "User: arn:aws:iam::123456789012:user/u is not authorized to perform: "
            "ssm:GetParametersByPath")
    assert images.resolve_ami(p.aws, REGION) == amis["2.9"]


def test_RA1_with_nothing_published_and_no_image_by_name_it_says_what_to_pass(
        ec2_provider):  # noqa: F811
    from cloudtrain.providers.aws.errors import AWSError

    assert images.newest_dlami(ec2_provider.aws, REGION) is None
    with pytest.raises(AWSError) as err:
        images.resolve_ami(ec2_provider.aws, REGION)
    assert err.value.message == f"no AWS Deep Learning PyTorch AMI found in {REGION}"
    assert "--ami" in err.value.hint
