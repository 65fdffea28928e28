"""`cloudtrain check` (issue 16): what cloudtrain would use, and whether a launch will work,
before a launch finds out. Like SkyPilot's `sky check` and dstack's `config`: every setting with
its value and where it came from, then the AWS side: the region and its source, the
credentials and where they came from, the account, the Deep Learning AMI in the region, and
the account's GPU vCPU quotas against what the recipes launch, the job store bucket and the
instance profile (whether a spot job is relaunched without this machine).

    run(region=None) -> Report                 the checks: read-only AWS calls, none without
                                               credentials
    render(report, width=None, color=False)    text: the settings, the checks, their hints
    to_json(report)                            the same for scripts
    exit_code(report)                          0 without a problem, 1 with one

A verdict is `ok`; `warning` (cloudtrain works, with a limit: no credentials and so only the
local backend, some recipe variants beyond a quota, a permission the check itself lacks); or
`problem` (a launch as configured fails: config.yaml refused, credentials AWS refuses, no
Deep Learning AMI in the region, a quota below what one instance needs). Every warning and
problem has a hint.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

from . import config
from .cells import json_times
from .errors import EXIT_FAILED, EXIT_OK, CloudError, CloudtrainError
from .market import Market

OK, WARNING, PROBLEM = "ok", "warning", "problem"
MARKETS = ("on-demand", "spot")
OWN_COMMAND = "your own command"  # a job of yours: the configured instance_type
ISSUE_HINT = "cloudtrain check again once it is fixed"


@dataclasses.dataclass(frozen=True)
class Check:
    name: str  # what was checked: "config", "region", "credentials", "quota G on-demand", ...
    verdict: str  # OK, WARNING or PROBLEM
    detail: str  # what was found, one line
    hint: str = ""  # what to do about a warning or a problem ("" when ok)
    data: dict = dataclasses.field(default_factory=dict)  # the facts, for --json


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    value: object
    source: str  # "default", "config.yaml line N", or an environment variable's name


@dataclasses.dataclass
class Report:
    config_path: str  # $CLOUDTRAIN_HOME/config.yaml ("" when CLOUDTRAIN_HOME is unusable)
    settings: list[Setting]  # empty when config.yaml was refused
    checks: list[Check]

    def count(self, verdict: str) -> int:
        return sum(1 for c in self.checks if c.verdict == verdict)


@dataclasses.dataclass(frozen=True)
class Need:
    """One instance of a recipe variant (or of your own command) as launch would place it."""
    what: str  # "resnet9", "imagenet machines-4", "your own command"
    instance_type: str
    nodes: int
    vcpus: float  # in all: the type's vCPUs (bundled catalog) times the nodes
    market: str


def exit_code(report: Report) -> int:
    return EXIT_FAILED if report.count(PROBLEM) else EXIT_OK


# -- the checks ------------------------------------------------------------------------------


def run(region: str | None = None) -> Report:
    """Every check, in the order they are shown. `region`: --region (else the chain launch
    uses: config.yaml, AWS_REGION, AWS_DEFAULT_REGION, the AWS profile, us-east-1)."""
    checks: list[Check] = []
    settings, rows, path = _configuration(checks)
    _aws(settings, region, checks)
    return Report(config_path=path, settings=rows, checks=checks)


def _configuration(checks: list[Check]) -> tuple[config.Settings, list[Setting], str]:
    """The settings in force and where each came from; config.yaml refused is a problem, and
    the AWS checks then run on the built-in defaults (said so)."""
    path = ""
    try:
        path = str(config.home() / "config.yaml")
        settings = config.Settings.load()
        origins = config.origins()
    except CloudtrainError as exc:
        checks.append(Check("config", PROBLEM, f"{exc.message} (the checks below use the "
                            "built-in defaults)",
                            exc.hint or "fix the line it names, or move config.yaml aside",
                            {"path": path}))
        return config.Settings(), [], path
    rows = [Setting(f.name, getattr(settings, f.name), origins[f.name])
            for f in dataclasses.fields(settings)]
    given = sum(1 for r in rows if r.source.startswith("config.yaml"))
    env = sorted({r.source for r in rows if r.source not in ("default",)
                  and not r.source.startswith("config.yaml")})
    if given:
        detail = f"{path}: {given} setting{'s' if given != 1 else ''}, the rest built-in defaults"
    elif Path(path).exists():
        detail = f"{path}: no settings in it, built-in defaults"
    else:
        detail = f"no {path}: built-in defaults"
    detail += f"; from the environment: {', '.join(env)}" if env else ""
    checks.append(Check("config", OK, detail, data={"path": path, "from_file": given,
                                                    "from_environment": env}))
    return settings, rows, path


def _aws(settings: config.Settings, region_flag: str | None, checks: list[Check]) -> None:
    from . import providers

    cloud = providers.get("aws", settings).account
    region = _region(cloud, region_flag, checks)
    if not _credentials(cloud, settings, region or cloud.DEFAULT_REGION, checks) or \
            not region:
        return
    if _account(cloud, region, checks) is None:
        return  # AWS refused the credentials, or cannot be reached: nothing more will answer
    _plan(cloud, checks)
    _image(cloud, region, checks)
    _job_store(cloud, settings, region, checks)
    _recovery(cloud, settings, region, checks)
    try:
        needs = _recipe_needs(settings, region, checks)
    except CloudtrainError as exc:  # the catalog's prices under an unusable CLOUDTRAIN_HOME
        checks.append(Check("recipes", PROBLEM, exc.message, exc.hint or ISSUE_HINT))
        return
    _quotas(cloud, settings, region, needs, checks)
    _reservations(cloud, region, checks)


def _reservations(cloud, region: str, checks: list[Check]) -> None:
    """The capacity the account holds in the region: what --reservation can name."""
    try:
        held = cloud.usable_reservations(region)
    except CloudtrainError as exc:
        checks.append(_failed("reservations", exc, "capacity reservations"))
        return
    checks.append(Check("reservations", OK, "; ".join(held) + " (launch into one with "
                        "--reservation ID)" if held else f"none active or scheduled in {region}",
                        data={"reservations": held}))


def _region(cloud, region_flag: str | None, checks: list[Check]) -> str | None:
    try:
        region, source = cloud.region_and_source(region_flag)
    except CloudtrainError as exc:
        checks.append(Check("region", PROBLEM, exc.message,
                            exc.hint or "cloudtrain check --region us-east-1"))
        return None
    if source == "the AWS profile":
        source += f" {cloud.profile()}"
    checks.append(Check("region", OK, f"{region} (from {source})",
                        data={"region": region, "source": source}))
    return region


def _credentials(cloud, settings: config.Settings, region: str,
                 checks: list[Check]) -> bool:
    try:
        found = cloud.credential_source(region)
    except CloudtrainError as exc:  # a profile that is not there, an SSO token expired, ...
        checks.append(Check("credentials", PROBLEM, exc.message, exc.hint or ISSUE_HINT))
        return False
    if found is None:
        verdict = PROBLEM if settings.backend == "aws" else WARNING
        detail = ("no AWS credentials found: only the local backend works; account, AMI and "
                  "quotas not checked")
        if verdict == PROBLEM:
            detail += "; but the backend setting is aws"
        checks.append(Check("credentials", verdict, detail,
                            "run `aws configure` (or `aws sso login`), or set AWS_PROFILE, or "
                            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"))
        return False
    checks.append(Check("credentials", OK, f"from {found['source']}, profile "
                        f"{found['profile']}, access key {found['access_key']}",
                        data=dict(found)))
    return True


def _account(cloud, region: str, checks: list[Check]) -> str | None:
    """The caller's ARN; "" when a permission hid it (the other checks still run), None when
    AWS refused the credentials or could not be reached."""
    try:
        arn = cloud.owner(region)
    except CloudtrainError as exc:
        checks.append(_failed("account", exc, "AWS STS GetCallerIdentity"))
        return "" if checks[-1].verdict == WARNING else None
    parts = arn.split(":")
    account = parts[4] if len(parts) > 4 else ""
    checks.append(Check("account", OK, f"{account or '?'}: {arn}",
                        data={"account": account, "arn": arn}))
    return arn


PAID_PLAN_HINT = ("upgrade the account to the Paid plan: the AWS console's Billing and Cost "
                  "Management, Free Tier, Upgrade plan (or `aws freetier upgrade-account-plan "
                  "--account-plan-type PAID`); the Free plan's credits stay")


def _plan(cloud, checks: list[Check]) -> None:
    """The account's plan: on the Free plan (accounts opened since 15 July 2025 start on it)
    EC2 launches only some small types, so a GPU launch fails however the quotas read."""
    try:
        plan = cloud.account_plan()
    except CloudtrainError as exc:
        said = _failed("account plan", exc, "AWS Free Tier GetAccountPlanState")
        if said.verdict == PROBLEM:  # AWS failed: no launch depends on this answer
            said = dataclasses.replace(said, verdict=WARNING, detail=f"not checked: {said.detail}")
        checks.append(said)
        return
    if plan is None:
        checks.append(Check("account plan", OK, "no Free plan: every instance type your "
                                                "quotas allow", data={"plan": None}))
        return
    extra = ", ".join(x for x in (plan["credits"] and f"{plan['credits']} of credits left",
                                  plan["expires"] and f"until {plan['expires']}") if x)
    if plan["type"] == "FREE":
        ended = plan["status"] == "EXPIRED"
        checks.append(Check(
            "account plan", PROBLEM,
            ("the Free plan has ended: " if ended else "Free plan" + (f" ({extra})" if extra
                                                                     else "") + ": ")
            + "EC2 launches only some small instance types on it, no GPU type, so every GPU "
              "launch fails until the account is on the Paid plan", PAID_PLAN_HINT,
            data={"plan": plan}))
        return
    checks.append(Check("account plan", OK, f"{plan['type'].title()} plan: every instance "
                                            "type your quotas allow", data={"plan": plan}))


def _image(cloud, region: str, checks: list[Check]) -> None:
    try:
        ami = cloud.resolve_image(region)
        facts = cloud.image_facts(region, ami)
    except CloudtrainError as exc:
        checks.append(_failed("AMI", exc, "the Deep Learning AMI lookup"))
        return
    created = (facts["created"] or "")[:10] or "an unknown date"
    checks.append(Check("AMI", OK, f"{facts['id']} {facts['name']}, created {created}",
                        data=facts))


STORE_HINT = "see 'The job store' in infra/README.md"
PROFILE_HINT = ("set instance_profile: in config.yaml to a profile with the role of "
                "infra/instance-role-policy.json (infra/README.md)")


def _job_store(cloud, settings: config.Settings, region: str, checks: list[Check]) -> None:
    """The job store's bucket, looked at without changing anything: there and ours, not made
    yet (the first launch makes it, where the credentials may), or one a launch cannot use."""
    if not settings.job_store:
        checks.append(Check("job store", WARNING, "off (job_store: false in config.yaml): a "
                            "job's results come home only while cloudtrain watches it over "
                            "SSH, and a spot job is relaunched only from this machine",
                            "remove job_store: false from config.yaml; " + STORE_HINT,
                            {"job_store": False}))
        return
    try:
        bucket, there = cloud.job_store_found(region)
    except CloudtrainError as exc:
        checks.append(_failed("job store", exc, "the job store bucket"))
        return
    if there:
        checks.append(Check("job store", OK, f"s3://{bucket}: there, and ours",
                            data={"bucket": bucket, "exists": True}))
    else:
        checks.append(Check("job store", WARNING, f"s3://{bucket} does not exist yet: the "
                            "first launch creates it where your credentials may (else it is "
                            "an administrator's one-time step)",
                            "cloudtrain check --launch makes it and tries it; " + STORE_HINT,
                            {"bucket": bucket, "exists": False}))
    _owner_prefix(cloud, region, checks)


def _owner_prefix(cloud, region: str, checks: list[Check]) -> None:
    """Whose part of the job store this caller's jobs go to, and whether the same user finds
    it again from the next process (a role session named after its start time does not)."""
    try:
        found = cloud.owner_prefix(region)
    except CloudtrainError as exc:
        checks.append(_failed("jobs prefix", exc, "AWS STS GetCallerIdentity"))
        return
    detail = f"jobs/{found['key']}/: {found['kind']}"
    if found["stable"]:
        checks.append(Check("jobs prefix", OK, detail + ", the same in every process",
                            data=dict(found)))
    else:
        checks.append(Check("jobs prefix", WARNING, detail + ": another process of yours gets "
                            "another prefix, and the jobs under this one are out of its reach",
                            found["hint"], dict(found)))


def _recovery(cloud, settings: config.Settings, region: str, checks: list[Check]) -> None:
    """Whether an interrupted spot job is relaunched without this machine (AWS Auto Scaling,
    which needs the instance profile a replacement reads the job's bundle with, and the job
    store it reads it from) or only while this machine is on (the supervisor here): the
    instance profile looked up in IAM, read-only."""
    name = settings.instance_profile
    off = " and AWS Auto Scaling relaunches it with this machine off"
    why: str | None
    if not name:
        why, hint = "no instance_profile in config.yaml", PROFILE_HINT + off
    else:
        why, hint = _profile(cloud, region, name, checks), PROFILE_HINT + off
    if why is None and not settings.job_store:
        why, hint = ("job_store: false, and a replacement starts the job from the job store",
                     "remove job_store: false from config.yaml" + off)
    if why is None and settings.regions:
        why, hint = ("regions: in config.yaml, which AWS Auto Scaling cannot follow",
                     "remove regions: from config.yaml" + off)
    if why is None:
        checks.append(Check("spot recovery", OK, "AWS Auto Scaling relaunches an interrupted "
                            "spot job: this machine may be off (a job with --fallback "
                            "on-demand still needs it)", data={"without_this_machine": True}))
        return
    checks.append(Check("spot recovery", WARNING, "a supervisor on this machine relaunches an "
                        f"interrupted spot job, only while this machine is on ({why})", hint,
                        {"without_this_machine": False}))


def _profile(cloud, region: str, name: str, checks: list[Check]) -> str | None:
    """The instance profile's row; why AWS cannot relaunch with it, or None where it can."""
    if name == config.PER_JOB_PROFILE:
        return _per_job(cloud, region, checks)
    try:
        roles = cloud.instance_profile_roles(region, name)
    except CloudtrainError as exc:
        checks.append(_failed("instance profile", exc, f"instance profile {name}"))
        return f"instance profile {name} not looked at"
    if roles is None:
        checks.append(Check("instance profile", PROBLEM, f"{name} (instance_profile in "
                            "config.yaml) does not exist in this account: RunInstances "
                            "refuses a launch with it",
                            "create it (infra/README.md), or fix the name", {"name": name}))
        return f"instance profile {name} does not exist"
    if not roles:
        checks.append(Check("instance profile", PROBLEM, f"{name} has no role: its instances "
                            "get no credentials to read the job store",
                            "add the role of infra/instance-role-policy.json to it "
                            "(infra/README.md)", {"name": name, "roles": []}))
        return f"instance profile {name} has no role"
    # Works, and AWS relaunches with it; but one role for every job (section 2 of
    # infra/README.md says what that lets a compromised instance do).
    checks.append(Check("instance profile", WARNING, f"{name}, role {', '.join(roles)}: "
                        "shared by every job, whose instances can read every job's bundle "
                        "and checkpoints; a job's writes end with your session",
                        SHARED_PROFILE_HINT, data={"name": name, "roles": roles}))
    return None


