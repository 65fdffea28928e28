"""Job history (issue 16): what `status` shows, and `rm` / `prune`, on a real SQLite store and
real files under a temporary CLOUDTRAIN_HOME."""

from __future__ import annotations

import datetime
import fnmatch
import json
import os
import random
import shutil

import pytest

from cloudtrain import history, job_views, state, state_schema
from cloudtrain.errors import UsageError
from cloudtrain.state import Instance, Store
from conftest import store_of_version

NOW = 2_000_000_000.0  # a fixed "now" (2033): every age below is relative to it
DAY = 86400.0
TABLES = ("jobs", "events", "instances", "attempts")


@pytest.fixture
def store(ct_home):
    s = Store(ct_home / "state.db")
    yield s
    s.close()


def _insert(store, rows: list[dict]) -> None:
    """Jobs written straight into the table in one transaction (1,000 in milliseconds)."""
    with store.transaction() as db:
        for r in rows:
            db.execute("INSERT INTO jobs (id, name, kind, recipe, command, backend, state, "
                       "created_at, ended_at, spec) VALUES (?, ?, 'recipe', ?, 'x', 'local', "
                       "?, ?, ?, ?)",
                       (r["id"], r.get("name"), r.get("recipe"), r["state"], r["created_at"],
                        r.get("ended_at"), json.dumps(r.get("spec", {}))))


def _thousand(seed: int = 0) -> list[dict]:
    """1,000 jobs over 100 days: 4 still active (one created 90 days ago), the rest finished,
    a few dozen of them in the last 7 days; names exp-0 .. exp-999, three recipes."""
    rng = random.Random(seed)
    rows, ids = [], set()
    for i in range(1000):
        job_id = f"{rng.getrandbits(32):08x}"
        while job_id in ids:
            job_id = f"{rng.getrandbits(32):08x}"
        ids.add(job_id)
        created = NOW - 100 * DAY + i * (99.9 * DAY / 1000)
        active = i in (100, 997, 998, 999)
        rows.append({"id": job_id, "name": f"exp-{i}", "created_at": created,
                     "recipe": rng.choice(["resnet9", "airbench94", "wide-resnet34"]),
                     "state": rng.choice(state.ACTIVE_STATES) if active else
                     rng.choice(state.TERMINAL_STATES),
                     "ended_at": None if active else created + rng.uniform(60, 3 * DAY)})
    return rows


def _newest_first(rows):
    return [r["id"] for r in sorted(rows, key=lambda r: (-r["created_at"], r["id"]))]


def _ids(jobs):
    return [j.id for j in jobs]


# -- status: the default view, -a, filters --------------------------------------------------


def test_default_view_is_every_active_job_and_the_20_latest_finished_in_7_days(store):
    """issue 16: without -a, status shows every job not finished (the one created 90 days ago
    too) and, of the finished ones, those that ended in the last 7 days, 20 at most, the most
    recently ended; the footer counts the rest."""
    rows = _thousand()
    _insert(store, rows)
    shown, hidden = history.select(store, now=NOW)
    active = [r for r in rows if r["state"] not in state.TERMINAL_STATES]
    recent = sorted((r for r in rows if r["state"] in state.TERMINAL_STATES
                     and r["ended_at"] >= NOW - 7 * DAY), key=lambda r: -r["ended_at"])
    assert len(active) == 4 and len(recent) > 20  # the cap is what limits here
    assert _ids(shown) == _newest_first(active + recent[:20])
    assert hidden == 1000 - 24
    assert history.footer(hidden) == "(976 older jobs not shown: cloudtrain status -a)"


def test_default_view_window_is_7_days_when_fewer_than_20_finished(store):
    """issue 16: with few jobs the 7-day window decides: ended 6.9 days ago is shown, 7.1 days
    ago is not (and no footer when nothing is hidden)."""
    _insert(store, [
        {"id": "0000000a", "state": "succeeded", "created_at": NOW - 8 * DAY,
         "ended_at": NOW - 6.9 * DAY},
        {"id": "0000000b", "state": "failed", "created_at": NOW - 8 * DAY,
         "ended_at": NOW - 7.1 * DAY},
        {"id": "0000000c", "state": "running", "created_at": NOW - 300 * DAY},
        {"id": "0000000d", "state": "weird-state-from-an-edit", "created_at": NOW - 300 * DAY},
    ])
    shown, hidden = history.select(store, now=NOW)
    # A state no cloudtrain wrote counts as not finished: shown, never hidden.
    assert sorted(_ids(shown)) == ["0000000a", "0000000c", "0000000d"]
    assert hidden == 1
    assert history.footer(hidden) == "(1 older job not shown: cloudtrain status -a)"
    assert history.select(store, all_=True, now=NOW)[1] == 0
    assert history.footer(0) is None


