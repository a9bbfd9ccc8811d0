"""The routes that reach into a running sandbox: exec (streamed), its files, and what object
storage proves about its workspace. They go through the sandbox's agent when its pod has one
(agentclient.py), and through Kubernetes exec where it has none (podexec.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from warren_control import agentclient, podexec
from warren_control.api.errors import ApiError, unsupported
from warren_control.api.params import Api, FilePath, Who, stamped_identity
from warren_control.api.service import ApiService, Target
from warren_control.api.shapes import SCHEMAS, ExecRequest, FileWrittenOut, WorkspaceProofOut, error_responses
from warren_control.models import utcnow
from warren_control.podspec import CONTAINER
from warren_control.scrub import scrub
from warren_control.workspaces import WorkspaceStoreError

log = logging.getLogger(__name__)

FILE_TIMEOUT_S = 120  # a file through Kubernetes exec


class Utf8Lines:
    """Output chunks as exec events: text where the bytes are UTF-8 (a character split
    across chunks is held back until it completes), base64 where they are not."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.pending = b""

    def feed(self, data: bytes, *, final: bool = False) -> list[dict[str, Any]]:
        buffer = self.pending + data
        self.pending = b""
        if not buffer:
            return []
        try:
            return [{"stream": self.stream, "text": buffer.decode("utf-8")}]
        except UnicodeDecodeError as exc:
            incomplete_tail = exc.reason == "unexpected end of data" and len(buffer) - exc.start < 4  # noqa: PLR2004
            if incomplete_tail and not final:
                head = buffer[: exc.start]
                try:
                    text = head.decode("utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    self.pending = buffer[exc.start :]
                    return [{"stream": self.stream, "text": text}] if text else []
            return [{"stream": self.stream, "base64": base64.b64encode(buffer).decode("ascii")}]


def event_line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


router = APIRouter(prefix="/v1", dependencies=[Depends(stamped_identity)], tags=["sandboxes"])


@router.post(
    "/sandboxes/{sandbox_id}/exec",
    responses={
        200: {
            "description": "Output as it comes, then the exit code: one JSON object a line",
            "content": {"application/x-ndjson": {"schema": {"$ref": SCHEMAS + "ExecEventOut"}}},
        },
        **error_responses(400, 401, 404, 409, 413, 503),
    },
    response_class=StreamingResponse,
    summary="Run a command in the sandbox, streaming its output",
)
async def exec_command(sandbox_id: str, who: Who, api: Api, body: ExecRequest) -> Response:
    stdin = exec_stdin(api.settings.max_file_bytes, body)
    target = await run_in_threadpool(api.target, who, sandbox_id)
    outputs: AsyncGenerator[tuple[str, bytes] | agentclient.Exit] | None = None
    if target.agent is not None:
        try:
            command = await agentclient.start(
                api.agent_http, target.agent, body.command, stdin=stdin is not None
            )
        except agentclient.AgentRefused as refused:
            # Nothing ran (no such executable): told the way a command's failure is.
            message = scrub(refused.message, *target.names)
            return StreamingResponse(
                iter([event_line({"exit_code": None, "error": "exec_failed", "message": message})]),
                media_type="application/x-ndjson",
            )
        except agentclient.AgentError as exc:
            log.warning("the sandbox's agent does not answer (%s); using Kubernetes exec", exc)
        else:
            outputs = agent_outputs(command, stdin)
    stream = outputs or await kube_outputs(api, target, body.command, stdin)
    return StreamingResponse(exec_events(stream, body.timeout_s, target), media_type="application/x-ndjson")


async def exec_events(
    stream: AsyncGenerator[tuple[str, bytes] | agentclient.Exit], timeout_s: int, target: Target
) -> AsyncIterator[bytes]:
    """The command's output and then its end as exec events, one a line: its exit code, a
    failure to run, or the timeout (`timeout_s` from the first event asked for)."""
    decoders = {name: Utf8Lines(name) for name in (podexec.STDOUT, podexec.STDERR)}

    def flush() -> list[bytes]:
        return [event_line(e) for d in decoders.values() for e in d.feed(b"", final=True)]

    deadline = anyio.current_time() + timeout_s
    try:
        while True:
            remaining = deadline - anyio.current_time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                item = await asyncio.wait_for(anext(stream), remaining)
            except TimeoutError:
                for line in flush():
                    yield line
                message = f"no exit within {timeout_s} s; the output stream was closed"
                yield event_line({"exit_code": None, "error": "timeout", "message": message})
                return
            if isinstance(item, agentclient.Exit):
                for line in flush():
                    yield line
                if item.code is not None:
                    yield event_line({"exit_code": item.code})
                else:
                    message = scrub(item.error or "the command did not run", *target.names)
                    yield event_line({"exit_code": None, "error": "exec_failed", "message": message})
                return
            for event in decoders[item[0]].feed(item[1]):
                yield event_line(event)
    finally:
        with anyio.CancelScope(shield=True):
            await stream.aclose()


def exec_stdin(limit: int, body: ExecRequest) -> bytes | None:
    if body.stdin_base64 is None:
        return None
    try:
        data = base64.b64decode(body.stdin_base64, validate=True)
    except ValueError as exc:
        raise ApiError(400, "invalid_request", "stdin_base64: not base64; encode the bytes") from exc
    if len(data) > limit:
        raise ApiError(413, "too_large", f"stdin larger than {limit} bytes: write a file and redirect")
    return data


async def agent_outputs(
    command: agentclient.Command, stdin: bytes | None
) -> AsyncGenerator[tuple[str, bytes] | agentclient.Exit]:
    try:
        async for item in command.outputs(stdin):
            yield item
    finally:
        await command.close()


async def kube_outputs(
    api: ApiService, target: Target, command: list[str], stdin: bytes | None
) -> AsyncGenerator[tuple[str, bytes] | agentclient.Exit]:
    """The command through Kubernetes exec (a pod without an agent), opened before the
    response starts, so that a pod that went away is a 409 rather than a stream."""
    session = podexec.ExecSession(
        api.cluster.kube, api.settings.namespace, target.pod, CONTAINER, command, stdin=stdin is not None
    )
    try:
        await anyio.to_thread.run_sync(session.open, limiter=api.exec_threads)
        if stdin is not None:
            await anyio.to_thread.run_sync(session.write, stdin, limiter=api.exec_threads)
            await anyio.to_thread.run_sync(session.close_stdin, limiter=api.exec_threads)
    except podexec.ExecNotFound as exc:
        await anyio.to_thread.run_sync(session.close, limiter=api.exec_threads)
        raise ApiError(409, "not_running", "the sandbox is not running any more") from exc
    except podexec.ExecError as exc:
        await anyio.to_thread.run_sync(session.close, limiter=api.exec_threads)
        log.warning("exec failed to start: %s", exc)
        raise ApiError(503, "unavailable", "cannot reach the sandbox right now; retry later") from exc
    return polled(session, api.exec_threads)


async def polled(
    session: podexec.ExecSession, threads: anyio.CapacityLimiter
) -> AsyncGenerator[tuple[str, bytes] | agentclient.Exit]:
    """An open Kubernetes exec session's output, polled from worker threads, then its end;
    the session is closed however the reading ends."""
    try:
        while True:
            chunks, done = await anyio.to_thread.run_sync(session.poll, 0.5, limiter=threads)
            for chunk in chunks:
                yield chunk
            if done:
                status = session.status()
                yield agentclient.Exit(status.exit_code, status.error or "the command did not run")
                return
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(session.close, limiter=threads)


def file_path(path: str) -> str:
    if not path.startswith("/") or "\x00" in path:
        raise ApiError(400, "invalid_request", "path must be absolute")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, "invalid_request", "path must be UTF-8") from exc
    return path


