"""The stager's plan, checked, and how a staging failure is said.

Standard library only, Python 3.8+; shipped beside stager.py (see stager.py for the plan's
shape and the command). Imports shards and stage_errors (StageError, reason: kept apart so that the
signer needs nothing else) and nothing else of ours (stage_errors <- stage_plan <- stage_fetch
<- stage_run <- stager; stage_plan <- stage_disk <- stager; stage_errors <- awsapi).

    check_plan(plan) -> [dataset]   every field the stager reads checked; StageError otherwise
    StageError                      a one-line reason staging failed
    reason(exc), disk_reason(exc)   an exception said in one line
"""

import json
import os
import re

from . import shards
from .stage_errors import StageError, reason  # noqa: F401 - said from here too

PLAN_VERSION = 1
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
HEX = re.compile(r"[0-9a-f]+")
MD5 = re.compile(r"[0-9a-f]{32}")


def disk_reason(exc: OSError) -> str:
    where = getattr(exc, "filename", None) or "disk"
    return "cannot write %s: %s" % (where, exc.strerror or exc)


# -- the plan -----------------------------------------------------------------------------


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise StageError("plan: " + what)


def _is_int(v, low: int, high: int) -> bool:
    return type(v) is int and low <= v <= high


def check_plan(plan) -> list:
    """Copies of the plan's datasets (shards ones with their parsed manifest as "_manifest"),
    every field this stager reads checked; StageError otherwise."""
    _need(isinstance(plan, dict), "not a JSON object")
    _need(plan.get("version") == PLAN_VERSION and type(plan.get("version")) is int,
          "version is not %d (a newer cloudtrain wrote it?)" % PLAN_VERSION)
    _need(_is_int(plan.get("workers"), 1, 256), "workers is not an integer from 1 to 256")
    _need(_is_int(plan.get("part_bytes"), 1 << 20, shards.MAX_OBJECT_BYTES),
          "part_bytes is not an integer of at least 1048576")
    p = plan.get("progress_s", 5)
    _need(type(p) in (int, float) and 0 < p <= 86400, "progress_s is not a positive number")
    scratch = _check_scratch(plan.get("scratch"))
    datasets = plan.get("datasets")
    _need(isinstance(datasets, list), "datasets is not a list")
    names = set()
    checked = []
    for i, d in enumerate(datasets):
        where = "dataset %d: " % i
        _need(isinstance(d, dict), where + "not an object")
        d = dict(d)  # the caller's plan is left as it was
        checked.append(d)
        name = d.get("name")
        _need(isinstance(name, str) and NAME.fullmatch(name) is not None,
              where + "name is not like [a-z0-9][a-z0-9_.-]*")
        where = "dataset %s: " % name
        _need(name not in names, where + "named twice")
        names.add(name)
        dest = d.get("dest")
        _need(isinstance(dest, str) and os.path.isabs(dest) and "\x00" not in dest
              and os.path.normpath(dest) != "/", where + "dest is not an absolute path")
        kind = d.get("kind")
        _need(kind in ("shards", "objects", "path"), where + "kind is not shards, objects or path")
        if kind == "path":
            _need(isinstance(d.get("path"), str) and os.path.isabs(d["path"]),
                  where + "path is not an absolute path")
            _need(isinstance(d.get("preread", False), bool), where + "preread is not true/false")
            continue
        _check_s3(plan, d, where)
        _check_scratch_dest(scratch, d, where)
        if kind == "shards":
            _check_shards(d, where)
        else:
            _check_objects(d, where)
    return checked


def _below(path, folder: str) -> bool:
    return isinstance(path, str) and os.path.isabs(path) and "\x00" not in path and \
        os.path.normpath(path).startswith(os.path.normpath(folder) + "/")


def _check_scratch(scratch):
    """The plan's local disk for the copies ({mount, dir}: the folder below the mount), or
    None."""
    if scratch is None:
        return None
    _need(isinstance(scratch, dict), "scratch is not an object")
    mount = scratch.get("mount")
    _need(isinstance(mount, str) and os.path.isabs(mount) and "\x00" not in mount
          and os.path.normpath(mount) != "/", "scratch mount is not an absolute path")
    _need(_below(scratch.get("dir"), mount), "scratch dir is not a folder below its mount")
    return scratch