# A shared profile's role reads every job's bundle and checkpoints, and a job's writes go
# through a presigned POST that ends with the session that signed it (infra/README.md 2, 2a).
SHARED_PROFILE_HINT = ("set instance_profile: per-job: each job a role of its own, scoped to "
                       "it, whose credentials AWS renews (infra/README.md section 2a)")


def _per_job(cloud, region: str, checks: list[Check]) -> str | None:
    """`instance_profile: per-job`: each job makes its own role under the boundary, which an
    administrator creates once; its row, and why AWS cannot relaunch, or None."""
    try:
        there = cloud.job_role_boundary(region)
    except CloudtrainError as exc:
        checks.append(_failed("instance profile", exc, "the per-job roles' boundary"))
        return "the per-job roles' boundary not looked at"
    if not there:
        checks.append(Check("instance profile", PROBLEM, "per-job: the permissions boundary "
                            "cloudtrain-job-boundary does not exist in this account, and IAM "
                            "refuses a job role without it",
                            "an administrator creates it once: infra/README.md section 2a",
                            {"name": config.PER_JOB_PROFILE, "boundary": False}))
        return "the per-job roles' boundary does not exist"
    checks.append(Check("instance profile", OK, "per-job: each job gets its own IAM role "
                        "(scoped to it, under cloudtrain-job-boundary), whose credentials AWS "
                        "renews for as long as the job runs",
                        data={"name": config.PER_JOB_PROFILE, "boundary": True}))
    return None


