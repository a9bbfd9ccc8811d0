"""The daemon's local API: JSON over HTTP on a unix socket (owner-only by file mode).

  GET  /healthz                      GET /metrics (Prometheus)       GET /v1/info
  GET  /v1/templates                 POST /v1/templates              {"name", ["kernel", "initramfs",
                                                                      "disk"], "cmdline", "mem_mib"}
  GET  /v1/snapshots                 POST /v1/snapshots/<id>/branch  {"count", "ids"}
  GET  /v1/vms    GET /v1/vms/<id>   POST /v1/vms                    {"template", "id"}
  POST /v1/vms/<id>/snapshot {"id"}  POST /v1/vms/<id>/exec {"command", "timeout"}
  POST /v1/vms/<id>/stop
Errors are {"error": code, "message": text, "fix": text} with a 4xx/5xx status; a refused
generation adds "snapshot", "recorded" and "found".
"""

from __future__ import annotations

import json
import logging
import os
import socketserver
from collections.abc import Callable, Coroutine
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from warren_forkd import metrics
from warren_forkd.daemon import Daemon
from warren_forkd.errors import GenerationMismatchError, RequestError

log = logging.getLogger("warren_forkd.api")
STATUS = {
    "bad_request": 400,
    "invalid_id": 400,
    "bad_path": 400,
    "not_found": 404,
    "exists": 409,
    "busy": 409,
    "wrong_state": 409,
    "not_snapshottable": 409,
    "disk_missing": 409,
    "agent_error": 502,
    "exec_timeout": 504,
}


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # the stdlib's name
        log.debug(format, *args)

    def address_string(self) -> str:
        return "unix"

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode())

    def _error(self, status: int, code: str, message: str, fix: str, **extra: Any) -> None:
        self._json(status, {"error": code, "message": message, "fix": fix, **extra})

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, metrics.exposition(), "text/plain; version=0.0.4")
            return
        self._handle(None)

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            self._error(400, "bad_request", f"the body is not JSON: {exc}", "send a JSON object")
            return
        if not isinstance(body, dict):
            self._error(400, "bad_request", "the request body must be a JSON object", "send a JSON object")
            return
        self._handle(body)

    def _handle(self, body: dict[str, Any] | None) -> None:
        try:
            self._json(200, self._route(body))
        except RequestError as exc:
            self._error(STATUS.get(exc.code, 500), exc.code, str(exc), exc.fix)
        except GenerationMismatchError as exc:
            self._error(
                409,
                "generation_mismatch",
                str(exc),
                "branch a snapshot taken over the disk as it is now (boot the template and snapshot "
                "it again), or put back the disk the snapshot was taken over",
                snapshot=exc.snapshot,
                recorded=exc.recorded,
                found=exc.found,
            )
        except KeyError as exc:
            self._error(400, "bad_request", f"missing field {exc}", "see the routes in NOTES.md")
        except Exception as exc:
            log.exception("request failed")
            self._error(500, "internal", f"{type(exc).__name__}: {exc}", "see the daemon's log")

    def _route(self, body: dict[str, Any] | None) -> Any:
        if self.path == "/healthz":
            return {"ok": True}
        daemon = self.server.daemon
        method = "GET" if body is None else "POST"
        parts = self.path.split("?")[0].strip("/").split("/")
        for route_method, pattern, action in ROUTES:
            matches = len(pattern) == len(parts) and all(
                p in ("*", part) for p, part in zip(pattern, parts, strict=False)
            )
            if route_method == method and matches:
                ids = [part for p, part in zip(pattern, parts, strict=True) if p == "*"]
                return daemon.call(action(daemon, ids, body or {}))
        raise RequestError("not_found", f"no route {method} {self.path}", "see the routes in NOTES.md")


Action = Callable[[Daemon, list[str], dict[str, Any]], Coroutine[Any, Any, Any]]
# (method, path with "*" for an id, what it does): ids arrive in path order.
ROUTES: list[tuple[str, tuple[str, ...], Action]] = [
    ("GET", ("v1", "info"), lambda d, _i, _b: d.info()),
    ("GET", ("v1", "templates"), lambda d, _i, _b: d.list_templates()),
    ("POST", ("v1", "templates"), lambda d, _i, b: d.add_template(b)),
    ("GET", ("v1", "snapshots"), lambda d, _i, _b: d.list_snapshots()),
    ("POST", ("v1", "snapshots", "*", "branch"), lambda d, i, b: d.branch(i[0], b)),
    ("GET", ("v1", "vms"), lambda d, _i, _b: d.list_vms()),
    ("POST", ("v1", "vms"), lambda d, _i, b: d.boot(b)),
    ("GET", ("v1", "vms", "*"), lambda d, i, _b: d.get_vm(i[0])),
    ("POST", ("v1", "vms", "*", "snapshot"), lambda d, i, b: d.take_snapshot(i[0], b)),
    ("POST", ("v1", "vms", "*", "exec"), lambda d, i, b: d.exec(i[0], b)),
    ("POST", ("v1", "vms", "*", "stop"), lambda d, i, _b: d.stop(i[0])),
]


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, daemon: Daemon) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        old = os.umask(0o077)  # the socket is the daemon's authority: its owner only
        try:
            super().__init__(str(path), Handler)
        finally:
            os.umask(old)
        self.daemon = daemon
