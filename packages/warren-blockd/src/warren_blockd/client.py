"""A client of the daemon's unix-socket API (used by the CLI, the CSI plugin and tests)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any

DEFAULT_SOCKET = "/run/warren-blockd/api.sock"
HANDOFF_RETRY = 60.0  # seconds a request answered `handed_over` is retried (the new daemon binds the socket)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status, self.code = status, code


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


class Client:
    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 600) -> None:
        self.socket_path, self.timeout = socket_path, timeout

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        deadline = time.monotonic() + HANDOFF_RETRY
        while True:
            try:
                return self._request(method, path, body)
            except ApiError as exc:
                # The daemon that answered handed its workspaces to a new one, which listens
                # on this socket a moment later: the request was not run, so it is retried.
                if exc.code != "handed_over" or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, payload, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if response.headers.get("Content-Type", "").startswith("text/plain"):
            return data.decode()
        doc = json.loads(data)
        if response.status >= 400:  # noqa: PLR2004
            raise ApiError(response.status, doc.get("error", "error"), doc.get("message", ""))
        return doc

    def create(
        self,
        workspace_id: str,
        size_bytes: int | None = None,
        *,
        template: str | None = None,
        image: str | None = None,
    ) -> Any:
        return self.request(
            "POST",
            "/v1/workspaces",
            {"id": workspace_id, "size_bytes": size_bytes, "template": template, "image": image},
        )

    def action(self, workspace_id: str, action: str, **body: Any) -> Any:
        return self.request("POST", f"/v1/workspaces/{workspace_id}/{action}", body)

    def stats(self) -> Any:
        return self.request("GET", "/v1/stats")

    def metrics(self) -> str:
        text: str = self.request("GET", "/metrics")
        return text
