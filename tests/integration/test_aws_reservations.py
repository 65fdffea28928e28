"""Capacity the user holds as a market (issue 38, RC7: `--reservation cr-…`): a job goes into
its On-Demand Capacity Reservation or Capacity Block, in its AZ, named in RunInstances as EC2
requires, priced from what it is; what cannot run in it is refused before anything is paid.
moto has no capacity reservations: labs/moto_capacity.py answers and enforces them as EC2
documents, in the moto server the CLI talks to."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.moto_capacity import Reservations
from conftest import error_line

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")

HOUR = 3600.0


@pytest.fixture
def held(monkeypatch) -> Reservations:
    return Reservations().install(monkeypatch)


def _rows(ct_home, job_id):
    db = sqlite3.connect(ct_home / "state.db")
    db.row_factory = sqlite3.Row
    return [dict(r) for r in db.execute("SELECT * FROM instances WHERE job_id = ?", (job_id,))]


def _block(held: Reservations, fee: float = 96.0, count: int = 2, hours: float = 24.0,
           az: str = "us-east-1b", start: float | None = None) -> str:
    start = time.time() - 60 if start is None else start
    return held.add(instance_type="g5.xlarge", az=az, count=count, kind="capacity-block",
                    start=start, end=start + hours * HOUR, fee=fee, match="targeted")


def test_RC7_a_job_runs_in_its_capacity_block_priced_from_the_block(cli, aws, ct_home, held,
                                                                    toy_recipes):
    """RC7: the launch names the block in RunInstances (CapacityReservationTarget, MarketType
    capacity-block), in the block's AZ only, though the catalog's cheapest is another; the
    instance bills the block's fee over its instance-hours ($96 / (2 x 24 h) = $2/h), not
    on-demand; its record and the timeline name the block; the instance gives its place back
    when it ends."""
    cr = _block(held, az="us-east-1a")
    proc = cli("launch", "--recipe", "toy", "--reservation", cr, "--block-fee", "96",
               "--follow", "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    (row,) = _rows(ct_home, job_id)
    assert row["instance_type"] == "g5.xlarge"  # the block's, no --instance given
    assert row["zone"] == "us-east-1a" and row["market"] == "on-demand"
    assert row["price_per_hour"] == pytest.approx(2.0)
    details = json.loads(row["details"])
    assert details["reservation"] == cr and details["reservation_kind"] == "capacity-block"
    (launch,) = held.launches
    assert launch["refused"] is None and launch["market type"] == "capacity-block"
    assert launch["reservation id"] == cr
    said = [p["detail"] for p in cli.job(job_id)["timeline"] if p["name"] == "instance"]
    assert said and cr in said[0], said
    assert cli.job(job_id)["state"] == "succeeded"
    assert held.instances(cr) == []  # terminated: its place in the block is free again


def test_RC7_the_plan_says_the_reservation_its_end_and_its_price(cli, aws, held):
    """RC7: the dry run reads the reservation: an ODCR is priced on-demand (it bills that
    whether used or not); a block from its fee, or today's offering of a block like it when
    no fee is given, said as such; the block's end and the termination 30 min before it."""
    odcr = held.add(instance_type="g5.xlarge", az="us-east-1a", count=1, kind="default")
    out = " ".join(cli.ok("launch", "--reservation", odcr, "--dry-run", "--", "true"
                          ).stdout.split())
    assert f"in reservation {odcr}, a capacity reservation of 1 g5.xlarge in us-east-1a, 1 " \
           "free" in out, out
    assert re.search(r"price \$1\.0060/h \(on-demand: a capacity reservation bills its type's "
                     r"on-demand rate, used or not\)", out), out
    start = time.time() - 60
    block = _block(held, start=start)
    held.offer("g5.xlarge", "us-east-1b", 2, 24, 120.0)
    out = " ".join(cli.ok("launch", "--reservation", block, "--dry-run", "--", "true"
                          ).stdout.split())
    assert "a Capacity Block of 2 g5.xlarge in us-east-1b" in out, out
    assert "EC2 terminates its instances from " + time.strftime(
        "%Y-%m-%d %H:%M", time.localtime(start + 24 * HOUR - 1800)) in out, out
    assert "$2.5000/h an instance (today's offering of a block like it, $120.00 over 2 x 24 h" \
        in out, out
    assert held.launches == [] and aws.instances() == []