def _check_scratch_dest(scratch, d: dict, where: str) -> None:
    """An S3 dataset's copy on the plan's local disk (scratch_dest, need_bytes), if any."""
    if "scratch_dest" in d:
        _need(scratch is not None, where + "scratch_dest without a scratch")
        _need(_below(d["scratch_dest"], scratch["dir"]),
              where + "scratch_dest is not a folder below the scratch dir")
    if "need_bytes" in d:
        _need(_is_int(d["need_bytes"], 0, 1 << 62), where + "need_bytes is not a size")


def _check_s3(plan: dict, d: dict, where: str) -> None:
    """The fields of a dataset read from S3 (kinds shards and objects)."""
    for key in ("bucket", "region"):
        _need(isinstance(d.get(key), str) and d[key] != "", where + key + " is not a name")
    _need(isinstance(d.get("prefix", ""), str), where + "prefix is not a string")
    ep = d.get("endpoint")
    _need(ep is None or (isinstance(ep, str) and ep.startswith(("http://", "https://"))),
          where + "endpoint is not null or an http(s) URL")
    auth = d.get("auth")
    _need(auth in ("presigned", "role"), where + "auth is not presigned or role")
    if auth == "role":
        _need(isinstance(plan.get("imds_url"), str)
              and plan["imds_url"].startswith(("http://", "https://")),
              "imds_url is not an http URL (auth role needs it)")
    ident = d.get("identity")
    _need(isinstance(ident, str) and HEX.fullmatch(ident) is not None,
          where + "identity is not hex")


def _check_shards(d: dict, where: str) -> None:
    """A shards dataset: its manifest (parsed into "_manifest"), and a URL per shard when
    presigned."""
    try:
        d["_manifest"] = shards.Manifest.from_json(json.dumps(d.get("manifest")))
    except ValueError as exc:
        raise StageError("plan: " + where + str(exc)) from None
    if d["auth"] == "presigned":
        urls = d.get("shard_urls")
        _need(isinstance(urls, list) and len(urls) == len(d["_manifest"].shards)
              and all(isinstance(u, str) and u.startswith(("http://", "https://"))
                      for u in urls),
              where + "shard_urls is not one URL per manifest shard")


def _check_objects(d: dict, where: str) -> None:
    """An objects dataset: each object's key, safe path (once), size, md5 and URL."""
    objs = d.get("objects")
    _need(isinstance(objs, list), where + "objects is not a list")
    seen = set()
    for j, o in enumerate(objs or ()):  # a list: checked above
        w = where + "object %d: " % j
        _need(isinstance(o, dict), w + "not an object")
        _need(isinstance(o.get("key"), str) and o["key"] != "", w + "key is not a string")
        _need(isinstance(o.get("path"), str), w + "path is not a string")
        why = shards.safe_member(o["path"])
        if why:
            raise StageError("plan: %sunsafe path %r: %s" % (w, o["path"][:200], why))
        _need(o["path"] not in seen, w + "path %r listed twice" % o["path"][:200])
        seen.add(o["path"])
        _need(_is_int(o.get("bytes"), 0, shards.MAX_OBJECT_BYTES),
              w + "bytes is not a size")
        md5 = o.get("md5")
        _need(md5 is None or (isinstance(md5, str) and MD5.fullmatch(md5) is not None),
              w + "md5 is not null or 32 lowercase hex digits")
        if d["auth"] == "presigned":
            _need(isinstance(o.get("url"), str)
                  and o["url"].startswith(("http://", "https://")),
                  w + "url is not an http(s) URL")
    _file_and_folder(where, d["bucket"], objs or [])


def _file_and_folder(where: str, bucket: str, objects: list) -> None:
    """Two objects where one needs the other's path as a folder (keys `p/a` and `p/a/b`, which
    S3 allows): no disk can hold both. StageError naming them."""
    keys = {o["path"]: o["key"] for o in objects}
    for path in keys:
        parts = path.split("/")
        for n in range(1, len(parts)):
            folder = "/".join(parts[:n])
            if folder in keys:
                raise StageError("plan: %sobjects s3://%s/%s and s3://%s/%s: %s needs %s as a "
                                 "folder, and %s is a file" % (
                                     where, bucket, keys[folder][:300], bucket, keys[path][:300],
                                     path[:300], folder[:300], folder[:300]))