def run_in_pod(api: ApiService, target: Target, command: list[str], stdin: bytes | None) -> podexec.Completed:
    """A file transfer through Kubernetes exec (a pod without an agent)."""
    settings = api.settings
    try:
        done = podexec.run(
            api.cluster.kube,
            settings.namespace,
            target.pod,
            CONTAINER,
            command,
            stdin=stdin,
            timeout_s=FILE_TIMEOUT_S,
            max_output=settings.max_file_bytes,
        )
    except podexec.OutputTooLarge as exc:
        raise ApiError(413, "too_large", f"files larger than {settings.max_file_bytes} bytes") from exc
    except podexec.ExecNotFound as exc:
        raise ApiError(409, "not_running", "the sandbox is not running any more") from exc
    except podexec.ExecError as exc:
        log.warning("file transfer failed: %s", exc)
        raise ApiError(503, "unavailable", "cannot reach the sandbox right now; retry later") from exc
    return done


def agent_file_failure(refused: agentclient.AgentRefused, target: Target, path: str, limit: int) -> ApiError:
    said = scrub(refused.message, *target.names)[:2000]
    if refused.status == httpx.codes.NOT_FOUND:
        return ApiError(404, "file_not_found", f"{path}: {said}")
    if refused.status == httpx.codes.REQUEST_ENTITY_TOO_LARGE:
        return ApiError(413, "too_large", f"files larger than {limit} bytes")
    return ApiError(400, "file_error", f"{path}: {said}")


