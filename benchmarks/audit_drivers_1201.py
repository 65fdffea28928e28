"""The programs behind the sets of the audit of 2026-12-01's new surfaces
(audit_surfaces_1201.py), each one case in a fresh process: run through audit_drivers.py
(audit_harness.Scratch.drive) with cloudtrain on PYTHONPATH, never by hand.

    ckpt-make CASE OUT MARKER [BASE]   write a hostile checkpoint (not an input: its setup)
    ckpt-load PATH                     recipes/common/checkpoint.load of it
    images-tree CASE SRC HOME          a small official ImageNet tree with hostile entries
                                       (setup), a fake private key in HOME/.ssh
    forged CASE HOME                   a group job in in-process moto, a forged record, then
                                       autoscaled.learn twice and provider.release
    regroup CASE MARKER                3 nodes of a group in moto's server, node b hostile;
                                       node c meets with the real regroup.meet
                                       (these two: audit_drivers_aws_1201.py)

As in audit_drivers.py: a designed refusal is one line `Error: ...` and exit 1, anything
else propagates as a traceback, exit 99 with `harness: ...` is this script failing to build
its case. `FLAW <kind>: ...` on stdout is what a check found (kinds: audit_harness.FLAW_KINDS).
"""

from __future__ import annotations

import io
import os
import re
import struct
import sys
import zipfile
import zlib
from pathlib import Path

import audit_cases_1201 as corpus
from audit_drivers import harness, refused

TREE = Path(os.environ.get("PYTHONPATH", ".").split(os.pathsep)[0]).resolve()
REGION = "us-east-1"
OWNER = "AIDAAUDITAUDITAUDIT01"


def flaw(kind: str, text: str) -> None:
    print(f"FLAW {kind}: {text}", flush=True)


def _recipes_on_path() -> None:
    sys.path.insert(0, str(TREE / "recipes"))


# -- checkpoints ---------------------------------------------------------------------------------


class RunsCode:
    """Unpickled, it runs a shell command (os.system)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Evals:
    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        return (eval, (self.code,))


class Custom:
    """An object of this module: a full unpickler imports it and runs its __setstate__."""

    def __init__(self, marker: str):
        self.marker = marker

    def __setstate__(self, state):
        Path(state["marker"]).touch()
        self.__dict__.update(state)


def _rewritten(data: bytes, edit) -> bytes:
    """torch's zip checkpoint `data` with its pickle's bytes passed through edit()."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                changed = edit(body)
                if changed == body:
                    harness("the pickle edit did not apply (torch's format changed?)")
                body = changed
            zout.writestr(info.filename, body)
    return out.getvalue()


def _deflated_storage(data: bytes, out: Path) -> None:
    """`data` (a checkpoint of 4 floats) with its storage record replaced by 1 GB of zeros,
    deflated (about 1 MB on disk)."""
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            if re.search(r"/data/\d+$", info.filename):
                entry = zipfile.ZipInfo(info.filename)
                entry.compress_type = zipfile.ZIP_DEFLATED
                with zout.open(entry, "w", force_zip64=True) as f:
                    chunk = bytes(1 << 24)
                    for _ in range(64):
                        f.write(chunk)
            else:
                zout.writestr(info.filename, zin.read(info.filename))


