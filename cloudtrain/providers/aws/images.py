"""The AMI: the Deep Learning AMI by its SSM parameter (or newest by name), and its root device."""

from __future__ import annotations

from .errors import AWSError, aws_errors
from .session import AwsSession

# The AWS Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9 (Ubuntu 24.04) by its SSM public
# parameter; its Python is /opt/pytorch/bin/python (DLAMI release notes). The newest image
# matching the name is the fallback when SSM is not reachable.
DLAMI_PARAMETER = ("/aws/service/deeplearning/ami/x86_64/"
                   "oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id")
DLAMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 24.04) *"


def resolve_ami(aws: AwsSession, region: str, ami: str | None = None) -> str:
    if ami:
        return ami
    try:
        with aws_errors(region, "ssm"):
            return aws.client("ssm", region).get_parameter(
                Name=DLAMI_PARAMETER)["Parameter"]["Value"]
    except AWSError as exc:
        if not exc.code:  # unreachable, not refused: the name lookup would fail the same
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
