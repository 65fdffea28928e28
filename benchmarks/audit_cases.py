"""The bad-input corpus of benchmarks/audit_figures.py, as data.

Placeholders in arguments, filled in per case by the runner: {job} is a finished local job's
id, {p1} its first character (an ambiguous or matching prefix), {aws} the id of a finished job
with an AWS instance row, {dir} the case's own scratch directory.

Never put a pid or process group of 0, 1, a negative number or a live process in a job-side
status.json: `down` signals what it finds there.
"""

from __future__ import annotations

HUGE = "a" * 100_000
DEEP_JSON = '{"a":' * 9_000 + "1" + "}" * 9_000  # 54 KB of nesting
DEEP_YAML = "a: " + "[" * 5_000 + "]" * 5_000 + "\n"

# Strings that a job reference, a name or a free-text flag may receive.
HOSTILE_TEXT = {
    "empty": "",
    "space": " ",
    "newline": "a\nb",
    "carriage return": "a\rb",
    "control chars": "a\x01\x07\x7fb",
    "ANSI escape": "\x1b[31mred\x1b[0m",
    "bidi override": "\u202eexe.txt",
    "zero-width": "a\u200bb",
    "emoji": "\U0001f680",
    "100k chars": HUGE,
    "LIKE %": "%",
    "LIKE _": "_",
    "LIKE %_ mix": "%_%_%" * 50,
    "backslash": "\\",
    "quote": "'",
    "double quote": '"',
    "path traversal": "../../etc/passwd",
    "dash option": "-x",
    "shell": "$(id); `id`",
    "non-ASCII": "é",
    "non-UTF-8 byte 0xff": "\udcff",  # os.fsencode: the raw byte 0xff in argv
}

JOB_REFS = {k: HOSTILE_TEXT[k] for k in (
    "empty", "space", "newline", "control chars", "ANSI escape", "bidi override", "100k chars",
    "LIKE %", "LIKE _", "LIKE %_ mix", "backslash", "quote", "path traversal", "shell",
    "non-ASCII", "non-UTF-8 byte 0xff")}
JOB_REFS.update({"unknown id": "nope", "id-shaped unknown": "deadbeef", "prefix": "{p1}",
                 "prefix%": "{p1}%", "id + newline": "{job}\n", "id with spaces": " {job} "})

NUMBERS = ["nan", "NaN", "inf", "-inf", "1e400", "-1", "0", "-0", "1e308", "abc", "", " 5",
           "0x10", "1_000", "99999999999999999999999"]

LAUNCH = ["launch", "-q"]
DRY = ["--dry-run"]
CMD = ["--", "true"]
AWS_DRY = ["-i", "g5.xlarge", "--dry-run"]


