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
STATE_READERS = [["status"], ["status", "{aws}", "--json"], ["status", "{aws}"],
                 ["logs", "{aws}"], ["cost-report", "--by", "instance"],
                 ["cost-report", "--by", "day", "--csv"], ["down", "{aws}"]]

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


# == the surfaces of the 2026-11-27 audit (/work/shared/findings/audit-2026-11-27.md) ==========
#
# Placeholders filled in by the runner besides {dir}: {outside} is a folder of marker files
# beside the job's directory (anything written or removed there is a write outside the job
# dir), {M} a marker file's path prefix (a file {M}-... appearing means injected code ran).

def alias_bomb(levels: int, key: str = "name") -> str:
    """The audit's F33 file: nested lists of aliases, 10^levels items once expanded (9
    levels: 489 bytes)."""
    lines = [f"{key}:", '  - &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"  - &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\nrun: echo hi\n"


def nested_key(path: str, yaml_value: str) -> str:
    """`resources.disk_gb` -> 'resources:\n  disk_gb: VALUE\n'."""
    head, _, leaf = path.rpartition(".")
    if head:
        return f"{head}:\n  {leaf}: {yaml_value}\n"
    return f"{path}: {yaml_value}\n"


# The audit's 14 keys that take text, a list or a number (F33), each given the alias bomb.
BOMB_KEYS = ["name", "setup", "run", "workdir", "recipe", "profile", "outputs", "include",
             "resources.spot", "resources.disk_gb", "resources.max_runtime", "resources.nodes",
             "resources.instance", "resources.regions"]
BIG_INT = "9" * 4301

RUN = "run: echo ok\n"
# Job files: label -> text (bytes where it must be exact). `launch FILE --dry-run` for each,
# then a real local launch where the dry run passes on the local backend.
JOB_FILES: dict[str, str | bytes] = {
    # YAML the loader must not obey or choke on
    "python tag apply": "name: !!python/object/apply:os.system ['touch {M}-tag']\n" + RUN,
    "python tag name": "name: !!python/name:os.system\n" + RUN,
    "python tag module": "run: !!python/module:os\n",
    "binary tag": "name: !!binary aGVsbG8=\n" + RUN,
    "set tag": "name: !!set {a, b}\n" + RUN,
    "timestamp name": "name: 2026-11-27\n" + RUN,
    "bad date": "name: 2026-13-45\n" + RUN,
    "float tag nan": "resources:\n  max_runtime: !!float .nan\n" + RUN,
    "NUL byte raw": b"name: a\x00b\nrun: echo ok\n",
    "NUL escaped in name": 'name: "a\\0b"\n' + RUN,
    "NUL in env value": 'envs: {A: "x\\0y"}\n' + RUN,
    "tab indent": "resources:\n\tspot: true\n" + RUN,
    "tab value": "name:\tx\n" + RUN,
    "duplicate keys": "name: a\nname: b\n" + RUN,
    "duplicate env keys": "envs:\n  A: 1\n  A: 2\n" + RUN,
    "duplicate sections": "resources: {spot: false}\nresources: {nodes: 1}\n" + RUN,
    "merge key in envs": "envs:\n  <<: {A: 1}\n  B: 2\n" + RUN,
    "merge key top": "<<: {name: merged}\n" + RUN,
    "anchor and alias": "name: &n x\nprofile: *n\n" + RUN,
    "recursive alias": "name: &o [*o]\n" + RUN,
    "recursive mapping alias": "envs: &e {A: *e}\n" + RUN,
    "alias bomb 3 levels": alias_bomb(3),
    "alias bomb 8 levels": alias_bomb(8),
    **{f"alias bomb 9 levels in {k}": alias_bomb(9, k.split(".")[-1]) if "." not in k else
       "resources:\n" + "\n".join("  " + line for line in alias_bomb(9, k.split(".")[1])
                                  .splitlines()[:-1]) + "\n" + RUN
       for k in BOMB_KEYS},
    "nesting 100000 deep": "name: " + "[" * 100_000 + "]" * 100_000 + "\n" + RUN,
    "nesting 5000 deep mapping": "name: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n" + RUN,
    "over 1 MB": RUN + "# " + "x" * (1 << 20) + "\n",
    "1 MB value": "name: " + "x" * ((1 << 20) - 100) + "\n" + RUN,
    "4301-digit disk_gb": nested_key("resources.disk_gb", BIG_INT) + RUN,
    "4301-digit arg": f"recipe: resnet9\nargs: {{epochs: {BIG_INT}}}\n",
    "4301-digit nodes": nested_key("resources.nodes", BIG_INT) + RUN,
    "4301-digit env value": f"envs: {{A: {BIG_INT}}}\n" + RUN,
    "4301-digit name": f"name: {BIG_INT}\n" + RUN,
    "4301-digit key": f"envs: {{{BIG_INT}: 1}}\n" + RUN,
    # the shape of the file
    "empty": "",
    "a list": "- name: x\n",
    "a scalar": "echo hi\n",
    "only comments": "# nothing\n",
    "non-UTF-8": b"name: \xff\xfe\nrun: echo ok\n",
    "UTF-16": ("name: x\n" + RUN).encode("utf-16"),
    "unknown key": "nmae: x\n" + RUN,
    "unknown resource key": "resources: {gpu: 1}\n" + RUN,
    "resources a list": "resources: [spot]\n" + RUN,
    "recipe and run": "recipe: resnet9\n" + RUN,
    "int key": "1: 2\n" + RUN,
    "null key": "~: 1\n" + RUN,
    "invalid YAML": "name: [x\n" + RUN,
    # names, env names, outputs, datasets, regions, instances, AMIs
    "name empty": "name: ''\n" + RUN,
    "name newline": 'name: "a\\nb"\n' + RUN,
    "name ANSI": 'name: "\\e[31mred"\n' + RUN,
    "name 100k": "name: " + "n" * 100_000 + "\n" + RUN,
    "name traversal": "name: ../../x\n" + RUN,
    "name dash": "name: -x\n" + RUN,
    "name a list": "name: [a]\n" + RUN,
    "env name digit": "envs: {1A: x}\n" + RUN,
    "env name dash": "envs: {A-B: x}\n" + RUN,
    "env name space": "envs: {'A B': x}\n" + RUN,
    "env name with =": "envs: {'A=B': x}\n" + RUN,
    "env name empty": "envs: {'': x}\n" + RUN,
    "env name CLOUDTRAIN_": "envs: {CLOUDTRAIN_JOB_DIR: /etc}\n" + RUN,
    "env name non-ASCII": "envs: {É: x}\n" + RUN,
    "env value a list": "envs: {A: [1, 2]}\n" + RUN,
    "env value unset here": "envs: {AUDIT_NOT_SET_ANYWHERE: null}\n" + RUN,
    "envs a list": "envs: [A, B]\n" + RUN,
    "output traversal": "outputs: [../../x]\n" + RUN,
    "output absolute": "outputs: [/etc]\n" + RUN,
    "output home": "outputs: ['~']\n" + RUN,
    "output newline": 'outputs: ["a\\nb"]\n' + RUN,
    "output glob": "outputs: ['*']\n" + RUN,
    "output empty": "outputs: ['']\n" + RUN,
    "output dict": "outputs: [{a: 1}]\n" + RUN,
    "dataset traversal source": "datasets: {x: 's3://bucket/../x'}\n" + RUN,
    "dataset traversal name": "datasets: {'../x': 's3://bucket/x'}\n" + RUN,
    "dataset file URL": "datasets: {x: 'file:///etc'}\n" + RUN,
    "dataset /etc/passwd": "datasets: {x: /etc/passwd}\n" + RUN,
    "dataset unknown null": "datasets: {nothere: null}\n" + RUN,
    "dataset a list": "datasets: {x: [a]}\n" + RUN,
    "region traversal": "resources: {region: ../x}\n" + RUN,
    "region shell": "resources: {region: '$(touch {M}-region)'}\n" + RUN,
    "region upper": "resources: {region: US-EAST-1}\n" + RUN,
    "region a list": "resources: {region: [us-east-1]}\n" + RUN,
    "regions hostile": "resources: {regions: [us-east-1, '$(id)', ../x]}\n" + RUN,
    "regions a number": "resources: {regions: 5}\n" + RUN,
    "instance shell": "resources: {instance: 'g5.xlarge; touch {M}-instance'}\n" + RUN,
    "instance traversal": "resources: {instance: ../x}\n" + RUN,
    "instance 1000 chars": "resources: {instance: " + "x" * 1000 + "}\n" + RUN,
    "instance a number": "resources: {instance: 5}\n" + RUN,
    "ami shell": "resources: {instance: g5.xlarge, ami: 'ami-1; touch {M}-ami'}\n" + RUN,
    "ami traversal": "resources: {instance: g5.xlarge, ami: ../x}\n" + RUN,
    "ami long": "resources: {instance: g5.xlarge, ami: ami-" + "f" * 1000 + "}\n" + RUN,
    # numbers
    **{f"disk_gb {v}": nested_key("resources.disk_gb", v) + RUN
       for v in (".nan", "-1", "1e400", "'10'", "true", "7", "70000", "1.5")},
    **{f"max_runtime {v}": nested_key("resources.max_runtime", v) + RUN
       for v in (".nan", ".inf", "-5", "0", "2x", "1e400", "999999d", "'1e3m'")},
    "max_price nan": "resources: {spot: true, max_price: .nan}\n" + RUN,
    "max_price -1": "resources: {spot: true, max_price: -1}\n" + RUN,
    "nodes 0": "resources: {nodes: 0}\n" + RUN,
    "nodes 65": "resources: {nodes: 65}\n" + RUN,
    "nodes 1.5": "resources: {nodes: 1.5}\n" + RUN,
    "procs 0": "resources: {procs: 0}\n" + RUN,
    "idle_minutes -1": "resources: {keep: true, idle_minutes: -1}\n" + RUN,
    "max_restarts 101": "resources: {spot: true, recover: true, max_restarts: 101}\n" + RUN,
    "spot a string": "resources: {spot: 'yes'}\n" + RUN,
    "fallback spot": "resources: {fallback: spot}\n" + RUN,
    # workdir out of the repository, include, inline secrets (F27, F38)
    "workdir ../..": "workdir: ../..\nrun: cat .aws/credentials\n",
    "workdir ..": "workdir: ..\n" + RUN,
    "workdir absolute home": "workdir: {dir}\n" + RUN,
    "workdir /": "workdir: /\n" + RUN,
    "workdir ~": "workdir: '~'\n" + RUN,
    "workdir symlink out": "workdir: out\n" + RUN,  # code/repo/out -> ../.. (made by runner)
    "workdir symlink loop": "workdir: loop\n" + RUN,
    "workdir a file": "workdir: job.yaml\n" + RUN,
    "workdir missing": "workdir: nowhere\n" + RUN,
    "workdir . (control)": "workdir: .\n" + RUN,
    "include .aws and .ssh": "workdir: .\ninclude: ['.aws/**', '.ssh/**']\nrun: ls\n",
    "include with ../..": "workdir: ../..\ninclude: ['.aws/**', '.ssh/**']\n"
                          "run: cat .aws/credentials\n",
    "include a pattern": "include: ['*.key']\n" + RUN,
    "secret inline value": "secrets: {TOKEN: s3cr3t-inline-audit}\n" + RUN,
    "secret inline number": "secrets: {TOKEN: 12345678}\n" + RUN,
    "secret inline empty": "secrets: {TOKEN: ''}\n" + RUN,
    "secret name bad": "secrets: {'A B': null}\n" + RUN,
}
INLINE_SECRET = "s3cr3t-inline-audit"

# F1 again: each of these in every flag and job-file field; a file {M}-<n> appearing means a
# shell ran part of it.
INJECTIONS = {
    "$() ` ' \" ;": "x$(touch {M}-1)`touch {M}-2`';touch {M}-3;'\";touch {M}-4;\";touch {M}-5",
    "newline": "x\ntouch {M}-6\ny",
}
# (label, launch argv before `--`, the command after it); {P} is the payload. Each is run as
# `launch --dry-run`, then as a real local launch.
INJECTION_FLAGS: list[tuple[str, list[str], list[str]]] = [
    ("--env value", ["--env", "A={P}"], ["true"]),
    ("--env name", ["--env", "{P}=1"], ["true"]),
    ("--secret value", ["--secret", "TOKEN={P}"], ["true"]),
    ("--output", ["--output", "{P}"], ["true"]),
    ("--name", ["--name", "{P}"], ["true"]),
    ("--data", ["--data", "d={P}"], ["true"]),
    ("--data name", ["--data", "{P}=/tmp"], ["true"]),
    ("--workdir", ["--workdir", "{dir}/{P}"], ["true"]),  # the folder is made by the runner
    ("--include", ["--include", "{P}"], ["true"]),
    ("--set (a user recipe)", ["--recipe", "toy", "--set", "tag={P}"], []),
    ("--region", ["--region", "{P}", "-i", "g5.xlarge"], ["true"]),
    ("--instance", ["--instance", "{P}"], ["true"]),
    ("--ami", ["--ami", "{P}", "-i", "g5.xlarge"], ["true"]),
    ("the command's arguments", [], ["echo", "{P}"]),
    ("CLOUDTRAIN_HOME", [], ["true"]),  # the state directory's own name holds the payload
]
# (label, job-file text); {P} is the payload written as a YAML double-quoted string
INJECTION_FIELDS: list[tuple[str, str]] = [
    ("name", "name: {P}\nrun: echo ok\n"),
    ("envs name", "envs: {{{P}: 1}}\nrun: echo ok\n"),
    ("envs value", "envs: {{A: {P}}}\nrun: echo ok\n"),
    ("secrets name", "secrets: {{{P}: null}}\nrun: echo ok\n"),
    ("outputs", "outputs: [{P}]\nrun: echo ok\n"),
    ("workdir", "workdir: {P}\nrun: echo ok\n"),  # the folder is made by the runner
    ("datasets", "datasets: {{d: {P}}}\nrun: echo ok\n"),
    ("region", "resources: {{region: {P}}}\nrun: echo ok\n"),
    ("instance", "resources: {{instance: {P}}}\nrun: echo ok\n"),
    ("ami", "resources: {{instance: g5.xlarge, ami: {P}}}\nrun: echo ok\n"),
    ("recipe args", "recipe: toy\nargs: {{tag: {P}}}\n"),
    ("profile", "recipe: toy\nprofile: {P}\n"),
]

# metrics.jsonl planted in a finished job's directory (F19, F34, F38), on top of
# METRICS_FILES; None: made by the runner (a FIFO, a link)
METRICS_HOSTILE: dict[str, str | bytes | None] = {
    "a FIFO": None,
    "a link to /dev/zero": None,
    "a link to /etc/shadow": None,
    "1e308 values": '{"epoch": 1, "test_acc": 1e308, "train_loss": 1e308}\n',
    "-1e308 times": '{"epoch": 1, "time": -1e308, "train_time": -1e308, "test_acc": 0.5}\n',
    "NaN time": '{"epoch": 1, "time": NaN, "test_acc": 0.5}\n',
    "ANSI keys": '{"epoch": 1, "\\u001b]0;owned\\u0007\\u001b[2Jacc": 0.5, '
                 '"\\u001b[31mloss": 1}\n',
    "RLO and newline keys": '{"epoch": 1, "\\u202eacc": 0.5, "a\\nb": 1}\n',
    "negative epochs": '{"epoch": -5, "epochs": -1, "test_acc": 0.5}\n{"epoch": -1e308}\n',
    "time strings": '{"epoch": 1, "time": "noon", "train_time": "1 h", "test_acc": "x"}\n',
    "huge lines 20 x 1 MB": "".join('{"epoch": %d, "n": "%s"}\n' % (i, "x" * (1 << 20))
                                    for i in range(20)),
}
METRICS_COMMANDS = [["metrics", "{job}"], ["metrics", "--csv", "{job}"],
                    ["metrics", "--json", "{job}"], ["plot", "{job}", "-o", "{dir}/m.png"],
                    ["plot", "{job}", "-o", "{dir}/m.svg"], ["status"], ["status", "{job}"],
                    ["status", "--json"]]

# Shards (shards.extract_shard): what a bucket writer can put in a tar. The driver builds
# each (benchmarks/audit_surfaces.py, tar_case).
TAR_CASES = [
    "member ../evil", "member ../../../evil", "member absolute into outside",
    "member a/../../../evil", "member ./a", "member a//b", "member .hidden", "member .git/x",
    "member with backslash", "member with NUL", "member non-UTF-8", "name of 4097 bytes",
    "component of 256 bytes", "symlink to outside", "symlink then write through it",
    "hardlink to /etc/passwd", "hardlink to outside", "char device", "block device", "FIFO",
    "directory", "contiguous file", "duplicate member", "file and folder", "GNU longname ../..",
    "GNU longlink", "global pax header", "8 MB pax header", "sparse pax key",
    "pax path override ../evil", "setuid file", "entry lies about sha256",
    "entry says larger", "entry says smaller", "entry lies about files",
    "entry lies about file bytes", "endless stream", "garbage bytes", "empty stream",
    "truncated tar", "link already in dest", "a good shard (control)",
]
# Manifests (shards.Manifest.from_json): text, or None for the driver to build
MANIFEST_CASES: dict[str, str | bytes | None] = {
    "invalid JSON": "{",
    "NaN": None,
    "nesting 100000 deep": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "5000-digit integer": None,
    "UTF-16": None,
    "17 MB": None,
    "totals that do not add up": None,
    "shard named ../../x.tar": None,
    "created 9999-99-99": None,
    "extra keys": None,
    "a list": "[]",
    "version 2": None,
    "bool as a count": None,
    "1e400 bytes": None,
    "a good manifest (control)": None,
}

# Stager plans (python -m cloudtrain.host.stager PLAN STATUS) against a lying local "S3".
STAGER_CASES = [
    "object path ..", "object path absolute", "object path hidden", "object path NUL",
    "object path empty", "duplicate paths", "file and folder", "short body", "longer body",
    "endless body", "403", "404", "500 always", "302 to a metadata-like address",
    "md5 mismatch", "size lies (smaller)", "size lies (larger)", "file:// URL", "dest /",
    "dest relative", "dest a file", "dest holds files", "bad name", "workers 0", "workers 10^9",
    "plan version 2", "plan a list", "plan a string", "kind unknown",
    "shard with ../ member through the stager", "trickle (1 byte/s)", "good objects (control)",
    "path dataset pointing outside",
]
# Checkpoint restore plans (python -m cloudtrain.host.checkpoint_stream restore PLAN JOBDIR)
RESTORE_CASES = [
    "path ..", "path absolute", "run.sh", "job.json", ".secrets.env", "sha256 mismatch",
    "size mismatch", "symlink at checkpoints/", "symlink at the file", "symlink at output.log",
    "file and folder", "10001 files", "bytes total lies", "timeout NaN", "file:// URL",
    "plan not JSON", "plan a list", "500 always", "a good plan (control)",
]
# The job store reader (jobstore_fetch.fetch) against moto's S3, keys written as the instance's
# grant could
HOSTILE_KEYS = ["../../x", "/abs", "a/../../../x", "C:x", "a\\..\\..\\x", "%2e%2e/x",
                "new\nline", "\u202eexe.txt", "n" * 300, "checkpoints/../../../x"]
JOBSTORE_CASES = [
    "hostile keys, no manifest", "hostile keys listed in a manifest",
    "manifest lies about sha256", "junk manifest", "manifest a list", "manifest entry types",
    "link checkpoints -> outside in the local dir", "link status.json -> outside",
    "streamed checkpoints with a hostile latest.json", "job id ../x", "job id a/b", "job id ..",
    "job id ''", "job id of 200 characters", "owner key hostile",
]
# Completion (F35): a job whose command is a multi-line script, and one with escapes
COMPLETION_JOBS = {
    "multi-line run": "run: |\n  echo one\n  plain\n  $(touch {M}-completion)\n  x\n",
    "escapes in run": 'run: "printf \\e]0;owned\\a\\e[2J; echo x"\n',
}
COMPLETION_SHELLS = ["zsh", "bash", "fish"]

# rm and prune (11)
RM_PRUNE_CASES = [
    "rm a running job", "rm a job whose dir links to outside folders",
    "rm a job whose dir is a symlink", "rm a job whose dir holds a hardlink to outside",
    "rm ../../x", "rm %", "prune --older-than 0s", "prune --older-than nan",
    "prune --older-than -1d", "prune --older-than 1e400d",
    "prune a symlinked job dir", "rm a job whose dir holds a FIFO and a loop of links",
]

# sync: credential files in a home directory. CREDENTIALS_F6: the kinds the 2026-11-23 audit
# listed (held back since); CREDENTIALS_F27: the 24 the 2026-11-27 audit found sent.
CREDENTIALS_F6 = [
    ".aws/credentials", ".aws/config", ".ssh/id_ed25519", ".ssh/id_rsa", ".netrc",
    ".git-credentials", "project/.env", "project/.env.local", "certs/server.pem",
    ".gnupg/private-keys-v1.d/key", ".pypirc", ".docker/config.json",
]
CREDENTIALS_F27 = [
    ".config/gcloud/application_default_credentials.json", ".config/gcloud/credentials.db",
    ".huggingface/token", ".cache/huggingface/token", ".cache/huggingface/stored_tokens",
    ".kaggle/kaggle.json", ".config/wandb/settings", ".config/gh/hosts.yml", ".npmrc",
    ".azure/accessTokens.json", ".terraform.d/credentials.tfrc.json", ".envrc", ".boto",
    ".s3cfg", ".config/rclone/rclone.conf", ".vault-token", "tls/client.key",
    "certs/client.p12", "certs/site.pfx", "service-account.json", ".bash_history",
    ".zsh_history", ".python_history", ".local/share/fish/fish_history",
]
SYNC_CASES = [
    "home as --workdir", "home as --workdir, dry run", "a job file with workdir ../..",
    "a job file with include .aws/.ssh", "a project below home as --workdir",
    "a .gitignore that re-includes .aws", "credentials in a project subfolder",
    "a link to .aws inside the workdir", "a newline file name (F3)",
    "file names that look like rsync options", "home through a symlinked workdir",
    "CLOUDTRAIN_HOME inside the workdir", "a job file in the home, workdir .",
    "--include typed (sent with a warning, by design)",
    "a workdir holding a FIFO, a socket and a link to /dev/zero",
]
SECRETS_CASES = ["--secret KEY=VALUE", "--secret KEY from the environment",
                 "job file secrets: {KEY: null}", "job file secret written inline"]