def test_RC7_what_cannot_run_in_the_reservation_is_refused_before_anything_is_paid(
        cli, aws, held):
    """RC7: one line and exit 2, nothing launched, for: an id EC2 does not know, another type
    than the reservation's, a block not started yet, more nodes than it has free, a max
    runtime past the block's termination, a block with no fee given or offered, --spot."""
    soon = _block(held, start=time.time() + 2 * HOUR)
    small = _block(held, count=1, hours=1.0)
    block = _block(held)
    for args, said in [
            (["--reservation", "cr-0123456789abcdef0"],
             "--reservation cr-0123456789abcdef0: no such capacity reservation in us-east-1"),
            (["--reservation", block, "--instance", "g5.2xlarge", "--block-fee", "9"],
             f"--reservation {block} holds g5.xlarge, not g5.2xlarge: launch with --instance "
             "g5.xlarge"),
            (["--reservation", soon, "--block-fee", "9"],
             f"--reservation {soon} (Capacity Block) starts at "),
            (["--reservation", block, "--nodes", "3", "--block-fee", "9"],
             f"--reservation {block} has 2 of its 2 g5.xlarge free; the job needs 3"),
            (["--reservation", small, "--block-fee", "9", "--max-runtime", "45m"],
             f"--reservation {small} ends at "),
            (["--reservation", block],
             f"--reservation {block}: EC2 does not show a Capacity Block's fee after its "
             "purchase"),
            (["--reservation", block, "--spot"],
             "--reservation: an instance in capacity you hold is not spot")]:
        proc = cli("launch", *args, "--yes", "--", "true")
        assert proc.returncode == 2, (args, proc.stderr)
        assert error_line(proc.stderr).startswith(f"Error: {said}"), (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert held.launches == [] and aws.instances() == []


def test_RC7_a_spot_job_with_a_deadline_moves_into_the_reservation_once_its_slack_is_out(
        cli, aws, held):
    """RC7 with --deadline: a spot job with a reservation stays on spot while the deadline's
    slack lasts, and its on-demand attempts go into the reservation (the plan says so, and
    that the supervisor on this machine makes that move: an Auto Scaling group's on-demand
    instances would not go into it); a job whose slack is out before it starts launches into
    the reservation at once."""
    odcr = held.add(instance_type="g5.xlarge", az="us-east-1a", count=1, kind="default")
    base = ("launch", "--instance", "g5.xlarge", "--spot", "--max-runtime", "60",
            "--reservation", odcr, "--dry-run")
    out = " ".join(cli.ok(*base, "--deadline", "+12h", "--", "sleep", "1").stdout.split())
    assert f"market spot, then on-demand once the deadline's slack is out, in reservation " \
           f"{odcr}, a capacity reservation of 1 g5.xlarge in us-east-1a" in out, out
    assert f"a deadline's move into reservation {odcr} is made by the supervisor on this " \
           "machine" in out, out
    assert ": spot until " in out
    out = " ".join(cli.ok(*base, "--deadline", "+70m", "--", "sleep", "1").stdout.split())
    assert f"market on-demand, in reservation {odcr}, a capacity reservation" in out, out
    assert "price $1.0060/h (on-demand: a capacity reservation bills" in out, out
    assert held.launches == [] and aws.instances() == []


def test_RC7_a_budget_is_kept_at_the_reservation_s_price(cli, aws, held):
    """RC7 with --budget: the first attempt's floor and the instance's meter use the
    reservation's price: a budget that one attempt fits at an ODCR's on-demand $1.006/h is
    refused in a block whose fee makes an instance-hour $4."""
    odcr = held.add(instance_type="g5.xlarge", az="us-east-1a", count=1, kind="default")
    block = _block(held, fee=192.0)  # $192 / (2 x 24 h) = $4/h
    cli.ok("launch", "--reservation", odcr, "--budget", "0.2", "--dry-run", "--", "true")
    proc = cli("launch", "--reservation", block, "--block-fee", "192", "--budget", "0.2",
               "--dry-run", "--", "true")
    assert proc.returncode == 2, proc.stderr
    line = error_line(proc.stderr)
    assert line.startswith("Error: --budget $0.20: one attempt costs about $") and \
        "at up to $4.0000/h" in line, line


def test_RC7_the_dry_run_without_credentials_says_the_reservation_is_read_at_launch(tmp_path):
    """RC7: the dry run needs no credentials: with --instance it plans the job and says the
    reservation is read and checked at launch; without, its type cannot be read, which the
    error says, with the way round it."""
    import subprocess
    import sys

    from conftest import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               CLOUDTRAIN_HOME=str(tmp_path / "home"))

    def plan(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--reservation",
                               "cr-0123456789abcdef0", *args, "--dry-run", "--", "true"],
                              cwd=REPO, capture_output=True, text=True, env=env, timeout=60)

    out = " ".join(plan("--instance", "g5.xlarge").stdout.split())
    assert "market on-demand, in reservation cr-0123456789abcdef0: not read (no " \
           "credentials): the launch reads it, and refuses what does not fit it" in out, out
    proc = plan()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "or give --instance too (the type cr-0123456789abcdef0 holds) for a dry run " \
           "without them" in proc.stderr, proc.stderr
