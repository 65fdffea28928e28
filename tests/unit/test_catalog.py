"""cloudtrain/catalog.py: the GPU a job asks for when it names none (RA2: never one that no
current Deep Learning AMI runs), and the cheapest type for it in the bundled catalog."""

from __future__ import annotations

import pytest

from cloudtrain import catalog, recipes


def test_RA2_no_default_request_names_a_gpu_the_dlami_cannot_run():
    """RA2: the multi-GPU recipes asked for V100:8 (p3.16xlarge), which no current DLAMI,
    driver branch or torch wheel runs. Every bundled recipe and variant now asks for a
    Turing-or-later GPU that the catalog has in us-east-1, in the count it needs."""
    asked = {}
    for name in recipes.names():
        rec = recipes.load(name)
        variants = (rec.arguments.get("variant").choices if "variant" in rec.arguments
                    else None) or [None]
        for variant in variants:
            values = rec.resolve(None, (f"variant={variant}",) if variant else ())
            request = rec.gpu_request(values)
            gpu, count = catalog.parse_gpus(request)
            assert gpu not in catalog.NO_DLAMI_GPUS, (name, variant, request)
            chosen, region, _ = catalog.cheapest(gpu, count, ["us-east-1"], "on-demand")
            assert chosen.gpus == count and region == "us-east-1"
            asked[(name, variant)] = (request, chosen.name)
    assert asked[("wide-resnet34", "8gpu")] == ("A100:8", "p4d.24xlarge")
    assert asked[("imagenet", "dawn-1x8")] == ("A100:8", "p4d.24xlarge")
    resnet9 = recipes.load("resnet9")  # Apple's 8-GPU form: gpus=8
    assert resnet9.gpu_request(resnet9.resolve(None, ("gpus=8",))) == "A100:8"
    assert asked[("wide-resnet34", "1gpu")] == ("A10G:1", "g5.xlarge")


@pytest.mark.parametrize("count, gpu", [(1, "A10G"), (4, "A10G"), (8, "A100")])
def test_RA2_the_default_gpu_by_count(count, gpu):
    assert catalog.default_gpu(count) == gpu
    assert catalog.gpu_request({"gpus_per_node": count}, 0) == f"{gpu}:{count}"


def test_a_recipe_s_own_gpu_is_kept():
    assert catalog.gpu_request({"gpus_per_node": 1, "gpu": "L4"}, 4) == "L4:4"


def test_RA2_the_volta_types_are_the_ones_that_get_their_own_image():
    """RA2: every catalog type whose GPU is in NO_DLAMI_GPUS is a p3 or p3dn (VOLTA_FAMILIES),
    and no other is: those, and only those, get the Ubuntu image with the proprietary driver;
    every other GPU type a default image runs is the DLAMI's."""
    volta = sorted(t.name for t in catalog.load().values() if t.gpu in catalog.NO_DLAMI_GPUS)
    assert volta == ["p3.16xlarge", "p3.2xlarge", "p3.8xlarge", "p3dn.24xlarge"]
    assert sorted(t.name for t in catalog.load().values() if catalog.volta(t.name)) == volta
    assert all(catalog.default_image_runs(name) and not catalog.dlami_runs(name)
               for name in volta)


def test_RA3_the_types_the_dlami_runs_are_the_families_its_release_notes_list():
    """RA3: of the catalog's GPU types, those outside the default DLAMI's supported list are
    p3/p3dn (Volta), g7e and p6-b300 (Blackwell parts it is not released for) and the
    fractional g6f/gr6f; every other family the catalog has is on the list."""
    outside = {t.name.split(".")[0] for t in catalog.load().values()
               if not catalog.dlami_runs(t.name)}
    assert outside == {"p3", "p3dn", "g7e", "p6-b300", "g6f", "gr6f", "g5g"}
    inside = {t.name.split(".")[0] for t in catalog.load().values() if catalog.dlami_runs(t.name)}
    assert inside == set(catalog.DLAMI_FAMILIES)
    assert catalog.no_dlami_note("g7e.2xlarge", "RTXPRO6000").startswith(
        "g7e.2xlarge is not among the GPU types cloudtrain's default images support (the Deep "
        "Learning AMI's release notes list G4DN, G5, G6, GR6, G6E, P4D")
    assert not catalog.default_image_runs("g7e.2xlarge")


def test_RG5_each_type_s_local_nvme_is_the_catalog_s_instance_store():
    """RG5: the bundled catalog's LocalDiskCount x LocalDiskSize of NVMe instance store, per
    type (AWS's instance type pages: g5.xlarge 1 x 250 GB, p4d.24xlarge 8 x 1,000 GB); none
    on a type without (p3, g5g), nor on one the catalog does not know."""
    assert catalog.instance_store("g5.xlarge") == (1, 250.0)
    assert catalog.instance_store("g6e.xlarge") == (1, 250.0)
    assert catalog.instance_store("g6e.2xlarge") == (1, 450.0)
    assert catalog.instance_store("p4d.24xlarge") == (8, 1000.0)
    assert catalog.instance_store("p5.48xlarge") == (8, 3800.0)
    assert catalog.instance_store("g6.48xlarge") == (8, 940.0)
    for none in ("p3.2xlarge", "p3.16xlarge", "g5g.xlarge", "m5.large", "nosuch.type"):
        assert catalog.instance_store(none) is None, none
    # every GPU type the default image runs has some (so the rule below decides by size)
    assert all(catalog.instance_store(t.name) for t in catalog.load().values()
               if catalog.dlami_runs(t.name))


def test_RD3_a_type_s_equivalents_have_its_gpus_and_at_least_its_resources():
    """RD3: the types a --gpus job's group may also launch: the same GPU model, count and
    architecture, at least its vCPUs, memory and NVMe instance store, priced in the region,
    the cheapest first; none where no larger type has the same GPUs."""
    t = catalog.get("g5.xlarge")
    found = catalog.equivalents(t, "us-east-1")
    assert [o.name for o in found] == ["g5.2xlarge", "g5.4xlarge"]
    for o in found:
        assert (o.gpu, o.gpus, o.arch) == (t.gpu, t.gpus, t.arch)
        assert o.vcpus >= t.vcpus and o.memory_gib >= t.memory_gib
        assert o.nvme_disks * o.nvme_disk_gb >= t.nvme_disks * t.nvme_disk_gb
        assert o.on_demand["us-east-1"] >= t.on_demand["us-east-1"]
    assert catalog.equivalents(catalog.get("p4d.24xlarge"), "us-east-1") == []
    assert len(catalog.equivalents(catalog.get("g6.xlarge"), "us-east-1", most=5)) > 2
