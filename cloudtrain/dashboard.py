"""`cloudtrain ui`: every job, its curves, its cost and its log on one page in the browser,
live, served from this machine with nothing else running for it.

A Flask app on 127.0.0.1 over the same state store and job files `status`, `metrics`, `logs`
and `cost-report` read (history, job_views, lifecycle.inspect, curves, ledger): the page
(cloudtrain/data/ui/) asks its JSON API and draws with plotly.js, served from the plotly
package, so nothing is built and nothing is fetched from elsewhere.

Safety: a random token in the URL it prints (as Jupyter does), required by every API call
(an `X-Cloudtrain-Token` header, compared in constant time) and by the page itself, so other
users of this machine cannot read it; requests naming another Host are refused (a web page
elsewhere cannot reach it through DNS rebinding); read-only but for stopping a job (POST,
which the page asks about first). What a job wrote (its name, log, metrics) is data: JSON
only, its log through the same filter as `logs` (hostdata.TerminalText), colour codes too.
"""

from __future__ import annotations

import hmac
import re
import secrets
import threading
import time
from pathlib import Path

from . import config, curves, history, job_views, ledger
from .cells import runtime
from .errors import CloudtrainError, UsageError
from .hostdata import TerminalText
from .state import Job, Store, open_store

PAGE = 100  # jobs per page of the jobs view (it loads more as it scrolls)
LOG_BYTES = 64 * 1024  # the most of a log one answer carries (its tail first)
REFRESH_S = 5.0  # active jobs are refreshed (as `status` does) at most this often
SGR = re.compile(r"\x1b\[[0-9;:]*m")
UI = Path(__file__).parent / "data" / "ui"
FILES = {"ui.js": "text/javascript", "ui.css": "text/css", "index.html": "text/html"}


def token() -> str:
    return secrets.token_urlsafe(24)


def page_url(host: str, port: int, key: str) -> str:
    return f"http://{host}:{port}/?token={key}"


class Dashboard:
    """What the API answers, one store per request (SQLite connections stay in their thread)."""

    def __init__(self, home: Path, settings: config.Settings):
        self.home, self.settings = Path(home), settings
        self._refreshed = 0.0
        self._lock = threading.Lock()

    def store(self) -> Store:
        return open_store(self.home)

    def refresh(self, store: Store) -> None:
        """Active jobs' states, as `status` refreshes them, at most every REFRESH_S."""
        with self._lock:
            if time.time() - self._refreshed < REFRESH_S:
                return
            self._refreshed = time.time()
        active = store.jobs(active_only=True)
        if active:
            from .lifecycle.watch import refresh_active

            try:
                refresh_active(store, self.settings, active)
            except CloudtrainError:
                pass  # the rows as stored; the next poll tries again

    def jobs(self, args: dict) -> dict:
        """A page of the jobs `status -a` lists for these filters, newest first."""
        filters = history.parse_filters(
            tuple(s for s in args.get("state", "").split(",") if s),
            tuple(r for r in args.get("recipe", "").split(",") if r),
            args.get("name") or None, args.get("since") or None)
        offset = _whole(args.get("offset"), 0, 10**9, "offset")
        limit = _whole(args.get("limit"), 1, 1000, "limit", PAGE)
        with self.store() as store:
            self.refresh(store)
            query = filters.query()
            total = store.count_jobs(query)
            jobs = store.find_jobs(query, limit=limit, offset=offset)
            now = time.time()
            return {"total": total, "offset": offset,
                    "jobs": [row(store, j, now) for j in jobs]}

    def job(self, ref: str) -> dict:
        """A job's page: as `status JOB --json` gives it, with its plan and its commands."""
        import json

        from .lifecycle import inspect

        with self.store() as store:
            d = inspect.detail(store, self.settings, ref, tail_lines=0)
            data = json.loads(job_views.detail_json(d.job, d.phases, b"", d.target, d.runs,
                                                    d.attempts, d.recovery))
            data["plan"] = plan_of(d.job)
            data["commands"] = commands(d.job)
            data["cost_items"] = (d.job.cost_detail or {}) if isinstance(
                d.job.cost_detail, dict) else {}
            return data

    def metrics(self, refs: list[str]) -> dict:
        """Each job's metrics rows (`metrics --json`), with its recipe's target."""
        import json

        from .lifecycle import inspect

        if not refs or len(refs) > 12:
            raise UsageError("give 1 to 12 jobs to draw")
        with self.store() as store:
            found = [store.find_job(r) for r in refs]
        data = [curves.read_job(j.id, j.name, inspect.metrics_file(j), started_at=j.started_at,
                                finished=not j.active) for j in found]
        out = json.loads(curves.to_json(data))
        for entry, job in zip(out, found):
            target, metric = inspect.recipe_target(job)
            detail = job.cost_detail if isinstance(job.cost_detail, dict) else {}
            entry.update(target=target, target_metric=metric, cost=job.cost,
                         state=job.state, created_at=job.created_at,
                         started_at=job.started_at,
                         to_target=detail.get("to_target"))
        return {"jobs": out}

    def log(self, ref: str, offset: int) -> dict:
        """The job's output from `offset` (its last LOG_BYTES where that is further back),
        made harmless: escapes as `logs` drops them, colours too."""
        from .lifecycle import collect, inspect

        with self.store() as store:
            job = store.find_job(ref)
            try:  # an ended job's files not home yet: from the job store
                job = collect.files_home(store, job)
                data = inspect.read_log(job, max(0, offset))
            except CloudtrainError as exc:
                return {"text": f"(output not available: {exc.message})\n", "offset": offset,
                        "active": job.active}
        start = offset
        if len(data) > LOG_BYTES:
            start = offset + len(data) - LOG_BYTES
            data = data[-LOG_BYTES:]
        screen = TerminalText()
        text = (screen.feed(data) + screen.flush()).decode("utf-8", "replace")
        return {"text": SGR.sub("", text), "start": start, "offset": offset + len(data),
                "active": job.active}

    def cost(self, by: str, since: str | None) -> dict:
        import json

        if by not in ("job", "recipe", "instance", "day", "month"):
            raise UsageError(f"by: job, recipe, instance, day or month, not {by!r}")
        with self.store() as store:
            rows, total = ledger.report(store, by, since)
            spot = ledger.spot_savings(store, since)
        return {**json.loads(ledger.report_json(rows, total, by)), "spot": spot}

    def stop(self, ref: str) -> dict:
        """`down JOB`: the job stopped and its instances terminated."""
        from .lifecycle import stop

        with self.store() as store:
            outcomes = stop.cancel(store, self.settings, (ref,), False)
        return {"ok": all(o.ok for o in outcomes),
                "said": job_views.stop_outcomes(outcomes)}