def test_all_lists_every_job_newest_first_and_limit_cuts(store):
    """issue 16: -a shows all 1,000 jobs, newest first; --limit cuts and the footer says so."""
    rows = _thousand()
    _insert(store, rows)
    shown, hidden = history.select(store, all_=True, now=NOW)
    assert _ids(shown) == _newest_first(rows) and hidden == 0
    shown, hidden = history.select(store, all_=True, limit=50, now=NOW)
    assert _ids(shown) == _newest_first(rows)[:50] and hidden == 950
    assert history.footer(hidden, all_=True) == "(950 more jobs not shown: raise --limit)"
    shown, hidden = history.select(store, limit=3, now=NOW)
    assert len(shown) == 3 and hidden == 997


def _reference(rows, states=(), recipe=None, name=None, since=None):
    """What the filters mean, computed in Python from the rows themselves."""
    return [r for r in rows
            if (not states or r["state"] in states)
            and (recipe is None or r["recipe"] in ",".join(
                (recipe,) if isinstance(recipe, str) else recipe).split(","))
            and (name is None or r["name"] == name or fnmatch.fnmatchcase(r["name"], name))
            and (since is None or r["created_at"] >= since)]


@pytest.mark.parametrize("states, recipe, name, since", [
    (("failed",), None, None, None),
    (("failed", "cancelled"), None, None, None),
    ((), "resnet9", None, None),
    ((), ("resnet9", "airbench94"), None, None),  # U18: several recipes: any of them
    ((), ("resnet9,wide-resnet34",), None, None),
    ((), None, "exp-7*", None),
    ((), None, "exp-1?", None),
    ((), None, "exp-[!1-8]?", None),       # a shell set, negated with !
    ((), None, "exp-[^9]", None),          # ^ first in a set is a literal in the shell
    ((), None, "exp-42", None),
    ((), None, "exp-4", None),             # exact: not exp-40..exp-49
    (("succeeded",), "airbench94", "exp-*5", "30d"),
    ((), None, None, "2h"),
    ((), None, None, "3d"),
])
def test_filters_on_1000_jobs_match_what_they_mean(store, states, recipe, name, since):
    """issue 16: --state, --recipe, --name (exact or shell glob), --since, alone and together,
    select exactly the jobs they describe, with -a and in the default view."""
    rows = _thousand(seed=1)
    _insert(store, rows)
    filters = history.parse_filters(states, recipe, name, since, now=NOW)
    expected = _reference(rows, states, recipe, name, filters.since)
    shown, hidden = history.select(store, filters, all_=True, now=NOW)
    assert _ids(shown) == _newest_first(expected) and hidden == 0
    shown, hidden = history.select(store, filters, now=NOW)
    assert set(_ids(shown)) <= {r["id"] for r in expected}
    assert len(shown) + hidden == len(expected)
    assert all(j.state not in state.TERMINAL_STATES or j.ended_at >= NOW - 7 * DAY
               for j in shown)


def test_a_name_with_glob_characters_also_matches_exactly(store):
    """issue 16: --name 'run[1]' finds the job named run[1] (exact) though as a glob it
    would mean run1."""
    _insert(store, [{"id": "0000000a", "name": "run[1]", "state": "failed",
                     "created_at": NOW - DAY, "ended_at": NOW - DAY},
                    {"id": "0000000b", "name": "run1", "state": "failed",
                     "created_at": NOW - DAY, "ended_at": NOW - DAY},
                    {"id": "0000000c", "name": "other", "state": "failed",
                     "created_at": NOW - DAY, "ended_at": NOW - DAY}])
    shown, _ = history.select(store, history.parse_filters(name="run[1]"), all_=True, now=NOW)
    assert sorted(_ids(shown)) == ["0000000a", "0000000b"]


def test_u18_several_recipes_all_count_and_the_footer_repeats_them(store):
    """U18: `--recipe resnet9 --recipe airbench94` shows both recipes' jobs (it showed only
    the last one's)."""
    filters = history.parse_filters((), ("resnet9", "airbench94"), None, None, now=NOW)
    assert filters.recipes == ("resnet9", "airbench94")
    assert history.footer(2, filters) == ("(2 older jobs not shown: cloudtrain status -a "
                                          "--recipe resnet9 --recipe airbench94)")


def test_u6_an_empty_filter_result_says_what_matched_nothing(store):
    """U6: a filter that matches nothing says so, with the count of all jobs and the command
    that shows them; an unknown recipe name is said; "no jobs yet" only when there are none."""
    assert history.empty_view(store, history.Filters()) == (
        "no jobs yet: cloudtrain launch --recipe resnet9 --profile smoke --follow")
    _insert(store, _thousand(seed=3)[:23])
    assert history.empty_view(store, history.parse_filters(["running"], now=NOW)) == (
        "no jobs match --state running (23 jobs in all: cloudtrain status -a)")
    assert history.empty_view(store, history.parse_filters((), "resnet99", now=NOW)) == (
        "no jobs match --recipe resnet99 (23 jobs in all: cloudtrain status -a); no recipe "
        "is named resnet99 (cloudtrain recipes lists them)")
    assert history.empty_view(store, history.parse_filters(name="nomatch*", now=NOW)) == (
        "no jobs match --name 'nomatch*' (23 jobs in all: cloudtrain status -a)")
    assert history.empty_view(store, history.Filters()) == (
        "no active or recent jobs (23 jobs in all: cloudtrain status -a)")


