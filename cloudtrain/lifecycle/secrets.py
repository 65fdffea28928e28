"""Stage: none of its own; a job's secrets (`--secret KEY`, job file `secrets:`), which
launch sends to the hosts and keeps for relaunches, and collect (or an aborted launch)
drops: in the job's environment, in no file cloudtrain keeps about it. It calls config only
(the bottom of the lifecycle package).

The spec, job.json, state.db and the logs hold the names only. The values travel twice:
- to the host, as a private file beside run.sh that run.sh reads and deletes before anything
  else runs (HOST_FILE; each node of a job on several machines gets its own);
- to a private file on this machine ($CLOUDTRAIN_HOME/secrets/<job id>.json, mode 0600,
  outside the job's directory), kept only while the job may be relaunched (spot recovery)
  and deleted when the job ends (collect.finish) or its record is removed.
"""

from __future__ import annotations

import json
import shlex

from .. import config

HOST_FILE = ".secrets.env"


def _path(job_id: str):
    return config.home() / "secrets" / f"{job_id}.json"


def save(job_id: str, values: dict[str, str]) -> None:
    """Keep a job's secret values for its relaunches (nothing when it has none)."""
    if values:
        path = _path(job_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        config.write_private(path, json.dumps(values).encode())


def load(job_id: str) -> dict[str, str]:
    """The values save() kept, or {} (none, or already forgotten)."""
    try:
        data = json.loads(_path(job_id).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def forget(job_id: str) -> None:
    """The job will not run again: its secrets go."""
    _path(job_id).unlink(missing_ok=True)


def host_script(values: dict[str, str]) -> str:
    """The host file's text: one `export KEY=VALUE` per secret, quoted for the shell."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(values.items()))


def run_lines(jobdir: str) -> list[str]:
    """run.sh's first lines: read the host file, then delete it, before anything else runs
    (the job itself never sees the file)."""
    path = shlex.quote(f"{jobdir}/{HOST_FILE}")
    return [f"if [ -f {path} ]; then . {path}; rm -f {path}; fi"]
