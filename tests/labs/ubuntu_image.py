"""What a Volta instance's boot-time install (infra/volta-software.sh) reaches on AWS, as the lab
plays it: Ubuntu's archive (apt-get), the kernel's modules (modprobe), nvidia-smi, the image's
python3 and PyTorch's package index. Nothing of it can be reached from here, and there is no
V100; what each refuses, it refuses as the real one does:

    apt-get update              ok (LAB_APT_FAIL=update: exit 100, as with no mirror)
    apt-get install PKG...      every name must be one Ubuntu 24.04's restricted archive has
                                for the running kernel: linux-modules-nvidia-B-server-$(uname
                                -r), nvidia-headless-no-dkms-B-server, nvidia-utils-B-server
                                (B a branch it carries: 535, 570, 580), python3-venv; any
                                other: "E: Unable to locate package X", exit 100, nothing
                                installed (apt's all-or-nothing)
    modprobe nvidia             loads only where the modules for the running kernel were
                                installed, else modprobe's "FATAL: Module nvidia not found"
    nvidia-smi -L               no GPU here: NVIDIA-SMI's "couldn't communicate" failure
    python3                     this machine's Python (the one the tests run on, as 24.04's
                                3.12 is the image's): `python3 -m venv` makes a real one
    the index (index_url)       PEP 503, as a file:// URL pip reads: torch 2.14.1+cu126 and
                                torchvision 0.29.1+cu126 only (a pin of anything else fails in
                                pip as it would there). Each stand-in wheel holds a .pth that
                                puts, on the environment's path, what that wheel and its
                                dependencies bring here (links to this machine's torch,
                                torchvision and their requirements' top-level packages, no
                                more): a job that imports something torch does not bring
                                fails in the lab as it would on the instance.

`ubuntu.env()` is what a user-data needs to reach them (PATH first, the index override);
apt's record of what it installed is under LAB_APT_ROOT (default /var/lib/lab-apt: inside an
instance's overlaid /var).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import re
import sys
import zipfile
from pathlib import Path

BRANCHES = ("535", "570", "580")
WHEELS = {"torch": "2.14.1+cu126", "torchvision": "0.29.1+cu126"}

APT = r"""#!/bin/bash
# Ubuntu 24.04's apt-get, for the lab (tests/labs/ubuntu_image.py)
ROOT=${LAB_APT_ROOT:-/var/lib/lab-apt}
mkdir -p "$ROOT"
echo "apt-get $*" >>"$ROOT/calls"
KERNEL=$(uname -r)
command=
packages=()
for arg in "$@"; do
    case $arg in
        -o) skip=1; continue ;;
        -*) continue ;;
    esac
    if [ -n "${skip:-}" ]; then skip=; continue; fi
    if [ -z "$command" ]; then command=$arg; else packages+=("$arg"); fi
done
case $command in
    update)
        [ "${LAB_APT_FAIL:-}" = update ] && { echo "E: Failed to fetch the archive" >&2; exit 100; }
        exit 0 ;;
    install)
        for p in "${packages[@]}"; do
            ok=
            [ "$p" = python3-venv ] && ok=1
            for b in @@BRANCHES@@; do
                case $p in
                    "linux-modules-nvidia-$b-server-$KERNEL"|"nvidia-headless-no-dkms-$b-server"|\
                    "nvidia-utils-$b-server") ok=1 ;;
                esac
            done
            [ -n "$ok" ] || { echo "E: Unable to locate package $p" >&2; exit 100; }
        done
        printf '%s\n' "${packages[@]}" >>"$ROOT/installed"
        exit 0 ;;
esac
echo "E: Invalid operation $command" >&2
exit 100
"""

MODPROBE = r"""#!/bin/bash
# the kernel's modprobe, for the lab: nvidia loads only where its modules were installed
ROOT=${LAB_APT_ROOT:-/var/lib/lab-apt}
KERNEL=$(uname -r)
[ "$1" = nvidia ] || { echo "modprobe: FATAL: Module $1 not found" >&2; exit 1; }
if grep -qE "^linux-modules-nvidia-[0-9]+-server-$KERNEL\$" "$ROOT/installed" 2>/dev/null; then
    exit 0
fi
echo "modprobe: FATAL: Module nvidia not found in directory /lib/modules/$KERNEL" >&2
exit 1
"""

NVIDIA_SMI = """#!/bin/bash
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""


def _brought(names: list[str]) -> list[Path]:
    """The top-level files and directories of `names` and everything they require here."""
    seen: set[str] = set()
    paths: dict[str, Path] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform, or an extra's
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(re.match(r"[A-Za-z0-9_.-]+", req).group(0))
        for file in dist.files or []:
            top = file.parts[0]
            if top in ("..", "__pycache__") or top.endswith((".dist-info", ".data", ".pth")):
                continue
            paths.setdefault(top, Path(dist.locate_file(top)))
    return [p for p in paths.values() if p.exists()]


def _wheel(directory: Path, name: str, version: str, pth: str) -> Path:
    """A py3-none-any wheel of `name` that installs `pth` (one line: a directory)."""
    dist = f"{name}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    files = {f"{name}_lab.pth": pth + "\n",
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\n"
                                            f"Version: {version}\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: lab\n"
                                         "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for arcname, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{arcname},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w") as z:
        for arcname, text in files.items():
            z.writestr(arcname, text)
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


class UbuntuImage:
    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        for name, text in (("apt-get", APT.replace("@@BRANCHES@@", " ".join(BRANCHES))),
                           ("modprobe", MODPROBE), ("nvidia-smi", NVIDIA_SMI)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        (self.bin / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
        site = root / "site"
        site.mkdir()
        for path in _brought(list(WHEELS)):
            (site / path.name).symlink_to(path)
        simple = root / "simple"
        for name, version in WHEELS.items():
            project = simple / name
            project.mkdir(parents=True)
            wheel = _wheel(project, name, version, str(site))
            (project / "index.html").write_text(
                f'<!DOCTYPE html><html><body><a href="{wheel.name}">{wheel.name}</a>'
                "</body></html>\n")
        self.index_url = simple.as_uri()

    def env(self, path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            ) -> dict[str, str]:
        """What a user-data's environment needs to reach the stand-ins."""
        return {"PATH": f"{self.bin}:{path}", "CLOUDTRAIN_UD_TORCH_INDEX": self.index_url}