def test_footer_gives_the_command_with_the_same_filters(store):
    """issue 16: the footer's command shows the hidden jobs: -a and the filters as given."""
    filters = history.parse_filters(["failed"], "resnet9", "exp *", "3d", now=NOW)
    assert history.footer(5, filters) == ("(5 older jobs not shown: cloudtrain status -a "
                                          "--state failed --recipe resnet9 --name 'exp *' "
                                          "--since 3d)")


def test_an_unknown_state_is_one_line_listing_the_states():
    """issue 16: --state bogus is refused in one line that lists every valid state."""
    with pytest.raises(UsageError) as exc:
        history.parse_filters(["running", "bogus"])
    assert exc.value.message == (
        "--state 'bogus': not a job state; the states are pending, provisioning, syncing, "
        "setting-up, queued, staging, running, recovering, succeeded, failed, preempted, "
        "cancelled, stopped")
    assert history.parse_filters(["Failed,cancelled", "failed"]).states == ("failed",
                                                                            "cancelled")


def test_u47_a_misspelt_state_gets_did_you_mean():
    """U47: `status --state runing` said only `not a job state; the states are ...`, where
    every other typo error has a "did you mean"."""
    with pytest.raises(UsageError) as caught:
        history.parse_filters(["runing"])
    assert caught.value.message.startswith(
        "--state 'runing': not a job state (did you mean running?); the states are pending, ")
    with pytest.raises(UsageError) as caught:
        history.parse_filters(["succeeded,canceled"])
    assert "(did you mean cancelled?)" in caught.value.message
    with pytest.raises(UsageError) as caught:
        history.parse_filters(["bogus"])
    assert "did you mean" not in caught.value.message


def test_since_takes_a_duration_or_a_date():
    """issue 16: --since 2h, 3d, 1w (ledger's units) or a date (local midnight), or a date
    and time."""
    assert history.parse_time("2h", "--since", NOW) == NOW - 7200
    assert history.parse_time("3d", "--since", NOW) == NOW - 3 * DAY
    assert history.parse_time("1w", "--since", NOW) == NOW - 7 * DAY
    midnight = datetime.datetime(2026, 11, 1).timestamp()
    assert history.parse_time("2026-11-01", "--since", NOW) == midnight
    assert history.parse_time("2026-11-01T14:30", "--since", NOW) == midnight + 14.5 * 3600
    assert history.parse_time("2026-11-01T00:00+00:00", "--since", NOW) == 1793491200.0


def test_u14_durations_say_minutes_and_months_without_doubt():
    """U14: min and mo are minutes and months (30 days), y a year; m stays minutes where it
    only chooses what to show (status --since 30m), but prune, which deletes, refuses it: a
    cron line `prune --older-than 6m` meant six months, not six minutes."""
    assert history.parse_time("30min", "--since", NOW) == NOW - 1800
    assert history.parse_time("30m", "--since", NOW) == NOW - 1800
    assert history.parse_time("6mo", "--since", NOW) == NOW - 6 * 30 * DAY
    assert history.parse_time("1y", "--since", NOW) == NOW - 365 * DAY
    with pytest.raises(UsageError) as exc:
        history.parse_time("6m", "--older-than", NOW, destructive=True)
    assert exc.value.message == "--older-than '6m': m could mean minutes or months"
    assert exc.value.hint == "write 6min or 6mo"
    assert history.parse_time("6min", "--older-than", NOW, destructive=True) == NOW - 360


def test_u14_prune_says_the_moment_it_cuts_at(store, ct_home):
    """U14: the prune listing says before when jobs finished, as a date and an age."""
    from cloudtrain import job_views

    _job(store, ct_home, created=NOW - 90 * DAY)
    plan = history.plan_removal(store, older_than="30d", now=NOW)
    text = job_views.removal_plan(plan, now=NOW)
    cut = datetime.datetime.fromtimestamp(NOW - 30 * DAY).strftime("%Y-%m-%d %H:%M")
    assert text.splitlines()[0] == f"jobs that finished before {cut} (30 days ago):"


def test_u26_the_removal_listing_is_aligned(store, ct_home):
    """U26: a 64-character name does not push its row out of line with the others."""
    from cloudtrain import job_views

    _job(store, ct_home, name="n" * 64)
    _job(store, ct_home, name="short")
    lines = job_views.removal_plan(history.plan_removal(store, older_than="1d", now=NOW + 2 * DAY),
                                now=NOW).splitlines()
    rows = [l for l in lines if l.startswith("  ")]
    assert len(rows) == 2
    assert len({l.index(" succeeded ") for l in rows}) == 1, lines


