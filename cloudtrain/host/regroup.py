"""A job of an Auto Scaling group on several nodes: after AWS replaces one, the nodes meet again
through the job store, and every one resumes from the last streamed checkpoint.

Standard library only, Python 3.8+; shipped beside agent.py. Imports auto_scaling, agent_upload,
bundle_reader, job_records (the records below, their keys, writers and checkers), job_status
and safefile, and nothing else of ours.

The group holds N instances; AWS knows no ranks. When it replaces a lost one, the replacement's
bootstrap.py records the next attempt (attempts/<n>.json) and meets the others; each other
node's agent sees the new attempt (Team.watch: one GET every WATCH_S) or a peer gone in EC2
(every PEERS_S), or finds its part of the job failed with a peer gone (Team.look_for_loss),
stops its part (the collective calls hang or fail without the lost node) and meets them too,
through these records (each one's key, writer and checker are job_records.py's):

    attempts/<n>/<instance>.json   {"instance", "rank", "address", "iface", "port", "at"}: a
                                   node of attempt n (rank: its rank before; null: new)
    attempts/<n>/ended-<rank>.json rank k > 0 has stored its results at the job's end
    attempts/<n>/leaving-<rank>.json   that node had a spot notice: it is going away

Each node writes its own record through the job's grant and lists the attempt's records
(s3:ListBucket on attempts/ only) until N are there (meet). Every node of the group holds that
grant, so a record counts only where EC2 lists its instance in the job's group at its address
(DescribeInstances by tag, with the role), and a node's interface is its own, never a
record's. Every node then ranks them the same
way (ranked: a node keeps its rank, the new ones take the free ranks in instance-id order);
rank 0's address and port are the rendezvous. A newer attempt recorded during the wait (one
more node lost) moves every node to it; final.json (the job has ended) ends the wait. Each node
then takes its part (take_part: the node environment, its results under nodes/<rank>/, the
checkpoint stream for rank 0 only), restores the latest streamed checkpoint (every rank resumes
from the same one), and runs run.sh again.

At the job's end rank 0 waits (bounded) for the others' ended-<rank>.json before it records
final.json and ends the group; the others wait for final.json and leave the power-off to the
group's deletion (a node powering off while the group lives would be replaced). A newer
attempt recorded before final.json (rank 0's node lost while it stored the end) brings them
back to meet its replacement (Team.rejoin): one attempt per lost node.
"""

import fcntl
import os
import socket
import struct
import threading
import time

from . import agent_upload, auto_scaling, job_records, safefile
from .bundle_reader import EXIT_ENDED, EXIT_RESTARTS, EXIT_STORE, FILE_MAX_BYTES, Failed
from .job_status import CANCELLED, FAILED, PREEMPTED, REGROUP, RUNNING, now

MASTER_PORT = 29500  # torchrun's default; the rendezvous takes the first free port from here
WATCH_S = 2.0  # how often a running node asks for a newer attempt
MEET_POLL_S = 0.5  # how often a meeting node lists the attempt's records
REPLACE_WAIT_S = 1800.0  # a node whose peer is lost waits this long for AWS to replace it
MEET_WAIT_S = 900.0  # once a node has joined an attempt, for the others to join
# After a failed run, how long to look for a lost peer before the failure is the job's own: a
# peer taken back without notice is shutting-down in EC2 within seconds; one with a notice
# says so first (leaving-<rank>.json), while it still runs, storing its checkpoint.
LOST_WAIT_S = 30.0
PEERS_S = 10.0  # how often a running node asks EC2 whether its peers still run
GONE = ("shutting-down", "terminated", "stopping", "stopped")  # EC2's, of a lost node
# The job's grace when its node leaves it to meet the others: a peer is gone, so its
# collectives wait for that peer (gloo and NCCL never see a reclaimed instance's connections
# close) and it cannot reach the step boundary where it would save; its last checkpoint is
# in the stream already.
STOP_GRACE_S = 3.0
END_WAIT_S = 300.0  # rank 0 for the others' results; the others for final.json
RECORD_MAX_BYTES = job_records.RECORD_MAX_BYTES


