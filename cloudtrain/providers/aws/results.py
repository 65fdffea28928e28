"""The job store verbs of the AWS provider: where a job's results go before its instance
powers off, and how they come home after it is gone (jobstore.py beside it does the S3 work).

    results_grant(store, job, spec)   a presigned POST for the agent, and what to tell the user
    fetch_results(store, job, local)  the stored files into `local`; None when nothing is stored
    upload_bundle(store, job, spec, parts, meta)   what an instance starts the job from
                                      (jobbundle.py), under the job's prefix; its pin

Why a presigned POST and not an instance role: no IAM role or iam:PassRole is needed, the
grant is scoped to one job's key prefix (`jobs/<owner key>/<id>/`) and expires, and no AWS
credential of any kind is put on the instance.

The owner key (the caller's aws:userid, jobstore.job_prefix) is kept with the job (its spec's
`store_owner`) at the first grant: a later command, a relaunch or another session of the same
role reads the prefix the job wrote to. A job recorded before owner prefixes has none and is
read from `jobs/<id>/`.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from ... import catalog
from ...errors import CloudtrainError
from ...state import Job, Store
from . import jobbundle, job_role, jobstore, jobstore_fetch
from .errors import aws_errors, client_error, code_of, message_of
from .instances import RUNTIME_MARGIN_MIN
from .session import AwsSession

STORE_KEEP_DAYS = 30  # the bucket's lifecycle rule deletes a job's objects after this
LOG_ALLOWANCE_BYTES = 512 << 20  # log, metrics and status, on top of the checkpoint limit


def job_store_client(aws: AwsSession, region: str):
    """(S3 client, bucket, account) of this account's job store in `region`; the client
    is made once per region (a launch asks for it several times)."""
    key = ("job-store", region)
    if key not in aws.clients:
        arn = aws.owner(region)
        account = arn.split(":")[4] if arn.count(":") >= 5 else ""
        bucket = aws.settings.job_store_bucket or jobstore.bucket_name(account, region)
        aws.clients[key] = (jobstore.s3_client(aws.session(region), region, store_endpoint()),
                            bucket, account)
    return aws.clients[key]


def store_endpoint() -> str | None:
    """The S3 endpoint this machine and the job's instances use: AWS's own (None), or the
    one AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL names (the tests' moto)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def upload_bundle(aws: AwsSession, store: Store, job: Job, spec, parts: list[tuple[str, Path]],
                  meta: dict) -> tuple[str, str]:
    """The job's bundle (jobbundle.py) under its prefix in the job store, with the
    caller's credentials, the manifest last: (where it went and its size, in words; the
    sha256 of its manifest as stored)."""
    region = job.facts.store_region or spec.placement.region or aws.region_of(job)
    s3, bucket, account = job_store_client(aws, region)
    prefix = jobstore.job_prefix(job.id, owner_key=job_store_owner(aws, store, job))
    with aws_errors(region, "s3"):
        doc = jobbundle.upload(s3, bucket, prefix, parts, meta,
                               expected_owner=account or None)
    size = sum(o["size"] for o in doc["objects"])
    return (f"bundle: {len(doc['objects'])} objects, {size / 1e6:.1f} MB "
            f"({meta['archive']['files']} synced files) to "
            f"s3://{bucket}/{prefix}bundle/, for an instance that starts the job by itself",
            hashlib.sha256(jobbundle.manifest_bytes(doc)).hexdigest())


def ensure_job_store(aws: AwsSession, region: str, owner_key: str | None = None) -> tuple[str, bool]:
    """The job store's bucket in `region`, checked with one listing of the caller's own
    prefix (`owner_key`: the job's, by default the caller's), or created and locked down
    by whoever may (a one-time administrator's step): (bucket, created now). S3's
    refusals are said with the action refused (AWSError)."""
    import botocore.exceptions

    s3, bucket, _ = job_store_client(aws, region)
    owner_key = owner_key if owner_key is not None else aws.owner_key(region)
    try:
        created = jobstore.ensure_bucket(s3, bucket, region, aws.owner(region),
                                         expire_days=STORE_KEEP_DAYS, owner_key=owner_key)
    except botocore.exceptions.ClientError as exc:
        raise client_error(exc, region, "s3") from exc
    return bucket, created


def job_store_found(aws: AwsSession, region: str) -> tuple[str, bool]:
    """Read-only (`check`): the job store's bucket in `region` and whether it is there and
    ours (False: not made yet); one the account does not own, or these credentials may
    not use, is a CloudtrainError."""
    import botocore.exceptions

    s3, bucket, _ = job_store_client(aws, region)
    try:
        return bucket, jobstore.bucket_is_ours(s3, bucket, aws.owner(region),
                                               aws.owner_key(region))
    except botocore.exceptions.ClientError as exc:
        raise client_error(exc, region, "s3") from exc


