"""estimate.py: expected time and cost per instance type from a recipe's published result,
checked against hand-computed figures; overheads measured from the store's AWS jobs; the
`estimate` command and the estimate line of `launch`."""
import json
import re

import pytest

from cloudtrain import catalog, estimate, recipes, state
from cloudtrain.errors import UsageError

RECIPE = """\
name: pub
description: a recipe with two published results
entry: train.py
arguments:
  variant: {type: choice, choices: [fast, slow], default: fast}
  gpus: {type: int, default: 1}
resources: {gpus_per_node: 1, disk_gb: 60}
published:
  - {variant: fast, result: "94%", time: "26 s", gpu: V100, gpus: 1, seconds: 26, accuracy: 0.941,
     source: "a notebook"}
  - {variant: slow, result: "94%", time: "74 s", gpu: V100, gpus: 1, seconds: 74}
  - {variant: fast, result: "94%", time: "9.43 s", gpu: V100, gpus: 8, seconds: 9.43}
"""


@pytest.fixture
def pub(tmp_path, monkeypatch):
    root = tmp_path / "recipes"
    (root / "pub").mkdir(parents=True)
    (root / "pub" / "recipe.yaml").write_text(RECIPE)
    (root / "pub" / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(root))
    return recipes.load("pub")


def test_the_published_entry_follows_variant_and_gpus(pub):
    assert estimate.published_basis(pub, {"variant": "fast", "gpus": 1}).seconds == 26
    assert estimate.published_basis(pub, {"variant": "slow", "gpus": 1}).seconds == 74
    assert estimate.published_basis(pub, {"variant": "fast", "gpus": 8}).seconds == 9.43
    basis = estimate.published_basis(pub, {"variant": "fast", "gpus": 1})
    assert basis.text == "26 s on 1x V100 (94.10%); a notebook"


def test_a_recipe_without_a_structured_published_time_is_a_clear_error(toy_recipes):
    with pytest.raises(UsageError, match="no published time to estimate from"):
        estimate.published_basis(recipes.load("toy"), {})


def test_scaling_by_tensor_throughput():
    basis = estimate.Basis("V100", 1, 26.0, None, "")
    assert estimate.scaled_seconds(basis, "V100") == (26.0, "published")
    seconds, how = estimate.scaled_seconds(basis, "A100")
    assert seconds == pytest.approx(26 * 125 / 312) and how == "x125/312 TFLOPS from V100"
    assert estimate.scaled_seconds(basis, "RTXPRO6000")[0] is None


def test_RA2_the_types_compared_by_default_are_ones_a_launch_takes(pub):
    """RA2: `estimate` without --instance compared every 1-GPU type, p3.2xlarge among them
    (and, on its published V100 figure, often the fastest), which a launch now refuses. The
    default comparison leaves out types whose GPU no current DLAMI runs; asked by name, a p3
    is still priced (the published figure's own hardware)."""
    args = {"variant": "fast", "gpus": 1}
    names = [r.instance_type for r in estimate.estimate(pub, args, "us-east-1").rows]
    assert names and "g5.xlarge" in names and "g6.xlarge" in names
    assert not [n for n in names if n.startswith("p3")], names
    asked = estimate.estimate(pub, args, "us-east-1", types=["p3.2xlarge"]).rows
    assert [(r.instance_type, r.train_s) for r in asked] == [("p3.2xlarge", 26)]


def test_cost_rows_equal_hand_computed_figures(pub):
    est = estimate.estimate(pub, {"variant": "fast", "gpus": 1}, "us-east-1",
                            types=["p3.2xlarge", "g4dn.xlarge", "p3.8xlarge"], own_image=True)
    rows = {r.instance_type: r for r in est.rows}
    over = sum(estimate.ASSUMED.values())  # 255 s: nothing measured in an empty store
    disk = 60 * 0.08 / 730  # gp3 $0.08/GB-month in us-east-1, per hour
    ip = 0.005  # its public IPv4 address, per hour (RH5)
    p3 = rows["p3.2xlarge"]
    assert p3.train_s == 26 and p3.total_s == 26 + over
    assert p3.on_demand == pytest.approx((3.06 + disk + ip) * (26 + over) / 3600)
    t4 = rows["g4dn.xlarge"]
    assert t4.train_s == pytest.approx(50.0)  # 26 s x 125/65
    assert t4.on_demand == pytest.approx((0.526 + disk + ip) * (50 + over) / 3600)
    p38 = rows["p3.8xlarge"]  # 4 GPUs: the recipe uses one, all four are billed
    assert p38.train_s == 26 and p38.scaling == "published; uses 1 of 4 GPUs"
    assert p38.on_demand == pytest.approx((12.24 + disk + ip) * (26 + over) / 3600)
    assert "cheapest" in t4.marks and "fastest" in p3.marks


