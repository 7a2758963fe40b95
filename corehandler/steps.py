"""A step of ingest or analysis that reads hostile input (a record, a core, the notes in it): whatever it
raises becomes a problem string on the dump, never a stopped ingest (docs/design.md, "Threat model").

The parsers themselves bound what they read and raise their own errors; this is the net under them, for the
exception nobody foresaw (RecursionError from a parser, MemoryError, a bug)."""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_PROBLEM_CHARS = 300


def problem(step: str, error: BaseException) -> str:
    """The problem string of a step that raised error (also logged with its traceback, for the bug report)."""
    log.warning("%s failed", step, exc_info=error)
    return f"{step} failed: {type(error).__name__}: {error}"[:MAX_PROBLEM_CHARS]


def run(step: str, problems: list[str], call: Callable[..., T], *args, fallback: T = None, **kwargs) -> T:
    """call(*args, **kwargs), or fallback with the problem appended when it raises."""
    try:
        return call(*args, **kwargs)
    except Exception as e:  # hostile input may make a parser raise anything: see the module's docstring
        problems.append(problem(step, e))
        return fallback
