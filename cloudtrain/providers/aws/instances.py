"""Instances: the RunInstances request, each AZ in turn, waiting for running and SSH,
finding them by tag, terminating them, and their end times for the bill."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ... import catalog
from ...config import REGION_PATTERN, check_region
from ...errors import CloudtrainError, HostError, MissingDependency, UsageError
from ...hosts import default_tmux_socket
from ...ssh_host import SSHHost
from ...progress import SILENT, Reporter
from ...ssh import Endpoint, not_up_reason
from ...state import Instance, Job, Store
from ..base import Sweep
from .errors import AUTH_ERRORS, CAPACITY_ERRORS, QUOTA_ERRORS, STALE_ERRORS, AWSError, \
    AWSPlacementError, StaleCache, aws_errors, is_permission_error
from .hostkeys import console_fingerprints, fingerprint, fingerprint_window
from .tags import LIVE_STATES, TAG_ATTEMPT, TAG_JOB, TAG_OWNER, TAG_RECIPE

USER_DATA = Path(__file__).resolve().parents[3] / "infra" / "user-data.sh"
# The power-off timers fire this long after the job's max runtime. At first boot they count
# from boot while the job starts only after user-data's own apt budget (600 + 900 s = 25 min
# when tmux/rsync are missing), the SSH wait and the sync: 30 min leaves the job its whole
# max runtime even then. The agent re-arms them at job start with the same margin.
RUNTIME_MARGIN_MIN = 30
REARM_PATH = "/usr/local/bin/cloudtrain-rearm"  # installed by user-data; run as root
USER_DATA_DONE = "/var/lib/cloudtrain/user-data-done"  # user-data's last act
USER_DATA_WAIT_S = 1560.0  # setup waits this long for it: the apt budget plus a minute
# The timeline phase that says a RunInstances call got no answer (the instance may exist).
UNANSWERED = "run-instances-unanswered"
# How long release() keeps looking by tag for the instance of an unanswered RunInstances.
RELEASE_LOOKUP_S = 60.0
# AWS failed while handling the request: it may have been carried out.
SERVER_ERRORS = {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"}


def ec2_transition_time(reason: str) -> float | None:
    """EC2 puts the time of a stop or termination in StateTransitionReason:
    'User initiated (2026-11-22 03:00:00 GMT)'."""
    import calendar
    import re

    m = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)", reason or "")
    if not m:
        return None
    return float(calendar.timegm(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")))



# A sweep asks every region the owner can have instances in (F28): this many at once, and
# for at most this long in all (a region that has not answered by then is said unchecked).
SWEEP_WORKERS = 16
SWEEP_WAIT_S = 60.0


def _partition(region: str) -> str:
    """The AWS partition a region is in: credentials of one never work in another."""
    return "aws-cn" if region.startswith("cn-") else \
        "aws-us-gov" if region.startswith("us-gov-") else "aws"


@dataclass
class Attempt:
    zone: str
    subnet: str
    error: str | None  # None: it worked



def power_off_minutes(max_runtime_s: float) -> int:
    """Minutes from now (boot, or job start) to the hard power-off for a job of this
    max runtime."""
    return int(max_runtime_s // 60) + RUNTIME_MARGIN_MIN


def user_data_wait_command(marker: str, seconds: float) -> str:
    """A shell command that waits until `marker` exists, at most `seconds`; exit 0 if so."""
    import shlex

    return (f"i=0; while [ ! -e {shlex.quote(marker)} ] && [ $i -lt {int(seconds)} ]; do "
            f"sleep 2; i=$((i+2)); done; [ -e {shlex.quote(marker)} ]")


class InstancesMixin:
    """AWSProvider's instances (needs self.call, self.client, self.settings, self.region and
    the price lookups)."""

    power_off_minutes = staticmethod(power_off_minutes)

    def _details(self, store: Store, instance_id: str) -> dict:
        row = store.db.execute("SELECT details FROM instances WHERE id = ?",
                               (instance_id,)).fetchone()
        return json.loads(row["details"]) if row and row["details"] else {}

    def _tags(self, job: Job, spec, owner: str) -> list[dict]:
        return [{"Key": TAG_JOB, "Value": job.id}, {"Key": TAG_OWNER, "Value": owner},
                {"Key": TAG_RECIPE, "Value": spec.recipe or "command"},
                {"Key": TAG_ATTEMPT, "Value": str(getattr(spec, "attempt", 1) or 1)},
                {"Key": "Name", "Value": f"cloudtrain-{job.id}" + (f"-{job.name}" if job.name else "")}]

    def user_data(self, job: Job, spec) -> str:
        minutes = power_off_minutes(spec.max_runtime_s)
        command = self.settings.shutdown_command.replace("sudo ", "")  # user-data runs as root
        return (USER_DATA.read_text().replace("@@JOB_ID@@", job.id)
                .replace("@@MAX_RUNTIME_MINUTES@@", str(minutes))
                .replace("@@SHUTDOWN_COMMAND@@", command))

    @staticmethod
    def _performance(spec) -> dict:
        """Provisioned gp3 throughput for a job that copies its datasets onto the disk
        (datasets.preflight sets spec.disk_mbps); the volume's own 125 MB/s otherwise."""
        from ...cost import GP3_BASE_MBPS, gp3_iops_for

        mbps = int(getattr(spec, "disk_mbps", 0) or 0)
        return {"Throughput": mbps, "Iops": gp3_iops_for(mbps)} if mbps > GP3_BASE_MBPS else {}

    def run_request(self, job: Job, spec, subnet: str, group: str, ami: str, key_name: str,
                    owner: str, disk_gb: int, root_device: str) -> dict:
        tags = self._tags(job, spec, owner)
        request = dict(
            ImageId=ami, InstanceType=spec.instance_type, MinCount=1, MaxCount=1,
            KeyName=key_name, SubnetId=subnet, SecurityGroupIds=[group],
            InstanceInitiatedShutdownBehavior="terminate",
            MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled",
                             # 1: only the instance itself reaches IMDS (and the instance
                             # role's credentials), not containers behind a bridge on it.
                             "HttpPutResponseHopLimit": 1},
            BlockDeviceMappings=[{"DeviceName": root_device, "Ebs": {
                "VolumeSize": disk_gb, "VolumeType": "gp3", "Encrypted": True,
                "DeleteOnTermination": True, **self._performance(spec)}}],
            TagSpecifications=[{"ResourceType": kind, "Tags": tags}
                               for kind in ("instance", "volume", "network-interface")],
            UserData=self.user_data(job, spec),
        )
        if self.settings.instance_profile:
            request["IamInstanceProfile"] = {"Name": self.settings.instance_profile}
        if spec.market == "spot":
            options = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if spec.max_price is not None:
                options["MaxPrice"] = f"{spec.max_price:.4f}"
            request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
            # Only a spot launch creates a spot request; EC2 rejects this resource type
            # otherwise.
            request["TagSpecifications"].append({"ResourceType": "spot-instances-request",
                                                 "Tags": tags})
        return request

    def _run(self, store, job, spec, region, boot: dict, report: Reporter = SILENT) -> str:
        zones, group, ami, key_name, owner = (boot["zones"], boot["group"], boot["ami"],
                                              boot["key_name"], boot["owner"])
        zones = self.relaunch_order(zones, spec, region)
        root_device = boot["root_device"]
        disk = spec.root_gb(self.settings)
        attempts: list[Attempt] = []
        for n, (zone, subnet, _vpc, _zone_id) in enumerate(zones):
            request = self.run_request(job, spec, subnet, group, ami, key_name, owner, disk,
                                       root_device)
            attempt = int(getattr(spec, "attempt", 1) or 1)
            token = f"{job.id}-{n}" if attempt == 1 else f"{job.id}-a{attempt}-{n}"
            report.phase(f"requesting {spec.market} {spec.instance_type} in {zone}"
                         + (f" ({attempts[-1].zone}: no capacity)" if attempts else ""))
            try:
                # ClientToken: a retried request can never start a second instance.
                response = self.call(region, "run_instances", fail_fast=True,
                                     ClientToken=token, **request)
            except BaseException as exc:
                code = self.run_failed(store, job, token, zone, exc, first=not attempts)
                if code in CAPACITY_ERRORS:
                    attempts.append(Attempt(zone, subnet, f"{code}: {exc.aws_message}"))
                    continue
                tried = ", ".join(a.zone for a in attempts + [Attempt(zone, subnet, code)])
                if code in QUOTA_ERRORS:
                    raise AWSPlacementError(f"{spec.instance_type} ({spec.market}) in {region}: {code}: "
                                   f"{exc.aws_message} (AZs tried: {tried})",
                                   hint="ask AWS for a higher quota (Service Quotas console: "
                                        "'Running On-Demand G and VT instances' / 'All G and VT "
                                        "Spot Instance Requests'), or use a smaller instance") from exc
                if code in ("InvalidParameterValue", "InvalidInstanceType") and \
                        spec.instance_type in exc.aws_message:
                    raise AWSError(f"{spec.instance_type} is not offered in {region}: "
                                   f"{exc.aws_message}", hint="cloudtrain catalog lists types and "
                                                              "regions") from exc
                if code and not exc.hint:
                    raise AWSError(f"run_instances failed in {zone}: {code}: {exc.aws_message}",
                                   code=code) from exc
                raise  # permissions, credentials, unreachable: already said in words
            raw = response["Instances"][0]
            instance_id = raw["InstanceId"]
            price = (catalog.get(spec.instance_type).price(region, "on-demand")
                     if catalog.get(spec.instance_type) else None)
            # Recorded before any waiting: from here on, every failure path can terminate it.
            store.add_instance(Instance(
                id=instance_id, job_id=job.id, provider=self.name, region=region, zone=zone,
                instance_type=spec.instance_type, market=spec.market, state="requested",
                launched_at=raw["LaunchTime"].timestamp() if raw.get("LaunchTime") else time.time(),
                terminated_at=None, price_per_hour=price if spec.market == "on-demand" else None,
                details={"subnet": subnet, "ami": ami, "key_name": key_name, "group": group,
                         "disk_gb": disk, "disk_mbps": spec.disk_mbps,
                         "attempts": [a.__dict__ for a in attempts]}))
            store.add_event(job.id, "instance", detail=f"{instance_id} in {zone}")
            return instance_id
        tried = "; ".join(f"{a.zone}: {a.error}" for a in attempts)
        what = f"{spec.instance_type} ({spec.market})"
        hint = ("try --spot / --on-demand, another --instance or --region, or later"
                if spec.market == "on-demand" else
                "try --on-demand, a higher --max-price, another --instance or --region")
        raise AWSPlacementError(f"no capacity for {what} in {region}, every AZ tried: {tried}",
                                hint=hint)

    @staticmethod
    def run_failed(store: Store, job: Job, token: str, zone: str, exc: BaseException,
                   first: bool) -> str:
        """A RunInstances that raised: AWS's error code for the caller to decide on (capacity:
        the next AZ). No answer, or AWS failed half-way (5xx): EC2 may have started instances
        all the same, so the timeline says so and release() looks for them by tag, for
        longer than usual. Anything but an AWSError is raised again; a cached resource that
        is gone (the first AZ's try) raises StaleCache."""
        if not isinstance(exc, AWSError) or not exc.code or exc.code in SERVER_ERRORS:
            store.add_event(job.id, UNANSWERED, detail=f"ClientToken {token} in {zone}: "
                            f"{getattr(exc, 'message', None) or type(exc).__name__}")
        if not isinstance(exc, AWSError):
            raise exc
        if exc.code in STALE_ERRORS and first:
            raise StaleCache(exc.code) from exc
        return exc.code

    def relaunch_order(self, zones: list[tuple], spec, region: str) -> list[tuple]:
        """The AZs in the order a launch tries them: the catalog's cheapest spot AZ first (the
        first launch); a relaunch asks EC2 for the spot prices now, and the AZs that were
        just interrupted (spec.avoid_zones) come last."""
        ordered = self.order_zones(zones, spec.instance_type, region, spec.market)
        if int(getattr(spec, "attempt", 1) or 1) > 1 and spec.market == "spot":
            try:
                now = self.current_spot_prices(region, [spec.instance_type]).get(
                    spec.instance_type) or {}
            except CloudtrainError:  # no permission for the price history: the snapshot's order
                now = {}
            if now:
                ordered = sorted(ordered, key=lambda z: (z[0] not in now, now.get(z[0], 0.0)))
        avoid = set(getattr(spec, "avoid_zones", None) or ())
        return [z for z in ordered if z[0] not in avoid] + [z for z in ordered if z[0] in avoid]

    def attempt_instance(self, store: Store, job: Job, region: str, attempt: int) -> str | None:
        """A live instance already started for this attempt of the job (by its tags): the
        supervisor that started it was killed before it could go on. Recorded if the store
        did not know it."""
        for raw in self._query(region, {TAG_JOB: job.id, TAG_ATTEMPT: str(attempt)}):
            if raw["State"]["Name"] not in ("pending", "running"):
                continue
            self._record_found(store, job, region, raw, attempt)
            return raw["InstanceId"]
        return None

    def attempt_instances(self, store: Store, job: Job, attempt: int,
                          regions: list[str]) -> dict[str, list[str]]:
        """Every live instance of this attempt of the job, by region, found by its attempt tag
        in each of `regions` and in every region the store has a live instance of the job
        in: a supervisor killed mid-relaunch may have left one in any place it tried (F30).
        Recorded if the store did not know them."""
        where = set(regions) | {i.region for i in store.instances(job.id)
                                if i.region and i.state != "terminated"}
        out: dict[str, list[str]] = {}
        for region in sorted(where):
            for raw in self._query(region, {TAG_JOB: job.id, TAG_ATTEMPT: str(attempt)}):
                if raw["State"]["Name"] in LIVE_STATES:
                    self._record_found(store, job, region, raw, attempt)
                    out.setdefault(region, []).append(raw["InstanceId"])
        return out

    def _record_found(self, store: Store, job: Job, region: str, raw: dict, attempt: int) -> None:
        """An instance of the attempt found by its tags: recorded if the store did not know
        it (its minutes are billed like any other)."""
        if raw["InstanceId"] in {i.id for i in store.instances(job.id)}:
            return
        spot = raw.get("InstanceLifecycle") == "spot"
        zone = raw.get("Placement", {}).get("AvailabilityZone")
        store.add_instance(Instance(
            id=raw["InstanceId"], job_id=job.id, provider=self.name, region=region, zone=zone,
            instance_type=raw.get("InstanceType"), market="spot" if spot else "on-demand",
            state="requested", launched_at=raw["LaunchTime"].timestamp(), terminated_at=None,
            price_per_hour=None, details={"found_by_tag": True}))
        store.add_event(job.id, "instance", detail=f"{raw['InstanceId']} in {zone} (attempt "
                        f"{attempt}, found by its tags)")

    def _describe(self, region: str, instance_id: str) -> dict:
        reservations = self.call(region, "describe_instances",
                                 InstanceIds=[instance_id])["Reservations"]
        return reservations[0]["Instances"][0]

    def _wait_running(self, region: str, instance_id: str, report: Reporter = SILENT) -> str:
        report.phase(f"instance {instance_id} requested, waiting for it to run")
        deadline = time.monotonic() + self.settings.instance_wait_seconds
        while True:
            raw = self._describe(region, instance_id)
            state = raw["State"]["Name"]
            if state == "running":
                key = "PrivateIpAddress" if self.settings.connect == "private" else "PublicIpAddress"
                if raw.get(key):
                    report.phase(f"instance {instance_id} running ({raw[key]})")
                    return raw[key]
                if self.settings.connect != "private":
                    raise AWSError(f"{instance_id} has no public IP address",
                                   hint="set `connect: private` (VPN, peering) or use a subnet "
                                        "that maps public IPs")
            if state in ("shutting-down", "terminated", "stopping", "stopped"):
                reason = raw.get("StateReason", {}).get("Message", state)
                raise AWSError(f"{instance_id} went {state} while starting: {reason}")
            if time.monotonic() > deadline:
                raise AWSError(f"{instance_id} is still {state} after "
                               f"{self.settings.instance_wait_seconds:.0f} s",
                               hint=f"aws ec2 describe-instances --instance-ids {instance_id} "
                                    f"--region {region}")
            time.sleep(self.settings.poll_seconds)

    def _wait_ssh(self, region: str, instance_id: str, endpoint: Endpoint,
                  report: Reporter = SILENT) -> SSHHost:
        deadline = time.monotonic() + self.settings.ssh_wait_seconds
        last = None
        report.phase(f"waiting for SSH on {endpoint.label()} (at most "
                     f"{self.settings.ssh_wait_seconds:.0f} s)")
        while time.monotonic() < deadline:
            host = SSHHost(endpoint, default_tmux_socket(),
                           python=self.settings.remote_python or "python3")
            try:
                host.conn  # connected and logged in; the caller checks the host key next
                return host
            except HostError as exc:
                last = exc
                host.close()
                report.retry(f"SSH not up yet ({not_up_reason(exc)}), retrying")
                time.sleep(self.settings.poll_seconds)
        console = self.console_tail(region, instance_id)
        raise AWSError(f"SSH to {instance_id} ({endpoint.label()}) did not answer in "
                       f"{self.settings.ssh_wait_seconds:.0f} s: {last.message if last else ''}"
                       + (f"; console output ends: {console}" if console else ""),
                       hint=f"aws ec2 get-console-output --instance-id {instance_id} --region "
                            f"{region} --latest; check the security group allows {self.ssh_cidr()}")

    def _check_host_key(self, store: Store, job: Job, region: str, instance_id: str,
                        host: SSHHost, instance_type: str | None,
                        report: Reporter = SILENT) -> bool:
        """Accept the key the SSH server presented only if the instance listed its
        fingerprint on the console (F5). Called as SSH answers: the fingerprints are waited
        for from then on (fingerprint_window, F37), then the key is trusted on first use, said
        at launch as a WARNING, or with `host_key_policy: strict` refused (the instance is
        then terminated like on any failed launch). Recorded in the job's timeline either
        way; a key that is not on a list is refused before anything is sent to the host."""
        seen = fingerprint(host.conn.host_key)
        started = time.monotonic()
        waited = fingerprint_window(instance_type, self.settings.ssh_wait_seconds, latest=True)
        while True:
            text, latest = self._console_read(region, instance_id)
            if not latest:  # a snapshot console (Xen): it lags by minutes
                waited = fingerprint_window(instance_type, self.settings.ssh_wait_seconds,
                                            latest=False)
            listed = console_fingerprints(text or "")
            if listed or text is None or time.monotonic() >= started + waited:
                break
            time.sleep(self.settings.poll_seconds)
        if listed and seen not in listed:
            host.close()
            store.add_event(job.id, "host-key", detail=f"REFUSED {seen}: not in {instance_id}'s "
                                                      "console output")
            raise AWSError(f"possible interception: the SSH server at {host.name} presented "
                           f"host key {seen}, but {instance_id} printed "
                           f"{', '.join(sorted(listed))} on its console; refusing to connect",
                           hint="launch again; if it repeats, something between this machine "
                                "and AWS answers SSH for the instance")
        if listed:
            store.add_event(job.id, "host-key", detail=f"verified {seen} against {instance_id}'s "
                                                      "console output")
            return True
        why = ("the console output is not readable: ec2:GetConsoleOutput refused" if text is None
               else f"no fingerprints in its console output after {waited:g} s")
        if self.settings.host_key_policy == "strict":
            host.close()
            store.add_event(job.id, "host-key", detail=f"REFUSED {seen}: {why} "
                                                      "(host_key_policy: strict)")
            raise AWSError(f"host key of {instance_id} not checked: {why}, and "
                           "host_key_policy is strict",
                           hint="launch again (on Xen types such as p3 the console lags by "
                                "minutes), allow ec2:GetConsoleOutput, or set host_key_policy: "
                                "tofu in config.yaml")
        store.add_event(job.id, "host-key", detail=f"trusted on first use: {seen} ({why})")
        report.note(f"WARNING: host key of {instance_id} trusted on first use ({why})")
        return False

    def console_text(self, region: str, instance_id: str) -> str:
        """The instance's console output as text; "" when EC2 has none yet or refuses."""
        return self._console(region, instance_id) or ""

    def _console(self, region: str, instance_id: str) -> str | None:
        """The console output; "" when there is none (yet), None when it may not be read."""
        return self._console_read(region, instance_id)[0]

    def _console_read(self, region: str, instance_id: str) -> tuple[str | None, bool]:
        """_console's answer, and whether it came from the live buffer (False: EC2's
        snapshot, which lags)."""
        import base64

        latest = True
        try:
            # Latest=True: the live buffer instead of the snapshot EC2 refreshes every few
            # minutes; only Nitro instances have it (p3 is Xen), so ask again without.
            out = self.call(region, "get_console_output", InstanceId=instance_id,
                            Latest=True).get("Output")
        except AWSError as exc:
            if is_permission_error(exc.code) or exc.code in AUTH_ERRORS:
                return None, True  # asking again, without Latest, would be refused the same way
            latest = False
            try:
                out = self.call(region, "get_console_output", InstanceId=instance_id).get("Output")
            except CloudtrainError:
                return "", latest
        except CloudtrainError:
            return "", latest
        if not out:
            return "", latest
        try:  # EC2 sends it base64-encoded (moto's server sends the plain text)
            return base64.b64decode(out, validate=True).decode("utf-8", "replace"), latest
        except ValueError:
            return out, latest

    def console_tail(self, region: str, instance_id: str) -> str:
        text = self.console_text(region, instance_id)
        return " | ".join(text.strip().splitlines()[-3:])

    def instance_states(self, store: Store, job: Job) -> dict[str, dict]:
        """EC2's view of the job's instances: id -> {state, reason, terminated}."""
        out = {}
        for region in {i.region for i in store.instances(job.id) if i.region}:
            for raw in self._query(region, {TAG_JOB: job.id}):
                out[raw["InstanceId"]] = {"state": raw["State"]["Name"],
                                          "reason": raw.get("StateReason", {}).get("Code", ""),
                                          "message": raw.get("StateReason", {}).get("Message", "")}
        return out

    def _query(self, region: str, tags: dict[str, str | None], client=None) -> list[dict]:
        filters = [{"Name": f"tag:{k}", "Values": [v]} if v else {"Name": "tag-key", "Values": [k]}
                   for k, v in tags.items()]
        out = []
        paginator = (client or self.client("ec2", region)).get_paginator("describe_instances")
        with aws_errors(region):
            for page in paginator.paginate(Filters=filters):
                for res in page["Reservations"]:
                    out.extend(res["Instances"])
        return out

    def release(self, store: Store, job: Job, force: bool = False) -> None:
        """Terminate what the job has: the recorded instances and anything tagged with its id
        (a request whose answer was lost still started an instance). A --keep job's instance
        stays until `cloudtrain down` (force)."""
        events = [e.phase for e in store.events(job.id)]
        # --keep keeps an instance that ran the job; one that never did (the launch failed or
        # its launcher died, F14) goes like any other.
        if (job.spec or {}).get("keep") and not force and job.state != "cancelled" \
                and "running" in events:
            return
        recorded = store.instances(job.id)
        regions = {i.region for i in recorded if i.region} or {self.region_of(job)}
        # RunInstances went unanswered (timeout, dropped connection, 5xx, interrupted): an
        # instance may exist that the store never heard of, and DescribeInstances is
        # eventually consistent, so a seconds-old instance can be missing from a tag lookup.
        # Look again, bounded, until it shows up (F12).
        lost = UNANSWERED in events and not recorded
        until = time.monotonic() + RELEASE_LOOKUP_S if lost else None
        for region in regions:
            ids = {i.id for i in recorded if i.region == region and i.state != "terminated"}
            try:
                ids |= self._find_by_tag(region, job.id, until)
            except MissingDependency:
                # No AWS credentials at all, nothing recorded and no request unanswered:
                # this launch never reached EC2, there is nothing to look for.
                if recorded or lost:
                    raise
            if ids:
                self.call(region, "terminate_instances", InstanceIds=sorted(ids))
            if int((job.spec or {}).get("nodes") or 1) > 1:
                # Deleted here if its instances are gone already, else by the next cleanup
                # (`down`, the next multi-node launch): a group in use cannot be deleted.
                self.delete_placement_groups(region, job.id)
            if any(d.get("kind") == "snapshot" for d in (job.spec or {}).get("datasets") or []):
                # Attached volumes go with their instance; one the launch made but never
                # attached (or attached without DeleteOnTermination) would bill on alone.
                # By tag, not by record: a launcher killed right after CreateVolume
                # recorded nothing.
                self.delete_job_volumes(region, job.id)
            for raw in self._query(region, {TAG_JOB: job.id}) if ids else []:
                known = {i.id for i in store.instances(job.id)}
                if raw["InstanceId"] not in known:  # found by tag only: record it now
                    store.add_instance(Instance(
                        id=raw["InstanceId"], job_id=job.id, provider=self.name, region=region,
                        zone=raw.get("Placement", {}).get("AvailabilityZone"),
                        instance_type=raw.get("InstanceType"), market=(job.spec or {}).get("market"),
                        state="requested", launched_at=raw["LaunchTime"].timestamp(),
                        terminated_at=None, price_per_hour=None, details={"found_by_tag": True}))
        self.record_ends(store, job)

    def _find_by_tag(self, region: str, job_id: str, until: float | None) -> set[str]:
        """The job's instances not yet terminated, by its tag; with `until`, asked again
        every poll_seconds until one shows up or that time passes."""
        while True:
            found = {r["InstanceId"] for r in self._query(region, {TAG_JOB: job_id})
                     if r["State"]["Name"] != "terminated"}
            if found or until is None or time.monotonic() >= until:
                return found
            time.sleep(self.settings.poll_seconds)

    def record_ends(self, store: Store, job: Job) -> None:
        """Termination times from EC2 (its state-transition reason carries the time), and for
        spot instances the price history of their AZ over their life: what the bill uses."""
        for inst in store.instances(job.id):
            if inst.state == "terminated" and inst.terminated_at and not (
                    inst.market == "spot" and not (inst.details or {}).get("spot_history")):
                continue
            raw = {}
            try:
                raw = self._describe(inst.region, inst.id)
            except Exception:  # gone from EC2's view (about an hour after termination)
                pass
            ended = ec2_transition_time(raw.get("StateTransitionReason", "")) or time.time()
            fields = {"state": "terminated", "terminated_at": inst.terminated_at or ended}
            if inst.market == "spot":
                details = dict(inst.details or {})
                try:
                    details["spot_history"] = self.spot_history(
                        inst.region, raw.get("Placement", {}).get("AvailabilityZone") or inst.zone,
                        inst.instance_type, inst.launched_at, fields["terminated_at"])
                except CloudtrainError:
                    pass  # the cost stays an estimate; `cost-report --refresh` asks again
                fields["details"] = json.dumps(details)
            store.update_instance(inst.id, **fields)

    def regions_in_use(self, store: Store | None) -> set[str]:
        """The regions the store has instances in, plus the one launches use (the built-in
        default included: it is where a job goes when nothing names a region, F28)."""
        regions = {r["region"] for r in store.db.execute(
            "SELECT DISTINCT region FROM instances WHERE provider = 'aws' AND region IS NOT NULL")
        } if store is not None else set()
        try:
            regions.add(self.region())
        except UsageError:
            pass
        return regions

    def sweep_regions(self, store: Store | None) -> tuple[list[str], str]:
        """Every region the owner can have instances in, and how they were chosen: the
        regions enabled for the account (DescribeRegions, asked in the region launches use;
        opt-in regions not enabled cannot hold instances). Without that answer, every region
        cloudtrain itself could have used: the one launches use (the default included),
        those config.yaml names, those the store knows, and the bundled catalog's."""
        home = self.region()
        try:
            answer = self.call(home, "describe_regions")
            named = [r.get("RegionName") for r in answer.get("Regions") or []]
            regions = {r for r in named if isinstance(r, str) and REGION_PATTERN.fullmatch(r)
                       and _partition(r) == _partition(home)}
            if regions:
                return sorted(regions | {home}), "the regions enabled for the account"
            why = "it listed none"
        except MissingDependency:
            raise
        except CloudtrainError as exc:
            why = exc.message
        regions = self.regions_in_use(store) | set(catalog.regions())
        regions |= {r.strip() for r in f"{self.settings.region},{self.settings.regions}"
                    .split(",") if REGION_PATTERN.fullmatch(r.strip())}
        return sorted(regions), (f"DescribeRegions failed ({why}), so the regions cloudtrain "
                                 "could have used")

    def _sweep_client(self, region: str):
        """An EC2 client for a sweep: from the one session every region shares (a session
        per region costs half a second each), with short timeouts and few retries."""
        key = ("ec2-sweep", region)
        with self._sweep_lock:
            if key not in self._clients:
                from botocore.config import Config

                check_region(region)
                self._clients[key] = self.session().client("ec2", region_name=region, config=Config(
                    retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5,
                    read_timeout=20))
            return self._clients[key]

    def sweep(self, store: Store | None, ask) -> Sweep:
        """ask(region) in every region of sweep_regions at once, SWEEP_WORKERS at a time, in
        daemon threads: a region that never answers holds the command up SWEEP_WAIT_S at
        most, and is then said to be unchecked like one whose call failed. `ask` makes only
        AWS calls (the store is not shared between threads)."""
        import queue
        import threading

        regions, chosen_by = self.sweep_regions(store)
        todo: queue.SimpleQueue = queue.SimpleQueue()
        for region in regions:
            todo.put(region)
        answers: dict[str, object] = {}
        failures: dict[str, str] = {}
        finished = threading.Semaphore(0)

        def work() -> None:
            while True:
                try:
                    region = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    answers[region] = ask(region)
                except CloudtrainError as exc:
                    failures[region] = exc.message
                except Exception as exc:  # noqa: BLE001 - said as that region's failure
                    failures[region] = f"{type(exc).__name__}: {exc}"
                finished.release()

        for _ in range(min(SWEEP_WORKERS, len(regions))):
            threading.Thread(target=work, daemon=True, name="cloudtrain-sweep").start()
        deadline = time.monotonic() + SWEEP_WAIT_S
        for _ in regions:
            if not finished.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
        answers, failures = dict(answers), dict(failures)
        unchecked = {r: failures.get(r) or f"no answer in {SWEEP_WAIT_S:g} s"
                     for r in regions if r not in answers}
        return Sweep(answers, sorted(answers), unchecked, chosen_by)

    def _tagged(self, region: str, tags: dict[str, str | None]) -> list[dict]:
        """_query for a sweep (its own clients)."""
        return self._query(region, tags, self._sweep_client(region))

    def orphans(self, store: Store) -> Sweep:
        """Every live instance tagged as this owner's, in every region it can have one
        (sweep), that no active job of the store holds (nor an ended --keep job, whose
        instance is kept on purpose), and its dataset volumes left unattached: what `down
        --all` terminates when the local state was lost or never learned of an instance
        (F12, F28). Sweep.found is the list; Sweep.unchecked the regions not asked."""
        held = {r["id"] for r in store.db.execute(
            "SELECT id, job_id FROM instances WHERE provider = 'aws' AND state != 'terminated'")
            if self._holds(store.job(r["job_id"]), store)}
        owner = self.owner(self.region())

        def ask(region: str) -> tuple[list[dict], list[dict]]:
            return (self._tagged(region, {TAG_OWNER: owner}),
                    self.dataset_volumes(region, owner, self._sweep_client(region)))

        swept = self.sweep(store, ask)
        out = []
        for region in swept.regions:
            instances, volumes = swept.found[region]
            for raw in instances:
                if raw["State"]["Name"] not in LIVE_STATES or raw["InstanceId"] in held:
                    continue
                tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
                out.append({"id": raw["InstanceId"], "region": region,
                            "job": tags.get(TAG_JOB), "type": raw.get("InstanceType"),
                            "state": raw["State"]["Name"],
                            "launched_at": raw["LaunchTime"].timestamp()})
            out += self.orphan_volumes(store, region, volumes)
        swept.found = out
        return swept

    @staticmethod
    def _holds(job: Job, store: Store) -> bool:
        """Whether the job still holds its instance: it is active, or it ran with --keep
        (kept for `launch --on` until `down`)."""
        return job.active or (bool((job.spec or {}).get("keep"))
                              and "running" in [e.phase for e in store.events(job.id)])

    def terminate(self, region: str, ids: list[str]) -> None:
        """Terminate these instances (the caller has decided they are ours and unused)."""
        volumes = [i for i in ids if i.startswith("vol-")]
        ids = [i for i in ids if not i.startswith("vol-")]
        for volume in volumes:  # a dataset volume left unattached (volumes.py)
            self.call(check_region(region), "delete_volume", VolumeId=volume)
        if ids:
            self.call(check_region(region), "terminate_instances", InstanceIds=sorted(ids))

    def reconcile(self, store: Store) -> Sweep:
        """Every instance tagged as ours in every region the owner can have one (sweep);
        marks whether the store knows it, and updates the store's instance states.
        Sweep.found is the list; Sweep.unchecked the regions that could not be asked."""
        known = {r["id"]: r["job_id"] for r in store.db.execute(
            "SELECT id, job_id FROM instances WHERE provider = 'aws'")}
        swept = self.sweep(store, lambda region: self._tagged(region, {TAG_JOB: None}))
        found = []
        for region in swept.regions:
            for raw in swept.found[region]:
                tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
                state = raw["State"]["Name"]
                found.append({"instance": raw["InstanceId"], "region": region, "state": state,
                              "type": raw.get("InstanceType"), "job": tags.get(TAG_JOB),
                              "tracked": raw["InstanceId"] in known,
                              "launched_at": raw["LaunchTime"].timestamp()})
                if raw["InstanceId"] in known and state == "terminated":
                    store.db.execute(
                        "UPDATE instances SET state = 'terminated', terminated_at = "
                        "COALESCE(terminated_at, ?) WHERE id = ?", (time.time(), raw["InstanceId"]))
        swept.found = found
        return swept