def test_an_instance_with_fewer_gpus_than_the_published_run_gets_no_figure(pub):
    est = estimate.estimate(pub, {"variant": "fast", "gpus": 8}, "us-east-1",
                            types=["p3.8xlarge", "p3.16xlarge"])
    rows = {r.instance_type: r for r in est.rows}
    assert rows["p3.8xlarge"].total_s is None
    assert rows["p3.8xlarge"].scaling == "published on 8 GPUs, p3.8xlarge has 4"
    assert rows["p3.16xlarge"].train_s == 9.43


def test_RA2_a_volta_type_on_its_default_image_pays_the_boot_time_install(pub, monkeypatch):
    """RA2: a p3 on the default image installs the driver and torch at boot; those minutes
    are billed and in the estimate (with --ami, an image that has them, they are not)."""
    monkeypatch.setattr(estimate, "ASSUMED", {"boot": 1.0, "setup": 1.0, "startup": 1.0,
                                              "teardown": 1.0})
    row = estimate.estimate(pub, {"variant": "fast", "gpus": 1}, "us-east-1",
                            types=["p3.2xlarge", "g5.xlarge"])
    by = {r.instance_type: r for r in row.rows}
    assert by["p3.2xlarge"].total_s == 30 + catalog.VOLTA_INSTALL_S
    assert "+6 min boot-time install of the driver and torch" in by["p3.2xlarge"].scaling
    assert "install" not in by["g5.xlarge"].scaling


def test_the_60_second_minimum_applies(pub, monkeypatch):
    monkeypatch.setattr(estimate, "ASSUMED", {"boot": 1.0, "setup": 1.0, "startup": 1.0,
                                              "teardown": 1.0})
    row = estimate.estimate(pub, {"variant": "fast", "gpus": 1}, "us-east-1",
                            types=["p3.2xlarge"], own_image=True).rows[0]
    assert row.total_s == 30
    # the compute and the disk at their 60 s minimum; the public IPv4 address (RH5) for the
    # 30 s it ran: it has none
    assert row.on_demand == pytest.approx(3.06 * 60 / 3600 + 60 * 0.08 / 730 * 60 / 3600
                                          + 0.005 * 30 / 3600)


def test_overheads_are_measured_from_past_aws_jobs(ct_home):
    with state.Store(ct_home / "state.db") as store:
        for boot, setup in ((100, 20), (140, 40), (120, 30)):
            job = store.create_job(name=None, kind="recipe", recipe="pub", command="pub",
                                   backend="aws", spec={})
            t = 1_000_000.0
            for phase, at in (("provisioning", t), ("syncing", t + boot),
                              ("setting-up", t + boot + setup / 2),
                              ("running", t + boot + setup)):
                store.set_state(job.id, phase, at=at)
            store.set_state(job.id, "succeeded", at=t + boot + setup + 50)
        over = estimate.overheads(store)
    assert over.seconds["boot"] == 120 and over.seconds["setup"] == 30
    assert over.source["boot"] == "measured: median of 3 of your AWS jobs"
    assert over.source["startup"] == "assumed"


def test_estimate_command(cli, pub):
    out = cli.ok("estimate", "--recipe", "pub", "--region", "us-east-1",
                 "--gpus", "V100:1").stdout
    assert "p3.2xlarge" in out and "published" in out
    assert "training: published 26 s on 1x V100" in out
    assert "boot 2m30s (assumed)" in out
    data = json.loads(cli.ok("estimate", "--recipe", "pub", "--set", "variant=slow",
                             "--instance", "g5.xlarge", "--spot", "--json").stdout)
    assert data["market"] == "spot" and data["basis"]["seconds"] == 74
    [row] = data["rows"]
    assert row["instance_type"] == "g5.xlarge" and row["train_s"] == pytest.approx(74 * 125 / 70)
    assert row["marks"] == ["cheapest", "fastest"]


