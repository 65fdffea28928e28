"""AWS Fault Injection Service's spot interruption, as AWS documents it, in the namespace lab
(tests/labs/asg.py's instances; root only).

moto 5.2 keeps FIS's experiment templates and experiments and nothing more: it never checks
a template's role, action or target, and an experiment moves to "completed" the moment it is
looked at, having done nothing. FaultInjection patches moto's FIS backend (with the test's
monkeypatch, gone at its end) so that what cloudtrain relies on happens as the FIS user guide
and API reference say:

- **CreateExperimentTemplate** is refused (ValidationException) for: an action other than
  those listed here; a parameter the action does not take, or `durationBeforeInterruption`
  outside PT2M..PT15M (ISO 8601 minutes); an action target whose resource type is not the
  action's (`aws:ec2:send-spot-instance-interruptions` takes `aws:ec2:spot-instance`
  targets, under the key `SpotInstances`); a target without resourceArns, resourceTags or
  filters, or with a selectionMode other than ALL, COUNT(n), PERCENT(n); a role that is not
  there or that FIS may not assume (its trust policy must let `fis.amazonaws.com` assume it).
- **StartExperiment** resolves the targets when it starts: only existing, running Spot
  Instances resolve (an on-demand instance, one terminated, one of another account is not a
  target); an empty resolution fails the experiment ("Target resolution returned empty set",
  the template's default emptyTargetResolutionMode `fail`). Otherwise the experiment runs,
  and for each instance, at once: the rebalance recommendation in its metadata
  (events/recommendations/rebalance: {"noticeTime"}) and, two minutes before the
  interruption, the interruption notice (spot/instance-action: {"action": "terminate",
  "time"}); at PT2M both come at once. When the duration has passed, EC2 interrupts the
  instance (terminated with Server.SpotInstanceTermination, as labs.cloud.take_back does),
  unless it is gone already, and the experiment is "completed".
- **Answers are JSON** with FIS's content type (moto's server sent them as text/html).
- **GetExperiment** says the state the lab holds (pending, running, completed, failed,
  stopped); **StopExperiment** stops one that runs (its interruption does not come).

    FaultInjection(lab, monkeypatch, minute=60.0).install()   `minute`: seconds the lab's
                                                  clock gives one of FIS's minutes
    .experiments           {experiment id: {"status", "reason", "instances"}}
    .events                [{"t", "event", ...}]: template-refused, started, failed,
                           notice, interrupted, completed, stopped
"""

from __future__ import annotations

import json
import re
import threading
import time

SPOT_ACTION = "aws:ec2:send-spot-instance-interruptions"
ACTIONS = {SPOT_ACTION: {"target_key": "SpotInstances", "resource_type": "aws:ec2:spot-instance",
                         "parameters": {"durationBeforeInterruption"}}}
