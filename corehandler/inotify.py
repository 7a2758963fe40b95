"""A minimal inotify watch through ctypes (no extra dependency): the daemon's wake-up on spool commits."""

from __future__ import annotations

import ctypes
import os
import struct

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name

_libc = ctypes.CDLL(None, use_errno=True)


class Watch:
    """Watches one directory; fileno() for select(), read() for the (mask, name) events pending."""

    # csplice commits a record by linkat() of an O_TMPFILE (IN_CREATE) or, where the filesystem has no
    # O_TMPFILE, by rename() (IN_MOVED_TO).
    def __init__(self, path: os.PathLike | str, mask: int = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE):
        self.fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        if _libc.inotify_add_watch(self.fd, os.fsencode(path), mask) < 0:
            e = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(e, f"inotify_add_watch {path}: {os.strerror(e)}", str(path))

    def fileno(self) -> int:
        return self.fd

    def read(self) -> list[tuple[int, str]]:
        events = []
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return events
            pos = 0
            while pos + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, pos)
                pos += _EVENT.size
                name = data[pos:pos + length].rstrip(b"\0")
                pos += length
                events.append((mask, os.fsdecode(name)))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
