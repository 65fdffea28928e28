"""recipes/imagenet/train.py end to end on the CPU, on generated JPEGs in the official layout
prepared like the real set: the tiny schedule (every kind of phase change), resume equality
(torch.equal) inside a phase, just before a phase switch and at it, SIGTERM mid-epoch, two gloo
ranks with an exact validation, the smoke profile as the orchestrator runs it, and one-line
errors for missing data.

Every test, and every process it starts, runs torch on one thread (see test_wide_resnet.py).
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import import_recipe_file, recipe_command, recipe_job_dir, resume_refusals

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "imagenet"


train = import_recipe_file("imagenet", "train.py", "imagenet_train")


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    pass


# 4 classes x 8 training images, 3 validation images a class: the tiny schedule takes 4 + 2 +
# 4 + 4 = 14 steps (batches 8, 16, 8, 8); epochs 1 -> 2 switch size, folder and min_scale.
SMALL = ["--variant", "tiny", "--arch", "resnet18", "--data", "synthetic",
         "--synthetic_classes", "4", "--synthetic_train", "8", "--synthetic_val", "3",
         "--workers", "0", "--device", "cpu"]


def _run(tmp_path, job, *extra):
    return train.main(SMALL + ["--job-dir", str(tmp_path / job),
                               "--data-dir", str(tmp_path / "data"), *extra])


def _ckpt(path):
    return torch.load(path / "checkpoints" / "last.pt", weights_only=True)


def _rows(job_dir):
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "event" not in r]


def _tsv(job_dir):
    with open(job_dir / "dawnbench.tsv") as f:
        return list(csv.reader(f, delimiter="\t"))


def _assert_same_training(reference: Path, resumed: Path):
    a, b = _ckpt(reference), _ckpt(resumed)
    assert a["step"] == b["step"]
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for x, y in zip(a["master"], b["master"]):
        assert torch.equal(x, y)
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"]), k
    ra, rb = _rows(reference), _rows(resumed)
    keys = ("epoch", "step", "size", "batch", "source", "min_scale", "lr", "train_loss",
            "train_acc", "test_acc", "top5", "test_loss", "val_images")
    assert [[r[k] for k in keys] for r in rb[-len(ra):]] == [[r[k] for k in keys] for r in ra]
    assert [row[0] for row in _tsv(resumed)] == [row[0] for row in _tsv(reference)]
    assert [row[2:] for row in _tsv(resumed)] == [row[2:] for row in _tsv(reference)]


@pytest.mark.slow(seconds=30)
def test_tiny_schedule_runs_every_phase_and_resumes_exactly_around_the_switch(tmp_path):
    assert _run(tmp_path, "straight") == 0
    rows = _rows(tmp_path / "straight")
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert [(r["size"], r["batch"], r["source"], r["min_scale"]) for r in rows] == [
        (32, 8, "sz/40", 0.08), (32, 16, "sz/40", 0.08), (56, 8, "sz/88", 0.087),
        (72, 8, "full", 0.5)]
    assert [r["step"] for r in rows] == [4, 6, 10, 14]
    assert [r["val_mode"] for r in rows] == ["center", "center", "center", "rect"]
    assert all(r["val_images"] == 12 for r in rows)  # every validation image, once
    sched = train.Schedule(train.VARIANTS["tiny"], 32, 1, 4)
    assert [r["lr"] for r in rows] == [sched.lr(r["step"] - 1) for r in rows]
    for r in rows:
        assert r["images_per_s"] > 0 and r["data_wait"] >= 0 and r["train_time"] > 0
        assert 0 <= r["top5"] <= 1 and r["top5"] >= r["test_acc"]
        assert r["loop_time"] >= r["train_time"]
    table = _tsv(tmp_path / "straight")
    assert table[0] == ["epoch", "hours", "top1Accuracy", "top5Accuracy"]
    assert [row[0] for row in table[1:]] == ["0", "1", "2", "3"]
    assert float(table[-1][3]) == pytest.approx(100 * rows[-1]["top5"], abs=1e-3)
    assert float(table[-1][1]) == pytest.approx(rows[-1]["train_time"] / 3600, abs=1e-5)
    # 4 classes: top-5 is 1.0 from the first epoch, so the target event comes at epoch 1
    events = [json.loads(line) for line in
              (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()
              if '"event"' in line]
    # issue 17: the startup row first, then the target event
    assert events[0]["event"] == "startup" and events[0]["device"] == "cpu", events[0]
    assert 0 < events[0]["import"] <= events[0]["to_first_step"] < rows[0]["wall_time"]
    assert [(e["event"], e["epoch"]) for e in events[1:]] == [("target_reached", 1)]
    assert events[1]["train_time"] == rows[0]["train_time"]
    assert events[1]["loop_time"] == rows[0]["loop_time"]
    assert events[1]["wall_time"] == rows[0]["wall_time"]
    # Stopped inside the first phase, just before the 1 -> 2 switch, and at it.
    for job, stop in (("inside", 2), ("before-switch", 5), ("at-switch", 6)):
        assert _run(tmp_path, job, "--stop-at-step", str(stop)) == 143
        assert _ckpt(tmp_path / job)["step"] == stop
        assert _run(tmp_path, job, "--resume", "true") == 0
        _assert_same_training(tmp_path / "straight", tmp_path / job)


def test_resume_refuses_a_checkpoint_from_other_arguments(tmp_path):
    assert _run(tmp_path, "j", "--stop-at-step", "1") == 143
    with pytest.raises(SystemExit, match="seed=0, this run has 1"):
        _run(tmp_path, "j", "--seed", "1", "--resume", "true")


def test_resume_refuses_a_damaged_checkpoint_or_a_step_past_the_schedule_F46(tmp_path):
    """F46: the tiny schedule has 14 steps: a checkpoint at step 15 or 10^18 is refused in
    one line, and so is an empty one."""
    assert _run(tmp_path, "j", "--stop-at-step", "1") == 143
    path = tmp_path / "j" / "checkpoints" / "last.pt"
    saved = _ckpt(tmp_path / "j")
    said = resume_refusals(lambda: _run(tmp_path, "j", "--resume", "true"), path,
                           [{**saved, "step": 15}, {**saved, "step": 10 ** 18}])
    assert said[:-1] == [f"{train.NAME}: {path}: refused to resume: its step is {step}, outside "
                         "this run's schedule (0 to 14)" for step in (15, 10 ** 18)]
    assert said[-1].startswith(f"{path}: refused to load the checkpoint: it is damaged")


def test_a_tree_whose_copies_disagree_is_refused_in_one_line(tmp_path):
    """The loaders index each folder by position: a val split missing a class, or a resized
    copy missing a file, would shift labels silently. Refused before training."""
    assert _run(tmp_path, "j", "--epochs", "1") == 0
    (root,) = [p for p in (tmp_path / "data").iterdir() if not p.name.endswith("-src")]
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    victim = sorted((bad / "sz" / "40" / "train").iterdir())[0]
    next(victim.iterdir()).unlink()
    with pytest.raises(SystemExit, match="sz/40 and full-size do not hold the same files"):
        train.main(["--variant", "tiny", "--device", "cpu", "--data-dir", str(bad),
                    "--job-dir", str(tmp_path / "k")])
    shutil.rmtree(sorted((bad / "val").iterdir())[0])
    with pytest.raises(SystemExit, match="class folders") as info:
        train.main(["--variant", "tiny", "--device", "cpu", "--data-dir", str(bad),
                    "--job-dir", str(tmp_path / "k")])
    assert "\n" not in str(info.value)


def test_too_few_images_or_an_uneven_batch_div_are_one_line(tmp_path):
    with pytest.raises(SystemExit, match="epoch 0 has no full batch.*--batch-div"):
        _run(tmp_path, "j", "--variant", "ffcv-rn50-16")
    with pytest.raises(SystemExit, match="batch_div 3 must divide tiny's per-GPU batches"):
        _run(tmp_path, "j", "--batch-div", "3")


@pytest.mark.slow(seconds=20)
def test_ffcv_variant_on_the_cpu(tmp_path):
    """FFCV rn50 (BlurPool, label smoothing, drop_last, 256 px validation with the 224/256
    crop and flip TTA) with its 512-image batch divided by 64: one epoch of 32 images."""
    assert _run(tmp_path, "f", "--variant", "ffcv-rn50-16", "--epochs", "1",
                "--batch-div", "64") == 0
    (row,) = _rows(tmp_path / "f")
    assert (row["size"], row["batch"], row["val_mode"], row["val_size"], row["step"]) == \
        (160, 8, "ffcv", 256, 4)
    assert row["val_images"] == 12
    model = _ckpt(tmp_path / "f")["model"]
    # resnet18's strided 3x3 is conv1 of the first block of layer2-4
    assert "layer2.0.conv1.blur_filter" in model and "layer2.0.conv1.conv.weight" in model


def test_amp_stepper_steps_the_masters_and_skips_an_overflow():
    """FFCV's precision (autocast + GradScaler) through the Stepper, on the CPU's float16
    autocast. GradScaler starts at 65536: steps whose float16 gradients overflow are skipped
    (masters and model unchanged) and halve the scale, until one fits and moves the fp32
    masters, which are then copied into the model; an input of inf is skipped the same way."""
    torch.manual_seed(0)
    variant = train.VARIANTS["ffcv-rn50-16"]
    model = train.build_model("resnet18", num_classes=4, blurpool=True)
    master = train.MasterWeights(model)
    opt = train.make_optimizer(model, master, variant)
    step = train.Stepper(model, model, master, opt, variant, 1.0, amp=True)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])

    def masters():
        return [p.detach().clone() for p in master.params]

    scale, moved = step.scaler.get_scale(), False
    for _ in range(16):
        before = masters()
        loss, logits = step(x, y, 0.1)
        assert logits.dtype == torch.float16 and torch.isfinite(loss)
        moved = any(not torch.equal(a, b) for a, b in zip(before, master.params))
        assert all(torch.equal(p, m) for p, m in zip(model.parameters(), master.params))
        if moved:
            assert step.scaler.get_scale() == scale  # a good step keeps the scale
            break
        assert step.scaler.get_scale() == scale / 2  # a skipped one halves it
        scale /= 2
    assert moved
    before = masters()
    step(torch.full_like(x, float("inf")), y, 0.1)
    assert all(torch.equal(a, b) for a, b in zip(before, master.params))
    assert step.scaler.get_scale() == scale / 2


def test_missing_data_is_one_line_naming_the_prepare_command(tmp_path):
    with pytest.raises(SystemExit) as info:
        train.main(["--variant", "dawn-1x8", "--device", "cpu", "--data-dir",
                    str(tmp_path / "nothing"), "--job-dir", str(tmp_path / "j")])
    message = str(info.value)
    assert "\n" not in message and "cloudtrain data prepare imagenet" in message
    assert "sz/160" in message


def test_u41_a_tree_prepared_with_other_sizes_names_the_sizes_that_make_it(tmp_path):
    """U41: the tiny variant on a tree `data prepare` made with its default sizes (160, 352)
    said `run cloudtrain data prepare imagenet SRC DEST`, which makes those again, not the
    40 and 88 px copies the variant reads. The fix names them, and running it makes the
    tree the variant reads."""
    from phases import VARIANTS

    files = train.imagenet_files
    files.write_synthetic_official(tmp_path / "src", classes=2, train_per_class=2,
                                   val_per_class=1, seed=3)
    files.prepare_imagenet(tmp_path / "src", tmp_path / "tree", workers=1)  # 160, 352
    with pytest.raises(SystemExit) as info:
        train.check_tree(tmp_path / "tree", VARIANTS["tiny"])
    message = str(info.value)
    assert "\n" not in message and "no " + str(tmp_path / "tree" / "sz" / "40" / "train") in \
        message
    assert message.endswith(f"run `cloudtrain data prepare imagenet SRC {tmp_path / 'tree'} "
                            "--sizes 40,88`")
    files.prepare_imagenet(tmp_path / "src", tmp_path / "tree", sizes=(40, 88), workers=1)
    assert set(train.check_tree(tmp_path / "tree", VARIANTS["tiny"])) == {"", "sz/40", "sz/88"}


@pytest.mark.parametrize("argv, text", [
    (["--epochs", "0"], "epochs must be at least 1"),
    (["--workers", "-1"], "workers must be >= 0"),
    (["--loss-scale", "nan"], "loss_scale must be a positive number"),
    (["--synthetic-classes", "0"], "synthetic_classes must be at least 1"),
])
def test_bad_arguments_are_one_line(argv, text):
    with pytest.raises(SystemExit, match=text):
        train.check_args(train.build_parser().parse_args(argv))


def test_recipe_yaml_declares_exactly_the_scripts_arguments():
    from cloudtrain import recipes

    rec = recipes.load("imagenet")
    parser = train.build_parser()
    dests = {a.dest for a in parser._actions} - {"help", "job_dir", "stop_at_step"}
    assert set(rec.arguments) == dests
    assert set(rec.arguments["variant"].choices) == set(train.VARIANTS)
    assert rec.nodes_published({"variant": "machines-16"}) == 16
    assert rec.nodes_published({"variant": "dawn-1x8"}) == 1
    target = recipes.load("imagenet").target
    assert (target["metric"], target["value"]) == ("top5", 0.93)
    assert {name: (own["metric"], own["value"]) for name, own in target["per_variant"].items()
            } == {name: (v.target_metric, v.target) for name, v in train.VARIANTS.items()
                  if (v.target_metric, v.target) != ("top5", 0.93)}


# ---------------------------------------------------------------------------------------------
# Subprocesses: the smoke profile as the orchestrator runs it, SIGTERM, two ranks


def _env(tmp_path, job):
    return {**os.environ, "CLOUDTRAIN_JOB_DIR": str(job), "OMP_NUM_THREADS": "1",
            "CLOUDTRAIN_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow(seconds=40)
def test_sigterm_mid_epoch_as_the_orchestrator_runs_it_resumes_exactly(tmp_path):
    """The smoke profile's command line (8 training images a class instead of 16, to keep
    this quick): straight; SIGTERM'd during the second epoch (5 steps of 16), exit 143 with a
    checkpoint at a step boundary; resumed, it ends with the straight run's weights."""
    job = recipe_job_dir(tmp_path, "imagenet")
    command = recipe_command("imagenet") + ["--synthetic_train", "8"]
    proc = subprocess.run(command, cwd=job, env=_env(tmp_path, job), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith("imagenet: starting (variant=tiny")
    rows = _rows(job)
    assert [r["size"] for r in rows] == [32, 32, 56, 72] and rows[0]["val_images"] == 40

    other = tmp_path / "other"
    other.mkdir()
    p = subprocess.Popen(command, cwd=job, env=_env(tmp_path, other), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out = []
    for line in p.stdout:
        out.append(line)
        if line.startswith("imagenet: epoch 1/4"):
            p.send_signal(signal.SIGTERM)
            break
    out += p.stdout.readlines()
    assert p.wait(timeout=120) == 143, "".join(out)
    stopped = _ckpt(other)["step"]
    assert 10 <= stopped < 35
    assert any("SIGTERM received" in line for line in out)
    resumed = subprocess.run(command + ["--resume", "true"], cwd=job, env=_env(tmp_path, other),
                             capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming at step {stopped}" in resumed.stdout
    _assert_same_training(job, other)


@pytest.mark.slow(seconds=40)
def test_two_gloo_ranks_validate_every_image_once(tmp_path):
    """5 validation images a class x 4 = 20 over 2 ranks: at 32 px the DX batching gives rank 0
    one batch of 16 and rank 1 one of 4; rectangular validation at 72 px (chunks of 8) gives
    rank 0 two batches and rank 1 one of 4 and one empty; the counts add up to 20."""
    env = {**os.environ, "CLOUDTRAIN_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    argv = [a if a != "3" else "5" for a in SMALL]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(RECIPE / "train.py"), *argv,
               "--job-dir", str(tmp_path / "two")]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "processes=2" in proc.stdout
    assert "2 process(es) with the published per-GPU batches: global batch and lr x2" in proc.stdout
    rows = _rows(tmp_path / "two")
    assert [r["val_images"] for r in rows] == [20, 20, 20, 20]
    assert [r["global_batch"] for r in rows] == [16, 32, 16, 16]
    sched = train.Schedule(train.VARIANTS["tiny"], 32, 2, 4, 2.0)
    assert [r["step"] for r in rows] == [sched.starts[e + 1] for e in range(4)]
    # The two ranks' validation is that of rank 0's model (the checkpoint) in one process.
    (root,) = [p for p in (tmp_path / "data").iterdir() if not p.name.endswith("-src")]
    model = train.build_model("resnet18", num_classes=4)
    model.load_state_dict(_ckpt(tmp_path / "two")["model"])
    valset = train.imagenet_data.ValSet(root / "val", 72, "rect", 8)
    loader = train.imagenet_data.val_loader(
        valset, train.imagenet_data.val_batches(len(valset), 8, 1, 0, valset.order), 0, False)
    alone = train.evaluate(model, loader, train.imagenet_data.Normaliser("cpu", torch.float32),
                           train.distributed.World(), tta=False, amp=False)
    assert alone["n"] == 20
    assert (alone["top1"], alone["top5"]) == (rows[-1]["test_acc"], rows[-1]["top5"])
    assert alone["loss"] == pytest.approx(rows[-1]["test_loss"], rel=1e-6)


def _startup(job_dir):
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r.get("event") == "startup")


FFCV_ONE_EPOCH = ["--variant", "ffcv-rn50-16", "--epochs", "1", "--batch-div", "64"]


def test_ffcv_variant_reads_the_500_px_tree_when_there_and_full_size_otherwise(tmp_path, capsys):
    """The same synthetic dataset first without max/500 (full size, and the startup row says
    how to get FFCV's copies), then with them (data prepare --max-sides 500): the run reads
    max/500 for train and val, says so, and a checkpoint of the first cannot resume the
    second."""
    pytest.importorskip("cv2", reason="opencv-python-headless (the recipes extra)")
    assert _run(tmp_path, "full", *FFCV_ONE_EPOCH) == 0
    row = _startup(tmp_path / "full")
    assert row["tree"] == "full" and "--max-sides 500" in row["tree_why"]
    assert _rows(tmp_path / "full")[0]["source"] == "full"
    assert "data prepare imagenet SRC DEST --max-sides 500" in capsys.readouterr().out

    args = train.build_parser().parse_args(SMALL + FFCV_ONE_EPOCH + [
        "--data-dir", str(tmp_path / "data")])
    src, root = train.synthetic_root(args, train.VARIANTS["ffcv-rn50-16"])
    report = train.imagenet_files.prepare_imagenet(src, root, sizes=(), max_sides=(500,),
                                                   workers=1)
    assert report.counts["max/500/train"] == 32
    # the copies are FFCV's re-encodings: other bytes than the full-size files
    full = sorted((root / "train").rglob("*.JPEG"))[1]
    assert full.read_bytes() != (root / "max/500/train" / full.relative_to(root / "train")
                                 ).read_bytes()
    assert _run(tmp_path, "max", *FFCV_ONE_EPOCH) == 0
    row = _startup(tmp_path / "max")
    assert row["tree"] == "max/500" and row["tree_why"].startswith("max/500 is there")
    (epoch,) = _rows(tmp_path / "max")
    assert (epoch["source"], epoch["val_images"]) == ("max/500", 12)
    assert "(max/500 is there: FFCV's data" in capsys.readouterr().out

    shutil.copytree(tmp_path / "full", tmp_path / "again")
    with pytest.raises(SystemExit, match="trained from full folders, this run would read "
                                         "max/500") as info:
        _run(tmp_path, "again", *FFCV_ONE_EPOCH, "--resume", "true")
    assert "\n" not in str(info.value)


def test_choose_tree_needs_train_and_val_and_leaves_other_variants_alone(tmp_path):
    ffcv, dawn = train.VARIANTS["ffcv-rn50-24"], train.VARIANTS["dawn-1x8"]
    assert ffcv.prefers == "max/500" and ffcv.sources() == [""]
    (tmp_path / "max/500/train").mkdir(parents=True)
    variant, tree = train.choose_tree(tmp_path, ffcv)  # no val/: not FFCV's data
    assert variant is ffcv and tree["tree"] == "full"
    (tmp_path / "max/500/val").mkdir()
    variant, tree = train.choose_tree(tmp_path, ffcv)
    assert variant.sources() == ["max/500"] and tree["tree"] == "max/500"
    assert [p.size for p in variant.data] == [p.size for p in ffcv.data]
    assert train.choose_tree(tmp_path, dawn) == (dawn, {})


def test_the_target_is_the_variants_metric():
    ffcv, dawn = train.VARIANTS["ffcv-rn50-32"], train.VARIANTS["dawn-1x8"]
    assert train.reached({"top1": 0.766, "top5": 0.90}, ffcv)
    assert not train.reached({"top1": 0.765, "top5": 0.95}, ffcv)  # top-5 alone is not it
    assert train.reached({"top1": 0.1, "top5": 0.93}, dawn)
    assert not train.reached({"top1": 0.9, "top5": 0.929}, dawn)
    assert train.target_text(ffcv) == "76.6% top-1 (FFCV's README: top-5 92.7%, its logs: 93.47%)"
    assert train.target_text(dawn) == "93.0% top-5"
