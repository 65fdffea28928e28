"""cloudtrain/preflight.py: the checks of a launch and of its dry run, through the real CLI.

Nothing is paid for a plan that cannot work (issue 14; findings D1-D36 of the first-hour
report): the checks a launch makes before creating anything, made the same by the dry run;
the region from the AWS chain for every command; the confirmation before spending.

CLI-level: the real `cloudtrain` as a subprocess; the AWS cases against a moto server, the
confirmation through a real pseudo-terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labs.aws import moto_endpoint  # noqa: F401  (fixture)
from labs.credentials import AWS_ENV, CLIENT_CREDS
from conftest import REPO
from labs.terminal import run_in_terminal
from labs.aws import reset_moto

NO_AWS = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
          "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}


def run(*args, env=None, cwd=REPO, aws=False, timeout=60):
    """`cloudtrain ARGS` with no AWS configuration at all unless `env` brings some."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", *args], capture_output=True,
                          text=True, env={**base, **NO_AWS, **(env or {})}, cwd=cwd,
                          timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def refused(proc, *words):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    first = proc.stderr.splitlines()[0]
    assert first.startswith("Error: "), proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
    return proc.stderr


def rows(plan: str) -> dict[str, str]:
    out = {}
    for line in plan.splitlines()[1:]:
        key, _, value = line.strip().partition("  ")
        out[key] = value.strip()
    return out


def no_jobs(home: Path) -> bool:
    proc = run("status", "--json", env={"CLOUDTRAIN_HOME": str(home)})
    return proc.returncode == 0 and proc.stdout.strip() == "[]"


@pytest.fixture
def moto(moto_endpoint):  # noqa: F811
    """AWS credentials and a fresh moto server: EC2 answers what the catalog cannot."""
    reset_moto(moto_endpoint)
    return {**AWS_ENV, "AWS_ENDPOINT_URL": moto_endpoint}


# -- the region ------------------------------------------------------------------------------