def _failed(name: str, exc: CloudtrainError, what: str) -> Check:
    """A call that failed: AWS refusing a permission is a warning naming it (the check could
    not look; the launch may not need it), anything else a problem."""
    code = getattr(exc, "code", "")
    if isinstance(exc, CloudError) and exc.denied:
        return Check(name, WARNING, f"{what} not checked: {exc.message}",
                     exc.hint or ISSUE_HINT, {"code": code})
    return Check(name, PROBLEM, exc.message, exc.hint or ISSUE_HINT, {"code": code})


# -- what the recipes launch, and the quotas they count against ----------------------------------


def _recipe_needs(settings: config.Settings, region: str, checks: list[Check]) -> list[Need]:
    """Each recipe's default and each of its variants, placed as launch places a cloud recipe
    job (spec's own placement: the configured type for one GPU, the cheapest type with the
    GPUs for more, on the nodes the variant was published on), plus your own command on the
    configured instance_type, in both markets."""
    from . import catalog, recipes
    from .spec import _place_recipe

    found, broken = recipes.survey()
    needs: list[Need] = []
    unplaced: list[str] = []
    for market in MARKETS:
        t = catalog.get(settings.instance_type)
        if t is not None:
            needs.append(Need(OWN_COMMAND, t.name, 1, t.vcpus, market))
        for rec in found:
            variant = rec.arguments.get("variant")
            choices = list(variant.choices or []) if variant is not None and \
                variant.type == "choice" else []
            for choice in [None, *choices]:
                what = rec.name if choice is None else f"{rec.name} {choice}"
                try:
                    args = rec.resolve(None, () if choice is None else (f"variant={choice}",))
                    nodes = rec.nodes_published(args)
                    placement = {"region": region, "market": market}
                    _place_recipe(rec, args, placement, settings, nodes)
                except CloudtrainError as exc:
                    if market == settings.market:
                        unplaced.append(f"{what}: {exc.message}")
                    continue
                t = catalog.get(placement["instance_type"])
                if t is not None:
                    needs.append(Need(what, t.name, nodes, t.vcpus * nodes, market))
    types = sorted({n.instance_type for n in needs if n.market == settings.market
                    and n.what != OWN_COMMAND})
    detail = f"{len(found)} recipes and their variants launch " + \
        (", ".join(types) or "nothing") + f" in {region} ({settings.market})"
    if broken or unplaced:
        problems = [exc.message for exc in broken] + unplaced
        checks.append(Check("recipes", WARNING, detail + "; " + "; ".join(problems),
                            "cloudtrain recipes NAME shows a recipe; --instance TYPE places "
                            "one yourself", {"types": types, "problems": problems}))
    else:
        checks.append(Check("recipes", OK, detail, data={"types": types}))
    return needs


