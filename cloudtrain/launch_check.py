"""`cloudtrain check --launch` (issue 25): the first contact with a real account, for cents.

Nothing in the test suite reaches AWS, so the first real launch is the user's. This runs it
once, small: one tiny job of your own kind through the real lifecycle (the provider's key
pair, security group, AMI and RunInstances, SSH with the host key checked against the
console output, the sync, the agent in tmux, the S3 job store, the collection, the release),
on the cheapest instance that boots the Deep Learning AMI, each step timed and judged on one
line; then everything it made is taken down again and the bill is shown to the fraction of a
cent. A failure names what is missing (the IAM action AWS refused, the quota, the setting),
stops there, terminates what it started (on Ctrl-C, SIGTERM and SIGHUP too) and exits 1.

    run(region=None, gpu=False, say=None, confirm=None) -> Report
    render_step(step)     one line: the step's name, its seconds, `ok  what was found` or
                          `FAILED: why`
    render_end(report)    the failed step's hint and the closing line
    to_json(report)       the same for scripts
    exit_code(report)     0 every step ok, 1 one failed, 130 interrupted

The job is an ordinary job (`cloudtrain status -a` lists it, `cost-report` counts it): its
command prints a file the sync sent, so that its log, read on the instance, from the job
store and from the collected copy, proves each leg carried the bytes.

This module holds the steps, from the credentials to the collection, and the report's text
and JSON; the steps' bookkeeping (Step, Report, Check) is in launch_check_steps, the
teardown and the bill in launch_check_teardown. It drives the lifecycle's stages like the CLI.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from . import config, progress, state
from .cells import json_times
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, CloudError, CloudtrainError, \
    HostError, UsageError
from .launch_check_steps import Check, Flow, Report, Step, Steps, Stopped, failed
from .launch_check_teardown import record_price, teardown
from .lifecycle import group, inspect, launch, lease, watch

# The instance a check launches: the cheapest x86_64 type that can boot the Deep Learning
# AMI. The DLAMI is x86_64 and needs a Nitro type (its kernel drives ENA networking and NVMe
# disks, not Xen's: no t2). The cheapest Nitro x86_64 types, t3a.nano and t3.nano, have 0.5
# GiB and no swap, less than the DLAMI's first boot is sized for (Ubuntu 24.04 with
# cloud-init, snapd's seeding, docker and the SSM agent: a reasoned choice, not measured here,
# where nothing reaches AWS); t3.micro has 1 GiB. AWS lists only GPU types for this AMI, and
# the check needs none: it boots the image and runs the path, not CUDA. t3.micro is offered in
# every commercial region (t3a.micro, $0.001/h cheaper, is not), and one exact type keeps the
# IAM policy's instance-type condition (the GPU families, and this) narrow. $0.0104/h in
# us-east-1.
CHECK_TYPE = "t3.micro"
# Its us-east-1 on-demand price, for when the Price List API cannot be asked (the bill then
# says the figure is us-east-1's).
CHECK_TYPE_PRICE = ("us-east-1", 0.0104)
# The quota a t3 instance counts against (Service Quotas, service ec2), for the hint when
# RunInstances says VcpuLimitExceeded.
STANDARD_QUOTA = ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) "
                  "instances")
# The job's maximum runtime: the agent stops it after this, and user-data powers the
# instance off this long plus its 30-minute margin after boot even if this command dies.
CHECK_MAX_RUNTIME_MINUTES = 5
CHECK_FILE = Check.synced  # the one file the sync sends; the job prints it
ROLE_DATASET, ROLE_FILE = "cloudtrain-check", "role-check.txt"  # read with the instance role
# The probe goes below its job's bundle/, where the shipped instance role may read (its
# ReadJobBundlesAndCheckpoints statement); anywhere else a least-privilege role is refused.
ROLE_KEY = "bundle/" + ROLE_FILE
JOB_END_WAIT_S = 600.0  # from the agent's start to the job's end and its upload
NAME_WIDTH = 21


def exit_code(report: Report) -> int:
    if report.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if report.ok else EXIT_FAILED


# -- the check -----------------------------------------------------------------------------------


def run(region: str | None = None, gpu: bool = False,
        say: Callable[[Step], None] | None = None,
        confirm: Callable[[str], None] | None = None, flow: Flow | None = None) -> Report:
    """Launch, exercise and take down one tiny job; each step said with `say` as it ends.
    `gpu`: on the region's cheapest GPU type instead of t3.micro. `confirm(question)` is
    asked (and may raise) once the price is known, before anything is created. `flow`:
    another job and steps between the launch and the teardown (--recovery)."""
    from . import providers
    from .state import open_store

    report = Report()
    steps = Steps(report, say)
    settings = config.Settings.load()
    with open_store(config.home()) as store:
        c = Check(settings, providers.get("aws", settings), store, gpu, secrets.token_hex(8),
                  flow=flow)
        try:
            _read_only(c, steps, report, region)
        except Stopped:
            return report
        if confirm is not None:
            confirm(flow.question(c, report) if flow else _question(c, report))
        try:
            with lease.signals_interrupt():
                try:
                    _launch(c, steps, report)
                except Stopped:
                    pass
                except KeyboardInterrupt as exc:
                    report.interrupted = getattr(exc, "signame", "SIGINT")
                finally:
                    with lease.uninterruptible("terminating what check --launch started"):
                        teardown(c, steps, report)
        finally:
            if c.workdir is not None:
                shutil.rmtree(c.workdir, ignore_errors=True)
    return report


def _read_only(c: Check, steps: Steps, report: Report, region_flag: str | None) -> None:
    """Who and where, and what it will launch at what price: nothing is created yet."""
    with steps.step("credentials") as s:
        c.region, source = c.provider.account.region_and_source(region_flag)
        report.region = c.region
        c.owner = c.provider.account.owner(c.region)  # without credentials: how to get some
        found = c.provider.account.credential_source(c.region) or {"source": "?"}
        parts = c.owner.split(":")
        account = parts[4] if len(parts) > 4 else "?"
        s.detail = (f"account {account} as {c.owner}, credentials from {found['source']}; "
                    f"region {c.region} (from {source})")
        s.data = {"account": account, "arn": c.owner, "region": c.region,
                  "region_source": source, **found}
    with steps.step("instance type") as s:
        itype, price, basis = c.flow.instance_type(c) if c.flow is not None and \
            c.flow.instance_type is not None else _instance_type(c)
        report.instance_type, report.price_per_hour = itype, price
        s.detail = f"{itype} on-demand in {c.region}: ${price:.4f}/h ({basis})"
        if c.flow is not None and c.flow.spot:
            s.detail = (f"{itype} spot in {c.region}: at most ${price:.4f}/h, its on-demand "
                        f"price ({basis})")
        s.data = {"instance_type": itype, "price_per_hour": price, "price_source": basis}
    if c.flow is not None:
        with steps.step(c.flow.name) as s:
            s.detail = c.flow.requires(c)


def _instance_type(c: Check) -> tuple[str, float, str]:
    """(type, on-demand USD/h, where the price came from): t3.micro, or with --gpu the
    region's cheapest type with a whole NVIDIA GPU that runs the x86_64 Deep Learning AMI
    (the fractional g6f/gr6f need NVIDIA's GRID driver, which the DLAMI does not carry; g5g
    is arm64), that EC2 offers there."""
    from . import catalog

    region = c.region
    if c.gpu:
        types = sorted((t for t in catalog.load().values() if t.gpus >= 1
                        and t.arch == catalog.DEFAULT_ARCH and catalog.dlami_runs(t.name)
                        and t.on_demand.get(region)),
                       key=lambda t: (t.on_demand[region], t.name))
        if not types:
            raise UsageError(f"the catalog has no on-demand GPU prices for {region}",
                             hint=f"cloudtrain catalog --refresh --region {region} (it "
                                  "fetches them), then check again")
        for t in types:
            if c.provider.account.type_offered(region, t.name) is not False:
                return t.name, t.on_demand[region], catalog.on_demand_source(region)
        raise CloudError(f"EC2 offers none of the GPU types the catalog prices in {region}",
                       hint="cloudtrain check --launch --gpu --region us-east-1")
    return priced_type(c, CHECK_TYPE, CHECK_TYPE_PRICE)


def priced_type(c: Check, name: str, fallback: tuple[str, float]) -> tuple[str, float, str]:
    """(name, on-demand USD/h, where the price came from) of a type a check launches: EC2
    must offer it in the region; its price from the Price List API, else `fallback`'s
    (region, USD/h), said as such."""
    region = c.region
    if c.provider.account.type_offered(region, name) is False:
        raise CloudError(f"EC2 does not offer {name} in {region}",
                         hint="cloudtrain check --launch --region us-east-1")
    try:
        price = c.provider.account.on_demand_prices(region, [name]).get(name)
    except CloudtrainError:  # no pricing:GetProducts, or no answer: the bundled figure
        price = None
    if price is not None:
        return name, price, "AWS price list"
    where, figure = fallback
    return name, figure, f"the {where} list price; the Price List API did not answer" + (
        "" if region == where else f", and {region}'s may differ")


def _question(c: Check, report: Report) -> str:
    minutes = c.provider.power_off_minutes(CHECK_MAX_RUNTIME_MINUTES * 60)
    return (f"This launches an on-demand {report.instance_type} in {c.region} for a few "
            f"minutes, billed per second (60 s minimum) at ${report.price_per_hour:.4f}/h; "
            f"it powers itself off after {minutes} min at the latest.")


def _launch(c: Check, steps: Steps, report: Report) -> None:
    """The resources a launch needs, then the job through the real lifecycle, then what it
    left in the job store and what came home."""
    account, region = c.provider.account, c.region
    c.launched = True
    with steps.step("key pair") as s:
        c.key_name, path = account.ensure_key(region, c.owner)
        s.detail = f"{c.key_name} (its private key: {path})"
    with steps.step("security group") as s:
        zones = account.subnets(region)
        c.group = account.ensure_group(region, zones[0][2], c.owner)
        s.detail = (f"{c.group} in {zones[0][2]}: SSH (port {c.settings.ssh_port}) from "
                    f"{account.ssh_cidr()} only; subnets in {', '.join(z[0] for z in zones)}")
    with steps.step("AMI") as s:
        ami = account.resolve_image(region, None)
        facts = account.image_facts(region, ami)
        c.disk_gb = facts.get("root_gb") or None
        s.detail = f"{ami} {facts['name']}" + (f", root volume {c.disk_gb} GB"
                                               if c.disk_gb else "")
        s.data = facts
    with steps.step("job store bucket") as s:
        if not c.settings.job_store:
            s.detail = "not checked: job_store is false in config.yaml"
        else:
            c.bucket, created = account.ensure_job_store(region)
            s.detail = f"s3://{c.bucket}" + (": created now (private, encrypted, TLS only)"
                                             if created else ": there, and ours")
    if c.settings.instance_profile and c.bucket and c.flow is None:
        with steps.step("role test object") as s:
            c.role_probe = f"{c.name}-role"
            c.role_url = account.put_stored_object(region, c.role_probe, ROLE_KEY,
                                                   (c.role_line + "\n").encode())
            s.detail = (f"{c.role_url}: the instance reads it with its role "
                        f"({c.settings.instance_profile})")
    _run_job(c, steps, report)


def _spec(c: Check, report: Report):
    from .launch_options import LaunchOptions
    from .spec import build_spec

    c.workdir = Path(tempfile.mkdtemp(prefix="cloudtrain-check-"))
    if c.flow is not None:
        return build_spec(LaunchOptions(
            workdir=str(c.workdir), name=c.name, backend="aws",
            instance_type=report.instance_type, region=c.region,
            cpu_only=None if c.gpu else True, disk_gb=c.disk_gb, **c.flow.job(c)), c.settings)
    (c.workdir / CHECK_FILE).write_text(c.line + "\n")
    command = f"cat {CHECK_FILE}"
    data: tuple[str, ...] = ()
    if c.role_url:  # the folder the object is in, as a dataset of the job
        data = (f"{ROLE_DATASET}={c.role_url.rsplit('/', 1)[0]}",)
        command += f' "$CLOUDTRAIN_DATA_DIR/{ROLE_DATASET}/{ROLE_FILE}"'
    return build_spec(LaunchOptions(
        command=(command,), workdir=str(c.workdir), name=c.name, backend="aws",
        max_runtime=CHECK_MAX_RUNTIME_MINUTES, data=data, instance_type=report.instance_type,
        region=c.region, spot=False, cpu_only=None if c.gpu else True,
        # the AMI's own size, the least EC2 takes; with data to stage, the
        # datasets' sizing decides (it keeps room for the AMI beside the copy)
        disk_gb=None if data else c.disk_gb), c.settings)


def _run_job(c: Check, steps: Steps, report: Report) -> None:
    store, settings = c.store, c.settings
    spec = _spec(c, report)
    launching = _LaunchSteps(steps, c, spec)
    try:
        job = launch.launch(store, settings, spec, say=launching)
    except BaseException as exc:
        _note_job(c, report)
        launching.fail(exc)
        if isinstance(exc, CloudtrainError):
            raise Stopped() from exc
        raise
    _note_job(c, report)
    if c.flow is not None:
        job = c.flow.steps(c, steps, job)
        with steps.step("collect") as s:
            local = config.home() / "jobs" / job.id / "output.log"
            where = "from the job store" if (job.host or {}).get("from_store") else "over SSH"
            s.detail = f"the job's log, status and settings {where} into {local.parent}"
        return
    with steps.step("job") as s:
        status = _wait_for_end(c, job)
        job = store.job(job.id)
        if status.get("state") != state.SUCCEEDED:
            if c.role_probe and "data staging failed" in (status.get("reason") or ""):
                s.name = "instance role"  # what failed is the read with the role
            raise _job_failed(c, status)
        out, _ = inspect.tail_log(job, 20) if job.jobdir else (b"", 0)
        if c.line.encode() not in out:
            raise CloudtrainError(f"the job ran, but its output lacks the synced "
                                  f"{CHECK_FILE}'s line: {_last_line(out)}")
        s.detail = (f"`{spec.display()}` exited 0 on the instance and printed the synced "
                    f"{CHECK_FILE}")
        s.data = {"status": status}
    if c.bucket:
        with steps.step("job store round trip") as s:
            s.detail, s.data = _round_trip(c, job, status)
    if c.role_probe:
        with steps.step("instance role") as s:
            assert c.workdir is not None  # made when the job was launched
            got = (Path(c.workdir) / "from-store" / "output.log")
            if c.role_line.encode() not in (got.read_bytes() if got.exists() else b""):
                raise CloudtrainError("the job's output lacks the object the instance was to "
                                      "read with its role")
            s.detail = (f"the instance read {c.role_url} with the role of instance profile {settings.instance_profile} "
                        "(credentials from IMDSv2)")
    with steps.step("collect") as s:
        job = _finish(c, job)
        local = config.home() / "jobs" / job.id / "output.log"
        if not local.exists() or c.line.encode() not in local.read_bytes():
            raise CloudtrainError(f"the job's log did not come home ({local})")
        where = "from the job store" if (job.host or {}).get("from_store") else "over SSH"
        s.detail = f"the job's log, status and settings {where} into {local.parent}"


def _note_job(c: Check, report: Report) -> None:
    """The job's id once launch made one (it exists once any instance could)."""
    try:
        c.job_id = report.job_id = c.store.find_job(c.name).id
    except CloudtrainError:
        pass
    if c.job_id:
        record_price(c, report.price_per_hour)

