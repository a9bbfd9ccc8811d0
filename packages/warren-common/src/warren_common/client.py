"""A client of a `warren_common.server` API on a unix socket."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Collection, Mapping
from typing import Any


class ApiError(Exception):
    """An error reply: its status, its `code` (the reply's "error") and the whole reply."""

    def __init__(self, status: int, doc: Mapping[str, Any]) -> None:
        self.status = status
        self.doc = dict(doc)
        self.code = str(self.doc.get("error", "error"))
        self.message = str(self.doc.get("message", ""))
        self.fix = str(self.doc.get("fix", ""))
        fix = f" (fix: {self.fix})" if self.fix else ""
        super().__init__(f"{status} {self.code}: {self.message}{fix}")


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    """One connection a request. Replies with an error code in `retry_codes` (the request
    was not run, e.g. the daemon is handing over to another) are tried again for up to
    `retry_for` seconds; a socket nobody listens on is an OSError at once."""

    def __init__(
        self,
        socket_path: str,
        timeout: float = 600,
        *,
        retry_codes: Collection[str] = (),
        retry_for: float = 0.0,
        retry_interval: float = 0.2,
    ) -> None:
        self.socket_path, self.timeout = socket_path, timeout
        self.retry_codes, self.retry_for, self.retry_interval = retry_codes, retry_for, retry_interval

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """The reply's JSON (a str for a text/plain reply); ApiError for an error reply."""
        deadline = time.monotonic() + self.retry_for
        while True:
            try:
                return self._request(method, path, body)
            except ApiError as exc:
                if exc.code not in self.retry_codes or time.monotonic() > deadline:
                    raise
                time.sleep(self.retry_interval)

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        conn = UnixConnection(self.socket_path, self.timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, payload, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if response.status < 400 and response.headers.get("Content-Type", "").startswith("text/plain"):  # noqa: PLR2004
            return data.decode()
        if response.status < 400:  # noqa: PLR2004
            return json.loads(data)
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):  # not one of ours (another server on the socket?)
            doc = {"error": "error", "message": data.decode(errors="replace")[:500]}
        raise ApiError(response.status, doc)
