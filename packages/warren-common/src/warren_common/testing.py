"""Helpers for tests and benchmarks: a free loopback port, and waiting for a condition.

Kept in the package (not in a test directory) so every package's suite, the repository's
tiers and the benchmarks wait and pick ports the same way.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A loopback port nothing listens on now (the OS's pick). It is free when picked, not
    necessarily when a server binds it: a server that lost that race is started again."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """Call `predicate` until it returns something true, and return that; past `timeout`
    seconds, fail with an AssertionError naming `what` was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