@pytest.mark.parametrize("text, message", [
    ("", "--since needs a value: a duration (min, h, d, w or mo after a number: 2h, 3d, 2w) "
         "or a date (2026-11-01)"),
    ("3x", "--since '3x': expected a duration (min, h, d, w or mo after a number: 2h, 3d, "
           "2w) or a date (2026-11-01)"),
    ("yesterday", "--since 'yesterday': expected a duration"),
    ("2026-13-01", "--since '2026-13-01': expected a duration"),
    ("nand", "--since 'nand': expected a duration"),
    ("1e400d", "--since '1e400d': expected a duration"),
    ("-3d", "--since '-3d' is in the future"),
    ("2099-01-01", "--since '2099-01-01' is in the future"),
])
def test_since_refuses_what_is_no_time_in_the_past(text, message):
    """issue 16: a --since that is no point in the past is a one-line UsageError."""
    with pytest.raises(UsageError) as exc:
        history.parse_filters(since=text, now=NOW)
    assert exc.value.message.startswith(message) and "\n" not in exc.value.message


@pytest.mark.parametrize("kwargs, message", [
    ({"recipe": " "}, "--recipe needs a value, got ' '"),
    ({"name": ""}, "--name needs a value, got ''"),
    ({"name": "exp-\udcff"}, "--name 'exp-\\udcff' is not UTF-8 text"),
])
def test_empty_or_undecodable_filters_are_refused(kwargs, message):
    """issue 16: an empty --recipe/--name, or one not UTF-8 (undecodable argv bytes), is a
    UsageError, not an SQLite error."""
    with pytest.raises(UsageError) as exc:
        history.parse_filters(**kwargs)
    assert exc.value.message == message


