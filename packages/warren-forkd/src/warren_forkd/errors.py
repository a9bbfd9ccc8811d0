"""Errors forkd reports to its callers."""

from __future__ import annotations


class ForkdError(Exception):
    """Base class of forkd's errors."""


class GenerationMismatchError(ForkdError):
    """A snapshot was asked to restore over a disk other than the one it was taken over."""

    def __init__(self, snapshot: str, recorded: str, found: str) -> None:
        super().__init__(
            f"snapshot {snapshot} was taken over disk generation {recorded}, "
            f"but the disk offered has generation {found}: refusing to restore (the guest's "
            "cached filesystem state would not match the disk)"
        )
        self.snapshot = snapshot
        self.recorded = recorded
        self.found = found


class AgentError(ForkdError):
    """The guest agent did not answer, or answered out of protocol."""


class QemuError(ForkdError):
    """QEMU exited, or a QMP command or migration failed."""


class RequestError(ForkdError):
    """A request the daemon refuses. `code` is stable for API clients; `fix` says what to do."""

    def __init__(self, code: str, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.fix = fix
