"""A client of the daemon's unix-socket API (used by the tests and operators' scripts)."""

from __future__ import annotations

from typing import Any

from warren_common import client
from warren_common.client import ApiError
from warren_common.client import UnixConnection as _UnixConnection

__all__ = ["ApiError", "Client", "_UnixConnection"]


class Client(client.Client):
    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, **body: Any) -> Any:
        return self.request("POST", path, body)

    def metrics(self) -> str:
        text: str = self.request("GET", "/metrics")
        return text
