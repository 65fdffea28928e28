"""What the launch checks of the instance type before anything is created (preflight), and
what a real launch needs beyond the dry run (ready): EC2's answers where the catalog has none."""

from __future__ import annotations

from ... import catalog
from ... import preflight as type_checks
from ...errors import CloudtrainError, UsageError, named_at
from ...market import Market
from . import reservations
from .errors import AWSError, no_credentials
from .session import AwsSession, partition


def preflight(aws: AwsSession, spec):
    """What the launch checks before anything is created, and the dry run with it: the
    options, the region, and the instance type (exists, offered in the region, runs the
    AMI's architecture, has a GPU unless --cpu-only). Returns the type's facts (None for
    --on, which reuses a kept job's instance: jobs checks that one)."""
    if not spec.placement.instance_type and not spec.on_job:  # --on: the kept job's instance
        raise UsageError("which instance? pass --instance (e.g. g5.xlarge)")
    if spec.placement.market not in tuple(Market):
        raise UsageError(f"market must be on-demand or spot, not {spec.placement.market!r}")
    if spec.placement.max_price is not None and spec.placement.market != Market.SPOT:
        raise UsageError("--max-price applies to --spot")
    if spec.on_job:
        return None
    region = aws.region(spec)
    if partition(region) == "aws-cn":
        # An instance signs its own S3 and Auto Scaling requests (host/awsapi.py) to
        # amazonaws.com addresses; the China regions' are amazonaws.com.cn
        raise UsageError(f"{region} is in AWS's China partition, which cloudtrain's "
                         "instances cannot reach yet (they address amazonaws.com)",
                         hint="launch in another region (--region)")
    facts = check_type(aws, spec, region)
    reservations.planned(aws, spec, region)  # one the job cannot run in: refused here
    return facts


def ready(aws: AwsSession, spec) -> None:
    """What a real launch needs beyond the dry run, checked before it asks or records
    anything: credentials to launch with. The dry run works without them."""
    if spec.on_job:
        return
    region = aws.region(spec)
    if aws.credentials(region) is None:
        exc = no_credentials()
        exc.hint = f"{exc.hint}; `cloudtrain launch --dry-run` works without"
        raise exc


def check_type(aws: AwsSession, spec, region: str) -> type_checks.TypeFacts:
    """preflight.instance_type with EC2's answers where the bundled catalog has none and
    there are credentials to ask with (DescribeInstanceTypes, ...TypeOfferings, the
    --ami's architecture)."""
    place = spec.placement
    describe = offered = image = None
    ami_arch = None if place.ami else catalog.DEFAULT_ARCH
    try:
        credentials = aws.credentials(region)
    except CloudtrainError:
        credentials = None  # said where it matters: the plan's permissions row, the launch
    if credentials is not None:
        describe = lambda name: describe_type(aws, region, name)  # noqa: E731
        offered = lambda name: type_offered(aws, region, name)  # noqa: E731
        if place.ami:
            image = ami_facts(aws, region, place.ami)
            ami_arch = image.get("Architecture")
    try:
        facts = type_checks.instance_type(place.instance_type, region, cpu_ok=place.cpu_only,
                                          ami_arch=ami_arch, describe=describe,
                                          offered=offered, dlami=not place.ami)
        if image:
            refused = image_refusal(place.ami, image, place.instance_type,
                                    _ec2_type(aws, region, place.instance_type))
            if refused:
                raise UsageError(refused, hint="pass an --ami that boots on it, or pick "
                                               "another type (cloudtrain catalog)")
        return facts
    except UsageError as exc:  # a job file's `instance:` is named where it is
        raise named_at(exc, getattr(spec, "origins", {}).get("instance_type"),
                       "--instance") from None