def _wait_for_end(c: Check, job) -> dict:
    """The agent's status once the job ended and its results went up to the job store (or
    could not: the status says so), read on the instance. If the instance is gone (it powered
    off), the job's end as the lifecycle records it from the job store."""
    deadline = time.monotonic() + JOB_END_WAIT_S
    ended_at = None
    while True:
        try:
            status = group.host_of(job).probe_job(job.jobdir, c.settings.stale_after_seconds
                                                 ).get("status") or {}
        except HostError:
            job = watch.refresh(c.store, c.settings, c.store.job(job.id))
            if not job.active:
                return {"state": job.state, "exit_code": job.exit_code, "reason": job.reason,
                        "instance_gone": True}
            status = {}
        if status.get("state") in state.TERMINAL_STATES:
            ended_at = ended_at or time.monotonic()
            # The upload follows the end at once; without a grant there is none to wait for.
            if "results_stored" in status or not c.bucket or \
                    time.monotonic() - ended_at > 120:
                return status
        if time.monotonic() > deadline:
            raise CloudtrainError(f"job {job.id} did not end within {JOB_END_WAIT_S:.0f} s of "
                                  f"its start (agent: {status.get('state') or 'no answer'})",
                                  hint=f"cloudtrain status {job.id}; cloudtrain logs {job.id}")
        time.sleep(min(c.settings.poll_seconds, 2.0))


