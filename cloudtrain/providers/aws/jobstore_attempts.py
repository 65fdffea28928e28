"""Reading back what the instances of a job run by an Auto Scaling group record of its attempts
in the S3 job store (the records, their keys, writers and checkers are host/job_records.py's,
the same on the instance; group_launch.py's group_record and follow_nodes read them here for
lifecycle/autoscaled.py):

    records(s3, bucket, prefix, owner)          {"attempts", "reached", "switched", "final"},
                                                all checked
    members(s3, bucket, prefix, n, nodes, owner)    attempt n's nodes as their records say
    attempt_keys(s3, bucket, prefix, owner)     {key: size} below the job's attempts/, bounded
    small_json(s3, bucket, key, size, owner)    one record, at most RECORD_MAX_BYTES, or None
    reached(s3, bucket, prefix, keys, owner, attempts)   {n: the last step attempt n reached}

Nothing read from the bucket is trusted: every instance of the job (and whoever read its
grant) could have written any key below its prefix. The listing stops at MAX_OBJECTS keys;
only the keys of the records asked for are read, each bounded, at most MAX_ATTEMPTS of them,
and each record goes through its one checker (job_records.check_*), under its own key only.
boto3 is never imported here: the caller's client does the calls.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from ...host import job_records
from ...host.job_records import RECORD_MAX_BYTES
from .jobstore import MAX_OBJECTS, list_keys, owner_check

if TYPE_CHECKING:
    from ...host.job_records import Attempt


def attempt_keys(s3, bucket: str, prefix: str, owner: str | None) -> dict[str, int]:
    """{key: size} of the objects below the job's attempts/: its attempts' records, their
    progress, and the nodes' records of a regroup (host/regroup.py). At most MAX_OBJECTS: a
    job's attempts leave far fewer, and a listing is never read without end."""
    return dict(itertools.islice(list_keys(s3, bucket, prefix + job_records.ATTEMPTS, owner),
                                 MAX_OBJECTS))


def records(s3, bucket: str, prefix: str, owner: str | None) -> dict:
    """What the job's instances recorded: {"attempts": [each attempt's record, checked, by
    n], "reached": {n: step} (reached), "switched": {n: attempt n's switch of the group to
    on-demand}, "final": the job's end, checked, or None}."""
    keys = attempt_keys(s3, bucket, prefix, owner)
    found = []
    for key, size in sorted(keys.items()):
        n = job_records.attempt_of(prefix, key)
        if n is None:
            continue  # a progress record, a node's record of a regroup
        attempt = job_records.check_attempt(small_json(s3, bucket, key, size, owner), n)
        if attempt is not None:
            found.append(attempt)
        if len(found) >= job_records.MAX_ATTEMPTS:
            break
    found.sort(key=lambda a: a["attempt"])
    final_key = job_records.final_key(prefix)
    final = dict(list_keys(s3, bucket, final_key, owner))
    switched = {}
    for a in found:  # an attempt's instance that set the group to on-demand (a deadline)
        key = job_records.switch_key(prefix, a["attempt"])
        if key in keys:
            doc = job_records.check_switch(small_json(s3, bucket, key, keys[key], owner),
                                           a["attempt"])
            if doc is not None:
                switched[a["attempt"]] = doc
    return {"attempts": found, "reached": reached(s3, bucket, prefix, keys, owner, found),
            "switched": switched,
            "final": job_records.check_final(small_json(s3, bucket, final_key,
                                                        final[final_key], owner))
            if final_key in final else None}


def members(s3, bucket: str, prefix: str, n: int, nodes: int, owner: str | None) -> list:
    """Attempt n's nodes as their records say (attempts/<n>/<instance>.json, each checked,
    under its own instance's name), at most MAX_ATTEMPTS records read."""
    folder, found = job_records.attempt_folder(prefix, n), []
    listed = dict(itertools.islice(list_keys(s3, bucket, folder, owner), MAX_OBJECTS))
    for key, size in sorted(listed.items())[:job_records.MAX_ATTEMPTS]:
        named = job_records.member_of(folder, key)
        doc = job_records.check_member(small_json(s3, bucket, key, size, owner), nodes) \
            if named else None
        if doc is not None and doc["instance"] == named:
            found.append(doc)
    return found


def small_json(s3, bucket: str, key: str, size: int, owner: str | None):
    """The JSON object at `key` (job_records.read_record), or None where it is too large or
    not one; for a checker to take or refuse."""
    if size > RECORD_MAX_BYTES:
        return None
    body = s3.get_object(Bucket=bucket, Key=key, **owner_check(owner))["Body"]
    return job_records.read_record(body.read(RECORD_MAX_BYTES + 1))


def reached(s3, bucket: str, prefix: str, keys: dict[str, int], owner: str | None,
            attempts: list[Attempt]) -> dict[int, int]:
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
        key = job_records.progress_key(prefix, n)
        if key in keys:
            rec = job_records.check_progress(small_json(s3, bucket, key, keys[key], owner), n)
            if rec is not None:
                more(n, rec["step"])
                more(n, rec["checkpoint_step"])
    for doc in attempts:
        resumed = doc["resumed_attempt"]
        if resumed is not None:
            more(resumed, doc["resumed_step"])
    return out
