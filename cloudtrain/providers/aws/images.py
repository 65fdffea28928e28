"""The AMI: the Deep Learning AMI by its SSM parameter (or newest by name), and its root
device; for a Volta type, Ubuntu 24.04 and the GPU software its instance installs at boot."""

from __future__ import annotations

import re
from pathlib import Path

from ... import catalog
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

# The image of a Volta type's job (p3, p3dn: catalog.VOLTA_FAMILIES), which no current DLAMI
# runs: Canonical's Ubuntu 24.04 server, by the SSM public parameter Canonical publishes for
# it (Ubuntu's "Find Ubuntu images on AWS"; 24.04's images are gp3), else the newest by name
# from Canonical's account. Its instance installs at boot (infra/volta-software.sh, run by
# user-data): NVIDIA's proprietary driver of branch 580, the last that runs Volta (NVIDIA's
# Unix driver deprecation schedule), as Ubuntu's signed prebuilt modules for the running
# kernel (no DKMS build), and torch built for CUDA 12.6, the newest CUDA with Volta code
# (sm_70; CUDA 13 dropped it), from PyTorch's own index into VOLTA_VENV. The pair is the one
# the recipes are tested with here.
DLAMI, VOLTA = "dlami", "volta"
UBUNTU_PARAMETER = ("/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/"
                    "ebs-gp3/ami-id")
UBUNTU_NAME = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"
CANONICAL_OWNER = "099720109477"
VOLTA_DRIVER = "580"
VOLTA_CUDA = "12.6"
VOLTA_TORCH = ("torch==2.14.1", "torchvision==0.29.1")
VOLTA_INDEX = "https://download.pytorch.org/whl/cu126"
VOLTA_VENV = "/opt/cloudtrain/torch"
USER_DATA_DONE = "/var/lib/cloudtrain/user-data-done"  # user-data's last act
USER_DATA_LOG = "/var/log/cloudtrain-user-data.log"  # user-data's own log, the install's too
VOLTA_SOFTWARE = Path(__file__).resolve().parents[3] / "infra" / "volta-software.sh"


def image_kind(instance_type: str | None, ami: str | None) -> str | None:
    """The default image a job gets: VOLTA on a Volta type, else DLAMI; None for the
    user's own (--ami), which cloudtrain installs nothing on."""
    if ami:
        return None
    return VOLTA if instance_type and catalog.volta(instance_type) else DLAMI


# Where the Deep Learning AMI mounts the type's NVMe instance store: its release notes give
# nvme_location /opt/dlami/nvme (those of "Deep Learning OSS Nvidia Driver AMI GPU PyTorch
# 2.9 (Ubuntu 24.04)", docs.amazonaws.cn/dlami/latest/devguide/
# aws-deep-learning-ami-gpupt29oss-ul2404-2026-03-20.html, and every later one). They do not
# say whether several disks become one volume, nor who owns its root: the plan counts every
# disk of the type (the catalog's count x size), and the stager checks the mount, its free
# space and whether it can write there (host/stage_disk.py) before the copy, else takes the
# root volume. Free with the type, lost with the instance, as the root volume is.
NVME_MOUNT = "/opt/dlami/nvme"
NVME_DATA = NVME_MOUNT + "/cloudtrain/data"  # the copies' folder there, the job's user's


def local_nvme(instance_type: str | None, ami: str | None) -> dict:
    """The local NVMe a job's default image mounts: {path, dir (the copies' folder), disks, gb
    (all of them)}; or {path: None, why} where there is none to copy onto (the user's own
    image, a Volta type's Ubuntu image, a type without instance store)."""
    kind = image_kind(instance_type, ami)
    if kind is None:
        return {"path": None, "why": "--ami: cloudtrain knows of no local NVMe your image mounts"}
    if kind == VOLTA:
        return {"path": None, "why": f"{instance_type}'s image (Ubuntu 24.04, for Volta) mounts "
                                     "no local NVMe"}
    if not instance_type or catalog.get(instance_type) is None:
        return {"path": None, "why": f"{instance_type} is not in the bundled catalog: its local "
                                     "disks are unknown"}
    found = catalog.instance_store(instance_type)
    if found is None:
        return {"path": None, "why": f"{instance_type} has no local NVMe instance store"}
    disks, each = found
    return {"path": NVME_MOUNT, "dir": NVME_DATA, "disks": disks, "gb": disks * each}


def ready_file(instance_type: str | None, ami: str | None) -> str | None:
    """The file whose existence says a new instance's boot-time install has ended (user-data's
    last marker), where its image has one to wait for; None where it has none."""
    if image_kind(instance_type, ami) != VOLTA:
        return None
    return USER_DATA_DONE


