"""A job run by an Auto Scaling group, seen from its instance: its settings in job.json, this
instance's identity, its group's instances, and the end of its own group and launch template.

Standard library only, Python 3.8+; shipped beside agent.py. Imports awsapi (the role's
credentials, SigV4), stage_plan (StageError), agent_upload (AWS error bodies), job_records
(the limits and patterns job.json's settings are checked with) and nothing else of ours.

job.json's "auto_scaling" (written by the launch, provider.agent_settings):

    {"group": "cloudtrain-<job>", "region": R, "endpoint": URL or null, "max_restarts": N,
     "prefix": "jobs/<owner>/<job>/", "bucket": B, "store_region": R,
     "nodes": N, "rank": r, "members": [{"rank", "instance", "address"}], "stream": {...},
     "on_demand_at": T or null}

(on_demand_at: a job with a deadline, the moment after which its next attempt must be
on-demand: the instance that stops past it sets its group to on-demand, to_on_demand)

(the last four for a job on several nodes, host/regroup.py: this node's rank, the attempt's
nodes, and the checkpoint stream that rank 0 runs)

Its records in the job store (final.json, attempts/...) are job_records.py's.

    settings(job) -> dict or None           job.json's "auto_scaling", checked (Invalid)
    attempt_number(job) -> int or None      the attempt job.json's env says this run is
    identity(imds) -> {instance, zone, type, lifecycle}   this instance, from IMDSv2
    end_group(conf, creds) -> [(step, ok, line)]          the group deleted (or set to 0),
                                                          then its launch template
    switch_due(conf, lifecycle, at) -> bool               the deadline wants on-demand now
    to_on_demand(conf, creds) -> (ok, line)               the group launches on-demand
    switch_for_deadline(conf, job, n, imds) -> (ok, line) or None   that, where due, recorded
    group_instances(conf, creds) -> ({id: address}, why)  what EC2 lists in the job's group
    instance_states(conf, creds, ids) -> ({id: state}, why)
"""

import re
import time
import urllib.error
import urllib.parse
import urllib.request
from xml.etree import ElementTree
from typing import TYPE_CHECKING

from .agent_upload import (ERROR_BODY_BYTES, FileUnreadable, UploadError, aws_error,
                           post_json, writable)
from .job_records import (INSTANCE, MAX_RESTARTS, NODES_MAX, attempt_in, switch_doc,
                          switch_key)
from .awsapi import (IMDS_URL, RoleCredentials, imds_get, imds_token, retry, sign_request,
                     utc_now)
from .stage_plan import StageError

if TYPE_CHECKING:  # 3.10's; the instance's Python may be older
    from typing import TypeGuard

AUTOSCALING_VERSION = "2011-01-01"
EC2_VERSION = "2016-11-15"
CALL_TIMEOUT_S = 20.0
TRIES = 3  # per call, on a connection error, 5xx or throttling only
ANSWER_MAX_BYTES = 1 << 20  # of a call's answer, read

GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # also a launch template's name
REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
PREFIX = re.compile(r"jobs/([A-Za-z0-9][A-Za-z0-9:+=,.@_-]{0,255}/)?"
                    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}/")
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Answers that mean "already gone": nothing left to delete.
GROUP_GONE = re.compile(r"not found|does not exist", re.I)
TEMPLATE_GONE = "InvalidLaunchTemplateName.NotFoundException"
TRANSIENT = ("Throttling", "RequestLimitExceeded", "ServiceUnavailable", "InternalFailure")


# auto_scaling.timing: regroup.py's waits a launch may set (config.yaml's regroup_*_seconds);
# one it leaves out keeps regroup.py's default.
TIMING = ("watch_s", "peers_s", "lost_wait_s", "stop_grace_s")
TIMING_MAX_S = 86400


class Invalid(ValueError):
    """job.json's auto_scaling is not one the launch writes."""