def test_the_default_view_reads_through_indexes(store):
    """issue 16: the default view's queries use migration 6's indexes (the few unfinished
    jobs, the latest finished ones), not a scan of every job: what keeps 10,000 jobs fast."""
    _insert(store, _thousand())
    seen = []
    store.db.set_trace_callback(seen.append)
    history.select(store, now=NOW)
    store.db.set_trace_callback(None)
    plans = {sql: " / ".join(r[3] for r in store.db.execute("EXPLAIN QUERY PLAN " + sql,
                                                             [NOW] * sql.count("?")))
             for sql in (s.replace(str(NOW), "?") for s in seen if s.startswith("SELECT *"))}
    assert len(plans) == 2, plans
    assert any("USING INDEX jobs_unfinished" in p for p in plans.values()), plans
    assert any("USING INDEX jobs_finished_at" in p for p in plans.values()), plans
    assert "jobs_name" in {r["name"] for r in store.db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index'")}


# -- rm and prune --------------------------------------------------------------------------


def _job(store, ct_home, *, name=None, end="succeeded", created=None, ended=None,
         instance=("local", "terminated"), files: dict | None = None, spec=None):
    """A job as a launch leaves it: its rows in every table (events, an instance, an attempt)
    and files in $CLOUDTRAIN_HOME/jobs/<id>/."""
    created = NOW - 60 * DAY if created is None else created
    job = store.create_job(name=name, kind="command", recipe=None, command="true",
                           backend="local", spec=spec or {"kind": "command"}, at=created)
    provider, inst_state = instance
    store.add_instance(Instance(id=f"{provider}-{job.id}", job_id=job.id, provider=provider,
                                region=None, zone=None, instance_type="t", market="on-demand",
                                state=inst_state, launched_at=created, terminated_at=None,
                                price_per_hour=1.0, details={"disk_gb": 8}))
    store.add_attempt(job.id, 1, started_at=created)
    store.set_state(job.id, state.RUNNING, at=created + 1)
    if end:
        store.set_state(job.id, end, at=created + 2 if ended is None else ended)
    jobdir = ct_home / "jobs" / job.id
    for rel, data in (files if files is not None else {"output.log": b"hello\n",
                                                       "checkpoints/last.pt": b"x" * 1000}
                      ).items():
        (jobdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (jobdir / rel).write_bytes(data)
    return store.job(job.id)


def _rows(store, job_id) -> dict[str, int]:
    """The job's rows in every table that has them (read from the schema, and the four
    named ones whatever the schema says)."""
    out = {"jobs": store.db.execute("SELECT count(*) FROM jobs WHERE id = ?",
                                    (job_id,)).fetchone()[0]}
    for table in {*store.job_tables(), *TABLES[1:]}:
        out[table] = store.db.execute(f'SELECT count(*) FROM "{table}" WHERE job_id = ?',
                                      (job_id,)).fetchone()[0]
    return out


def _snapshot(store, root) -> tuple:
    """Every row of every table, and every path with its content, under `root`."""
    tables = [r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = "
                                             "'table' ORDER BY name")]
    rows = {t: sorted(map(tuple, store.db.execute(f'SELECT * FROM "{t}"'))) for t in tables}
    files = {}
    for top, dirs, names in os.walk(root):
        for n in dirs + names:
            p = os.path.join(top, n)
            files[p] = os.readlink(p) if os.path.islink(p) else (
                None if os.path.isdir(p) else open(p, "rb").read())
    return rows, files


def test_rm_removes_every_row_in_every_table_and_the_directory(store, ct_home):
    """issue 16: after rm, the job has no row left in any table (jobs, events, instances,
    attempts, and any table with a job_id) and no directory; another job keeps all of its."""
    gone = _job(store, ct_home, name="old")
    kept = _job(store, ct_home, name="other")
    before = _rows(store, gone.id)
    assert all(before.values()), before  # it really had rows everywhere
    kept_rows = _rows(store, kept.id)
    plan = history.plan_removal(store, [gone.id], now=NOW)
    assert [r.job.id for r in plan.removals] == [gone.id] and plan.refused == []
    assert plan.bytes == 6 + 1000 and plan.files == 2
    summary = history.remove(store, plan)
    assert summary.removed == [gone.id] and summary.bytes == 1006
    assert summary.rows == sum(before.values())
    assert set(_rows(store, gone.id).values()) == {0}
    assert not (ct_home / "jobs" / gone.id).exists()
    assert _rows(store, kept.id) == kept_rows
    assert (ct_home / "jobs" / kept.id / "checkpoints" / "last.pt").read_bytes() == b"x" * 1000


def test_a_table_a_later_migration_adds_is_cleaned_too(store, ct_home):
    """issue 16: the tables are read from the schema: a new table with a job_id column does
    not keep rows of a removed job."""
    job = _job(store, ct_home)
    store.db.execute("CREATE TABLE notes (job_id TEXT REFERENCES jobs(id), text TEXT)")
    store.db.execute("INSERT INTO notes VALUES (?, 'hi')", (job.id,))
    history.remove(store, history.plan_removal(store, [job.id], now=NOW))
    assert store.db.execute("SELECT count(*) FROM notes").fetchone()[0] == 0
    assert set(_rows(store, job.id).values()) == {0}


def test_rm_takes_ids_prefixes_and_names_each_job_once(store, ct_home):
    """issue 16: rm accepts an id, a unique id prefix or a name (Store.find_job), each job
    once."""
    a = _job(store, ct_home, name="first")
    b = _job(store, ct_home, name="second")
    c = _job(store, ct_home)
    for _ in range(40):
        _job(store, ct_home, files={})
    plan = history.plan_removal(store, [a.id[:7], "second", c.id, c.id[:6]], now=NOW)
    assert [r.job.id for r in plan.removals] == [a.id, b.id, c.id] and plan.refused == []
    history.remove(store, plan)
    for job in (a, b, c):
        assert set(_rows(store, job.id).values()) == {0}
        assert not (ct_home / "jobs" / job.id).exists()
    assert store.db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 40


def test_u26_a_reference_that_names_no_job_refuses_the_whole_rm(store, ct_home):
    """U26: `rm s1b nosuch` removed s1b, then failed (exit 1) on nosuch; every other command
    refuses an unknown job with exit 2 before doing anything. rm does the same now: a typo in
    a list of jobs removes none of them."""
    a = _job(store, ct_home, name="first")
    for _ in range(40):
        _job(store, ct_home, files={})
    ids = [r[0] for r in store.db.execute("SELECT id FROM jobs")]
    shared = next(p for p in "0123456789abcdef" if sum(i.startswith(p) for i in ids) > 1)
    for refs, message in (([a.id, "nope"], "no job 'nope'"),
                          (["first", shared], f"job id prefix '{shared}' is ambiguous")):
        with pytest.raises(UsageError) as exc:
            history.plan_removal(store, refs, now=NOW)
        assert exc.value.message.startswith(message) and exc.value.exit_code == 2
    assert store.job(a.id) is not None and (ct_home / "jobs" / a.id).exists()


@pytest.mark.parametrize("active", [s for s in state.ACTIVE_STATES])
def test_rm_and_prune_never_touch_a_job_that_has_not_finished(store, ct_home, active):
    """issue 16: a job in any active state, however old, is not removed: prune leaves it out,
    rm refuses it with the reason and `cloudtrain down`, and its rows and files stay."""
    job = _job(store, ct_home, end=None, created=NOW - 90 * DAY)
    store.update_job(job.id, state=active)
    done = _job(store, ct_home, created=NOW - 90 * DAY)
    before = _rows(store, job.id)
    plan = history.plan_removal(store, older_than="30d", now=NOW)
    assert [r.job.id for r in plan.removals] == [done.id] and plan.refused == []
    history.remove(store, plan)
    plan = history.plan_removal(store, [job.id], now=NOW)
    assert plan.removals == []
    assert [(r.ref, r.reason, r.hint) for r in plan.refused] == [
        (job.id, f"job {job.id} is {active}: only finished jobs are removed",
         f"stop it first: cloudtrain down {job.id}")]
    history.remove(store, plan)
    assert _rows(store, job.id) == before
    assert (ct_home / "jobs" / job.id / "output.log").exists()
    assert not (ct_home / "jobs" / done.id).exists()


@pytest.mark.parametrize("inst_state", ["running", "requested", "stopped", "shutting-down"])
def test_rm_and_prune_keep_a_finished_job_whose_instance_may_still_bill(store, ct_home,
                                                                       inst_state):
    """issue 16: a finished job whose cloud instance is not terminated (a --keep job's kept
    instance) is refused by rm and prune with the hint `cloudtrain down JOB`; once the
    instance is terminated it goes. A local instance left 'running' bills nothing."""
    kept = _job(store, ct_home, instance=("aws", inst_state))
    local = _job(store, ct_home, instance=("local", "running"))
    before = _rows(store, kept.id)
    for plan in (history.plan_removal(store, older_than="30d", now=NOW),
                 history.plan_removal(store, [kept.id, local.id], now=NOW)):
        assert [r.job.id for r in plan.removals] == [local.id]
        assert [(r.ref, r.reason, r.hint) for r in plan.refused] == [
            (kept.id, f"job {kept.id} is succeeded but its instance aws-{kept.id} is "
                      f"{inst_state} and may still bill",
             f"terminate it first: cloudtrain down {kept.id}")]
    summary = history.remove(store, history.plan_removal(store, older_than="30d", now=NOW))
    assert summary.removed == [local.id] and summary.refused == []  # kept when planned
    assert _rows(store, kept.id) == before and (ct_home / "jobs" / kept.id).is_dir()
    store.update_instance(f"aws-{kept.id}", state="terminated", terminated_at=NOW)
    assert history.remove(store, history.plan_removal(store, [kept.id])).removed == [kept.id]


def test_remove_checks_each_job_again(store, ct_home):
    """issue 16: a job that may bill again after the plan was shown (its kept instance
    relaunched, another instance recorded) is kept by remove: nothing of it is deleted."""
    job = _job(store, ct_home)
    plan = history.plan_removal(store, [job.id], now=NOW)
    assert len(plan.removals) == 1
    store.add_instance(Instance(id="i-new", job_id=job.id, provider="aws", region="us-east-1",
                                zone=None, instance_type="g5.xlarge", market="spot",
                                state="requested", launched_at=NOW, terminated_at=None,
                                price_per_hour=1.0, details=None))
    before = _snapshot(store, ct_home)
    summary = history.remove(store, plan)
    assert summary.removed == [] and "i-new is requested" in summary.refused[0].reason
    assert _snapshot(store, ct_home) == before


def test_a_job_an_active_job_resumes_from_is_kept(store, ct_home):
    """issue 16: while a job launched with --resume-from (by id prefix or name) is active,
    the job whose checkpoints it takes is kept; once it ended, the source can go."""
    source = _job(store, ct_home, name="base")
    other = _job(store, ct_home, name="unrelated")
    resumer = _job(store, ct_home, end=None, created=NOW - DAY,
                   spec={"kind": "recipe", "resume_from": "base"})
    plan = history.plan_removal(store, older_than="30d", now=NOW)
    assert [r.job.id for r in plan.removals] == [other.id]
    assert plan.refused[0].reason == (f"job {source.id}: job {resumer.id} (running) resumes "
                                      "from its checkpoints")
    store.update_job(resumer.id, spec={"kind": "recipe", "resume_from": source.id[:5]})
    assert history.plan_removal(store, [source.id], now=NOW).removals == []
    store.set_state(resumer.id, state.SUCCEEDED)
    assert [r.job.id for r in history.plan_removal(store, [source.id]).removals] == [source.id]


def test_prune_goes_by_when_the_job_finished(store, ct_home):
    """issue 16: prune --older-than 30d removes jobs that finished more than 30 days ago: not
    one created 40 days ago that ran until 10 days ago; a date works as well."""
    long_run = _job(store, ct_home, created=NOW - 40 * DAY, ended=NOW - 10 * DAY)
    old = _job(store, ct_home, created=NOW - 40 * DAY, ended=NOW - 35 * DAY)
    assert [r.job.id for r in history.plan_removal(store, older_than="30d",
                                                   now=NOW).removals] == [old.id]
    date = datetime.date.fromtimestamp(NOW - 5 * DAY).isoformat()
    assert {r.job.id for r in history.plan_removal(store, older_than=date,
                                                   now=NOW).removals} == {old.id, long_run.id}


def test_the_dry_run_plan_changes_nothing(store, ct_home):
    """issue 16: planning (what --dry-run shows) writes no row and touches no file."""
    for _ in range(3):
        _job(store, ct_home)
    _job(store, ct_home, instance=("aws", "running"))
    _job(store, ct_home, end=None)
    before = _snapshot(store, ct_home)
    everything = [r[0] for r in store.db.execute("SELECT id FROM jobs")]
    for plan, refused in ((history.plan_removal(store, older_than="1d", now=NOW), 1),
                          (history.plan_removal(store, everything, now=NOW), 2)):
        assert len(plan.removals) == 3 and len(plan.refused) == refused  # prune: not active
        assert _snapshot(store, ct_home) == before


def test_a_symlinked_job_directory_is_unlinked_not_followed(store, ct_home, tmp_path):
    """issue 16: jobs/<id> that is a symlink to elsewhere: the link goes, the directory it
    points to and its files stay; a symlink inside a real job directory is not followed
    either."""
    outside = tmp_path / "precious"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "data.bin").write_bytes(b"keep me")
    linked = _job(store, ct_home, files={})
    (ct_home / "jobs").mkdir(exist_ok=True)
    os.symlink(outside, ct_home / "jobs" / linked.id)
    inner = _job(store, ct_home, files={"output.log": b"log"})
    os.symlink(outside, ct_home / "jobs" / inner.id / "escape")
    plan = history.plan_removal(store, [linked.id, inner.id], now=NOW)
    link_plan = next(r for r in plan.removals if r.job.id == linked.id)
    assert link_plan.link_to == str(outside) and link_plan.bytes == 0
    history.remove(store, plan)
    assert not os.path.lexists(ct_home / "jobs" / linked.id)
    assert not os.path.lexists(ct_home / "jobs" / inner.id)
    assert (outside / "sub" / "data.bin").read_bytes() == b"keep me"
    assert set(_rows(store, linked.id).values()) == {0}


