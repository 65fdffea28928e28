"""The corpus of the sets benchmarks/audit_figures.py runs for the new surfaces of the audit of
2026-12-01 (/work/shared/findings/audit-2026-12-01.md): job files that take values from the
launching shell (jobfile2), hostile checkpoints (ckpt), hostile image trees (images), forged
job store records (forged records) and hostile regroup records (regroup members), as data.
The builders are in audit_surfaces_1201.py, the programs that run them in audit_drivers_1201.py.

Placeholders as in audit_cases.py: {M} a marker file's path prefix (a file {M}-... appearing
means injected code ran), {dir} the case's scratch directory (its HOME).
"""

from __future__ import annotations

import base64

# == jobfile2 (F39, and F33's YAML again) =======================================================

# The launching shell's values: distinctive, so that any copy of one is found wherever it lands.
MARKERS = {
    "AWS_ACCESS_KEY_ID": "AKIAVICTIM1201000000",
    "AWS_SECRET_ACCESS_KEY": "VICTIMENVSECRET1201",
    "AWS_SESSION_TOKEN": "VICTIMSESSION1201",
    "GITHUB_TOKEN": "ghp_VICTIM1201",
    "HF_TOKEN": "hf_VICTIM1201",
    "WANDB_API_KEY": "VICTIMWANDB1201",
    "AZURE_CLIENT_SECRET": "VICTIMAZURE1201",
    "GOOGLE_APPLICATION_CREDENTIALS": "/victim/gcp-VICTIM1201.json",
}

ECHO_ALL = 'run: echo "got $AWS_SECRET_ACCESS_KEY|$AWS_SESSION_TOKEN|$GITHUB_TOKEN"\n'
F39_FILE = ("name: envsteal\n" + ECHO_ALL + "secrets:\n  AWS_SECRET_ACCESS_KEY: null\n"
            "  AWS_SESSION_TOKEN: ~\n  GITHUB_TOKEN: ~\n")

# Job files that take values from this shell: label -> (text, the modes it is launched in).
# Modes (audit_surfaces_1201.SECRET_MODES): "dry run", "aws dry run", "no terminal",
# "no terminal, -y", "terminal, Enter", "terminal, -y, Enter", "terminal, answered y".
# A label ending "(by design)" is a value the user sent: found where it went, not counted.
ALL_MODES = ["dry run", "aws dry run", "no terminal", "no terminal, -y", "terminal, Enter",
             "terminal, -y, Enter"]
SECRET_FILES: dict[str, tuple[str, list[str]]] = {
    "the audit's F39 file: secrets AWS secret key, session token, GitHub token":
        (F39_FILE, ALL_MODES),
    "envs: {AWS_SECRET_ACCESS_KEY: null}":
        ("envs: {AWS_SECRET_ACCESS_KEY: null}\nrun: echo \"got $AWS_SECRET_ACCESS_KEY\"\n",
         ["dry run", "no terminal", "terminal, -y, Enter"]),
    "secrets: {GITHUB_TOKEN: null} (not a cloud's: asked)":
        ("secrets: {GITHUB_TOKEN: null}\nrun: echo \"got $GITHUB_TOKEN\"\n",
         ALL_MODES + ["terminal, answered y"]),
    "envs HF_TOKEN and WANDB_API_KEY read by setup:":
        ("envs: {HF_TOKEN: ~, WANDB_API_KEY: ~}\nsetup: echo \"setup $HF_TOKEN $WANDB_API_KEY\"\n"
         "run: echo ok\n", ["no terminal, -y", "terminal, Enter"]),
    "secrets AZURE_CLIENT_SECRET and GOOGLE_APPLICATION_CREDENTIALS":
        ("secrets: {AZURE_CLIENT_SECRET: null, GOOGLE_APPLICATION_CREDENTIALS: null}\n"
         "run: cat \"$GOOGLE_APPLICATION_CREDENTIALS\"; echo \"$AZURE_CLIENT_SECRET\"\n",
         ["no terminal, -y"]),
    "secrets through a merge key (<<: {AWS_SECRET_ACCESS_KEY: null})":
        ("secrets:\n  <<: {AWS_SECRET_ACCESS_KEY: null}\n" + ECHO_ALL, ["no terminal, -y"]),
    "a secret named through an alias (&k AWS_SESSION_TOKEN)":
        ("name: &k AWS_SESSION_TOKEN\nsecrets: {*k : null}\n" + ECHO_ALL, ["no terminal, -y"]),
    "envs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, flow style":
        ("envs: {AWS_ACCESS_KEY_ID: ~, AWS_SECRET_ACCESS_KEY: ~}\n"
         "run: echo \"$AWS_ACCESS_KEY_ID $AWS_SECRET_ACCESS_KEY\"\n", ["no terminal, -y"]),
    "secrets: {aws_secret_access_key: null} (lower case)":
        ("secrets: {aws_secret_access_key: null}\nrun: echo \"$aws_secret_access_key\"\n",
         ["no terminal, -y"]),
    "secrets and envs naming the same variable":
        ("envs: {GITHUB_TOKEN: ~}\nsecrets: {GITHUB_TOKEN: ~}\nrun: echo \"$GITHUB_TOKEN\"\n",
         ["no terminal, -y"]),
    # On this machine a job is a process of this shell's user: what its environment holds is
    # what any program the user runs here reads. Not a value the file takes (by design).
    "run: reads them without naming them (local: the shell's own process) (by design)":
        ("name: inherit\n" + ECHO_ALL, ["no terminal, -y"]),
}