def test_d1_dry_run_without_a_region_plans_in_the_default_one_and_says_so():
    proc = run("launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--spot", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    region = rows(proc.stdout)["region"]
    assert region.startswith("us-east-1 (the default: no --region, `region:` in config.yaml, "
                             "AWS_REGION"), region
    assert "$0.4328/h" in rows(proc.stdout)["price"]


# D2
def test_d2_aws_region_is_read_as_the_aws_cli_reads_it():
    proc = run("launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--dry-run",
               env={"AWS_REGION": "eu-west-1"})
    assert proc.returncode == 0, proc.stderr
    assert rows(proc.stdout)["region"] == "eu-west-1 (AWS_REGION)"
    # botocore reads AWS_DEFAULT_REGION; AWS_REGION comes first, as in the AWS CLI
    proc = run("launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--dry-run",
               env={"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-west-2"})
    assert rows(proc.stdout)["region"] == "eu-west-1 (AWS_REGION)"


# D28
def test_d28_gpus_looks_in_the_aws_chains_region():
    proc = run("launch", "--recipe", "resnet9", "--gpus", "L4:1", "--dry-run",
               env={"AWS_DEFAULT_REGION": "us-east-1"})
    assert proc.returncode == 0, proc.stderr
    plan = rows(proc.stdout)
    assert plan["region"] == "us-east-1" and plan["instance"].startswith("g6.xlarge")


# D6
def test_d6_unknown_region_is_named_with_the_nearest():
    refused(run("launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--region",
                "xx-east-1", "--dry-run"), "unknown AWS region 'xx-east-1'",
            "did you mean us-east-1?")


def test_d27_spot_and_region_choose_the_cloud_as_instance_does():
    for flags in (["--spot"], ["--region", "us-west-2"]):
        proc = run("launch", "--recipe", "resnet9", "--profile", "smoke", *flags, "--dry-run")
        assert proc.returncode == 0, proc.stderr
        assert rows(proc.stdout)["backend"] == "aws"
        assert "--market" not in proc.stderr
    # asked for on the local backend by name, the flag that exists is named
    refused(run("launch", "--backend", "local", "--spot", "--", "true"),
            "--spot applies to cloud backends, not local")


# -- the instance type -----------------------------------------------------------------------


@pytest.mark.parametrize("typed, meant", [("g5.xlarg", "g5.xlarge"), ("G5.xlarge", "g5.xlarge"),
                                          ("p3.2xlarg", "p3.2xlarge")])
# D5
def test_d5_a_mistyped_instance_type_is_refused_with_a_suggestion(typed, meant, ct_home):
    err = refused(run("launch", "--recipe", "resnet9", "--instance", typed, "--dry-run"),
                  f"did you mean {meant}?")
    assert "unknown instance type" in err
    refused(run("launch", "--instance", typed, "--", "true"), f"did you mean {meant}?")
    assert no_jobs(ct_home)


# D5
def test_d5_a_type_without_a_gpu_needs_cpu_only():
    refused(run("launch", "--recipe", "resnet9", "--instance", "t3.micro", "--dry-run"),
            "t3.micro is not a GPU instance type", "--cpu-only")
    proc = run("launch", "--recipe", "resnet9", "--instance", "t3.micro", "--cpu-only",
               "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "no GPU (--cpu-only)" in rows(proc.stdout)["instance"]


# D5
def test_d5_ec2_answers_for_types_the_catalog_does_not_hold(moto):
    refused(run("launch", "--recipe", "resnet9", "--instance", "t3.micro", "--dry-run",
                env=moto), "t3.micro has no GPU", "--cpu-only")
    refused(run("launch", "--recipe", "resnet9", "--instance", "x9.huge", "--dry-run", env=moto),
            "unknown instance type 'x9.huge'", "EC2 has no such type")
    proc = run("launch", "--recipe", "resnet9", "--instance", "t3.micro", "--cpu-only",
               "--dry-run", env=moto)
    assert proc.returncode == 0, proc.stderr


# D6
def test_d6_a_type_not_offered_in_the_region_is_refused(moto):
    # the catalog covers eu-west-1 and has no p5.48xlarge there
    refused(run("launch", "--recipe", "resnet9", "--instance", "p5.48xlarge", "--region",
                "eu-west-1", "--dry-run"), "p5.48xlarge is not offered in eu-west-1",
            "us-east-1")
    # eu-north-1 is outside the catalog: EC2 says (moto's offerings, like AWS's, lack p3 there)
    refused(run("launch", "--recipe", "resnet9", "--instance", "p3.2xlarge", "--region",
                "eu-north-1", "--dry-run", env=moto), "p3.2xlarge is not offered in eu-north-1")
    # without credentials it cannot be known: said in the plan, not approved silently
    proc = run("launch", "--recipe", "resnet9", "--instance", "g6.xlarge", "--region",
               "eu-north-1", "--dry-run")
    assert proc.returncode == 0 and "EC2 checks at launch" in rows(proc.stdout)["note"]


@pytest.mark.parametrize("instance", ["p3.2xlarge", "p3.8xlarge", "p3.16xlarge",
                                      "p3dn.24xlarge"])
def test_RA2_a_volta_type_gets_ubuntu_with_the_proprietary_driver_and_a_cuda_12_6_torch(instance):
    """RA2: no current Deep Learning AMI runs a V100 (its open-kernel-module driver supports
    Turing and newer; its torch is CUDA 13, no sm_70), so the mission's own `--instance
    p3.2xlarge` would boot and fail, billed. A Volta type's dry run now names what it gets
    instead, and why: Canonical's Ubuntu 24.04 by its SSM parameter, NVIDIA's proprietary
    driver 580 (the last branch that runs Volta) and torch 2.14.1 built for CUDA 12.6 (sm_70)
    installed at boot, the minutes that costs in the estimate, and the disk; the note says
    that a current type starts sooner. RH4 (the host key of a Xen type, read from a lagging
    console) applies to p3 again."""
    proc = run("launch", "--recipe", "resnet9", "--instance", instance, "--spot",
               "--region", "us-east-1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    plan = rows(proc.stdout)
    assert plan["instance"].startswith(f"{instance}: ")
    assert plan["note"].startswith(f"{instance}'s V100") and "(Volta)" in plan["note"]
    assert "g6.xlarge (L4) start sooner" in plan["note"]
    ami = plan["AMI"]
    for said in ("Ubuntu 24.04", "/aws/service/canonical/ubuntu/server/24.04/stable/current/"
                 "amd64/hvm/ebs-gp3/ami-id", "NVIDIA's proprietary driver 580-server",
                 "the last branch that runs Volta", "torch 2.14.1 + torchvision 0.29.1",
                 "CUDA 12.6", "sm_70", "/opt/cloudtrain/torch", "about 6 min more",
                 "the job stops if torch sees no GPU"):
        assert said in ami, (said, ami)
    assert plan["disk"].startswith("60 GB gp3")
    assert "+6 min boot-time install of the driver and torch" in plan["estimate"]
    # with --ami the image is the user's: nothing is installed, and the plan says so
    proc = run("launch", "--recipe", "resnet9", "--instance", instance, "--region",
               "us-east-1", "--ami", "ami-0123456789abcdef0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert rows(proc.stdout)["AMI"] == "ami-0123456789abcdef0"
    assert "note" not in rows(proc.stdout)


def test_RA2_an_image_on_a_type_it_does_not_boot_on_is_refused_by_ec2_and_before_anything(
        moto, monkeypatch):
    """RA2 (the lab refuses an image on a type it does not support): EC2's RunInstances
    refuses an image of another architecture, a UEFI-only image on a type that boots only
    legacy BIOS (p3, a Xen type) and an image without ENA on a type that requires it; the
    lab (labs/moto_images.py ImageFits, with the p3 types moto lacks: labs/moto_types.py)
    refuses them the same way, and a uefi-preferred image boots on p3. cloudtrain refuses
    each such --ami before anything is created, in one line, naming why."""
    import boto3
    from botocore.exceptions import ClientError

    from labs.moto_images import ImageFits
    from labs.moto_types import MotoTypes

    MotoTypes().install(monkeypatch)
    fits = ImageFits().install(monkeypatch)
    ec2 = boto3.client("ec2", endpoint_url=moto["AWS_ENDPOINT_URL"], region_name="us-east-1",
                       **CLIENT_CREDS)
    uefi = ec2.register_image(Name="uefi-only", BootMode="uefi", EnaSupport=True)["ImageId"]
    arm = ec2.register_image(Name="arm-image", Architecture="arm64", EnaSupport=True)["ImageId"]
    no_ena = ec2.register_image(Name="no-ena", EnaSupport=False)["ImageId"]
    both = ec2.register_image(Name="both-modes", BootMode="uefi-preferred",
                              EnaSupport=True)["ImageId"]
    for ami, kind, code in ((uefi, "p3.2xlarge", "InvalidParameterCombination"),
                            (arm, "g5.xlarge", "InvalidParameterValue"),
                            (no_ena, "g5.xlarge", "InvalidParameterCombination")):
        with pytest.raises(ClientError, match=code):
            ec2.run_instances(ImageId=ami, InstanceType=kind, MinCount=1, MaxCount=1)
    assert "does not match the architecture 'arm64'" in fits.refused[1]
    assert "(ENA) is required for the 'g5.xlarge' instance type" in fits.refused[2]
    for ami, kind in ((both, "p3.2xlarge"), (no_ena, "p3.2xlarge"), (uefi, "g5.xlarge")):
        ec2.run_instances(ImageId=ami, InstanceType=kind, MinCount=1, MaxCount=1)
    assert len(fits.refused) == 3

    def launch(ami, kind):
        return run("launch", "--recipe", "resnet9", "--instance", kind, "--ami", ami,
                   "--region", "us-east-1", "--dry-run", env=moto)

    for ami, kind, words in (
            (uefi, "p3.2xlarge", (f"{uefi} boots only with UEFI", "p3.2xlarge boots only "
                                  "legacy-bios", "RunInstances would refuse it")),
            (no_ena, "g5.xlarge", ("g5.xlarge requires ENA", f"{no_ena} is not enabled")),
            (arm, "g5.xlarge", ("g5.xlarge is x86_64 but the AMI is arm64",))):
        error = refused(launch(ami, kind), *words)
        assert len(error.splitlines()) == 2, error
    for ami, kind in ((both, "p3.2xlarge"), (uefi, "g5.xlarge")):
        assert launch(ami, kind).returncode == 0


@pytest.mark.parametrize("instance, region", [
    ("g7e.2xlarge", "us-east-1"), ("p6-b300.48xlarge", "us-west-2"), ("g6f.large", "us-east-1"),
    ("gr6f.4xlarge", "us-east-1")])
def test_RA3_a_gpu_type_the_dlami_does_not_list_is_refused_unless_an_ami_is_given(instance,
                                                                                   region):
    """RA3: the catalog offered g7e, p6-b300 (Blackwell parts the Ubuntu PyTorch DLAMI's
    driver is not released for) and the fractional g6f/gr6f (an AL2023 image's) as equals of
    the types the DLAMI lists. A GPU type outside its list is refused before anything, naming
    the list; with --ami the image is the user's to vouch for."""
    error = refused(run("launch", "--instance", instance, "--region", region, "--dry-run",
                        "--", "true"),
                    f"{instance} is not among the GPU types cloudtrain's default images support",
                    "G4DN, G5, G6, GR6, G6E, P4D, P4DE, P5, P5E, P5EN, P6-B200",
                    f"or pass --ami with an image that supports {instance}")
    assert len(error.splitlines()) == 2
    proc = run("launch", "--instance", instance, "--region", region, "--ami",
               "ami-0123456789abcdef0", "--dry-run", "--", "true")
    assert proc.returncode == 0, proc.stderr
    # The types it lists, and a CPU type run on purpose, are taken as before.
    for ok in (("--instance", "g4dn.xlarge"), ("--instance", "p5.4xlarge"),
               ("--instance", "t3.micro", "--cpu-only")):
        proc = run("launch", "--recipe", "resnet9", *ok, "--region", "us-east-1", "--dry-run")
        assert proc.returncode == 0, (ok, proc.stderr)


@pytest.mark.parametrize("region", ["cn-north-1", "cn-northwest-1"])
def test_RF3_a_china_region_is_refused_before_anything(region):
    """RF3: an instance signs its own S3 and Auto Scaling requests to amazonaws.com
    addresses; the China partition's are amazonaws.com.cn, so its uploads, bootstrap and
    group ending would fail on the instance, billed. Refused before anything, in one line
    and a hint; a GovCloud region (amazonaws.com too) goes on to the type check."""
    error = refused(run("launch", "--recipe", "resnet9", "--instance", "g5.xlarge",
                        "--region", region, "--dry-run"),
                    f"{region} is in AWS's China partition", "--region")
    assert len(error.splitlines()) == 2
    proc = run("launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--region",
               "us-gov-west-1", "--dry-run")
    assert "China partition" not in proc.stdout + proc.stderr


def test_RA2_gpus_v100_finds_a_p3_with_its_own_image_and_ec2s_word_on_a_type_counts_too():
    """RA2, RG3 (p3/p3dn offered to --gpus as equals): --gpus V100:1 finds p3.2xlarge, which
    gets the Volta image as above; a type the catalog lacks is judged by the GPU and family
    EC2 says it has (DescribeInstanceTypes), the same way; a GPU type no default image runs
    is refused naming what to take instead."""
    from cloudtrain import preflight
    from cloudtrain.errors import UsageError

    proc = run("launch", "--recipe", "resnet9", "--gpus", "V100:1", "--region", "us-east-1",
               "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert rows(proc.stdout)["instance"].startswith("p3.2xlarge: ")
    assert "NVIDIA's proprietary driver 580-server" in rows(proc.stdout)["AMI"]
    volta = {"gpus": 4, "gpu": "V100", "arch": "x86_64"}
    facts = preflight.instance_type("p3.9xlarge", "us-east-1", describe=lambda name: volta,
                                    offered=lambda name: True)
    assert (facts.gpu, facts.gpus, facts.source) == ("V100", 4, "EC2")
    assert facts.note and facts.note.startswith("p3.9xlarge's V100 (Volta)")
    blackwell = {"gpus": 4, "gpu": "RTXPRO6000", "arch": "x86_64"}
    with pytest.raises(UsageError, match="g7e.24xlarge is not among") as info:
        preflight.instance_type("g7e.24xlarge", "us-east-1", describe=lambda name: blackwell,
                                offered=lambda name: True)
    assert "e.g. g5.12xlarge (4 A10G)" in info.value.hint
    facts = preflight.instance_type("g7e.24xlarge", "us-east-1",
                                    describe=lambda name: blackwell,
                                    offered=lambda name: True, dlami=False)
    assert facts.note is None


# D21
def test_d21_arm64_types_are_not_paired_with_the_x86_64_ami():
    refused(run("launch", "--recipe", "resnet9", "--gpus", "T4g:1", "--region", "us-east-1",
                "--dry-run"), "arm64", "x86_64")
    refused(run("launch", "--recipe", "resnet9", "--instance", "g5g.xlarge", "--region",
                "us-east-1", "--dry-run"), "g5g.xlarge is arm64 but the Deep Learning AMI is "
                                          "x86_64")


# D31
def test_d31_a_missing_deep_learning_ami_is_said_under_ami(moto):
    proc = run("launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--region",
               "us-east-1", "--dry-run", env=moto)
    assert proc.returncode == 0, proc.stderr
    plan = rows(proc.stdout)
    assert "no AWS Deep Learning PyTorch AMI found in us-east-1" in plan["AMI"], proc.stdout
    assert "credentials" not in plan


def test_RA5_the_plan_says_which_user_an_image_of_the_user_s_own_lets_in(moto):
    """RA5: with --ami naming an Amazon Linux image, the plan's SSH user is ec2-user and says
    why (the image's own name); without --ami, the Deep Learning AMI's ubuntu."""
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=moto["AWS_ENDPOINT_URL"], region_name="us-east-1",
                       **CLIENT_CREDS)
    ami = ec2.register_image(Name="al2023-ami-2023.6.20261101.0-kernel-6.1-x86_64",
                             RootDeviceName="/dev/xvda")["ImageId"]
    proc = run("launch", "--recipe", "resnet9", "--instance", "g5.xlarge", "--region",
               "us-east-1", "--ami", ami, "--dry-run", env=moto)
    assert proc.returncode == 0, proc.stderr
    assert rows(proc.stdout)["SSH user"].startswith(f"ec2-user: the default user of {ami} "
                                                   "(al2023-ami-"), proc.stdout


# -- what runs -------------------------------------------------------------------------------


# D14
def test_d14_a_task_file_given_after_double_dash_is_refused_and_one_before_it_runs(ct_home,
                                                                                  tmp_path):
    """D14 (issue 16): `launch task.yaml` reads the job file now; after `--` the same word is
    a command, refused with the way to run the file; a .json "task file" is not ours."""
    (tmp_path / "task.yaml").write_text("run: python train.py\n")
    (tmp_path / "task.json").write_text("{}\n")
    env = {"CLOUDTRAIN_HOME": str(ct_home)}
    for flags in ([], ["--instance", "g5.xlarge"]):
        err = refused(run("launch", *flags, "--", "task.yaml", cwd=tmp_path, env=env),
                      "task.yaml is a job file, not a command: give it before any --")
        assert "cloudtrain launch task.yaml" in err
    err = refused(run("launch", "--", "task.json", cwd=tmp_path, env=env),
                  "task.json is a file, not a command; cloudtrain's job files are YAML")
    # the file itself is read: its `run` names train.py, which the job would not have (U11:
    # said at the file's line, naming the key to write)
    err = refused(run("launch", "task.yaml", cwd=tmp_path, env=env),
                  "task.yaml:1: run: train.py: no such file, and without workdir:")
    assert no_jobs(ct_home)


# D15
def test_d15_own_options_before_double_dash_are_explained(ct_home):
    err = refused(run("launch", "-n", "x", "python", "train.py", "--epochs", "1"),
                  "--epochs is not an option of cloudtrain launch")
    assert "Hint: cloudtrain launch -n x -- python train.py --epochs 1" in err
    assert "--procs" not in err  # click's "did you mean" pointed elsewhere



def test_u3_hints_keep_launchs_options_and_never_turn_a_dry_run_into_a_launch(ct_home):
    err = refused(run("launch", "--instance", "g5.xlarge", "--spot", "python", "train.py",
                      "--epochs", "1", "--dry-run"), "--epochs is not an option")
    assert "Hint: cloudtrain launch --instance g5.xlarge --spot --dry-run -- python train.py " \
           "--epochs 1" in err
    err = refused(run("launch", "--recipe", "resnet9", "--epochs", "3", "--dry-run"),
                  "a recipe argument is --set KEY=VALUE")
    assert "Hint: cloudtrain launch --recipe resnet9 --set epochs=3 --dry-run" in err
    err = refused(run("launch", "-c", "mycluster", "proj/r9.yaml", "--dry-run"),
                  "Error: -c is not an option of cloudtrain launch")
    assert "-- mycluster" not in err
    assert no_jobs(ct_home)


# D16
def test_d16_a_script_outside_the_workdir_is_refused_before_launch(ct_home, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('trained')\n")
    env = {"CLOUDTRAIN_HOME": str(ct_home)}
    err = refused(run("launch", "--", "python", "train.py", cwd=project, env=env),
                  "train.py is here, but without --workdir the job runs in an empty directory")
    assert "--workdir ." in err
    other = tmp_path / "other"
    other.mkdir()
    refused(run("launch", "--workdir", str(other), "--", "python", "train.py", cwd=project,
                env=env), f"train.py is not in --workdir {other}")
    assert no_jobs(ct_home)
    # with the workdir that has it, it runs
    proc = run("launch", "-q", "--workdir", ".", "--follow", "--", "python", "train.py",
               cwd=project, env=env)
    assert proc.returncode == 0, proc.stderr


# D30
def test_d30_the_dry_run_refuses_what_the_launch_refuses():
    proc = run("launch", "--recipe", "wide-resnet34", "--dry-run")
    refused(proc, "runs one process per GPU on 8 GPUs, but this host has 0 GPU(s)")


# D29
def test_d29_the_dry_run_makes_the_launchs_on_checks(ct_home):
    from cloudtrain.state import Instance, open_store

    with open_store(ct_home) as store:
        job = store.create_job(name="aws1", kind="recipe", recipe="resnet9", command="resnet9",
                               backend="aws", spec={"region": "us-east-1"})
        store.update_job(job.id, state="succeeded", ended_at=time.time())
        store.add_instance(Instance(id="i-0123456789abcdef0", job_id=job.id, provider="aws",
                                    region="us-east-1", zone="us-east-1a",
                                    instance_type="g5.xlarge", market="on-demand",
                                    state="terminated", launched_at=time.time() - 60,
                                    terminated_at=time.time(), price_per_hour=1.006,
                                    details=None))
    for extra in (["--dry-run"], []):
        refused(run("launch", "--on", "aws1", "--recipe", "resnet9", "--set", "variant=dawn",
                    *extra, env={"CLOUDTRAIN_HOME": str(ct_home)}), "its instance is gone")


# -- GPU recipes without a GPU, and the question before spending ------------------------------

SLOW = """\
name: slow
description: "A GPU recipe whose full run takes hours on a CPU."
entry: train.py
arguments:
  epochs: {type: int, default: 2, help: epochs}
profiles:
  smoke: {description: quick, set: {epochs: 1}}
resources: {gpus_per_node: 1, nodes: 1, max_runtime_minutes: 60, cpu_minutes: 142}
"""


@pytest.fixture
def slow_recipe(tmp_path):
    root = tmp_path / "recipes"
    (root / "slow").mkdir(parents=True)
    (root / "slow" / "recipe.yaml").write_text(SLOW)
    (root / "slow" / "train.py").write_text("print('trained')\n")
    return {"CLOUDTRAIN_RECIPES": str(root)}


def in_a_terminal(args, answer: str | None, env: dict) -> tuple[int, str]:
    """`cloudtrain ARGS` on a pseudo-terminal with no AWS configuration but `env`'s."""
    clean = {k: None for k in os.environ if k.startswith("AWS_")}
    return run_in_terminal(args, answer=answer, env={**clean, **NO_AWS, **env}, columns=120)


def test_d17_a_gpu_recipe_on_this_cpu_says_what_it_would_take(ct_home, slow_recipe):
    env = {"CLOUDTRAIN_HOME": str(ct_home), **slow_recipe}
    proc = run("launch", "--recipe", "slow", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    warning = rows(proc.stdout)["WARNING"]
    assert "no GPU here: slow would take about 2.4 h on this CPU" in warning
    assert "past its max runtime of 60 min" in warning
    assert "--profile smoke" in warning and "--gpus A10G:1" in warning
    code, shown = in_a_terminal(["launch", "--recipe", "slow"], "n", env)
    assert code == 1 and "Proceed? [y/N]" in shown and "not launched" in shown, shown
    assert no_jobs(ct_home)
    # the smoke profile is what it suggests: not asked about
    assert "WARNING" not in run("launch", "--recipe", "slow", "--profile", "smoke", "--dry-run",
                                env=env).stdout


def test_u15_without_a_terminal_the_warning_is_still_said_on_its_own_line(ct_home, slow_recipe):
    """U15: `launch --recipe slow </dev/null` (a script, CI): nobody is asked, and the launch goes
    on, but the 2.4 h CPU run predicted to fail is said on stderr first."""
    env = {"CLOUDTRAIN_HOME": str(ct_home), **slow_recipe}
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--recipe", "slow",
                           "--quiet"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env={**base, **NO_AWS, **env}, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if "no GPU here" in line]
    assert warning.startswith("WARNING: no GPU here: slow would take about 2.4 h on this CPU")
    assert "past its max runtime of 60 min" in warning and "Proceed" not in proc.stderr
    assert not no_jobs(ct_home)  # launched: nobody was there to say no


def test_u15_in_a_terminal_enter_means_no_to_a_run_predicted_to_fail(ct_home, slow_recipe):
    """U15: in a terminal, a run the plan predicts to fail (past its max runtime) is asked
    about with [y/N]: Enter means no."""
    env = {"CLOUDTRAIN_HOME": str(ct_home), **slow_recipe}
    code, shown = in_a_terminal(["launch", "--recipe", "slow"], "", env)
    lines = shown.splitlines()
    warning = next(i for i, line in enumerate(lines) if "no GPU here" in line)
    asked = next(i for i, line in enumerate(lines) if "Proceed?" in line)
    # the warning, wrapped at the terminal's width (U42), then the question on its own line
    assert lines[warning].startswith("WARNING: ") and asked > warning, shown
    assert all(line.startswith("  ") for line in lines[warning + 1:asked]), shown
    assert lines[asked].startswith("Proceed? [y/N]"), shown
    assert code == 1 and "not launched: nothing was created" in shown, shown
    assert no_jobs(ct_home)
    # within its max runtime (142 of 300 min): said, and Enter goes on
    code, shown = in_a_terminal(["launch", "--recipe", "slow", "--max-runtime", "300"], "n",
                                env)
    assert "no GPU here: slow would take about 2.4 h" in shown and "past its max" not in shown
    assert "Proceed? [Y/n]" in shown and code == 1, shown


def test_d26_a_paid_launch_asks_with_its_price_and_yes_skips(ct_home, moto):
    env = {"CLOUDTRAIN_HOME": str(ct_home), **moto}
    args = ["launch", "--recipe", "resnet9", "--profile", "smoke", "--instance", "g5.xlarge",
            "--spot"]
    code, shown = in_a_terminal(args, "n", env)
    assert code == 1, shown
    assert "This launches a spot g5.xlarge in us-east-1, billed per second: $0.4328/h" in shown
    # U9: the question quotes the dry run's "at most": all 4 attempts (3 restarts by default)
    at_most = rows(run(*args, "--dry-run", env=env).stdout)["at most"]
    assert ": 4 attempts (1 + 3 restarts) of up to 50 min each" in at_most  # smoke: 20 + 30
    # wrapped at the terminal's width (U42): the same words
    assert " ".join(f"at most {at_most}. Proceed? [Y/n]".split()) in " ".join(shown.split())
    assert "not launched: nothing was created" in shown
    assert no_jobs(ct_home)
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto["AWS_ENDPOINT_URL"],
                       **CLIENT_CREDS)
    assert ec2.describe_instances()["Reservations"] == []
    # --yes: not asked; the launch goes on (and stops here at a later step: this sandbox
    # cannot look up its own address for the security group)
    code, shown = in_a_terminal([*args, "--yes"], None, env)
    assert code != 0 and "Proceed?" not in shown, shown
    assert "Error: " in shown and "Traceback" not in shown


# -- the catalog -----------------------------------------------------------------------------


def test_d36_catalog_names_unknown_regions_and_gpus():
    refused(run("catalog", "--region", "xx-east-1"), "unknown AWS region 'xx-east-1'")
    refused(run("catalog", "--gpu", "V10"), "no instance type in the catalog has a GPU named "
                                            "'V10'", "did you mean V100?")
    proc = run("catalog", "--gpu", "v100")
    assert proc.returncode == 0 and "p3.2xlarge" in proc.stdout


def test_d36_estimate_names_unknown_gpus_types_and_regions_too():
    refused(run("estimate", "--recipe", "resnet9", "--gpus", "V10:1"), "--gpus V10",
            "did you mean V100?")
    refused(run("estimate", "--recipe", "resnet9", "--instance", "g5.xlarg"),
            "did you mean g5.xlarge?")
    refused(run("estimate", "--recipe", "resnet9", "--region", "xx-east-1"),
            "unknown AWS region 'xx-east-1'")


# D16
def test_d16_shell_code_and_scripts_the_job_makes_are_not_second_guessed(ct_home, tmp_path):
    """Only a script word of the command itself is looked for: shell code given to -c (which
    may make its script first) is the user's business."""
    env = {"CLOUDTRAIN_HOME": str(ct_home)}
    proc = run("launch", "-q", "--follow", "--", "bash", "-c",
               "echo 'echo made' > job.sh; bash job.sh", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr


# U24
def test_u24_a_file_here_that_is_not_a_command_is_refused_before_anything(ct_home, tmp_path):
    """U24: `launch notjob.txt`, an existing file that is neither a job file nor a command,
    ran as a command and failed with exit 127 (on AWS after the instance booted): refused
    before anything is created, with the ways to run it; with or without --, and from a job
    file's run:. A command on PATH, and ./script, still go."""
    (tmp_path / "notjob.txt").write_text("echo hi\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tmp_path / "run.sh").chmod(0o755)
    env = {"CLOUDTRAIN_HOME": str(ct_home)}
    for args in (["notjob.txt"], ["--", "notjob.txt"], ["--workdir", ".", "notjob.txt", "x"]):
        err = refused(run("launch", *args, cwd=tmp_path, env=env),
                      "notjob.txt is a file here, not a command")
        assert "Hint: cloudtrain launch -- bash notjob.txt" in err and ".yaml" in err, err
    err = refused(run("launch", "--workdir", ".", "--", "run.sh", cwd=tmp_path, env=env),
                  "run.sh is a file here, not a command")
    assert "cloudtrain launch -- ./run.sh" in err
    (tmp_path / "job.yaml").write_text("workdir: .\nrun: notjob.txt\n")
    refused(run("launch", "job.yaml", cwd=tmp_path, env=env),
            "job.yaml:2: run: notjob.txt is a file here, not a command")
    assert no_jobs(ct_home)
    proc = run("launch", "-q", "--follow", "--workdir", ".", "--", "./run.sh", cwd=tmp_path,
               env=env)
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr


def test_u58_a_smoke_profile_is_planned_with_its_own_disk_and_runtime():
    """U58: `launch --recipe imagenet --profile smoke --instance g5.xlarge --dry-run` kept
    the full recipe's 400 GB disk and 360-minute max runtime (`at most $7.00 ... 400 GB`)
    for a run of seconds; the plan and the estimate now use the profile's own."""
    proc = run("launch", "--recipe", "imagenet", "--profile", "smoke", "--instance",
               "g5.xlarge", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.strip().split(None, 1) for line in proc.stdout.splitlines()[1:]
                if line.startswith("  ") and len(line.split()) > 1)
    assert rows["disk"].startswith("100 GB gp3"), rows["disk"]
    assert "up to 50 min (the max runtime of 20 min + 30 until user-data powers it off)" in \
        rows["at"], rows["at"]
    full = run("launch", "--recipe", "imagenet", "--set", "variant=tiny", "--instance",
               "g5.xlarge", "--dry-run", "--set", "data=synthetic")
    assert "400 GB gp3" in full.stdout and "max runtime of 360 min" in full.stdout
