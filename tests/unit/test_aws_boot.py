"""providers/aws/boot.py alone: how long a launch waits for SSH (RB2)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloudtrain.config import Settings
from cloudtrain.providers.aws import boot


def _aws(**settings) -> SimpleNamespace:
    return SimpleNamespace(settings=Settings(**settings))


@pytest.mark.parametrize("instance_type, nodes, want", [
    ("g5.xlarge", 1, 300.0), ("g6e.12xlarge", 1, 300.0), (None, 1, 300.0),
    ("p4d.24xlarge", 1, 600.0), ("p5.48xlarge", 1, 600.0), ("p6-b200.48xlarge", 1, 600.0),
    ("p5en.48xlarge", 1, 600.0), ("g5.xlarge", 2, 900.0), ("p5.48xlarge", 4, 900.0)])
def test_RB2_big_gpu_hosts_and_several_nodes_get_longer_to_answer_ssh(instance_type, nodes,
                                                                      want):
    """RB2: 300 s for SSH was SkyPilot's half; a p4d/p5/p6 Deep Learning AMI's first boot also
    builds the NVMe array and starts EFA and the driver, and dstack measured 10 to 25 minutes
    to provision such hosts. A job on several nodes waits for its slowest."""
    assert boot.ssh_wait_s(_aws(), instance_type, nodes) == want


@pytest.mark.parametrize("said", [30.0, 120.0, 1800.0])
def test_RB2_a_wait_set_in_config_is_the_wait_for_every_type(said):
    aws = _aws(ssh_wait_seconds=said)
    assert {boot.ssh_wait_s(aws, t, n) for t, n in [("g5.xlarge", 1), ("p5.48xlarge", 1),
                                                     ("g5.xlarge", 3)]} == {said}


def test_RB2_the_slow_families_are_catalog_families():
    from cloudtrain import catalog

    known = {name.split(".")[0] for name in catalog.load()}
    assert boot.SLOW_BOOT_FAMILIES <= known
