"""JSON requests to a throw-away API server over a client certificate: the standard library
only, so the builder needs no Kubernetes client (and the callers keep their own)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from http import HTTPStatus
from pathlib import Path
from typing import Any

Obj = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:2000]}")
        self.status = status


class Client:
    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        self.server = server
        self._context = ssl.create_default_context(cafile=str(ca))
        self._context.load_cert_chain(cert, key)

    def request(
        self, method: str, path: str, body: Obj | None = None, query: dict[str, str] | None = None
    ) -> Obj:
        url = self.server + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        request = urllib.request.Request(  # noqa: S310  # our own loopback https URL
            url,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Accept": "application/json", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30, context=self._context) as response:  # noqa: S310
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, method, path, exc.read().decode(errors="replace")) from None
        parsed: Obj = json.loads(text) if text else {}
        return parsed

    def list(self, path: str, page: int = 500) -> list[Obj]:
        """Every item of a collection, a page at a time so no single response is huge."""
        items: list[Obj] = []
        token = ""
        while True:
            query = {"limit": str(page), **({"continue": token} if token else {})}
            result = self.request("GET", path, query=query)
            items.extend(result.get("items") or [])
            token = (result.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    def ready(self) -> bool:
        try:
            url = f"{self.server}/readyz"
            with urllib.request.urlopen(url, timeout=5, context=self._context) as response:  # noqa: S310
                return int(response.status) == HTTPStatus.OK
        except OSError:  # refused, reset, a TLS error, or 500 while it starts
            return False
