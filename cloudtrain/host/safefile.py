"""Reading and writing files where a job, an instance or a bucket may have planted things.

Standard library only, Python 3.8+: part of the host package (the agent imports it), and used
by the CLI for the same files once they are home.

A job owns its directory and can put anything where a reader expects its metrics or status:
a FIFO (open() for reading then waits for a writer, for ever), a symlink to /dev/zero (a read
to the end never ends), a directory, a file of many GB. So a reader here opens with
O_NONBLOCK (a FIFO opens at once) and O_NOFOLLOW (a symlink is refused, not followed), checks
on the open descriptor that what it got is a regular file (fstat: whatever was swapped in
after any listing), and reads a bounded number of bytes.

    open_regular(path) -> fd            or NotRegular / FileNotFoundError / OSError
    read_regular(path, offset, end, limit) -> bytes   at most `limit`, never past the size
                                        the file had when opened
    kind(st_mode) -> str                what a file that is not regular is, in words
    read_tail(path, nbytes) -> (bytes, size)   the last `nbytes` and the size then
    read_json(path, limit, default)     the JSON object in a regular file of at most `limit`
                                        bytes, or `default`

Writing, the same way for everything on the host side (one copy of each):

    write_atomic(path, data, sync=True)  replace the file whole (a reader sees the old one or
                                        the new one), through a temporary file beside it
                                        that is never a planted link
    write_json(path, data, sync=True)   the same, of json.dumps(data)
    fsync_dir(path)                     a folder's entries to the disk (after renames in it)
    make_folders(root, parts, made) -> path   root/parts..., made one folder at a time, a
                                        link or a file on the way refused (NotFolder)
"""

import errno
import json
import os
import stat


class NotRegular(OSError):
    """What is at the path is not a regular file (a FIFO, a symlink, a device, a folder)."""

    def __init__(self, path, what):
        super().__init__(errno.EINVAL, "not a regular file (%s)" % what, path)
        self.what = what


class NotFolder(OSError):
    """What is on the way to a folder is not one (a symbolic link, a file)."""

    def __init__(self, path, what):
        super().__init__(errno.ENOTDIR, "not a folder (%s)" % what, path)
        self.what = what


def kind(mode):
    """What a st_mode is, in words, for one that is not a regular file."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def open_regular(path):
    """A read-only descriptor of the regular file at `path`. A FIFO is opened without waiting
    (and refused), a symlink is not followed (and refused), a device or folder refused:
    NotRegular. FileNotFoundError when nothing is there."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symlink
            raise NotRegular(path, "a symbolic link") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):  # a folder; a FIFO/socket with no peer
            raise NotRegular(path, "a directory" if exc.errno == errno.EISDIR
                             else "a FIFO or socket") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegular(path, kind(mode))
    return fd


def read_regular(path, offset=0, end=None, limit=None):
    """Bytes [offset, end) of the regular file at `path` (end None: to the size it had when
    opened, so a file that keeps growing is still one bounded read), at most `limit` of them
    (None: no bound but that size). Raises as open_regular does."""
    fd = open_regular(path)
    try:
        return _read(fd, offset, end, limit)
    finally:
        os.close(fd)


def read_tail(path, nbytes):
    """(the last `nbytes` bytes of the regular file at `path`, its size when opened)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        nbytes = max(nbytes, 0)
        return _read(fd, size - nbytes, size, nbytes), size
    finally:
        os.close(fd)


def read_json(path, limit, default=None):
    """The JSON object in the regular file at `path`, or `default` when it is missing, not a
    regular file (read_regular), over `limit` bytes, not UTF-8 JSON, too deep or not an
    object: the job can write anything into its directory."""
    try:
        raw = read_regular(path, limit=limit + 1)
        if len(raw) > limit:
            return default
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return default
    return data if isinstance(data, dict) else default


def _read(fd, offset, end, limit):
    size = os.fstat(fd).st_size
    offset = max(offset, 0)
    stop = size if end is None else min(end, size)
    want = max(0, stop - offset if limit is None else min(stop - offset, limit))
    chunks, got = [], 0
    while got < want:
        data = os.pread(fd, min(want - got, 1 << 20), offset + got)
        if not data:
            break
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def write_atomic(path, data, sync=True, mode=None):
    """Replace the file at `path` by one holding the bytes `data` (or each bytes an iterable
    `data` yields, for a file too large to hold at once): written to a temporary file
    beside it, then renamed over it, so a reader sees the old file or the new one, never half
    of one. sync: the bytes reach the disk before the rename (a crash leaves the old file or
    the whole new one). `mode`: its permission bits (default: 0o666 less the umask). The
    temporary file is opened without following a link (one planted there is refused, not
    written through) and removed again when anything fails."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
                     0o666 if mode is None else 0o600)
        with os.fdopen(fd, "wb") as f:
            for chunk in (data,) if isinstance(data, (bytes, bytearray)) else data:
                f.write(chunk)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path, data, sync=True):
    """write_atomic of the object `data` as JSON (json.dump's bytes: ASCII, no newline)."""
    write_atomic(path, json.dumps(data).encode("ascii"), sync)


def fsync_dir(path):
    """Make the renames and new names in the folder `path` durable. Nothing happens where
    there is no folder (a FIFO is not waited on, a link not followed) or it cannot be synced."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                     | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_folders(root, parts, made=None):
    """The folder root/parts[0]/parts[1]/..., each one made (0o755) where it is missing, one
    at a time: never os.makedirs, which follows a link already on the way out of root. What is
    on the way must be a folder, checked after our own mkdir too (another process may swap
    it); a link or anything else there raises NotFolder (`what`: "a symbolic link", "a file",
    ...; `filename`: its path). A folder made by someone else meanwhile is taken like one
    already there. Each folder this call made is appended to `made`, for a caller that takes
    them back on a later failure."""
    path = root
    for part in parts:
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            try:
                os.mkdir(path, 0o755)
                if made is not None:
                    made.append(path)
            except FileExistsError:  # made meanwhile by another thread or process
                pass
            mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            raise NotFolder(path, "a file" if stat.S_ISREG(mode) else kind(mode))
    return path