def boot_software(kind: str | None) -> str:
    """The script a job's instance runs at boot to install what its image lacks (user-data
    runs it before it says it is done): for VOLTA, the driver and torch; else nothing."""
    if kind != VOLTA:
        return ""
    return (VOLTA_SOFTWARE.read_text().replace("@@DRIVER_BRANCH@@", VOLTA_DRIVER)
            .replace("@@TORCH_INDEX@@", VOLTA_INDEX).replace("@@VENV@@", VOLTA_VENV)
            .replace("@@TORCH_PACKAGES@@", " ".join(VOLTA_TORCH)))


# infra/volta-software.sh's exit codes: the step that failed.
VOLTA_STEPS = {11: "apt-get update", 12: "installing NVIDIA's driver {branch}-server",
               13: "loading the nvidia kernel module", 14: "making the virtual environment",
               15: "installing torch"}
SOFTWARE_FAILED = "/var/lib/cloudtrain/software-failed"  # user-data writes `exit=N` there


def software_failure(name: str, answer: str) -> str | None:
    """What setup says when an instance's boot-time install failed (None: it did not).
    `answer`: software-failed's `exit=N` line, then the last lines of the install's output
    (user-data's log without its own lines), from the instance: untrusted, only printable
    text of it is repeated."""
    lines = answer.splitlines()
    found = re.fullmatch(r"exit=(\d{1,3})", lines[0].strip()) if lines else None
    if not found:
        return None
    code = int(found[1])
    tail = [re.sub(r"[^\x20-\x7e]", "?", line)[:200] for line in lines[1:] if line.strip()]
    return (f"{name}: the GPU software its image lacks did not install at boot: "
            f"{VOLTA_STEPS.get(code, 'the install').format(branch=VOLTA_DRIVER)} failed "
            f"(exit {code})"
            + (f"; its last line: {tail[-1]}" if tail else ""))


def volta_software() -> str:
    """What the plan says a Volta job's instance installs at boot, and why."""
    return (f"at boot the instance installs NVIDIA's proprietary driver {VOLTA_DRIVER}-server "
            f"(the last branch that runs Volta; the DLAMI's open driver needs Turing or "
            f"newer) and {' + '.join(p.replace('==', ' ') for p in VOLTA_TORCH)} built for "
            f"CUDA {VOLTA_CUDA} (the newest CUDA with Volta code, sm_70) into "
            f"{VOLTA_VENV}: about {catalog.VOLTA_INSTALL_S / 60:.0f} min more before the job "
            "starts (estimated), billed; "
            "the exact torch, CUDA and driver are read at setup (the timeline's software "
            "line), and the job stops if torch sees no GPU")


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


def software_said(name: str, asked: str | None, kind: str | None = DLAMI) -> str:
    """What the plan can say of an image's software before it boots: for the PyTorch DLAMI,
    its torch (by its name), where the job's Python is, NVIDIA's open driver (Turing and
    newer) and that the instance reads the exact versions at setup; for a Volta type's
    Ubuntu, what its instance installs at boot; for --ami, only that it is read at setup."""
    if kind == VOLTA and not asked:
        return f" (Canonical's Ubuntu 24.04); {volta_software()}"
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


def resolve_ami(aws: AwsSession, region: str, ami: str | None = None,
                kind: str | None = DLAMI) -> str:
    """The AMI a job launches: `ami` as given; for VOLTA, Ubuntu 24.04 (newest_ubuntu);
    else the newest PyTorch DLAMI."""
    if ami:
        return ami
    if kind == VOLTA:
        return newest_ubuntu(aws, region)
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


def newest_ubuntu(aws: AwsSession, region: str) -> str:
    """Canonical's current Ubuntu 24.04 server image for x86_64 in `region`: by its SSM
    parameter, else (not published there, or not allowed) the newest by name."""
    try:
        with aws_errors(region, "ssm"):
            found = aws.client("ssm", region).get_parameter(
                Name=UBUNTU_PARAMETER)["Parameter"]["Value"]
        if AMI_ID.fullmatch(found or ""):
            return found
    except AWSError as exc:
        if not exc.code:  # unreachable, not refused
            raise
    images = aws.call(region, "describe_images", Owners=[CANONICAL_OWNER], Filters=[
        {"Name": "name", "Values": [UBUNTU_NAME]}, {"Name": "state", "Values": ["available"]}
    ])["Images"]
    if not images:
        raise AWSError(f"no Ubuntu 24.04 image of Canonical's found in {region}",
                       hint="pass --ami ami-... (an Ubuntu image with NVIDIA's proprietary "
                            "driver and a torch built for CUDA 12.6)")
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
        return DLAMI_USER, "the default image's (Ubuntu 24.04)"
    key = ("image name", region, ami)
    if key not in aws.clients:
        aws.clients[key] = image_facts(aws, region, ami)["name"]
    name = str(aws.clients[key])
    for pattern, user in IMAGE_USERS:
        if pattern.search(name):
            return user, f"the default user of {ami} ({name})"
    return DLAMI_USER, (f"{ami}'s name ({name or 'none'}) names no distribution this knows: "
                        "set ssh_user in config.yaml if its user is not ubuntu")