def records_grant(job, prefix):
    """The job's grant (every node of a group holds the job-wide one), for its records."""
    grant = job.get("results_store")
    if not agent_upload.writable(grant):
        raise Failed(EXIT_STORE, "no results_store grant in job.json to write the job's "
                     "records with")
    return dict(grant, prefix=prefix)


def ranked(found, nodes):
    """The attempt's nodes in rank order, the same on every node, or None until there are
    exactly `nodes`: a node keeps the rank it had (the smaller instance id where two claim
    one), the others take the free ranks in instance-id order."""
    if len(found) != nodes:
        return None
    by_id = sorted(found, key=lambda m: m["instance"])
    ranks = {}
    for m in by_id:
        if m["rank"] is not None and m["rank"] not in ranks:
            ranks[m["rank"]] = m
    placed = {id(m) for m in ranks.values()}
    free = iter(r for r in range(nodes) if r not in ranks)
    for m in by_id:
        if id(m) not in placed:
            ranks[next(free)] = m
    return [dict(ranks[r], rank=r) for r in range(nodes)]


def interface_of(address):
    """The name of the network interface that holds `address` (gloo and NCCL bind to it),
    or None."""
    for _, name in socket.if_nameindex():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
        except OSError:
            pass
        finally:
            s.close()
    return None


