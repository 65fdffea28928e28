"""Issue 12, the pure parts: how a dataset's SOURCE is read (config.yaml `datasets:`, `--data`,
a recipe's `data:` entries), which datasets a job stages, and what the copy adds to the
estimate and the bill."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudtrain import catalog, config, cost, datasets, datasources, estimate, ledger, recipes
from cloudtrain.errors import ConfigError, UsageError
from conftest import tiny_prepared_imagenet
from cloudtrain.spec import JobSpec
from cloudtrain.state import Instance, Store
from cloudtrain.providers.aws import datasets as aws_datasets


def test_sources_of_each_kind_and_their_options():
    s3 = datasources.parse_source("imagenet", "s3://my-bucket/data/imagenet/", "here")
    assert (s3.kind, s3.location) == ("s3", "s3://my-bucket/data/imagenet")
    snap = datasources.parse_source("imagenet", {"source": "snap-0123456789abcdef0",
                                              "throughput": 1000, "first_read": "fsr"}, "here")
    assert (snap.kind, snap.throughput, snap.iops, snap.first_read) == \
        ("snapshot", 1000, 4000, "fsr")  # gp3: 1000 MB/s needs 4000 IOPS
    assert datasources.parse_source("x", {"path": "/data/x/"}, "here").location == "/data/x"
    assert datasources.parse_source("x", "/data//x", "here").kind == "path"
    assert datasources.Source.from_dict(snap.to_dict()) == snap


@pytest.mark.parametrize("value,words", [
    ("ftp://bucket/x", "is not s3://BUCKET/PREFIX, an EBS snapshot id"),
    ("relative/path", "is not s3://BUCKET/PREFIX"),
    ("s3://Bad_Bucket/x", "is not an S3 bucket name"),
    ("s3://bucket/../x", "is not a prefix cloudtrain writes under"),
    ({"source": "snap-0123456789abcdef0", "throughput": 2000}, "from 125 to 1000"),
    ({"source": "snap-0123456789abcdef0", "throughput": 800, "iops": 3000},
     "800 MB/s needs at least 3200 iops"),
    ({"source": "snap-0123456789abcdef0", "first_read": "later"}, "first_read must be one of"),
    ({"source": "s3://bucket/x", "throughput": 500}, "unknown option(s) throughput"),
    ({"path": "data"}, "path must be an absolute path"),
    (None, "expected s3://BUCKET/PREFIX"),
    ([1, 2], "expected s3://BUCKET/PREFIX"),
])
def test_bad_sources_are_one_line_usage_errors(value, words):
    with pytest.raises(UsageError) as err:
        datasources.parse_source("imagenet", value, "config.yaml")
    assert words in err.value.message and "\n" not in err.value.message


@settings(max_examples=300, deadline=None)
@given(name=st.text(max_size=20) | st.integers(), value=st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40) |
    st.sampled_from(["s3://b-1/x", "snap-0123456789abcdef0", "/d", "s3://"]),
    lambda inner: st.dictionaries(st.sampled_from(["source", "path", "throughput", "iops",
                                                   "first_read", "x"]), inner, max_size=4)
    | st.lists(inner, max_size=3), max_leaves=8))
def test_fuzz_any_declaration_is_a_source_or_a_usage_error(name, value):
    try:
        source = datasources.parse_source(name, value, "fuzz")
    except UsageError as exc:
        assert exc.message and "\n" not in exc.message
    else:
        assert source.kind in datasources.KINDS and datasources.NAME.fullmatch(source.name)


def test_config_yaml_declares_datasets_and_refuses_bad_ones(ct_home):
    (ct_home / "config.yaml").write_text(
        "datasets:\n  imagenet: s3://bkt/imagenet\n  cifar10: {path: /data/cifar}\n")
    declared = config.Settings.load().datasets
    assert declared["imagenet"].location == "s3://bkt/imagenet"
    assert declared["cifar10"].kind == "path"
    (ct_home / "config.yaml").write_text("datasets: [imagenet]\n")
    with pytest.raises(ConfigError, match="must be a mapping of NAME: SOURCE"):
        config.Settings.load()
    (ct_home / "config.yaml").write_text("datasets:\n  ImageNet: s3://bkt/x\n")
    with pytest.raises(ConfigError, match="is not a dataset name"):
        config.Settings.load()


def test_data_flags_name_a_source_or_the_declared_one():
    flags = datasources.parse_data_flags(("imagenet=s3://bkt/in", "cifar10"))
    assert flags["imagenet"].location == "s3://bkt/in" and flags["cifar10"] is None
    with pytest.raises(UsageError, match="given twice"):
        datasources.parse_data_flags(("a=/x", "a=/y"))


def _spec(recipe="imagenet", **args):
    rec = recipes.load(recipe)
    return JobSpec(kind="recipe", backend="aws", recipe=recipe,
                   args=rec.resolve(None, tuple(f"{k}={v}" for k, v in args.items())))


def _resolve(spec, settings, flags):
    return datasets.resolve(spec, settings, flags,
                            recipes.load(spec.recipe).data if spec.recipe else [])


def test_which_datasets_a_job_stages():
    settings = config.Settings()
    # imagenet with synthetic data reads nothing; with the real set it needs a source
    assert _resolve(_spec(data="synthetic"), settings, {}) == []
    with pytest.raises(UsageError) as err:
        _resolve(_spec(), settings, {})
    assert "reads dataset imagenet, which has no source" in err.value.message
    assert "datasets:" in err.value.hint
    settings.datasets = {"imagenet": datasources.parse_source("imagenet", "s3://bkt/in", "c")}
    (entry,) = _resolve(_spec(), settings, {})
    assert entry["dir"] == "imagenet" and entry["location"] == "s3://bkt/in"
    # --data wins over config.yaml; a recipe only takes the datasets it reads
    flag = datasources.parse_data_flags(("imagenet=s3://other/in",))
    assert _resolve(_spec(), settings, flag)[0]["location"] == "s3://other/in"
    with pytest.raises(UsageError, match="recipe resnet9 with these arguments reads cifar10"):
        _resolve(_spec("resnet9"), settings, datasources.parse_data_flags(("imagenet",)))
    # CIFAR-10 has a public origin: downloaded as before unless declared, then staged into
    # the folder torchvision reads
    assert _resolve(_spec("resnet9"), settings, {}) == []
    cifar = _resolve(_spec("resnet9"), settings,
                             datasources.parse_data_flags(("cifar10=s3://bkt/cifar",)))
    assert cifar[0]["dir"] == "cifar-10-batches-py"
    # your own command stages what --data names, into a folder of that name
    own = JobSpec(kind="command", backend="aws", command=["python", "train.py"])
    assert _resolve(own, settings, datasources.parse_data_flags(("imagenet",)))[0][
        "dir"] == "imagenet"
    with pytest.raises(UsageError, match="no source is declared for mine"):
        _resolve(own, settings, datasources.parse_data_flags(("mine",)))


def test_progress_and_staged_lines_from_an_untrusted_status():
    staging = {"state": "staging", "error": None, "datasets": [
        {"name": "imagenet", "state": "staging", "bytes_total": 150_000_000_000,
         "bytes_done": 12_300_000_000, "files_total": 1_281_167, "files_done": 40_112,
         "mb_s": 410.0, "seconds": 30.0}]}
    assert datasets.progress_line(staging) == (
        "imagenet staging 12.3 GB of 150.0 GB (8%), 40,112 of 1,281,167 files, 410 MB/s")
    staging["datasets"][0].update(state="staged", bytes_done=150_000_000_000,
                                  files_done=1_281_167, seconds=300.0)
    assert datasets.staged_line(staging) == (
        "data staged: imagenet 150.0 GB, 1,281,167 files in 300 s (500 MB/s)")
    assert datasets.progress_line({"state": None, "datasets": []}) == "starting"


def test_the_estimate_counts_the_copy_at_the_slower_of_disk_and_network():
    assert estimate.staging_rate("p3.16xlarge", 1000) == (1000.0, "1000 MB/s gp3 root volume")
    assert estimate.staging_rate("p3.8xlarge", 2000) == (1250.0, "10 Gbit/s network")
    assert estimate.staging_rate("g5.xlarge", 125) == (125.0, "125 MB/s gp3 root volume")
    settings = config.Settings()
    rec = recipes.load("imagenet")
    args = rec.resolve(None, ())
    assert estimate.staged_bytes(rec, args, settings) == 160_000 * 10**6
    assert estimate.staged_bytes(rec, rec.resolve("smoke", ()), settings) == 0
    est = estimate.estimate(rec, args, "us-east-1", types=["p3.16xlarge"],
                            staging_bytes=160 * 10**9, disk_mbps=1000)
    plain = estimate.estimate(rec, args, "us-east-1", types=["p3.16xlarge"],
                              staging_bytes=160 * 10**9, disk_mbps=0)
    (row,), (slow,) = est.rows, plain.rows
    assert row.staging_s == pytest.approx(160.0) and slow.staging_s == pytest.approx(1280.0)
    # p3 installs the driver and torch at boot: that too is in the total, beside the copy
    assert row.total_s - row.train_s - est.overheads.total == pytest.approx(
        160.0 + catalog.VOLTA_INSTALL_S)
    assert est.disk_gb >= 160 * 1.05 + datasets.DISK_MARGIN_GB


def test_provisioned_throughput_and_snapshot_volumes_are_in_the_bill(tmp_path):
    hour = 3600.0
    base = {"disk_gb": 200}
    fast = {"disk_gb": 200, "disk_mbps": 1000}
    volumes = {"disk_gb": 200, "data_volumes": [{"gb": 300, "mbps": 500, "iops": 3000}]}
    gp3 = cost.gp3_price("us-east-1").per_gb_month

    def billed(details):
        inst = Instance(id="i-1", job_id="j", provider="aws", region="us-east-1",
                        zone="us-east-1a", instance_type="g5.xlarge", market="on-demand",
                        state="terminated", launched_at=0.0, terminated_at=hour,
                        price_per_hour=1.0, details=details)
        return cost.instance_cost(ledger.run_of(inst)).dollars

    per_month_to_hour = 1 / cost.HOURS_PER_MONTH
    assert billed(fast) - billed(base) == pytest.approx(
        cost.gp3_performance_per_month(1000) * per_month_to_hour)
    assert cost.gp3_performance_per_month(1000) == pytest.approx(875 * 0.04 + 1000 * 0.005)
    assert billed(volumes) - billed(base) == pytest.approx(
        (300 * gp3 + 375 * 0.04) * per_month_to_hour)


def test_cost_report_splits_out_the_data_copy(tmp_path):
    with Store(tmp_path / "state.db") as store:
        for n, staging in enumerate((0.75, None)):
            job = store.create_job(name=None, kind="recipe", recipe="imagenet",
                                   command="imagenet", backend="aws", spec={})
            detail = {"phases": {"boot": 0.1, "training": 2.0}}
            if staging is not None:
                detail["phases"]["staging"] = staging
            store.update_job(job.id, cost=3.0, cost_settled=1,
                             cost_detail=json.dumps(detail))
        rows, total = ledger.report(store, "recipe")
    assert [(r.key, r.jobs, r.staging) for r in rows] == [("imagenet", 2, 0.75)]
    assert total.staging == 0.75
    from cloudtrain import catalog_views

    assert "OF WHICH DATA COPY" in catalog_views.cost_report(rows, total, "recipe")
    assert ledger.report_csv(rows, total, "recipe").splitlines()[1].endswith(",0.750000")


def test_push_report_shows_a_skipped_name_without_its_control_characters():
    from cloudtrain import catalog_views
    from cloudtrain.providers.aws.datasets import PushReport

    report = PushReport("s3://b/p", skipped=[("evil\x1b[2Jname\n", "a socket")])
    text = catalog_views.push_report(report)
    assert "evil?[2Jname? (a socket)" in text and "\x1b" not in text


def test_a_snapshot_read_once_before_training_is_in_the_estimate(ct_home):
    (ct_home / "config.yaml").write_text(
        "datasets:\n  imagenet: {source: snap-0123456789abcdef0, throughput: 500}\n")
    est = estimate.for_recipe("imagenet", None, (), "us-east-1", types=["p3.16xlarge"])
    (row,) = est.rows
    assert est.staging_bytes == 0  # nothing is copied from S3
    assert est.preread_s == pytest.approx(160_000 / 500)  # the recipe's 160 GB at 500 MB/s
    assert row.staging_s == pytest.approx(320.0)
    assert row.total_s == pytest.approx(row.train_s + est.overheads.total + 320.0
                                        + catalog.VOLTA_INSTALL_S)  # p3's boot-time install
    from cloudtrain import catalog_views

    assert "reading the snapshot volumes once before training, 5m20s" in \
        catalog_views.estimate_table(est)


def test_notes_on_a_cross_region_copy_and_links_that_die_with_a_session(monkeypatch):
    from cloudtrain.providers.aws import AWSProvider

    for k, v in {"AWS_ACCESS_KEY_ID": "AKIAX", "AWS_SECRET_ACCESS_KEY": "s",
                 "AWS_CONFIG_FILE": "/nonexistent",
                 "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    settings = config.Settings(region="us-east-1")
    spec = JobSpec.of(kind="command", backend="aws", region="us-east-1", datasets=[
        {"name": "imagenet", "kind": "s3", "location": "s3://bkt/in", "dir": "imagenet"}],
        staging={"imagenet": {"kind": "shards", "bytes": 150 * 10**9, "region": "eu-west-1"}})

    def read():  # what preflight found: read with the credentials of the moment
        return [datasets.Staged(spec.data.datasets[0], temporary=aws_datasets.temporary_credentials(
            AWSProvider(settings).aws))]

    (note,) = datasets.notes(spec, settings, read())
    assert note == ("dataset imagenet: its bucket is in eu-west-1, the instance in us-east-1: "
                    "the copy crosses regions (slower, and about $3.00 of transfer for "
                    "150.0 GB)")
    spec.data.staging["imagenet"]["region"] = "us-east-1"
    assert datasets.notes(spec, settings, read()) == []
    monkeypatch.setenv("AWS_SESSION_TOKEN", "a-session")
    (note,) = datasets.notes(spec, settings, read())
    assert "temporary (session) credentials" in note
    settings.instance_profile = "cloudtrain-instance"  # the instance signs with its role
    assert datasets.notes(spec, settings, read()) == []


def _root_only(spec, wanted: int) -> dict:
    """A provider's disks for the copy: no local disk, `wanted` MB/s of the root volume."""
    return {"local": None, "mbps": wanted or None}