def row(store: Store, job: Job, now: float) -> dict:
    """A job as the jobs view lists it."""
    metrics = job.metrics if isinstance(job.metrics, dict) else {}
    spec = job.spec
    attempts = store.attempts(job.id) if spec.recovery.recover else []
    expected = spec.expected or {}
    return {
        "id": job.id, "name": job.name, "state": job.state, "reason": job.reason,
        "what": job.command, "recipe": job.recipe, "backend": job.backend,
        "instance": spec.placement.instance_type if job.backend != "local" else None,
        "market": str(spec.placement.market) if job.backend != "local" else None,
        "nodes": spec.nodes, "created_at": job.created_at, "runtime_s": runtime(job, now),
        "epoch": metrics.get("epoch"), "epochs": spec.args.get("epochs"),
        "loss": _last(metrics, curves.is_loss),
        "accuracy": _last(metrics, curves.is_accuracy),
        "cost": job.cost, "settled": bool(job.cost_settled),
        "expected_usd": expected.get("usd"), "budget_usd": spec.budget_usd,
        "attempts": len(attempts), "recoveries": max(0, len(attempts) - 1)}


def _last(metrics: dict, kind) -> float | None:
    for key, value in metrics.items():
        if kind(key) and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def plan_of(job: Job) -> list[list[str]]:
    """The plan the job was launched with, as rows: what ran, where, its limits and the
    estimate it was launched on."""
    spec = job.spec
    rows = [["job", spec.display()], ["backend", spec.backend]]
    place = spec.placement
    if spec.backend != "local":
        rows += [["instance", f"{place.instance_type or '?'} ({place.market})"
                  + (f" x {spec.nodes} nodes" if spec.nodes > 1 else "")],
                 ["region", place.region or "(configured)"]]
        if place.reservation:
            rows.append(["reservation", place.reservation])
        if spec.recovery.recover:
            rows.append(["recovery", f"on, at most {spec.recovery.max_restarts} restarts"])
    rows.append(["max runtime", f"{spec.max_runtime_s / 60:g} min"])
    if spec.budget_usd is not None:
        rows.append(["budget", f"${spec.budget_usd:.2f}"])
    if spec.deadline_at is not None:
        rows.append(["deadline", time.strftime("%Y-%m-%d %H:%M", time.localtime(
            spec.deadline_at))])
    expected = spec.expected or {}
    if isinstance(expected.get("usd"), (int, float)):
        rows.append(["estimate", f"${expected['usd']:.4f}"
                     + (f", {expected['total_s'] / 60:.1f} min" if isinstance(
                         expected.get("total_s"), (int, float)) else "")])
    return rows