def _job_failed(c: Check, status: dict) -> CloudtrainError:
    reason = status.get("reason") or f"exit code {status.get('exit_code')}"
    if c.role_probe and "data staging failed" in reason:
        return CloudtrainError(
            f"the instance could not read the test object with its role: {reason}",
            hint=f"the role of instance profile {c.settings.instance_profile} needs "
                 "infra/instance-role-policy.json's ReadJobBundlesAndCheckpoints (s3:GetObject "
                 "on arn:aws:s3:::cloudtrain-*/jobs/*/bundle/*: infra/README.md);"
                 " check imds_url in config.yaml if it is not EC2's")
    return CloudtrainError(f"the job {status.get('state') or 'did not end'}: {reason}",
                           hint=f"cloudtrain logs {c.job_id} shows its output")


def _last_line(out: bytes) -> str:
    from .hostdata import clean_text

    lines = out.decode("utf-8", "replace").strip().splitlines()
    return clean_text(lines[-1], 200) if lines else "(no output)"


def _round_trip(c: Check, job, status: dict) -> tuple[str, dict]:
    """The agent's upload from the instance (a presigned POST, signed with your
    credentials) and the same files fetched back here, checked against the manifest."""
    stored = status.get("results_stored")
    if stored is None and not status.get("instance_gone"):
        notes = [e.detail for e in c.store.events(job.id)
                 if e.phase == "results-store" and e.detail is not None]
        raise CloudtrainError("the instance uploaded nothing to the job store: "
                              + (notes[-1] if notes else "it had no upload grant"))
    if stored is not None and not stored.get("ok"):
        error = stored.get("error") or "no reason given"
        if "403" in error or "AccessDenied" in error:
            raise CloudtrainError(
                f"not allowed: s3:PutObject: S3 refused the instance's upload to "
                f"s3://{c.bucket}/jobs/{job.id}/ ({error})",
                hint="the presigned POST the instance uploads with is signed with your "
                     "credentials: allow s3:PutObject on arn:aws:s3:::cloudtrain-*/* (attach "
                     "infra/iam-policy-cli-account.json; infra/README.md)")
        raise CloudtrainError(f"the instance's upload to s3://{c.bucket}/jobs/{job.id}/ "
                              f"failed: {error}")
    assert c.workdir is not None  # made when the job was launched
    local = Path(c.workdir) / "from-store"
    got = c.provider.fetch_results(c.store, job, local)
    if not got or not got.get("complete"):
        raise CloudtrainError(f"the job store holds no complete upload of job {job.id} "
                              f"({'nothing' if not got else 'no manifest'})")
    log = local / "output.log"
    if not log.exists() or c.line.encode() not in log.read_bytes():
        raise CloudtrainError("the job store's output.log lacks the synced file's line")
    sent = f"{stored['files']} files, {stored['bytes']} bytes" if stored else "files"
    return (f"the instance POSTed {sent} to s3://{c.bucket}/jobs/{job.id}/ (a presigned "
            f"POST: no AWS keys on it); {got['files']} fetched back here, each matching the "
            f"manifest's sha256", {"uploaded": stored, "fetched": got})