def _count(value) -> "TypeGuard[int]":
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def settings(job):
    """job.json's "auto_scaling", every field checked; None when the job has none (a job
    not run by a group). Invalid, naming the field, when it is not one the launch writes."""
    conf = job.get("auto_scaling") if isinstance(job, dict) else None
    if conf is None:
        return None
    if not isinstance(conf, dict):
        raise Invalid("auto_scaling is not an object")
    checks = (("group", GROUP), ("region", REGION), ("prefix", PREFIX), ("bucket", BUCKET))
    for name, pattern in checks:
        if not isinstance(conf.get(name), str) or not pattern.fullmatch(conf[name]):
            raise Invalid("auto_scaling.%s is not a %s" % (name, name))
    endpoint = conf.get("endpoint")
    if endpoint is not None and not (isinstance(endpoint, str)
                                     and endpoint.startswith(("http://", "https://"))):
        raise Invalid("auto_scaling.endpoint is neither null nor an http(s) URL")
    restarts = conf.get("max_restarts")
    if not _count(restarts) or restarts > MAX_RESTARTS:
        raise Invalid("auto_scaling.max_restarts is not a number from 0 to %d" % MAX_RESTARTS)
    nodes = conf.get("nodes", 1)
    if not _count(nodes) or not 1 <= nodes <= NODES_MAX:
        raise Invalid("auto_scaling.nodes is not a number from 1 to %d" % NODES_MAX)
    rank = conf.get("rank", 0)
    if not _count(rank) or rank >= nodes:
        raise Invalid("auto_scaling.rank is not a rank of its %d nodes" % nodes)
    members = conf.get("members", [])
    if not isinstance(members, list) or len(members) > nodes or not all(
            isinstance(m, dict) and isinstance(m.get("instance"), str)
            and INSTANCE.fullmatch(m["instance"]) for m in members):
        raise Invalid("auto_scaling.members is not a list of the nodes' instances")
    stream = conf.get("stream")
    if stream is not None and not isinstance(stream, dict):
        raise Invalid("auto_scaling.stream is not an object")
    timing = conf.get("timing")
    timing = {} if timing is None else timing
    if not isinstance(timing, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= TIMING_MAX_S
            for v in timing.values()):
        raise Invalid("auto_scaling.timing is not an object of seconds from 0 to %d"
                      % TIMING_MAX_S)
    store_region = conf.get("store_region") or conf["region"]
    if not isinstance(store_region, str) or not REGION.fullmatch(store_region):
        raise Invalid("auto_scaling.store_region is not a region")
    on_demand_at = conf.get("on_demand_at")
    if on_demand_at is not None and not (isinstance(on_demand_at, (int, float))
                                         and not isinstance(on_demand_at, bool)
                                         and 0 < on_demand_at < 1e10):
        raise Invalid("auto_scaling.on_demand_at is neither null nor a time in seconds")
    return {"group": conf["group"], "region": conf["region"], "prefix": conf["prefix"],
            "bucket": conf["bucket"], "endpoint": endpoint, "max_restarts": restarts,
            "nodes": nodes, "rank": rank, "store_region": store_region,
            "members": [{"instance": m["instance"], "rank": m.get("rank")} for m in members],
            "stream": stream, "timing": {k: float(timing[k]) for k in TIMING if k in timing},
            "on_demand_at": None if on_demand_at is None else float(on_demand_at)}


def attempt_number(job):
    """The attempt job.json's env says this run is (CLOUDTRAIN_ATTEMPT, which the launch and
    bootstrap.py write), or None where it says none."""
    env = job.get("env") if isinstance(job, dict) else None
    env = env if isinstance(env, dict) else {}
    return attempt_in(env.get("CLOUDTRAIN_ATTEMPT", ""))


# -- this instance ---------------------------------------------------------------------------

IDENTITY = {"instance": "instance-id", "zone": "placement/availability-zone",
            "type": "instance-type", "lifecycle": "instance-life-cycle",
            "address": "local-ipv4"}
IDENTITY_TEXT = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def identity(imds=IMDS_URL, timeout=5.0):
    """{instance, zone, type, lifecycle, address} of this instance from IMDSv2; a value it did not
    give (or gave in a shape no EC2 value has) is None. Never raises."""
    out = dict.fromkeys(IDENTITY)
    try:
        token = imds_token(imds, 300, timeout)
    except (OSError, ValueError):
        return out
    for name, path in IDENTITY.items():
        try:
            text = imds_get(imds, "meta-data/" + path, token, timeout, 256).decode(
                "ascii", "replace").strip()
        except (OSError, ValueError):
            continue
        out[name] = text if IDENTITY_TEXT.fullmatch(text) else None
    if out["lifecycle"] == "normal":  # IMDS says "normal" for on-demand
        out["lifecycle"] = "on-demand"
    return out


# -- the group's end -------------------------------------------------------------------------

def endpoint_url(service, region, endpoint=None):
    """The Query API's address: the lab's one endpoint for every service, else AWS's."""
    if endpoint:
        return endpoint.rstrip("/") + "/"
    return "https://%s.%s.amazonaws.com/" % (service, region)


def call(service, params, region, creds, endpoint=None, clock=time.sleep):
    """One Query API call (a signed GET, the parameters in its query string). Returns
    (True, "") or (False, "Code: Message"); a connection error, a 5xx or throttling is tried
    TRIES times (1 s, then 2 s apart). `creds` is awsapi.RoleCredentials."""
    ok, why, _ = ask(service, params, region, creds, endpoint, clock)
    return ok, why


