"""Reading a file that a job, an instance or a bucket may have planted.

Standard library only, Python 3.8+: shipped to the host beside agent.py (which imports it
either way: as part of the package, or from its own folder), and used by the CLI for the same
files once they are home.

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
"""

import errno
import os
import stat


class NotRegular(OSError):
    """What is at the path is not a regular file (a FIFO, a symlink, a device, a folder)."""

    def __init__(self, path, what):
        super().__init__(errno.EINVAL, "not a regular file (%s)" % what, path)
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
