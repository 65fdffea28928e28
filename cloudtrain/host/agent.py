"""The on-host agent: runs one job inside tmux and keeps its job directory truthful.

Standard library only, Python 3.8+: it is copied to whatever host runs the job and started
with that host's python3, as the command of a tmux session:

    tmux -L cloudtrain new-session -d -s ct-<job> 'python3 agent.py run <jobdir>'

It knows nothing but its job directory:

    job.json        settings written by the orchestrator (max runtime, grace, shutdown, env)
    run.sh          the job's command (uploaded; never typed into tmux)
    status.json     state, pid, started_at, ended_at, exit_code, heartbeat_at, reason
    staging-status.json  the dataset copies run.sh makes before the job (stager.py)
    output.log      stdout + stderr of the job (also echoed to the tmux pane)
    metrics.jsonl   written by the job itself
    cancel          written by `agent.py stop`: the next SIGTERM is a user's cancel

Subcommands:
    run JOBDIR      start run.sh, pump its output, heartbeat, enforce the max runtime,
                    forward SIGTERM/SIGINT/SIGHUP to the job's process group, record the end
    probe JOBDIR    print one JSON object: status, the host's clock, the latest metrics row;
                    a job whose agent is gone is recorded as failed and its processes killed
    stop JOBDIR     ask the agent to stop the job (SIGTERM, then SIGKILL after the grace
                    period), wait for it, and print the final status (`--nowait 1`: only
                    ask, and print the status as it is)

The agent lives outside the job directory (`<root>/agent-<hash>/agent.py`, the launcher of
this module in the host package beside it: hosts.host_files), so a job that writes into its own directory cannot replace the
code that probes and stops it. Everything read back from the job directory (status.json,
metrics.jsonl, job.json) may have been written by the job: it is read under guard.

job.json keys that switch on more (absent: nothing happens):
    rearm           {"argv": [...], "start_minutes": N, "idle_minutes": M or null}: the host's
                    power-off backstop, re-armed for this job and, on a kept host, for its
                    idle time after the job
    results_store   an opaque grant for `agent_upload.upload_job(jobdir, grant)`, run after the
                    job ends and before the power-off wait
    checkpoint_stream  {"settle_s", "poll_s", "start_seq", "start_slot", "attempt"}: while the
                    job runs, each new checkpoint goes to the job store through the same grant
                    (checkpoint_stream.Streamer, beside us); at the end one last flush, before
                    the results. Recorded in status.json as `checkpoint_stream`
    collect_wait_s  how long to wait for the CLI's `collected` marker when there is no stored
                    copy of the results (default: shutdown_delay_s)
    auto_scaling    the job's Auto Scaling group (auto_scaling.settings): when the job has
                    truly ended (not preempted), after the checkpoint's last flush and the
                    results, final.json goes to the job store; before the power-off the
                    group and its launch template are deleted, so that AWS relaunches
                    nothing. A signal without `agent.py stop`'s cancel file is then the
                    instance going away (a reclaim without notice): preempted, not an end.
                    Rank 0 keeps how far the attempt got in the job store while it runs
                    (agent_progress: at most every 30 s, at a spot notice, at the run's end)

This module holds the agent's run and the command; probe and stop (the agent seen from outside)
are agent_control's. It imports agent_control, job_status (states, guarded reads),
job_processes (the job's processes), agent_store (the uploads to the job store) and safefile.
"""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

from . import safefile
from .agent_control import POLL_S, STAGING_STATUS, probe, stop
from .agent_store import StoreUploads, shipped
from .job_processes import (MAX_RECORDED_PIDS, PR_SET_CHILD_SUBREAPER, describe_exit,
                            descendants, prctl, proc_state, set_pdeathsig, signal_group)
from .job_status import (CANCELLED, FAILED, PREEMPTED, REGROUP, RUNNING, STARTING, STOPPED,
                         SUCCEEDED,
                         as_time, fmt_duration, now, read_json)

SPOT_POLL_S = 5.0  # AWS gives two minutes' notice; checking every 5 s leaves the job ~115 s
REARM_TIMEOUT_S = 60.0
WAIT_POLL_S = 0.5
SETUP_STATUS = "setup-status.json"  # written by run.sh when the job file's setup script fails


