"""The embedded default: this machine, no cloud account, nothing that bills."""

from __future__ import annotations

import time

from .. import config
from ..errors import MissingDependency
from ..hosts import LocalHost, default_tmux_socket
from ..progress import SILENT, Reporter
from ..state import Instance, Job, Store


class LocalProvider:
    name = "local"

    def __init__(self):
        self.settings = config.Settings.load()

    def _host(self, tmux: str | None = None, python: str | None = None) -> LocalHost:
        return LocalHost(tmux or default_tmux_socket(), python or self.settings.python or None)

    def preflight(self, spec) -> None:
        host = self._host()
        host.require_tmux()
        if spec.requires:
            missing = host.missing_modules(spec.requires)
            if missing:
                raise MissingDependency(
                    f"{spec.display()} needs the Python modules {', '.join(missing)}, "
                    f"which {host.python} lacks",
                    hint="pip install 'cloudtrain[recipes]' (torch and torchvision) into this "
                         "environment, or set `python:` in config.yaml to one that has them")

    def acquire(self, store: Store, job: Job, spec, report: Reporter = SILENT) -> LocalHost:
        report.phase("running on this machine (local backend)")
        host = self._host()
        store.add_instance(Instance(
            id=f"local-{job.id}", job_id=job.id, provider=self.name, region=None, zone=None,
            instance_type="local", market="local", state="running", launched_at=time.time(),
            terminated_at=None, price_per_hour=0.0, details=None))
        return host

    def host_for(self, job: Job) -> LocalHost:
        info = job.host or {}
        return self._host(info.get("tmux_socket"), info.get("python"))

    def setup(self, host: LocalHost) -> None:
        """Nothing to install here: preflight checked tmux and the Python modules."""

    def gpus(self, spec, host: LocalHost) -> int:
        return host.gpu_count()

    def jobdir(self, job_id: str, host: LocalHost | None = None) -> str:
        return str(config.home() / "jobs" / job_id)

    def data_dir(self, host: LocalHost | None = None) -> str:
        return str(config.home() / "data")

    def data_mounts(self, store: Store, job: Job, host: LocalHost) -> dict[str, str]:
        return {}  # no volumes here: a dataset on this machine is a path

    def agent_settings(self, spec) -> dict:
        return {}

    def shutdown(self, spec) -> tuple[str | None, float]:
        return None, 0.0  # never power off the user's own machine

    def results_grant(self, store: Store, job: Job, spec) -> tuple[dict | None, str | None]:
        return None, None  # the job directory is here already, and outlives nothing

    def checkpoint_plan(self, store: Store, job: Job, expires_s: float) -> dict | None:
        return None  # a job here is never relaunched elsewhere: its checkpoints stay put

    def fetch_results(self, store: Store, job: Job, local) -> dict | None:
        return None

    def plan(self, spec) -> list[tuple[str, str]]:
        self.preflight(spec)
        rows = [("backend", "local (this machine)"), ("runs", spec.display())]
        if spec.kind == "recipe":  # D30: refused here as the launch refuses it
            gpus = self._host().gpu_count()
            procs = spec.processes(gpus)
            rows.append(("processes", f"{procs} ({gpus} GPU(s) here)"))
        warning = self.question(spec)
        if warning:
            rows.append(("WARNING", warning))
        return rows + [("max runtime", f"{spec.max_runtime_s / 60:g} min"), ("cost", "$0.00")]

    def question(self, spec) -> str | None:
        """D17: a GPU recipe's full run on a machine without a GPU would take hours (and be
        stopped at its max runtime): said, and asked, before it starts."""
        from ..preflight import cpu_warning

        if spec.kind != "recipe" or spec.profile or self._host().gpu_count():
            return None
        return cpu_warning(spec)

    def instance_states(self, store: Store, job: Job) -> dict[str, dict]:
        return {}  # this machine is always there

    def record_ends(self, store: Store, job: Job) -> None:
        """Nothing to ask: release() recorded the end, and nothing here is billed."""

    def cleanup(self, store: Store, regions: set[str] | None = None) -> list[str]:
        return []  # no shared cloud resources

    def release(self, store: Store, job: Job, force: bool = False) -> None:
        for inst in store.instances(job.id):
            if inst.state != "terminated":
                store.update_instance(inst.id, state="terminated", terminated_at=time.time())