def free_port(start=MASTER_PORT):
    """The first TCP port from `start` that binds (the rendezvous, where this node is rank 0)."""
    for port in range(start, min(start + 1000, 65536)):
        s = socket.socket()
        try:
            s.bind(("", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    return start


def mine(ident, rank):
    """This node's record: its instance and private address (IMDS), the interface that holds
    it, a free port, the rank it had (None: a new node)."""
    address = ident.get("address")
    if not ident.get("instance") or not address:
        raise Failed(EXIT_STORE, "IMDS gave no instance id or private address: this node "
                     "cannot meet the others")
    return job_records.member_doc(ident["instance"], rank, address, interface_of(address),
                                  free_port())


def group_peers(conf, creds, say=None):
    """meet's `peers`: {instance: private address} of what EC2 lists in the job's group now
    (auto_scaling.group_instances), or None, said once, when it cannot be asked."""
    said: list[str] = []

    def peers():
        listed, why = auto_scaling.group_instances(conf, creds)
        if listed is None and not said and say is not None:
            said.append(why)
            say("EC2 could not be asked which instances are the job's (%s): asking again"
                % why)
        return listed
    return peers


def newest(reader, prefix, n):
    """The newest attempt recorded from n on (GETs of attempts/<n+1>.json, ... until one is
    missing)."""
    for _ in range(job_records.MAX_ATTEMPTS):
        data = reader.get_bytes(job_records.attempt_key(prefix, n + 1), RECORD_MAX_BYTES,
                                EXIT_STORE, denied_is_missing=True)
        if data is None:
            return n
        n += 1
    return n


def ended(reader, prefix):
    """Whether final.json is there (the job has ended, whatever it says)."""
    return reader.get_bytes(job_records.final_key(prefix), RECORD_MAX_BYTES, EXIT_STORE,
                            denied_is_missing=True) is not None


def members(reader, prefix, n, nodes):
    """Attempt n's nodes as their records say (listed, each read and checked). Any node of
    the group can write any record: meet keeps only those EC2 agrees with."""
    found, folder = [], job_records.attempt_folder(prefix, n)
    listed = reader.list_keys(folder, EXIT_STORE)
    for key, size in sorted(listed.items()):
        named = job_records.member_of(folder, key)  # directly in the folder: not sub/<id>.json
        if named is None or size > RECORD_MAX_BYTES:
            continue
        doc = job_records.check_member(job_records.read_record(reader.get_bytes(
            key, RECORD_MAX_BYTES, EXIT_STORE, denied_is_missing=True)), nodes)
        if doc is not None and doc["instance"] == named:
            found.append(doc)
    return found


def meet(reader, grant, prefix, at_least, nodes, me, peers, wait_s=REPLACE_WAIT_S,
         meet_s=MEET_WAIT_S, poll_s=MEET_POLL_S, say=None, max_restarts=None):
    """Wait for attempt `at_least` (or a newer one) to be recorded, join the newest, and wait
    for all `nodes` of it; (n, the nodes ranked). A record counts only where `peers()` (EC2:
    {instance: private address} of the job's group, or None when it cannot be asked) lists
    that instance at that address; EC2 is asked once `nodes` records are there.
    Failed(EXIT_ENDED) once final.json is there; Failed(EXIT_RESTARTS) for an attempt past
    `max_restarts` (each regroup is a restart); Failed(EXIT_STORE) after `wait_s` without
    the attempt, or `meet_s` from the first join without all of its nodes: newer attempts
    recorded meanwhile move the meeting on, not its clock (a writer adding attempts
    kept every node waiting, billing, for as long as it wrote)."""
    say = say or (lambda line: None)
    start, joined, since, n = time.time(), None, None, at_least - 1  # since: the first join
    while True:
        if ended(reader, prefix):
            raise Failed(EXIT_ENDED, "the job has ended (final.json) while its nodes met")
        n = newest(reader, prefix, n)
        if max_restarts is not None and n - 1 > max_restarts:
            raise Failed(EXIT_RESTARTS, job_records.restarts_used(max_restarts))
        if n >= at_least:
            if joined != n:
                try:
                    agent_upload.post_json(grant, job_records.member_key(
                        prefix, n, me["instance"]), me)
                except (agent_upload.UploadError, agent_upload.FileUnreadable) as exc:
                    raise Failed(EXIT_STORE, "this node's record of attempt %d could not be "
                                 "written: %s" % (n, exc)) from None
                joined, since = n, time.time() if since is None else since
                say("attempt %d: joined as %s (rank before: %s); waiting for %d nodes"
                    % (n, me["instance"], me["rank"], nodes))
            found = members(reader, prefix, n, nodes)
            if len(found) >= nodes:
                listed = peers()
                if listed is not None:
                    found = [m for m in found if listed.get(m["instance"]) == m["address"]]
                    ranks = ranked(found, nodes)
                    if ranks is not None and any(m["instance"] == me["instance"]
                                                 for m in ranks):
                        return n, ranks
            if since is not None and time.time() - since > meet_s:
                raise Failed(EXIT_STORE, "attempt %d: not all %d nodes met in %.0f s"
                             % (n, nodes, meet_s))
        elif time.time() - start > wait_s:
            raise Failed(EXIT_STORE, "no replacement node recorded in %.0f s: AWS found no "
                         "capacity for it" % wait_s)
        time.sleep(poll_s)


def take_part(job, prefix, rank, ranks, iface=None):
    """job.json for this node's part in the attempt: its rank, the rendezvous at rank 0, its
    interface (`iface`: this node's own, interface_of its own address; never what a record
    says), its results below nodes/<rank>/ (rank 0: the job's), the checkpoint stream for
    rank 0 only, and the attempt's nodes (what look_for_loss asks EC2 about)."""
    job = dict(job)
    master = ranks[0]
    env = dict(job.get("env") or {})
    env.update(CLOUDTRAIN_NODES=str(len(ranks)), CLOUDTRAIN_NODE_RANK=str(rank),
               MASTER_ADDR=master["address"], MASTER_PORT=str(master["port"]))
    iface = iface if isinstance(iface, str) and job_records.IFACE.fullmatch(iface) else None
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if iface:
            env[key] = iface
        else:
            env.pop(key, None)
    job["env"] = env
    if isinstance(job.get("results_store"), dict):
        job["results_store"] = dict(job["results_store"], prefix=prefix + (
            "" if rank == 0 else "nodes/%d/" % rank))
    conf = dict(job.get("auto_scaling") or {})
    if rank == 0 and isinstance(conf.get("stream"), dict):
        job["checkpoint_stream"] = dict(conf["stream"])
    else:
        job.pop("checkpoint_stream", None)
    conf.update(rank=rank, members=[{"rank": m["rank"], "instance": m["instance"],
                                     "address": m["address"]} for m in ranks])
    job["auto_scaling"] = conf
    return job


class Team:
    """An agent's part in a job of an Auto Scaling group on several nodes (job.json's
    auto_scaling with nodes > 1): the watch for a newer attempt, the meeting after a loss,
    the waits at the end. `reader`: a bundle_reader.Bundle over the job store; `creds`: the
    role's (awsapi.RoleCredentials); `join`: bootstrap.join_attempt (the new attempt's
    job.json written, its checkpoint restored, as on a replacement)."""

    def __init__(self, agent, conf, reader, creds, ident, join):
        self.agent, self.first_conf, self.reader, self.creds = agent, conf, reader, creds
        self.ident, self.join = ident, join
        self.newer = None  # the attempt the watch found recorded
        self.seen_at = None  # when this node saw it (or look_for_loss found a peer gone)
        self.final_seen = False  # final.json was there already: not ours to write
        self.end_seen = False  # a rank k > 0 has waited for the job's end (rejoin)

    @property
    def conf(self):
        """job.json's auto_scaling as it is now: the attempt's nodes change with each meeting
        (agent.reload)."""
        return self.agent.group() or self.first_conf

    @property
    def rank(self):
        return self.conf.get("rank") or 0

    def timing(self, name, default):
        """One of regroup's waits in seconds: job.json's auto_scaling.timing[name] (the
        launch's config.yaml), else `default`, this module's."""
        value = (self.conf.get("timing") or {}).get(name)
        return default if value is None else value

    def attempt(self):
        env = self.agent.settings.get("env") or {}
        return job_records.attempt_in(env.get("CLOUDTRAIN_ATTEMPT", "1")) or 1

    def watch(self):
        """While run.sh runs: a newer attempt recorded (AWS replaced a node), or a peer EC2
        says is gone (asked every PEERS_S), stops this node's part of the job, to meet the
        others. A reclaimed instance's connections never close: the job's collectives wait
        for it, and would until the replacement recorded its attempt, minutes later."""
        agent, n = self.agent, self.attempt()
        mine_id = self.ident.get("instance")
        peers = [m["instance"] for m in self.conf.get("members") or []
                 if m.get("instance") != mine_id]
        asked = now()
        while agent.proc is not None and agent.proc.poll() is None:
            why = None
            try:
                found = newest(self.reader, self.conf["prefix"], n)
            except Failed:
                found = n  # the store did not answer: asked again next time
            if found > n:
                why = "attempt %d recorded: AWS replaced a node of the job" % found
            elif peers and now() - asked >= self.timing("peers_s", PEERS_S):
                asked = now()
                states, _ = auto_scaling.instance_states(self.conf, self.creds, peers)
                gone = [p for p in peers if (states or {}).get(p) in GONE]
                if gone:
                    found = n + 1
                    why = "node %s is gone (%s)" % (gone[0], states[gone[0]])
            if why is not None and agent.stop_reason is None:
                self.newer, self.seen_at = found, now()
                agent.log_line("%s; this node stops its part and meets the others" % why)
                agent.request_stop(REGROUP, why, self.timing("stop_grace_s", STOP_GRACE_S))
                return
            time.sleep(self.timing("watch_s", WATCH_S))

    def start_watch(self):
        threading.Thread(target=self.watch, daemon=True).start()

    def look_for_loss(self):
        """After a failed run that nobody asked to stop: the attempt to meet at when a peer is
        gone (EC2 says it is not running, or a newer attempt is recorded) within LOST_WAIT_S,
        else None (the failure is the job's own)."""
        n, mine_id, prefix = self.attempt(), self.ident.get("instance"), self.conf["prefix"]
        members = [m for m in self.conf.get("members") or [] if m.get("instance") != mine_id]
        peers = [m["instance"] for m in members]
        deadline = now() + self.timing("lost_wait_s", LOST_WAIT_S)
        while True:
            try:
                if newest(self.reader, prefix, n) > n:
                    return n + 1
                for m in members:
                    if isinstance(m.get("rank"), int) and job_records.check_leaving(
                            job_records.read_record(self.reader.get_bytes(
                                job_records.leaving_key(prefix, n, m["rank"]),
                                RECORD_MAX_BYTES, EXIT_STORE, denied_is_missing=True)),
                            m["rank"]) is not None:
                        self.agent.log_line("node %s had a spot notice: the job goes on "
                                            "after AWS replaces it" % m["instance"])
                        return n + 1
            except Failed:
                pass
            states, why = auto_scaling.instance_states(self.conf, self.creds, peers)
            lost = [p for p in peers if states is not None and states.get(p) not in
                    auto_scaling.ALIVE]
            if lost:
                self.agent.log_line("node %s is gone (%s): the job goes on after AWS "
                                    "replaces it" % (lost[0], states.get(lost[0], "unknown")))
                return n + 1
            if now() >= deadline:
                if states is None:
                    self.agent.log_line("the peers' state could not be asked (%s)" % why)
                return None
            time.sleep(self.timing("watch_s", WATCH_S))

    def leaving(self):
        """A spot notice on this node: its peers are told at once (their runs fail with it
        gone, and EC2 says running until it powers off)."""
        prefix = self.conf["prefix"]
        try:
            agent_upload.post_json(records_grant(self.agent.settings, prefix),
                                   job_records.leaving_key(prefix, self.attempt(), self.rank),
                                   job_records.leaving_doc(self.rank,
                                                           self.ident.get("instance")))
        except Exception as exc:  # noqa: BLE001 - its peers then learn it from EC2
            self.agent.log_line("could not tell the other nodes of the notice: %s" % exc)

    def again(self):
        """After run.sh ended: True when this node met the others in a newer attempt and is to
        run its part again (job.json, the checkpoint and the agent's settings are then the
        new attempt's); False when the job's end is its own."""
        agent = self.agent
        end = agent.held_end  # None: succeeded, cancelled, preempted, out of time: the end
        if end is None:
            return False
        if self.newer is None:
            self.newer, self.seen_at = self.look_for_loss(), now()
            if self.newer is None:  # a failure of the job's own
                agent.held_end = None
                agent.write_status(**end)
                return False
        at_least, self.newer, agent.held_end = self.newer, None, None
        # where a regroup's time goes, in status.json: the run's end, the loss seen (a newer
        # attempt, a peer gone), the checkpoint stored, all nodes met, the checkpoint restored
        timeline = {"to": at_least, "at": now(), "run_ended": end.get("ended_at"),
                    "loss_seen": self.seen_at}
        agent.store.finish_stream(agent.store.upload_limit())  # rank 0's checkpoint first
        timeline["stored"] = now()
        agent.write_status(state=RUNNING, ended_at=None, exit_code=None, reason=None,
                           pid=None, regroup=timeline)
        try:
            job = self.meet_again(at_least, timeline)
        except Failed as exc:
            self.final_seen = exc.code == EXIT_ENDED
            if exc.code == EXIT_RESTARTS:  # as a replacement's bootstrap ends such a job:
                agent.restarts_used = True  # final.json says preempted, the group ends
                agent.write_status(state=PREEMPTED, ended_at=now(), reason=str(exc))
                return False
            agent.write_status(state=CANCELLED if self.final_seen else FAILED, ended_at=now(),
                               reason="meeting the other nodes: %s" % exc)
            return False
        except Exception as exc:  # a bug: the job's end, said, and the power-off still comes
            agent.write_status(state=FAILED, ended_at=now(), reason="meeting the other "
                               "nodes failed: %s: %s" % (type(exc).__name__, exc))
            return False
        agent.reload(job)
        agent.write_status(regroup=timeline)
        return True

    def meet_again(self, at_least, timeline=None):
        """Meet the others at attempt >= at_least, take this node's part, restore the latest
        checkpoint; the new job.json. `timeline` gets the times it met and restored."""
        timeline = {} if timeline is None else timeline
        root, prefix = self.agent.jobdir, self.conf["prefix"]
        job = safefile.read_json(os.path.join(root, "job.json"), FILE_MAX_BYTES)
        if not isinstance(job, dict):
            raise Failed(EXIT_STORE, "job.json is not a JSON object")
        me = mine(self.ident, self.rank)
        n, ranks = meet(self.reader, records_grant(job, prefix), prefix, at_least,
                        self.conf["nodes"], me, group_peers(self.conf, self.creds,
                                                            self.agent.log_line),
                        say=self.agent.log_line, max_restarts=self.conf.get("max_restarts"))
        rank = next(m["rank"] for m in ranks if m["instance"] == me["instance"])
        timeline.update(met=now(), attempt=n)
        self.agent.log_line("attempt %d: rank %d of %d, rendezvous %s:%d"
                            % (n, rank, len(ranks), ranks[0]["address"], ranks[0]["port"]))
        job, _ = self.join(self.reader, root, take_part(job, prefix, rank, ranks, me["iface"]),
                           n)
        timeline["restored"] = now()
        return job

    def before_final(self):
        """Rank 0 at the job's end: the other ranks' results stored first (bounded), since
        ending the group ends their instances; a newer attempt (a node lost meanwhile, whose
        replacement will find final.json) ends the wait. Others: their mark that they have."""
        prefix, n = self.conf["prefix"], self.attempt()
        if self.rank != 0:
            try:
                agent_upload.post_json(records_grant(self.agent.settings, prefix),
                                       job_records.ended_key(prefix, n, self.rank),
                                       job_records.ended_doc(self.rank, self.agent.status.get(
                                           "state"), self.ident.get("instance")))
            except Exception as exc:  # noqa: BLE001 - said; rank 0's wait is bounded
                self.agent.log_line("could not mark this node's end: %s" % exc)
            return
        waiting = set(range(1, self.conf["nodes"]))
        deadline = now() + END_WAIT_S
        while waiting and now() < deadline:
            for k in sorted(waiting):
                try:
                    if job_records.check_ended(job_records.read_record(self.reader.get_bytes(
                            job_records.ended_key(prefix, n, k), RECORD_MAX_BYTES, EXIT_STORE,
                            denied_is_missing=True)), k) is not None:
                        waiting.discard(k)
                except Failed:
                    pass
            if waiting and self._newer(n):
                self.agent.log_line("a node was replaced after the job's end: ranks %s "
                                    "stored what they could" % sorted(waiting))
                return
            if waiting:
                time.sleep(self.timing("watch_s", WATCH_S))
        if waiting:
            self.agent.log_line("ranks %s did not say they stored their results in %.0f s"
                                % (sorted(waiting), END_WAIT_S))

    def _newer(self, n):
        try:
            return newest(self.reader, self.conf["prefix"], n) > n
        except Failed:
            return False

    def rejoin(self):
        """Ranks k > 0 whose part has ended: the job's end is rank 0's to record. Until
        final.json says it (bounded), a newer attempt means rank 0's node was lost before it
        could (a spot notice or a reclaim while it stored the job's end): this node meets the
        replacement and runs its part again, from the last streamed checkpoint. True when it
        did (job.json and the agent's settings are then the new attempt's)."""
        agent = self.agent
        if self.rank == 0 or agent.status.get("state") in (PREEMPTED, CANCELLED):
            return False
        n, deadline = self.attempt(), now() + 2 * END_WAIT_S
        while now() < deadline:
            try:
                if ended(self.reader, self.conf["prefix"]):
                    self.end_seen = True
                    return False
                found = newest(self.reader, self.conf["prefix"], n)
            except Failed:
                found = n
            if found > n:
                agent.log_line("attempt %d recorded before the job's end: rank 0's node was "
                               "replaced; this node meets it and runs its part again" % found)
                end = {k: agent.status.get(k) for k in ("state", "ended_at", "exit_code",
                                                        "reason")}
                self.newer, self.seen_at, agent.held_end = found, now(), end
                if self.again():
                    return True
                agent.write_status(**end)  # its part stands as it ended
                return False
            time.sleep(self.timing("watch_s", WATCH_S))
        self.end_seen = True  # waited long enough: the power-off need not wait again
        return False

    def before_power_off(self):
        """Ranks k > 0 at the job's end: wait (bounded) for final.json, and then for the group's
        deletion to end this instance; a node that powered off while the group lives would be
        replaced."""
        if self.rank == 0 or self.agent.status.get("state") == PREEMPTED:
            return
        deadline = now() + 2 * END_WAIT_S
        while now() < deadline and not self.end_seen:
            try:
                if ended(self.reader, self.conf["prefix"]):
                    break
            except Failed:
                pass
            time.sleep(self.timing("watch_s", WATCH_S))
        time.sleep(min(120.0, max(0.0, deadline - now())))

    def writes_final(self):
        """Whether this agent records the job's end: rank 0's, unless it was there already."""
        return self.rank == 0 and not self.final_seen
