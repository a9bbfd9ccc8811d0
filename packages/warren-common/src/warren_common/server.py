"""JSON over HTTP on a unix socket (or TCP with a bearer token): one route table, one error
contract.

Routes are (method, pattern, handler); a pattern's `{name}` segments match any one path
segment and reach the handler in `Request.params`. A handler returns what to send as JSON,
or `Text` (e.g. Prometheus' exposition). Every error reply is

    {"error": code, "message": text, "fix": text, ...extra}

raised by a handler as `RequestError`; a daemon's own exceptions become refusals through its
`translate` function. An unknown route is 404 `not_found`, a body that is not a JSON object
400 `bad_request`, anything else 500 `internal` (logged with its traceback). The socket is
made owner-only: whoever can connect has the daemon's authority. `TcpServer` serves the same
contract on a TCP address to callers that present its token (`Authorization: Bearer T`); any
other caller gets 401 `unauthorized` before a route runs.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socketserver
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

JSON = "application/json"
PROMETHEUS = "text/plain; version=0.0.4"
INTERNAL_FIX = "see the daemon's log"


class RequestError(Exception):
    """A request refused: a stable `code` for clients, what went wrong, and what to do."""

    def __init__(
        self, code: str, message: str, fix: str, status: int = 400, extra: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.fix, self.status = code, message, fix, status
        self.extra = dict(extra or {})

    def doc(self) -> dict[str, Any]:
        return {**self.extra, "error": self.code, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    params: dict[str, str] = field(default_factory=dict)  # the pattern's {name} segments
    body: dict[str, Any] = field(default_factory=dict)  # {} when none was sent


@dataclass(frozen=True)
class Text:
    """A plain-text answer (the JSON contract's one exception: metrics)."""

    body: str | bytes
    content_type: str = PROMETHEUS


class Route(NamedTuple):
    method: str
    pattern: str  # "/v1/vms/{id}/exec"
    handler: Callable[[Request], Any]

    def match(self, method: str, path: str) -> dict[str, str] | None:
        want, got = self.pattern.strip("/").split("/"), path.strip("/").split("/")
        if method != self.method or len(want) != len(got):
            return None
        params: dict[str, str] = {}
        for pattern, part in zip(want, got, strict=True):
            if pattern.startswith("{") and pattern.endswith("}") and part:
                params[pattern[1:-1]] = part
            elif pattern != part:
                return None
        return params


def _no_translation(_exc: Exception) -> RequestError | None:
    return None


def _nothing_around(_request: Request) -> AbstractContextManager[object]:
    return nullcontext()


class _Handler(BaseHTTPRequestHandler):
    server: Server | TcpServer

    def log_message(self, format: str, *args: Any) -> None:  # the stdlib's name
        self.server.log.debug(format, *args)

    def address_string(self) -> str:
        return "unix"

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # What the stdlib refuses before a route is looked up (a malformed request line,
        # a method no do_* exists for): the same contract, not its HTML page.
        name = {404: "not_found", 501: "bad_request"}.get(code, "bad_request" if code < 500 else "internal")  # noqa: PLR2004
        self.close_connection = True
        error = RequestError(name, message or explain or "", "send a valid HTTP request")
        self._send(code, json.dumps(error.doc()))

    def _send(self, status: int, body: str | bytes, content_type: str = JSON) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise RequestError("bad_request", "Content-Length is not a number", "send a JSON body") from None
        data = self.rfile.read(length) if length > 0 else b""
        if not data.strip():
            return {}
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise RequestError("bad_request", f"the body is not JSON: {exc}", "send a JSON object") from None
        if not isinstance(body, dict):
            raise RequestError("bad_request", "the request body must be a JSON object", "send a JSON object")
        return body

    def _serve(self) -> None:
        server = self.server
        path = urlsplit(self.path).path
        try:
            server.authorize(self.headers.get("Authorization") or "")
            handler, params = server.find(self.command, path)
            request = Request(self.command, path, params, self._body())
            with server.around(request):
                result = handler(request)
            if isinstance(result, Text):
                self._send(200, result.body, result.content_type)
            else:
                self._send(200, json.dumps(result))
        except Exception as exc:
            refusal = exc if isinstance(exc, RequestError) else server.translate(exc)
            if refusal is None:
                fields = {"method": self.command, "path": path}
                server.log.exception("request failed", extra={"fields": fields})
                refusal = RequestError("internal", f"{type(exc).__name__}: {exc}", INTERNAL_FIX, 500)
            self._send(refusal.status, json.dumps(refusal.doc()))

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()


class _Table:
    """What both servers hold: the routes, the error translation, the wrapper around each
    request, and who may call."""

    routes: list[Route]
    translate: Callable[[Exception], RequestError | None]
    around: Callable[[Request], AbstractContextManager[object]]
    log: logging.Logger
    token: bytes | None = None

    def _table(
        self,
        routes: Sequence[Route],
        translate: Callable[[Exception], RequestError | None],
        around: Callable[[Request], AbstractContextManager[object]],
        log: logging.Logger | None,
    ) -> None:
        self.routes = list(routes)
        self.translate, self.around = translate, around
        self.log = log or logging.getLogger(__name__)

    def authorize(self, header: str) -> None:
        if self.token is None:
            return  # a unix socket: its file mode is the authority
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token):
            raise RequestError(
                "unauthorized",
                "this API needs the token it was started with",
                "send Authorization: Bearer <token> with the token from the Secret both sides mount",
                401,
            )

    def find(self, method: str, path: str) -> tuple[Callable[[Request], Any], dict[str, str]]:
        for route in self.routes:
            params = route.match(method, path)
            if params is not None:
                return route.handler, params
        raise RequestError("not_found", f"no route {method} {path}", "see the daemon's API routes", 404)


class Server(_Table, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves `routes` on the unix socket at `path` (replacing a stale one) once
    `serve_forever` runs. `translate` turns a daemon's own exceptions into refusals (None:
    an internal error); `around(request)` wraps each request's handling (e.g. holds off a
    handoff while it runs)."""

    daemon_threads = True
    # socketserver's default backlog is 5; a unix socket's connect past a full backlog fails
    # at once (EAGAIN), and a node's CSI plugin sends one request per pod volume at a time
    # (eight children of one fork, say).
    request_queue_size = 128

    def __init__(
        self,
        path: Path,
        routes: Sequence[Route],
        *,
        translate: Callable[[Exception], RequestError | None] = _no_translation,
        around: Callable[[Request], AbstractContextManager[object]] = _nothing_around,
        log: logging.Logger | None = None,
    ) -> None:
        self._table(routes, translate, around, log)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        old = os.umask(0o077)  # the socket is the daemon's authority: its owner only
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old)


class TcpServer(_Table, socketserver.ThreadingMixIn, socketserver.TCPServer):
    """Serves `routes` on (host, port) to callers that send `token` as a bearer token."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        routes: Sequence[Route],
        *,
        token: bytes,
        translate: Callable[[Exception], RequestError | None] = _no_translation,
        log: logging.Logger | None = None,
    ) -> None:
        if not token.strip():
            raise ValueError("the token is empty: a TCP API without one would serve anyone")
        self._table(routes, translate, _nothing_around, log)
        self.token = token.strip()
        super().__init__(address, _Handler)