def ask(service, params, region, creds, endpoint=None, clock=time.sleep):
    """call, with the answer's body (at most ANSWER_MAX_BYTES, as text): (ok, why, body)."""
    query = urllib.parse.urlencode(sorted(params.items()), quote_via=urllib.parse.quote,
                                   safe="-_.~")
    url = endpoint_url(service, region, endpoint) + "?" + query

    def once():
        try:
            req = urllib.request.Request(url, headers=sign_request(
                "GET", url, region, creds.get(), utc_now(), service))
        except StageError as exc:
            raise _Refused("no role credentials: %s" % exc, False) from None
        try:
            with urllib.request.urlopen(req, timeout=CALL_TIMEOUT_S) as resp:
                return resp.read(ANSWER_MAX_BYTES).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            why = aws_error(exc.read(ERROR_BODY_BYTES) or b"") or "HTTP %d" % exc.code
            exc.close()
            raise _Refused(why, exc.code >= 500 or why.startswith(TRANSIENT)) from None
        except (OSError, ValueError) as exc:
            raise _Refused("cannot reach %s: %s" % (endpoint_url(service, region, endpoint),
                                                    getattr(exc, "reason", None) or exc),
                           True) from None

    try:
        return True, "", retry(once, lambda exc: isinstance(exc, _Refused) and exc.transient,
                               TRIES, 1.0, sleep=clock)
    except _Refused as exc:
        return False, exc.why, ""


class _Refused(Exception):
    """A call that failed: why (one line), and whether another try may succeed."""

    def __init__(self, why, transient):
        super().__init__(why)
        self.why, self.transient = why, transient


# The states in which an instance still runs, or is about to (EC2's instanceState name).
ALIVE = ("pending", "running")
_STATE = re.compile(r"<instanceId>(i-[0-9a-f]{8,17})</instanceId>.*?<instanceState>\s*"
                    r"<code>[0-9]+</code>\s*<name>([a-z-]{1,20})</name>", re.S)


def instance_states(conf, creds, ids, clock=time.sleep):
    """{instance id: EC2's state name} of `ids` (DescribeInstances with the role; an id EC2
    no longer knows is left out), or None with the line saying why it could not be asked."""
    params = {"Action": "DescribeInstances", "Version": EC2_VERSION}
    for i, ident in enumerate(sorted(ids)[:100], 1):
        params["InstanceId.%d" % i] = ident
    ok, why, body = ask("ec2", params, conf["region"], creds, conf["endpoint"], clock)
    if not ok and why.startswith("InvalidInstanceID.NotFound"):
        return {}, ""  # gone long enough for EC2 to forget it
    if not ok:
        return None, why
    return {ident: state for ident, state in _STATE.findall(body) if ident in ids}, ""


# The job's tag on everything it launches (providers/aws/tags.py TAG_JOB); AWS Auto Scaling
# tags each instance it launches with its group's name.
JOB_TAG = "cloudtrain:job"
GROUP_TAG = "aws:autoscaling:groupName"
PAGES_MAX = 10  # of DescribeInstances' answer (NODES_MAX instances fit in one)


def job_id(conf):
    """The job's id: the last part of its prefix in the job store (jobs/<owner>/<job>/)."""
    return conf["prefix"].rstrip("/").rsplit("/", 1)[-1]


def _local(tag):
    return tag.rsplit("}", 1)[-1]


def _instances(body):
    """{instance id: private IPv4 address or None} of a DescribeInstances answer, and its
    nextToken (None on the last page)."""
    root = ElementTree.fromstring(body)
    found, token = {}, None
    for el in root.iter():
        name = _local(el.tag)
        if name == "nextToken" and el.text:
            token = el.text.strip()
        if name != "instancesSet":
            continue
        for item in el:
            fields = {_local(child.tag): (child.text or "").strip() for child in item}
            ident = fields.get("instanceId", "")
            if INSTANCE.fullmatch(ident):
                found[ident] = fields.get("privateIpAddress") or None
    return found, token


def group_instances(conf, creds, clock=time.sleep):
    """({instance id: private IPv4 address} of the instances EC2 lists in the job's group
    now: its Auto Scaling group's tag, the job's tag, pending or running; None, the line
    saying why it could not be asked). DescribeInstances with the role (SeeJobPeers)."""
    params = {"Action": "DescribeInstances", "Version": EC2_VERSION,
              "Filter.1.Name": "tag:" + GROUP_TAG, "Filter.1.Value.1": conf["group"],
              "Filter.2.Name": "tag:" + JOB_TAG, "Filter.2.Value.1": job_id(conf),
              "Filter.3.Name": "instance-state-name", "Filter.3.Value.1": "pending",
              "Filter.3.Value.2": "running"}
    found = {}
    for _ in range(PAGES_MAX):
        ok, why, body = ask("ec2", params, conf["region"], creds, conf["endpoint"], clock)
        if not ok:
            return None, why
        try:
            page, token = _instances(body)
        except ElementTree.ParseError as exc:
            return None, "EC2's answer is not XML: %s" % exc
        found.update(page)
        if not token:
            return found, ""
        params["NextToken"] = token
    return found, ""


