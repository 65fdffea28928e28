"""What the agent sends to the job store: checkpoints while the job runs, results after it.

Standard library only, Python 3.8+; shipped beside agent.py. The uploaders themselves
(checkpoint_stream.Streamer, agent_upload.upload_job) are imported by name only when job.json
asks for them (shipped). Imports job_status and nothing else of ours at the top.

    StoreUploads(agent)   the job.json keys results_store and checkpoint_stream, carried out
                          for the agent, within their time limits, and the attempt's
                          progress for a job run by a group (agent_progress); nothing here
                          may stop the job or the power-off
"""

import os
import threading

from .job_status import PREEMPTED, as_pid, as_time, fmt_duration, now

SPOT_UPLOAD_S = 75.0  # after a spot notice: what is left of the two minutes, with a margin
PROGRESS_END_S = 10.0  # of that, at most, for the attempt's progress at the run's end
LOG_UPLOAD_S = 15.0  # of that, kept for status.json, the log and the metrics after the checkpoint
UPLOAD_TIMEOUT_S = 1800.0  # the power-off must come even if the results store hangs


def shipped(name):
    """A module of this package (agent_upload, checkpoint_stream), imported by name when it is
    needed, not with the agent."""
    import importlib

    return importlib.import_module("." + name, __package__)