def test_the_copy_gets_time_of_its_own_in_the_max_runtime():
    from cloudtrain.providers.aws import datasets as s3_datasets

    provider = SimpleNamespace(staging_disk=_root_only,
                               read_dataset=lambda spec, source: datasets.Staged(
        source, s3_datasets.Contents("shards", 10, 50 * 10**9, 50 * 10**9, "ab" * 32), "r"))
    spec = JobSpec.of(kind="command", backend="aws", max_runtime_s=3600.0, datasets=[
        {"name": "d", "kind": "s3", "location": "s3://bkt/d", "dir": "d"}])
    spec, _ = datasets.preflight(spec, config.Settings(), provider)
    assert spec.data.staging_allowance_s == 600 + 500  # 10 min + 50 GB at 100 MB/s
    assert spec.max_runtime_s == 3600 + 1100
    # read again (a dry run, then the launch)
    spec, _ = datasets.preflight(spec, config.Settings(), provider)
    assert spec.max_runtime_s == 3600 + 1100
    assert datasets.staging_line(spec).endswith("; max runtime +18 min for it")


def _stored(size: int, largest: int = 256 << 20, manifest=None) -> SimpleNamespace:
    """A provider whose S3 dataset holds `size` bytes as S3 lists them (contents() checked the
    manifest against that listing: test_data_push_s3.py)."""
    from cloudtrain.providers.aws import datasets as s3_datasets

    return SimpleNamespace(staging_disk=_root_only,
                           read_dataset=lambda spec, source: datasets.Staged(
        source, s3_datasets.Contents("shards", 10, size, size, "ab" * 32, manifest,
                                     largest=largest), "r"))