def cli_cases() -> list[tuple[str, list[str]]]:
    """(label, argv) over every command."""
    cases: list[tuple[str, list[str]]] = []
    add = cases.append
    for command in ("status", "logs", "attach", "down", "ssh"):
        for label, ref in JOB_REFS.items():
            add((f"{command} <{label}>", [command, ref]))
    for label, ref in (("empty", ""), ("unknown", "nope"), ("traversal", "../../x"),
                       ("100k", HUGE), ("newline", "resnet9\n"), ("ANSI", "\x1b[31m")):
        add((f"recipes <{label}>", ["recipes", ref]))

    # launch: names, numbers, --set grammar, regions, instances, flags that do not apply
    for label in ("empty", "newline", "ANSI escape", "bidi override", "100k chars", "LIKE %",
                  "dash option", "control chars", "zero-width", "emoji"):
        add((f"launch --name <{label}>", LAUNCH + ["--name", HOSTILE_TEXT[label]] + CMD))
    add(("launch --name <an id prefix>", LAUNCH + ["--name", "{p1}"] + CMD))
    add(("launch --name <an existing id>", LAUNCH + ["--name", "{job}"] + CMD))
    add(("launch --name <digits>", LAUNCH + ["--name", "1"] + CMD))
    for value in NUMBERS:
        add((f"launch --max-runtime {value!r}", LAUNCH + ["--max-runtime", value] + DRY + CMD))
    for value in ("nan", "inf", "1e400"):
        add((f"launch aws --max-runtime {value}",
             LAUNCH + ["--max-runtime", value] + AWS_DRY + CMD))
    for value in ("0", "-1", "1e20", "100000000000000000000", "nan", "", "x"):
        add((f"launch --procs {value!r}",
             LAUNCH + ["--recipe", "resnet9", "--procs", value] + DRY))
    for value in ("7", "65537", "-1", "nan", "1e30", "", "10" * 30):
        add((f"launch --disk-gb {value!r}", LAUNCH + ["--disk-gb", value] + AWS_DRY + CMD))
    for value in ("nan", "-1", "inf", "abc", "0", "1e400"):
        add((f"launch --max-price {value}",
             LAUNCH + ["--spot", "--max-price", value] + AWS_DRY + CMD))
        add((f"launch --idle-minutes {value}",
             LAUNCH + ["--keep", "--idle-minutes", value] + AWS_DRY + CMD))
    for value in ("", "=", "a", "=x", "epochs=", "epochs=nan", "epochs=inf", "epochs=-5",
                  "epochs=0", "epochs=1e30", "epochs=" + "9" * 40, "gpus=-1", "gpus=0",
                  "gpus=100000", "nope=1", "epochs=1=2", "epochs=\n3", "epochs= 3",
                  "EPOCHS=3", "epochs=3\x1b", HUGE + "=1", "epochs=" + HUGE):
        add((f"launch --set {value[:30]!r}",
             LAUNCH + ["--recipe", "resnet9", "--set", value] + DRY))
        add((f"estimate --set {value[:30]!r}", ["estimate", "--recipe", "resnet9", "--set", value]))
    for value in ("", "bogus", "../../etc", "smoke\n", HUGE):
        add((f"launch --profile {value[:20]!r}",
             LAUNCH + ["--recipe", "resnet9", "--profile", value] + DRY))
    for value in ("", "nope", "../../etc/passwd", "/etc", "resnet9/../airbench94", HUGE):
        add((f"launch --recipe {value[:20]!r}", LAUNCH + ["--recipe", value] + DRY))
        add((f"estimate --recipe {value[:20]!r}", ["estimate", "--recipe", value]))
    for value in ("", "V100", ":1", "V100:0", "V100:-1", "V100:nan", "V100:1e9", "ZZZ:1",
                  "V100:1:2", "v100:1", HUGE + ":1"):
        add((f"launch --gpus {value[:20]!r}", LAUNCH + ["--gpus", value] + DRY + CMD))
        add((f"estimate --gpus {value[:20]!r}",
             ["estimate", "--recipe", "resnet9", "--gpus", value]))
    for value in ("../../x", "us-east-1; id", "US-EAST-1", "", "nowhere", "us-east-1\n",
                  "us-east-99", HUGE):
        add((f"launch --region {value[:20]!r}",
             LAUNCH + ["--region", value] + AWS_DRY + CMD))
        add((f"catalog --region {value[:20]!r}", ["catalog", "--region", value]))
        add((f"estimate --region {value[:20]!r}",
             ["estimate", "--recipe", "resnet9", "--region", value]))
    for value in ("", "../x", "g5.xlarge\n", "x" * 1000, "g5.nonexistent", "G5.XLARGE"):
        add((f"launch --instance {value[:20]!r}", LAUNCH + ["--instance", value] + DRY + CMD))
        add((f"estimate --instance {value[:20]!r}",
             ["estimate", "--recipe", "resnet9", "--instance", value]))
    for value in ("", "gcp", "LOCAL", "aws\n", HUGE):
        add((f"launch --backend {value[:20]!r}", LAUNCH + ["--backend", value] + CMD))
    for value in ("", "/nonexistent", "/dev/null", "{dir}/afile", "{dir}/nonexistent/\n", HUGE):
        add((f"launch --workdir {value[:20]!r}", LAUNCH + ["--workdir", value] + CMD))
    for value in ("", "nope", "{job}", "%", "{aws}"):
        add((f"launch --on {value!r}", LAUNCH + ["--on", value] + CMD))
        add((f"launch --resume-from {value!r}",
             LAUNCH + ["--recipe", "resnet9", "--resume-from", value] + DRY))
    for value in ("", "[", "**/../../etc", "\n"):
        add((f"launch --include {value!r}", LAUNCH + ["--include", value] + CMD))
    add(("launch --spot on local", LAUNCH + ["--spot"] + CMD))
    add(("launch --keep on local", LAUNCH + ["--keep"] + CMD))
    add(("launch --ami on local", LAUNCH + ["--ami", "ami-123"] + CMD))
    add(("launch --ami <traversal>", LAUNCH + ["--ami", "../../x"] + AWS_DRY + CMD))
    add(("launch no command", LAUNCH))
    add(("launch recipe and command", LAUNCH + ["--recipe", "resnet9"] + CMD))
    add(("launch -- ''", LAUNCH + ["--", ""]))
    add(("launch -- newline", LAUNCH + ["--", "echo", "a\nrm -rf /nonexistent-x"]))
    add(("launch -- 100k arg", LAUNCH + ["--", "echo", HUGE]))
    add(("launch -- ANSI", LAUNCH + ["--", "echo", "\x1b[2J"]))

    # status / logs / down / cost-report / catalog flags
    for value in ("-1", "0", "nan", "1e30", "", "99999999999999999999"):
        add((f"status --limit {value!r}", ["status", "--limit", value]))
        add((f"logs --tail {value!r}", ["logs", "--tail", value, "{job}"]))
        add((f"down --grace {value!r}", ["down", "--grace", value, "{job}"]))
    for value in ("", "nand", "30", "-1d", "0d", "1e400d", "99999999999999999999d", "3w2d",
                  "30d\n", HUGE):
        add((f"cost-report --since {value[:20]!r}", ["cost-report", "--since", value]))
    for by in ("job", "recipe", "instance", "day", "month", "", "week"):
        add((f"cost-report --by {by!r}", ["cost-report", "--by", by]))
    add(("cost-report --json --csv", ["cost-report", "--json", "--csv"]))
    for value in ("", "ZZZ", "%", HUGE, "a100"):
        add((f"catalog --gpu {value[:20]!r}", ["catalog", "--gpu", value]))
    add(("down --all twice over", ["down", "--all", "{job}"]))
    add(("down no job", ["down"]))
    add(("status --json --refresh no credentials", ["status", "--json", "--refresh"]))
    add(("unknown command", ["frobnicate"]))
    add(("--debug alone", ["--debug"]))
    return cases


