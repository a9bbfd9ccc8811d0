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

import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from warren_common import server
from warren_common.server import Request, RequestError, Route, Text

from warren_forkd import metrics
from warren_forkd.daemon import Daemon
from warren_forkd.errors import GenerationMismatchError
from warren_forkd.errors import RequestError as ForkdRequestError

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
ROUTES_FIX = "see the routes in NOTES.md"


def translate(exc: Exception) -> RequestError | None:
    """The daemon's exceptions as API errors (None: an internal error)."""
    if isinstance(exc, ForkdRequestError):
        return RequestError(exc.code, str(exc), exc.fix, STATUS.get(exc.code, 500))
    if isinstance(exc, GenerationMismatchError):
        fix = (
            "branch a snapshot taken over the disk as it is now (boot the template and snapshot "
            "it again), or put back the disk the snapshot was taken over"
        )
        found = {"snapshot": exc.snapshot, "recorded": exc.recorded, "found": exc.found}
        return RequestError("generation_mismatch", str(exc), fix, 409, found)
    if isinstance(exc, KeyError):
        return RequestError("bad_request", f"missing field {exc}", ROUTES_FIX)
    return None


Action = Callable[[Daemon, Request], Coroutine[Any, Any, Any]]
# (method, path with {placeholders}, what it does on the daemon's event loop).
ACTIONS: list[tuple[str, str, Action]] = [
    ("GET", "/v1/info", lambda d, _r: d.info()),
    ("GET", "/v1/templates", lambda d, _r: d.list_templates()),
    ("POST", "/v1/templates", lambda d, r: d.add_template(r.body)),
    ("GET", "/v1/snapshots", lambda d, _r: d.list_snapshots()),
    ("POST", "/v1/snapshots/{id}/branch", lambda d, r: d.branch(r.params["id"], r.body)),
    ("GET", "/v1/vms", lambda d, _r: d.list_vms()),
    ("POST", "/v1/vms", lambda d, r: d.boot(r.body)),
    ("GET", "/v1/vms/{id}", lambda d, r: d.get_vm(r.params["id"])),
    ("POST", "/v1/vms/{id}/snapshot", lambda d, r: d.take_snapshot(r.params["id"], r.body)),
    ("POST", "/v1/vms/{id}/exec", lambda d, r: d.exec(r.params["id"], r.body)),
    ("POST", "/v1/vms/{id}/stop", lambda d, r: d.stop(r.params["id"])),
]


def routes(daemon: Daemon) -> list[Route]:
    def on_loop(action: Action) -> Callable[[Request], Any]:
        return lambda request: daemon.call(action(daemon, request))

    return [
        Route("GET", "/healthz", lambda _r: {"ok": True}),
        Route("GET", "/metrics", lambda _r: Text(metrics.exposition())),
        *(Route(method, pattern, on_loop(action)) for method, pattern, action in ACTIONS),
    ]


class Server(server.Server):
    def __init__(self, path: Path, daemon: Daemon) -> None:
        super().__init__(path, routes(daemon), translate=translate, log=log)
        self.daemon = daemon
