"""Issue 39: the dashboard's server (cloudtrain/dashboard.py) through Flask's test client, on a
real state store: the token and the Host it answers, the jobs view's pages and filters, a
hostile job's log and name as data, the stop that is asked for, bad input as one line."""

from __future__ import annotations

import json

import pytest

from cloudtrain import config, dashboard
from cloudtrain.state import open_store


@pytest.fixture
def web(ct_home):
    board = dashboard.Dashboard(ct_home, config.Settings.load())
    client = dashboard.app(board, "sekrit", {"127.0.0.1", "localhost"}).test_client()
    return client


def _get(web, path, token="sekrit", host="127.0.0.1:5000"):
    return web.get(path, headers={"X-Cloudtrain-Token": token, "Host": host})


def _jobs(ct_home, n, **kw):
    store = open_store(ct_home)
    made = []
    for i in range(n):
        job = store.create_job(name=kw.get("name", f"exp-{i}"), kind="command", recipe=None,
                               command="echo hi", backend="local",
                               spec={"kind": "command", "command": ["echo", "hi"]})
        store.update_job(job.id, created_at=1_800_000_000.0 + i)
        made.append(job.id)
    store.close()
    return made


def test_issue39_every_request_needs_the_token_and_this_host(web, ct_home):
    """Issue 39: without the token (or with another) the page and the API answer 403 and
    nothing of the store; a request naming another Host (a page elsewhere rebinding its name
    to 127.0.0.1) is refused whatever its token; the static files need none."""
    _jobs(ct_home, 1)
    for token in ("", "wrong", "sekrit "):
        for path in ("/", "/api/jobs", "/api/cost"):
            got = _get(web, path, token=token)
            assert got.status_code == 403 and b"exp-0" not in got.data, (path, token)
    assert _get(web, "/api/jobs", host="evil.example:5000").status_code == 403
    assert web.get("/?token=sekrit", headers={"Host": "127.0.0.1"}).status_code == 200
    assert _get(web, "/api/jobs").json["total"] == 1
    assert web.get("/static/ui.js", headers={"Host": "127.0.0.1"}).status_code == 200
    assert web.get("/static/../dashboard.py", headers={"Host": "127.0.0.1"}).status_code == 404
    page = web.get("/?token=sekrit", headers={"Host": "127.0.0.1"})
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["Referrer-Policy"] == "no-referrer"


def test_issue39_the_jobs_view_pages_through_the_store_newest_first(web, ct_home):
    """Issue 39: the jobs view asks for a page at a time (offset, limit), newest first, with
    the total; filters as `status` has them; bad numbers are one line, 400."""
    ids = _jobs(ct_home, 250)
    first = _get(web, "/api/jobs").json
    assert first["total"] == 250 and len(first["jobs"]) == dashboard.PAGE
    assert [j["id"] for j in first["jobs"][:2]] == ids[::-1][:2]
    nxt = _get(web, "/api/jobs?offset=200&limit=100").json
    assert [j["id"] for j in nxt["jobs"]] == ids[::-1][200:]
    named = _get(web, "/api/jobs?name=exp-7").json
    assert named["total"] == 1 and named["jobs"][0]["name"] == "exp-7"
    assert _get(web, "/api/jobs?state=succeeded").json["total"] == 0
    for bad in ("offset=-1", "limit=0", "limit=x", "limit=100000", "state=nonsense"):
        got = _get(web, "/api/jobs?" + bad)
        assert got.status_code == 400 and "\n" not in got.json["error"], bad


def test_issue39_a_hostile_log_and_name_are_data(web, ct_home):
    """Issue 39: a job's log with a window-title escape, a cleared screen, colours and
    markup comes back as text without the escapes (its markup as characters, which the page
    puts in as text); the name too. The log's tail only, past LOG_BYTES."""
    store = open_store(ct_home)
    job = store.create_job(name="<script>alert(1)</script>", kind="command", recipe=None,
                           command="x", backend="local", spec={"kind": "command"})
    jobdir = ct_home / "jobs" / job.id
    jobdir.mkdir(parents=True)
    (jobdir / "output.log").write_bytes(
        b"\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m <img src=x onerror=alert(1)>\n")
    store.update_job(job.id, jobdir=str(jobdir), host={"kind": "local"})
    store.close()
    got = _get(web, f"/api/jobs/{job.id}/log").json
    assert got["text"] == "red <img src=x onerror=alert(1)>\n", got
    assert got["offset"] == len((jobdir / "output.log").read_bytes())
    assert _get(web, f"/api/jobs/{job.id}/log?offset={got['offset']}").json["text"] == ""
    (jobdir / "output.log").write_bytes(b"a" * (dashboard.LOG_BYTES + 10))
    tail = _get(web, f"/api/jobs/{job.id}/log").json
    assert len(tail["text"]) == dashboard.LOG_BYTES and tail["start"] == 10
    listed = _get(web, "/api/jobs").json["jobs"][0]
    assert listed["name"] == "<script>alert(1)</script>"  # JSON: the page shows it as text