# F33's YAML again, as the audit attacked it for this set: label -> text or bytes. Each is
# `launch FILE --dry-run`, then a real local launch where the dry run passes locally.
RUN = "run: echo ok\n"


def _nested_flow_keys(depth: int) -> str:
    key = "a"
    for _ in range(depth):
        key = "{" + key + ": 1}"
    return key


YAML_ODDITIES: dict[str, str | bytes] = {
    "an alias as a key": "envs:\n  &k A: 1\n  *k : 2\n" + RUN,
    "an alias as a flow key": "envs: {&k A: 1, *k : 2}\n" + RUN,
    "an anchor alone": "name: &a\n" + RUN,
    "a merge of an alias": "x-base: &b {name: merged}\n<<: *b\n" + RUN,
    "a %TAG directive for python tags":
        "%TAG !p! tag:yaml.org,2002:python/\n---\nname: !p!object/apply:os.system "
        "['touch {M}-tagdirective']\n" + RUN,
    "!!binary of 1 MB": "name: !!binary " + base64.b64encode(bytes(1 << 20)).decode()
                        + "\n" + RUN,
    "!!binary of 700 KB (under the size limit)":
        "name: !!binary " + base64.b64encode(bytes(700_000)).decode() + "\n" + RUN,
    "!!set in envs": "envs: !!set {A, B}\n" + RUN,
    "!!omap in envs": "envs: !!omap [{A: 1}, {B: 2}]\n" + RUN,
    "a timestamp name": "name: 2026-12-01 10:00:00\n" + RUN,
    "1e999999": "resources: {disk_gb: 1e999999}\n" + RUN,
    "a 5,000-digit hex int": "resources:\n  disk_gb: 0x" + "f" * 5000 + "\n" + RUN,
    "a 20,000-digit binary int": "resources:\n  nodes: 0b" + "1" * 20000 + "\n" + RUN,
    "a sexagesimal int of 20,000 parts": "resources:\n  disk_gb: 1" + ":59" * 20000 + "\n"
                                         + RUN,
    "3,000-deep flow keys": "envs: " + _nested_flow_keys(3000) + "\n" + RUN,
    "5,000 documents": "---\nname: x\n" * 5000 + RUN,
    "BOM and CRLF": "\ufeffname: bom\r\nrun: echo ok\r\n".encode(),
    "NEL as a line break": "name: x\u0085run: echo ok\n".encode(),
}

# == ckpt (F32, F46) =============================================================================

# Each checkpoint through recipes/common/checkpoint.load (audit_drivers_1201.py ckpt-load).
# Those that would run code touch {M}-ckpt-<label's first word> when they do.
CKPT_LOAD_CASES = [
    "empty", "truncated", "cut at the end", "a list", "1 GB storage over 16 bytes",
    "deflated 1 GB storage", "10^12 elements on 4 floats", "stride-0 view of 10^14",
    "os.system reduce", "eval reduce", "a custom class", "numpy _reconstruct",
    "legacy non-zip pickle running os.system", "step 10^18 (loads: the recipe refuses it)",
    "a good checkpoint (control)",
]
# Each written over a real resnet9 checkpoint (a run stopped at step 1), then resumed by the
# recipe: `python recipes/resnet9/train.py ... --resume true` (its 2-epoch, 8-step schedule).
CKPT_RESUME_CASES = [
    "empty", "truncated", "stride-0 view of 10^14", "os.system reduce", "step 10^18",
    "epoch 99", "step -1", "a good checkpoint (control)",
]
# resnet9's smallest run (tests/unit/test_resnet9.py TINY): 4 steps per epoch, 2 epochs
RESNET9_TINY = ["--data", "synthetic", "--synthetic_train", "256", "--synthetic_test", "64",
                "--width_div", "16", "--ghost_splits", "4", "--batch_size", "64", "--epochs",
                "2", "--device", "cpu"]

