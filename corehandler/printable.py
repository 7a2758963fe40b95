"""Process-chosen text (comm, exe, cmdline, hostname) made safe for a terminal and a one-line log.

The crashing process picks its names: they may hold bytes that are not UTF-8 (Python carries them as lone
surrogates, the spool record's convention), newlines, terminal escapes or bidi overrides. Shown, they are
escaped the way Python writes a string literal: `\\xff` for an invalid byte, `\\n`, `\\x1b`, `\\u202e`, and a
backslash as `\\\\`, so two different names never print alike. Searching uses the real bytes (match.py).
"""

from __future__ import annotations

import unicodedata

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}
# Control and format characters, surrogates, and the line and paragraph separators.
_UNSAFE = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def display(s: object) -> str | None:
    """s escaped; None stays None, and anything not a string is shown as its str() (a sidecar's field may hold
    any JSON value)."""
    if s is None:
        return None
    if not isinstance(s, str):
        s = str(s)
    if s.isprintable() and "\\" not in s:
        return s
    return "".join(_char(c) for c in s)


def _char(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:  # surrogateescape's form of the invalid byte o - 0xDC00
        return f"\\x{o - 0xDC00:02x}"
    if unicodedata.category(c) in _UNSAFE:
        # \xNN is kept for invalid bytes: U+0085 (valid UTF-8 C2 85) is \u0085, the lone byte 85 is \x85.
        return f"\\x{o:02x}" if o < 0x80 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"
    return c
