"""The control plane's processes: each logs to a file, leads a session of its own and dies
with its parent; they are stopped newest first."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
PORT_TAKEN = "address already in use"


class PortTakenError(RuntimeError):
    """A server exited because another process bound its port first: a free port is free
    when it is picked, not necessarily when the server binds it (other work shares the
    machine)."""


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def exited(self) -> RuntimeError:
        """The error for a process found dead: PortTakenError when it lost its port."""
        message = f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}"
        return PortTakenError(message) if PORT_TAKEN in message else RuntimeError(message)


def spawn(name: str, argv: Sequence[str], log: Path) -> Process:
    with log.open("wb") as out:
        # A session of its own: a ^C meant for pytest reaches the harness, which then stops
        # these in order rather than every process at once. If the harness dies without
        # stopping them (SIGKILL), the kernel kills them too.
        popen = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  # only an async-signal-safe prctl
        )
    return Process(name, popen, log)


def stop_all(processes: Sequence[Process], grace: float = 15) -> None:
    """Newest first, one at a time: SIGTERM, then SIGKILL after `grace` seconds. One at a time
    because the API server shuts down in a second while etcd still answers, and hangs until
    killed when etcd went first."""
    for process in reversed(processes):
        if process.alive():
            process.popen.send_signal(signal.SIGTERM)
        try:
            process.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait(timeout=10)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
