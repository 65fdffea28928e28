"""EC2 Auto Scaling as AWS runs it, in the namespace lab (tests/cloud_lab.py; root only).

moto 5.2 keeps Auto Scaling groups and launches their instances in its backend, and nothing
more: no instance boots, no user-data runs, a scheduled action never fires, and an instance
terminated through EC2's API is replaced at once in the same subnet while one taken back by
EC2 itself is never replaced. AutoScalingLab is a thread beside the lab's ThreadedMotoServer,
plus a few patches on moto's classes (installed with the test's monkeypatch, gone at its end),
that make a group do what AWS does for what cloudtrain relies on:

- **Every instance a group launches is a lab instance** (at creation, on a capacity change, as
  a replacement): a namespace host at its private IP (NetnsLab.add_host) whose processes
  share one mount namespace, held by a long-lived init process, with its own view of `/etc`,
  `/var`, `/opt`, `/usr`, `/run`, `/root`, `/home`, `/mnt`, `/srv` (an overlay each; upper
  dirs under the lab's folder) and its own home directory (`lab.homes[ip]`: the SSH sessions'
  HOME, which the instance also sees as /home/ubuntu, the DLAMI user's home); its own sshd
  (a fresh host key), whose fingerprints its console prints
  as cloud-init's keys-to-console does; the fake IMDS at 169.254.169.254 (a forwarder in the
  namespace) with its instance's metadata and its role's credentials when the launch template
  names an instance profile; `sudo` (as on the DLAMI: root may do anything); and, where its
  type has NVMe instance store (the bundled catalog) and its image is the Deep Learning AMI
  (not a Volta type's Ubuntu), a folder of the lab's (`inst.dir / "nvme"`) mounted at
  /opt/dlami/nvme as the DLAMI mounts the instance store there (`local_nvme = "missing"`:
  none, an image whose mount failed).
- **The launch template's user-data runs once at boot, as root, in the instance**, after its
  sshd is up, with a cloud-init-like environment plus `user_data_env` (AWS_ENDPOINT_URL: the
  lab's moto). Its output is the instance's console output, then the SSH host key
  fingerprint block once it has exited: in cloud-init's final stage, scripts-user runs before
  keys-to-console, so a user-data that never exits never shows the fingerprints.
- **Powering off ends the instance as EC2 does.** `shutdown`, `poweroff`, `halt`, `reboot` and
  `systemctl` in an instance (and the lab's own power-off recorder, cloud_lab.RECORDER, which
  the lab's config names as the agent's shutdown command) record the call; the thread then
  terminates the instance in moto (Client.InstanceInitiatedShutdown), or stops it when its
  launch template did not ask for shutdown behaviour terminate (the group then terminates the
  stopped instance and replaces it, as its health check does). `shutdown -h +N` is kept as
  systemd keeps it (the instance looks systemd-run: /run/systemd/system exists) and fires at
  its time; `shutdown -c` cancels it; `halt` does nothing, as on EC2.
- **Replacement.** A group with fewer live instances than its desired capacity launches the
  missing ones within a tick (0.1 s), whichever way an instance went (CloudLab.take_back, EC2's
  TerminateInstances, a power-off, a scale-in elsewhere): moto's own immediate replacement on
  TerminateInstances is turned off, so there is one behaviour. A launch goes to the group's AZ
  with the fewest live instances, and among equals to one that did not just lose an instance.
  The launch applies what moto's group launch leaves out: the template's instance profile,
  shutdown behaviour, metadata options, block devices (without moto's extra default volume)
  and volume tags, the MixedInstancesPolicy's spot share and the first of its overrides that
  has capacity (`no_capacity`: the types a test emptied), the group's placement group.
- **Updates keep what they do not name** (AWS: "Any properties that you don't specify are not
  changed"): a MixedInstancesPolicy of only an InstancesDistribution keeps the group's launch
  template and overrides (moto replaced the whole policy). **A new instances distribution is
  met by replacement**: a group with fewer on-demand instances than its distribution asks for
  launches one above its desired capacity, then terminates a spot one once the new one runs
  (AWS: "launches new instances before terminating the previous ones").
- **Scheduled actions** (one-time, StartTime) are applied at their time (min, max, desired;
  instances terminated when desired drops) and then removed, as AWS does; recurring ones are
  not run (an event says so). Actions are kept per group (moto keys them by name alone, so two
  groups' actions of one name overwrote each other), a StartTime in the past is refused, and a
  group's actions go with the group.
- **Deleting a group** without ForceDelete while it has instances fails with ResourceInUse, as
  on AWS (moto deleted it); with ForceDelete, or after desired 0, its instances are terminated
  and their namespaces' processes killed.
- **Everything the thread does is an event** (`events`): launch, launch-failed, boot,
  boot-failed, user-data-start, user-data-exit, power-off-request, power-off, lost, terminated,
  scheduled-action, group-deleted, policy-updated, rebalance-launch, rebalance-terminate, error.

Start it with `cloud_lab(..., autoscaling=True)`: `lab.asg`, an AutoScalingLab. For tests:

    lab.asg.wait_for_group(name, n)    n live instances that ran their user-data (LabInstance)
    lab.asg.live(name)                 the group's booted instances that run now
    inst.ip, .zone, .host, .sshd, .replaces, .user_data_exit, .power_off_at
    inst.path("/var/lib/x")            a path as the instance sees it; inst.enter(): a
                                       command prefix that runs in it (nsenter)
    lab.asg.console(id)                its console output (GetConsoleOutput's text)
    lab.asg.log("launch", ...)         the events, each {"t", "event", ...}; errors(): the
                                       lab's own failures (a test ends with none)
    lab.asg.leftovers()                instances, volumes, spot requests, groups, launch
                                       templates, lab hosts still up
    lab.asg.kill_launching_machine()   the laptop closes (kill_launching_machine below)
    lab.asg.advance(s)                 AWS's clock s ahead, for scheduled actions
    lab.asg.user_data_env              more of each user-data's environment
    lab.asg.placement = PlacementGroups(...).install(mp)   groups' PlacementGroup honoured
    lab.take_back(instance), lab.imds.announce(ip)         EC2 takes a spot instance back

Addresses: moto hands out each
subnet's addresses in order (10.200.0.4, .5, ... in us-east-1a; .132, ... in us-east-1b) and
reuses a terminated instance's; an instance whose address is one of the lab's pre-declared
hosts (CloudLab's `hosts`) cannot boot (a boot-failed event), so give a lab with groups no
pre-declared hosts in the range its groups use.

Instances share this machine's kernel, processes and /tmp (and what is not overlaid) with the
test: what a user-data writes in an overlaid directory stays inside its instance.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import gzip
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

from labs.cloud import terminate_with_reason
from labs.polling import wait_for
from labs.netns import LAB_HOSTS, LAB_RESOLV
from labs.sshd import SSHD

TICK_S = 0.1
# An AZ that lost an instance this recently is the last choice for its replacement.
LOST_ZONE_MEMORY_S = 300.0
LAUNCH_RETRY_S = 1.0  # a group whose launch failed tries again after this
USER_DATA_LIMIT = 16384  # EC2: "User data is limited to 16 KB, in raw form"
CONSOLE_LIMIT = 65536  # GetConsoleOutput: the last 64 KB
OVERLAID = ("/etc", "/var", "/opt", "/usr", "/run", "/root", "/home", "/mnt", "/srv")
USER_HOME = "/home/ubuntu"  # the DLAMI's default user's home: the instance's home dir
NVME_MOUNT = "/opt/dlami/nvme"  # where the DLAMI mounts the instance store (its release notes)
ROOT_HOME = "/root"  # root's: user-data's HOME
IMDS_ADDRESS = "169.254.169.254"
SHUTDOWN_REASON = ("Client.InstanceInitiatedShutdown",
                   "Client.InstanceInitiatedShutdown: Instance initiated shutdown")
# a stopped instance, terminated by its group's health check (a TerminateInstances of AWS's)
# What EC2 says of an instance that its group terminated to meet a new instances distribution
REBALANCE_REASON = ("Client.UserInitiatedShutdown",
                    "Client.UserInitiatedShutdown: User initiated shutdown")
HEALTH_REASON = ("Client.UserInitiatedShutdown",
                 "Client.UserInitiatedShutdown: User initiated shutdown")
CLOUD_INIT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IN_SERVICE_GONE = ("terminated", "shutting-down", "stopped", "stopping")

# The instance's shutdown, poweroff, halt, reboot and systemctl: one line per call, for the
# lab's thread (which plays EC2's part): time, $CLOUDTRAIN_JOB_DIR, the command's name and
# arguments, shell-quoted. It returns at once, as systemd's do.
POWER_RECORDER = """#!/bin/bash
name=${{LAB_POWER_OFF_AS:-$(basename "$0")}}
line=$(printf '%q ' "$(date +%s.%N)" "${{CLOUDTRAIN_JOB_DIR:-}}" "$name" "$@")
echo "$line" >> {requests}
exit 0
"""
# The lab's own power-off recorder (cloud_lab.RECORDER, the agent's shutdown command in the
# lab's config) stands for `sudo shutdown -h now`: inside an Auto Scaling instance it is that.
POWER_OFF_NOW = """#!/bin/bash
LAB_POWER_OFF_AS=poweroff exec {recorder} "$@"
"""
# As on the DLAMI, where the default user may run anything with sudo: here everything runs
# as root already.
SUDO = """#!/bin/bash
while [ $# -gt 0 ]; do
    case $1 in
        -n|-E|-H|-S|--non-interactive|--preserve-env) shift ;;
        -u) shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