def put_stored_object(aws: AwsSession, region: str, job_id: str, name: str, data: bytes) -> str:
    """Write one object under the job's prefix of the job store (`check --launch`: a file
    the instance then reads with its role); returns its s3:// URL."""
    s3, bucket, account = job_store_client(aws, region)
    with aws_errors(region, "s3"):
        key = jobstore.put(s3, bucket, job_id, name, data, expected_owner=account or None,
                           owner_key=aws.owner_key(region))
    return f"s3://{bucket}/{key}"


def delete_results(aws: AwsSession, region: str, job_id: str) -> int:
    """Delete what the job store holds for the job (every object under the caller's
    jobs/<owner>/<id>/); returns how many there were."""
    s3, bucket, account = job_store_client(aws, region)
    with aws_errors(region, "s3"):
        return jobstore.delete_job(s3, bucket, job_id, expected_owner=account or None,
                                   owner_key=aws.owner_key(region))


def job_store_owner(aws: AwsSession, store: Store, job: Job, record: bool = False,
                 region: str | None = None) -> str | None:
    """The owner key of the job's prefix, as kept with the job; None for a job recorded
    before owner prefixes (jobs/<id>/). `record`: a job without one takes the caller's
    (the first grant: from then on the job writes, and is read, there)."""
    kept = store.job(job.id).facts.store_owner
    if kept is not None or not record:
        return kept
    owner_key = aws.owner_key(region)
    store.record_facts(job.id, store_owner=owner_key)
    return owner_key


def results_plan(aws: AwsSession, spec, region: str) -> str:
    """The dry run's line: where the results go, or what waiting for the CLI costs."""
    if not aws.settings.job_store:
        wait = aws.settings.collect_wait_minutes
        t = catalog.get(spec.placement.instance_type) if spec.placement.instance_type else None
        price = t.price(region, spec.placement.market) if t else None
        cost = f", up to ${price * wait / 60:.2f}" if price else ""
        return (f"no S3 job store (job_store: false): the instance waits up to {wait:g} "
                f"min after the job for the CLI to collect (billed{cost})")
    bucket = aws.settings.job_store_bucket or f"cloudtrain-<account>-{region}"
    where = (f"s3://{bucket}/jobs/<your user id>/<job>/ before the power-off (log, metrics, "
             f"checkpoints; kept {STORE_KEEP_DAYS} days; ")
    if aws.settings.instance_profile == job_role.PER_JOB and not spec.keep:
        return where + ("the job's own IAM role writes them, with credentials AWS renews for "
                        "its whole run)")
    line = where + "the instance gets a presigned POST, no keys)"
    try:
        ends = jobstore.credential_expiry(aws.session(region))
    except Exception:  # noqa: BLE001 - no credentials: the launch says so itself
        ends = None
    lifetime = spec.max_runtime_s + RUNTIME_MARGIN_MIN * 60
    if ends is not None and ends - time.time() < lifetime:
        line = (f"WARNING: {line}; that POST is signed with your temporary credentials, which "
                f"end in {max(0.0, ends - time.time()) / 60:.0f} min, before the job's "
                f"{spec.max_runtime_s / 3600:g} h max runtime: its checkpoints and results "
                "stop reaching the store then (instance_profile: per-job gives the job "
                "credentials of its own: infra/README.md)")
    return line


def results_grant(aws: AwsSession, store: Store, job: Job, spec, node: int = 0
                  ) -> tuple[dict | None, str | None]:
    """The agent's upload grant, valid for the job's whole life (its max runtime plus the
    power-off margin and an hour), and one line for the user. Without S3 permissions
    the launch goes on, and the line says what is lost. `node`: node i > 0 of a job on
    several machines stores under its own prefix (jobs/<id>/nodes/<i>/)."""
    import botocore.exceptions

    if not aws.settings.job_store:
        return None, (f"no S3 job store (job_store: false): after the job the instance "
                      f"waits up to {aws.settings.collect_wait_minutes:g} min (billed) for "
                      f"`cloudtrain status {job.id}` to bring the results home; after "
                      "that they are lost")
    # Every attempt of a recovering job stores into the first attempt's bucket, where the
    # next one finds its checkpoint (spec.store_region, set by the relaunch).
    region = job.facts.store_region or spec.placement.region or aws.region_of(job)
    try:
        s3, bucket, _ = job_store_client(aws, region)
        owner_key = job_store_owner(aws, store, job, record=True, region=region)
        if node == 0:  # the other nodes' grants come right after node 0's, same bucket
            ensure_job_store(aws, region, owner_key)
        # A job queued on a kept instance first waits for the jobs ahead of it there.
        waits = float((getattr(spec, "kept", None) or {}).get("wait_s") or 0)
        lifetime = spec.max_runtime_s + waits + RUNTIME_MARGIN_MIN * 60 + 3600
        prefix = jobstore.job_prefix(job.id, owner_key=owner_key)
        note = (f"results: s3://{bucket}/{prefix} when the job ends, whoever is "
                f"watching (kept {STORE_KEEP_DAYS} days)")
        if store.job(job.id).facts.job_role and job_role.job_role(aws, job):
            return role_grant(aws, bucket, region, jobstore.job_prefix(
                job.id, node, owner_key=owner_key)), note + (
                "; written with the job's own IAM role, whose credentials AWS renews")
        ends = jobstore.credential_expiry(aws.session(region))
        if ends is not None and ends - time.time() < lifetime:
            lifetime = max(60.0, ends - time.time())
            note = (f"WARNING: {note}; your AWS credentials are temporary and end in "
                    f"{lifetime / 60:.0f} min: a job ending after that cannot store its "
                    f"results (keep `cloudtrain logs {job.id} -f` running, or use "
                    "long-term credentials)")
        grant = jobstore.upload_grant(s3, bucket, job.id,
                                      int(min(lifetime, jobstore.GRANT_MAX_S)),
                                      jobstore.POST_MAX_BYTES, node=node,
                                      owner_key=owner_key)
        return grant, note
    except (CloudtrainError, botocore.exceptions.ClientError,
            botocore.exceptions.BotoCoreError) as exc:
        why = exc.message if isinstance(exc, CloudtrainError) else \
            f"{code_of(exc) or type(exc).__name__}: {message_of(exc)}"
        return None, (f"WARNING: no S3 job store ({why}). After the job the instance "
                      f"waits up to {aws.settings.collect_wait_minutes:g} min (billed) for "
                      f"`cloudtrain status {job.id}` to bring the results home; after that "
                      "they are lost (collect_wait_minutes: in config.yaml)")