@pytest.mark.parametrize("args, message", [
    (("--instance", "p9.huge"), "unknown instance type 'p9.huge': not in the bundled catalog"),
    (("--instance", "g5.xlarge", "--gpus", "A10G:1"), "give --instance or --gpus, not both"),
    (("--gpus", "V100:3"), "no instance type with 3x V100 in us-east-1"),
    (("--set", "variant=medium"), "--set variant"),
])
def test_estimate_errors(cli, pub, args, message):
    proc = cli("estimate", "--recipe", "pub", "--region", "us-east-1", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_u21_a_gpu_sold_only_eight_to_an_instance_is_said_with_its_types(cli):
    """`--gpus A100:1` matched nothing and said only that; A100 comes 8 to an instance."""
    said = ("no instance type with 1x A100 in us-east-1: A100 comes only in 8-GPU types here: "
            "p4d.24xlarge (8x A100), p4de.24xlarge (8x A100-80GB)")
    proc = cli("estimate", "--recipe", "resnet9", "--gpus", "A100:1", "--region", "us-east-1")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"Error: {said}", "Hint: --gpus A100:8"]
    proc = cli("launch", "--recipe", "resnet9", "--gpus", "A100:1", "--region", "us-east-1",
               "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"Error: {said}", "Hint: --gpus A100:8"]
    proc = cli("estimate", "--recipe", "resnet9", "--gpus", "H100:2", "--region", "us-east-1")
    assert proc.stderr.splitlines()[0] == (
        "Error: no instance type with 2x H100 in us-east-1: H100 comes in 1- and 8-GPU types "
        "here: p5.4xlarge (1x H100), p5.48xlarge (8x H100)")


def test_u22_a_region_the_catalog_has_no_prices_for_says_which_it_has(cli):
    """U22: estimate and catalog for a region the bundled catalog has no prices for say which
    regions it has and suggest catalog --refresh."""
    from cloudtrain import catalog

    have = ", ".join(sorted(catalog.regions()))
    proc = cli("estimate", "--recipe", "resnet9", "--region", "eu-north-1")
    assert proc.returncode == 2  # nothing could be priced
    assert proc.stderr.splitlines() == [
        f"Error: the catalog has no prices for eu-north-1 (it has {have})",
        "Hint: cloudtrain catalog --refresh --region eu-north-1 fetches them"]


def test_u48_catalog_for_a_region_without_prices_exits_2_as_estimate_does(cli):
    """U48: `catalog --region eu-north-1` said U22's message and exited 0, while `estimate`
    exits 2 for the same message. Both now refuse it the same way (--json too)."""
    est = cli("estimate", "--recipe", "resnet9", "--region", "eu-north-1")
    for args in (("catalog", "--region", "eu-north-1"),
                 ("catalog", "--region", "eu-north-1", "--gpu", "V100"),
                 ("catalog", "--region", "eu-north-1", "--json")):
        proc = cli(*args)
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", est.stderr), args
    assert cli.ok("catalog", "--region", "eu-west-1").stdout.startswith("TYPE")


def test_launch_shows_the_estimate_of_what_it_starts(cli, pub):
    # On the published figure's own GPU (a V100: with an image that runs it, RA2).
    plan = cli.ok("launch", "--recipe", "pub", "--instance", "p3.2xlarge", "--region",
                  "us-east-1", "--ami", "ami-0123456789abcdef0", "--dry-run").stdout
    line = [l for l in plan.splitlines() if l.strip().startswith("estimate")][0]
    assert "training 26s (published)" in line and "$0.24 on-demand" in line
    # No basis (your own command): no estimate row rather than a made-up one.
    plan = cli.ok("launch", "--instance", "g5.xlarge", "--region", "us-east-1", "--dry-run",
                  "--", "python", "-c", "pass").stdout
    assert "estimate" not in plan


def test_a_figure_measured_on_the_same_gpu_wins_over_a_scaled_published_one():
    """issue 17: recipe.yaml `measured` (this project's own figures) is the basis on the same
    GPU model, for the arguments it was measured with; other GPUs scale the published one."""
    rec = recipes.load("airbench94")
    args = rec.resolve(None)
    est = estimate.estimate(rec, args, "us-east-1", types=["p5.48xlarge", "g5.xlarge"])
    rows = {r.instance_type: r for r in est.rows}
    assert rows["p5.48xlarge"].train_s == 2.09
    assert rows["p5.48xlarge"].scaling.startswith("measured on H100 (torch 2.11 + CUDA 13")
    assert "TFLOPS from A100-80GB" in rows["g5.xlarge"].scaling
    # measured eager: compile=true (max-autotune now) has no figure of its own yet
    compiled = rec.resolve(None, ("compile=true",))
    assert estimate.measured_seconds(rec, compiled, None, "H100", 1) is None
    assert estimate.measured_seconds(rec, args, None, "H100", 8) is None  # not on 8 GPUs
    assert estimate.measured_seconds(rec, args, "smoke", "H100", 1) is None
    r9 = recipes.load("resnet9")
    assert estimate.measured_seconds(r9, r9.resolve(None, ("variant=dawn",)), None, "H100",
                                     1)[0] == 31.1
    assert estimate.measured_seconds(r9, r9.resolve(None), None, "H100", 1) is None


COMPILED = """\
name: comp
description: a recipe with compile
entry: train.py
arguments:
  compile: {type: bool, default: false}
resources: {gpus_per_node: 1, disk_gb: 20}
published:
  - {result: "94%", time: "30 s", gpu: V100, gpus: 1, seconds: 30}
measured:
  - {gpu: V100, gpus: 1, seconds: 20, when: {compile: true}, compile_seconds: 75,
     compile_cached_seconds: 5}
  - {hardware: "2 CPU cores", when: {compile: true}, compile_seconds: 40}
"""


def test_compile_true_adds_the_measured_compile_or_says_it_is_missing(tmp_path, monkeypatch):
    """issue 17: the first run's compile is billed before the first step: on a GPU where it
    was measured (a cold cache, as on a new instance) it is in the training figure and the
    basis says so; where it was not, a note says the figures leave it out."""
    root = tmp_path / "recipes"
    (root / "comp").mkdir(parents=True)
    (root / "comp" / "recipe.yaml").write_text(COMPILED)
    (root / "comp" / "train.py").write_text("")
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(root))
    rec = recipes.load("comp")
    types = ["p3.2xlarge", "g4dn.xlarge"]
    est = estimate.estimate(rec, {"compile": True}, "us-east-1", types=types)
    rows = {r.instance_type: r for r in est.rows}
    assert rows["p3.2xlarge"].train_s == 20 + 75
    assert "+75 s compile (measured)" in rows["p3.2xlarge"].scaling
    assert rows["g4dn.xlarge"].train_s == pytest.approx(30 * 125 / 65)  # no compile figure
    (note,) = [n for n in est.notes if n.startswith("compile=true")]
    assert "not in the figures for T4 " in note and "V100" not in note
    eager = estimate.estimate(rec, {"compile": False}, "us-east-1", types=types)
    assert {r.instance_type: r.train_s for r in eager.rows}["p3.2xlarge"] == 30
    assert not [n for n in eager.notes if n.startswith("compile=true")]


