"""The AMI: the Deep Learning AMI by its SSM parameter (or newest by name), and its root device."""

from __future__ import annotations

import re

from .errors import AWSError, aws_errors
from .session import AwsSession

# The AWS Deep Learning OSS Nvidia Driver AMI GPU PyTorch X.Y (Ubuntu 24.04): the newest X.Y
# that AWS publishes under DLAMI_PATH (SSM public parameters, one per PyTorch version; each
# version gets patches for a year, then none: a pinned one ages into an unpatched image). Its
# Python is /opt/pytorch/bin/python (DLAMI release notes). Where the listing is refused (a
# policy from before ssm:GetParametersByPath), the 2.9 parameter; where SSM is not reachable
# at all, the newest image matching the name.
DLAMI_PATH = "/aws/service/deeplearning/ami/x86_64/"
DLAMI_FAMILY = re.compile(r"oss-nvidia-driver-gpu-pytorch-(\d{1,3})\.(\d{1,3})-ubuntu-24\.04"
                          r"/latest/ami-id")
DLAMI_PARAMETER = DLAMI_PATH + "oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id"
DLAMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 24.04) *"
AMI_ID = re.compile(r"ami-[0-9a-f]{8,17}")


def newest_dlami(aws: AwsSession, region: str) -> tuple[str, str] | None:
    """(SSM parameter, AMI id) of the newest PyTorch DLAMI under DLAMI_PATH in `region` (the
    highest PyTorch version), None where none is published there; AWSError where SSM refuses
    or cannot be reached."""
    best: tuple[tuple[int, int], str, str] | None = None
    with aws_errors(region, "ssm"):
        pages = aws.client("ssm", region).get_paginator("get_parameters_by_path").paginate(
            Path=DLAMI_PATH, Recursive=True, PaginationConfig={"PageSize": 10})
        for page in pages:
            for parameter in page.get("Parameters") or []:
                name, value = parameter.get("Name") or "", parameter.get("Value") or ""
                found = DLAMI_FAMILY.fullmatch(name[len(DLAMI_PATH):]) \
                    if name.startswith(DLAMI_PATH) else None
                if found and AMI_ID.fullmatch(value):
                    version = (int(found[1]), int(found[2]))
                    if best is None or version > best[0]:
                        best = (version, name, value)
    return (best[1], best[2]) if best else None


DLAMI_TORCH = re.compile(r"PyTorch (\d{1,3})\.(\d{1,3})")


def local_torch() -> str | None:
    """This machine's torch version (where the recipes are tested), None without one."""
    try:
        import importlib.metadata

        return importlib.metadata.version("torch")
    except Exception:  # not installed here: nothing to compare with
        return None


def software_said(name: str, asked: str | None) -> str:
    """What the plan can say of an image's software before it boots: for the PyTorch DLAMI,
    its torch (by its name), where the job's Python is, NVIDIA's open driver (Turing and
    newer) and that the instance reads the exact versions at setup; for --ami, only that."""
    found = DLAMI_TORCH.search(name or "")
    if asked or not found:
        return (": your image; the job's torch, CUDA build and driver are read at setup "
                "(the timeline's software line)")
    torch = f"{found[1]}.{found[2]}"
    here = local_torch()
    differs = f"; this machine has torch {here}" if here and ".".join(
        here.split("+")[0].split(".")[:2]) != torch else ""
    return (f": torch {torch} at /opt/pytorch/bin/python, built for the CUDA of NVIDIA's "
            f"open driver it carries (Turing and newer GPUs){differs}; the exact torch, CUDA "
            "and driver are read at setup (the timeline's software line), and the job stops "
            "if torch sees no GPU")


