"""Polling for a condition that another process brings about, with a deadline and a message that says what."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 10.0, what: str = "condition", interval: float = 0.05):
    """Returns the predicate's first truthy value; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