# config.yaml contents (bytes or text), each read by `status` and by a local launch
CONFIGS: dict[str, str | bytes] = {
    "int key": "1: 2\n",
    "null key": "~: 1\n",
    "float key": "1.5: x\n",
    "bool key": "true: 1\n",
    "list key": "? [a, b]\n: 1\n",
    "non-UTF-8": b"backend: \xff\xfe\n",
    "UTF-16 BOM": "backend: local\n".encode("utf-16"),
    "NUL bytes": b"backend: lo\x00cal\n",
    "empty": "",
    "only a comment": "# nothing\n",
    "a list": "- a\n- b\n",
    "a scalar": "42\n",
    "invalid YAML": "backend: [local\n",
    "tabs": "backend:\tlocal\n\tregion: x\n",
    "python tag": "backend: !!python/object/apply:os.system ['true']\n",
    "alias bomb": "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                  "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c]\n"
                  "region: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
    "deep nesting": DEEP_YAML,
    "unknown key": "nope: 1\n",
    "stale_after_seconds -1": "stale_after_seconds: -1\n",
    "stale_after_seconds .nan": "stale_after_seconds: .nan\n",
    "stale_after_seconds 0": "stale_after_seconds: 0\n",
    "stale < heartbeat": "stale_after_seconds: 0.4\nheartbeat_seconds: 0.5\n",
    "heartbeat_seconds 0": "heartbeat_seconds: 0\n",
    "heartbeat_seconds 1e308": "heartbeat_seconds: 1e308\n",
    "max_runtime_minutes -5": "max_runtime_minutes: -5\n",
    "max_runtime_minutes .nan": "max_runtime_minutes: .nan\n",
    "max_runtime_minutes .inf": "max_runtime_minutes: .inf\n",
    "max_runtime_minutes 1e400": "max_runtime_minutes: 1e400\n",
    "max_runtime_minutes string": "max_runtime_minutes: soon\n",
    "stop_grace_seconds -1": "stop_grace_seconds: -1\n",
    "stop_grace_seconds true": "stop_grace_seconds: true\n",
    "stop_grace_seconds list": "stop_grace_seconds: [1, 2]\n",
    "ssh_port 70000": "ssh_port: 70000\n",
    "ssh_port 0": "ssh_port: 0\n",
    "ssh_port 22.5": "ssh_port: 22.5\n",
    "ssh_port string": "ssh_port: ssh\n",
    "poll_seconds 0": "poll_seconds: 0\n",
    "collect_checkpoints_mb -1": "collect_checkpoints_mb: -1\n",
    "disk_gb 3": "disk_gb: 3\n",
    "region list": "region: [us-east-1]\n",
    "region traversal": "region: ../../x\n",
    "regions bad": "regions: us-east-1, nowhere\n",
    "market cheap": "market: cheap\n",
    "backend gcp": "backend: gcp\n",
    "backend null": "backend: null\n",
    "backend int": "backend: 5\n",
    "python missing": "python: /nonexistent/python\n",
    "python int": "python: 5\n",
    "python empty dict": "python: {}\n",
    "python is a directory": "python: /tmp\n",
    "huge value": "backend: " + "x" * 1_000_000 + "\n",
    "date value": "stale_after_seconds: 2026-11-23\n",
    "binary value": "backend: !!binary aGVsbG8=\n",
    "set value": "backend: !!set {a, b}\n",
    "merge key": "<<: {backend: local}\n",
}
# config.yaml as something other than a file: made by the runner
CONFIG_SHAPES = ["directory", "symlink to /dev/null", "dangling symlink", "symlink loop",
                 "symlink to /etc/shadow"]