exec "$@"
"""
# 169.254.169.254:80 in the instance's namespace, forwarded to the fake IMDS on the bridge
# (from the instance's own address, so the IMDS knows who asks).
IMDS_FORWARDER = """
import asyncio, sys
up_host, up_port = sys.argv[1], int(sys.argv[2])

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()

async def handle(reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_connection(up_host, up_port)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

async def main():
    server = await asyncio.start_server(handle, sys.argv[3], 80)
    print("ready", flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


class LaunchError(Exception):
    """What AWS's launch activity would fail with (the group tries again)."""


@dataclasses.dataclass(eq=False)
class LabInstance:
    """One instance a group launched, and the lab's parts of it."""

    id: str
    group: str
    ip: str
    zone: str
    launched_at: float  # time.time() of its launch in moto
    dir: Path  # the lab's files for it: its overlays' upper dirs, sshd, console
    moto: object  # moto's Instance
    user_data: bytes | None
    replaces: str | None = None  # the lost instance whose place it takes, if any
    host: object | None = None  # its NetnsHost, once booted
    sshd: SSHD | None = None
    init: subprocess.Popen | None = None  # holds its mount namespace
    process: subprocess.Popen | None = None  # its user-data, while it runs
    booted_at: float | None = None
    failed: str | None = None  # why it could not boot
    user_data_started_at: float | None = None
    user_data_ended_at: float | None = None
    user_data_exit: int | None = None
    keys_printed: bool = False  # the fingerprint block is on its console
    power_off_at: float | None = None  # a `shutdown -h +N` pending (time.time())
    terminated_at: float | None = None  # when the lab tore it down
    console_final: str | None = None  # its console once terminated
    _requests_read: int = 0

    @property
    def state(self) -> str:
        return self.moto.state

    @property
    def ran_user_data(self) -> bool:
        """Its user-data has ended (or it had none)."""
        return self.user_data_ended_at is not None

    def path(self, inside: str) -> Path:
        """A path as this instance sees it (readable from here while it runs)."""
        return Path(f"/proc/{self.init.pid}/root") / inside.lstrip("/")

    def enter(self) -> list[str]:
        """A command prefix that runs inside this instance (its network, mounts, hostname)."""
        return ["nsenter", "-t", str(self.init.pid), "-m", "-n", "-u", "--"]


class InstanceSSHD(SSHD):
    """An instance's sshd, run inside its mount namespace (so sessions see what its user-data
    installed), not in a fresh one as `ip netns exec` would make."""

    def __init__(self, *args, instance: LabInstance, **kw):
        self.instance = instance
        super().__init__(*args, **kw)

    def argv(self) -> list[str]:
        return [*self.instance.enter(), *super().argv()]


class AutoScalingLab:
    def __init__(self, cloud, monkeypatch, placement=None):
        """`cloud`: the CloudLab; `placement`: tests/moto_placement.PlacementGroups, if the
        test installed it (a group's PlacementGroup then holds its instances)."""
        self.cloud = cloud
        self.placement = placement
        self.dir = cloud.tmp / "asg"
        self.dir.mkdir(exist_ok=True)
        self.lock = threading.RLock()  # held by the thread and moto's Auto Scaling calls
        self.events: list[dict] = []
        self.instances: dict[str, LabInstance] = {}  # every instance a group launched
        self.lost_zones: dict[str, dict[str, float]] = {}  # group -> AZ -> when it lost one
        self._retry_at: dict[str, float] = {}
        self._unreplaced: dict[str, list[str]] = {}  # group -> lost instances, oldest first
        self._unsupported: set = set()
        # How far AWS's clock is ahead of this machine's for scheduled actions (advance()):
        # a test of a deadline an hour away cannot wait that hour.
        self.clock_ahead_s = 0.0
        # more of a user-data's environment (cloud-init gives it only PATH): how an instance
        # reaches the lab's AWS, as CLOUDTRAIN_UD_* reach user-data.sh's test paths
        self.user_data_env: dict[str, str] = {"AWS_ENDPOINT_URL": cloud.endpoint}
        # True: the fingerprint block comes before the user-data's output (not cloud-init's
        # order; for a test that wants the keys while a user-data still runs)
        self.keys_first = False
        # "mounted": an instance of a type with NVMe instance store, on the DLAMI, has a folder
        # of its own mounted at /opt/dlami/nvme, as the DLAMI mounts the store there (RG5);
        # "missing": none is (the mount failed, or an image that makes none)
        self.local_nvme = "mounted"
        # instance types with no capacity now: a group launches the first of its overrides
        # not named here, and fails its launch (and tries again) where all are
        self.no_capacity: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="asg-lab", daemon=True)
        self._install(monkeypatch)

    # --- what a test uses -----------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """AWS's clock moves on by `seconds` for scheduled actions (they fire when their time
        has come on it); instances, timers and everything else keep this machine's time."""
        with self.lock:
            self.clock_ahead_s += seconds

    def start(self) -> "AutoScalingLab":
        self._thread.start()
        return self

    def event(self, kind: str, /, **fields) -> dict:
        entry = {"t": time.time(), "event": kind, **fields}
        self.events.append(entry)
        return entry

    def log(self, *kinds: str) -> list[dict]:
        """The events of these kinds (all, without any), in order."""
        return [e for e in list(self.events) if not kinds or e["event"] in kinds]

    def errors(self) -> list[dict]:
        """What went wrong in the lab itself (a test ends with none)."""
        return self.log("error", "boot-failed")

    def live(self, group: str | None = None) -> list[LabInstance]:
        """The group's (every group's) instances that run now, booted."""
        return [i for i in list(self.instances.values())
                if (group is None or i.group == group) and i.host is not None
                and i.terminated_at is None and i.state == "running"]

    def wait_for_group(self, group: str, count: int, timeout: float = 30.0,
                       user_data: str = "exited") -> list[LabInstance]:
        """Once `group` has exactly `count` live instances that ran their user-data
        (`user_data` "exited": it has ended; "started": it runs), those instances."""
        def ready():
            live = self.live(group)
            done = [i for i in live if (i.ran_user_data if user_data == "exited"
                                        else i.user_data_started_at is not None)]
            return done if len(live) == len(done) == count else None

        if count == 0:  # and the lab is done with the last one (processes, namespace)
            wait_for(lambda: not any(i.group == group and i.host is not None
                                     and i.terminated_at is None
                                     for i in list(self.instances.values())),
                     timeout=timeout, interval=0.05, what=f"group {group} to have no instance")
            return []
        return wait_for(ready, timeout=timeout, interval=0.05,
                        what=f"group {group} to have {count} instances that ran user-data")

    def instance(self, instance_id: str) -> LabInstance:
        return self.instances[instance_id]

    def console(self, instance_id: str) -> str:
        """Its console output, as GetConsoleOutput returns it (decoded)."""
        inst = self.instances[instance_id]
        return inst.console_final if inst.console_final is not None else self._console(inst)

    def leftovers(self) -> dict:
        """What is left in moto: CloudLab.leftovers() plus Auto Scaling groups, launch
        templates and lab hosts still up."""
        import boto3
        from botocore.config import Config

        left = self.cloud.leftovers()
        asg = boto3.client("autoscaling", endpoint_url=self.cloud.endpoint,
                           region_name=self.cloud.aws.ec2.meta.region_name,
                           aws_access_key_id="testing", aws_secret_access_key="testing",
                           config=Config(retries={"max_attempts": 1}))
        left["groups"] = [g["AutoScalingGroupName"] for g in
                          asg.describe_auto_scaling_groups()["AutoScalingGroups"]]
        left["launch_templates"] = [t["LaunchTemplateName"] for t in self.cloud.aws.ec2
                                    .describe_launch_templates()["LaunchTemplates"]]
        left["hosts"] = [i.id for i in list(self.instances.values())
                         if i.host is not None and i.terminated_at is None]
        return left

    def kill_launching_machine(self) -> list[int]:
        """The laptop closes: kill_launching_machine() for this lab's CLOUDTRAIN_HOME and
        tmux socket."""
        return kill_launching_machine(self.cloud.home, os.environ["CLOUDTRAIN_TMUX_SOCKET"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for inst in list(self.instances.values()):
            if inst.host is not None and inst.terminated_at is None:
                self._teardown(inst, "the lab closed")

    # --- moto -----------------------------------------------------------------------------
    def _install(self, mp) -> None:
        from moto.autoscaling.exceptions import AutoscalingClientError, ValidationError
        from moto.autoscaling.models import AutoScalingBackend, FakeAutoScalingGroup
        from moto.autoscaling.responses import AutoScalingResponse
        from moto.core.responses import ActionResult
        from moto.core.types import Base64EncodedString
        from moto.core.utils import utcnow
        from moto.ec2.responses.general import General

        lab = self

        def locked(method):
            def run(*args, **kw):
                with lab.lock:
                    return method(*args, **kw)
            return run

        for name in ("create_auto_scaling_group", "update_auto_scaling_group",
                     "delete_auto_scaling_group", "set_desired_capacity", "attach_instances",
                     "detach_instances", "terminate_instance", "enter_standby_instances",
                     "exit_standby_instances", "execute_policy", "batch_put_scheduled_update_group_action",
                     "batch_delete_scheduled_action"):
            mp.setattr(AutoScalingBackend, name, locked(getattr(AutoScalingBackend, name)))

        update_group = AutoScalingBackend.update_auto_scaling_group

        def update_auto_scaling_group(backend, name, *args, mixed_instances_policy=None, **kw):
            # AWS: "Any properties that you don't specify are not changed by this update
            # request"; moto replaced the whole policy with the part the request named.
            with lab.lock:
                group = backend.autoscaling_groups.get(name)
                if mixed_instances_policy and group is not None \
                        and group.mixed_instances_policy:
                    kept = dict(group.mixed_instances_policy)
                    for part, value in mixed_instances_policy.items():
                        if isinstance(value, dict) and isinstance(kept.get(part), dict):
                            kept[part] = {**kept[part], **value}
                        else:
                            kept[part] = value
                    if "LaunchTemplate" not in mixed_instances_policy:
                        # moto keeps the template's id beside the name it was given, and
                        # refuses a policy that names both: the kept one, as it was made
                        template = dict(kept["LaunchTemplate"])
                        spec = dict(template["LaunchTemplateSpecification"])
                        if spec.get("LaunchTemplateName"):
                            spec.pop("LaunchTemplateId", None)
                        kept["LaunchTemplate"] = dict(template, LaunchTemplateSpecification=spec)
                    mixed_instances_policy = kept
                result = update_group(backend, name, *args,
                                      mixed_instances_policy=mixed_instances_policy, **kw)
                if mixed_instances_policy and group is not None:
                    lab.event("policy-updated", group=name,
                              distribution=mixed_instances_policy.get("InstancesDistribution"))
            return result

        mp.setattr(AutoScalingBackend, "update_auto_scaling_group", update_auto_scaling_group)

        def replace(group, count_needed, propagated_tags):
            # moto's only way to launch a group's instances (at creation, on a capacity
            # change): the lab's launch instead
            lab._launch(group, count_needed)

        mp.setattr(FakeAutoScalingGroup, "replace_autoscaling_group_instances", replace)

        def notify_terminate_instances(backend, instance_ids):
            # EC2's TerminateInstances on a group's instance: moto replaced it at once, in
            # the group's first subnet; the lab's thread replaces it as any other loss
            with lab.lock:
                lab._reap(backend, time.time())

        mp.setattr(AutoScalingBackend, "notify_terminate_instances", notify_terminate_instances)

        delete_group = AutoScalingResponse.delete_auto_scaling_group

        def delete_auto_scaling_group(response):
            name = response._get_param("AutoScalingGroupName")
            force = response._get_bool_param("ForceDelete", False)
            backend = response.autoscaling_backend
            with lab.lock:
                group = backend.autoscaling_groups.get(name)
                if group is not None and not force and any(
                        s.instance.state not in ("terminated",) for s in group.instance_states):
                    raise AutoscalingClientError(
                        "ResourceInUse", "You cannot delete an AutoScalingGroup while there "
                        "are instances or pending Spot instance request(s) still in the group.")
                result = delete_group(response)
                for key in [k for k, a in backend.scheduled_actions.items()
                            if a.auto_scaling_group_name == name]:
                    del backend.scheduled_actions[key]  # they go with their group on AWS
                lab._unreplaced.pop(name, None)
                lab.event("group-deleted", group=name, force=force)
            return result

        mp.setattr(AutoScalingResponse, "delete_auto_scaling_group", delete_auto_scaling_group)

        put_action = AutoScalingBackend.put_scheduled_update_group_action

        def put_scheduled_update_group_action(backend, name, desired_capacity, max_size,
                                              min_size, scheduled_action_name, start_time,
                                              end_time, recurrence, timezone):
            when = _parse_time(start_time)
            if when is not None and when < time.time() - 1:
                raise ValidationError("Given start time is in the past")
            with lab.lock:
                kept = backend.scheduled_actions.pop(scheduled_action_name, None)
                action = put_action(backend, name, desired_capacity, max_size, min_size,
                                    scheduled_action_name, start_time, end_time, recurrence,
                                    timezone)
                # per group, as AWS keeps them (moto by name: one group's overwrote another's)
                backend.scheduled_actions.pop(scheduled_action_name)
                if kept is not None:
                    backend.scheduled_actions[scheduled_action_name] = kept
                backend.scheduled_actions[(name, scheduled_action_name)] = action
            return action

        def delete_scheduled_action(backend, auto_scaling_group_name, scheduled_action_name):
            with lab.lock:
                if backend.scheduled_actions.pop(
                        (auto_scaling_group_name, scheduled_action_name), None) is None:
                    raise ValidationError("Scheduled action name not found")

        mp.setattr(AutoScalingBackend, "put_scheduled_update_group_action",
                   put_scheduled_update_group_action)
        mp.setattr(AutoScalingBackend, "delete_scheduled_action", delete_scheduled_action)

        console = General.get_console_output

        def get_console_output(response):
            instance_id = response._get_param("InstanceId")
            if instance_id not in lab.instances:
                return console(response)
            response.ec2_backend.get_instance(instance_id)
            text = lab.console(instance_id)
            result = {"InstanceId": instance_id, "Timestamp": utcnow()}
            if text:  # EC2 leaves Output out while there is none
                result["Output"] = Base64EncodedString.from_raw_string(text)
            return ActionResult(result)

        mp.setattr(General, "get_console_output", get_console_output)

    @staticmethod
    def _backends():
        from moto.autoscaling.models import autoscaling_backends
        from moto.core import DEFAULT_ACCOUNT_ID

        from labs.credentials import REGION

        return autoscaling_backends[DEFAULT_ACCOUNT_ID][REGION]

    # --- launching ------------------------------------------------------------------------
    def _launch(self, group, count: int, replaces: list[str] | None = None) -> None:
        """Launch `count` instances for `group`; each takes the place of the first of
        `replaces` (lost instances) left, which it removes."""
        for _ in range(count):
            try:
                inst = self._launch_one(group, replaces[0] if replaces else None)
                if replaces:
                    replaces.pop(0)
            except Exception as exc:  # noqa: BLE001 - AWS: a failed launch activity
                self._retry_at[group.name] = time.time() + LAUNCH_RETRY_S
                self.event("launch-failed", group=group.name, error=str(exc))
                return
            self.event("launch", group=group.name, instance=inst.id, zone=inst.zone,
                       ip=inst.ip, replaces=inst.replaces, spot=inst.moto.lifecycle == "spot",
                       instance_type=inst.moto.instance_type)

    def _launch_one(self, group, replaces: str | None) -> LabInstance:
        from moto.autoscaling.models import ASG_NAME_TAG
        from moto.autoscaling.models import InstanceState as GroupMember
        from moto.ec2.utils import convert_tag_spec, filter_iam_instance_profiles

        ec2 = group.ec2_backend
        version = group.ec2_launch_template.get_version(group.launch_template_version) \
            if group.ec2_launch_template else None
        data = version.data if version else {}
        user_data = _user_data_bytes(group.user_data)
        raw = base64.b64decode(str(group.user_data)) if group.user_data else b""
        if len(raw) > USER_DATA_LIMIT:  # in raw form: gzipped, as sent, not as it unpacks
            raise LaunchError(f"User data is limited to {USER_DATA_LIMIT} bytes "
                              f"(this one is {len(raw)})")
        profile = data.get("IamInstanceProfile") or {}
        found = None
        if profile:
            try:
                found = filter_iam_instance_profiles(
                    ec2.account_id, partition=ec2.partition,
                    iam_instance_profile_arn=profile.get("Arn"),
                    iam_instance_profile_name=profile.get("Name"))
            except Exception:  # noqa: BLE001 - moto's IAM: not found
                found = None
            if found is None:
                raise LaunchError(f"Invalid IamInstanceProfile: {profile}")
        if group.placement_group and self.placement is not None and \
                group.placement_group not in self.placement.live():
            raise LaunchError(f"The Placement Group '{group.placement_group}' is unknown.")
        zone, subnet = self._pick_zone(group)
        policy = group.mixed_instances_policy or {}
        overrides = (policy.get("LaunchTemplate") or {}).get("Overrides") or []
        types = [o["InstanceType"] for o in overrides if o.get("InstanceType")] or \
            [group.instance_type or "m1.small"]
        # AWS takes the pools it finds capacity in (price-capacity-optimized): here the first
        # override a test has not emptied (no_capacity)
        instance_type = next((t for t in types if t not in self.no_capacity), None)
        if instance_type is None:
            raise LaunchError(f"InsufficientInstanceCapacity: no capacity for {', '.join(types)}")
        tags = {**group.get_propagated_tags(), ASG_NAME_TAG: group.name, **group.instance_tags}
        kwargs = dict(
            instance_type=instance_type, placement=zone, subnet_id=subnet,
            tags={"instance": tags, "volume": convert_tag_spec(
                data.get("TagSpecifications", [])).get("volume", {})},
            launch_config=group.launch_config, is_instance_type_default=False,
            launch_template={"LaunchTemplateId": group.ec2_launch_template.id,
                             "Version": str(version.number)} if version else None,
            associate_public_ip=group.launch_config.associate_public_ip_address
            if group.launch_config else None,
            instance_initiated_shutdown_behavior=data.get("InstanceInitiatedShutdownBehavior"),
            metadata_options=data.get("MetadataOptions") or {}, key_name=data.get("KeyName"))
        if data.get("BlockDeviceMappings"):  # (moto added its own 8 GiB root volume too)
            kwargs["block_device_mappings"] = _block_devices(data["BlockDeviceMappings"])
        if self._wants_spot(group, data):
            kwargs["instance_market_options"] = {"MarketType": "spot"}
        reservation = ec2.run_instances(group.image_id, 1, group.user_data,
                                        group.security_groups, **kwargs)
        instance = reservation.instances[0]
        if found is not None:
            ec2.associate_iam_instance_profile(
                instance_id=instance.id, iam_instance_profile_name=profile.get("Name"),
                iam_instance_profile_arn=profile.get("Arn"))
        if group.placement_group:
            instance.placement.group_name = group.placement_group
            if self.placement is not None:
                with self.placement.lock:
                    self.placement.members[group.placement_group].append(instance.id)
        instance.autoscaling_group = group
        group.instance_states.append(GroupMember(
            instance, protected_from_scale_in=group.new_instances_protected_from_scale_in))
        inst = LabInstance(id=instance.id, group=group.name, ip=instance.private_ip_address,
                           zone=instance.placement.zone, launched_at=time.time(),
                           dir=self.dir / instance.id, moto=instance, user_data=user_data,
                           replaces=replaces)
        self.instances[inst.id] = inst
        return inst

    def _pick_zone(self, group) -> tuple[str, str | None]:
        """AWS balances a group across its AZs: the AZ with the fewest live instances; among
        equals, one that did not just lose an instance, then the group's order."""
        if group.vpc_zone_identifier:
            subnets = [s.strip() for s in group.vpc_zone_identifier.split(",") if s.strip()]
            options = [(group.ec2_backend.get_subnet(s).availability_zone, s) for s in subnets]
        else:
            options = [(z, None) for z in group.availability_zones]
        live = Counter(s.instance.placement.zone for s in group.instance_states
                       if s.instance.state not in IN_SERVICE_GONE)
        lost = self.lost_zones.get(group.name, {})
        recent = {z for z, at in lost.items() if time.time() - at < LOST_ZONE_MEMORY_S}
        return min(options, key=lambda o: (live[o[0]], o[0] in recent, options.index(o)))

    @staticmethod
    def _wants_spot(group, data: dict) -> bool:
        """Spot for the template's market options, or for a MixedInstancesPolicy's share above
        its on-demand base (OnDemandPercentageAboveBaseCapacity; AWS's default is 100: all
        on-demand)."""
        if (data.get("InstanceMarketOptions") or {}).get("MarketType") == "spot":
            return True
        policy = group.mixed_instances_policy
        if not policy:
            return False
        dist = policy.get("InstancesDistribution") or {}
        base = int(dist.get("OnDemandBaseCapacity") or 0)
        share = int(dist.get("OnDemandPercentageAboveBaseCapacity", 100))
        live = [s.instance for s in group.instance_states
                if s.instance.state not in IN_SERVICE_GONE]
        on_demand = sum(1 for i in live if i.lifecycle != "spot")
        spot = len(live) - on_demand
        if on_demand < base:
            return False
        above = on_demand - base
        return above * 100 >= (above + spot + 1) * share

    # --- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - the thread goes on; the test sees it
                self.event("error", error=traceback.format_exc())

    def _tick(self) -> None:
        now = time.time()
        backend = self._backends()
        with self.lock:
            self._power_offs(now)
            self._scheduled_actions(backend, now + self.clock_ahead_s)
            self._reap(backend, now)
            self._replace(backend, now)
            self._rebalance(backend, now)
            gone = [i for i in self.instances.values() if i.host is not None
                    and i.terminated_at is None and i.state in IN_SERVICE_GONE]
            new = [i for i in self.instances.values() if i.host is None
                   and i.failed is None and i.state == "running"]
        for inst in gone:
            self._teardown(inst, inst.moto.state_reason.code or inst.state)
        for inst in list(self.instances.values()):
            if inst.host is None and inst.terminated_at is None and inst.state in IN_SERVICE_GONE:
                inst.terminated_at = time.time()  # before it booted
                self.event("terminated", instance=inst.id, group=inst.group, zone=inst.zone,
                           reason=inst.moto.state_reason.code or inst.state, booted=False)
        for inst in new:
            self._boot(inst)
        for inst in list(self.instances.values()):
            if inst.process is not None and inst.user_data_exit is None \
                    and inst.terminated_at is None and (code := inst.process.poll()) is not None:
                inst.user_data_exit, inst.user_data_ended_at = code, time.time()
                self.event("user-data-exit", instance=inst.id, code=code,
                           seconds=round(inst.user_data_ended_at - inst.user_data_started_at, 3))

    def _reap(self, backend, now: float) -> None:
        """A group's instances that are no longer in service leave it (a stopped one is
        terminated, as the group's health check does); the AZ each was in is remembered."""
        for group in list(backend.autoscaling_groups.values()):
            kept = []
            for member in group.instance_states:
                instance = member.instance
                if instance.state not in IN_SERVICE_GONE:
                    kept.append(member)
                    continue
                if instance.state in ("stopped", "stopping"):
                    terminate_with_reason(instance.id, HEALTH_REASON)
                self.lost_zones.setdefault(group.name, {})[instance.placement.zone] = now
                self._unreplaced.setdefault(group.name, []).append(instance.id)
                self.event("lost", group=group.name, instance=instance.id,
                           zone=instance.placement.zone, reason=instance.state_reason.code)
            if len(kept) != len(group.instance_states):
                group.instance_states = kept

    def _replace(self, backend, now: float) -> None:
        for group in list(backend.autoscaling_groups.values()):
            missing = (group.desired_capacity or 0) - len(group.active_instances())
            if missing <= 0 or now < self._retry_at.get(group.name, 0):
                continue
            self._launch(group, missing, replaces=self._unreplaced.get(group.name))

    def _rebalance(self, backend, now: float) -> None:
        """A group with fewer on-demand instances than its instances distribution asks for
        (an update of OnDemandBaseCapacity or OnDemandPercentageAboveBaseCapacity) replaces
        a spot one, as AWS does: "an update to this setting means a gradual replacement of
        instances ... Amazon EC2 Auto Scaling launches new instances before terminating the
        previous ones": one on-demand instance launched above the desired capacity, the
        spot one terminated once the new one runs. (The other way, spot wanted where
        on-demand runs, is not needed by cloudtrain and not played.)"""
        for group in list(backend.autoscaling_groups.values()):
            dist = (group.mixed_instances_policy or {}).get("InstancesDistribution") or {}
            desired = group.desired_capacity or 0
            if not dist or not desired or now < self._retry_at.get(group.name, 0):
                continue
            base = min(desired, int(dist.get("OnDemandBaseCapacity") or 0))
            share = int(dist.get("OnDemandPercentageAboveBaseCapacity", 100))
            wanted = base + math.ceil((desired - base) * share / 100)
            live = [m.instance for m in group.instance_states
                    if m.instance.state not in IN_SERVICE_GONE]
            spot = [i for i in live if i.lifecycle == "spot"]
            on_demand = len(live) - len(spot)
            if not spot:
                continue
            if len(live) > desired:  # launched first: the spot one goes once the new one runs
                newest = max((self.instances[i.id] for i in live if i.id in self.instances
                              and i.lifecycle != "spot"), key=lambda i: i.launched_at,
                             default=None)
                if newest is not None and newest.host is not None:
                    terminate_with_reason(spot[0].id, REBALANCE_REASON)
                    self.event("rebalance-terminate", group=group.name, instance=spot[0].id)
            elif on_demand < wanted:
                self._launch(group, 1)
                self.event("rebalance-launch", group=group.name, replacing=spot[0].id)

    def _scheduled_actions(self, backend, now: float) -> None:
        for key, action in list(backend.scheduled_actions.items()):
            if action.recurrence:
                if key not in self._unsupported:
                    self._unsupported.add(key)
                    self.event("error", error=f"scheduled action {action.scheduled_action_name}"
                               f": a recurrence ({action.recurrence}) is not run by the lab")
                continue
            when = _parse_time(action.start_time)
            if when is None or when > now:
                continue
            del backend.scheduled_actions[key]  # a one-time action is gone once it ran
            group = backend.autoscaling_groups.get(action.auto_scaling_group_name)
            if group is None:
                continue
            if action.min_size is not None:
                group.min_size = action.min_size
            if action.max_size is not None:
                group.max_size = action.max_size
            desired = action.desired_capacity
            if desired is None:  # the capacity stays, within the new bounds
                desired = max(group.min_size or 0, min(group.desired_capacity or 0,
                                                       group.max_size or 0))
            group.set_desired_capacity(desired)
            self.event("scheduled-action", group=group.name, name=action.scheduled_action_name,
                       min=group.min_size, max=group.max_size, desired=desired,
                       late_s=round(now - when, 3))

    def _power_offs(self, now: float) -> None:
        for inst in self.instances.values():
            if inst.host is None or inst.terminated_at is not None \
                    or inst.state in IN_SERVICE_GONE:
                continue
            for at, jobdir, argv in self._requests(inst):
                kind, minutes = _power_request(argv)
                self.event("power-off-request", instance=inst.id, command=argv, kind=kind,
                           jobdir=jobdir or None)
                if kind == "now":
                    inst.power_off_at = now
                elif kind == "schedule":
                    inst.power_off_at = now + minutes * 60
                elif kind == "cancel":
                    inst.power_off_at = None
            if inst.power_off_at is not None and now >= inst.power_off_at:
                stop = inst.moto.instance_initiated_shutdown_behavior != "terminate"
                terminate_with_reason(inst.id, SHUTDOWN_REASON, stop=stop)
                self.event("power-off", instance=inst.id, group=inst.group,
                           then="stopped" if stop else "terminated")

    def _requests(self, inst: LabInstance) -> list[tuple[str, str, list[str]]]:
        path = inst.dir / "power-requests"
        try:
            with open(path, "rb") as f:
                f.seek(inst._requests_read)
                data = f.read()
        except FileNotFoundError:
            return []
        whole = data[:data.rfind(b"\n") + 1]
        inst._requests_read += len(whole)
        out = []
        for line in whole.decode("utf-8", "replace").splitlines():
            try:
                at, jobdir, *argv = shlex.split(line)
            except ValueError:
                continue
            out.append((at, jobdir, argv))
        return out

    # --- an instance's life ---------------------------------------------------------------
    def _boot(self, inst: LabInstance) -> None:
        cloud, ip = self.cloud, inst.ip
        if ip in cloud.net.hosts:
            if any(i.ip == ip and i.host is not None and i.terminated_at is None
                   for i in list(self.instances.values())):
                return  # the address's last instance is still going: next tick
            inst.failed = f"{ip} is one of the lab's pre-declared hosts"
            self.event("boot-failed", instance=inst.id, error=inst.failed)
            return
        try:
            self._boot_host(inst)
        except Exception as exc:  # noqa: BLE001 - the instance stays up in moto, without a host
            inst.failed = f"{type(exc).__name__}: {exc}"
            self.event("boot-failed", instance=inst.id, error=inst.failed,
                       trace=traceback.format_exc())

    def _boot_host(self, inst: LabInstance) -> None:
        cloud, ip = self.cloud, inst.ip
        inst.dir.mkdir(parents=True, exist_ok=True)
        home = cloud.tmp / f"home-{ip}"
        shutil.rmtree(home, ignore_errors=True)  # a fresh disk
        home.mkdir()
        host = cloud.net.add_host(ip)
        inst.host = host
        cloud.hosts[ip], cloud.homes[ip] = host, home
        boot = self._root(inst, home)
        inst.init = host.popen(["unshare", "--uts", "bash", str(boot)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        said = inst.init.stdout.readline().strip()
        if said != "ready":
            raise RuntimeError(f"its init said {said!r}: {inst.init.stdout.read()[-500:]}")
        inst.init.stdout.close()
        subprocess.run(["ip", "-n", host.name, "addr", "add", f"{IMDS_ADDRESS}/32", "dev", "lo"],
                       check=True, capture_output=True)
        imds_host, imds_port = cloud.imds.url.split("//")[1].split(":")
        forwarder = subprocess.Popen(
            [*inst.enter(), sys.executable, "-c", IMDS_FORWARDER, imds_host, imds_port,
             IMDS_ADDRESS], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL, text=True)
        host.procs.append(forwarder)
        self._metadata(inst)
        server = InstanceSSHD(inst.dir / "sshd", host=ip, port=22, client_key=cloud.aws.key,
                              instance=inst)
        inst.sshd = server
        host.sshds.append(server)
        cloud.sshds[ip] = server
        cloud.start(ip)  # its SetEnv (HOME, TMUX_TMPDIR, host_env), then sshd
        if forwarder.stdout.readline().strip() != "ready":
            raise RuntimeError("the IMDS forwarder did not start")
        forwarder.stdout.close()
        inst.booted_at = time.time()
        self.event("boot", instance=inst.id, group=inst.group, ip=ip, zone=inst.zone,
                   seconds=round(inst.booted_at - inst.launched_at, 3))
        self._run_user_data(inst)

    def _root(self, inst: LabInstance, home: Path) -> Path:
        """Its own view of the system's paths (seeded upper dirs) and the script its init
        runs: mount them, name the host, say ready, hold the namespace."""
        up = inst.dir / "root"
        name = "ip-" + inst.ip.replace(".", "-")
        seeds = {
            "etc/hosts": LAB_HOSTS + f"{inst.ip} {name} {name}.ec2.internal\n",
            "etc/resolv.conf": LAB_RESOLV, "etc/hostname": name + "\n",
            "usr/bin/sudo": SUDO,
        }
        recorder = POWER_RECORDER.format(requests=shlex.quote(str(inst.dir / "power-requests")))
        for command in ("bin/systemctl", "sbin/shutdown", "sbin/poweroff", "sbin/halt",
                        "sbin/reboot"):
            seeds[f"usr/{command}"] = recorder
        for rel, text in seeds.items():
            path = up / rel.split("/")[0] / "upper" / rel.split("/", 1)[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o755 if rel.startswith("usr/") else 0o644)
        (up / "run" / "upper" / "systemd" / "system").mkdir(parents=True)  # systemd runs it
        power_off = inst.dir / "power-off-now"
        power_off.write_text(POWER_OFF_NOW.format(recorder=shlex.quote(
            str(up / "usr" / "upper" / "bin" / "systemctl"))))
        power_off.chmod(0o755)
        lines = ["set -e"]
        for target in OVERLAID:
            if not os.path.isdir(target):
                continue
            d = up / target.strip("/")
            (d / "upper").mkdir(parents=True, exist_ok=True)
            (d / "work").mkdir(exist_ok=True)
            lines.append(f"mount -t overlay -o lowerdir={target},upperdir={d / 'upper'},"
                         f"workdir={d / 'work'} overlay {target}")
        lines.append(f"mkdir -p {USER_HOME}")
        lines.append(f"mount --bind {shlex.quote(str(home))} {USER_HOME}")
        if self.local_nvme == "mounted" and self._has_nvme(inst):
            nvme = inst.dir / "nvme"  # the instance store, as the test sees it
            nvme.mkdir(parents=True, exist_ok=True)
            lines.append(f"mkdir -p {NVME_MOUNT}")
            lines.append(f"mount --bind {shlex.quote(str(nvme))} {NVME_MOUNT}")
        lab_recorder = self.cloud.tmp / "shutdown"  # cloud_lab.RECORDER
        if lab_recorder.exists():
            lines.append(f"mount --bind {shlex.quote(str(power_off))} "
                         f"{shlex.quote(str(lab_recorder))}")
        lines += [f"hostname {name}", "echo ready",
                  f"exec -a 'lab-instance-init {inst.id}' sleep infinity"]
        boot = inst.dir / "init.sh"
        boot.write_text("\n".join(lines) + "\n")
        return boot

    @staticmethod
    def _has_nvme(inst: LabInstance) -> bool:
        """Its type has NVMe instance store (the catalog's) and its image is the Deep Learning
        AMI, which mounts it (not Canonical's Ubuntu of a Volta type, nor an image of the
        user's own)."""
        from cloudtrain import catalog

        image = inst.moto.ec2_backend.amis.get(inst.moto.image_id)
        return "Deep Learning" in (getattr(image, "name", "") or "") and \
            catalog.instance_store(inst.moto.instance_type) is not None

    def _metadata(self, inst: LabInstance) -> None:
        """What the instance reads from IMDS: its role (from its instance profile) and its
        metadata; its tags only when its metadata options allow them, as on AWS."""
        imds, moto = self.cloud.imds, inst.moto
        role = None
        assoc = moto.ec2_backend.iam_instance_profile_associations.get(inst.id)
        if assoc is not None:
            profile = assoc.iam_instance_profile
            role = profile.roles[0].name if profile.roles else profile.name
        imds.roles[inst.ip] = role
        region = inst.zone[:-1]
        name = "ip-" + inst.ip.replace(".", "-")
        doc = {"accountId": moto.owner_id, "architecture": "x86_64",
               "availabilityZone": inst.zone, "imageId": moto.image_id,
               "instanceId": inst.id, "instanceType": moto.instance_type,
               "privateIp": inst.ip, "region": region, "version": "2017-09-30",
               "pendingTime": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                            time.gmtime(inst.launched_at))}
        meta = "/latest/meta-data/"
        data = {meta + "instance-id": inst.id, meta + "instance-type": moto.instance_type,
                meta + "ami-id": moto.image_id, meta + "local-ipv4": inst.ip,
                meta + "hostname": f"{name}.ec2.internal",
                meta + "local-hostname": f"{name}.ec2.internal",
                meta + "placement/availability-zone": inst.zone,
                meta + "placement/region": region,
                meta + "instance-life-cycle": "spot" if moto.lifecycle == "spot" else "on-demand",
                meta + "autoscaling/target-lifecycle-state": "InService",
                "/latest/dynamic/instance-identity/document": json.dumps(doc, indent=2)}
        if inst.user_data:
            data["/latest/user-data"] = inst.user_data.decode("utf-8", "replace")
        if moto.metadata_options.instance_metadata_tags == "enabled":
            tags = {t["key"]: t["value"] for t in moto.get_tags()}
            data[meta + "tags/instance"] = "\n".join(tags)
            data.update({f"{meta}tags/instance/{k}": v for k, v in tags.items()})
        imds.metadata[inst.ip] = data

    def _run_user_data(self, inst: LabInstance) -> None:
        """cloud-init's scripts-user: the user-data, written where cloud-init keeps it and
        run once, as root, with cloud-final's environment; its output is the console."""
        raw = inst.user_data
        if not raw or not raw.startswith(b"#!"):
            inst.keys_printed = True
            inst.user_data_started_at = inst.user_data_ended_at = time.time()
            if raw:  # cloud-config, MIME parts, a script without #!: cloud-init's other paths
                self.event("error", instance=inst.id,
                           error="only a script user-data (#!...) is run by the lab")
            return
        scripts = inst.path("/var/lib/cloud/instance/scripts")
        scripts.mkdir(parents=True, exist_ok=True)
        inst.path("/var/lib/cloud/instance/user-data.txt").write_bytes(raw)
        (scripts / "part-001").write_bytes(raw)
        (scripts / "part-001").chmod(0o700)
        # root's tmux directory is the instance's own, as its SSH sessions' is (TMUX_TMPDIR):
        # on AWS each instance has its own /tmp; here they share this machine's
        tmux = self.cloud.tmux_root / inst.ip
        tmux.mkdir(exist_ok=True)
        env = {"PATH": CLOUD_INIT_PATH, "LANG": "C.UTF-8", "HOME": ROOT_HOME,
               "TMUX_TMPDIR": str(tmux), **self.cloud.host_env, **self.user_data_env}
        with open(inst.dir / "console.log", "ab") as out:
            inst.process = subprocess.Popen(
                [*inst.enter(), "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                 "/var/lib/cloud/instance/scripts/part-001"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd="/",
                start_new_session=True)
        inst.host.procs.append(inst.process)
        inst.user_data_started_at = time.time()
        self.event("user-data-start", instance=inst.id, group=inst.group, zone=inst.zone,
                   replaces=inst.replaces,
                   since_launch_s=round(inst.user_data_started_at - inst.launched_at, 3))

    def _console(self, inst: LabInstance) -> str:
        if inst.sshd is None:
            return ""
        head = (f"[    4.211] cloud-init[1021]: Cloud-init v. 24.1 running 'modules:final' "
                f"at {time.strftime('%a, %d %b %Y %H:%M:%S', time.gmtime(inst.booted_at))}"
                " +0000. Up 4.21 seconds.\r\n")
        try:
            out = (inst.dir / "console.log").read_bytes().decode("utf-8", "replace")
        except OSError:
            out = ""
        out = out.replace("\r\n", "\n").replace("\n", "\r\n")
        from labs.aws import AWSLab

        keys = AWSLab.fingerprint_block(inst.sshd.host_key).split("\r\n", 1)[1]
        if self.keys_first:
            text = head + keys + out
        elif inst.keys_printed or inst.ran_user_data:
            text = head + out + keys
        else:
            text = head + out
        return text[-CONSOLE_LIMIT:]

    def _teardown(self, inst: LabInstance, why: str) -> None:
        """The instance is gone: every process in it, its namespace, its disk."""
        cloud, ip = self.cloud, inst.ip
        inst.console_final = self._console(inst)
        if inst.process is not None and inst.user_data_exit is None \
                and inst.process.poll() is None:
            self.event("user-data-exit", instance=inst.id, code=None,
                       seconds=round(time.time() - inst.user_data_started_at, 3),
                       note="killed with its instance")
        if cloud.net.hosts.get(ip) is inst.host:
            cloud.net.remove_host(ip)  # sshd, init, user-data and all they started
        for table in (cloud.hosts, cloud.sshds):
            if table.get(ip) in (inst.host, inst.sshd):
                del table[ip]
        if cloud.homes.get(ip) == cloud.tmp / f"home-{ip}":
            shutil.rmtree(cloud.homes.pop(ip), ignore_errors=True)
        shutil.rmtree(cloud.tmux_root / ip, ignore_errors=True)
        shutil.rmtree(inst.dir / "root", ignore_errors=True)
        for table in (cloud.imds.spot_actions, cloud.imds.roles, cloud.imds.metadata):
            table.pop(ip, None)
        inst.terminated_at = time.time()
        self.event("terminated", instance=inst.id, group=inst.group, zone=inst.zone,
                   reason=why)


def _user_data_bytes(encoded) -> bytes | None:
    """The user-data as the instance gets it: base64 decoded, gunzipped as cloud-init does."""
    if encoded is None:
        return None
    raw = base64.b64decode(str(encoded))
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def _block_devices(mappings: list[dict]) -> list[dict]:
    """A launch template's block devices as moto's RunInstances reads them: moto keeps the
    template's values as the query string had them ("false" would be a true
    DeleteOnTermination), and a mapping without Ebs (NoDevice) would break it."""
    def flag(value) -> bool:
        return str(value).lower() == "true"

    out = []
    for mapping in mappings:
        ebs = dict(mapping.get("Ebs") or {})
        if not ebs:
            continue
        ebs.setdefault("DeleteOnTermination", True)  # EC2's default at launch (moto's: no)
        for key in ("Encrypted", "DeleteOnTermination"):
            if key in ebs:
                ebs[key] = flag(ebs[key])
        for key in ("VolumeSize", "Iops", "Throughput"):
            if key in ebs:
                ebs[key] = int(ebs[key])
        out.append({**mapping, "Ebs": ebs})
    return out


def _parse_time(value) -> float | None:
    if not value:
        return None
    if isinstance(value, datetime.datetime):
        when = value
    else:
        when = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _power_request(argv: list[str]) -> tuple[str, float | None]:
    """What a recorded call asks of the machine, as systemd reads it: ("now", None),
    ("schedule", minutes), ("cancel", None), or ("halt" | "reboot" | "other", None), which
    the lab leaves alone (EC2: halt does not power the instance off)."""
    name, args = (argv[0], argv[1:]) if argv else ("", [])
    flags = [a for a in args if a.startswith("-")]
    words = [a for a in args if not a.startswith("-")]
    if name == "systemctl":
        name, words = (words[0], words[1:]) if words else ("", [])
        if name not in ("poweroff", "halt", "reboot"):
            return "other", None
    if name == "poweroff":
        return ("reboot" if "--reboot" in flags else "halt" if "--halt" in flags
                else "now"), None
    if name == "halt":
        return ("now" if {"-p", "--poweroff"} & set(flags) else "halt"), None
    if name == "reboot":
        return ("now" if {"-p", "--poweroff"} & set(flags) else "reboot"), None
    if name != "shutdown":
        return "other", None
    if "-c" in flags:
        return "cancel", None
    if "-k" in flags:
        return "other", None
    if {"-r", "--reboot"} & set(flags):
        return "reboot", None
    if {"-H", "--halt"} & set(flags):
        return "halt", None
    when = words[0] if words else "+1"  # systemd's shutdown: a minute from now by default
    if when == "now":
        return "now", None
    if re.fullmatch(r"\+\d+", when):
        minutes = int(when[1:])
        return ("now", None) if minutes == 0 else ("schedule", minutes)
    if m := re.fullmatch(r"(\d{1,2}):(\d{2})", when):
        now = datetime.datetime.now()
        at = now.replace(hour=int(m.group(1)), minute=int(m.group(2)), second=0,
                         microsecond=0)
        if at <= now:
            at += datetime.timedelta(days=1)
        return "schedule", (at - now).total_seconds() / 60
    return "other", None


def kill_launching_machine(ct_home: Path, tmux_socket: str) -> list[int]:
    """The launching machine goes away (a laptop closes): SIGKILL every cloudtrain process
    of this CLOUDTRAIN_HOME running in this machine's own network namespace (`python -m
    cloudtrain ...` or the `cloudtrain` console script: commands, the supervisor), then the
    tmux server on the test's private socket (the supervisor's session). Processes on the
    lab's instances (other namespaces: agents, user-data) and other tests' are left alone.
    Returns the pids killed."""
    home = str(Path(ct_home))
    own_net = os.stat("/proc/self/ns/net").st_ino
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
            environ = (entry / "environ").read_bytes().decode("utf-8", "replace").split("\0")
            net = os.stat(entry / "ns" / "net").st_ino
        except OSError:
            continue
        if net != own_net or not _is_cloudtrain(argv):
            continue
        if f"CLOUDTRAIN_HOME={home}" not in environ and home not in argv:
            continue
        try:
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
        except OSError:
            pass
    subprocess.run(["tmux", "-L", tmux_socket, "kill-server"], capture_output=True)
    return killed


def _is_cloudtrain(argv: list[str]) -> bool:
    """`python -m cloudtrain ...` (or a module of it), or the cloudtrain console script."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and argv[i + 1].split(".")[0] == "cloudtrain":
            return True
    return any(os.path.basename(arg) == "cloudtrain" for arg in argv[:2])


def instance_profile_config(lab, ct_home: Path, profile: str = "ct-instance",
                            drop: tuple[str, ...] = ()) -> None:
    """An instance profile for the job's group (its role trusts EC2) and config.yaml naming
    it, with remote_root where the job directory is on every instance of the group (as
    ~/.cloudtrain is on AWS: /home/ubuntu on the default images; each lab instance has its
    home there too); the config lines starting with `drop` go."""
    import boto3

    from labs.credentials import CLIENT_CREDS, REGION

    iam = boto3.client("iam", endpoint_url=lab.endpoint, region_name=REGION, **CLIENT_CREDS)
    iam.create_role(RoleName=f"{profile}-role", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": "sts:AssumeRole",
            "Principal": {"Service": "ec2.amazonaws.com"}}]}))
    iam.create_instance_profile(InstanceProfileName=profile)
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=f"{profile}-role")
    config = ct_home / "config.yaml"
    text = "".join(line for line in config.read_text().splitlines(keepends=True)
                   if not line.startswith(("remote_root:", *drop)))
    config.write_text(text + f"instance_profile: {profile}\n"
                      "remote_root: /home/ubuntu/.cloudtrain\n")