def _quotas(cloud, settings: config.Settings, region: str, needs: list[Need],
            checks: list[Check]) -> None:
    """One row per vCPU quota the needs count against, the configured market first: below the
    smallest need is a problem (a warning for the other market), below the largest a
    warning naming what does not fit."""
    quotas: dict[tuple, list[Need]] = {}
    for need in needs:
        quota = cloud.vcpu_quota(need.instance_type, need.market)
        if quota is not None:
            quotas.setdefault((need.market, quota), []).append(need)
    order = sorted(quotas, key=lambda k: (k[0] != settings.market, k[1][2], k[0]))
    for market, (code, quota_name, group) in order:
        name = f"quota {group} {market}"
        try:
            value = cloud.quota_value(region, code)
        except CloudError as exc:
            if exc.denied:
                action = exc.refused_action("servicequotas") or "servicequotas:GetServiceQuota"
                checks.append(Check("quotas", WARNING, f"GPU quotas not checked: not allowed: "
                                    f"{action} in {region} ({exc.code})",
                                    f"allow servicequotas:GetServiceQuota and "
                                    f"servicequotas:GetAWSDefaultServiceQuota to see them (a "
                                    f"launch does not need them), or look in the console: "
                                    f"{cloud.quota_console_url(region, code)}",
                                    {"code": exc.code}))
                return
            checks.append(Check(name, WARNING, f"{quota_name} ({code}) not checked: "
                                f"{exc.message}", exc.hint or ISSUE_HINT))
            continue
        checks.append(_quota_check(name, code, quota_name, value, quotas[(market, (code,
                                   quota_name, group))], region, market == settings.market,
                                   cloud.quota_console_url(region, code)))