def _staging_spec(minutes: float, backend: str = "aws") -> JobSpec:
    return JobSpec.of(kind="command", backend=backend, max_runtime_s=minutes * 60, datasets=[
        {"name": "d", "kind": "s3", "location": "s3://bkt/d", "dir": "d"}])


def test_f29_the_copy_s_allowance_keeps_the_max_runtime_within_the_week():
    """The max runtime also sets the agent's limit, the user-data power-off timer and the
    upload grant: with the copy's allowance added it stays within the one-week limit."""
    provider = _stored(50 * 10**9)  # 10 min + 500 s at 100 MB/s: 1100 s
    spec = _staging_spec(config.WEEK_S / 60 - 10)
    spec, _ = datasets.preflight(spec, config.Settings(), provider)
    assert spec.data.staging_allowance_s == 600  # capped: ten minutes were left of the week
    assert spec.max_runtime_s == config.WEEK_S
    assert datasets.staging_line(spec).endswith(
        "; max runtime +10 min for it (the one-week limit: the copy may take up to 18 min, "
        "the rest from the job's own time)")
    # read again (a dry run, then the launch)
    spec, _ = datasets.preflight(spec, config.Settings(), provider)
    assert spec.max_runtime_s == config.WEEK_S
    full = _staging_spec(config.WEEK_S / 60)
    full, _ = datasets.preflight(full, config.Settings(), provider)
    assert full.max_runtime_s == config.WEEK_S and full.data.staging_allowance_s == 0