class StoreUploads:
    """The job store's uploads for one agent.Agent: its settings (job.json), its stop state
    (after a spot notice only what is left of the two minutes), its log and status."""

    def __init__(self, agent):
        self.agent = agent
        self.jobdir, self.settings = agent.jobdir, agent.settings
        self.log_line, self.write_status = agent.log_line, agent.write_status
        self.streamer = None  # checkpoint_stream.Streamer, while the job runs
        self.stream_seen = None  # its last record as written to status.json
        self.progress = None  # agent_progress.Progress, for rank 0 of a group's job

    def after_job(self):
        """The checkpoint first, then the status and logs (which then record how it went).
        Returns the results' record (None without a job store)."""
        limit, t0 = self.upload_limit(), now()
        streamed = self.finish_stream(limit)
        return self.store_results(max(limit - (now() - t0), min(limit, LOG_UPLOAD_S)),
                                  include_checkpoints=not (streamed and streamed.get("ok")))

    def upload_limit(self):
        """Seconds for storing the checkpoint and the results after the job: after a spot
        notice only what is left of its two minutes."""
        limit = as_time(self.settings.get("results_store_timeout_s"), UPLOAD_TIMEOUT_S)
        if self.agent.stop_state == PREEMPTED:  # AWS gives two minutes' notice, part of it spent
            limit = min(limit, SPOT_UPLOAD_S)
        return max(limit, 0.0)

    def start_stream(self):
        """Start the checkpoint streamer (kept as self.streamer) when job.json asks for one and
        there is a grant to upload with; None otherwise (said in output.log). It must never
        stop the job."""
        conf = self.settings.get("checkpoint_stream")
        if conf is None:
            return None
        if not isinstance(conf, dict):
            self.log_line("checkpoint_stream in job.json is not an object: checkpoints are "
                          "not streamed")
            return None
        grant = self.settings.get("results_store")
        if not isinstance(grant, dict):
            self.log_line("no job store to stream checkpoints to (no results_store grant): "
                          "checkpoints are not streamed")
            return None
        slot = conf.get("start_slot")
        try:
            streamer = shipped("checkpoint_stream").Streamer(
                self.jobdir, grant, settle_s=as_time(conf.get("settle_s"), 2.0),
                poll_s=as_time(conf.get("poll_s"), 1.0),
                start_seq=as_pid(conf.get("start_seq")) or 0,  # as_pid: a positive int
                start_slot=slot if slot in ("a", "b") else None,
                attempt=as_pid(conf.get("attempt")))
            streamer.start()
        except BaseException as exc:  # ImportError, a bad grant, a bug
            self.log_line("checkpoint streaming could not start: %s: %s"
                          % (type(exc).__name__, exc))
            return None
        self.streamer = streamer
        return streamer

    def start_progress(self):
        """Start posting the attempt's progress (agent_progress) where this is rank 0 of a
        job run by a group; kept as self.progress. It must never stop the job."""
        try:
            progress = shipped("agent_progress").Progress.for_job(
                self.jobdir, self.settings, self.agent.group(),
                checkpoint=lambda: self.streamer.last if self.streamer else None,
                log=self.log_line, spend=self.spend)
            self.progress = progress and progress.start()
        except Exception as exc:  # noqa: BLE001 - ImportError, a bug: the job runs on
            self.log_line("the attempt's progress is not recorded: %s: %s"
                          % (type(exc).__name__, exc))
        return self.progress

    def spend(self, final=False):
        """This attempt's spend for its progress record (a job with a budget), or None."""
        keeper = self.agent.budget
        return keeper.figure(final) if keeper is not None else None

    def noticed(self):
        """A spot notice: the progress so far goes up at once."""
        if self.progress is not None:
            self.progress.now()

    def note_stream(self):
        """Record the streamer's last upload in status.json when it is a new one."""
        if self.streamer is None:
            return
        last = self.streamer.last
        if last is None or last == self.stream_seen:
            return
        self.stream_seen = last
        self.write_status(checkpoint_stream=dict(last, uploads=self.streamer.uploads))

    def finish_stream(self, limit):
        """At the run's end: stop the streamer, then upload the checkpoints if they changed
        since its last upload (the one written on SIGTERM, after a spot notice), within
        `limit` less what the logs need after a notice. Recorded in status.json with
        "final": true; returns that record (None without streaming). Then the attempt's
        progress, with the step the run reached and that checkpoint's."""
        t0 = now()
        rec = self._finish_stream(limit)
        if self.progress is not None:
            self.progress.finish(min(PROGRESS_END_S, max(0.0, limit - (now() - t0))))
        return rec

    def _finish_stream(self, limit):
        if self.streamer is None:
            return None
        if self.agent.stop_state == PREEMPTED:
            limit = max(0.0, limit - LOG_UPLOAD_S)
        t0 = now()
        self.streamer.stop(timeout_s=limit)
        rec = self.streamer.flush(max(0.0, limit - (now() - t0)), final=True)
        rec = dict(rec, final=True, uploads=self.streamer.uploads)
        self.write_status(checkpoint_stream=rec)
        if rec.get("ok") and rec.get("seq") is not None:
            self.log_line("checkpoint %s (step %s, %.1f MB) is in the job store (%.1f s)"
                          % (rec["seq"], "unknown" if rec.get("step") is None else rec["step"],
                             (rec.get("bytes") or 0) / 1e6, rec.get("seconds") or 0.0))
        elif not rec.get("ok"):
            self.log_line("the last checkpoint did not reach the job store: %s"
                          % (rec.get("error") or "no reason given"))
        return rec

    def store_results(self, limit=None, include_checkpoints=True):
        """Upload the job's results with `agent_upload.upload_job(jobdir, grant)` (a module
        of this package), before the host powers off, within `limit` seconds (default:
        upload_limit()). Without `include_checkpoints` (the checkpoint stream stored them)
        checkpoints/ is left out. Whatever happens is recorded in status.json as
        `results_stored`; nothing here may stop the power-off."""
        grant = self.settings.get("results_store")
        if grant is None:
            return None
        box = {}
        options: dict[str, object] = {} if include_checkpoints else {"include_checkpoints": False}
        outputs = self.settings.get("outputs")
        if isinstance(outputs, list) and outputs:
            options["outputs"] = [str(o) for o in outputs]

        def work():
            try:
                box["result"] = shipped("agent_upload").upload_job(
                    self.jobdir, grant, timeout_s=limit, **options)
            except BaseException as exc:  # ImportError, SystemExit, a bug in the uploader
                box["error"] = "%s: %s" % (type(exc).__name__, exc)

        if limit is None:
            limit = self.upload_limit()
        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(timeout=limit)
        result = box.get("result")
        error: str | None
        if worker.is_alive():
            error = "the upload did not finish in %s" % fmt_duration(limit)
        elif "error" in box:
            error = box["error"]
        elif not isinstance(result, dict):
            error = "upload_job returned %s, not a dict" % type(result).__name__
        else:
            error = result.get("error")
        result = result if isinstance(result, dict) else {}
        count = lambda v: v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0
        stored = {"at": now(), "ok": result.get("ok") is True and not worker.is_alive(),
                  "files": count(result.get("files")), "bytes": count(result.get("bytes")),
                  "error": None if error is None else str(error)[:500]}
        if not stored["ok"]:
            self.log_line("storing the results failed: %s" % (stored["error"] or "no reason given"))
        self.write_status(results_stored=stored)
        return stored