def _quota_check(name: str, code: str, quota_name: str, value: float, needs: list[Need],
                 region: str, configured: bool, url: str) -> Check:
    sizes: dict[tuple[str, int], list[str]] = {}
    for n in needs:
        sizes.setdefault((n.instance_type, n.nodes), []).append(n.what)
    rows = sorted(((n.vcpus, n.instance_type, n.nodes) for n in needs), key=lambda r: r[0])
    rows = list(dict.fromkeys(rows))
    smallest, largest = rows[0], rows[-1]

    def need_text(row) -> str:
        vcpus, itype, nodes = row
        users = sizes[(itype, nodes)]
        what = ", ".join(users[:3]) + (f" and {len(users) - 3} more" if len(users) > 3 else "")
        size = itype if nodes == 1 else f"{nodes} x {itype}"
        return f"{size} needs {vcpus:g} ({what})"

    data = {"code": code, "quota": quota_name, "vcpus": value, "market": needs[0].market,
            "needs": [{"instance_type": t, "nodes": n, "vcpus": v, "for": sizes[(t, n)]}
                      for v, t, n in rows]}
    head = f"{quota_name} ({code}): {value:g} vCPUs"
    flag = "--spot" if needs[0].market == Market.SPOT else "--on-demand"
    market = "" if configured else f" (for {flag})"
    if value >= largest[0]:
        return Check(name, OK, f"{head}: enough for every recipe; the most: "
                     f"{need_text(largest)}", data=data)
    if value < smallest[0]:
        return Check(name, PROBLEM if configured else WARNING,
                     f"{head}{market}: {need_text(smallest)}",
                     f"request an increase to at least {smallest[0]:g} in {region} at {url}",
                     data)
    short = [need_text(r) for r in rows if r[0] > value]
    return Check(name, WARNING, f"{head}{market}: too few where " + "; ".join(short),
                 f"to run them, request an increase to {largest[0]:g} in {region} at {url}",
                 data)