def spot_notice(imds_url, timeout=1.0):
    """The spot interruption notice from the instance metadata service (IMDSv2), or None.
    404 on spot/instance-action means no interruption is scheduled."""
    awsapi = shipped("awsapi")
    try:
        token = awsapi.imds_token(imds_url, 300, timeout)
        return json.loads(awsapi.imds_get(imds_url, "meta-data/spot/instance-action", token,
                                            timeout).decode())
    except (OSError, ValueError):
        return None


class Agent:
    """One job's run in its job directory, from run.sh's start to the power-off."""

    def __init__(self, jobdir):
        self.jobdir = os.path.abspath(jobdir)
        self.settings = read_json(self.path("job.json"), {}) or {}
        self.heartbeat_s = as_time(self.settings.get("heartbeat_s"), 2.0)
        self.grace_s = as_time(self.settings.get("grace_s"), 30.0)
        self.max_runtime_s = self.settings.get("max_runtime_s")
        self.status = {}
        self.stop_reason = None  # why we are stopping the job, once we are
        self.stop_state = None
        self.stop_grace = None  # `stop --grace`'s, over job.json's grace_s
        self.kill_at = None
        self.proc = None
        self.held_end = None  # a run's end while regroup.Team decides what it means
        self.first_run_at = None  # the max runtime counts from here, across regroups
        self.restarts_used = False  # a regroup found --max-restarts used: preempted, and over
        self.team_now = None  # regroup.Team, for a node of a job on several nodes of a group
        self.lock = threading.Lock()
        self.store = StoreUploads(self)  # checkpoints and results to the job store
        self.budget = None  # budget.Keeper, where job.json sets a budget

    def path(self, name):
        return os.path.join(self.jobdir, name)

    def write_status(self, **fields):
        with self.lock:
            self.status.update(fields)
            self.status["heartbeat_at"] = now()
            safefile.write_json(self.path("status.json"), self.status)

    def log_line(self, text):
        """A line of the agent's own in output.log (where the user looks first)."""
        try:
            with open(self.path("output.log"), "ab") as f:
                f.write(("cloudtrain agent: %s\n" % text).encode("utf-8", "replace"))
        except OSError:
            pass

    def beat(self):
        """Heartbeat, with the job's processes as they are now: if the agent is killed, the
        probe kills these (those that called setsid too), matched by start time."""
        procs = descendants(os.getpid(), with_start=True)[:MAX_RECORDED_PIDS]
        self.write_status(descendants=procs)

    # -- signals --------------------------------------------------------------------------

    def on_signal(self, signum, frame):
        if self.stop_reason is None:
            if os.path.exists(self.path("cancel")):
                self.request_stop(CANCELLED, "cancelled by user", self.cancel_grace())
            elif self.settings.get("auto_scaling") is not None:
                # AWS reclaims a spot instance without notice by shutting it down: systemd's
                # SIGTERM reaches us. Only `stop` (down) writes the cancel file, so any
                # other signal is the instance going away, and its group's replacement
                # resumes the job: no final.json, the group is kept.
                self.request_stop(PREEMPTED, "agent received %s without a cancel: the "
                                  "instance is going away" % signal.Signals(signum).name)
            else:
                self.request_stop(CANCELLED, "agent received %s" % signal.Signals(signum).name)
        elif signum == signal.SIGINT:
            self.kill_at = now()  # a second Ctrl-C in the pane: no more grace

    def signal_job(self, sig):
        """The job's process group, and every process below the agent that left it: torchrun
        starts each rank in a session of its own, and an orphan whose parent died is
        re-parented to the agent (a child subreaper), so none escapes."""
        if self.proc is None:
            return
        signal_group(self.proc.pid, sig)
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def reap_orphans(self):
        """Collect the exit status of re-parented orphans (not the job's own bash, which
        Popen waits for), so none stays a zombie."""
        assert self.proc is not None  # called once run.sh started
        for pid in descendants(os.getpid()):
            if pid != self.proc.pid and "zombie" in proc_state(pid):
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def cancel_grace(self):
        """The grace period `stop` was given (`cloudtrain down --grace`), written into the
        cancel file; None: the launch's (job.json)."""
        request = read_json(self.path("cancel"))
        grace = as_time(request.get("grace_s")) if isinstance(request, dict) else None
        return grace if grace is not None and grace >= 0 else None

    def request_stop(self, state, reason, grace_s=None):
        self.stop_state, self.stop_reason, self.stop_grace = state, reason, grace_s
        self.signal_job(signal.SIGTERM)
        self.kill_at = now() + (self.grace_s if grace_s is None else grace_s)

    def watch_spot(self):
        """On a spot instance: when AWS announces the interruption, stop the job (SIGTERM, so
        the recipe checkpoints) and record it as preempted, inside the two minutes' notice."""
        url = self.settings.get("imds_url")
        while url and self.proc is not None and self.proc.poll() is None:
            notice = spot_notice(url)
            if notice and self.stop_reason is None:
                self.write_status(interruption=dict(notice, noticed_at=now()))
                self.request_stop(PREEMPTED, "spot interruption notice: %s at %s"
                                  % (notice.get("action"), notice.get("time")))
                self.store.noticed()  # how far the attempt got, for the launching machine
                if self.team_now is not None:  # its peers learn it at once, not from EC2
                    self.team_now.leaving()
                return
            time.sleep(float(self.settings.get("spot_poll_s", SPOT_POLL_S)))

    def keep_budget(self):
        """A job with a budget: stopped (stopped: budget) before it crosses it (host/budget.py
        keeps it: budget.keep)."""
        if self.settings.get("budget") is not None:
            shipped("budget").keep(self, STOPPED, FAILED)

    # -- output -----------------------------------------------------------------------------

    def pump(self, stream, log):
        """Copy the job's output to output.log and to the tmux pane, as it comes."""
        out = getattr(sys.stdout, "buffer", None)
        while True:
            try:
                chunk = os.read(stream.fileno(), 65536)
            except OSError:
                break
            if not chunk:
                break
            log.write(chunk)
            log.flush()
            if out is not None:
                try:
                    out.write(chunk)
                    out.flush()
                except (OSError, ValueError):
                    out = None  # the pane is gone; the log still gets everything

    # -- run ----------------------------------------------------------------------------------

    def run(self):
        """Start run.sh, watch it to its end, record that end, store the results and power
        off (a cloud host); the exit code of `agent.py run`. A node of a job on several nodes
        of an Auto Scaling group runs it again after AWS replaced a peer (host/regroup.py)."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the job come to us, not to init
        self.write_status(state=STARTING, agent_pid=os.getpid(), pid=None, started_at=None,
                          ended_at=None, exit_code=None, reason=None)
        # In the background: a slow sudo must not hold back the heartbeat (a probe would
        # take the agent for dead).
        rearming = threading.Thread(target=self.rearm, args=("start_minutes",), daemon=True)
        rearming.start()
        team = self.team_now = self.team()
        while True:
            if self.run_once(team, rearming) is not None:
                return 1
            if team is not None and team.again():
                continue
            stored = self.store.after_job()
            if team is not None:
                team.before_final()
            if team is None or team.writes_final():
                self.record_final()
            if team is None or not team.rejoin():
                break
        if team is not None:
            team.before_power_off()
        self.maybe_shutdown(stored)
        return 0

    def run_once(self, team, rearming):
        """run.sh from its start to its end, recorded; None, or 1 where it could not start."""
        env = self.job_env()
        log = open(self.path("output.log"), "ab")
        try:
            self.proc = subprocess.Popen(
                ["bash", self.path("run.sh")], cwd=self.jobdir, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=set_pdeathsig)
        except OSError as exc:
            log.write(("cloudtrain agent: could not start run.sh: %s\n" % exc).encode())
            log.close()
            self.write_status(state=FAILED, ended_at=now(), exit_code=127,
                              reason="could not start run.sh: %s" % exc)
            return 1
        started = now()
        if self.first_run_at is None:
            self.first_run_at = started
        self.write_status(state=RUNNING, pid=self.proc.pid, pgid=self.proc.pid, started_at=started)
        self.beat()
        pump = threading.Thread(target=self.pump, args=(self.proc.stdout, log), daemon=True)
        pump.start()
        threading.Thread(target=self.watch_spot, daemon=True).start()
        threading.Thread(target=self.keep_budget, daemon=True).start()
        if team is not None:
            team.start_watch()
        self.store.start_stream()
        self.store.start_progress()
        if self.stop_reason is not None:  # a signal arrived before the job existed
            self.request_stop(self.stop_state, self.stop_reason, self.stop_grace)
        self.supervise(started)
        rearming.join(REARM_TIMEOUT_S)  # its process is ours too, and must not be killed below
        self.clean_up()
        pump.join(timeout=5)
        log.close()
        self.record_end(hold=team is not None)
        return None

    def team(self):
        """This node's regroup.Team where the job runs on several nodes of an Auto Scaling
        group, else None."""
        conf = self.group()
        if conf is None or conf["nodes"] < 2:
            return None
        try:
            regroup, reader = shipped("regroup"), shipped("bundle_reader")
            imds = self.settings.get("imds_url") or shipped("auto_scaling").IMDS_URL
            return regroup.Team(self, conf, reader.Bundle(
                conf["bucket"], conf["prefix"], conf["store_region"], conf["endpoint"], imds),
                shipped("awsapi").RoleCredentials(imds),
                shipped("auto_scaling").identity(imds), shipped("bootstrap").join_attempt)
        except Exception as exc:  # noqa: BLE001 - the job still runs, without regrouping
            self.group_failed("regroup", "this node cannot meet its peers again after a "
                              "loss: %s: %s" % (type(exc).__name__, exc))
            return None

    def reload(self, settings):
        """The next run's job.json (a regroup rewrote it): its settings, a fresh store of
        uploads, no stop asked for."""
        self.settings = settings
        self.heartbeat_s = as_time(settings.get("heartbeat_s"), 2.0)
        self.store = StoreUploads(self)
        self.stop_reason = self.stop_state = self.stop_grace = self.kill_at = None
        self.held_end = None
        self.__dict__.pop("_group", None)

    def job_env(self):
        """run.sh's environment: ours, job.json's env, and where the job is."""
        env = dict(os.environ)
        env.update({k: str(v) for k, v in (self.settings.get("env") or {}).items()})
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["CLOUDTRAIN_JOB_DIR"] = self.jobdir
        # The zero of the job's own startup breakdown (import, data, warm-up: issue 17).
        env["CLOUDTRAIN_STARTED_AT"] = "%.6f" % time.time()
        return env

    def supervise(self, started):
        """Until run.sh ends: the maximum runtime, the SIGKILL after the grace period, the
        heartbeat and the checkpoint stream's record. The maximum runtime counts from the
        first run: a regroup's run goes on the same clock."""
        next_beat = started + self.heartbeat_s
        clock_from = self.first_run_at if self.first_run_at is not None else started
        assert self.proc is not None  # run.sh started
        while self.proc.poll() is None:
            t = now()
            if (self.max_runtime_s and self.stop_reason is None
                    and t - clock_from > float(self.max_runtime_s)):
                self.request_stop(FAILED, "exceeded the maximum runtime of %s"
                                  % fmt_duration(float(self.max_runtime_s)))
            if self.kill_at is not None and t >= self.kill_at:
                self.signal_job(signal.SIGKILL)
                self.kill_at = t + self.grace_s  # keep trying, in case of a stubborn group
            if t >= next_beat:
                self.beat()
                next_beat = t + self.heartbeat_s
            self.store.note_stream()
            time.sleep(POLL_S)

    def clean_up(self):
        """run.sh ended; whatever it left behind, in its group or not, goes too (no orphans)."""
        self.signal_job(signal.SIGKILL)
        deadline = now() + 5
        while now() < deadline:
            self.reap_orphans()
            if not [p for p in descendants(os.getpid()) if self.proc is None or p != self.proc.pid]:
                break
            time.sleep(POLL_S)

    def record_end(self, hold=False):
        """The job's end in status.json: the state and reason a stop asked for, else its exit
        (a failed staging or setup says so rather than run.sh's exit code). `hold` (a node of
        a job on several nodes of a group): a run left to meet the others, or failed with
        nobody asking, is kept in self.held_end and status.json still says running, until
        regroup.Team.again decides whether a lost peer was the cause."""
        assert self.proc is not None  # run.sh ended
        exit_code, exit_reason = describe_exit(self.proc.returncode)
        if self.stop_reason is not None:
            state, reason = self.stop_state, self.stop_reason
        elif exit_code == 0:
            state, reason = SUCCEEDED, None
        else:
            state, reason = FAILED, staging_failure(self.jobdir) or \
                setup_failure(self.jobdir) or exit_reason
        end = dict(state=state, ended_at=now(), exit_code=exit_code, reason=reason)
        self.held_end = None
        if hold and (state == REGROUP or (state == FAILED and self.stop_reason is None)):
            self.held_end = end
            self.write_status(state=RUNNING, descendants=[],
                              regroup={"run_ended": dict(end), "at": now()})
            return
        self.write_status(descendants=[], **end)

    # -- after the job ----------------------------------------------------------------------------

    def rearm(self, key):
        """Run the host's power-off re-arm command (`rearm.argv` + [minutes], no shell): the
        user-data timer was armed for the instance's first job only. A failure is
        logged, never fatal: the agent's own power-off still follows the job."""
        spec = self.settings.get("rearm")
        if not isinstance(spec, dict) or spec.get(key) is None:
            return
        argv, minutes = spec.get("argv"), as_time(spec.get(key))
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            self.log_line("rearm: argv is not a list of strings; not re-armed")
            return
        if minutes is None or minutes < 0:
            self.log_line("rearm: %s is not a number of minutes; not re-armed" % key)
            return
        command = argv + [str(int(math.ceil(minutes)))]  # whole minutes, rounded up
        try:
            proc = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=REARM_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            self.log_line("rearm %s failed: %s" % (" ".join(command), exc))
            return
        if proc.returncode != 0:
            tail = proc.stdout.decode("utf-8", "replace").strip().splitlines()[-3:]
            self.log_line("rearm %s exited with %d%s" % (" ".join(command), proc.returncode,
                                                        (": " + " / ".join(tail)) if tail else ""))

    def group(self):
        """job.json's auto_scaling, checked (auto_scaling.settings), or None: no group, or
        one that is not valid (said in output.log and status.json)."""
        if self.settings.get("auto_scaling") is None:
            return None
        if not hasattr(self, "_group"):
            try:
                self._group = shipped("auto_scaling").settings(self.settings)
            except Exception as exc:  # Invalid, ImportError: the power-off still comes
                self._group = None
                self.group_failed("auto_scaling", "auto_scaling in job.json: %s" % exc)
        return self._group

    def group_failed(self, step, line):
        self.log_line(line)
        with self.lock:
            failures = list(self.status.get("auto_scaling_errors") or [])
        self.write_status(auto_scaling_errors=failures + [{"step": step, "error": line[:500]}])

    def record_final(self):
        """A job run by a group that has truly ended (any end but preempted, unless its
        restarts are used up: regroup.Team.again): its final.json in the job store, through
        the results grant, so that a replacement that boots anyway starts nothing
        (bootstrap.py reads it). Recorded in status.json as `final_stored`."""
        conf = self.group()
        if conf is None or (self.status.get("state") == PREEMPTED and not self.restarts_used):
            return None
        auto_scaling, records = shipped("auto_scaling"), shipped("job_records")
        grant = self.settings.get("results_store")
        attempt = auto_scaling.attempt_number(self.settings)
        ident = auto_scaling.identity(self.settings.get("imds_url") or auto_scaling.IMDS_URL)
        doc = records.final_doc(self.status.get("state"), self.status.get("exit_code"),
                                self.status.get("reason"), attempt, ident["instance"])
        try:
            if not isinstance(grant, dict):
                raise ValueError("no results_store grant in job.json")
            shipped("agent_upload").post_json(grant, records.final_key(conf["prefix"]), doc)
        except Exception as exc:  # UploadError, a bad grant: said, and the power-off goes on
            self.group_failed("final.json", "final.json was not stored: %s" % exc)
            return None
        self.write_status(final_stored=dict(doc, at=now()))
        self.log_line("the job's end is in the job store (%s)"
                      % records.final_key(conf["prefix"]))
        return doc

    def end_group(self):
        """Before the power-off of a job whose end is stored: its group and launch template
        deleted with the role's credentials (IMDSv2), so that AWS starts no replacement.
        Each step's failure is a line; the power-off follows whatever happens (the group's
        scheduled action at the deadline is the backstop)."""
        conf = self.group()
        if conf is None or not self.status.get("final_stored"):
            return
        auto_scaling = shipped("auto_scaling")
        try:
            creds = shipped("awsapi").RoleCredentials(self.settings.get("imds_url")
                                                    or auto_scaling.IMDS_URL)
            steps = auto_scaling.end_group(conf, creds)
        except Exception as exc:
            steps = [("end group", False, "ending group %s failed: %s: %s"
                      % (conf["group"], type(exc).__name__, exc))]
        for step, ok, line in steps:
            if ok:
                self.log_line(line)
            else:
                self.group_failed(step, line)
        self.write_status(group_ended=all(ok for _, ok, _ in steps))

    def switch_group(self):
        """A spot instance of a group whose job stopped at a notice past its deadline's switch
        sets the group to on-demand at once, before any wait: AWS's replacement is then
        on-demand (auto_scaling.switch_for_deadline; said in output.log)."""
        conf = self.group()
        if conf is None or self.status.get("state") != PREEMPTED or self.restarts_used:
            return
        auto_scaling = shipped("auto_scaling")
        switched = auto_scaling.switch_for_deadline(conf, self.settings)
        if switched:  # (ok, line)
            self.log_line(switched[1]) if switched[0] else self.group_failed("on-demand",
                                                                             switched[1])

    def start_queued(self):
        """Start the next job queued on this host (`launch --on` while this job ran), now that
        this one has ended; whether one was started. A failure is logged: the power-off or
        the idle re-arm still follows."""
        try:
            started = shipped("job_queue").next_job(self.jobdir)
        except Exception as exc:  # noqa: BLE001 - whatever it is, the host must not stay on
            self.log_line("the job queue could not be read: %s: %s" % (type(exc).__name__, exc))
            return False
        if started:
            self.log_line("started job %s, queued on this instance behind this one" % started)
        return bool(started)

    def kept(self):
        """A host kept after the job: none was to power off, or `keep` was asked for later."""
        return not self.settings.get("shutdown_command") or os.path.exists(self.path("keep"))

    def maybe_shutdown(self, stored=None):
        """Cloud hosts power themselves off after the job (shutdown behaviour: terminate).
        First they wait for the CLI to copy the results home (it writes `collected`): up to
        shutdown_delay_s when a stored copy exists, else collect_wait_s. A kept host re-arms
        its power-off backstop for its idle time instead. A job queued behind this one on the
        host (job_queue) starts now instead of either: its own agent re-arms the timer."""
        if self.start_queued():
            return
        self.switch_group()
        delay = as_time(self.settings.get("shutdown_delay_s"), 60.0)
        if stored is None or not stored.get("ok"):
            delay = as_time(self.settings.get("collect_wait_s"), delay)
        elif self.status.get("state") == STOPPED:  # at its budget: every second bills
            delay = 0.0
        deadline = now() + delay
        while not self.kept() and now() < deadline and not os.path.exists(self.path("collected")):
            time.sleep(min(WAIT_POLL_S, max(deadline - now(), 0)))
        if self.kept():
            self.rearm("idle_minutes")
            return
        self.end_group()
        self.write_status(shutdown_requested_at=now())
        subprocess.call(self.settings["shutdown_command"], shell=True,
                        env=dict(os.environ, CLOUDTRAIN_JOB_DIR=self.jobdir))