def wait_for_job(found, timeout: float, what: str, c: Check, job):
    """found() until it gives something, the job refreshed between looks (the lifecycle
    learns the replacement and the end, and collects)."""
    deadline = time.monotonic() + timeout
    while True:
        got = found()
        if got:
            return got
        current = c.store.job(job.id)
        if current.active:
            watch.refresh(c.store, c.settings, current)
        elif not found():
            raise CloudtrainError(f"the job {current.state} while waiting for {what}: "
                                  f"{current.reason or 'no reason given'}",
                                  hint=f"cloudtrain status {job.id}; cloudtrain logs {job.id}")
        if time.monotonic() > deadline:
            raise CloudtrainError(f"no {what} within {timeout:.0f} s",
                                  hint=f"cloudtrain status {job.id}")
        time.sleep(min(c.settings.poll_seconds, 2.0))


def ended_job(c: Check, job):
    """The job once it has ended (the lifecycle has collected it), else None."""
    current = c.store.job(job.id)
    return None if current.active else current


def _finish(c: Check, job):
    """The lifecycle's own end: the refresh that sees the job ended brings its files home
    (over SSH, else from the job store) and releases the instance."""
    deadline = time.monotonic() + 120
    job = c.store.job(job.id)
    while job.active:
        job = watch.refresh(c.store, c.settings, job)
        if job.active:
            if time.monotonic() > deadline:
                raise CloudtrainError(f"job {job.id} is still {job.state}")
            time.sleep(min(c.settings.poll_seconds, 2.0))
    return job


