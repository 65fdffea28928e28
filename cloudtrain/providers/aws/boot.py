"""Boot: waiting for a requested instance to run and answer SSH, and its SSH host key
checked against the fingerprints it printed on its console."""

from __future__ import annotations

import time

from ...errors import CloudtrainError, HostError
from ...hosts import default_tmux_socket
from ...progress import SILENT, Reporter
from ...ssh import Endpoint, not_up_reason
from ...ssh_host import SSHHost
from ...state import Job, Store
from . import instances, network
from .errors import AUTH_ERRORS, AWSError, is_permission_error
from .hostkeys import console_fingerprints, fingerprint, fingerprint_window
from .session import AwsSession


def describe_instance(aws: AwsSession, region: str, instance_id: str) -> dict:
    reservations = aws.call(region, "describe_instances",
                            InstanceIds=[instance_id])["Reservations"]
    return reservations[0]["Instances"][0]


def wait_running(aws: AwsSession, region: str, instance_id: str, report: Reporter = SILENT,
                 public: list | None = None) -> str:
    """The address to reach the instance at once it runs; `public` (a list) gets the number
    of public IPv4 addresses it holds (each billed by the hour: cost.PUBLIC_IPV4_PER_HOUR)."""
    report.phase(f"instance {instance_id} requested, waiting for it to run")
    deadline = time.monotonic() + aws.settings.instance_wait_seconds
    while True:
        raw = describe_instance(aws, region, instance_id)
        state = raw["State"]["Name"]
        if state == "running":
            key = "PrivateIpAddress" if aws.settings.connect == "private" else "PublicIpAddress"
            if public is not None:
                public[:] = [instances.public_ipv4s(raw)]
            if raw.get(key):
                report.phase(f"instance {instance_id} running ({raw[key]})")
                return raw[key]
            if aws.settings.connect != "private":
                raise AWSError(f"{instance_id} has no public IP address",
                               hint="set `connect: private` (VPN, peering) or use a subnet "
                                    "that maps public IPs")
        if state in ("shutting-down", "terminated", "stopping", "stopped"):
            reason = raw.get("StateReason", {}).get("Message", state)
            raise AWSError(f"{instance_id} went {state} while starting: {reason}")
        if time.monotonic() > deadline:
            raise AWSError(f"{instance_id} is still {state} after "
                           f"{aws.settings.instance_wait_seconds:.0f} s",
                           hint=f"aws ec2 describe-instances --instance-ids {instance_id} "
                                f"--region {region}")
        time.sleep(aws.settings.poll_seconds)


# The types whose first boot takes longest: a Deep Learning AMI on a p4d, p5 or p6 also
# assembles the local NVMe array and starts EFA and the driver before SSH answers (dstack saw
# 10 to 25 minutes to provision such hosts; SkyPilot waits 600 s for SSH on AWS).
SLOW_BOOT_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300"})
SLOW_BOOT_SSH_S = 600.0
NODES_SSH_S = 900.0  # a job on several nodes: the slowest of them


def ssh_wait_s(aws: AwsSession, instance_type: str | None, nodes: int = 1) -> float:
    """How long a launch waits for an instance's SSH to answer: config.yaml's
    ssh_wait_seconds where it says another value than the built-in one; else that (300 s),
    raised to NODES_SSH_S for a job on several nodes and to SLOW_BOOT_SSH_S for a type of
    SLOW_BOOT_FAMILIES. Only a launch that fails waits the whole bound."""
    said = aws.settings.ssh_wait_seconds
    if said != type(aws.settings).ssh_wait_seconds:
        return said
    if nodes > 1:
        return max(said, NODES_SSH_S)
    if (instance_type or "").split(".")[0] in SLOW_BOOT_FAMILIES:
        return max(said, SLOW_BOOT_SSH_S)
    return said


