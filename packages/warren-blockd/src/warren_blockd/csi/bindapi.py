"""The plugin's bind API: the control plane names the workspace of a claimed pod's
bindAtClaim volume. JSON over HTTP on a TCP address, to callers holding the token both sides
mount from one Secret (sandbox pods cannot reach the address at all: the egress floor keeps
them off private ranges; the token keeps everyone else out).

  POST /v1/bind  {"pod_uid", "workspace", and one of "forkOf" | "template" | "size", or
                 none of them for a workspace that exists; "container_id"? to mount it at
                 /workspace of that running container of the pod (csi/rootfs.py)}
                 -> {"workspace", "how"}: forked, from template, created, restored, already bound
  POST /v1/fork  {"source", "children", "siblings"?} -> {"children": {id: error or null},
                 "fork_ms"}: the children made in object storage by the node the source is
                 mounted on, after its writes there reached storage (a fork whose children
                 run on other nodes: each binds its child as it exists)
  POST /v1/capture  {"pod_uid", "workspace"} -> {"image", "workspace_seq", "bytes", ...}
  POST /v1/stage    {"image", "workspace", "workspace_seq", "into"?} -> {"image", "workspace",
                    "path"}: where the host has it, verified, if the workspace is at that write
                    record; with "into", onto a new fork of the workspace at that record
  POST /v1/place    {"staged", "slot"}       -> {"slot", "path"}: the staged image given to
                    the resume slot (a pod waiting to restore) of that name
  POST /v1/release  {"slot"}                 -> the resume slot's wait ended: it starts afresh
  POST /v1/discard  {"pod_uid"}              -> the sandbox a capture froze, killed

Capture, stage, place and release are the daemon's (warren_blockd.memory), passed on as asked.

The fields are the volume attributes a pod would give, checked the same way; the workspace
is made and mounted as a publish would, at the target of the pod's awaiting volume.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc
from warren_common.client import ApiError
from warren_common.server import Request, RequestError, Route, TcpServer

from warren_blockd.csi import attributes
from warren_blockd.csi.errors import CsiError, invalid
from warren_blockd.csi.publisher import Publisher

log = logging.getLogger("warren_blockd.csi")
FIELDS = ("workspace", "size", "forkOf", "template", "siblings")
# What a CSI refusal means to an HTTP caller.
STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "bad_request"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "conflict"),
    grpc.StatusCode.FAILED_PRECONDITION: (409, "conflict"),
    grpc.StatusCode.UNAVAILABLE: (503, "unavailable"),
}


def request_of(body: dict[str, Any]) -> attributes.VolumeRequest:
    uid = body.get("pod_uid")
    if not isinstance(uid, str) or not uid:
        raise invalid("pod_uid is missing: name the claimed pod by its uid")
    unknown = sorted(k for k in body if k not in (*FIELDS, "pod_uid", "container_id"))
    if unknown:
        raise invalid(
            f"unknown field(s) {', '.join(unknown)}: use pod_uid, container_id, {', '.join(FIELDS)}"
        )
    context = {attributes.EPHEMERAL: "true", attributes.KUBELET_PREFIX + "pod.uid": uid}
    context.update({key: str(body[key]) for key in FIELDS if body.get(key) is not None})
    wanted = attributes.parse(context)
    if not isinstance(wanted, attributes.VolumeRequest):  # bindAtClaim is not among FIELDS
        raise invalid("a bind names a workspace: give workspace")
    return wanted  # one with neither source nor size is restored, or refused for lack of a size


def fork_of(body: dict[str, Any]) -> tuple[str, list[str], int | None]:
    """(source, children, siblings) of a fork request, checked as a pod's attributes are."""
    unknown = sorted(k for k in body if k not in ("source", "children", "siblings"))
    if unknown:
        raise invalid(f"unknown field(s) {', '.join(unknown)}: use source, children, siblings")
    children = body.get("children")
    if not isinstance(children, list) or not children:
        raise invalid("children is missing: name the workspaces the fork makes")
    source = attributes.workspace_id("source", str(body.get("source") or ""))
    made = [attributes.workspace_id("children", str(child)) for child in children]
    if source in made:
        raise invalid(f"workspace {source} cannot be made from itself: drop it from children")
    siblings = attributes.sibling_count(str(body["siblings"])) if body.get("siblings") is not None else None
    return source, made, siblings