def test_f29_data_that_cannot_be_copied_within_the_week_is_refused():
    provider = _stored(61 * 10**12)  # 610,000 s at 100 MB/s: past 604,800
    with pytest.raises(UsageError) as err:
        datasets.preflight(_staging_spec(60, backend="local"), config.Settings(), provider)
    assert err.value.message == ("the datasets (61,000 GB) take up to 10,177 min to copy at "
                                 "the 100 MB/s the max runtime allows for: past the one-week "
                                 "limit (10,080 min)")


def test_f29_a_root_volume_past_gp3_s_64_tib_is_refused():
    # 50,000 GB copies within the week, but ten 5 TiB shards in flight beside it do not fit
    provider = _stored(50 * 10**12, largest=5 << 40)
    spec = _staging_spec(60)
    need = datasets.disk_needed(50 * 10**12, 5 << 40)
    with pytest.raises(UsageError) as err:
        datasets.preflight(spec, config.Settings(), provider)
    assert err.value.message == ("the datasets take 50,000 GB on disk: with the system and "
                                 f"the copies in flight the root volume would be {need:,} GB, "
                                 "past gp3's largest (65,536 GiB)")
    provider = _stored(60 * 10**12, largest=5 << 30)  # 63,000 + 100 + 10 x 5.4 GB fits
    spec, _ = datasets.preflight(spec, config.Settings(), provider)
    assert spec.placement.disk_gb == datasets.disk_needed(60 * 10**12, 5 << 30) <= config.GP3_MAX_GB


