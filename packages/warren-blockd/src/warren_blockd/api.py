"""The daemon's local API: JSON over HTTP on a unix socket (root-only by file mode).

  POST /v1/workspaces                      {"id", "size_bytes" | "template" | "image"}
  POST /v1/workspaces/<id>/fork            {"children": [...], "siblings"?}
  POST /v1/workspaces/<id>/mount           {"target"}
  POST /v1/workspaces/<id>/restore         {"target"}
  POST /v1/workspaces/<id>/unmount         {"wait_replicated": seconds}
  POST /v1/workspaces/<id>/flush           {"wait_replicated": seconds}
  POST /v1/images                          {"pod_uid", "workspace"}: capture (memory.py)
  POST /v1/images/<image>/stage            {"workspace", "workspace_seq", "into"?}: fetch, verify
  POST /v1/images/discard                  {"pod_uid"}: end the sandbox a capture froze
  POST /v1/images/place                    {"staged", "slot"}: a staged image to a resume slot
  POST /v1/images/release                  {"slot"}: a resume slot's wait ended, no image
  GET  /v1/stats      GET /metrics      GET /healthz
Errors are {"error": code, "message": text, "fix": text} with a 4xx/5xx status. During a
handoff the POSTs wait; once this daemon has handed over they answer `handed_over` (503),
and the client retries until the new daemon answers on the same socket.
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

from warren_common import server
from warren_common.server import INTERNAL_FIX, Request, RequestError, Route, Text

from warren_blockd import metrics
from warren_blockd.daemon import BlockdError, Daemon
from warren_blockd.errors import BlobError, NotFoundError
from warren_blockd.ids import WORKSPACE_ID_RULE
from warren_blockd.memory import Images
from warren_blockd.workspace import SplitBrainError, WorkspaceReleasedError

log = logging.getLogger("warren_blockd.api")
# code: (status, what the caller can do about it)
ERRORS = {
    "invalid_id": (400, f"name the workspace with {WORKSPACE_ID_RULE}"),
    "invalid_size": (400, "give size_bytes as a multiple of 4096 of at least 16 MiB"),
    "bad_request": (400, "send the fields the route takes (docs/workspace-layer.md)"),
    "not_found": (404, "check the workspace id: create it, or fork it from one that exists"),
    "not_attached": (404, "mount or restore the workspace on this node first"),
    "exists": (409, "choose another id, or use the workspace that exists"),
    "busy": (409, "retry once the operation under way on this workspace is done"),
    "split_brain": (409, "another node wrote this workspace: stop the other writer, then fork from it"),
    "held": (409, "delete the pod that uses the workspace on the node named, or wait until its hold lapses"),
    "released": (410, "the workspace was released for good: create or fork another"),
    "not_replicated": (503, "object storage may be unreachable: check the daemon's store, then retry"),
    "storage": (503, "object storage did not answer: check the daemon's store and try again"),
    "handed_over": (503, "retry: the new daemon answers on the same socket in a moment"),
    "host_command_failed": (500, "the host refused the command in the message: see the daemon's log"),
    "not_frozen": (409, "discard only the sandbox of a pod whose capture left it frozen"),
    "no_runsc": (501, "start the daemon with --runsc and --runsc-root (the node's gVisor) to capture memory"),
    "corrupt_image": (422, "the image cannot be restored: delete it; resume from a cold start if you must"),
    "workspace_mismatch": (409, "stage an image with the workspace it was captured over"),
    "workspace_changed": (
        409,
        "the workspace was written after the capture: resume from a cold start, or from a newer image",
    ),
}


CODES: list[tuple[type[Exception], str]] = [
    (NotFoundError, "not_found"),
    (SplitBrainError, "split_brain"),
    (WorkspaceReleasedError, "released"),
    (BlobError, "storage"),
]


def refusal(code: str, message: str) -> RequestError:
    status, fix = ERRORS.get(code, (500, INTERNAL_FIX))
    return RequestError(code, message, fix, status)


def translate(exc: Exception) -> RequestError | None:
    """The daemon's exceptions as API errors (None: an internal error)."""
    if isinstance(exc, BlockdError):
        return refusal(exc.code, str(exc))
    # The first class that matches names the code; NotFoundError is a BlobError.
    for kind, code in CODES:
        if isinstance(exc, kind):
            return refusal(code, str(exc))
    if isinstance(exc, (KeyError, TypeError, ValueError)):
        return refusal("bad_request", f"bad request: {exc}")
    return None


def routes(daemon: Daemon, images: Images | None = None) -> list[Route]:
    def health(_r: Request) -> Any:
        ok = daemon.ready.is_set() and not daemon.gate.handed_over
        return {"ok": ok, "instance": daemon.instance, "pid": os.getpid()}

    def create(r: Request) -> Any:
        image = r.body.get("image")
        return daemon.create(
            r.body["id"],
            r.body.get("size_bytes"),
            template=r.body.get("template"),
            image=Path(image) if image else None,
        )

    def fork(r: Request) -> Any:
        siblings = r.body.get("siblings")
        if siblings is not None and not isinstance(siblings, int):
            raise BlockdError("bad_request", f"siblings={siblings!r}: give how many children the fork makes")
        return {"children": daemon.fork(r.params["id"], list(r.body["children"]), siblings)}

    def wait(r: Request) -> Any:
        return r.body.get("wait_replicated")

    def memory() -> Images:
        if images is None:
            raise BlockdError("no_runsc", "this daemon keeps no memory images")
        return images

    ws = "/v1/workspaces/{id}"
    return [
        Route("GET", "/healthz", health),
        Route("GET", "/metrics", lambda _r: Text(metrics.exposition())),
        Route("GET", "/v1/stats", lambda _r: daemon.stats()),
        Route("POST", "/v1/workspaces", create),
        Route("POST", f"{ws}/fork", fork),
        Route("POST", f"{ws}/mount", lambda r: daemon.mount(r.params["id"], str(r.body["target"]))),
        Route("POST", f"{ws}/restore", lambda r: daemon.restore(r.params["id"], str(r.body["target"]))),
        Route("POST", f"{ws}/unmount", lambda r: asdict(daemon.unmount(r.params["id"], wait(r)))),
        Route("POST", f"{ws}/flush", lambda r: asdict(daemon.flush(r.params["id"], wait(r)))),
        Route(
            "POST", "/v1/images", lambda r: memory().capture(str(r.body["pod_uid"]), str(r.body["workspace"]))
        ),
        Route("POST", "/v1/images/discard", lambda r: memory().discard(str(r.body["pod_uid"]))),
        Route(
            "POST", "/v1/images/place", lambda r: memory().place(str(r.body["staged"]), str(r.body["slot"]))
        ),
        Route("POST", "/v1/images/release", lambda r: memory().release(str(r.body["slot"]))),
        Route(
            "POST",
            "/v1/images/{id}/stage",
            lambda r: memory().stage(
                r.params["id"], str(r.body["workspace"]), int(r.body["workspace_seq"]), r.body.get("into")
            ),
        ),
    ]


class Server(server.Server):
    def __init__(self, path: Path, daemon: Daemon, images: Images | None = None) -> None:
        def around(request: Request) -> AbstractContextManager[object]:
            # A handoff waits for the POSTs under way, or they for the handoff.
            return daemon.gate.operation() if request.method == "POST" else nullcontext()

        super().__init__(path, routes(daemon, images), translate=translate, around=around, log=log)
        self.daemon = daemon
