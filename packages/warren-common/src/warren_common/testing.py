"""Helpers for tests and benchmarks: a free loopback port, waiting for a condition, and what
a node's gVisor sandboxes cost in memory.

Kept in the package (not in a test directory) so every package's suite, the repository's
tiers and the benchmarks wait and pick ports the same way.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
# gVisor's processes for one pod: the sentry and the gofer (runsc's re-executions of itself)
# and the containerd shim that drives them.
GVISOR_PROCESSES = ("runsc", "containerd-shim-runsc-v1")


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


def gvisor_pss_kib(proc: Path = Path("/proc")) -> tuple[int, int]:
    """(processes, summed proportional set size in KiB) of this host's gVisor processes
    (GVISOR_PROCESSES, by the name they were run under): shared pages count once across
    them, so the sum is what they cost the host. Reading another user's needs root."""
    count = total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
            if not Path(argv0).name.startswith(GVISOR_PROCESSES):
                continue
            rollup = (entry / "smaps_rollup").read_text()
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        count += 1
        total += next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)
    return count, total