def test_f29_the_shards_in_flight_are_the_largest_stored_and_no_more_than_there_are():
    """The manifest's own shard size (its word) no longer sizes the disk: two shards of 1 GB,
    whatever shard_bytes it claims, are at most two of the largest in flight."""
    from cloudtrain.host import shards

    two = shards.Manifest.build(5 << 40, [shards.ShardEntry(
        shards.shard_name(i), 1, 10**9, 10**9 - 3 * 512, "ab" * 32) for i in range(2)])
    provider = _stored(2 * 10**9, largest=10**9, manifest=two)
    spec = _staging_spec(60)
    spec, _ = datasets.preflight(spec, config.Settings(), provider)
    assert spec.placement.disk_gb == datasets.disk_needed(2 * 10**9, 10**9, in_flight=2) == 105


def test_a_recipe_pointed_at_a_copy_on_the_host_stages_nothing():
    """`--set data_dir=PATH`: the tree is already where the job runs (an AMI, a mount)."""
    assert _resolve(_spec(data_dir="/data/imagenet"), config.Settings(), {}) == []
    with pytest.raises(UsageError, match="recipe imagenet with these arguments reads no "
                                         "dataset"):
        _resolve(_spec(data_dir="/data/imagenet"), config.Settings(),
                         datasources.parse_data_flags(("imagenet=s3://bkt/in",)))


def test_u41_a_tree_without_the_variant_s_folders_is_refused_before_launch(tmp_path):
    """U41: `data prepare` with its default sizes writes sz/160 and sz/352; the tiny variant
    reads sz/40 and sz/88. That tree passed the launch and failed on the instance after
    boot and staging. preflight (the launch and the dry run) now refuses it, naming what is
    missing and the prepare command that makes exactly that; the tree it makes passes."""
    tree = tiny_prepared_imagenet(tmp_path, seed=1, sizes=(160, 352), classes=2)
    settings = config.Settings()
    flags = datasources.parse_data_flags((f"imagenet={tree}",))
    spec = _spec(variant="tiny")
    spec = dataclasses.replace(spec, backend="local")
    spec = spec.changed(datasets=_resolve(spec, settings, flags))
    with pytest.raises(datasets.MissingFolders) as err:
        datasets.preflight(spec, settings, provider=None)
    assert err.value.message == (
        f"dataset imagenet at {tree} has no sz/40/train, sz/40/val, sz/88/train, sz/88/val, "
        "which recipe imagenet with variant=tiny reads")
    assert err.value.hint == f"cloudtrain data prepare imagenet SRC {tree} --sizes 40,88"
    assert err.value.exit_code == 2
    # dawn-1x8 reads sz/160, which is there: no refusal
    dawn = _spec(variant="dawn-1x8")
    dawn = dataclasses.replace(dawn, backend="local")
    dawn = dawn.changed(datasets=_resolve(dawn, settings, flags))
    dawn, _ = datasets.preflight(dawn, settings, provider=None)
    # the hint's command, as `data prepare` runs it, makes what was missing
    from cloudtrain import dataprep

    dataprep.prepare("imagenet", tmp_path / "src", tree,
                     sizes=dataprep.parse_sizes(err.value.hint.split("--sizes ")[1]), workers=1)
    spec, _ = datasets.preflight(spec, settings, provider=None)