# -- text and JSON ----------------------------------------------------------------------------


def _value_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={getattr(v, 'location', v)}" for k, v in value.items()) or "{}"
    return '""' if value == "" else str(value)


def _value_json(value):
    if isinstance(value, dict):
        return {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in value.items()}
    return value


VERDICT_STYLES = {OK: "green", WARNING: "yellow", PROBLEM: "red"}


def render(report: Report, width: int | None = None, color: bool = False) -> str:
    """The settings table, the checks table, then each warning's and problem's hint, and a
    summary line; tables fit `width` (None: full length)."""
    from .cells import Col, grid

    out = []
    if report.settings:
        out += _wrapped(f"settings (built-in defaults, then {report.config_path}, then the "
                        "environment):", width)
        out.append(grid([Col("SETTING"), Col("VALUE", cut=12, wrap=True), Col("SOURCE")],
                        [[s.name, _value_text(s.value), s.source] for s in report.settings],
                        width=width))
        out.append("")
    out.append(grid([Col("CHECK"), Col("VERDICT"), Col("DETAIL", cut=20, wrap=True)],
                    [[c.name, c.verdict, c.detail] for c in report.checks], width=width,
                    color=color, styles={"VERDICT": VERDICT_STYLES.get}))
    hinted = [c for c in report.checks if c.hint and c.verdict != OK]
    if hinted:
        out.append("")
        for c in hinted:
            out += _wrapped(f"{c.name}: {c.hint}", width)
    problems, warnings = report.count(PROBLEM), report.count(WARNING)
    out.append("")
    if problems:
        out.append(f"{problems} problem{'s' if problems > 1 else ''}"
                   + (f", {warnings} warning{'s' if warnings > 1 else ''}" if warnings else "")
                   + ": fix the problems before launching")
    elif warnings:
        out.append(f"no problem, {warnings} warning{'s' if warnings > 1 else ''}")
    else:
        out.append("everything checked is ok")
    return "\n".join(out)


def _wrapped(text: str, width: int | None) -> list[str]:
    """`text` in lines of `width`, later ones indented; a path or URL is never broken (one
    longer than the width stays whole, to be copied)."""
    if not width:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False)


def to_json(report: Report) -> str:
    return json.dumps(json_times({
        "ok": exit_code(report) == EXIT_OK, "exit_code": exit_code(report),
        "problems": report.count(PROBLEM),
        "warnings": report.count(WARNING), "config_path": report.config_path,
        "settings": [{"name": s.name, "value": _value_json(s.value), "source": s.source}
                     for s in report.settings],
        "checks": [dataclasses.asdict(c) for c in report.checks],
    }), indent=1, default=str)