def switch_due(conf, lifecycle, at):
    """Whether the job's deadline wants its group on-demand now: job.json's on_demand_at
    (the plan's switch, the latest moment a next attempt may start on spot) has passed and
    this instance is spot (an on-demand one is what the switch asks for)."""
    return conf.get("on_demand_at") is not None and at >= conf["on_demand_at"] \
        and lifecycle == "spot"


def to_on_demand(conf, creds, clock=time.sleep):
    """The job's group set to launch on-demand from now on (its instances distribution:
    100% on-demand above a base of 0), nothing else of it changed: AWS keeps every property
    an update does not name. AWS then replaces the group's spot instances, a new one
    launched before the old one is terminated, so this is for an instance whose job has
    stopped (a notice, a spot replacement past the switch). (ok, line)."""
    name = conf["group"]
    ok, why = call("autoscaling", {
        "Action": "UpdateAutoScalingGroup", "Version": AUTOSCALING_VERSION,
        "AutoScalingGroupName": name,
        "MixedInstancesPolicy.InstancesDistribution.OnDemandBaseCapacity": "0",
        "MixedInstancesPolicy.InstancesDistribution.OnDemandPercentageAboveBaseCapacity": "100"},
        conf["region"], creds, conf["endpoint"], clock)
    return ok, ("group %s set to on-demand: the deadline's switch was at %s" % (
        name, time.strftime("%H:%M:%S UTC", time.gmtime(conf["on_demand_at"])))
        if ok else "setting group %s to on-demand failed: %s" % (name, why))


def switch_for_deadline(conf, job, n=None, imds=None, clock=time.sleep):
    """Attempt n's spot instance (n: job.json's attempt_number where not given), stopping
    past the deadline's switch, sets the job's group to on-demand (to_on_demand) and records
    it in the job store (switched.json, through job.json's results grant). None where no
    switch is due (no deadline, not yet, or this instance is on-demand); else (ok, line)."""
    n = attempt_number(job) if n is None else n
    imds = imds or job.get("imds_url") or IMDS_URL
    ident = identity(imds)
    if not switch_due(conf, ident["lifecycle"], time.time()):
        return None
    ok, line = to_on_demand(conf, RoleCredentials(imds), clock)
    grant = job.get("results_store") if isinstance(job, dict) else None
    if n is None or not writable(grant):
        return ok, line + "; not recorded in the job store: no attempt or grant"
    try:
        post_json(grant, switch_key(conf["prefix"], n), switch_doc(n, ident["instance"], ok,
                                                                    line))
    except (UploadError, FileUnreadable) as exc:
        line += "; not recorded in the job store: %s" % exc
    return ok, line


def end_group(conf, creds, clock=time.sleep):
    """The job's group deleted with its instances (ForceDelete: this one too, which is on its
    way to power off), or, where that is refused, set to 0; then its launch template (named
    as the group). [(step, ok, line)], one per call made; "already gone" counts as done."""
    region, endpoint, name = conf["region"], conf["endpoint"], conf["group"]
    steps = []
    ok, why = call("autoscaling", {"Action": "DeleteAutoScalingGroup", "Version":
                                   AUTOSCALING_VERSION, "AutoScalingGroupName": name,
                                   "ForceDelete": "true"}, region, creds, endpoint, clock)
    if ok or GROUP_GONE.search(why):
        steps.append(("delete group", True, "group %s deleted%s" % (
            name, "" if ok else " already (%s)" % why)))
    else:
        steps.append(("delete group", False, "deleting group %s failed: %s" % (name, why)))
        ok, why = call("autoscaling", {"Action": "UpdateAutoScalingGroup", "Version":
                                       AUTOSCALING_VERSION, "AutoScalingGroupName": name,
                                       "MinSize": "0", "MaxSize": "0",
                                       "DesiredCapacity": "0"}, region, creds, endpoint, clock)
        steps.append(("set group to 0", ok, "group %s set to 0" % name if ok else
                      "setting group %s to 0 failed: %s" % (name, why)))
    ok, why = call("ec2", {"Action": "DeleteLaunchTemplate", "Version": EC2_VERSION,
                           "LaunchTemplateName": name}, region, creds, endpoint, clock)
    gone = not ok and why.startswith(TEMPLATE_GONE)
    steps.append(("delete launch template", ok or gone,
                  "launch template %s deleted%s" % (name, " already" if gone else "")
                  if ok or gone else "deleting launch template %s failed: %s" % (name, why)))
    return steps
