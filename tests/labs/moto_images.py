"""The root snapshot of moto's images, and EC2's rule for the root volume a launch asks for
(RB1), which moto does not enforce:

    DescribeImages    the root device's mapping says its snapshot's size: moto's 15 GB, or
                      what the test set in `ImageRoots.sizes[ami]`
    RunInstances      a root volume (the mapping under the image's root device name)
                      smaller than that snapshot is refused, as EC2 refuses it:
                      InvalidBlockDeviceMapping "Volume of size 20GB is smaller than
                      snapshot 'snap-...', expect size >= 75GB"

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