def test_only_a_directory_named_by_a_real_job_id_is_removed(store, ct_home):
    """issue 16: a job row whose id is not one cloudtrain makes (an edited row: '..',
    upper case) has its rows removed but never becomes a path: nothing on disk is touched."""
    victim = ct_home / "victim"
    victim.mkdir()
    (victim / "f").write_text("x")
    (ct_home / "jobs" / "ABCDEF12").mkdir(parents=True)
    _insert(store, [{"id": "../victim", "state": "failed", "created_at": NOW - 90 * DAY},
                    {"id": "ABCDEF12", "state": "failed", "created_at": NOW - 90 * DAY}])
    plan = history.plan_removal(store, ["../victim", "ABCDEF12"], now=NOW)
    assert [(r.job.id, r.path) for r in plan.removals] == [("../victim", None),
                                                           ("ABCDEF12", None)]
    history.remove(store, plan)
    assert (victim / "f").read_text() == "x" and (ct_home / "jobs" / "ABCDEF12").is_dir()
    assert store.db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_files_that_cannot_be_removed_keep_the_job_records(store, ct_home, monkeypatch):
    """issue 16: files go first, rows after: when removing the files fails half-way, the
    job's rows all stay (rolled back) and it is reported kept; the next rm finishes it."""
    job = _job(store, ct_home)
    other = _job(store, ct_home)
    before = _rows(store, job.id)
    real_rmtree = shutil.rmtree

    def failing(path, *a, **kw):
        if os.path.basename(path) == job.id:
            os.unlink(os.path.join(path, "output.log"))  # some files went before the error
            raise PermissionError(13, "Permission denied", os.path.join(path, "checkpoints"))
        real_rmtree(path, *a, **kw)

    monkeypatch.setattr(shutil, "rmtree", failing)
    summary = history.remove(store, history.plan_removal(store, [job.id, other.id], now=NOW))
    assert summary.removed == [other.id]
    assert [(r.ref, r.reason) for r in summary.refused] == [
        (job.id, f"job {job.id}: could not remove {ct_home}/jobs/{job.id}/checkpoints: "
                 "Permission denied; its records are kept")]
    assert _rows(store, job.id) == before
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert history.remove(store, history.plan_removal(store, [job.id])).removed == [job.id]
    assert set(_rows(store, job.id).values()) == {0} and not (ct_home / "jobs" / job.id).exists()


