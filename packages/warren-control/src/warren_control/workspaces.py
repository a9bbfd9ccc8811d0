"""What object storage proves about a sandbox's workspace.

The node's warren-blockd publishes each batch of writes as a numbered log record, only after
its data is confirmed in storage; a `replicated` receipt names such a number. Reading the
store (not the node) tells a user what survives the loss of the node the sandbox ran on:
every write at or below that number. The storage layout belongs to warren-blockd, so the
store is read by its own `warren-blockd replicated` command: its environment is separate
(boto3's and the Kubernetes client's pins cannot share one).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

DEFAULT_RETENTION_S = 7 * 24 * 3600  # a deleted sandbox's workspace, kept to start from
NOT_IN_STORE = 3  # `warren-blockd replicated`: the workspace has nothing in the store
TOOL_TIMEOUT_S = 60.0


class WorkspaceStoreError(RuntimeError):
    """The workspace store could not be read, or (missing) holds nothing for the workspace."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class Proof:
    workspace_id: str
    replicated_sequence: int
    checked_at: datetime


class WorkspaceStore(Protocol):
    def proof(self, workspace_id: str) -> Proof: ...

    def copy(self, workspace_id: str, new_id: str) -> None:
        """The workspace's stored state under `new_id` (nothing may be writing it)."""

    def release(self, workspace_id: str) -> None:
        """Remove the workspace from storage (what a fork still stands on stays for it)."""

    def collect(self) -> dict[str, Any]:
        """Delete the chunks nothing references any more; a report of what was done."""


@dataclass(frozen=True)
class BlockdStore:
    """The bucket the nodes' warren-blockd write to: the same URL and endpoint they are given,
    credentials from the usual AWS environment variables (passed on to the tool)."""

    url: str
    endpoint: str | None = None
    tool: str = "warren-blockd"

    def _tool(self, *args: str, timeout: float = TOOL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        argv = [self.tool, *args, f"--store={self.url}"]
        if self.endpoint:
            argv.append(f"--s3-endpoint={self.endpoint}")
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WorkspaceStoreError(f"cannot reach the workspace store with {self.tool}: {exc}") from None

    @staticmethod
    def _failed(done: subprocess.CompletedProcess[str]) -> WorkspaceStoreError:
        said = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return WorkspaceStoreError(f"the workspace store did not answer: {said[0]}")

    def proof(self, workspace_id: str) -> Proof:
        done = self._tool("replicated", workspace_id)
        if done.returncode == NOT_IN_STORE:
            raise WorkspaceStoreError("the workspace has nothing in storage yet", missing=True)
        if done.returncode != 0:
            raise self._failed(done)
        return Proof(workspace_id, int(json.loads(done.stdout)["replicated_seq"]), datetime.now(UTC))

    def copy(self, workspace_id: str, new_id: str) -> None:
        done = self._tool("copy", workspace_id, new_id)
        if done.returncode == NOT_IN_STORE:
            raise WorkspaceStoreError("the workspace has nothing in storage yet", missing=True)
        if done.returncode != 0:
            raise self._failed(done)

    def release(self, workspace_id: str) -> None:
        done = self._tool("release", workspace_id)
        if done.returncode != 0:
            raise self._failed(done)

    def collect(self) -> dict[str, Any]:
        # A sweep lists every chunk and manifest: give it far longer than one read.
        done = self._tool("gc", timeout=TOOL_TIMEOUT_S * 30)
        if done.returncode != 0:
            raise self._failed(done)
        report: dict[str, Any] = json.loads(done.stdout)
        return report


def from_arguments(url: str | None, endpoint: str | None, tool: str | None) -> WorkspaceStore | None:
    """The store named on the command line or by WARREN_WORKSPACE_STORE(_ENDPOINT, _TOOL)."""
    url = url or os.environ.get("WARREN_WORKSPACE_STORE")
    if not url:
        return None
    return BlockdStore(
        url,
        endpoint or os.environ.get("WARREN_WORKSPACE_STORE_ENDPOINT"),
        tool or os.environ.get("WARREN_WORKSPACE_STORE_TOOL") or "warren-blockd",
    )