def test_measured_entries_are_checked_when_the_recipe_loads(tmp_path, monkeypatch):
    """issue 17: a `measured` entry without gpu and seconds, or a `when` naming no argument,
    is refused in one line when the recipe loads."""
    from cloudtrain.errors import ConfigError

    root = tmp_path / "recipes"
    (root / "pub").mkdir(parents=True)
    (root / "pub" / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(root))
    for bad, message in (("  - {gpu: H100}\n", "gpu (a GPU model) and seconds go together"),
                         ("  - {gpu: H100, seconds: 2, when: {nope: 1}}\n", "when must map"),
                         ("  - {gpu: H100, seconds: fast}\n", "measured[0]")):
        (root / "pub" / "recipe.yaml").write_text(RECIPE + "measured:\n" + bad)
        with pytest.raises(ConfigError, match=re.escape(message)):
            recipes.load("pub")


# -- issue 28: bounded by what feeds the GPUs -------------------------------------------------

IMAGES, FULL, SMALL = 1_281_167, 226, 765  # recipe.yaml data_path (issue 28's measurements)


def _bounds(cli, variant, *extra):
    proc = cli.ok("estimate", "--recipe", "imagenet", "--set", f"variant={variant}",
                  "-i", "p3.16xlarge", "-i", "p4d.24xlarge", "-i", "p5.48xlarge", "--json",
                  *extra)
    return {r["instance_type"]: r for r in json.loads(proc.stdout)["rows"]}


