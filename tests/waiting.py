"""Waiting in tests for something another process does (a replica up, a worker gone), bounded in time."""

from __future__ import annotations

import time


def wait_until(predicate, timeout_s: float = 30.0, what: str = "condition"):
    """The first truthy value of `predicate()`, polled every 50 ms; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
