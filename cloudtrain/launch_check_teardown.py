"""`cloudtrain check --launch`'s teardown: whatever happened, the job stopped and its instance
terminated, checked gone, its job-store objects deleted, and the bill to the fraction of a cent.

Called by launch_check once its steps end; imports the steps' bookkeeping
(launch_check_steps), the lifecycle's collect, stop and watch, and cost and ledger for the bill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from .errors import CloudtrainError
from .launch_check_steps import Check, Report, Steps, Stopped
from .lifecycle import collect, stop, watch

GONE_WAIT_S = 300.0  # for EC2 to finish terminating (the volume goes with the instance)


def teardown(c: Check, steps: Steps, report: Report) -> None:
    """Whatever happened: the job stopped and its instance terminated (as `down` does),
    then checked gone, its objects deleted from the job store, and the bill."""
    if not c.launched:
        return
    job = c.store.job(c.job_id) if c.job_id else None
    if job is not None and job.active:
        with contextlib.suppress(CloudtrainError):  # a job that ended: collect and release
            job = watch.refresh(c.store, c.settings, job)
    if job is not None and (job.active or any(i.state != "terminated"
                                              for i in c.store.instances(job.id))):
        with contextlib.suppress(CloudtrainError):  # the terminate step says what is left
            stop.cancel(c.store, c.settings, (job.id,), False)  # as `down` stops it
    if job is not None and c.store.instances(job.id):
        with contextlib.suppress(Stopped), steps.step("terminate") as s:
            s.detail = _terminated(c, job)
    with contextlib.suppress(Stopped), steps.step("cleanup") as s:
        s.detail, s.data = _cleaned(c, job)
    with contextlib.suppress(Stopped), steps.step("bill") as s:
        s.detail, s.data = _bill(c, job, report)


def _terminated(c: Check, job) -> str:
    deadline = time.monotonic() + GONE_WAIT_S
    while True:
        states = c.provider.instance_states(c.store, job)
        left = {i: s["state"] for i, s in states.items() if s["state"] != "terminated"}
        if not left:
            break
        if time.monotonic() > deadline:
            raise CloudtrainError(f"not terminated after {GONE_WAIT_S:.0f} s: " + ", ".join(
                f"{i} ({s})" for i, s in sorted(left.items())),
                hint=f"cloudtrain down {job.id} (it terminates by record and by tag)")
        time.sleep(min(c.settings.poll_seconds, 5.0))
    return ", ".join(sorted(states)) + " terminated (shutdown behaviour terminate: its root " \
        "volume goes with it)"


def _cleaned(c: Check, job) -> tuple[str, dict]:
    """Nothing of the job left in EC2 (by its tag: instances, volumes, placement groups) or in
    the job store; the key pair and the security group stay, as after every launch."""
    account, region = c.provider.account, c.region
    left: dict = {}
    unended: dict = {}
    if c.fis is not None:  # the experiment ended, its template deleted
        try:
            account.end_interruption(region, *c.fis)
        except CloudtrainError as exc:
            unended["experiment templates"] = [f"{c.fis[0]} ({exc.message})"]
    if job is not None:
        deadline = time.monotonic() + GONE_WAIT_S
        while True:  # a terminated instance's volume takes a moment to go
            try:
                left = {k: v for k, v in account.leftovers(region, job.id).items() if v}
                if c.flow is not None and c.flow.leftovers is not None:
                    left.update({k: v for k, v in c.flow.leftovers(c, job.id).items() if v})
            except CloudtrainError as exc:  # AWS could not be asked: said, then the bill
                raise CloudtrainError(f"could not verify the cleanup: {exc.message}",
                                      hint="cloudtrain down --all finds and stops what is left "
                                           "by its tags") from exc
            left.update(unended)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(min(c.settings.poll_seconds, 5.0))
    left.update(unended)
    deleted = 0
    for prefix in [x for x in (c.job_id, c.role_probe) if x and c.bucket]:
        deleted += account.delete_results(region, prefix)
        if account.delete_results(region, prefix):  # none may be left (nothing uploads any more)
            left.setdefault("job store objects", []).append(f"jobs/{prefix}/")
    if left:
        raise CloudtrainError("still there: " + "; ".join(f"{k}: {', '.join(v)}"
                                                          for k, v in left.items()),
                              hint="cloudtrain down --all (it finds them by their tags)")
    shared = account.shared_resources(region)
    stay = []
    if c.key_name and c.key_name in shared["key pairs"]:
        stay.append(f"key pair {c.key_name}")
    if c.group and c.group in shared["security groups"]:
        stay.append(f"security group {c.group}")
    kept = (" and ".join(stay) + " stay for the next launch, as after every job (`cloudtrain "
            "down --all` removes them when nothing uses them)") if stay else ""
    if job is None:
        return "nothing was launched" + (f"; {kept}" if kept else ""), {}
    stored = f"{deleted} job-store objects deleted" if c.bucket else "no job store"
    more = c.flow.left_words if c.flow is not None and c.flow.left_words else \
        " or placement group"
    return (f"nothing of job {job.id} is left: no instance, volume{more}; "
            f"{stored}" + (f"; {kept}" if kept else ""), {"job_store_objects_deleted": deleted})


def _bill(c: Check, job, report: Report) -> tuple[str, dict]:
    """Seconds billed (60 s minimum) x the price, the root volume's seconds and its public
    IPv4 address's, per instance, from EC2's launch and termination times: the job's
    recorded cost."""
    from . import cost, ledger

    if job is None or not c.store.instances(job.id):
        report.cost_usd = 0.0
        return "$0: nothing was launched", {"usd": 0.0}
    c.provider.record_ends(c.store, c.store.job(job.id))
    record_price(c, report.price_per_hour)
    collect.settle_cost(c.store, c.store.job(job.id))
    parts, rows = [], []
    total = 0.0
    now = time.time()
    for inst in c.store.instances(job.id):
        run_ = ledger.run_of(inst)
        end = run_.end if run_.end is not None else now
        ran = max(0.0, end - run_.start)
        billed = cost.billed_seconds(run_.start, max(end, run_.start))
        compute = cost.on_demand_cost(run_.start, end, run_.price_per_hour or 0.0)
        disk = cost.ebs_cost(run_.start, end, run_.disk_gb, run_.gp3_per_gb_month) \
            if run_.disk_gb and run_.gp3_per_gb_month is not None else None
        usd = cost.instance_cost(run_, now=now).dollars  # what the job's record says
        ipv4 = run_.public_ipv4 * cost.PUBLIC_IPV4_PER_HOUR * ran / 3600  # no minimum
        total += usd
        rate = f" x ${run_.price_per_hour or 0:.4f}/h = ${compute.dollars:.6f}"
        if run_.market == "spot" and run_.spot_history:  # billed at the spot price in force
            compute = dataclasses.replace(compute, dollars=usd - ipv4 - (
                disk.dollars if disk else 0.0))
            low, high = (f(p.price for p in run_.spot_history) for f in (min, max))
            rate = (f" at EC2's spot price (${low:.4f}/h" + (f" to ${high:.4f}/h" if high > low
                                                              else "")
                    + f" in its AZ then) = ${compute.dollars:.6f}")
        text = (f"{inst.id}: {billed:.0f} s billed" + (f" (the 60-second minimum; it ran "
                                                        f"{ran:.0f} s)" if ran < billed else "")
                + rate)
        if disk:
            text += (f"; its {run_.disk_gb:g} GB gp3 root volume ${disk.dollars:.6f}")
        if run_.public_ipv4:
            text += f"; its public IPv4 address ${ipv4:.6f}"
        parts.append(text)
        rows.append({"instance": inst.id, "ran_seconds": ran, "billed_seconds": billed,
                     "price_per_hour": run_.price_per_hour, "compute_usd": compute.dollars,
                     "disk_gb": run_.disk_gb, "disk_usd": disk.dollars if disk else 0.0,
                     "public_ipv4_usd": ipv4, "usd": usd, "settled": run_.end is not None})
    report.cost_usd = total
    return ("; ".join(parts) + f"; total ${total:.6f}"
            + ("" if all(r["settled"] for r in rows) else " so far (not yet terminated)"),
            {"instances": rows, "usd": total})


def record_price(c: Check, price: float | None) -> None:
    """The catalog knows GPU types only: a t3.micro is recorded without a price. The check's
    price goes on its record, so that status and cost-report bill it too."""
    assert c.job_id is not None  # the check's job was made
    for inst in c.store.instances(c.job_id):
        if inst.price_per_hour is None and price is not None:
            c.store.update_instance(inst.id, price_per_hour=price)
