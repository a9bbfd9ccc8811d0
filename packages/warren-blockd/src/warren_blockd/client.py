"""A client of the daemon's unix-socket API (used by the CLI, the CSI plugin and tests)."""

from __future__ import annotations

from typing import Any

from warren_common import client
from warren_common.client import ApiError

__all__ = ["DEFAULT_SOCKET", "HANDOFF_RETRY", "ApiError", "Client"]

DEFAULT_SOCKET = "/run/warren-blockd/api.sock"
HANDOFF_RETRY = 60.0  # seconds a request answered `handed_over` is retried (the new daemon binds the socket)


class Client(client.Client):
    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 600) -> None:
        # A daemon that answers `handed_over` gave its workspaces to a new one, which listens
        # on this socket a moment later: the request was not run, so it is tried again.
        super().__init__(socket_path, timeout, retry_codes={"handed_over"}, retry_for=HANDOFF_RETRY)

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