# state.db corruptions (whole-file), made by the runner
STATE_SHAPES = ["random bytes", "truncated", "directory", "empty file", "foreign schema v0",
                "foreign schema current version", "user_version 99", "garbage WAL",
                "jobs table dropped", "instances table dropped", "events table dropped",
                "symlink to /dev/null", "dangling symlink", "text file"]
# one bad value in one row of the finished AWS-instance job: (table, column, value)
STATE_ROWS: list[tuple[str, str, object]] = [
    ("jobs", "spec", "{not json"), ("jobs", "spec", "[1, 2]"), ("jobs", "spec", "null"),
    ("jobs", "spec", DEEP_JSON),
    ("jobs", "host", '["a", "list"]'), ("jobs", "host", "{not json"), ("jobs", "host", "42"),
    ("jobs", "metrics", '{"train_loss": "abc", "test_acc": "x", "epoch": 1}'),
    ("jobs", "metrics", "{not json"), ("jobs", "metrics", "[1, 2]"),
    ("jobs", "metrics", '{"epoch": NaN, "train_time": Infinity}'),
    ("jobs", "metrics", '{"test_acc": "94.1%"}'), ("jobs", "metrics", DEEP_JSON),
    ("jobs", "cost_detail", "not json"), ("jobs", "cost_detail", "42"),
    ("jobs", "cost_detail", '{"phases": [1]}'), ("jobs", "cost_detail", '{"phases": {"run": "x"}}'),
    ("jobs", "created_at", "yesterday"), ("jobs", "created_at", 1e300),
    ("jobs", "created_at", -1e20), ("jobs", "created_at", b"\xff"),
    ("jobs", "started_at", "noon"), ("jobs", "ended_at", b"\x00\xff"),
    ("jobs", "ended_at", 1e18), ("jobs", "cost", "a lot"), ("jobs", "cost", -1e300),
    ("jobs", "command", b"\xff\xfe"), ("jobs", "exit_code", "zero"),
    ("jobs", "exit_code", 10**18), ("jobs", "state", "zombie"), ("jobs", "state", ""),
    ("jobs", "state", "running"), ("jobs", "backend", "gcp"), ("jobs", "kind", "???"),
    ("jobs", "name", "\x1b[31m\n"), ("jobs", "recipe", "../../etc"),
    ("instances", "details", "{not json"), ("instances", "details", '"a string"'),
    ("instances", "details", '{"disk_gb": "big", "spot_history": "x"}'),
    ("instances", "launched_at", "dawn"), ("instances", "terminated_at", 1e300),
    ("instances", "price_per_hour", "cheap"), ("instances", "price_per_hour", -5),
    ("instances", "region", "../../x"), ("instances", "state", "exploded"),
    ("instances", "instance_type", None),
]
# commands that read the database; {aws} is the job whose row is corrupted
STATE_READERS = [["status"], ["status", "{aws}", "--json"], ["logs", "{aws}"],
                 ["cost-report", "--by", "instance"], ["cost-report", "--by", "day", "--csv"],
                 ["down", "{aws}"]]

