"""JSON from bytes a crashing process chose (spool records, package notes, OCI bundle prefixes): bounded in size
and nesting, and one error type for everything a parser of hostile bytes can raise.

json.loads of 2000 `[` raises RecursionError, not ValueError, and a document nested a few hundred deep that
parses still makes every later json.dumps of it (the index row, the analysis, a user's view) raise. So the
nesting is measured before parsing, on the brackets outside strings, and refused past MAX_DEPTH.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

# Deeper than any record csplice writes (3) or any package note the spec shows (2), far below the
# interpreter's recursion limit at any depth of the daemon's stack.
MAX_DEPTH = 32
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]")
_STEP = str.maketrans({"[": "\x01", "{": "\x01", "]": "\x02", "}": "\x02"})


class BoundedJSONError(ValueError):
    """The text is not JSON, or is JSON past the size or nesting bounds."""


def depth(text: str) -> int:
    """The deepest nesting of arrays and objects in text (brackets inside strings do not count); a linear
    scan done by the regex engine."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text)).translate(_STEP)
    if not brackets:
        return 0
    return max(accumulate(1 if c == "\x01" else -1 for c in brackets))


def _checked(text: str, max_bytes: int | None, max_depth: int) -> None:
    if max_bytes is not None and len(text) > max_bytes:
        raise BoundedJSONError(f"JSON of {len(text)} characters, more than {max_bytes}")
    d = depth(text)
    if d > max_depth:
        raise BoundedJSONError(f"JSON nested {d} deep, more than {max_depth}")


def loads(data: bytes | str, *, max_bytes: int | None = None, max_depth: int = MAX_DEPTH) -> Any:
    """The value of a JSON document (bytes: UTF-8); BoundedJSONError for anything else."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        _checked(text, max_bytes, max_depth)
        return json.loads(text)
    except BoundedJSONError:
        raise
    except (ValueError, RecursionError, MemoryError, TypeError) as e:
        raise BoundedJSONError(f"not JSON: {e}") from None


def raw_decode(text: str, start: int, *, max_bytes: int | None = None, max_depth: int = MAX_DEPTH) -> Any:
    """The first JSON value in text at start (what follows it is ignored), bounded like loads."""
    try:
        _checked(text[start:], max_bytes, max_depth)
        return json.JSONDecoder().raw_decode(text, start)[0]
    except BoundedJSONError:
        raise
    except (ValueError, RecursionError, MemoryError, TypeError) as e:
        raise BoundedJSONError(f"not JSON: {e}") from None