def test_ffcvs_published_a100_time_is_out_of_reach_of_a_p4ds_cpus(cli):
    """FFCV 16 epochs from full-size JPEGs: 16 x 1,281,167 images over 96 vCPUs x 226/s is
    945 s, more than FFCV's published 894 s on 8 A100: the p4d row is data-bound and says
    the published time is not reachable; the p5's 192 vCPUs cannot feed 8 H100s either; the
    p3.16xlarge's V100s are slower than its 64 vCPUs."""
    rows = _bounds(cli, "ffcv-rn50-16")
    p4d, p5, p3 = rows["p4d.24xlarge"], rows["p5.48xlarge"], rows["p3.16xlarge"]
    assert p4d["data_bound_s"] == pytest.approx(16 * IMAGES / (96 * FULL))
    assert (p4d["bound"], p4d["gpu_bound_s"]) == ("data", 894)
    assert p4d["train_s"] == pytest.approx(945.0, abs=1)
    assert p4d["scaling"].startswith("data-bound: 96 vCPUs decoding at 226/s per core")
    assert "not reachable with this data path" in p4d["scaling"]
    assert p5["bound"] == "data" and p5["data_bound_s"] == pytest.approx(
        16 * IMAGES / (192 * FULL))
    assert p5["gpu_bound_s"] == pytest.approx(894 * 312 / 989)
    assert p3["bound"] == "gpu" and p3["train_s"] == pytest.approx(894 * 312 / 125)
    assert p3["data_bound_s"] == pytest.approx(16 * IMAGES / (64 * FULL))
    assert "GPU-bound: 64 vCPUs" in p3["scaling"]


def test_dawn_reads_the_160_px_copies_and_stays_gpu_bound_everywhere(cli):
    """dawn-1x8: 18 epochs at 765/s per core from the 160 px copies, 27 at 226 from full size."""
    rows = _bounds(cli, "dawn-1x8")
    for name, vcpus in (("p3.16xlarge", 64), ("p4d.24xlarge", 96), ("p5.48xlarge", 192)):
        row = rows[name]
        assert row["data_bound_s"] == pytest.approx(
            18 * IMAGES / (vcpus * SMALL) + 27 * IMAGES / (vcpus * FULL)), name
        assert row["bound"] == "gpu" and row["train_s"] == row["gpu_bound_s"], name
    assert rows["p3.16xlarge"]["train_s"] == 10647


def test_decode_gpu_has_no_measured_rate_and_says_so(cli):
    row = _bounds(cli, "ffcv-rn50-16", "--set", "decode=gpu")["p4d.24xlarge"]
    assert (row["bound"], row["data_bound_s"], row["train_s"]) == ("", None, 894)
    assert "decode=gpu: no measured GPU decode rate" in row["scaling"]


def test_the_table_says_the_bound_in_words(cli):
    out = cli.ok("estimate", "--recipe", "imagenet", "--set", "variant=ffcv-rn50-16", "-i",
                 "p4d.24xlarge", "--wide").stdout
    assert "data-bound: 96 vCPUs decoding at 226/s per core from full need 15.7 min, the " \
           "GPUs 14.9 min (published: not reachable with this data path)" in out


def test_u58_the_estimate_bills_a_profile_s_own_disk():
    """U58: a smoke run's estimate billed the full recipe's 400 GB disk too."""
    imagenet = recipes.load("imagenet")
    assert estimate._disk(imagenet, "us-east-1", None, 0, 0, "smoke")[0] == 100
    assert estimate._disk(imagenet, "us-east-1", None, 0, 0)[0] == 400
    assert estimate._disk(imagenet, "us-east-1", 50, 0, 0, "smoke")[0] == 50  # --disk-gb


# -- RG5: the copy onto the local NVMe ------------------------------------------------------------