def test_u41_an_s3_dataset_is_checked_by_its_manifest_s_folders_or_its_objects():
    """U41 on S3: the manifest's folder list (or a plain prefix's objects) says what the tree
    holds; a manifest pushed before folders were listed cannot tell, and is not refused."""
    from cloudtrain.host import shards
    from cloudtrain.providers.aws import datasets as s3_datasets

    entry = shards.ShardEntry(shards.shard_name(0), 1, 2048, 100, "ab" * 32)
    prepared = shards.folders_of(["train/n1/a.JPEG", "val/n1/b.JPEG", "sz/160/train/n1/a.JPEG",
                                  "sz/160/val/n1/b.JPEG", "sz/352/train/n1/a.JPEG",
                                  "sz/352/val/n1/b.JPEG"])

    def provider(manifest=None, objects=()):
        contents = s3_datasets.Contents("shards" if manifest else "objects", 1, 2048, 100,
                                        "ab" * 32, manifest, objects=list(objects))
        return SimpleNamespace(staging_disk=_root_only,
                           read_dataset=lambda spec, source: datasets.Staged(
            source, contents, "r"))

    settings = config.Settings()
    flags = datasources.parse_data_flags(("imagenet=s3://bkt/imagenet",))
    spec = _spec(variant="tiny")
    spec = spec.changed(datasets=_resolve(spec, settings, flags))
    listed = shards.Manifest.build(2048, [entry], prepared)
    with pytest.raises(datasets.MissingFolders) as err:
        datasets.preflight(spec, settings, provider(listed))
    assert "has no sz/40/train, sz/40/val, sz/88/train, sz/88/val" in err.value.message
    assert err.value.hint == ("cloudtrain data prepare imagenet SRC DEST --sizes 40,88, then "
                              "cloudtrain data push DEST s3://bkt/imagenet")
    objects = [{"key": f"imagenet/{p}", "path": p, "bytes": 1, "md5": None}
               for p in ("train/n1/a.JPEG", "val/n1/b.JPEG")]
    with pytest.raises(datasets.MissingFolders, match="has no sz/40/train"):
        datasets.preflight(spec, settings, provider(objects=objects))
    spec = spec.changed(datasets=_resolve(spec, settings, flags))
    spec, found = datasets.preflight(spec, settings,
                                     provider(shards.Manifest.build(2048, [entry])))
    assert datasets.notes(spec, settings, found) == [
        "dataset imagenet: its manifest lists no folders (pushed by an older cloudtrain), so "
        "whether it has what the job reads is found out on the instance; `cloudtrain data "
        "push DIR s3://bkt/imagenet` again lists them"]
    machines4 = _spec(variant="machines-4")
    machines4 = machines4.changed(datasets=_resolve(machines4, settings, flags))
    # sz/160 and sz/352: all there
    machines4, _ = datasets.preflight(machines4, settings, provider(listed))
    # a dataset with nothing but sz/40 lacks the full-size folders: any prepare makes those
    only40 = shards.Manifest.build(2048, [entry], shards.folders_of(
        ["sz/40/train/n/a", "sz/40/val/n/a", "sz/88/train/n/a", "sz/88/val/n/a"]))
    spec = spec.changed(datasets=_resolve(spec, settings, flags))
    with pytest.raises(datasets.MissingFolders) as err:
        datasets.preflight(spec, settings, provider(only40))
    assert "has no train, val, which" in err.value.message
    assert "--sizes ''" in err.value.hint


def test_u60_a_linked_path_is_said_as_linked_in_the_timeline():
    """U60: a path on the host is linked, not copied: the timeline's staged line said
    `imagenet 0.0 MB, 0 files` for it."""
    from cloudtrain import hostdata

    staging = hostdata.clean_staging({"state": "staged", "datasets": [
        {"name": "imagenet", "kind": "path", "state": "staged", "bytes_total": 0,
         "bytes_done": 0, "files_total": 0, "files_done": 0, "mb_s": 0.0, "seconds": 0.01}]})
    assert datasets.staged_line(staging) == "data staged: imagenet linked, not copied"


# -- RG5: the copy onto the local NVMe the image mounts ------------------------------------------

GB = 10**9


def _nvme_provider(size: int, largest: int = 256 << 20, shards_count: int = 600,
                   ebs_cap: int = 437) -> SimpleNamespace:
    """The AWS provider's rules offline: the local NVMe the default image mounts on the job's
    type (images.local_nvme), gp3 throughput capped at `ebs_cap` MB/s; an S3 dataset of `size`
    bytes in `shards_count` shards, the largest `largest` bytes."""
    from cloudtrain.host import shards
    from cloudtrain.providers.aws import images

    manifest = SimpleNamespace(shards=[None] * shards_count)
    return SimpleNamespace(
        staging_disk=lambda spec, wanted: {
            "local": images.local_nvme(spec.placement.instance_type, spec.placement.ami),
            "mbps": min(wanted, ebs_cap) if wanted else None},
        read_dataset=lambda spec, source: datasets.Staged(source, aws_datasets.Contents(
            "shards", 1_281_167, size, size, "ab" * 32, manifest, largest=largest), "us-east-1"))