def role_grant(aws: AwsSession, bucket: str, region: str, prefix: str) -> dict:
    """The grant of a job that runs on its own IAM role (job_role.py): no signature, only
    where to write; the instance signs each PUT with the role's credentials from its
    metadata service (host/agent_upload.py), which AWS renews for as long as it runs. No
    max_bytes: a file over one PUT's 5 GB goes as a multipart upload."""
    return {"signer": "role", "bucket": bucket, "region": region, "endpoint": store_endpoint(),
            "imds": aws.settings.imds_url, "prefix": prefix}


def checkpoint_plan(aws: AwsSession, store: Store, job: Job, expires_s: float) -> dict | None:
    """The job's latest checkpoint in the job store (streamed there by the agent as it was
    written, jobstore_fetch.latest_checkpoint) as a restore plan for the new host: presigned
    GETs, so the host needs no AWS credentials. None when none was stored; a manifest or
    object that does not check out raises (the relaunch says why)."""
    import botocore.exceptions

    if not aws.settings.job_store:
        return None
    first = store.attempt(job.id, 1)
    region = (first.region if first and first.region else None) or \
        job.facts.store_region or aws.region_of(job)
    try:
        s3, bucket, account = job_store_client(aws, region)
        owner_key = job_store_owner(aws, store, job)
        manifest = jobstore_fetch.latest_checkpoint(s3, bucket, job.id,
                                              expected_owner=account or None,
                                              owner_key=owner_key)
        if manifest is None:
            return None
        return jobstore_fetch.restore_plan(s3, bucket, job.id, manifest,
                                     int(min(expires_s, jobstore.GRANT_MAX_S)),
                                     owner_key=owner_key)
    except botocore.exceptions.ClientError as exc:
        raise CloudtrainError(f"the job store's checkpoint of job {job.id} could not be "
                              f"read: {code_of(exc)}: {message_of(exc)}") from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise CloudtrainError(f"the job store could not be read: {exc}") from exc


def fetch_results(aws: AwsSession, store: Store, job: Job, local: Path, node: int = 0
                  ) -> dict | None:
    """What the agent stored for the job (for node `node` of a job on several machines),
    brought into `local` (checked as untrusted: paths, sizes, the manifest's sha256).
    None when nothing was stored."""
    import boto3.exceptions
    import botocore.exceptions

    regions = {i.region for i in store.instances(job.id) if i.region} or {aws.region_of(job)}
    limit = int(aws.settings.collect_checkpoints_mb * 1e6) + LOG_ALLOWANCE_BYTES
    owner_key = job_store_owner(aws, store, job)
    for region in sorted(regions):
        try:
            s3, bucket, account = job_store_client(aws, region)
            got = jobstore_fetch.fetch(s3, bucket, job.id, Path(local), limit,
                                 expected_owner=account or None, node=node,
                                 owner_key=owner_key)
        except botocore.exceptions.ClientError as exc:
            raise CloudtrainError(f"the job store s3://.../{job.id}/ could not be read: "
                                  f"{code_of(exc)}: {message_of(exc)}") from exc
        except (botocore.exceptions.BotoCoreError, boto3.exceptions.Boto3Error) as exc:
            raise CloudtrainError(f"the job store could not be read: {exc}") from exc
        if got.found:
            return {"files": len(got.files), "bytes": got.bytes, "complete": got.complete,
                    "skipped": got.skipped}
    return None