def file_failure(done: podexec.Completed, target: Target, path: str) -> ApiError:
    said = done.stderr.decode("utf-8", "replace").strip() or (done.status.error or "")
    said = scrub(said, *target.names)
    if "No such file" in said or "not found" in said.lower():
        return ApiError(404, "file_not_found", f"{path}: {said}"[:2000])
    return ApiError(400, "file_error", f"{path}: {said}"[:2000])


@router.get(
    "/sandboxes/{sandbox_id}/workspace",
    response_model=WorkspaceProofOut,
    responses=error_responses(400, 401, 404, 409, 503),
    summary="What object storage proves about the sandbox's workspace",
)
def workspace_proof(sandbox_id: str, who: Who, api: Api) -> Response:
    workspace_id = api.workspace_of(who, sandbox_id)
    if not workspace_id:
        raise ApiError(
            409, "no_workspace", "this sandbox has no workspace (made without the workspace layer)"
        )
    workspaces = api.settings.workspace_store
    if workspaces is None:
        raise unsupported(
            "workspace_proof",
            "this control plane is not given the workspace store (serve --workspace-store)",
        )
    try:
        proof = workspaces.proof(workspace_id)
    except WorkspaceStoreError as exc:
        if not exc.missing:
            raise ApiError(503, "unavailable", str(exc)) from exc
        answer = WorkspaceProofOut(workspace_id=workspace_id, replicated_sequence=None, checked_at=utcnow())
    else:
        answer = WorkspaceProofOut(
            workspace_id=workspace_id,
            replicated_sequence=proof.replicated_sequence,
            checked_at=proof.checked_at,
        )
    return JSONResponse(answer.model_dump(mode="json"))


@router.get(
    "/sandboxes/{sandbox_id}/files",
    responses={
        200: {"description": "The file's bytes", "content": {"application/octet-stream": {}}},
        **error_responses(400, 401, 404, 409, 413, 503),
    },
    response_class=Response,
    summary="Read a file from the sandbox",
)
async def read_file(sandbox_id: str, who: Who, api: Api, path: FilePath) -> Response:
    path = file_path(path)
    limit = api.settings.max_file_bytes
    target = await run_in_threadpool(api.target, who, sandbox_id)
    if target.agent is not None:
        try:
            data = await agentclient.read_file(api.agent_http, target.agent, path, limit)
        except agentclient.AgentRefused as refused:
            raise agent_file_failure(refused, target, path, limit) from refused
        except agentclient.AgentError as exc:
            log.warning("the sandbox's agent does not answer (%s); using Kubernetes exec", exc)
        else:
            return Response(data, media_type="application/octet-stream")
    done = await run_in_threadpool(run_in_pod, api, target, ["cat", path], None)
    if done.status.exit_code != 0:
        raise file_failure(done, target, path)
    return Response(done.stdout, media_type="application/octet-stream")


@router.put(
    "/sandboxes/{sandbox_id}/files",
    response_model=FileWrittenOut,
    responses=error_responses(400, 401, 404, 409, 413, 503),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
    summary="Write a file in the sandbox (replacing it)",
)
async def write_file(sandbox_id: str, who: Who, api: Api, path: FilePath, request: Request) -> Response:
    path = file_path(path)
    limit = api.settings.max_file_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "too_large", f"files larger than {limit} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data.extend(chunk)
        if len(data) > limit:
            raise ApiError(413, "too_large", f"files larger than {limit} bytes")
    target = await run_in_threadpool(api.target, who, sandbox_id)
    if target.agent is not None:
        try:
            await agentclient.write_file(api.agent_http, target.agent, path, bytes(data))
        except agentclient.AgentRefused as refused:
            raise agent_file_failure(refused, target, path, limit) from refused
        except agentclient.AgentError as exc:
            log.warning("the sandbox's agent does not answer (%s); using Kubernetes exec", exc)
        else:
            return JSONResponse({"path": path, "size": len(data)})
    # head -c: exactly the bytes sent, whether or not the exec protocol can close stdin.
    command = ["sh", "-c", 'head -c "$2" > "$1"', "sh", path, str(len(data))]
    done = await run_in_threadpool(run_in_pod, api, target, command, bytes(data))
    if done.status.exit_code != 0:
        raise file_failure(done, target, path)
    return JSONResponse({"path": path, "size": len(data)})