def describe_type(aws: AwsSession, region: str, name: str) -> dict | None:
    """{gpus, gpu, arch} of an instance type from EC2; None when EC2 has no such type; {}
    when EC2 could not be asked (no permission, unreachable)."""
    try:
        found = aws.call(region, "describe_instance_types",
                         InstanceTypes=[name])["InstanceTypes"]
    except AWSError as exc:
        return None if exc.code in ("InvalidInstanceType", "InvalidParameterValue") else {}
    if not found:
        return None
    gpus = (found[0].get("GpuInfo") or {}).get("Gpus") or []
    arches = found[0].get("ProcessorInfo", {}).get("SupportedArchitectures") or []
    return {"gpus": sum(g.get("Count", 0) for g in gpus),
            "gpu": gpus[0].get("Name") if gpus else None,
            "arch": catalog.DEFAULT_ARCH if catalog.DEFAULT_ARCH in arches
            else (arches[0] if arches else catalog.DEFAULT_ARCH)}


def ebs_throughput_cap(aws: AwsSession, spec, wanted: int) -> int:
    """The root volume's MB/s for a data copy: `wanted`, capped at the most the instance's
    link to EBS carries (DescribeInstanceTypes' EbsOptimizedInfo.MaximumThroughputInMBps:
    the burst smaller types hold for 30 minutes a day, which a copy fits in; their baseline
    is often below gp3's free 125 MB/s). gp3 throughput past it would be billed and never
    used. `wanted` where EC2 cannot be asked."""
    from ...cost import GP3_BASE_MBPS

    name = spec.placement.instance_type
    if not name:
        return wanted
    region = aws.region(spec)
    try:
        if aws.credentials(region) is None:
            return wanted
        found = aws.call(region, "describe_instance_types", InstanceTypes=[name])
    except CloudtrainError:
        return wanted
    info = ((found.get("InstanceTypes") or [{}])[0].get("EbsInfo") or {}).get(
        "EbsOptimizedInfo") or {}
    most = info.get("MaximumThroughputInMBps")
    if not isinstance(most, (int, float)) or most <= 0:
        return wanted
    return max(GP3_BASE_MBPS, min(int(wanted), int(most)))


def type_offered(aws: AwsSession, region: str, name: str) -> bool | None:
    """Whether EC2 offers the type in the region; None when it could not be asked."""
    try:
        found = aws.call(region, "describe_instance_type_offerings", LocationType="region",
                         Filters=[{"Name": "instance-type", "Values": [name]}])
    except AWSError:
        return None
    return bool(found.get("InstanceTypeOfferings"))


def ami_facts(aws: AwsSession, region: str, ami: str) -> dict:
    """The --ami as DescribeImages gives it ({} when it cannot be read here: the launch then
    says what is wrong with the AMI)."""
    try:
        images = aws.call(region, "describe_images", ImageIds=[ami])["Images"]
    except AWSError:
        return {}
    return images[0] if images else {}


def _ec2_type(aws: AwsSession, region: str, name: str) -> dict:
    """The type as DescribeInstanceTypes gives it; {} when EC2 cannot be asked."""
    try:
        found = aws.call(region, "describe_instance_types", InstanceTypes=[name])
    except AWSError:
        return {}
    return (found.get("InstanceTypes") or [{}])[0]


def image_refusal(ami: str, image: dict, name: str, ec2_type: dict) -> str | None:
    """Why RunInstances would refuse image `ami` on type `name` (EC2's user guide: "Instance
    launch behavior with Amazon EC2 boot modes", and ENA's "Enable enhanced networking"),
    None where it would not or a fact is missing: an image whose boot mode is uefi on a type
    that boots only legacy BIOS (the Xen types: p3, ...; uefi-preferred, legacy-bios or none
    boots there), an image without ENA on a type that requires it (every Nitro type)."""
    modes = ec2_type.get("SupportedBootModes") or []
    if image.get("BootMode") == "uefi" and modes and "uefi" not in modes:
        return (f"{ami} boots only with UEFI (its boot mode is uefi), and {name} boots only "
                f"{' or '.join(modes)}: RunInstances would refuse it")
    ena = (ec2_type.get("NetworkInfo") or {}).get("EnaSupport")
    if ena == "required" and image.get("EnaSupport") is False:
        return (f"{name} requires ENA (enhanced networking), and {ami} is not enabled for "
                "it: RunInstances would refuse it")
    return None