def resolve_ami(aws: AwsSession, region: str, ami: str | None = None) -> str:
    if ami:
        return ami
    try:
        newest = newest_dlami(aws, region)
        if newest:
            return newest[1]
    except AWSError as exc:
        if not exc.code:  # unreachable, not refused: every lookup would fail the same
            raise
    try:
        with aws_errors(region, "ssm"):
            return aws.client("ssm", region).get_parameter(
                Name=DLAMI_PARAMETER)["Parameter"]["Value"]
    except AWSError as exc:
        if not exc.code:
            raise
        # ParameterNotFound (not published in this region) or not allowed: by name.
    images = aws.call(region, "describe_images", Owners=["amazon"], Filters=[
        {"Name": "name", "Values": [DLAMI_NAME]}, {"Name": "state", "Values": ["available"]}
    ])["Images"]
    if not images:
        raise AWSError(f"no AWS Deep Learning PyTorch AMI found in {region}",
                       hint="pass --ami ami-... (an Ubuntu image with NVIDIA drivers and PyTorch)")
    return max(images, key=lambda i: i.get("CreationDate", ""))["ImageId"]


def image_facts(aws: AwsSession, region: str, ami: str) -> dict:
    """{id, name, created, architecture, root_device, root_gb} of an AMI (`created`: AWS's
    CreationDate, ISO 8601; `root_device`: its root device's name, /dev/sda1 on Ubuntu,
    /dev/xvda on Amazon Linux: a mapping's size and type apply only under that name;
    `root_gb`: its root snapshot's size, the smallest root volume RunInstances accepts for
    it, None where the image does not say); an AWSError when it does not exist there."""
    images = aws.call(region, "describe_images", ImageIds=[ami])["Images"]
    if not images:
        raise AWSError(f"AMI {ami} does not exist in {region}",
                       hint="check --ami, or leave it out for the Deep Learning AMI")
    image = images[0]
    device = image.get("RootDeviceName") or "/dev/sda1"
    root = next((m.get("Ebs") or {} for m in image.get("BlockDeviceMappings") or []
                 if m.get("DeviceName") == device), {})
    size = root.get("VolumeSize")
    return {"id": image["ImageId"], "name": image.get("Name", ""),
            "created": image.get("CreationDate", ""),
            "architecture": image.get("Architecture", ""), "root_device": device,
            "root_gb": size if isinstance(size, int) and not isinstance(size, bool) else None}


# The user an image lets in over SSH, by the distribution its name says (AWS's list of
# default user names for Linux AMIs, in the EC2 user guide: "Connect to your Linux instance
# using SSH"). Checked in this order: "Ubuntu" before "Amazon Linux" where a name has both.
IMAGE_USERS = (
    (re.compile(r"ubuntu", re.I), "ubuntu"),
    (re.compile(r"debian", re.I), "admin"),
    (re.compile(r"amazon linux|\bamzn|\bal20(23|22)\b|al2023-ami", re.I), "ec2-user"),
    (re.compile(r"\brhel\b|red ?hat", re.I), "ec2-user"),
    (re.compile(r"\bsuse\b|\bsles\b", re.I), "ec2-user"),
    (re.compile(r"rocky", re.I), "rocky"),
    (re.compile(r"centos", re.I), "centos"),
    (re.compile(r"fedora", re.I), "fedora"),
)
DLAMI_USER = "ubuntu"  # the default image: the Ubuntu 24.04 PyTorch DLAMI


def login_user(aws: AwsSession, region: str, ami: str | None) -> tuple[str, str]:
    """(user, why) cloudtrain logs in to an instance of `ami` as: `ssh_user` in config.yaml
    where it is set; for the default image (None) the DLAMI's ubuntu; for the user's own
    image, its distribution's default user by the image's name, read once per process; an
    image whose name names none gets ubuntu, and `why` says to set ssh_user."""
    if aws.settings.ssh_user:
        return aws.settings.ssh_user, "ssh_user in config.yaml"
    if ami is None:
        return DLAMI_USER, "the Deep Learning AMI's"
    key = ("image name", region, ami)
    if key not in aws.clients:
        aws.clients[key] = image_facts(aws, region, ami)["name"]
    name = str(aws.clients[key])
    for pattern, user in IMAGE_USERS:
        if pattern.search(name):
            return user, f"the default user of {ami} ({name})"
    return DLAMI_USER, (f"{ami}'s name ({name or 'none'}) names no distribution this knows: "
                        "set ssh_user in config.yaml if its user is not ubuntu")