# CLOUDTRAIN_HOME values ({dir}: the case's scratch directory, where `afile` is a file)
HOMES = {
    "/dev/null": "/dev/null",
    "/proc/1": "/proc/1",
    "under a file": "{dir}/afile/home",
    "a file": "{dir}/afile",
    "relative": "relative-home",
    "~nosuchuser": "~nosuchuser-ct/x",
    "5000 chars": "{dir}/" + "d" * 250 + "/" + ("e" * 250 + "/") * 19,
    "symlink loop": "{dir}/loop",
    "dangling symlink": "{dir}/dangling",
    "newline in path": "{dir}/a\nb",
    "/proc/self/fd/0": "/proc/self/fd/0",
}

# user recipes on CLOUDTRAIN_RECIPES: each replaces recipe.yaml of a recipe `bad`, next to
# a good recipe `toy`
GOOD_RECIPE = """\
name: {name}
description: a tiny recipe
entry: train.py
arguments:
  epochs: {{type: int, default: 2, help: epochs}}
  mode: {{type: choice, choices: [fast, slow], default: fast, help: how}}
profiles:
  smoke: {{description: one epoch, set: {{epochs: 1}}}}
resources: {{gpus_per_node: 1, nodes: 1, disk_gb: 10, max_runtime_minutes: 5}}
published:
  - {{result: "50%", time: "1 s", hardware: "any CPU", source: "test"}}
"""


def bad_recipe(**replace: str) -> str:
    """GOOD_RECIPE for `bad` with some top-level keys replaced by YAML text."""
    lines = GOOD_RECIPE.format(name="bad").splitlines()
    out, skip = [], False
    for line in lines:
        key = line.split(":", 1)[0]
        if not line.startswith(" ") and key in replace:
            out.append(f"{key}: {replace.pop(key)}")
            skip = True
            continue
        if skip and line.startswith(" "):
            continue
        skip = False
        out.append(line)
    out += [f"{k}: {v}" for k, v in replace.items()]
    return "\n".join(out) + "\n"