def test_a_job_removed_meanwhile_is_reported_not_an_error(store, ct_home):
    """issue 16: two `rm` at once: the second finds the job gone and says so."""
    job = _job(store, ct_home)
    plan = history.plan_removal(store, [job.id], now=NOW)
    assert history.remove(store, plan).removed == [job.id]
    summary = history.remove(store, plan)
    assert summary.removed == [] and summary.refused[0].reason == \
        f"job {job.id} was removed meanwhile"


def test_plan_removal_wants_refs_or_an_age():
    """issue 16: rm without jobs, or refs and --older-than together, or an age that is no
    duration, are UsageErrors."""
    store = Store(os.environ["CLOUDTRAIN_HOME"] + "/state.db")
    with pytest.raises(UsageError, match="give job ids or names"):
        history.plan_removal(store)
    with pytest.raises(UsageError, match="not both"):
        history.plan_removal(store, ["a"], older_than="3d")
    with pytest.raises(UsageError, match=r"^--older-than '30': expected a duration"):
        history.plan_removal(store, older_than="30")
    store.close()


def test_plan_and_summary_text(store, ct_home):
    """issue 16: what the CLI prints before asking: each job, its files and size, what is
    kept and why; and after: how much went."""
    job = _job(store, ct_home, name="exp", created=NOW - 60 * DAY)
    live = _job(store, ct_home, instance=("aws", "running"))
    plan = history.plan_removal(store, [job.id, live.id], now=NOW)
    ended = datetime.date.fromtimestamp(NOW - 60 * DAY + 2).isoformat()
    assert job_views.removal_plan(plan).splitlines() == [
        "remove 1 finished job(s) and 1.0 kB of files (2 files):",
        f"  {job.id}  exp  succeeded  {ended}  {ct_home}/jobs/{job.id} (1.0 kB)",
        f"kept: job {live.id} is succeeded but its instance aws-{live.id} is running and may "
        f"still bill (terminate it first: cloudtrain down {live.id})"]
    assert job_views.removal_summary(history.remove(store, plan)) == \
        "removed 1 job(s) and 1.0 kB of files"
    assert job_views.removal_plan(history.Plan([], [])) == "nothing to remove"


