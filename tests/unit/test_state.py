from __future__ import annotations

import json
import sqlite3

import pytest

from cloudtrain import state, state_schema
from cloudtrain.errors import NotFound, UsageError
from cloudtrain.job_spec import JobFacts, JobSpec
from cloudtrain.market import Market
from cloudtrain.state import Store
from conftest import store_of_version


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def _job(store, name=None, at=None):
    return store.create_job(name=name, kind="command", recipe=None, command="true",
                            backend="local", spec={"kind": "command"}, at=at)


def test_new_store_has_schema_and_wal(tmp_path):
    Store(tmp_path / "s.db").close()
    db = sqlite3.connect(tmp_path / "s.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == state_schema.SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"jobs", "instances", "events"} <= tables


def test_a_newer_schema_is_refused(tmp_path):
    Store(tmp_path / "s.db").close()
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    with pytest.raises(UsageError, match="schema version 99, newer"):
        Store(tmp_path / "s.db")


def test_state_changes_record_events_and_end_once(store):
    job = _job(store)
    assert store.set_state(job.id, state.RUNNING, at=10.0)
    assert store.set_state(job.id, state.SUCCEEDED, at=20.0, exit_code=0)
    # A second observer noticing a different end does not rewrite history.
    assert not store.set_state(job.id, state.FAILED, at=30.0)
    job = store.job(job.id)
    assert job.state == state.SUCCEEDED and job.ended_at == 20.0 and job.exit_code == 0
    assert [e.phase for e in store.events(job.id)] == ["pending", "running", "succeeded"]


def test_find_job_by_id_prefix_and_name(store):
    a = _job(store, name="exp", at=1.0)
    b = _job(store, name="exp", at=2.0)
    assert store.find_job(a.id).id == a.id
    assert store.find_job("exp").id == b.id  # the newest of that name
    assert store.find_job(a.id[:6]).id == a.id if a.id[:6] != b.id[:6] else True
    with pytest.raises(NotFound):
        store.find_job("zzzz-none")
    with pytest.raises(NotFound):
        store.find_job("%")  # LIKE wildcards are literal


def test_ambiguous_prefix(store):
    ids = {_job(store).id for _ in range(40)}
    common = next(p for p in "0123456789abcdef" if sum(i.startswith(p) for i in ids) > 1)
    with pytest.raises(UsageError, match="ambiguous"):
        store.find_job(common)


def test_jobs_newest_first_and_active_filter(store):
    old, new = _job(store, at=1.0), _job(store, at=2.0)
    store.set_state(old.id, state.SUCCEEDED)
    assert [j.id for j in store.jobs()] == [new.id, old.id]
    assert [j.id for j in store.jobs(active_only=True)] == [new.id]


def test_metrics_and_host_round_trip_as_json(store):
    job = _job(store)
    store.update_job(job.id, metrics={"epoch": 3, "loss": 0.5}, host={"kind": "LocalHost"})
    job = store.job(job.id)
    assert job.metrics == {"epoch": 3, "loss": 0.5} and job.host == {"kind": "LocalHost"}


def test_migrating_a_version_1_store_keeps_its_jobs(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    state_schema.MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO jobs (id, kind, command, backend, state, created_at, spec) "
               "VALUES ('abcd1234', 'command', 'true', 'local', 'succeeded', 1.0, '{}')")
    db.close()
    store = Store(path)
    job = store.job("abcd1234")
    assert job.state == "succeeded" and job.launcher is None
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == state_schema.SCHEMA_VERSION
    store.close()


# A job's spec as the version before jobs.details stored it (schema 6): JobSpec.to_dict() with
# the per-attempt facts in it, and what its provider and lifecycle wrote in since.
OLD_SPEC = {
    "kind": "command", "backend": "aws", "name": "old", "recipe": None, "profile": None,
    "args": {}, "command": ["python", "train.py"], "workdir": "/home/me/work",
    "max_runtime_s": 43200.0, "resources": {}, "requires": [], "resume_from": None,
    "procs": None, "gpus_needed": 0, "gpus_exact": True, "nodes": 1,
    "instance_type": "g5.xlarge", "market": "spot", "region": "us-east-1", "ami": None,
    "disk_gb": None, "max_price": None, "keep": False, "idle_minutes": None, "on_job": None,
    "kept": None, "cpu_only": False, "expected": None, "target": None, "include": [],
    "datasets": [], "staging": {}, "disk_mbps": None, "staging_allowance_s": 0.0,
    "recover": True, "max_restarts": 3, "fallback": None, "attempt": 1, "avoid_zones": [],
    "store_region": None, "store_owner": "AIDAEXAMPLE", "auto_scaling_group":
    "cloudtrain-abcd1234", "setup": None, "envs": {"SEED": "1"}, "secrets": [],
    "outputs": [], "kept_for_queue": "beef0001"}


def test_a_job_stored_by_the_previous_version_loads_with_its_facts_found_in_its_spec(tmp_path):
    """issue 35: a store of schema 6 whose job kept the per-attempt facts in its spec opens;
    the spec reads as what the user asked, and the facts (the job store's owner, the Auto
    Scaling group, the queued job it keeps its instance for) are found where it kept them."""
    path = store_of_version(
        tmp_path / "v6.db", 6,
        "INSERT INTO jobs (id, name, kind, command, backend, state, created_at, spec) "
        "VALUES ('abcd1234', 'old', 'command', 'python train.py', 'aws', 'running', 1.0, ?)",
        json.dumps(OLD_SPEC))
    with Store(path) as store:
        job = store.job("abcd1234")
        assert isinstance(job.spec, JobSpec) and job.spec.placement.market is Market.SPOT
        assert (job.spec.command, job.spec.envs, job.spec.recovery.recover, job.spec.keep) == (
            ["python", "train.py"], {"SEED": "1"}, True, False)
        assert job.facts == JobFacts(attempt=1, store_owner="AIDAEXAMPLE",
                                     auto_scaling_group="cloudtrain-abcd1234",
                                     kept_for_queue="beef0001")
        assert job.keeps_instance
        # what is learnt from now on is kept beside the spec, never in it
        store.record_facts(job.id, attempt=2, avoid_zones=["us-east-1b"])
        again = store.job(job.id)
        assert (again.facts.attempt, again.facts.avoid_zones, again.facts.store_owner) == (
            2, ("us-east-1b",), "AIDAEXAMPLE")
        assert json.loads(store.db.execute("SELECT spec FROM jobs").fetchone()[0]) == OLD_SPEC


def test_a_new_job_keeps_its_facts_apart_from_its_spec(store):
    """issue 35: the stored spec holds only what the user asked; facts never go into it, and
    a fact recorded as None hides the one an older version wrote in the spec."""
    spec = JobSpec(kind="command", backend="local", command=["true"], keep=True)
    job = store.create_job(name=None, kind="command", recipe=None, command="true",
                           backend="local", spec=spec)
    assert store.job(job.id).spec == spec and store.job(job.id).facts == JobFacts()
    store.record_facts(job.id, store_owner="me", auto_scaling_group="g")
    stored = json.loads(store.db.execute("SELECT spec FROM jobs").fetchone()[0])
    assert stored == spec.to_dict() and not {"store_owner", "auto_scaling_group",
                                             "attempt", "avoid_zones"} & set(stored)
    store.update_job(job.id, spec={**stored, "auto_scaling_group": "old"})
    store.record_facts(job.id, auto_scaling_group=None)
    assert store.job(job.id).facts.auto_scaling_group is None
    with pytest.raises(ValueError):
        store.record_facts(job.id, region="us-east-1")  # what the user asked is the spec's


@pytest.mark.parametrize("stored", [{"nodes": "two", "args": [1], "keep": "yes"},
                                    {"market": "reserved", "datasets": {"x": 1}}])
def test_F22_a_spec_value_of_another_type_reads_as_its_default(store, stored):
    job = store.create_job(name=None, kind="command", recipe=None, command="true",
                           backend="local", spec=stored)
    assert store.job(job.id).spec == JobSpec(kind="command", backend="local")


def test_cost_phases_stay_in_order_when_a_job_ends_before_its_running_event(store):
    """The agent's end can precede the launcher's 'running' event for a job that exits at
    once (two clocks): the split per phase must still work, and add up."""
    from cloudtrain import ledger
    from cloudtrain.state import Instance

    job = _job(store, at=100.0)
    store.set_state(job.id, state.PROVISIONING, at=100.5)
    store.set_state(job.id, state.SYNCING, at=101.0)
    store.set_state(job.id, state.SETTING_UP, at=101.5)
    store.set_state(job.id, state.RUNNING, at=102.2)
    store.update_job(job.id, started_at=102.0)
    store.set_state(job.id, state.SUCCEEDED, at=102.1, only_if_active=False)
    store.update_job(job.id, ended_at=102.1)
    store.add_instance(Instance(id="i-1", job_id=job.id, provider="aws", region="us-east-1",
                                zone="us-east-1a", instance_type="g5.xlarge", market="on-demand",
                                state="terminated", launched_at=100.6, terminated_at=200.0,
                                price_per_hour=1.006, details={"disk_gb": 0}))
    phases = ledger.phases_of(store, store.job(job.id))
    starts = [p.start for p in phases]
    assert starts == sorted(starts)
    billed = ledger.settle(store, store.job(job.id), now=300.0)
    detail = store.job(job.id).cost_detail
    assert sum(detail["phases"].values()) == pytest.approx(billed.dollars, abs=1e-12)
    assert billed.dollars == pytest.approx(1.006 * (200.0 - 100.6) / 3600)


def test_an_unpriced_instance_type_leaves_the_cost_unknown_not_an_error(store):
    from cloudtrain import ledger
    from cloudtrain.state import Instance

    job = _job(store, at=100.0)
    store.add_instance(Instance(id="i-2", job_id=job.id, provider="aws", region="us-east-1",
                                zone="us-east-1a", instance_type="x9.nonexistent",
                                market="on-demand", state="terminated", launched_at=100.0,
                                terminated_at=200.0, price_per_hour=None, details={}))
    billed = ledger.settle(store, store.job(job.id), now=300.0)
    assert not billed.settled
    recorded = store.job(job.id)
    assert recorded.cost is None and recorded.cost_detail["notes"][0].startswith("cost unknown")


def test_F22_update_stores_lists_as_json_and_binds_anything(store):
    """`_update` stored only dicts as JSON: a list (or a tuple, a Path, an int past 64 bits)
    failed to bind ("Error binding parameter")."""
    from pathlib import Path

    job = _job(store)
    store.update_job(job.id, host={"kind": "local", "ports": [22, 2222]}, jobdir=Path("/x"),
                     metrics={"epoch": 1}, cost=1 << 70)
    store.update_job(job.id, reason=["a", "list"])
    row = store.db.execute("SELECT jobdir, reason, cost FROM jobs WHERE id = ?", (job.id,)).fetchone()
    assert row["reason"] == '["a", "list"]' and row["jobdir"] == "/x"
    assert row["cost"] == float(1 << 70)
    assert store.job(job.id).host == {"kind": "local", "ports": [22, 2222]}
    inst = state.Instance(id="i-1", job_id=job.id, provider="aws", region=None, zone=None,
                          instance_type=None, market=None, state="running", launched_at=1.0,
                          terminated_at=None, price_per_hour=None, details={"a": [1, 2]})
    store.add_instance(inst)
    store.update_instance("i-1", details={"b": (3, 4)})
    assert store.instances(job.id)[0].details == {"b": [3, 4]}


def test_F22_find_job_refuses_an_empty_reference_and_survives_a_long_one(store):
    _job(store)
    _job(store)
    with pytest.raises(UsageError, match="give a job id, id prefix or name"):
        store.find_job("")
    with pytest.raises(NotFound, match=r"^no job 'xxxxxxxx"):
        store.find_job("x" * 100_000)
    # Wildcards are plain characters in a prefix.
    for ref in ("%", "_", "\\", "'"):
        with pytest.raises(NotFound):
            store.find_job(ref)


def test_F22_unusable_database_is_a_usage_error_naming_the_file(tmp_path):
    bad = tmp_path / "state.db"
    bad.write_bytes(b"\x00" * 100 + b"garbage" * 200)
    with pytest.raises(UsageError, match=f"{bad} is not a usable cloudtrain database") as info:
        Store(bad)
    assert info.value.hint.startswith(f"move it aside (mv {bad} {bad}.broken)")


def test_F22_rows_are_read_defensively(store):
    job = _job(store)
    store.db.execute("UPDATE jobs SET spec = '[1]', host = '{', metrics = ?, cost_detail = 'x', "
                     "created_at = 'noon', exit_code = 'zero' WHERE id = ?",
                     (json.dumps({"train_loss": "abc", "loss": 0.5, "note": "ok",
                                  "test_acc": float("nan")}), job.id))
    got = store.job(job.id)
    assert got.spec == JobSpec(kind="command", backend="local") and got.host is None \
        and got.cost_detail is None
    assert got.created_at is None and got.exit_code is None
    assert got.metrics == {"loss": 0.5, "note": "ok"}
    # Times past year 9999 (time.localtime fails), negative dollars, a relative job directory.
    store.db.execute("UPDATE jobs SET started_at = 1e17, cost = -1, jobdir = 'rel/dir' "
                     "WHERE id = ?", (job.id,))
    got = store.job(job.id)
    assert got.started_at is None and got.cost is None and got.jobdir is None
    store.add_instance(state.Instance(
        id="i-1", job_id=job.id, provider="aws", region=None, zone=None, instance_type=None,
        market="spot", state="terminated", launched_at=1.0, terminated_at=2.0,
        price_per_hour=None, details={"disk_gb": [1], "gp3_per_gb_month": "x", "keep": 1,
                                      "spot_history": [[1.0, 0.5], [1, "x"], "junk"]}))
    assert store.instances(job.id)[0].details == {"keep": 1, "spot_history": [[1.0, 0.5]]}


def _racing(n: int, work) -> list:
    """`work(store)` in n threads at once, each on its own connection to the same file (as
    `status` and the supervisor each open theirs): what each returned or raised."""
    import threading

    path = _racing.path
    start = threading.Barrier(n)
    out: list = [None] * n

    def one(i: int) -> None:
        with Store(path) as store:
            start.wait()
            try:
                out[i] = work(store)
            except Exception as exc:  # noqa: BLE001 - the test reports it
                out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_C2_processes_recording_the_same_instance_at_once_record_it_once(tmp_path):
    """C2: `status` and the recovery supervisor it had just started both recorded the job
    store's attempts; the slower one's INSERT broke on instances.id ("UNIQUE constraint
    failed") and the command said the database was unusable. Eight recorders of one
    instance at once: no error, one row, its event once."""
    _racing.path = tmp_path / "state.db"
    with Store(_racing.path) as store:
        job = _job(store)
    inst = state.Instance(
        id="i-0aaaaaaaaaaaaaaa1", job_id=job.id, provider="aws", region="us-east-1",
        zone="us-east-1b", instance_type="g5.xlarge", market="spot", state="running",
        launched_at=1.0, terminated_at=None, price_per_hour=None, details={"attempt": 2})
    got = _racing(8, lambda s: s.add_instance(inst))
    assert not [g for g in got if isinstance(g, Exception)], got
    assert got.count(True) == 1 and got.count(False) == 7
    again = state.Instance(**{**inst.__dict__, "id": "i-0aaaaaaaaaaaaaaa2"})
    said = _racing(8, lambda s: s.add_instance(again, event=("instance", "i-2 (attempt 3)")))
    assert said.count(True) == 1, said
    with Store(_racing.path) as store:
        assert [i.id for i in store.instances(job.id)] == [inst.id, again.id]
        assert [e.detail for e in store.events(job.id) if e.phase == "instance"] == \
            ["i-2 (attempt 3)"]


def test_C2_an_event_said_once_is_said_once_whoever_says_it(tmp_path):
    _racing.path = tmp_path / "state.db"
    with Store(_racing.path) as store:
        job = _job(store)
    got = _racing(8, lambda s: s.add_event(job.id, "passed-over", detail="x", once=True))
    assert got.count(True) == 1 and got.count(False) == 7, got
    with Store(_racing.path) as store:
        assert store.add_event(job.id, "passed-over", detail="y", once=True)
        assert store.add_event(job.id, "passed-over", detail="x")  # without once: always
        assert [e.detail for e in store.events(job.id) if e.phase == "passed-over"] == \
            ["x", "y", "x"]


def test_C2_a_refused_change_in_a_sound_database_is_not_called_unusable(tmp_path):
    """C2: the advice to move state.db aside (losing every job's records) only where a check
    of the file finds it unusable; a constraint error in a sound database says so."""
    path = tmp_path / "state.db"
    Store(path).close()
    err = state.database_error(path, sqlite3.IntegrityError("UNIQUE constraint failed: "
                                                            "instances.id"))
    assert "not a usable" not in err.message and "move it aside" not in (err.hint or "")
    assert err.message == (f"{path} refused a change (UNIQUE constraint failed: "
                           "instances.id); the database itself is sound (PRAGMA quick_check: "
                           "ok; cloudtrain's schema)")
    assert "run the command again" in err.hint
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE attempts RENAME TO attempts_old")  # no longer cloudtrain's schema
    db.commit()
    db.close()
    err = state.database_error(path, sqlite3.OperationalError("no such table: attempts"))
    assert err.message == f"{path} is not a usable cloudtrain database: no such table: attempts"
    assert err.hint.startswith(f"move it aside (mv {path} {path}.broken)")
    assert state.check_database(path) == "no table attempts"