def wait_ssh(aws: AwsSession, region: str, instance_id: str, endpoint: Endpoint,
             instance_type: str | None, nodes: int = 1, report: Reporter = SILENT) -> SSHHost:
    """The instance's SSH host once it answers, within ssh_wait_s (for `instance_type`, one
    of `nodes`); AWSError with the console's last lines after that."""
    wait_s = ssh_wait_s(aws, instance_type, nodes)
    deadline = time.monotonic() + wait_s
    last = None
    report.phase(f"waiting for SSH on {endpoint.label()} (at most {wait_s:.0f} s)")
    while time.monotonic() < deadline:
        host = SSHHost(endpoint, default_tmux_socket(),
                       python=aws.settings.remote_python or "python3")
        try:
            host.conn  # connected and logged in; the caller checks the host key next
            return host
        except HostError as exc:
            last = exc
            host.close()
            report.retry(f"SSH not up yet ({not_up_reason(exc)}), retrying")
            time.sleep(aws.settings.poll_seconds)
    console = console_tail(aws, region, instance_id)
    raise AWSError(f"SSH to {instance_id} ({endpoint.label()}) did not answer in "
                   f"{wait_s:.0f} s: {last.message if last else ''}"
                   + (f"; console output ends: {console}" if console else ""),
                   hint=f"aws ec2 get-console-output --instance-id {instance_id} --region "
                        f"{region} --latest; check the security group allows {network.ssh_cidr(aws)}")


def check_host_key(aws: AwsSession, store: Store, job: Job, region: str, instance_id: str,
                    host: SSHHost, instance_type: str | None,
                    report: Reporter = SILENT) -> bool:
    """Accept the key the SSH server presented only if the instance listed its
    fingerprint on the console. Called as SSH answers: the fingerprints are waited
    for from then on (fingerprint_window), then the key is trusted on first use, said
    at launch as a WARNING, or with `host_key_policy: strict` refused (the instance is
    then terminated like on any failed launch). Recorded in the job's timeline either
    way; a key that is not on a list is refused before anything is sent to the host."""
    seen = fingerprint(host.conn.host_key)
    started = time.monotonic()
    waited = fingerprint_window(instance_type, aws.settings.ssh_wait_seconds, latest=True)
    while True:
        text, latest = _console_read(aws, region, instance_id)
        if not latest:  # a snapshot console (Xen): it lags by minutes
            waited = fingerprint_window(instance_type, aws.settings.ssh_wait_seconds,
                                        latest=False)
        listed = console_fingerprints(text or "")
        if listed or text is None or time.monotonic() >= started + waited:
            break
        time.sleep(aws.settings.poll_seconds)
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
    if aws.settings.host_key_policy == "strict":
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


def console_text(aws: AwsSession, region: str, instance_id: str) -> str:
    """The instance's console output as text; "" when EC2 has none yet or refuses."""
    return _console(aws, region, instance_id) or ""


def _console(aws: AwsSession, region: str, instance_id: str) -> str | None:
    """The console output; "" when there is none (yet), None when it may not be read."""
    return _console_read(aws, region, instance_id)[0]


def _console_read(aws: AwsSession, region: str, instance_id: str) -> tuple[str | None, bool]:
    """_console's answer, and whether it came from the live buffer (False: EC2's
    snapshot, which lags)."""
    import base64

    latest = True
    try:
        # Latest=True: the live buffer instead of the snapshot EC2 refreshes every few
        # minutes; only Nitro instances have it (p3 is Xen), so ask again without.
        out = aws.call(region, "get_console_output", InstanceId=instance_id,
                       Latest=True).get("Output")
    except AWSError as exc:
        if is_permission_error(exc.code) or exc.code in AUTH_ERRORS:
            return None, True  # asking again, without Latest, would be refused the same way
        latest = False
        try:
            out = aws.call(region, "get_console_output", InstanceId=instance_id).get("Output")
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


def console_tail(aws: AwsSession, region: str, instance_id: str) -> str:
    text = console_text(aws, region, instance_id)
    return " | ".join(text.strip().splitlines()[-3:])
