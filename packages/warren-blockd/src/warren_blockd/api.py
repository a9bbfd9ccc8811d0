"""The daemon's local API: JSON over HTTP on a unix socket (root-only by file mode).

  POST /v1/workspaces                      {"id", "size_bytes" | "template" | "image"}
  POST /v1/workspaces/<id>/fork            {"children": [...]}
  POST /v1/workspaces/<id>/mount           {"target"}
  POST /v1/workspaces/<id>/restore         {"target"}
  POST /v1/workspaces/<id>/unmount         {"wait_replicated": seconds}
  POST /v1/workspaces/<id>/flush           {"wait_replicated": seconds}
  GET  /v1/stats      GET /metrics      GET /healthz
Errors are {"error": code, "message": text} with a 4xx/5xx status. During a handoff the
POSTs wait; once this daemon has handed over they answer `handed_over` (503), and the
client retries until the new daemon answers on the same socket.
"""

from __future__ import annotations

import json
import logging
import os
import socketserver
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from warren_blockd import metrics
from warren_blockd.daemon import BlockdError, Daemon
from warren_blockd.errors import BlobError, NotFoundError
from warren_blockd.replicator import Receipt
from warren_blockd.workspace import SplitBrainError, WorkspaceReleasedError

log = logging.getLogger("warren_blockd.api")
STATUS = {
    "invalid_id": 400,
    "invalid_size": 400,
    "bad_request": 400,
    "not_found": 404,
    "not_attached": 404,
    "exists": 409,
    "busy": 409,
    "split_brain": 409,
    "not_replicated": 503,
    "storage": 503,
    "handed_over": 503,
}


def _receipt(receipt: Receipt) -> dict[str, Any]:
    return asdict(receipt)


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # the stdlib's name
        log.debug(format, *args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode())

    def address_string(self) -> str:
        return "unix"

    def do_GET(self) -> None:
        daemon = self.server.daemon
        if self.path == "/healthz":
            ok = daemon.ready.is_set() and not daemon.gate.handed_over
            self._json(200, {"ok": ok, "instance": daemon.instance, "pid": os.getpid()})
        elif self.path == "/metrics":
            self._send(200, metrics.exposition(), "text/plain; version=0.0.4")
        elif self.path == "/v1/stats":
            self._json(200, daemon.stats())
        else:
            self._json(404, {"error": "not_found", "message": f"no such path {self.path}"})

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise BlockdError("bad_request", "the request body must be a JSON object")
            with self.server.daemon.gate.operation():  # a handoff waits for it, or it for the handoff
                result = self._route(body)
            self._json(200, result)
        except BlockdError as exc:
            self._json(STATUS.get(exc.code, 500), {"error": exc.code, "message": str(exc)})
        except NotFoundError as exc:
            self._json(404, {"error": "not_found", "message": str(exc)})
        except SplitBrainError as exc:
            self._json(409, {"error": "split_brain", "message": str(exc)})
        except WorkspaceReleasedError as exc:
            self._json(410, {"error": "released", "message": str(exc)})
        except BlobError as exc:
            self._json(503, {"error": "storage", "message": str(exc)})
        except (KeyError, TypeError, ValueError) as exc:
            self._json(400, {"error": "bad_request", "message": f"bad request: {exc}"})
        except Exception as exc:
            log.exception("request failed")
            self._json(500, {"error": "internal", "message": str(exc)})

    def _route(self, body: dict[str, Any]) -> Any:
        daemon = self.server.daemon
        parts = self.path.strip("/").split("/")
        if parts == ["v1", "workspaces"]:
            image = body.get("image")
            return daemon.create(
                body["id"],
                body.get("size_bytes"),
                template=body.get("template"),
                image=Path(image) if image else None,
            )
        if len(parts) == 4 and parts[:2] == ["v1", "workspaces"]:  # noqa: PLR2004
            workspace_id, action = parts[2], parts[3]
            wait = body.get("wait_replicated")
            if action == "fork":
                return {"children": daemon.fork(workspace_id, list(body["children"]))}
            if action == "mount":
                return daemon.mount(workspace_id, str(body["target"]))
            if action == "restore":
                return daemon.restore(workspace_id, str(body["target"]))
            if action == "unmount":
                return _receipt(daemon.unmount(workspace_id, wait))
            if action == "flush":
                return _receipt(daemon.flush(workspace_id, wait))
        raise BlockdError("not_found", f"no such path {self.path}")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, daemon: Daemon) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        old = os.umask(0o077)  # the socket is the daemon's authority: root only
        try:
            super().__init__(str(path), Handler)
        finally:
            os.umask(old)
        self.daemon = daemon