def drive_ckpt_make(case: str, out: str, marker: str, base: str | None = None) -> None:
    import numpy as np
    import torch

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    small = io.BytesIO()
    torch.save({"w": torch.zeros(4), "step": 1}, small)
    good = Path(base).read_bytes() if base else small.getvalue()
    word = case.split()[0].strip("'")
    tag = f"{marker}-ckpt-{word.replace('.', '')}"
    saved = torch.load(io.BytesIO(good), weights_only=True) if base else {"w": torch.zeros(4),
                                                                           "step": 1}
    size, stride = b"K\x04\x85", b"K\x01\x85"  # (4,) and (1,) in the small one's pickle
    if case == "empty":
        path.write_bytes(b"")
    elif case == "truncated":
        path.write_bytes(good[:len(good) // 2])
    elif case == "cut at the end":
        path.write_bytes(good[:-30])
    elif case == "a list":
        torch.save([torch.zeros(2)], path)
    elif case == "1 GB storage over 16 bytes":
        path.write_bytes(_rewritten(small.getvalue(), lambda p: p.replace(
            b"cpuq\x06K\x04t", b"cpuq\x06J" + (1 << 28).to_bytes(4, "little") + b"t")))
    elif case == "deflated 1 GB storage":
        _deflated_storage(small.getvalue(), path)
    elif case == "10^12 elements on 4 floats":
        path.write_bytes(_rewritten(small.getvalue(), lambda p: p.replace(
            size, b"\x8a\x06" + (10 ** 12).to_bytes(6, "little") + b"\x85")))
    elif case == "stride-0 view of 10^14" and base:  # in place of the model's first weight
        model = dict(saved["model"])
        model[next(iter(model))] = torch.zeros(4).as_strided((10 ** 14,), (0,))
        torch.save({**saved, "model": model}, path)
    elif case == "stride-0 view of 10^14":
        path.write_bytes(_rewritten(small.getvalue(), lambda p: p.replace(
            size, b"\x8a\x06" + (10 ** 14).to_bytes(6, "little") + b"\x85").replace(
            stride, b"K\x00\x85")))
    elif case == "os.system reduce":
        torch.save({**saved, "evil": RunsCode(f"touch {tag}")}, path)
    elif case == "eval reduce":
        torch.save({**saved, "evil": Evals(f"__import__('os').system('touch {tag}')")}, path)
    elif case == "a custom class":
        torch.save({**saved, "evil": Custom(tag)}, path)
    elif case == "numpy _reconstruct":
        torch.save({**saved, "a": np.zeros(3)}, path)
    elif case == "legacy non-zip pickle running os.system":
        torch.save({**saved, "evil": RunsCode(f"touch {tag}")}, path,
                   _use_new_zipfile_serialization=False)
    elif case.startswith("step 10^18"):
        torch.save({**saved, "step": 10 ** 18}, path)
    elif case == "epoch 99":
        torch.save({**saved, "epoch": 99}, path)
    elif case == "step -1":
        torch.save({**saved, "step": -1}, path)
    elif case == "a good checkpoint (control)":
        path.write_bytes(good)
    else:
        harness(f"no such checkpoint case {case!r}")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def drive_ckpt_load(path: str) -> None:
    _recipes_on_path()
    from common import checkpoint

    try:
        data = checkpoint.load(path)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            refused(exc.code.splitlines()[0] if exc.code else "SystemExit")
        raise
    print(f"loaded a checkpoint of {len(data)} keys: {sorted(map(str, data))[:6]}")


# -- image trees --------------------------------------------------------------------------------


def _png(path: Path, width: int, height: int) -> None:
    """A 1-bit grayscale PNG of width x height, all black, written row by row (a few KB to a
    few hundred KB however many pixels it claims)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    row = b"\x00" + bytes((width + 7) // 8)
    comp = zlib.compressobj(9)
    data = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(
        ">IIBBBBB", width, height, 1, 0, 0, 0, 0)) + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def _jpeg(size=(40, 30), mode="RGB") -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new(mode, size, 128 if mode != "RGB" else (200, 30, 30)).save(out, "JPEG")
    return out.getvalue()


def _claims(jpeg: bytes, width: int, height: int) -> bytes:
    """The JPEG with its frame header (SOF0) claiming width x height."""
    at = jpeg.index(b"\xff\xc0")
    return jpeg[:at + 5] + struct.pack(">HH", height, width) + jpeg[at + 9:]


def hostile_entry(case: str, src: Path, home: Path, cls: Path, n: int = 0) -> None:
    """Put the case's hostile entry into the tree (`cls`: a class folder of train/)."""
    from PIL import Image

    key = home / ".ssh" / "id_ed25519"
    name = f"hostile{n}"
    if case == "x.JPEG -> ~/.ssh/id_ed25519 in train":
        (cls / f"{name}.JPEG").symlink_to(key)
    elif case == "a val image -> ~/.ssh/id_ed25519":  # labelled: only the link is wrong
        stem = f"ILSVRC2012_val_{99990 + n:08d}"
        (src / "val" / f"{stem}.JPEG").symlink_to(key)
        with open(src / "LOC_val_solution.csv", "a") as f:
            f.write(f"{stem},{cls.name} 1 1 10 10 \n")
    elif case == "a class folder that is a link (to ~/photos)":
        (src / "train" / "n99999999").symlink_to(home / "photos", target_is_directory=True)
    elif case == "a class folder linking to its parent":
        (src / "train" / "n99999998").symlink_to("..", target_is_directory=True)
    elif case == "train/<wnid>.tar that is a link to the key":
        (src / "train" / "n99999997.tar").symlink_to(key)
    elif case == "a link loop named .JPEG":
        (cls / f"{name}.JPEG").symlink_to(f"{name}.JPEG")
    elif case == "a FIFO named .JPEG":
        os.mkfifo(cls / f"{name}.JPEG")
    elif case == "a link to /dev/zero named .JPEG":
        (cls / f"{name}.JPEG").symlink_to("/dev/zero")
    elif case == "a directory named .JPEG":
        (cls / f"{name}.JPEG").mkdir()
        (cls / f"{name}.JPEG" / "inner.JPEG").write_bytes(_jpeg())
    elif case == "a 20000x20000 PNG named .JPEG":
        _png(cls / f"{name}.JPEG", 20000, 20000)
    elif case == "a 144 Mpx PNG of about 100 KB":
        _png(cls / f"{name}.JPEG", 12000, 12000)
    elif case == "a JPEG whose SOF claims 65500x65500":
        (cls / f"{name}.JPEG").write_bytes(_claims(_jpeg(), 65500, 65500))
    elif case == "a truncated JPEG":
        data = _jpeg((200, 150))
        (cls / f"{name}.JPEG").write_bytes(data[:len(data) // 2])
    elif case == "an empty .JPEG":
        (cls / f"{name}.JPEG").write_bytes(b"")
    elif case == "random bytes named .JPEG":
        (cls / f"{name}.JPEG").write_bytes(os.urandom(5000))
    elif case == "a CMYK JPEG":
        (cls / f"{name}.JPEG").write_bytes(_jpeg(mode="CMYK"))
    elif case == "an RGBA PNG named .jpg":
        Image.new("RGBA", (40, 30), (1, 2, 3, 4)).save(cls / f"{name}.jpg", "PNG")
    elif case == "a 16-bit PNG":
        Image.new("I;16", (40, 30), 40000).save(cls / f"{name}.JPEG", "PNG")
    elif case == "a palette PNG":
        Image.new("P", (40, 30), 3).save(cls / f"{name}.JPEG", "PNG")
    elif case == "a 1x30000 image":
        Image.new("RGB", (1, 30000), (9, 9, 9)).save(cls / f"{name}.JPEG", "JPEG")
    else:
        harness(f"no such image case {case!r}")


def drive_images_tree(case: str, src: str, home: str) -> None:
    _recipes_on_path()
    from PIL import Image

    from common import imagenet_files as inf

    src_path, home_path = Path(src), Path(home)
    inf.write_synthetic_official(src_path, classes=2, train_per_class=3, val_per_class=2,
                                 seed=1, min_side=24, max_side=48)
    (home_path / ".ssh").mkdir(parents=True, exist_ok=True)
    (home_path / ".ssh" / "id_ed25519").write_text(corpus.PRIVATE_KEY)
    (home_path / "photos").mkdir(exist_ok=True)
    Image.new("RGB", (40, 30), (200, 10, 10)).save(home_path / "photos" / "me.JPEG")
    cls = sorted(p for p in (src_path / "train").iterdir() if p.is_dir())[0]
    cases = corpus.IMAGE_CASES if case in (corpus.IMAGE_ALL, corpus.IMAGE_RERUN) else [case]
    for n, one in enumerate(cases):
        hostile_entry(one, src_path, home_path, cls, n)
    print(f"a tree of {len(cases)} hostile entries in {src_path}")


def main(kind: str, args: list[str]) -> None:
    import audit_drivers_aws_1201 as aws

    drivers = {"ckpt-make": drive_ckpt_make, "ckpt-load": drive_ckpt_load,
               "images-tree": drive_images_tree, "forged": aws.drive_forged,
               "regroup": aws.drive_regroup}
    if kind not in drivers:
        harness(f"no such driver {kind!r}")
    drivers[kind](*args)
