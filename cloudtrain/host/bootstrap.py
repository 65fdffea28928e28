"""An instance that starts its job by itself, from the job's bundle in the job store.

Standard library only, Python 3.8+; shipped beside agent.py (and run from a copy fetched by the
instance's user-data). Imports bundle_reader (the bundle read with the role and checked: its
layout, manifest, objects and archive), awsapi (the role's credentials), auto_scaling and
agent_upload (a group's records and end), safefile, checkpoint_manifest and checkpoint_restore
(the latest checkpoint, restored as a relaunch's run.sh restores it), job_records (the job
store's records of a group's job: each one's writer and checker), and nothing else of ours.

    python3 bootstrap.py --bucket B --prefix jobs/<owner>/<job>/ --jobdir DIR --region R
                         [--endpoint URL] [--imds URL] [--group NAME]

The orchestrator (providers/aws/jobbundle.py) uploads at launch, under the job's prefix:

    bundle/files.tar        the files launch syncs (recipe, shared code, workdir), one tar
    bundle/job/<name>       run.sh, job.json, setup.sh, the stager's plan, as launch wrote them
    bundle/agent/<name>.py  the host-side files (hosts.host_files())
    bundle/start.sh         the line that starts the agent in tmux (Host.start_command)
    bundle/manifest.json    last: each object's name, size and sha256, the archive's file count
                            and bytes, the job directory the scripts were written for

This reads them with the instance role's credentials (IMDSv2; no AWS keys on the instance):
(bundle_reader.py) the manifest (at most MANIFEST_MAX_BYTES), then each object into <jobdir>/.bundle/, its size
checked before (the manifest's bound) and while it comes (no byte more than listed), and its
sha256 after. Only once every object is verified: the archive is checked member by member
(regular files only, relative names without `..`, NUL or newlines, no more files or bytes than
the manifest says) and unpacked into the job directory without following any link, the job's
files put beside it, the agent's files in its directory; then the latest checkpoint slot the job
streamed (stream/latest.json) is restored (checkpoint_restore.restore, each GET signed with the
role) and job.json's checkpoint stream goes on from it; then start.sh runs. Nothing of the
bundle is trusted until its sha256 matches: whoever can write under the job's prefix could have
written anything there. An instance of a group is told the manifest's own sha256 by its user-data
(--manifest-sha256; the launch adds it to the group's template once the bundle is up, and only
the launching principal may change the template), so such a writer cannot change the code a
replacement runs either: another manifest ends the job (EXIT_MANIFEST) and nothing of it runs.

A job run by an Auto Scaling group (job.json's "auto_scaling", host/auto_scaling.py): before
the restore, final.json in the job store means the job has ended: the group and its launch
template are deleted, the instance powers off, and nothing runs (EXIT_ENDED). Else the attempts
recorded there are counted; past job.json's max_restarts, final.json says preempted and the
same end follows (EXIT_RESTARTS); otherwise attempts/<n>.json records this instance, the job's
env says CLOUDTRAIN_ATTEMPT=n, and a restored checkpoint leaves the RESUME marker that run.sh
turns into the recipe's resume argument.

Every failure prints one line on stderr, writes <jobdir>/bootstrap-status.json saying why, and
exits with its own code (EXIT_*); the agent is never started on a partial or unverified bundle.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from . import (agent_upload, auto_scaling, checkpoint_manifest, checkpoint_restore,
               job_records, regroup, safefile)
from .bundle_reader import (  # noqa: F401 - the layout and codes are said from here too
    AGENT_DIR, AGENT_START_S, ARCHIVE, BUNDLE, Bundle, EXIT_AGENT, EXIT_ARCHIVE,
    EXIT_CREDENTIALS, EXIT_ENDED, EXIT_GRANT, EXIT_MANIFEST, EXIT_OBJECT, EXIT_RESTARTS,
    EXIT_RESTORE, EXIT_STORE, EXIT_SWITCHED, EXIT_USAGE, EXIT_WRITE, FILE_MAX_BYTES, Failed,
    IMDS_URL, JOB_DIR, MANIFEST, MANIFEST_MAX_BYTES, MANIFEST_POLL_S, PREFIX,
    RESUME, SHA256, STAGING, START, STATUS_FILE, VERSION, check_archive, check_manifest,
    check_name, unpack)
from .awsapi import RoleCredentials, object_url


def _job_root(jobdir):
    """The job directory, made (its parents with makedirs: they are the instance's own, named
    by user-data), refused where it is a link or not a folder."""
    parent, name = os.path.split(jobdir.rstrip("/"))
    os.makedirs(parent, exist_ok=True)
    return safefile.make_folders(parent, [name])


def write_status(jobdir, status):
    try:
        safefile.write_json(os.path.join(jobdir, STATUS_FILE), status)
    except OSError:
        pass


def start_agent(jobdir, start_sh, timeout_s=AGENT_START_S):
    """Run start.sh (Host.start_command's line: tmux new-session, printing the pane's pid),
    then wait until status.json names that pid as the agent's, as Host.start_agent does."""
    try:
        done = subprocess.run(["sh", start_sh], cwd=jobdir, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Failed(EXIT_AGENT, "start.sh did not run: %s" % exc) from None
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise Failed(EXIT_AGENT, "start.sh exited with %d: %s" % (done.returncode, tail[0][:300]))
    out = done.stdout.decode("ascii", "replace").strip()
    pid = int(out) if out.isdigit() else None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = safefile.read_json(os.path.join(jobdir, "status.json"), 1 << 20)
        if isinstance(status, dict) and status.get("agent_pid") and \
                pid in (None, status.get("agent_pid")):
            return pid
        time.sleep(0.05)
    raise Failed(EXIT_AGENT, "the agent wrote no status.json in %.0f s (see %s/agent.err)"
                 % (timeout_s, jobdir))


def restore_latest(bundle, root):
    """The latest checkpoint slot the job streamed to its job store, restored into the job
    directory by checkpoint_restore.restore (the relaunch's restore step: every file checked
    against its size and sha256, swapped in only once all are), each GET signed with the role;
    job.json's checkpoint stream then goes on after it (its seq and slot), as a relaunch's
    does. The restore's status, with "attempt": the attempt that streamed the checkpoint;
    None when nothing was streamed yet: the job starts over."""
    stream = bundle.prefix + checkpoint_manifest.STREAM
    doc = bundle.get_json(stream + checkpoint_manifest.LATEST,
                          checkpoint_manifest.MANIFEST_MAX_BYTES, EXIT_RESTORE,
                          denied_is_missing=True)
    if doc is None:
        return None
    why = checkpoint_manifest.check_manifest(doc)
    if why is not None:
        raise Failed(EXIT_RESTORE, "the stored checkpoint's latest.json: %s" % why)
    job_path = os.path.join(root, "job.json")
    job = safefile.read_json(job_path, FILE_MAX_BYTES)
    if not isinstance(job, dict) or doc.get("job_id") != job.get("job_id"):
        raise Failed(EXIT_RESTORE, "the stored checkpoint is job %r's, not this job's"
                     % str(doc.get("job_id"))[:100])
    slot = "%s%s/" % (stream, doc["slot"])
    files = doc["files"]
    if ((job.get("auto_scaling") or {}).get("rank") or 0) != 0:
        # node 0's log and metrics are the job's: the other ranks take its checkpoint only
        files = [f for f in files if f["path"] not in checkpoint_manifest.LOGS]
    plan = dict(doc, bytes=sum(f["size"] for f in files),
                files=[dict(item, url=object_url(bundle.bucket, slot + item["path"],
                                                 bundle.region, bundle.endpoint))
                       for item in files])
    plan_path = os.path.join(root, checkpoint_manifest.RESTORE_PLAN)
    safefile.write_json(plan_path, plan)
    status = checkpoint_restore.restore(plan_path, root, sign=bundle.sign)
    if not status.get("ok"):
        raise Failed(EXIT_RESTORE, "restoring checkpoint %s failed: %s"
                     % (doc.get("seq"), status.get("error")))
    status["attempt"] = doc.get("attempt")  # the attempt that streamed it (checked: int or null)
    stream_settings = job.get("checkpoint_stream")
    if isinstance(stream_settings, dict):
        job["checkpoint_stream"] = dict(stream_settings, start_seq=doc["seq"],
                                        start_slot=doc["slot"])
        safefile.write_atomic(job_path, json.dumps(job, indent=1).encode())
    return status


def wait_for_manifest(bundle, wait_s, pin=None):
    """The bundle's manifest once it is there (the launch uploads it once the job's files are
    written), asked every MANIFEST_POLL_S for up to `wait_s`; Failed after that, or at once
    for one whose sha256 is not `pin`."""
    deadline = time.time() + wait_s
    while True:
        doc = bundle.manifest(pin, missing=None)
        if doc is not None:
            return doc
        if time.time() >= deadline:
            raise Failed(EXIT_MANIFEST, "no bundle in the job store after %.0f s: the launch "
                         "did not finish" % wait_s)
        time.sleep(MANIFEST_POLL_S)


def group_settings(root, bucket, prefix, group=None):
    """(job.json, its auto_scaling checked) of the unpacked bundle; (job, None) for a job not
    run by a group. `group` (user-data's --group, which names the group to end where the
    bundle cannot be read) must agree with it; its max_restarts is the count."""
    job = safefile.read_json(os.path.join(root, "job.json"), FILE_MAX_BYTES)
    if not isinstance(job, dict):
        raise Failed(EXIT_MANIFEST, "the bundle's job.json is not a JSON object")
    try:
        conf = auto_scaling.settings(job)
    except auto_scaling.Invalid as exc:
        raise Failed(EXIT_MANIFEST, "the bundle's job.json: %s" % exc) from None
    if conf is None:
        if group is not None:
            raise Failed(EXIT_USAGE, "--group %s, but the bundle's job.json has no "
                         "auto_scaling: not a job run by a group" % group)
        return job, None
    for name, given in (("group", group), ("prefix", prefix), ("bucket", bucket)):
        if given is not None and conf[name] != given:
            raise Failed(EXIT_USAGE, "--%s %s, but the bundle's job.json says %s"
                         % (name, given, conf[name]))
    return job, conf


def power_off(job, root):
    """job.json's shutdown_command (the agent's power-off; the lab's names a recorder);
    None when it ran, else the line saying why not."""
    command = job.get("shutdown_command")
    if not command:
        return "no shutdown_command in job.json: the instance stays up"
    if not isinstance(command, str):
        return "job.json's shutdown_command is not a command: the instance stays up"
    try:
        code = subprocess.call(command, shell=True, stdin=subprocess.DEVNULL, timeout=60,
                               env=dict(os.environ, CLOUDTRAIN_JOB_DIR=root))
    except (OSError, subprocess.SubprocessError) as exc:
        return "the power-off did not run: %s" % exc
    return None if code == 0 else "the power-off exited with %d" % code


def end_here(bundle, conf, job, root, code, line):
    """Nothing is to run here: the job's group and launch template deleted (AWS starts no
    more), the power-off, and Failed(code) with `line` and what of that failed."""
    try:
        steps = auto_scaling.end_group(conf, bundle.creds)
    except Exception as exc:  # a bug must not keep the power-off from coming
        steps = [("end group", False, "ending group %s failed: %s: %s"
                  % (conf["group"], type(exc).__name__, exc))]
    failed = [text for _, ok, text in steps if not ok]
    off = power_off(job, root)
    raise Failed(code, "; ".join([line] + failed + ([off] if off else [])))


def store_record(job, key, doc, prefix=None):
    """`doc` at `key` in the job store, through job.json's results grant (the role may not
    write there: only the launch's presigned POST may). A grant past its end, or one S3
    refuses, is EXIT_GRANT: every instance of the group would meet it (GIVE_UP); a store that
    does not answer, EXIT_STORE. `prefix`: the job's, for a node of rank k > 0 whose grant
    says nodes/<k>/ (every node of a group holds the job-wide grant: host/regroup.py)."""
    grant = job.get("results_store")
    if not agent_upload.writable(grant):
        raise Failed(EXIT_STORE, "no results_store grant in job.json to write %s with" % key)
    if prefix is not None:
        grant = dict(grant, prefix=prefix)
    ends = grant.get("expires_at")
    if isinstance(ends, (int, float)) and not isinstance(ends, bool) and ends < time.time():
        raise Failed(EXIT_GRANT, "the job's upload grant ended at %s: %s cannot be written, "
                     "nor any checkpoint or result" % (time.strftime(
                         "%Y-%m-%d %H:%M:%S UTC", time.gmtime(ends)), key))
    try:
        agent_upload.post_json(grant, key, doc)
    except (agent_upload.UploadError, agent_upload.FileUnreadable) as exc:
        code = EXIT_GRANT if str(exc).startswith("S3 refused the upload grant (403") \
            else EXIT_STORE
        raise Failed(code, "%s could not be written: %s" % (key, exc)) from None


def take_attempt(bundle, conf, job, root, imds):
    """This instance's attempt at a job run by a group: EXIT_ENDED when final.json is there
    (whatever it holds: its presence is the end), EXIT_RESTARTS when its attempts are past
    max_restarts (final.json written, preempted), both after ending the group and powering
    off. Else the attempt recorded (attempts/<n>.json, read back: a role that cannot read it
    would count 1 for ever) and (n, its record) returned. Attempts are counted by GETs of 1, 2, ... until
    one is missing (403 too: the role may not list), at most max_restarts + 1 of them."""
    prefix, limit = conf["prefix"], job_records.RECORD_MAX_BYTES
    where = "s3://%s/%s" % (conf["bucket"], prefix)
    data = bundle.get_bytes(job_records.final_key(prefix), limit, EXIT_STORE,
                            denied_is_missing=True)
    if data is not None:
        final = job_records.check_final(job_records.read_record(data))
        end_here(bundle, conf, job, root, EXIT_ENDED, "the job has ended (%s, %s%s): nothing "
                 "to run" % (final["state"] if final else "its record unreadable", where,
                             job_records.FINAL))
    ident = auto_scaling.identity(imds)
    last, last_doc, most = 0, None, conf["max_restarts"] + 1
    while last < most:
        data = bundle.get_bytes(job_records.attempt_key(prefix, last + 1), limit, EXIT_STORE,
                                denied_is_missing=True)
        if data is None:
            break
        last, last_doc = last + 1, job_records.check_attempt(job_records.read_record(data),
                                                             last + 1)
    if last and ident["instance"] and last_doc is not None \
            and last_doc["instance"] == ident["instance"]:
        return last, last_doc  # this instance's own, recorded already (the launch's, a reboot's)
    n = last + 1
    if n - 1 > conf["max_restarts"]:
        reason = job_records.restarts_used(conf["max_restarts"])
        store_record(job, job_records.final_key(prefix), job_records.final_doc(
            "preempted", None, reason, n - 1, ident["instance"]))
        end_here(bundle, conf, job, root, EXIT_RESTARTS, "the job is over: %s; final.json "
                 "says preempted" % reason)
    key = job_records.attempt_key(prefix, n)
    doc = job_records.attempt_doc(n, ident)
    store_record(job, key, doc)
    bundle.get_bytes(key, limit, EXIT_STORE, "written just now, but the instance role cannot "
                     "read it back: it needs s3:GetObject on jobs/*/attempts/* "
                     "(infra/instance-role-policy.json), or attempts are never counted")
    return n, doc


def set_attempt(root, job, n):
    """job.json as the agent reads it for attempt n: CLOUDTRAIN_ATTEMPT in the job's env,
    the checkpoint stream's attempt."""
    env = job.get("env") if isinstance(job.get("env"), dict) else {}
    job["env"] = dict(env, CLOUDTRAIN_ATTEMPT=str(n))
    if isinstance(job.get("checkpoint_stream"), dict):
        job["checkpoint_stream"] = dict(job["checkpoint_stream"], attempt=n)
    safefile.write_atomic(os.path.join(root, "job.json"), json.dumps(job, indent=1).encode())


def join_attempt(bundle, root, job, n, conf=None, record=None):
    """This node's part in attempt n: job.json written for it (CLOUDTRAIN_ATTEMPT=n), the
    latest streamed checkpoint restored and its RESUME marker left for run.sh; with `conf`
    and this instance's attempt `record`, the record says where it resumed (the step, the
    checkpoint's seq and the attempt that streamed it). The job.json
    now on disk and the checkpoint restored (None: nothing was streamed yet)."""
    try:
        if n is not None:
            set_attempt(root, job, n)
        os.unlink(os.path.join(root, RESUME))  # from a run before, on this disk
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise Failed(EXIT_WRITE, "cannot write job.json or clear %s: %s" % (RESUME, exc)) \
            from None
    restored = restore_latest(bundle, root)
    if restored:  # run.sh adds the recipe's resume argument (scripts.run_script)
        safefile.write_json(os.path.join(root, RESUME), {
            "attempt": n, "seq": restored.get("seq"), "step": restored.get("step")})
        if conf is not None and isinstance(record, dict) and n > 1 \
                and record.get("attempt") == n:
            # the attempt's record says where it resumed (the launching machine's attempts
            # table shows it); a failure to say so costs only that line
            try:
                store_record(job, job_records.attempt_key(conf["prefix"], n),
                             job_records.attempt_doc(n, record, record.get("by"),
                                                     record.get("started_at"), restored),
                             prefix=conf["prefix"])
            except Failed:
                pass
    return safefile.read_json(os.path.join(root, "job.json"), FILE_MAX_BYTES), restored


def meet_others(bundle, conf, job, n, imds):
    """A new node of a job on several nodes (a replacement): it meets the others at attempt n
    or a newer one (host/regroup.py); its job.json for the rank it is given, and the attempt."""
    prefix = conf["prefix"]
    me = regroup.mine(auto_scaling.identity(imds), None)
    n, ranks = regroup.meet(bundle, regroup.records_grant(job, prefix), prefix, n,
                            conf["nodes"], me, regroup.group_peers(conf, bundle.creds))
    rank = next(m["rank"] for m in ranks if m["instance"] == me["instance"])
    return regroup.take_part(job, prefix, rank, ranks, me["iface"]), n


def switch_here(conf, job, root, n, imds):
    """A spot instance of the group past its deadline's switch (one that replaced an instance
    lost without a notice, or whose switch failed) runs nothing: its group set to on-demand
    (AWS then replaces it with an on-demand instance), the switch recorded as attempt n's,
    the power-off, and Failed(EXIT_SWITCHED). Where the switch is refused, the job runs
    here on spot rather than this instance and each replacement powering off in turn."""
    switched = auto_scaling.switch_for_deadline(conf, job, n, imds)
    if switched is None:
        return
    ok, line = switched
    if not ok:
        print("cloudtrain bootstrap: %s; the job runs on this spot instance" % line,
              file=sys.stderr)
        return
    off = power_off(job, root)
    raise Failed(EXIT_SWITCHED, "; ".join(
        [line + ": this spot instance runs nothing and powers off"] + ([off] if off else [])))


def enter_job(bundle, root, job, conf, imds):
    """This instance's part in the job whose files are in `root`: for a job run by a group
    (`conf`), its attempt taken (take_attempt) and, on several nodes, the others met; then
    job.json written for it and the latest checkpoint restored (join_attempt). Returns (the
    attempt or None, the checkpoint restored or None)."""
    attempt = record = None
    if conf is not None:
        attempt, record = take_attempt(bundle, conf, job, root, imds)
        switch_here(conf, job, root, attempt, imds)
        if conf["nodes"] > 1:
            job, attempt = meet_others(bundle, conf, job, attempt, imds)
    _, restored = join_attempt(bundle, root, job, attempt, conf, record)
    return attempt, restored


def bootstrap(bucket, prefix, jobdir, region, endpoint=None, imds=IMDS_URL, group=None,
              wait_s=0, pin=None):
    """Fetch, verify and unpack the job's bundle into `jobdir` (`pin`: the sha256 its manifest
    must have, so that a writer of the job's prefix cannot change what runs); for a job run by a group
    (job.json's auto_scaling), take this instance's attempt (take_attempt); then restore the
    latest checkpoint and start the agent. Returns the status written to
    <jobdir>/bootstrap-status.json; Failed on any failure. `wait_s`: an instance of the
    job's Auto Scaling group, which waits that long for the bundle, and leaves the job alone
    where the launching machine has written its files (the group's first instance)."""
    started = time.time()
    try:  # first: every later failure is said in its status file
        root = _job_root(jobdir)
    except OSError as exc:
        raise Failed(EXIT_WRITE, "cannot make %s: %s" % (jobdir, exc)) from None
    # Until the agent runs, this says the job directory is being filled, and by whom: a
    # probe from the launching machine (its `status`) must not take the job for one whose
    # agent never started while the checkpoint is restored (agent_control.probe).
    write_status(root, {"ok": None, "stage": "booting", "pid": os.getpid(), "at": started})
    bundle = Bundle(bucket, prefix, region, endpoint, imds)
    bundle.credentials()
    doc = bundle.manifest(pin) if not wait_s else wait_for_manifest(bundle, wait_s, pin)
    if wait_s and os.path.exists(os.path.join(root, "job.json")):
        # The group's first instance: the launching machine wrote the job's files here over
        # SSH before it uploaded the bundle, and starts the agent itself.
        status = {"ok": True, "stage": "started by the launching machine", "error": None,
                  "exit_code": 0, "seconds": round(time.time() - started, 3),
                  "at": time.time()}
        write_status(root, status)
        return status
    objects, counts, agent_dir = check_manifest(doc, jobdir)
    try:
        staging = safefile.make_folders(root, [STAGING])
        for name in os.listdir(staging):  # a bootstrap cut short before (a reboot)
            os.unlink(os.path.join(staging, name))
    except OSError as exc:
        raise Failed(EXIT_WRITE, "cannot prepare %s: %s" % (jobdir, exc)) from None
    local = {}
    for name, (size, digest) in sorted(objects.items()):
        local[name] = os.path.join(staging, name.replace("/", "~"))
        bundle.download(name, size, digest, local[name])
    members = check_archive(local[ARCHIVE], *counts)
    try:
        unpack(local[ARCHIVE], members, root)
        for name, path in local.items():
            if name.startswith(JOB_DIR):
                os.chmod(path, 0o600 if name.endswith(".json") else 0o700)
                os.replace(path, os.path.join(root, name[len(JOB_DIR):]))
        for name in ("checkpoints", "work"):
            safefile.make_folders(root, [name])
    except safefile.NotFolder as exc:
        raise Failed(EXIT_ARCHIVE, "cannot unpack below %s: %s is %s" % (
            jobdir, exc.filename, exc.what)) from None
    except OSError as exc:
        raise Failed(EXIT_WRITE, "cannot write the job's files: %s" % exc) from None
    job, conf = group_settings(root, bucket, prefix, group)
    attempt, restored = enter_job(bundle, root, job, conf, imds)
    try:  # last, outside the job directory: hosts.agent_dir, <root>/agent-<version>
        agent_root = os.path.join(os.path.dirname(os.path.dirname(root)), agent_dir)
        os.makedirs(agent_root, exist_ok=True)
        for name, path in local.items():
            if name.startswith(AGENT_DIR):
                folder, _, base = name[len(AGENT_DIR):].rpartition("/")
                into = safefile.make_folders(agent_root, [folder]) if folder else agent_root
                with open(path, "rb") as f:
                    safefile.write_atomic(os.path.join(into, base), f.read())
    except OSError as exc:
        raise Failed(EXIT_WRITE, "cannot write the agent's files: %s" % exc) from None
    pid = start_agent(root, local[START])
    status = {"ok": True, "stage": "started", "agent_pane_pid": pid, "attempt": attempt,
              "restored": restored and {k: restored.get(k) for k in
                                        ("seq", "slot", "step", "epoch", "files", "bytes",
                                         "attempt")},
              "files": len(members), "seconds": round(time.time() - started, 3),
              "error": None, "exit_code": 0, "at": time.time()}
    write_status(root, status)
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bootstrap.py", description=__doc__.split("\n")[0])
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--prefix", required=True, help="jobs/<owner>/<job>/")
    parser.add_argument("--jobdir", required=True, help="the job directory (absolute)")
    parser.add_argument("--region", required=True)
    parser.add_argument("--endpoint", default=None, help="an S3 endpoint URL (tests)")
    parser.add_argument("--imds", default=IMDS_URL, help="the metadata service (tests)")
    parser.add_argument("--group", default=None, help="the job's Auto Scaling group")
    parser.add_argument("--wait-s", type=float, default=0.0,
                        help="wait this long for the bundle (an Auto Scaling instance)")
    parser.add_argument("--manifest-sha256", default=None,
                        help="the sha256 of the bundle's manifest as launched")
    parser.add_argument("--end-group", action="store_true",
                        help="start nothing: the instance's power-off timer fired; record the "
                             "job's end and end its group (run by the watchdog, as root)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed its one usage line
        return EXIT_USAGE if exc.code else 0
    jobdir = args.jobdir
    try:
        if not os.path.isabs(jobdir) or check_name(jobdir.strip("/")) is not None:
            raise Failed(EXIT_USAGE, "--jobdir must be an absolute path without `..`")
        if not PREFIX.fullmatch(args.prefix):
            raise Failed(EXIT_USAGE, "--prefix must be jobs/<owner>/<job>/")
        if args.group is not None and not auto_scaling.GROUP.fullmatch(args.group):
            raise Failed(EXIT_USAGE, "--group must be an Auto Scaling group's name")
        pin = args.manifest_sha256
        if pin is not None and not SHA256.fullmatch(pin):
            raise Failed(EXIT_USAGE, "--manifest-sha256 must be 64 lowercase hex digits")
        if args.end_group:
            if args.group is None:
                raise Failed(EXIT_USAGE, "--end-group needs --group")
            here = os.path.isdir(jobdir) and not os.path.islink(jobdir)
            left = give_up(args, jobdir if here else None, WATCHDOG_REASON)
            sys.stderr.write("bootstrap: %s\n" % "; ".join(
                ["the power-off timer fired: the job's group is ended"] + left))
            return EXIT_STORE if left else 0
        bootstrap(args.bucket, args.prefix, os.path.normpath(jobdir), args.region,
                  args.endpoint, args.imds, args.group, max(0.0, args.wait_s), pin)
        return 0
    except Failed as exc:
        line = " ".join(str(exc).split())[:500]
        code = exc.code
    except Exception as exc:  # anything unforeseen still ends in one line and a status
        line = "%s: %s" % (type(exc).__name__, " ".join(str(exc).split())[:400])
        code = EXIT_WRITE
    here = os.path.isabs(jobdir) and os.path.isdir(jobdir) and not os.path.islink(jobdir)
    if args.group is not None and code in GIVE_UP and auto_scaling.GROUP.fullmatch(args.group):
        try:
            left = give_up(args, jobdir if here else None, COULD_NOT_START % line)
        except Exception as exc:  # noqa: BLE001 - the power-off (the boot script's) still comes
            left = ["giving up failed: %s: %s" % (type(exc).__name__, exc)]
        line = "; ".join([line, "the job is ended: no instance of its group can start it"]
                         + left)
    sys.stderr.write("bootstrap: %s\n" % line)
    if here:
        write_status(jobdir, {"ok": False, "stage": "failed", "error": line,
                              "exit_code": code, "at": time.time()})
    return code


# Failures every instance of a job's group would meet (the same bundle, checkpoint and grant):
# the job ends there rather than AWS starting one instance after another until the deadline.
# A store that does not answer (EXIT_STORE) may be a passing failure: that instance only
# powers off (the boot script), and the next one tries again.
GIVE_UP = (EXIT_MANIFEST, EXIT_OBJECT, EXIT_ARCHIVE, EXIT_RESTORE, EXIT_GRANT)


# What final.json says when an instance of a group cannot start the job (GIVE_UP)
COULD_NOT_START = "an instance of the job's Auto Scaling group could not start it: %s"
# What final.json says when the user-data's power-off timer fires on an instance of a group
# (a group that would otherwise start replacements into the same end): the agent, which ends
# the job at its max runtime, did not.
WATCHDOG_REASON = ("the max runtime passed and the instance's power-off timer fired (its agent "
                   "had not ended the job): the group is ended so that no replacement starts")


def give_up(args, jobdir, reason):
    """An instance of a job's group that cannot start it (a reason in GIVE_UP), or whose
    power-off timer fired (--end-group): the job recorded failed with `reason` (final.json,
    through the bundle's grant where its job.json was unpacked here), then its group and
    launch template deleted with the role. The power-off is the caller's. Returns what of
    that failed, in words."""
    left = []
    job = None
    if jobdir is not None and os.path.isfile(os.path.join(jobdir, "job.json")):
        job = safefile.read_json(os.path.join(jobdir, "job.json"), FILE_MAX_BYTES)
    if isinstance(job, dict):
        try:
            store_record(job, job_records.final_key(args.prefix), job_records.final_doc(
                "failed", None, reason, None, None))
        except Failed as exc:
            left.append(str(exc))
    conf = {"group": args.group, "region": args.region, "endpoint": args.endpoint}
    steps = auto_scaling.end_group(conf, RoleCredentials(args.imds))
    return left + [text for _, ok, text in steps if not ok]


if __name__ == "__main__":
    sys.exit(main())