# -- the launch's own phases, as steps -------------------------------------------------------------

# A launch reports its phases (progress.Reporter) as it goes: each becomes one of the check's
# steps, the step ending when the next one's phase begins.
_PHASES = (
    (re.compile(r"launching job "), "RunInstances"),  # bootstrap (cached), then the request
    (re.compile(r"requesting "), "RunInstances"),
    (re.compile(r"instance \S+ requested"), "instance running"),
    (re.compile(r"instance \S+ running"), "instance running"),
    (re.compile(r"waiting for SSH"), "SSH"),
    (re.compile(r"checking \S+ host key"), "host key"),
    (re.compile(r"syncing "), "sync"),
    (re.compile(r"setting up the host"), "setup"),
    (re.compile(r"starting the job in tmux"), "agent"),
    (re.compile(r"started job "), None),  # the agent runs it: the launch is over
)


class _LaunchSteps(progress.Reporter):
    """launch.launch's reporter: turns its phases into steps, says each as it ends, and lets a
    step that must fail (a host key nobody could check) stop the launch, which then
    terminates what it started."""

    def __init__(self, steps: Steps, c: Check, spec):
        super().__init__()
        self.steps, self.c, self.spec = steps, c, spec
        self.notes: list[str] = []
        self.name: str | None = "RunInstances"
        self.started = time.monotonic()
        self.texts: list[str] = []
        self.said = False  # a step said the launch's failure itself

    def phase(self, text: str) -> None:
        name = next((n for pattern, n in _PHASES if pattern.match(text)), self.name)
        if name == self.name:
            self.texts.append(text)
            return
        self._close()
        self.name, self.started, self.texts = name, time.monotonic(), [text]

    def note(self, line: str) -> None:
        """The launch's remarks (where the results go, a warning) go with the step's data;
        what matters of them is checked by a later step (the job store round trip)."""
        self.notes.append(line)

    def fail(self, exc: BaseException) -> None:
        """The launch raised: the step under way failed (unless it said so itself)."""
        if self.said:
            return
        step = failed(self.name or "launch", time.monotonic() - self.started, exc)
        if step.data.get("quota") and not self.c.gpu:  # the launch's hint is the GPU quotas'
            code, quota = STANDARD_QUOTA
            step.hint = (f"ask AWS for more vCPUs of '{quota}' ({code}) in {self.c.region}: "
                         f"{self.c.provider.account.quota_console_url(self.c.region, code)}")
        self.steps.add(step)
        self.name = None

    def _close(self) -> None:
        if self.name is None:
            return
        name, seconds = self.name, time.monotonic() - self.started
        self.name = None
        try:
            detail = self._detail(name)
        except CloudtrainError as exc:
            self.steps.add(failed(name, seconds, exc))
            self.said = True
            raise
        self.steps.add(Step(name, seconds, True, detail, data={
            "phases": self.texts, **({"notes": self.notes} if self.notes else {})}))
        self.notes = []

    def _detail(self, name: str) -> str:
        from .hosts import session_name

        c, store, last = self.c, self.c.store, (self.texts or [""])[-1]
        job = store.find_job(c.name)
        if name == "RunInstances":
            inst = store.instances(job.id)[-1]
            market = "spot" if c.flow is not None and c.flow.spot else "on-demand"
            return (f"{inst.id} {inst.instance_type} {market} in {inst.zone}, tagged "
                    f"cloudtrain:job={job.id} with its volume, shutdown behaviour terminate, "
                    f"IMDSv2 only; it powers itself off after "
                    f"{c.provider.power_off_minutes(self.spec.max_runtime_s)} min at the latest")
        if name == "instance running":
            return last.replace("instance ", "", 1)
        if name == "SSH":
            found = re.search(r"on (\S+)", last)
            return f"{found.group(1) if found else 'the instance'} answered, key {c.key_name}"
        if name == "host key":
            seen = [e.detail or "" for e in store.events(job.id) if e.phase == "host-key"]
            said = seen[-1] if seen else "not checked"
            if "GetConsoleOutput refused" in said:
                raise CloudtrainError(
                    "not allowed: ec2:GetConsoleOutput: the host key could not be checked "
                    f"against the instance's console ({said})",
                    hint="allow ec2:GetConsoleOutput on your own instances (attach "
                         "infra/iam-policy-cli.json): without it every launch trusts the "
                         "first key it is shown")
            return said
        if name == "sync":
            return last.replace("syncing ", "", 1) + f" ({c.synced}), by rsync over SSH"
        if name == "setup":
            python = (store.job(job.id).host or {}).get("python") or "python3"
            return f"python ({python}) and tmux found"
        if name == "agent":
            return f"the agent runs the job in tmux session {session_name(job.id)}"
        return last


