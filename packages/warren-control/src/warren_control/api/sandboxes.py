"""The /v1 sandbox routes: create, list, get, delete, fork, stop, start, keep-alive."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Body, Depends, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from warren_control import store
from warren_control.api.errors import ApiError, not_found, unsupported
from warren_control.api.params import Api, IdempotencyKey, Who, stamped_identity
from warren_control.api.service import MAX_WAIT_S, ApiService
from warren_control.api.shapes import (
    CreateSandboxRequest,
    ForkOut,
    ForkRequest,
    PageOut,
    SandboxOut,
    StartRequest,
    StopRequest,
    error_responses,
)
from warren_control.identity import Identity
from warren_control.models import (
    SandboxPhase,
)

router = APIRouter(prefix="/v1", dependencies=[Depends(stamped_identity)], tags=["sandboxes"])


@router.post(
    "/sandboxes",
    status_code=201,
    response_model=SandboxOut,
    responses=error_responses(400, 401, 403, 404, 422, 503),
    summary="Create a sandbox",
)
def create_sandbox(body: CreateSandboxRequest, who: Who, api: Api, key: IdempotencyKey = None) -> Response:
    status, response, replayed = api.create(who, body, key)
    headers = {"Location": f"/v1/sandboxes/{response['id']}"} if status == 201 else {}  # noqa: PLR2004
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(response, status_code=status, headers=headers)


@router.get(
    "/sandboxes",
    response_model=PageOut,
    responses=error_responses(400, 401),
    summary="List the organization's sandboxes, oldest first",
)
def list_sandboxes(
    who: Who,
    api: Api,
    limit: Annotated[int, Query(ge=1, le=store.MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> Response:
    with api.sessions.begin() as session:
        try:
            page = store.list_sandboxes(session, who.org, limit=limit, cursor=cursor)
        except store.InvalidCursorError as exc:
            raise ApiError(400, "invalid_request", str(exc)) from exc
        api.observe_page(session, who.org, page.items)
        items = [api.public(r) for r in page.items if r.phase is not SandboxPhase.DELETED]
    return JSONResponse({"items": items, "next_cursor": page.next_cursor})


@router.get(
    "/sandboxes/{sandbox_id}",
    response_model=SandboxOut,
    responses=error_responses(401, 404),
    summary="One sandbox, as the cluster shows it",
)
async def get_sandbox(
    sandbox_id: str,
    who: Who,
    api: Api,
    wait_s: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_S,
            description="A long poll: answer once a starting sandbox runs, cannot start or reports "
            "another state, at most this many seconds later (0: at once).",
        ),
    ] = 0,
) -> Response:
    # Past the long polls a process holds at once, the answer leaves at once: the client asks again.
    if wait_s > 0 and api.wait_threads.available_tokens >= 1:
        await anyio.to_thread.run_sync(api.await_news, who, sandbox_id, wait_s, limiter=api.wait_threads)
    return await run_in_threadpool(_one, sandbox_id, who, api)


def _one(sandbox_id: str, who: Identity, api: ApiService) -> Response:
    with api.sessions.begin() as session:
        record = api.find(session, who, sandbox_id)
        api.observe(session, record)
        answer = api.public(record)
    # Outside the transaction: what the observation found (gone, say) is committed.
    if record.phase is SandboxPhase.DELETED:
        raise not_found(sandbox_id)
    return JSONResponse(answer)


@router.delete(
    "/sandboxes/{sandbox_id}",
    status_code=202,
    response_model=SandboxOut,
    responses=error_responses(401, 404, 503),
    summary="Delete a sandbox and its workspace",
)
def delete_sandbox(sandbox_id: str, who: Who, api: Api) -> Response:
    return JSONResponse(api.delete(who, sandbox_id), status_code=202)


@router.post(
    "/sandboxes/{sandbox_id}/fork",
    response_model=ForkOut,
    responses=error_responses(400, 401, 403, 404, 409, 422, 503),
    summary="Fork a sandbox's workspace into `count` new sandboxes, each on its own",
)
def fork_sandbox(
    sandbox_id: str, who: Who, api: Api, body: Annotated[ForkRequest, Body()], key: IdempotencyKey = None
) -> Response:
    status, response, replayed = api.fork(who, sandbox_id, body.count, key, secrets=body.secrets)
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    return JSONResponse(response, status_code=status, headers=headers)


@router.post(
    "/sandboxes/{sandbox_id}/stop",
    status_code=202,
    response_model=SandboxOut,
    responses=error_responses(400, 401, 404, 409, 503),
    summary="Stop a sandbox: its processes end (their memory captured first if asked), its workspace stays",
)
def stop_sandbox(
    sandbox_id: str, who: Who, api: Api, body: Annotated[StopRequest | None, Body()] = None
) -> Response:
    memory = body is not None and body.memory_capture
    if memory and (refused := api.capture_refusal(api.image_of(who, sandbox_id))) is not None:
        raise unsupported("memory_capture", refused)
    api.need_workspaces("stopping (only the workspace outlives the processes)")
    return JSONResponse(api.set_stopped(who, sandbox_id, True, memory=memory), status_code=202)


@router.post(
    "/sandboxes/{sandbox_id}/start",
    status_code=202,
    response_model=SandboxOut,
    responses=error_responses(401, 404, 409, 503),
    summary="Start a stopped sandbox again, on the same workspace (resumed from its memory if captured)",
)
def start_sandbox(
    sandbox_id: str, who: Who, api: Api, body: Annotated[StartRequest | None, Body()] = None
) -> Response:
    cold = body is not None and body.cold
    return JSONResponse(api.set_stopped(who, sandbox_id, False, cold=cold), status_code=202)


@router.post(
    "/sandboxes/{sandbox_id}/keepalive",
    response_model=SandboxOut,
    responses=error_responses(401, 404),
    summary="Restart the sandbox's idle timer",
)
def keepalive(sandbox_id: str, who: Who, api: Api) -> Response:
    with api.sessions.begin() as session:
        record = api.find(session, who, sandbox_id)
        record.touch()
        session.flush()
        return JSONResponse(api.public(record))
