"""The Volta types moto does not know (p3.2xlarge, p3.8xlarge, p3.16xlarge; it has p3dn), as
EC2's DescribeInstanceTypes describes them, so that what asks EC2 about a type (the image
rules of labs/moto_images.py, the type checks) gets EC2's answer for the mission's own
p3.2xlarge. From AWS's "Amazon EC2 instance type specifications" (accelerated computing) and
its boot-mode page: Xen types, legacy BIOS only (UEFI needs Nitro), ENA supported (not
required), no NVMe for EBS, no EFA; V100 with 16 GiB each.

    MotoTypes().install(monkeypatch)     adds them for the test; gone at its end
"""

from __future__ import annotations

# name: (vCPUs, memory MiB, GPUs, network performance, network interfaces, IPv4 per interface)
VOLTA = {"p3.2xlarge": (8, 62464, 1, "Up to 10 Gigabit", 4, 15),
         "p3.8xlarge": (32, 249856, 4, "10 Gigabit", 8, 30),
         "p3.16xlarge": (64, 499712, 8, "25 Gigabit", 8, 30)}


def describe(name: str) -> dict:
    vcpus, memory, gpus, network, interfaces, addresses = VOLTA[name]
    return {
        "InstanceType": name, "CurrentGeneration": False, "FreeTierEligible": False,
        "SupportedUsageClasses": ["on-demand", "spot"], "SupportedRootDeviceTypes": ["ebs"],
        "SupportedVirtualizationTypes": ["hvm"], "BareMetal": False, "Hypervisor": "xen",
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"], "SustainedClockSpeedInGhz": 2.3},
        "VCpuInfo": {"DefaultVCpus": vcpus},
        "MemoryInfo": {"SizeInMiB": memory},
        "InstanceStorageSupported": False,
        "EbsInfo": {"EbsOptimizedSupport": "default", "EncryptionSupport": "supported",
                    "NvmeSupport": "unsupported"},
        "NetworkInfo": {"NetworkPerformance": network, "MaximumNetworkInterfaces": interfaces,
                        "MaximumNetworkCards": 1, "DefaultNetworkCardIndex": 0,
                        "NetworkCards": [{"NetworkCardIndex": 0, "NetworkPerformance": network,
                                          "MaximumNetworkInterfaces": interfaces}],
                        "Ipv4AddressesPerInterface": addresses,
                        "Ipv6AddressesPerInterface": addresses, "Ipv6Supported": True,
                        "EnaSupport": "supported", "EfaSupported": False},
        "GpuInfo": {"Gpus": [{"Name": "V100", "Manufacturer": "NVIDIA", "Count": gpus,
                              "MemoryInfo": {"SizeInMiB": 16384}}],
                    "TotalGpuMemoryInMiB": 16384 * gpus},
        "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
        "HibernationSupported": False, "BurstablePerformanceSupported": False,
        "DedicatedHostsSupported": True, "AutoRecoverySupported": True,
        "SupportedBootModes": ["legacy-bios"],
    }


class MotoTypes:
    def install(self, monkeypatch) -> "MotoTypes":
        from moto.ec2.models.instance_types import (
            INSTANCE_TYPES, InstanceType, InstanceTypeBackend)

        added = [name for name in VOLTA if name not in INSTANCE_TYPES]
        for name in added:
            monkeypatch.setitem(INSTANCE_TYPES, name, describe(name))
        # DescribeInstanceTypes answers from the list moto made of them at import
        monkeypatch.setattr(InstanceTypeBackend, "instance_types", [
            *InstanceTypeBackend.instance_types, *map(InstanceType, added)])
        return self
