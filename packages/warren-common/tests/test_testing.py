"""The test helpers: a port that can be bound, a wait that returns or names what it awaited, and
the memory of gVisor's processes."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest
from warren_common.testing import free_port, gvisor_pss_kib, wait_for


def test_a_free_port_can_be_bound_on_loopback() -> None:
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        assert server.getsockname()[1] == port


def test_wait_for_returns_the_first_true_value() -> None:
    counter = itertools.count()
    assert wait_for(lambda: next(counter) >= 3 and "done", 5, "the third call", interval=0) == "done"


def test_wait_for_names_what_it_waited_for_when_it_gives_up() -> None:
    with pytest.raises(AssertionError, match="waiting for the impossible"):
        wait_for(lambda: False, 0.05, "the impossible", interval=0.01)


def test_gvisor_memory_sums_the_sandboxes_processes_only(tmp_path: Path) -> None:
    def process(pid: int, argv: list[str], pss_kib: int | None) -> None:
        entry = tmp_path / str(pid)
        entry.mkdir()
        (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        if pss_kib is not None:  # a kernel thread or a process gone meanwhile has none
            (entry / "smaps_rollup").write_text(f"Rss: {pss_kib * 2} kB\nPss: {pss_kib} kB\n")

    process(10, ["runsc-sandbox", "boot"], 30_000)
    process(11, ["/usr/local/bin/runsc", "gofer"], 5_000)
    process(12, ["/opt/bin/containerd-shim-runsc-v1", "-namespace", "k8s.io"], 3_000)
    process(13, ["/usr/bin/containerd"], 90_000)  # the runtime itself is not a sandbox's
    process(14, ["runsc"], None)
    (tmp_path / "self").mkdir()
    assert gvisor_pss_kib(tmp_path) == (3, 38_000)