def test_issue39_the_stop_is_a_post_that_says_it_was_asked(web, ct_home):
    """Issue 39: read-only but for the stop, which is a POST carrying {"confirm": true} (the
    page asks first); a GET or an unconfirmed POST stops nothing."""
    (job_id,) = _jobs(ct_home, 1)
    headers = {"X-Cloudtrain-Token": "sekrit", "Host": "127.0.0.1"}
    assert web.get(f"/api/jobs/{job_id}/stop", headers=headers).status_code == 405
    got = web.post(f"/api/jobs/{job_id}/stop", headers=headers, data=json.dumps({}),
                   content_type="application/json")
    assert got.status_code == 400 and "confirm" in got.json["error"]
    assert open_store(ct_home).job(job_id).state == "pending"
    got = web.post(f"/api/jobs/{job_id}/stop", headers=headers,
                   data=json.dumps({"confirm": True}), content_type="application/json")
    assert got.status_code == 200 and got.json["ok"], got.json
    assert open_store(ct_home).job(job_id).state == "cancelled"
    assert web.post(f"/api/jobs/{job_id}/stop", data=json.dumps({"confirm": True}),
                    headers={"Host": "127.0.0.1"},
                    content_type="application/json").status_code == 403


def test_issue39_a_job_s_page_has_its_plan_commands_and_curves(web, ct_home):
    """Issue 39: a job's page: its timeline, the plan it was launched with, the commands to
    follow, stop or rerun it; its curves from metrics.jsonl (with its recipe's target); an
    unknown job is one line."""
    store = open_store(ct_home)
    job = store.create_job(name="r9", kind="recipe", recipe="resnet9", command="resnet9",
                           backend="local", spec={"kind": "recipe", "recipe": "resnet9",
                                                  "profile": "smoke", "args": {"epochs": 2}})
    jobdir = ct_home / "jobs" / job.id
    jobdir.mkdir(parents=True)
    (jobdir / "metrics.jsonl").write_text(
        "".join(json.dumps({"epoch": e, "train_loss": 1 / e, "test_acc": 0.4 * e}) + "\n"
                for e in (1, 2)))
    store.update_job(job.id, jobdir=str(jobdir), host={"kind": "local"})
    store.close()
    page = _get(web, f"/api/jobs/{job.id}").json
    assert ["job", "resnet9 (smoke) epochs=2"] in page["plan"]
    assert page["commands"]["rerun"] == ("cloudtrain launch --recipe resnet9 --profile smoke "
                                         "--set epochs=2")
    assert page["timeline"][0]["name"] == "pending"
    (curves,) = _get(web, f"/api/metrics?jobs={job.id}").json["jobs"]
    assert [r["train_loss"] for r in curves["rows"]] == [1.0, 0.5]
    assert curves["target"] == 0.94 and curves["target_metric"] == "test_acc"
    missing = _get(web, "/api/jobs/nosuchjob")
    assert missing.status_code == 400 and "nosuchjob" in missing.json["error"]
    assert _get(web, "/api/metrics?jobs=").status_code == 400


def test_issue39_the_cost_page_says_what_spot_saved(web, ct_home):
    """Issue 39: the cost page's spot savings (ledger.spot_savings): a spot instance's hour
    at its price history against the same hour on-demand at the catalog's price; an
    on-demand instance is not counted, a type the catalog has no price for is counted apart."""
    from cloudtrain import catalog
    from cloudtrain.state import Instance

    store = open_store(ct_home)
    job = store.create_job(name="s", kind="command", recipe=None, command="x", backend="aws",
                           spec={"kind": "command"})
    t0 = 1_800_000_000.0
    for n, (market, kind, history) in enumerate([
            ("spot", "g5.xlarge", [[t0 - 60, 0.40]]), ("on-demand", "g5.xlarge", None),
            ("spot", "x9.unknown", [[t0 - 60, 0.10]])]):
        store.add_instance(Instance(
            id=f"i-{n}", job_id=job.id, provider="aws", region="us-east-1", zone="us-east-1a",
            instance_type=kind, market=market, state="terminated", launched_at=t0,
            terminated_at=t0 + 3600, price_per_hour=1.006 if market == "on-demand" else None,
            details={"spot_history": history} if history else {}))
    store.close()
    spot = _get(web, "/api/cost?by=day").json["spot"]
    on_demand = catalog.get("g5.xlarge").on_demand["us-east-1"]
    assert spot["instances"] == 1 and spot["unpriced"] == 1
    assert spot["spot_usd"] == pytest.approx(0.40)
    assert spot["on_demand_usd"] == pytest.approx(on_demand)
    assert spot["saved_usd"] == pytest.approx(on_demand - 0.40)
    assert _get(web, "/api/cost?by=week").status_code == 400


def test_issue39_fuzzed_queries_are_answered_or_refused_in_one_line(web, ct_home):
    """Issue 39: whatever the query (filters, page, job reference, cost grouping), the API
    answers 200 or refuses with 400 and one line; never a 500 or a traceback."""
    from hypothesis import HealthCheck, given, settings, strategies as st
    from urllib.parse import quote

    _jobs(ct_home, 3)
    text = st.text(max_size=30)

    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(state=text, recipe=text, name=text, since=text, offset=text, limit=text, ref=text,
           by=text)
    def check(state, recipe, name, since, offset, limit, ref, by):
        q = "&".join(f"{k}={quote(v)}" for k, v in (
            ("state", state), ("recipe", recipe), ("name", name), ("since", since),
            ("offset", offset), ("limit", limit)))
        for path in (f"/api/jobs?{q}", f"/api/jobs/{quote(ref, safe='')}",
                     f"/api/jobs/{quote(ref, safe='')}/log?offset={quote(offset)}",
                     f"/api/metrics?jobs={quote(ref)}", f"/api/cost?by={quote(by)}&since="
                     f"{quote(since)}"):
            got = _get(web, path)
            assert got.status_code in (200, 400, 404), (path, got.status_code, got.data[:300])
            if got.status_code == 400:
                assert "\n" not in got.json["error"], (path, got.json)

    check()
