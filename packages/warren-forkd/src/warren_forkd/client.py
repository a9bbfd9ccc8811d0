"""A client of the daemon's unix-socket API (used by the tests and operators' scripts)."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, doc: dict[str, Any]) -> None:
        super().__init__(f"{status} {doc.get('error')}: {doc.get('message')} (fix: {doc.get('fix')})")
        self.status = status
        self.code = str(doc.get("error", "error"))
        self.doc = doc


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class Client:
    def __init__(self, socket_path: str, timeout: float = 600) -> None:
        self.socket_path, self.timeout = socket_path, timeout

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
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
            raise ApiError(response.status, doc)
        return doc

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, **body: Any) -> Any:
        return self.request("POST", path, body)

    def metrics(self) -> str:
        text: str = self.request("GET", "/metrics")
        return text