def test_migration_6_keeps_a_version_5_store(tmp_path):
    """issue 16: a store of schema 5 opens with the history indexes added and its jobs kept."""
    path = store_of_version(
        tmp_path / "v5.db", 5,
        "INSERT INTO jobs (id, kind, command, backend, state, created_at, spec) "
        "VALUES ('abcd1234', 'command', 'true', 'local', 'running', 1.0, '{}')")
    store = Store(path)
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == state_schema.SCHEMA_VERSION
    assert _ids(history.select(store, now=NOW)[0]) == ["abcd1234"]
    store.close()


def test_batches_keep_each_jobs_outcome_and_an_interrupt_loses_no_record(store, ct_home,
                                                                         monkeypatch):
    """issue 16: removals commit in batches (3 jobs here); a job whose files fail keeps its
    rows while the rest of its batch goes; an interrupt mid-batch rolls that batch back: a job
    whose files went keeps its records, and running the removal again finishes it."""
    monkeypatch.setattr(history, "BATCH_JOBS", 3)
    for i in range(10):
        _job(store, ct_home, created=NOW - 60 * DAY + i)
    plan = history.plan_removal(store, older_than="30d", now=NOW)
    order = [r.job.id for r in plan.removals]
    fail, interrupt = order[1], order[8]
    real_rmtree = shutil.rmtree

    def rmtree(path, *a, **kw):
        if os.path.basename(path) == fail:
            raise PermissionError(13, "Permission denied", str(path))
        if os.path.basename(path) == interrupt:
            raise KeyboardInterrupt
        real_rmtree(path, *a, **kw)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    with pytest.raises(KeyboardInterrupt):
        history.remove(store, plan)
    # Batches: [0, 2, 3] (1 failed), [4, 5, 6], then 7 went and 8 was interrupted.
    left = {r[0] for r in store.db.execute("SELECT id FROM jobs")}
    assert left == {order[1], order[7], order[8], order[9]}
    assert all(_rows(store, order[7]).values())  # its records, though its files are gone
    assert not (ct_home / "jobs" / order[7]).exists()
    for i in (1, 8, 9):
        assert (ct_home / "jobs" / order[i] / "output.log").exists()
    for i in (0, 2, 3, 4, 5, 6):
        assert set(_rows(store, order[i]).values()) == {0}
        assert not (ct_home / "jobs" / order[i]).exists()
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    summary = history.remove(store, history.plan_removal(store, older_than="30d", now=NOW))
    assert set(summary.removed) == left and summary.refused == []
    assert store.db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    assert not any((ct_home / "jobs").iterdir())


def test_plan_text_cannot_steer_the_terminal(store, ct_home):
    """issue 16: a job name or a link target holding escape sequences is printed inert."""
    job = _job(store, ct_home, name="a\x1b[2Jb", files={})
    (ct_home / "jobs").mkdir(exist_ok=True)
    os.symlink("/tmp/x\x1b]0;owned\x07", ct_home / "jobs" / job.id)
    text = job_views.removal_plan(history.plan_removal(store, [job.id], now=NOW))
    assert "\x1b" not in text and "\x07" not in text
    assert "a?[2Jb" in text and "(to /tmp/x?]0;owned?)" in text
