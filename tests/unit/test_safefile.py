"""cloudtrain/host/safefile.py's writing half, shared by the agent, the checkpoint stream, the
stager and the shard reader (issue 26: one copy of the atomic write, the directory fsync and
the folder made without following links, where there were two of each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from cloudtrain.host import safefile


# -- read_json -----------------------------------------------------------------------------------


def test_read_json_gives_an_object_or_the_default(tmp_path):
    path = tmp_path / "status.json"
    path.write_text('{"state": "running"}')
    assert safefile.read_json(str(path), 100) == {"state": "running"}
    assert safefile.read_json(str(path), 10) is None  # over the bound
    assert safefile.read_json(str(path), 10, {}) == {}
    for data in (b"[1, 2]", b"not json", b"[" * 100_000, b'{"a": "\xff"}'):
        path.write_bytes(data)
        assert safefile.read_json(str(path), 1 << 20, "default") == "default", data[:10]
    assert safefile.read_json(str(tmp_path / "gone"), 100) is None
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "link.json")
    (tmp_path / "elsewhere.json").write_text('{"planted": true}')
    assert safefile.read_json(str(tmp_path / "link.json"), 100) is None  # never followed


def test_read_json_does_not_wait_on_a_fifo_planted_in_its_place(tmp_path):
    """The checkpoint stream read restore-status.json (the job's folder) with open(): a FIFO
    there held its thread for ever."""
    os.mkfifo(tmp_path / "restore-status.json")
    code = ("import sys; from cloudtrain.host import safefile; "
            "print(safefile.read_json(sys.argv[1], 100))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "restore-status.json")],
                          timeout=20, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "None\n"), done.stderr


# -- write_atomic / write_json ----------------------------------------------------------------


def test_write_json_replaces_the_file_whole(tmp_path):
    path = tmp_path / "job" / "status.json"
    path.parent.mkdir()
    path.write_text('{"state": "old"}')
    safefile.write_json(str(path), {"state": "running", "pid": 7})
    assert path.read_text() == '{"state": "running", "pid": 7}'  # json.dump's own bytes
    assert os.listdir(path.parent) == ["status.json"]  # no temporary file left beside it
    safefile.write_atomic(str(path), b'{\n "a": 1\n}\n', sync=False)
    assert path.read_bytes() == b'{\n "a": 1\n}\n'


def test_a_reader_sees_the_old_file_or_the_new_one_never_half(tmp_path):
    path = str(tmp_path / "status.json")
    big, small = {"rows": list(range(100_000))}, {"rows": []}
    safefile.write_json(path, small)
    stop, seen = threading.Event(), []

    def read():
        while not stop.is_set():
            with open(path) as f:
                seen.append(len(json.load(f)["rows"]))  # a half-written file would not parse

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(30):
            safefile.write_json(path, big, sync=False)
            safefile.write_json(path, small, sync=False)
    finally:
        stop.set()
        reader.join()
    assert seen and set(seen) <= {0, 100_000}


def test_a_failed_write_leaves_no_temporary_file_and_raises(tmp_path):
    path = tmp_path / "job" / "status.json"
    path.mkdir(parents=True)  # a folder where the file goes: the rename fails
    with pytest.raises(OSError):
        safefile.write_json(str(path), {"state": "running"})
    assert os.listdir(path.parent) == ["status.json"] and path.is_dir()


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path):
    """The job owns the folder: a link where the temporary file goes must not make the
    writer write into the link's target (outside the job's folder)."""
    victim = tmp_path / "agent.py"
    victim.write_text("the agent's code\n")
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    path = jobdir / "status.json"
    os.symlink(victim, f"{path}.{os.getpid()}.tmp")
    with pytest.raises(OSError):
        safefile.write_json(str(path), {"state": "running"})
    assert victim.read_text() == "the agent's code\n" and not path.exists()


# -- fsync_dir -----------------------------------------------------------------------------------


def test_fsync_dir_syncs_a_folder_and_passes_over_what_is_none(tmp_path):
    safefile.fsync_dir(str(tmp_path))  # a folder: synced, no error
    safefile.fsync_dir(str(tmp_path / "gone"))  # nothing there: nothing to do
    (tmp_path / "file").write_text("x")
    safefile.fsync_dir(str(tmp_path / "file"))


def test_fsync_dir_does_not_wait_on_a_fifo_left_where_a_folder_was(tmp_path):
    fifo = tmp_path / "checkpoints"
    os.mkfifo(fifo)
    code = "import sys; from cloudtrain.host import safefile; safefile.fsync_dir(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], timeout=20,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- make_folders --------------------------------------------------------------------------------


def test_make_folders_makes_what_is_missing_and_says_which(tmp_path):
    (tmp_path / "a").mkdir()
    made = []
    path = safefile.make_folders(str(tmp_path), ["a", "b", "c"], made)
    assert path == str(tmp_path / "a" / "b" / "c") and os.path.isdir(path)
    assert made == [str(tmp_path / "a" / "b"), str(tmp_path / "a" / "b" / "c")]
    assert safefile.make_folders(str(tmp_path), ["a", "b"]) == str(tmp_path / "a" / "b")
    assert safefile.make_folders(str(tmp_path), []) == str(tmp_path)


def test_make_folders_refuses_a_link_on_the_way(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "dest"
    root.mkdir()
    os.symlink(outside, root / "train")
    with pytest.raises(safefile.NotFolder) as caught:
        safefile.make_folders(str(root), ["train", "cats"])
    assert caught.value.what == "a symbolic link"
    assert caught.value.filename == str(root / "train")
    assert os.listdir(outside) == []  # nothing made through the link


def test_make_folders_refuses_a_file_on_the_way(tmp_path):
    (tmp_path / "train").write_text("not a folder")
    with pytest.raises(safefile.NotFolder) as caught:
        safefile.make_folders(str(tmp_path), ["train", "cats"])
    assert caught.value.what == "a file" and caught.value.filename == str(tmp_path / "train")


def test_make_folders_checks_a_folder_it_made_itself(tmp_path, monkeypatch):
    """A folder swapped for a link right after our mkdir (another process in the same dest)
    is refused too: the stager's copy checked there, the shard reader's did not."""
    outside, dest = tmp_path / "outside", tmp_path / "dest"
    outside.mkdir()
    dest.mkdir()
    real_mkdir = os.mkdir

    def mkdir_then_swapped(path, mode=0o777):
        real_mkdir(path, mode)
        os.rmdir(path)
        os.symlink(outside, path)

    monkeypatch.setattr(safefile.os, "mkdir", mkdir_then_swapped)  # os.mkdir, for this test
    made = []
    with pytest.raises(safefile.NotFolder) as caught:
        safefile.make_folders(str(dest), ["train", "cats"], made)
    assert caught.value.what == "a symbolic link"
    assert made == [str(dest / "train")]  # made by us: the caller takes it back
    assert os.listdir(outside) == []