def _imagenet_copy(instance_type: str, **placement) -> JobSpec:
    return JobSpec.of(kind="command", backend="aws", command=["true"], region="us-east-1",
                      instance_type=instance_type, max_runtime_s=3600.0, datasets=[
                          {"name": "imagenet", "kind": "s3", "dir": "imagenet",
                           "location": "s3://bkt/imagenet"}], **placement)


def test_RG5_the_copy_room_is_the_root_volume_s_sizing_without_the_system():
    """RG5: what a copy takes on whatever disk it lands on, the same arithmetic the root
    volume is sized with (the files, 5 % for the file system, the shards in flight), less
    the root volume's own allowance for the AMI, caches and checkpoints."""
    assert datasets.copy_room(150 * GB, 256 << 20) == pytest.approx(157.5 + 10 * 0.268435456)
    assert datasets.disk_needed(150 * GB, 256 << 20) == math.ceil(
        datasets.copy_room(150 * GB, 256 << 20) + datasets.DISK_MARGIN_GB)
    assert datasets.copy_room(2 * GB, GB, in_flight=2) == pytest.approx(2.1 + 2)


@pytest.mark.parametrize("instance_type, disks, gb", [
    ("g5.xlarge", 1, 250.0), ("g6e.xlarge", 1, 250.0), ("p4d.24xlarge", 8, 8000.0)])
def test_RG5_a_copy_the_local_nvme_holds_goes_there_and_buys_no_disk(instance_type, disks, gb):
    """RG5: 150 GB of ImageNet on a type whose default image mounts NVMe big enough: the copy
    goes there; the root volume stays what the job asked (not raised for the copy) and no gp3
    throughput is bought; the spec says where and why, for the plan and the stager."""
    spec, _ = datasets.preflight(_imagenet_copy(instance_type), config.Settings(),
                                 _nvme_provider(150 * GB))
    room = datasets.copy_room(150 * GB, 256 << 20)
    assert spec.data.local_disk == {"used": True, "path": "/opt/dlami/nvme",
                                    "dir": "/opt/dlami/nvme/cloudtrain/data", "disks": disks,
                                    "gb": gb, "need_gb": math.ceil(room)}
    assert spec.placement.disk_gb is None and spec.root_gb(config.Settings()) == 100
    assert spec.data.disk_mbps is None
    assert datasets.notes(spec, config.Settings(), []) == []  # no throughput to explain
    # the copy's time of its own is the same wherever it lands (a pessimistic 100 MB/s)
    assert spec.data.staging_allowance_s == 600 + 1500
    # read again (the dry run, then the launch): the same
    again, _ = datasets.preflight(spec, config.Settings(), _nvme_provider(150 * GB))
    assert again.data == spec.data and again.placement == spec.placement


def test_RG5_a_copy_too_big_for_the_nvme_goes_to_the_root_volume_as_before_and_says_why():
    """RG5: 300 GB on g5.xlarge (250 GB of NVMe): the root volume is sized and given
    throughput as before, and the spec says why not the NVMe."""
    spec, _ = datasets.preflight(_imagenet_copy("g5.xlarge"), config.Settings(),
                                 _nvme_provider(300 * GB))
    need = math.ceil(datasets.copy_room(300 * GB, 256 << 20))
    assert spec.data.local_disk == {"used": False, "why": (
        f"g5.xlarge's local NVMe (250 GB at /opt/dlami/nvme) is smaller than the {need} GB "
        "the copy needs (the files, 5% for the file system, the shards in flight)")}
    assert spec.placement.disk_gb == datasets.disk_needed(300 * GB, 256 << 20)
    assert spec.data.disk_mbps == 437


@pytest.mark.parametrize("instance_type, placement, why", [
    ("p3.2xlarge", {}, "p3.2xlarge's image (Ubuntu 24.04, for Volta) mounts no local NVMe"),
    ("g5.xlarge", {"ami": "ami-0123456789abcdef0"},
     "--ami: cloudtrain knows of no local NVMe your image mounts"),
])
def test_RG5_no_nvme_on_volta_s_image_or_your_own_the_root_volume_as_before(
        instance_type, placement, why):
    spec, _ = datasets.preflight(_imagenet_copy(instance_type, **placement), config.Settings(),
                                 _nvme_provider(150 * GB))
    assert spec.data.local_disk == {"used": False, "why": why}
    assert spec.placement.disk_gb == datasets.disk_needed(150 * GB, 256 << 20)
    assert spec.data.disk_mbps == 437


