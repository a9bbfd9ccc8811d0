"""Running a command in a sandbox's pod through the Kubernetes exec API.

One `ExecSession` is one exec websocket (the channel protocol v5, falling back to v4):
stdout and stderr arrive as bytes on their channels and are handed over as they come, the
exit status arrives last on the error channel. The session is synchronous (the websocket
client is); the API drives it from worker threads a poll at a time, so a cancelled request
closes the socket between two polls.

The kubernetes client's `stream()` helper is not used: it swaps the shared ApiClient's
`call_api` for the duration of a call, which would divert other threads' requests onto a
websocket.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from kubernetes.stream import ws_client
from websocket import WebSocketBadStatusException, WebSocketException

from warren_control.kube import Kube

STDOUT = "stdout"
STDERR = "stderr"
_CHANNELS = {ws_client.STDOUT_CHANNEL: STDOUT, ws_client.STDERR_CHANNEL: STDERR}
_STDIN_CHUNK = 64 * 1024


class ExecError(Exception):
    """The command could not be run (or its outcome could not be learned)."""


class ExecNotFound(ExecError):  # noqa: N818 (reads as what happened)
    """The pod or its container does not exist (any more)."""


@dataclass
class ExecStatus:
    """How the command ended: `exit_code`, or `error` when it could not run at all (no such
    executable, say) or the connection was lost before it reported."""

    exit_code: int | None
    error: str | None = None


@dataclass
class ExecSession:
    kube: Kube
    namespace: str
    pod: str
    container: str
    command: Sequence[str]
    stdin: bool = False
    _client: Any = field(init=False, default=None)
    _error: bytes = field(init=False, default=b"")

    def open(self) -> None:
        if not self.command:
            raise ExecError("empty command")
        query: list[tuple[str, str]] = [("command", arg) for arg in self.command]
        query += [
            ("container", self.container),
            ("stdin", "true" if self.stdin else "false"),
            ("stdout", "true"),
            ("stderr", "true"),
            ("tty", "false"),
        ]
        path = f"/api/v1/namespaces/{quote(self.namespace)}/pods/{quote(self.pod)}/exec"
        _, url, headers, _, _ = self.kube.api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={},
            auth_settings=["BearerToken"],
        )
        lowered = {name.lower(): value for name, value in headers.items()}
        try:
            self._client = ws_client.WSClient(  # type: ignore[no-untyped-call]
                self.kube.configuration,
                ws_client.get_websocket_url(url),  # type: ignore[no-untyped-call]
                lowered,
                capture_all=False,
                binary=True,
            )
        except WebSocketBadStatusException as exc:
            if exc.status_code == 404:  # noqa: PLR2004
                raise ExecNotFound("the pod is gone") from exc
            raise ExecError(f"the cluster refused the exec (HTTP {exc.status_code})") from exc
        except (OSError, WebSocketException) as exc:
            raise ExecError(f"cannot reach the cluster's exec API: {exc}") from exc

    @property
    def v5(self) -> bool:
        return bool(self._client is not None and self._client.subprotocol == ws_client.V5_CHANNEL_PROTOCOL)

    def poll(self, wait_s: float) -> tuple[list[tuple[str, bytes]], bool]:
        """Output that arrived within `wait_s` (stdout/stderr chunks, in order per stream)
        and whether the command has finished."""
        client = self._client
        if client is None:
            raise ExecError("the session is not open")
        try:
            if client.is_open():
                client.update(timeout=wait_s)
        except (OSError, WebSocketException) as exc:
            client._connected = False  # the client has no public way to say so
            self._error = self._error or json.dumps({"status": "Failure", "message": str(exc)}).encode()
        chunks: list[tuple[str, bytes]] = []
        channels: dict[int, bytes] = client._channels  # read what arrived, without waiting
        for channel, name in _CHANNELS.items():
            data = channels.pop(channel, b"")
            if data:
                chunks.append((name, bytes(data)))
        error = channels.pop(ws_client.ERROR_CHANNEL, b"")
        if error:
            self._error += bytes(error)
        return chunks, not client.is_open()

    def write(self, data: bytes) -> None:
        client = self._client
        if client is None:
            raise ExecError("the session is not open")
        try:
            for start in range(0, len(data), _STDIN_CHUNK):
                client.write_stdin(data[start : start + _STDIN_CHUNK])
        except (OSError, WebSocketException) as exc:
            raise ExecError(f"writing to the command's stdin failed: {exc}") from exc

    def close_stdin(self) -> None:
        if self._client is not None and self.v5:
            try:
                self._client.close_channel(ws_client.STDIN_CHANNEL)
            except (OSError, WebSocketException) as exc:
                raise ExecError(f"closing the command's stdin failed: {exc}") from exc

    def status(self) -> ExecStatus:
        """The outcome, once `poll` said the command finished."""
        return parse_status(self._error)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(OSError, WebSocketException):
                client.close()


def parse_status(raw: bytes) -> ExecStatus:
    """The error channel's Status object: Success, NonZeroExitCode with the code as a cause,
    or another failure whose message says why the command did not run."""
    if not raw:
        return ExecStatus(None, "the connection ended before the command reported an exit status")
    try:
        status = json.loads(raw)
    except ValueError:
        return ExecStatus(None, raw.decode("utf-8", "replace")[:2000])
    if not isinstance(status, dict):
        return ExecStatus(None, "unreadable exit status")
    if status.get("status") == "Success":
        return ExecStatus(0)
    causes = (status.get("details") or {}).get("causes") or []
    for cause in causes:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            try:
                return ExecStatus(int(cause.get("message", "")))
            except ValueError:
                break
    return ExecStatus(None, str(status.get("message") or "the command could not be run")[:2000])


@dataclass
class Completed:
    stdout: bytes
    stderr: bytes
    status: ExecStatus


class OutputTooLarge(ExecError):  # noqa: N818
    pass


def run(
    kube: Kube,
    namespace: str,
    pod: str,
    container: str,
    command: Sequence[str],
    *,
    stdin: bytes | None = None,
    timeout_s: float,
    max_output: int,
) -> Completed:
    """Run a command to completion, collecting at most `max_output` bytes of stdout."""
    session = ExecSession(kube, namespace, pod, container, command, stdin=stdin is not None)
    session.open()
    try:
        if stdin is not None:
            session.write(stdin)
            session.close_stdin()
        stdout, stderr = bytearray(), bytearray()
        deadline = time.monotonic() + timeout_s
        while True:
            chunks, done = session.poll(min(1.0, max(0.0, deadline - time.monotonic())))
            for name, data in chunks:
                (stdout if name == STDOUT else stderr).extend(data)
            if len(stdout) > max_output:
                raise OutputTooLarge(f"more than {max_output} bytes")
            if done:
                return Completed(bytes(stdout), bytes(stderr[:65536]), session.status())
            if time.monotonic() >= deadline:
                raise ExecError(f"the command did not finish within {timeout_s:.0f} s")
    finally:
        session.close()