def commands(job: Job) -> dict[str, str]:
    """The commands that attach to the job, follow, stop or rerun it (ids are hex: nothing
    here needs quoting)."""
    out = {"logs": f"cloudtrain logs {job.id} --follow", "status": f"cloudtrain status {job.id}"}
    if job.active:
        out.update(attach=f"cloudtrain attach {job.id}", stop=f"cloudtrain down {job.id}")
    if job.kind == "recipe" and job.recipe:
        import shlex

        sets = " ".join(f"--set {shlex.quote(f'{k}={v}')}" for k, v in sorted(
            (job.spec.args or {}).items()))
        out["rerun"] = " ".join(w for w in (
            f"cloudtrain launch --recipe {shlex.quote(job.recipe)}",
            f"--profile {shlex.quote(job.spec.profile)}" if job.spec.profile else "", sets)
            if w)
    return out


def _whole(value, low: int, high: int, name: str, default: int | None = None) -> int:
    if value in (None, ""):
        if default is None:
            return low
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name}: a whole number, not {str(value)[:20]!r}") from None
    if not low <= number <= high:
        raise UsageError(f"{name}: from {low} to {high}")
    return number


def app(board: Dashboard, key: str, hosts: set[str]):
    """The Flask app: the page, its files, plotly.js, and the API under /api/."""
    import json

    from flask import Flask, Response, abort, request

    web = Flask(__name__, static_folder=None)
    web.url_map.merge_slashes = False  # /api/jobs//log is no job's log: 404, not a redirect

    def answer(data, status: int = 200) -> Response:
        return Response(json.dumps(data), status=status, mimetype="application/json",
                        headers={"Cache-Control": "no-store"})

    @web.before_request
    def guard():
        if request.host.split(":")[0] not in hosts:
            abort(403)  # another name for this address: a page elsewhere, rebinding
        if request.path.startswith("/static/"):
            return None
        given = request.headers.get("X-Cloudtrain-Token") or request.args.get("token") or ""
        if not hmac.compare_digest(given.encode(), key.encode()):
            return Response("cloudtrain ui: open the address `cloudtrain ui` printed (its "
                            "token is required)\n", status=403, mimetype="text/plain")
        return None

    @web.errorhandler(CloudtrainError)
    def refused(exc: CloudtrainError):
        return answer({"error": exc.message}, 400 if isinstance(exc, UsageError) else 500)

    @web.after_request
    def headers(response: Response) -> Response:
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"  # the token stays in this tab
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; script-src 'self'; style-src 'self' "
            "'unsafe-inline'; img-src 'self' data: blob:; frame-ancestors 'none'")
        return response

    @web.get("/")
    def index():
        return Response((UI / "index.html").read_bytes(), mimetype="text/html",
                        headers={"Cache-Control": "no-store"})

    @web.get("/static/<name>")
    def files(name: str):
        if name == "plotly.min.js":
            return Response(_plotly(), mimetype="text/javascript",
                            headers={"Cache-Control": "max-age=86400"})
        if name not in FILES or name == "index.html":
            abort(404)
        return Response((UI / name).read_bytes(), mimetype=FILES[name],
                        headers={"Cache-Control": "no-cache"})

    @web.get("/api/jobs")
    def jobs():
        return answer(board.jobs(request.args))

    @web.get("/api/jobs/<ref>")
    def job(ref: str):
        return answer(board.job(ref))

    @web.get("/api/metrics")
    def metrics():
        return answer(board.metrics([r for r in request.args.get("jobs", "").split(",") if r]))

    @web.get("/api/jobs/<ref>/log")
    def log(ref: str):
        return answer(board.log(ref, _whole(request.args.get("offset"), 0, 2**62, "offset")))

    @web.get("/api/cost")
    def cost():
        return answer(board.cost(request.args.get("by", "day"), request.args.get("since")))

    @web.post("/api/jobs/<ref>/stop")
    def stop(ref: str):
        body = request.get_json(silent=True) or {}
        if body.get("confirm") is not True:
            raise UsageError("a stop is sent with {\"confirm\": true}, after the page asked")
        return answer(board.stop(ref))

    return web


_PLOTLY: list[bytes] = []


def _plotly() -> bytes:
    """plotly.js as the plotly package ships it (read once)."""
    if not _PLOTLY:
        import plotly

        _PLOTLY.append((Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
                        ).read_bytes())
    return _PLOTLY[0]


def serve(home: Path, settings: config.Settings, port: int = 0, host: str = "127.0.0.1",
          key: str | None = None, ready=None) -> None:
    """Serve until interrupted (Ctrl-C). `ready(url)` is called once it listens."""
    import logging

    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    key = key or token()
    names = {host, "localhost", "127.0.0.1"} if host in ("127.0.0.1", "localhost") else {host}
    web = app(Dashboard(home, settings), key, names)
    try:
        server = make_server(host, port, web, threaded=True)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         hint="give another --port, or leave it out for a free one") from None
    url = page_url(host, server.server_port, key)
    if ready is not None:
        ready(url)
    try:
        server.serve_forever()
    finally:
        server.server_close()