def test_RG5_a_copy_onto_the_nvme_runs_at_the_slower_of_its_writes_and_the_network():
    """RG5: onto the local NVMe the copy is bound by the network or by the NVMe's writes (a
    figure assumed per disk: AWS states the instance store's IOPS, not its MB/s), whichever
    is slower, and the basis says which; no gp3 throughput enters it."""
    per_disk = estimate.NVME_WRITE_MBPS
    assert estimate.staging_rate("p4d.24xlarge", 1000, nvme_disks=8) == (
        8.0 * per_disk, f"the local NVMe's writes (8 disks at ~{per_disk} MB/s each, assumed)")
    assert estimate.staging_rate("g5.xlarge", 125, nvme_disks=1) == (
        float(per_disk), f"the local NVMe's writes (1 disk at ~{per_disk} MB/s, assumed)")
    # 10 Gbit/s is 1250 MB/s: slower than two disks
    assert estimate.staging_rate("p3.8xlarge", 1000, nvme_disks=2) == (
        1250.0, "10 Gbit/s network (onto the local NVMe)")
    # the root volume as before
    assert estimate.staging_rate("p4d.24xlarge", 1000) == (1000.0, "1000 MB/s gp3 root volume")


def test_RG5_the_estimate_puts_the_copy_on_each_type_s_nvme_and_bills_no_disk_for_it(pub):
    """RG5: 150 GB copied: on g5.xlarge's NVMe (250 GB) the root volume stays the recipe's
    60 GB with no throughput bought, the copy at the NVMe's writes; with --ami (nothing known
    of its disks) the root volume is sized for the copy and its throughput bought, as before.
    300 GB does not fit g5.xlarge's NVMe but fits g6e.2xlarge's (450 GB)."""
    args = {"variant": "fast", "gpus": 1}
    kw = dict(types=["g5.xlarge"], staging_bytes=150 * 10**9, disk_mbps=1000)
    (nvme,) = estimate.estimate(pub, args, "us-east-1", **kw).rows
    (root,) = estimate.estimate(pub, args, "us-east-1", own_image=True, **kw).rows
    assert (nvme.on_nvme, nvme.disk_gb) == (True, 60)
    assert nvme.staging_s == pytest.approx(150e9 / 1e6 / estimate.NVME_WRITE_MBPS)
    assert nvme.staging_basis.startswith("the local NVMe's writes")
    from cloudtrain import datasets

    assert (root.on_nvme, root.disk_gb) == (False, datasets.disk_needed(150 * 10**9, 256 << 20))
    assert root.staging_basis == "1000 MB/s gp3 root volume"
    from cloudtrain import cost

    gp3 = catalog.gp3_price("us-east-1").per_gb_month
    price = catalog.get("g5.xlarge").price("us-east-1")
    # on the NVMe: the instance and the recipe's 60 GB root volume at gp3's price, nothing more
    assert nvme.on_demand == pytest.approx(
        cost.on_demand_cost(0.0, nvme.total_s, price).dollars
        + cost.ebs_cost(0.0, nvme.total_s, 60, gp3).dollars
        + nvme.total_s / 3600 * cost.PUBLIC_IPV4_PER_HOUR, rel=1e-9)
    assert root.on_demand > nvme.on_demand
    big = estimate.estimate(pub, args, "us-east-1", types=["g5.xlarge", "g6e.2xlarge"],
                            staging_bytes=300 * 10**9, disk_mbps=1000)
    rows = {r.instance_type: r for r in big.rows}
    assert not rows["g5.xlarge"].on_nvme and rows["g6e.2xlarge"].on_nvme
    # the launch's own decision (the spec's) wins over the catalog's rule
    (told,) = estimate.estimate(pub, args, "us-east-1", local_disk=False, **kw).rows
    assert not told.on_nvme and told.disk_gb == root.disk_gb


def test_RG5_the_estimate_table_says_which_types_copy_onto_their_nvme(pub, monkeypatch):
    from cloudtrain import catalog_views

    args = {"variant": "fast", "gpus": 1}
    est = estimate.estimate(pub, args, "us-east-1", types=["g5.xlarge", "g4dn.xlarge"],
                            staging_bytes=150 * 10**9, disk_mbps=1000)
    text = " ".join(catalog_views.estimate_table(est, width=200).split())
    assert ("data copy onto the local NVMe (free, lost with the instance; no root volume "
            "space or gp3 throughput bought for it): g5.xlarge") in text, text
    # g4dn.xlarge's 125 GB cannot hold it: its root volume is sized and sped up
    assert "g4dn.xlarge" not in text.split("data copy onto the local NVMe")[1].split(";")[0]