# -- probe and stop (run by the orchestrator, on the host) --------------------------------------


def staging_failure(jobdir):
    """Why the dataset staging before the job failed (the stager's status file), or None:
    the job's reason is then that, not run.sh's exit code."""
    staging = read_json(os.path.join(jobdir, STAGING_STATUS))
    if not isinstance(staging, dict) or staging.get("state") != "failed":
        return None
    error = staging.get("error")
    return "data staging failed: %s" % (str(error)[:400] if error else "see output.log")


def setup_failure(jobdir):
    """Why the job's setup script (job file `setup:`) failed, from the marker run.sh writes,
    or None: the reason is then the setup's exit, not the job's."""
    status = read_json(os.path.join(jobdir, SETUP_STATUS))
    if not isinstance(status, dict) or status.get("state") != "failed":
        return None
    code = status.get("exit_code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else "?"
    return "setup failed (exit code %s; its output leads the job's log)" % code


def main(argv):
    usage = ("usage: agent.py run|probe|stop JOBDIR [--stale S] [--grace S] [--nowait 1] "
             "[--session NAME --socket NAME]")
    if len(argv) < 2 or argv[0] not in ("run", "probe", "stop"):
        print(usage, file=sys.stderr)
        return 2
    command, jobdir, rest = argv[0], argv[1], argv[2:]
    opts = dict(zip(rest[::2], rest[1::2]))
    if command == "run":
        return Agent(jobdir).run()
    if command == "probe":
        result = probe(jobdir, float(opts.get("--stale", 30.0)), opts.get("--session"),
                       opts.get("--socket"))
    else:
        grace = opts.get("--grace")
        result = stop(jobdir, None if grace is None else float(grace),
                      signal_only=opts.get("--nowait") == "1")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
