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


@pytest.mark.parametrize("name, user", [
    ("al2023-ami-2023.6.20261101.0-kernel-6.1-x86_64", "ec2-user"),
    ("Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.10 (Amazon Linux 2023) 20261101",
     "ec2-user"),
    ("amzn2-ami-kernel-5.10-hvm-2.0.20261101.0-x86_64-gp2", "ec2-user"),
    ("ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20261101", "ubuntu"),
    ("debian-12-amd64-20261101-1923", "admin"),
    ("RHEL-9.4.0_HVM-20261101-x86_64-0-Hourly2-GP3", "ec2-user"),
    ("Rocky-9-EC2-Base-9.4-20261101.0.x86_64", "rocky"),
])
def test_RA5_an_image_of_the_user_s_own_is_logged_in_to_as_its_distribution_s_user(
        ec2_provider, name, user):  # noqa: F811
    """RA5: every instance was logged in to as ubuntu, the DLAMI's user; an Amazon Linux
    image (--ami, the AL2023 DLAMI) lets in ec2-user, Debian's admin (AWS's list of default
    user names). The image's name says which; the plan says the user and why."""
    got, why = images.login_user(ec2_provider.aws, REGION, _image(name))
    assert got == user and name in why


def test_RA5_the_default_image_an_unknown_one_and_ssh_user_in_config(ec2_provider):  # noqa: F811
    aws = ec2_provider.aws
    assert images.login_user(aws, REGION, None) == ("ubuntu",
                                                    "the default image's (Ubuntu 24.04)")
    mine = _image("my-golden-image-7")
    user, why = images.login_user(aws, REGION, mine)
    assert user == "ubuntu" and "set ssh_user in config.yaml" in why
    aws.settings.ssh_user = "researcher"
    assert images.login_user(aws, REGION, mine) == ("researcher", "ssh_user in config.yaml")


# -- RG5: the local NVMe the default image mounts ------------------------------------------------


def test_RG5_the_deep_learning_ami_mounts_the_type_s_nvme_at_opt_dlami_nvme():
    """RG5: the DLAMI's release notes give nvme_location /opt/dlami/nvme: a job on the default
    image of a type with NVMe instance store has it there, every disk of it (the catalog's
    count x size); the copies go to a folder of cloudtrain's below it."""
    assert images.NVME_MOUNT == "/opt/dlami/nvme"
    g5 = images.local_nvme("g5.xlarge", None)
    assert g5 == {"path": "/opt/dlami/nvme", "dir": "/opt/dlami/nvme/cloudtrain/data",
                  "disks": 1, "gb": 250.0}
    assert images.local_nvme("p4d.24xlarge", None)["gb"] == 8000.0
    assert images.local_nvme("p4d.24xlarge", None)["disks"] == 8


@pytest.mark.parametrize("name, ami, why", [
    ("p3.2xlarge", None, "p3.2xlarge's image (Ubuntu 24.04, for Volta) mounts no local NVMe"),
    ("p3dn.24xlarge", None,
     "p3dn.24xlarge's image (Ubuntu 24.04, for Volta) mounts no local NVMe"),
    ("g5.xlarge", "ami-0123456789abcdef0",
     "--ami: cloudtrain knows of no local NVMe your image mounts"),
    ("g5g.xlarge", None, "g5g.xlarge has no local NVMe instance store"),
    ("zz9.huge", None, "zz9.huge is not in the bundled catalog: its local disks are unknown"),
])
def test_RG5_no_local_nvme_on_volta_s_ubuntu_your_own_image_or_a_type_without(name, ami, why):
    """RG5: p3dn has NVMe, but its Ubuntu image (image_kind VOLTA) mounts nothing; --ami is the
    user's image, of which nothing is known; g5g has no instance store."""
    assert images.local_nvme(name, ami) == {"path": None, "why": why}


def test_RG5_the_estimate_s_rule_is_the_provider_s_for_every_type():
    """RG5: the estimate (above the providers) decides by the catalog what the AWS provider
    decides by image_kind: the same answer for every type, with and without --ami."""
    from cloudtrain import catalog, estimate

    for name in catalog.load():
        for ami in (None, "ami-0123456789abcdef0"):
            mounted = images.local_nvme(name, ami)
            assert estimate.local_nvme(name, own_image=bool(ami)) == (
                (mounted["disks"], mounted["gb"]) if mounted["path"] else None), (name, ami)