RECIPES: dict[str, str | bytes] = {
    "profiles a list": bad_recipe(profiles="[smoke, full]"),
    "profile a string": bad_recipe(profiles="{smoke: fast}"),
    "profile set a list": bad_recipe(profiles="{smoke: {set: [1, 2]}}"),
    "profile sets unknown arg": bad_recipe(profiles="{smoke: {set: {nope: 1}}}"),
    "requires an int": bad_recipe(requires="5"),
    "requires list of ints": bad_recipe(requires="[1, 2]"),
    "choices an int": bad_recipe(arguments="{mode: {type: choice, choices: 5, default: a}}"),
    "choices empty": bad_recipe(arguments="{mode: {type: choice, choices: [], default: a}}"),
    "published a string": bad_recipe(published="yes"),
    "published list of strings": bad_recipe(published="[a, b]"),
    "published entry int": bad_recipe(published="[{result: 1, time: 2}]"),
    "arguments a list": bad_recipe(arguments="[epochs]"),
    "argument a string": bad_recipe(arguments="{epochs: int}"),
    "argument unknown type": bad_recipe(arguments="{epochs: {type: tensor, default: 1}}"),
    "default wrong type": bad_recipe(arguments="{epochs: {type: int, default: many}}"),
    "default nan": bad_recipe(arguments="{epochs: {type: float, default: .nan}}"),
    "entry traversal": bad_recipe(entry="../../../../etc/hostname"),
    "entry absolute": bad_recipe(entry="/etc/hostname"),
    "entry missing": bad_recipe(entry="nope.py"),
    "entry a list": bad_recipe(entry="[a.py]"),
    "name mismatch": bad_recipe(name="other"),
    "name an int": bad_recipe(name="5"),
    "resources a string": bad_recipe(resources="lots"),
    "gpus_per_node negative": bad_recipe(resources="{gpus_per_node: -1, nodes: 1}"),
    "gpus_per_node string": bad_recipe(resources="{gpus_per_node: x, nodes: 1}"),
    "disk_gb nan": bad_recipe(resources="{gpus_per_node: 1, disk_gb: .nan}"),
    "max_runtime huge": bad_recipe(resources="{gpus_per_node: 1, max_runtime_minutes: 1e400}"),
    "target a string": bad_recipe(target="fast"),
    "description an int": bad_recipe(description="5"),
    "int key": bad_recipe() + "1: 2\n",
    "invalid YAML": "name: bad\narguments: [\n",
    "a list": "- a\n",
    "empty": "",
    "non-UTF-8": b"name: bad\ndescription: \xff\xfe\n",
    "alias bomb": CONFIGS["alias bomb"].replace("region", "description"),
    "deep nesting": DEEP_YAML.replace("a:", "description:"),
}
RECIPE_SHAPES = ["recipe.yaml a directory", "recipe.yaml missing", "CLOUDTRAIN_RECIPES missing",
                 "CLOUDTRAIN_RECIPES a file", "CLOUDTRAIN_RECIPES /dev/null",
                 "CLOUDTRAIN_RECIPES empty dir", "recipe dir named with newline"]
RECIPE_READERS = [["recipes"], ["recipes", "bad"],
                  ["launch", "-q", "--recipe", "bad", "--dry-run"],
                  ["estimate", "--recipe", "bad"]]