def test_RG5_a_small_copy_says_nothing_of_disks_and_the_local_backend_has_none():
    """Nothing copied (a path on the host), the local backend (the provider knows no local
    disk): no word of an NVMe, and nothing changes."""
    spec, _ = datasets.preflight(_imagenet_copy("g5.xlarge").changed(backend="local"),
                                 config.Settings(), SimpleNamespace(
                                     staging_disk=_root_only,
                                     read_dataset=_nvme_provider(GB).read_dataset))
    assert spec.data.local_disk is None and spec.placement.disk_gb is None


def test_RG5_the_stager_s_plan_names_the_nvme_folder_and_each_copy_s_room():
    """RG5: the host's plan says where the local NVMe should be (the stager checks it there),
    and for each S3 dataset the folder its copy goes to there and the room it needs; a
    dataset already on the host (a path) is linked as before. Each node of a job on several
    machines gets this same plan and stages its own copy on its own NVMe."""
    provider = _nvme_provider(150 * GB)
    spec = _imagenet_copy("g5.xlarge")
    spec = spec.changed(datasets=[*spec.data.datasets, {"name": "mine", "kind": "path",
                                                        "location": "/data/mine", "dir": "mine"}])
    provider.read_dataset = (lambda read: lambda spec, source: read(spec, source)
                             if source["kind"] == "s3" else datasets.Staged(source))(
        provider.read_dataset)
    spec, found = datasets.preflight(spec, config.Settings(), provider)
    for staged in found:
        if staged.contents is not None:
            staged.entry = lambda role: {"kind": "shards", "auth": "presigned"}
    plan = datasets.host_plan(found, spec, config.Settings(), "/home/ubuntu/cloudtrain/data")
    assert plan["scratch"] == {"mount": "/opt/dlami/nvme",
                               "dir": "/opt/dlami/nvme/cloudtrain/data"}
    imagenet, mine = plan["datasets"]
    assert imagenet["dest"] == "/home/ubuntu/cloudtrain/data/imagenet"
    assert imagenet["scratch_dest"] == "/opt/dlami/nvme/cloudtrain/data/imagenet"
    assert imagenet["need_bytes"] == int(datasets.copy_room(150 * GB, 256 << 20) * 1e9)
    assert "scratch_dest" not in mine and mine["kind"] == "path"
    # the root volume: no scratch in the plan, the copies go to dest as before
    root_spec, root_found = datasets.preflight(
        _imagenet_copy("g5.xlarge", ami="ami-0123456789abcdef0"), config.Settings(),
        _nvme_provider(150 * GB))
    root_found[0].entry = lambda role: {"kind": "shards", "auth": "presigned"}
    root_plan = datasets.host_plan(root_found, root_spec, config.Settings(), "/d")
    assert "scratch" not in root_plan and "scratch_dest" not in root_plan["datasets"][0]


def test_RG5_the_timeline_says_which_disk_took_the_copy_and_why_not_the_nvme():
    """RG5: the stager's word on the disk (its status's `disk`, untrusted) ends the staged
    line: the local NVMe, or the root volume and why (a mount missing at run time)."""
    from cloudtrain import hostdata

    row = {"name": "imagenet", "kind": "shards", "state": "staged", "bytes_total": 150 * GB,
           "bytes_done": 150 * GB, "files_total": 10, "files_done": 10, "mb_s": 500.0,
           "seconds": 300.0}
    on_nvme = hostdata.clean_staging({"state": "staged", "datasets": [row], "disk": {
        "local": True, "path": "/opt/dlami/nvme/cloudtrain/data", "note": None}})
    assert datasets.staged_line(on_nvme) == (
        "data staged: imagenet 150.0 GB, 10 files in 300 s (500 MB/s); onto the local NVMe "
        "(/opt/dlami/nvme/cloudtrain/data)")
    fallback = hostdata.clean_staging({"state": "staged", "datasets": [row], "disk": {
        "local": False, "path": "/home/ubuntu/cloudtrain/data",
        "note": "/opt/dlami/nvme is not there\x1b (the image did not mount the local NVMe)"}})
    assert datasets.staged_line(fallback) == (
        "data staged: imagenet 150.0 GB, 10 files in 300 s (500 MB/s); onto the root volume "
        "(/home/ubuntu/cloudtrain/data), not the local NVMe: /opt/dlami/nvme is not there "
        "(the image did not mount the local NVMe)")
    for junk in ("no", {"local": "yes", "path": 5}, {"local": True}, {"path": "/x"}):
        assert hostdata.clean_staging({"state": "staged", "datasets": [row],
                                       "disk": junk}).get("disk") is None, junk
    # without a word on the disk (no NVMe planned), the line is as it was
    assert datasets.staged_line(hostdata.clean_staging({"state": "staged", "datasets": [row]})
                                ) == "data staged: imagenet 150.0 GB, 10 files in 300 s (500 MB/s)"