DURATION = re.compile(r"^PT(\d+)M$")
SELECTION = re.compile(r"^(ALL|COUNT\(\d+\)|PERCENT\(\d+\))$")
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
SPOT_REASON = ("Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot "
                                                 "instance termination")


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class FaultInjection:
    def __init__(self, lab, monkeypatch, minute: float = 60.0):
        self.lab, self.mp, self.minute = lab, monkeypatch, minute
        self.experiments: dict[str, dict] = {}
        self.events: list[dict] = []
        self.lock = threading.Lock()
        self.timers: list[threading.Timer] = []

    def log(self, event: str, **detail) -> None:
        with self.lock:
            self.events.append({"t": time.time(), "event": event, **detail})

    def install(self) -> "FaultInjection":
        from moto.fis.exceptions import FISException
        from moto.fis.models import Experiment, FISBackend

        class ValidationException(FISException):
            code = 400

            def __init__(self, message: str):
                super().__init__("ValidationException", message)

        lab = self
        create, start = FISBackend.create_experiment_template, FISBackend.start_experiment

        def create_experiment_template(backend, client_token, description, stop_conditions,
                                       targets, actions, role_arn, *args, **kwargs):
            why = lab._template_refusal(backend, stop_conditions, targets or {}, actions or {},
                                        role_arn)
            if why:
                lab.log("template-refused", why=why)
                raise ValidationException(why)
            return create(backend, client_token, description, stop_conditions, targets,
                          actions, role_arn, *args, **kwargs)

        def start_experiment(backend, *args, **kwargs):
            answer = start(backend, *args, **kwargs)
            experiment = backend.experiments[answer["id"]]
            lab._run(backend, experiment)
            return experiment.to_dict(tags=backend.tagger.get_tag_dict_for_resource(
                experiment.arn))

        def stop_experiment(backend, id):
            held = lab.experiments.get(id)
            if held is not None and held["status"] in ("pending", "running"):
                held["status"], held["reason"] = "stopped", "Experiment stopped"
                lab.log("stopped", experiment=id)
            return backend.experiments[id].to_dict()

        class LabExperiment(Experiment):
            @property
            def status(self):
                held = lab.experiments.get(self.id)
                return held["status"] if held else "pending"

            @status.setter
            def status(self, value):
                pass

        self.experiment_class = LabExperiment
        # FIS answers in JSON (restJson1) with its content type; moto's server sends its
        # FIS answers as text/html, which a client takes for a proxy's page.
        from moto.fis.responses import FISResponse

        call = FISResponse.call_action

        def call_action(response):
            status, headers, body = call(response)
            return status, dict(headers, **{"Content-Type": "application/json"}), body

        self.mp.setattr(FISResponse, "call_action", call_action)
        self.mp.setattr(FISBackend, "create_experiment_template", create_experiment_template)
        self.mp.setattr(FISBackend, "start_experiment", start_experiment)
        self.mp.setattr(FISBackend, "stop_experiment", stop_experiment)
        self.mp.setattr(Experiment, "STATUS_REASONS", dict(
            Experiment.STATUS_REASONS, failed="Target resolution returned empty set"))
        return self

    def close(self) -> None:
        for timer in self.timers:
            timer.cancel()

    # -- the rules

    def _template_refusal(self, backend, stop_conditions, targets: dict, actions: dict,
                          role_arn: str) -> str | None:
        if not stop_conditions:
            return "stopConditions is required"
        for name, target in targets.items():
            if not (target.get("resourceArns") or target.get("resourceTags")
                    or target.get("filters")):
                return f"Target {name} must specify resourceArns, resourceTags or filters"
            if not SELECTION.match(str(target.get("selectionMode") or "")):
                return f"Target {name} has an invalid selectionMode"
        if not actions:
            return "actions is required"
        for name, action in actions.items():
            known = ACTIONS.get(action.get("actionId"))
            if known is None:
                return f"Action {name}: unknown action id {action.get('actionId')!r}"
            params = action.get("parameters") or {}
            extra = set(params) - known["parameters"]
            if extra:
                return f"Action {name}: unknown parameter(s) {sorted(extra)}"
            duration = DURATION.match(params.get("durationBeforeInterruption", "PT2M"))
            if not duration or not 2 <= int(duration.group(1)) <= 15:
                return (f"Action {name}: durationBeforeInterruption must be between PT2M and "
                        "PT15M")
            for key, target_name in (action.get("targets") or {}).items():
                target = targets.get(target_name)
                if key != known["target_key"] or target is None or \
                        target.get("resourceType") != known["resource_type"]:
                    return (f"Action {name} takes a {known['resource_type']} target under "
                            f"{known['target_key']}")
        return self._role_refusal(backend, role_arn)

    @staticmethod
    def _role_refusal(backend, role_arn: str) -> str | None:
        from moto.iam.models import iam_backends

        name = str(role_arn or "").rsplit("/", 1)[-1]
        iam = iam_backends[backend.account_id]["global"]
        role = next((r for r in iam.roles.values() if r.name == name), None)
        if role is None:
            return f"The role {role_arn} does not exist"
        trust = role.assume_role_policy_document
        doc = json.loads(trust) if isinstance(trust, str) else trust
        for statement in doc.get("Statement", []):
            services = (statement.get("Principal") or {}).get("Service") or []
            services = [services] if isinstance(services, str) else services
            actions = statement.get("Action")
            actions = [actions] if isinstance(actions, str) else actions or []
            if statement.get("Effect") == "Allow" and "fis.amazonaws.com" in services and \
                    "sts:AssumeRole" in actions:
                return None
        return f"FIS cannot assume the role {role_arn}: its trust policy does not name fis.amazonaws.com"

    # -- the experiment

    def _resolve(self, backend, experiment) -> list:
        from moto.ec2.models import ec2_backends

        ec2 = ec2_backends[backend.account_id][backend.region_name]
        found = []
        for target in experiment.targets.values():
            for arn in target.get("resourceArns") or []:
                parts = arn.split(":")
                if len(parts) < 6 or parts[4] != backend.account_id or \
                        parts[3] != backend.region_name:
                    continue
                instance_id = parts[5].split("/", 1)[-1]
                try:
                    inst = ec2.get_instance(instance_id)
                except Exception:
                    continue
                if inst.state == "running" and inst.lifecycle == "spot":
                    found.append(inst)
        return found

    def _run(self, backend, experiment) -> None:
        experiment.__class__ = self.experiment_class
        instances = self._resolve(backend, experiment)
        held = {"status": "running", "reason": "Experiment is running",
                "instances": [i.id for i in instances]}
        self.experiments[experiment.id] = held
        if not instances:
            held["status"], held["reason"] = "failed", "Target resolution returned empty set"
            self.log("failed", experiment=experiment.id)
            return
        self.log("started", experiment=experiment.id, instances=held["instances"])
        (action,) = experiment.actions.values()
        minutes = int(DURATION.match((action.get("parameters") or {}).get(
            "durationBeforeInterruption", "PT2M")).group(1))
        now = time.time()
        at = now + minutes * self.minute
        for inst in instances:
            ip = inst.private_ip_address
            self.lab.imds.metadata.setdefault(ip, {})[REBALANCE_PATH] = json.dumps(
                {"noticeTime": _utc(now)})
            # The notice says the time EC2 gives (two of AWS's minutes ahead at PT2M).
            notice_at = max(now, at - 2 * self.minute)

            def notice(ip=ip, inst=inst):
                if held["status"] == "running":
                    self.lab.imds.spot_actions[ip] = {
                        "action": "terminate", "time": _utc(time.time() + 2 * self.minute)}
                    self.log("notice", experiment=experiment.id, instance=inst.id)

            self._later(notice_at - now, notice)

        def interrupt():
            if held["status"] != "running":
                return
            for inst in instances:
                if inst.state not in ("terminated", "shutting-down"):
                    self.lab.take_back({"InstanceId": inst.id,
                                        "PrivateIpAddress": inst.private_ip_address},
                                       SPOT_REASON)
                    self.log("interrupted", experiment=experiment.id, instance=inst.id)
            held["status"], held["reason"] = "completed", "Experiment completed"
            self.log("completed", experiment=experiment.id)

        self._later(at - now, interrupt)

    def _later(self, seconds: float, what) -> None:
        if seconds <= 0:
            what()
            return
        timer = threading.Timer(seconds, what)
        timer.daemon = True
        self.timers.append(timer)
        timer.start()