# job-side files: (file, label, content); content None = made by the runner (see JOB_SHAPES)
STATUS_FILES: dict[str, str | bytes] = {
    "a list": "[1, 2]",
    "a string": '"running"',
    "a number": "42",
    "null": "null",
    "empty object": "{}",
    "empty file": "",
    "truncated": '{"state": "runn',
    "non-UTF-8": b'{"state": "\xff\xfe"}',
    "agent_pid a string": '{"state": "running", "agent_pid": "abc"}',
    "agent_pid huge": '{"state": "running", "agent_pid": 100000000000000000000000000}',
    "agent_pid beyond pid_max": '{"state": "running", "agent_pid": 4194305, "pgid": "x", '
                                '"descendants": "abc"}',
    "agent_pid NaN": '{"state": "running", "agent_pid": NaN, "pid": Infinity}',
    "times strings": '{"state": "succeeded", "started_at": "x", "ended_at": "y", '
                     '"exit_code": "zero"}',
    "times past 9999": '{"state": "succeeded", "started_at": 1e300, "ended_at": 1e301, '
                       '"exit_code": 0}',
    "times negative huge": '{"state": "failed", "started_at": -1e300, "ended_at": -Infinity}',
    "state unknown": '{"state": "zombie"}',
    "state a list": '{"state": ["running"]}',
    "reason an object": '{"state": "failed", "exit_code": 1e30, "reason": {"x": [1]}}',
    "heartbeat NaN": '{"state": "running", "heartbeat_at": NaN, "started_at": Infinity}',
    "deep nesting 54 KB": DEEP_JSON,
    "huge line 8 MB": '{"state": "running", "reason": "' + "x" * 8_000_000 + '"}',
}
METRICS_FILES: dict[str, str | bytes] = {
    "94.1%": '{"epoch": 1, "test_acc": "94.1%"}\n',
    "NaN": '{"epoch": 1, "train_time": NaN, "train_loss": NaN}\n',
    "Infinity": '{"epoch": 1, "train_time": Infinity, "test_acc": -Infinity}\n',
    "a list row": "[1, 2]\n",
    "a string row": '"epoch 1"\n',
    "a number row": "5\n",
    "null row": "null\n",
    "epoch a string": '{"epoch": "one", "epochs": "ten"}\n',
    "epoch huge": '{"epoch": 1e300, "epochs": 100000000000000000000000}\n',
    "value an object": '{"epoch": 1, "test_acc": {"a": 1}, "train_loss": [1]}\n',
    "deep nesting 54 KB": DEEP_JSON + "\n",
    "huge line 8 MB": '{"epoch": 1, "note": "' + "x" * 8_000_000 + '"}\n',
    "non-UTF-8": b'{"epoch": 1, "test_acc": "\xff"}\n',
    "truncated last line": '{"epoch": 1, "test_acc": 0.5}\n{"epoch": 2, "te',
    "10k keys": "{" + ",".join(f'"k{i}": {i}' for i in range(10_000)) + "}\n",
    "100k rows": "".join(f'{{"epoch": {i}, "test_acc": 0.5}}\n' for i in range(100_000)),
    "blank lines": "\n\n   \n\t\n",
    "no newline binary": bytes(range(256)) * 64,
}
JOB_SHAPES = ["status.json a directory", "status.json -> /etc/shadow", "metrics.jsonl a directory",
              "metrics.jsonl -> /etc/shadow", "output.log a directory", "job dir removed",
              "job.json garbage"]
JOB_READERS = [["status"], ["status", "{job}"], ["status", "--json"],
               ["logs", "--tail", "5", "{job}"], ["down", "{job}"], ["status"]]

# AWS without AWS: (label, stub server behaviour or None for a closed port, argv)
AWS_CASES: list[tuple[str, str | None, list[str]]] = []
for _server in (None, "denied", "garbage", "error500"):
    for _label, _argv in (
            ("catalog --refresh", ["catalog", "--refresh", "--region", "us-east-1"]),
            ("status --refresh", ["status", "--refresh"]),
            ("cost-report --refresh", ["cost-report", "--refresh"]),
            ("launch g5.xlarge", ["launch", "-q", "-i", "g5.xlarge", "--region", "us-east-1",
                                  "--", "true"]),
            ("launch --gpus A10G:1", ["launch", "-q", "--gpus", "A10G:1", "--", "true"]),
            ("launch --spot", ["launch", "-q", "-i", "g5.xlarge", "--spot", "--", "true"]),
            ("down --all", ["down", "--all", "-y"]),
            ("down aws job", ["down", "{aws}"])):
        AWS_CASES.append((f"{_label} [{_server or 'closed port'}]", _server, _argv))
# credentials absent altogether (no stub server reached)
AWS_NO_CREDENTIALS = [["catalog", "--refresh"], ["status", "--refresh"],
                      ["launch", "-q", "-i", "g5.xlarge", "--", "true"],
                      ["cost-report", "--refresh"]]