def routes(publisher: Publisher) -> list[Route]:
    def bind(request: Request) -> dict[str, Any]:
        began = time.monotonic()
        wanted = request_of(request.body)
        container = request.body.get("container_id")
        how = publisher.bind(wanted, str(container) if container is not None else None)
        fields = {
            "workspace": wanted.workspace,
            "how": how,
            "pod_uid": wanted.pod_uid,
            "from": wanted.source,
            "bind_ms": round((time.monotonic() - began) * 1000),
        }
        log.info("bound", extra={"fields": fields})
        return {"workspace": wanted.workspace, "how": how}

    def fork(request: Request) -> dict[str, Any]:
        began = time.monotonic()
        source, children, siblings = fork_of(request.body)
        body: dict[str, Any] = {"children": children}
        if siblings is not None:
            body["siblings"] = siblings
        made = publisher.client.request("POST", f"/v1/workspaces/{source}/fork", body)["children"]
        fork_ms = round((time.monotonic() - began) * 1000)
        log.info(
            "forked for other nodes",
            extra={"fields": {"source": source, "children": made, "fork_ms": fork_ms}},
        )
        return {"children": made, "fork_ms": fork_ms}

    def capture(request: Request) -> Any:
        body = {"pod_uid": str(request.body["pod_uid"]), "workspace": str(request.body["workspace"])}
        return publisher.client.request("POST", "/v1/images", body)

    def stage(request: Request) -> Any:
        image = str(request.body["image"])
        body = {
            "workspace": str(request.body["workspace"]),
            "workspace_seq": int(request.body["workspace_seq"]),
        }
        if request.body.get("into"):
            body["into"] = str(request.body["into"])
        return publisher.client.request("POST", f"/v1/images/{image}/stage", body)

    def place(request: Request) -> Any:
        body = {"staged": str(request.body["staged"]), "slot": str(request.body["slot"])}
        return publisher.client.request("POST", "/v1/images/place", body)

    def release(request: Request) -> Any:
        return publisher.client.request("POST", "/v1/images/release", {"slot": str(request.body["slot"])})

    def discard(request: Request) -> Any:
        body = {"pod_uid": str(request.body["pod_uid"])}
        return publisher.client.request("POST", "/v1/images/discard", body)

    return [
        Route("POST", "/v1/bind", bind),
        Route("POST", "/v1/fork", fork),
        Route("POST", "/v1/discard", discard),
        Route("POST", "/v1/capture", capture),
        Route("POST", "/v1/stage", stage),
        Route("POST", "/v1/place", place),
        Route("POST", "/v1/release", release),
    ]


def translate(exc: Exception) -> RequestError | None:
    if isinstance(exc, ApiError):  # the daemon's refusal, as it gave it
        return RequestError(exc.code, str(exc.doc.get("message")), str(exc.doc.get("fix")), exc.status)
    if isinstance(exc, OSError):
        return RequestError("unavailable", f"the node's warren-blockd did not answer: {exc}", "retry", 503)
    if isinstance(exc, KeyError):
        fix = "send the fields the route names in warren_blockd.csi.bindapi"
        return RequestError("bad_request", f"missing field {exc}", fix, 400)
    if not isinstance(exc, CsiError):
        return None
    status, code = STATUS.get(exc.code, (500, "internal"))
    return RequestError(code, exc.message, "see the message; the plugin's log has the rest", status)


def server(address: tuple[str, int], token: bytes, publisher: Publisher) -> TcpServer:
    return TcpServer(address, routes(publisher), token=token, translate=translate, log=log)