# -- text and JSON ----------------------------------------------------------------------------------


def render_step(step: Step) -> str:
    verdict = f"ok  {step.detail}" if step.ok else f"FAILED: {step.detail}"
    return f"{step.name:<{NAME_WIDTH}}{step.seconds:>6.1f} s  {verdict}"


def render_end(report: Report) -> str:
    """After the steps: each failure's remedy, then one line on the outcome."""
    out = [f"{s.name}: {s.hint}" for s in report.steps if not s.ok and s.hint]
    first = next((s for s in report.steps if not s.ok), None)
    cost = "" if report.cost_usd is None else "; nothing was billed" if not report.cost_usd \
        else f"; it cost ${report.cost_usd:.6f}"
    job = f" (job {report.job_id}: cloudtrain status {report.job_id})" if report.job_id else ""
    left = next((s for s in report.steps if s.name in ("terminate", "cleanup") and not s.ok),
                None)
    after = "SOMETHING MAY STILL BE THERE (see above)" if left else "nothing is left running"
    if report.interrupted:
        out.append(f"interrupted ({report.interrupted}): {after}{cost}{job}")
    elif first is None:
        out.append(f"every step ok: cloudtrain launches in {report.region}; {after}{cost}{job}")
    else:
        out.append(f"FAILED at {first.name}: {after}{cost}{job}")
    return "\n".join(out)


def to_json(report: Report) -> str:
    steps = [dict(dataclasses.asdict(s), seconds=round(s.seconds, 3)) for s in report.steps]
    return json.dumps(json_times({
        "ok": report.ok, "exit_code": exit_code(report), "region": report.region,
        "instance_type": report.instance_type, "price_per_hour": report.price_per_hour,
        "job": report.job_id, "cost_usd": report.cost_usd, "interrupted": report.interrupted,
        "steps": steps,
    }), indent=1, default=str)
