"""The root snapshot of moto's images and EC2's rule for the root volume a launch asks for
(RB1); what an image is (architecture, boot mode, ENA) and EC2's rules for the types it
launches on (ImageFits); neither of which moto enforces:

    DescribeImages    the root device's mapping says its snapshot's size: moto's 15 GB, or
                      what the test set in `ImageRoots.sizes[ami]`
    RunInstances      a root volume (the mapping under the image's root device name)
                      smaller than that snapshot is refused, as EC2 refuses it:
                      InvalidBlockDeviceMapping "Volume of size 20GB is smaller than
                      snapshot 'snap-...', expect size >= 75GB"

ImageFits:

    RegisterImage     keeps Architecture (x86_64 where a test gives none: AWS's default for an
                      EBS-backed image is i386, and no image here is one), BootMode (none
                      where none is given, as AWS: the type's default then) and EnaSupport
    RunInstances      refused as EC2 refuses it (EC2 user guide: "Instance launch behavior
                      with Amazon EC2 boot modes"; "Enable enhanced networking with ENA"):
                      an image whose architecture the type does not have
                      (InvalidParameterValue, EC2's wording); an image whose boot mode is
                      uefi on a type that boots only legacy BIOS (the Xen types: p3, ...;
                      InvalidParameterCombination, in the lab's words); an image registered
                      without ENA on a type that requires it (InvalidParameterCombination,
                      EC2's wording). Only RunInstances: an Auto Scaling group's launches
                      (tests/labs/asg.py) are not checked.

Installed with monkeypatch on moto's classes (labs.aws.use_moto and the ec2_provider fixture
install it for every test), so it serves in-process `mock_aws()` and a ThreadedMotoServer
alike, and goes away at the test's end.
"""

from __future__ import annotations


class ImageRoots:
    def __init__(self):
        self.sizes: dict[str, int] = {}  # ami -> its root snapshot's GB, where not moto's 15
        self.refused: list[str] = []  # every RunInstances refused, its message

    def install(self, monkeypatch) -> "ImageRoots":
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.models.amis import Ami
        from moto.ec2.responses.instances import InstanceResponse

        lab = self
        own = Ami.block_device_mappings

        def block_device_mappings(image) -> list[dict]:
            rows = own.fget(image)
            size = lab.sizes.get(image.id)
            if size is None:
                return rows
            return [dict(r, Ebs=dict(r["Ebs"], VolumeSize=size))
                    if r["DeviceName"] == image.root_device_name else r for r in rows]

        original = InstanceResponse.run_instances

        def run_instances(self):
            image_id = self._get_param("ImageId")
            images = self.ec2_backend.describe_images(ami_ids=[image_id]) if image_id else []
            for image in images[:1]:
                root = next((r for r in image.block_device_mappings
                             if r["DeviceName"] == image.root_device_name), None)
                for asked in self._get_param("BlockDeviceMappings", []) or []:
                    size = (asked.get("Ebs") or {}).get("VolumeSize")
                    if root is None or asked.get("DeviceName") != image.root_device_name \
                            or size is None or int(size) >= root["Ebs"]["VolumeSize"]:
                        continue
                    message = (f"Volume of size {int(size)}GB is smaller than snapshot "
                               f"'{root['Ebs']['SnapshotId']}', expect size >= "
                               f"{root['Ebs']['VolumeSize']}GB")
                    lab.refused.append(message)
                    raise EC2ClientError("InvalidBlockDeviceMapping", message)
            return original(self)

        monkeypatch.setattr(Ami, "block_device_mappings", property(block_device_mappings))
        monkeypatch.setattr(InstanceResponse, "run_instances", run_instances)
        return self


class ImageFits:
    def __init__(self):
        self.refused: list[str] = []  # every RunInstances refused, its message

    def install(self, monkeypatch) -> "ImageFits":
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.models.instance_types import INSTANCE_TYPES
        from moto.ec2.responses.amis import AmisResponse
        from moto.ec2.responses.instances import InstanceResponse

        lab = self
        register = AmisResponse.register_image

        def register_image(self):
            result = register(self)
            image = self.ec2_backend.amis[result.result["ImageId"]]
            image.architecture = self._get_param("Architecture") or "x86_64"
            image.boot_mode = self._get_param("BootMode")
            ena = self._get_param("EnaSupport")
            image.ena_support = None if ena is None else str(ena).lower() == "true"
            return result

        run = InstanceResponse.run_instances

        def run_instances(self):
            image_id = self._get_param("ImageId")
            name = self._get_param("InstanceType")
            images = self.ec2_backend.describe_images(ami_ids=[image_id]) if image_id else []
            kind = INSTANCE_TYPES.get(name) or {}
            for image in images[:1]:
                why = _refusal(image, name, kind)
                if why:
                    lab.refused.append(why[1])
                    raise EC2ClientError(*why)
            return run(self)

        monkeypatch.setattr(AmisResponse, "register_image", register_image)
        monkeypatch.setattr(InstanceResponse, "run_instances", run_instances)
        return self


def _refusal(image, name: str, kind: dict) -> tuple[str, str] | None:
    arches = (kind.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
    arch = getattr(image, "architecture", None) or "x86_64"
    if arches and arch not in arches:
        return ("InvalidParameterValue",
                f"The architecture '{arches[0]}' of the specified instance type does not match "
                f"the architecture '{arch}' of the specified AMI. Specify an instance type and "
                "an AMI that have matching architectures, and try again.")
    modes = kind.get("SupportedBootModes") or []
    if getattr(image, "boot_mode", None) == "uefi" and modes and "uefi" not in modes:
        return ("InvalidParameterCombination",
                f"The instance type {name} does not support the boot mode uefi of {image.id}")
    ena = (kind.get("NetworkInfo") or {}).get("EnaSupport")
    if ena == "required" and getattr(image, "ena_support", None) is False:
        return ("InvalidParameterCombination",
                f"Enhanced networking with the Elastic Network Adapter (ENA) is required for "
                f"the '{name}' instance type. Ensure that you are using an AMI that is "
                "enabled for ENA.")
    return None