# == images (F48) ================================================================================

# One small official tree (2 classes) with one hostile entry each, then all of them at once,
# twice (a rerun resumes): `cloudtrain data prepare imagenet SRC DEST`.
PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nPRIVATE-KEY-AUDIT-1201\n"
IMAGE_CASES = [
    "x.JPEG -> ~/.ssh/id_ed25519 in train", "a val image -> ~/.ssh/id_ed25519",
    "a class folder that is a link (to ~/photos)", "a class folder linking to its parent",
    "train/<wnid>.tar that is a link to the key", "a link loop named .JPEG",
    "a FIFO named .JPEG", "a link to /dev/zero named .JPEG", "a directory named .JPEG",
    "a 20000x20000 PNG named .JPEG", "a 144 Mpx PNG of about 100 KB",
    "a JPEG whose SOF claims 65500x65500", "a truncated JPEG", "an empty .JPEG",
    "random bytes named .JPEG", "a CMYK JPEG", "an RGBA PNG named .jpg", "a 16-bit PNG",
    "a palette PNG", "a 1x30000 image",
]
IMAGE_ALL = "all of them in one tree"
IMAGE_RERUN = "all of them in one tree, run again"

# == forged records (F41) ========================================================================

# A recovering group job in in-process moto (its group, attempt 1 on the group's instance); a
# stranger: an untagged t3.micro `prod-database`, another job's instance, an instance with the
# job's tag outside its group. Each case puts what the job's grant lets anyone put, then
# autoscaled.learn (what status runs) twice and provider.release (what down runs).
FORGED_CASES = [
    "attempts/2.json names an untagged instance (prod-database)",
    "attempts/2.json names another job's instance",
    "attempts/2.json names an instance with the job's tag outside its group",
    "attempts/2.json and 3.json name prod-database and another job's instance",
    "attempts/2.json names no instance EC2 has",
    "attempts/2.json names an instance of another region",
    "attempts/2.json names the job's own first instance again",
    "attempts/2.json garbage bytes",
    "attempts/2.json a record of 1 MB",
    "attempts/2.json holding attempt 3",
    "final.json (succeeded) naming attempt 7, which the job does not have",
    "final.json (succeeded) naming prod-database",
    "final.json (succeeded) naming attempt 1 while attempt 2 runs",
    "final.json (succeeded) naming nothing",
    "a true replacement by AWS (control)",
]

# == regroup members (F42, F43) ==================================================================

# A job of 3 nodes (a: rank 0, b: rank 1, c: rank 2) in its group in moto's server; node b is
# hostile and holds the job's grant. Node c meets (regroup.meet, its real reader and grant);
# a's record is as a's node writes it; b writes what the case says.
REGROUP_ADDRESSES = ["8.8.8.8", "127.0.0.1", "169.254.169.254", "0.0.0.0", "255.255.255.255",
                     "224.0.0.1", "10.200.0.66 (private, not b's)"]
REGROUP_JUNK: dict[str, object] = {
    "not JSON": b"\x00\xff{not json",
    "a JSON list": ["instance", "i-0"],
    "null": None,
    "10,000-deep nesting": b"[" * 10_000 + b"]" * 10_000,
    "a record of 1 MB": {"pad": "x" * (1 << 20)},
    "another instance's id inside": {"instance": "i-0fffffffffffffff0"},
    "rank '0' (a string)": {"rank": "0"},
    "rank true": {"rank": True},
    "rank 10^30": {"rank": 10 ** 30},
    "port 0": {"port": 0},
    "port 65536": {"port": 65536},
    "port '29500' (a string)": {"port": "29500"},
    "address as a number": {"address": 181141505},  # 10.204.0.1
    "address with a prefix length": {"address": "{address}/24"},
    "address with leading zeros": {"address": "{zeros}"},
    "iface holding a shell command": {"iface": "lo; touch {M}-iface"},
    "port NaN": b'{"instance": "{b}", "rank": 1, "address": "{address}", "port": NaN}',
}
REGROUP_CASES = [
    "three honest nodes (control)",
    "b overwrites rank 0's record with 203.0.113.66:4444",
    "b writes a phantom i-00000000000000001 ranked 0 at 198.51.100.7, none of its own",
    "b writes a phantom ranked 0 at a private address, none of its own",
    "b rewrites c's record with iface lo",
    "b writes a record for another job's group's instance",
    *[f"b's own record at {a}" for a in REGROUP_ADDRESSES],
    *[f"b's own record: {j}" for j in REGROUP_JUNK],
    "newer attempts recorded every 0.2 s while c meets (F43)",
]
