"""Reading back what the instances of a job run by an Auto Scaling group record of its attempts
in the S3 job store (the records' contract is host/auto_scaling.py's; group_launch.py's
group_record reads them for lifecycle/autoscaled.py):

    attempt_keys(s3, bucket, prefix, owner)     {key: size} below the job's attempts/, bounded
    is_attempt_key(prefix, key)                 attempts/<n>.json, the attempt's own record
    small_json(s3, bucket, key, size, owner)    one record, at most RECORD_MAX_BYTES, or None
    reached(s3, bucket, prefix, keys, owner, attempts)   {n: the last step attempt n reached}

Nothing read from the bucket is trusted: every instance of the job (and whoever read its
grant) could have written any key below its prefix. The listing stops at MAX_OBJECTS keys;
only the keys of attempt records and progress records are read, each bounded, and each
record goes through its one checker (auto_scaling.check_progress). boto3 is never imported
here: the caller's client does the calls.
"""

from __future__ import annotations

import itertools
import json
import re

from ...host import auto_scaling
from .jobstore import MAX_OBJECTS, list_keys, owner_check

RECORD_MAX_BYTES = auto_scaling.RECORD_MAX_BYTES
ATTEMPT_NAME = re.compile(r"[1-9][0-9]{0,5}\.json")  # below attempts/


def attempt_keys(s3, bucket: str, prefix: str, owner: str | None) -> dict[str, int]:
    """{key: size} of the objects below the job's attempts/: its attempts' records, their
    progress, and the nodes' records of a regroup (host/regroup.py). At most MAX_OBJECTS: a
    job's attempts leave far fewer, and a listing is never read without end."""
    return dict(itertools.islice(list_keys(s3, bucket, prefix + auto_scaling.ATTEMPTS, owner),
                                 MAX_OBJECTS))


def is_attempt_key(prefix: str, key: str) -> bool:
    return key.startswith(prefix + auto_scaling.ATTEMPTS) and bool(
        ATTEMPT_NAME.fullmatch(key[len(prefix + auto_scaling.ATTEMPTS):]))


def small_json(s3, bucket: str, key: str, size: int, owner: str | None):
    """The JSON at `key`, or None where it is too large or not JSON."""
    if size > RECORD_MAX_BYTES:
        return None
    body = s3.get_object(Bucket=bucket, Key=key, **owner_check(owner))["Body"]
    data = body.read(RECORD_MAX_BYTES + 1)
    try:
        return json.loads(data) if len(data) <= RECORD_MAX_BYTES else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def reached(s3, bucket: str, prefix: str, keys: dict[str, int], owner: str | None,
            attempts: list[dict]) -> dict[int, int]:
    """{n: the last step attempt n is known to have reached}, for the `attempts` (their
    records, checked) whose instances said so: the larger of the steps in its progress record
    (attempts/<n>/progress.json in `keys`: its run's last metrics row, its newest streamed
    checkpoint), and the step a later attempt resumed from a checkpoint it streamed (that
    attempt's record names it: resumed_attempt). An instance taken back without notice
    says nothing more after its last record: the step is how far it is known to have got."""
    out: dict[int, int] = {}

    def more(n: int, step: int | None) -> None:
        if step is not None and (n not in out or step > out[n]):
            out[n] = step

    for doc in attempts:
        n = doc["attempt"]
        key = auto_scaling.progress_key(prefix, n)
        if key in keys:
            rec = auto_scaling.check_progress(small_json(s3, bucket, key, keys[key], owner), n)
            if rec is not None:
                more(n, rec["step"])
                more(n, rec["checkpoint_step"])
    for doc in attempts:
        if doc.get("resumed_attempt") is not None:
            more(doc["resumed_attempt"], doc.get("resumed_step"))
    return out
