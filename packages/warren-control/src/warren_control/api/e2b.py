"""The E2B-compatible REST surface: the routes the official E2B SDK calls, on Warren's sandboxes.

A program written for E2B runs against Warren with `E2B_API_URL` naming the edge and
`E2B_API_KEY` holding a key Warren issued (`warren-control admin issue-key ORG USER --e2b`).
The edge authenticates it like any other request (the SDK sends `X-API-KEY`); these routes
then do what the /v1 routes do, through the same ApiService, with E2B's names and shapes:

- a sandbox's E2B id is its Warren id without the `sbx_` prefix (lower-case base32, so it
  fits in a host name: `{port}-{id}.{domain}`); the Warren id is accepted as well;
- `templateID` names a template the operator configured (`serve --template NAME=IMAGE`);
- `timeout` is the sandbox's end time from now, enforced by the reaper; `POST
  .../timeout` moves it, within the organization's longest lifetime;
- pause is Warren's stop: the workspace stays; where the deployment captures memory
  (`serve --memory-capture`) the processes' memory is kept too, as E2B's pause keeps it, and
  connect or resume restores them (`memory: false` asks for a filesystem pause). Where it
  does not, the processes end, and a request that asks for memory (`memory: true`) is refused
  as an unsupported capability;
- errors are E2B's `{"code": status, "message": text}`.

- `autoPause` (`lifecycle={"on_timeout": "pause"}`) pauses the sandbox at the end of its
  timeout instead of killing it (with its memory where the deployment captures it, or only
  its filesystem where the SDK asks for that); it then lives until its organization's
  longest lifetime, counted from its creation. `autoResume` resumes it when it is used
  (exec, files, its ports), as connect does.

Requests E2B's API accepts but this deployment cannot carry out exactly (a network policy,
MCP, IAM, volume mounts, turning internet access off, a memory auto-pause where memory is
not captured) are refused with 400 naming the field, never dropped in silence.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, unquote

from fastapi import APIRouter, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from warren_control import agentclient, ids, keys, store
from warren_control.api.errors import ApiError, ClusterError
from warren_control.api.params import Api, IdempotencyKey, Who
from warren_control.api.service import ApiService, restore_point
from warren_control.api.shapes import CreateSandboxRequest, WorkspaceRequest
from warren_control.identity import Identity
from warren_control.models import Sandbox, SandboxPhase, Snapshot, utcnow
from warren_control.observation import start_ended, start_report
from warren_control.podspec import sandbox_pod_name
from warren_control.scrub import scrub
from warren_control.templates import Template
from warren_control.workspaces import WorkspaceStoreError

# The envd protocol version Warren's agent speaks: the SDK turns features on by it.
log = logging.getLogger(__name__)
ENVD_VERSION = "0.6.4"
CLIENT_ID = "warren"
DEFAULT_TIMEOUT_S = 300  # E2B's default sandbox timeout
MAX_LIST = 100
_E2B_ID = re.compile(r"[a-z2-7]{26}")
_WARREN_PREFIX = "sbx_"

State = Literal["running", "paused"]


# --- ids and tokens ----------------------------------------------------------------------------


def e2b_id(sandbox_id: str) -> str:
    return sandbox_id.removeprefix(_WARREN_PREFIX)


def warren_id(sandbox_id: str) -> str:
    """The Warren id of an E2B id (or of a Warren id). Anything else maps to an id no
    record has, so it is simply not found."""
    if _E2B_ID.fullmatch(sandbox_id):
        return _WARREN_PREFIX + sandbox_id
    return sandbox_id


# --- requests ----------------------------------------------------------------------------------


class _Body(BaseModel):
    # E2B's bodies grow fields; what this surface does not know is ignored unless it asks for
    # something (see refuse_unsupported), so a newer SDK keeps working.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class NewSandbox(_Body):
    template_id: str = Field(alias="templateID", min_length=1, max_length=256)
    timeout: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars")
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    auto_resume: dict[str, Any] | None = Field(default=None, alias="autoResume")
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    mcp: dict[str, Any] | None = None
    iam: dict[str, Any] | None = None
    volume_mounts: list[Any] | None = Field(default=None, alias="volumeMounts")


class TimeoutBody(_Body):
    timeout: int = Field(ge=0)


class ConnectBody(_Body):
    timeout: int | None = Field(default=None, ge=1)
    memory: bool | None = None


class PauseBody(_Body):
    memory: bool | None = None


class SnapshotBody(_Body):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    memory: bool | None = None


class ForkBody(_Body):
    timeout: int | None = Field(default=None, ge=1)
    count: int = Field(default=1, ge=1, le=100)


class RefreshBody(_Body):
    duration: int | None = Field(default=None, ge=0)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")


def check_env(env: Mapping[str, str]) -> None:
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise ApiError(
                400,
                "invalid_request",
                f"envVars: {name[:64]!r} is not a variable name: letters, digits and _, not first a digit",
            )


def auto_resumes(body: NewSandbox) -> bool:
    return bool(body.auto_resume and body.auto_resume.get("enabled", True))


def lifecycle(body: NewSandbox, refused: str | None) -> dict[str, Any]:
    """What the end of the sandbox's timeout does (`on_end`: pause, with its memory where
    it can be captured (`refused` says why not) and the SDK did not ask for a filesystem
    one, or stop) and whether using it resumes it (`auto_resume`); nothing for E2B's
    default, a kill."""
    if not body.auto_pause:
        if auto_resumes(body):
            raise ApiError(400, "invalid_request", "autoResume needs autoPause: a killed one never resumes")
        return {}
    asked = (body.model_extra or {}).get("autoPauseMemory")
    if asked and refused is not None:
        raise ApiError(
            400,
            "unsupported_capability",
            f"autoPause: this sandbox's memory cannot be kept ({refused}); ask for a filesystem "
            'auto-pause: lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}',
        )
    memory = refused is None if asked is None else bool(asked)
    return {"on_end": "pause" if memory else "stop", "auto_resume": auto_resumes(body)}


def refuse_unsupported(body: NewSandbox) -> None:
    asked = {
        "allow_internet_access": body.allow_internet_access is False,
        "network": bool(body.network),
        "mcp": bool(body.mcp),
        "iam": bool(body.iam),
        "volumeMounts": bool(body.volume_mounts),
    }
    for field, wanted in asked.items():
        if wanted:
            raise ApiError(
                400,
                "unsupported_capability",
                f"{field} is not supported on this deployment yet: leave it out (a sandbox's "
                "egress is the platform's floor)",
            )


# --- responses ---------------------------------------------------------------------------------


def _state(record: Mapping[str, Any]) -> State:
    return "paused" if record["spec"].get("stopped") else "running"


def _size(record: Mapping[str, Any]) -> dict[str, int]:
    spec = record["spec"]
    workspace = spec.get("workspace") or {}
    return {
        "cpuCount": max(1, math.ceil(int(spec["cpu_millis"]) / 1000)),
        "memoryMB": int(spec["memory_mib"]),
        "diskSizeMB": int(workspace.get("size_gib") or 0) * 1024,
    }


class Shapes:
    """The /v1 record (ApiService.public) in E2B's shapes."""

    def __init__(self, stamp_key: bytes, domain: str | None) -> None:
        self.stamp_key = stamp_key
        self.domain = domain

    def sandbox(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """`Sandbox`: what create, connect and fork answer."""
        return {
            "templateID": record["spec"].get("template") or record["spec"]["image"],
            "sandboxID": e2b_id(record["id"]),
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": keys.agent_token(self.stamp_key, record["id"]),
            "domain": self.domain,
        }

    def listed(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """`ListedSandbox`."""
        return {
            "templateID": record["spec"].get("template") or record["spec"]["image"],
            "sandboxID": e2b_id(record["id"]),
            "clientID": CLIENT_ID,
            "startedAt": record["started_at"] or record["created_at"],
            "endAt": record["expires_at"],
            "state": _state(record),
            "envdVersion": ENVD_VERSION,
            "metadata": record["spec"].get("metadata") or {},
            **_size(record),
        }

    def detail(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """`SandboxDetail`: what get answers."""
        return {
            **self.listed(record),
            "envdAccessToken": keys.agent_token(self.stamp_key, record["id"]),
            "domain": self.domain,
        }

    @staticmethod
    def metric(sample: Mapping[str, Any]) -> dict[str, Any]:
        """`SandboxMetric`, from one of the agent's samples (envd's field names)."""
        ts = int(sample.get("ts") or 0)
        return {
            "timestamp": datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z"),
            "timestampUnix": ts,
            "cpuCount": int(sample.get("cpu_count") or 0),
            "cpuUsedPct": float(sample.get("cpu_used_pct") or 0.0),
            "memUsed": int(sample.get("mem_used") or 0),
            "memTotal": int(sample.get("mem_total") or 0),
            "memCache": int(sample.get("mem_cache") or 0),
            "diskUsed": int(sample.get("disk_used") or 0),
            "diskTotal": int(sample.get("disk_total") or 0),
        }


def shapes(api: ApiService) -> Shapes:
    """The E2B shapes of this deployment's records."""
    return Shapes(api.settings.stamp_key, api.settings.sandbox_domain)


# --- errors in E2B's shape ---------------------------------------------------------------------


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


class E2bRoute(APIRoute):
    """A route whose errors are E2B's `{code, message}`, not Warren's `{error, message}`.
    An organization out of quota gets 429, as E2B answers a team at its sandbox limit."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                status = 429 if exc.error == "quota_exceeded" else exc.status
                return _error(status, exc.message, exc.headers)
            except ClusterError:
                return _error(503, "the cluster is unavailable; retry later")
            except RequestValidationError as exc:
                parts = []
                for error in exc.errors()[:5]:
                    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
                    parts.append(
                        f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg"))
                    )
                return _error(400, "; ".join(parts) or "invalid request")

        return handle


# --- the routes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListQuery:
    """Which sandboxes a list asks for."""

    states: frozenset[State]
    metadata: dict[str, str]
    template: str | None = None
    started_after: datetime | None = None

    def matches(self, item: Sandbox) -> bool:
        if item.being_deleted or item.phase is SandboxPhase.FAILED:
            return False
        stopped = bool(item.spec.get("stopped"))
        if ("paused" if stopped else "running") not in self.states:
            return False
        kept = item.spec.get("metadata") or {}
        if any(kept.get(k) != v for k, v in self.metadata.items()):
            return False
        if self.template is not None and item.spec.get("template") != self.template:
            return False
        return self.started_after is None or (item.started_at or item.created_at) >= self.started_after


# Every route takes the stamped identity (Who), as the /v1 routes do, and the API's service (Api).
router = APIRouter(route_class=E2bRoute, include_in_schema=False)


def template(templates: Mapping[str, Template], name: str) -> Template:
    found = templates.get(name)
    if found is None:
        known = ", ".join(sorted(templates)) or "none"
        raise ApiError(
            404,
            "not_found",
            f"template {name[:64]!r} not found: this deployment's templates are {known}",
        )
    return found


def record(api: ApiService, who: Identity, sandbox_id: str) -> dict[str, Any]:
    with api.sessions.begin() as session:
        found = api.find(session, who, warren_id(sandbox_id))
        api.observe(session, found)
        gone = found.being_deleted
        answer = api.public(found)
    # Killed is gone, to E2B: its pod may still be stopping, the sandbox is no more.
    if gone:
        raise not_found(sandbox_id)
    return answer


def running(api: ApiService, who: Identity, sandbox_id: str) -> dict[str, Any]:
    """The sandbox once it runs (so its agent answers: a pod counts as running only after
    the hook that starts the agent), waiting at most the deployment's start wait. What
    counts is the Sandbox resource's own status, written by the controller for the
    resource's current generation: not a record that may not have caught up with a
    resume yet; it is followed through a watch, so the answer leaves as soon as the status
    is written. A sandbox that cannot start says why at once; one still starting after
    the wait is a 504 naming what it waits for, and keeps starting."""
    deadline = time.monotonic() + api.settings.start_wait_s
    while True:
        answer = record(api, who, sandbox_id)
        if api.settings.start_wait_s <= 0:
            return answer
        name = api.object_name(who, answer["id"])
        obj = api.cluster.read(name) or {}
        phase, reason, current = start_report(obj)
        if phase == SandboxPhase.RUNNING.value and current:
            return record(api, who, sandbox_id)
        meta = obj.get("metadata") or {}
        ready: dict[str, Any] = next(
            (c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {}
        )
        uid = str(meta.get("uid") or "-")
        names = (str(meta.get("name") or "-"), api.settings.namespace, sandbox_pod_name(obj), uid)
        shown = reason or (phase if current else "") or "Pending"
        why = scrub(f"{shown}: {ready.get('message') or 'starting'}", *names)
        if start_ended(obj):
            raise ApiError(500, "cannot_start", f"sandbox {e2b_id(answer['id'])} cannot start: {why}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise ApiError(
                504,
                "timeout",
                f"sandbox {e2b_id(answer['id'])} is not running after {api.settings.start_wait_s:.0f} s "
                f"({why}); it keeps starting: connect to it again",
                # The sandbox exists: a retry would make a second one.
                headers={"Should-Retry": "false"},
            )
        if meta.get("resourceVersion"):
            api.cluster.watch_start(name, obj, left)
        else:
            time.sleep(min(0.2, left))  # not in the cluster yet


def from_snapshot(api: ApiService, who: Identity, name: str) -> Snapshot | None:
    if name in api.settings.templates:
        return None  # an operator's template's name wins
    with api.sessions() as session:
        return store.find_snapshot(session, who.org, name)


def create(api: ApiService, body: NewSandbox, who: Identity, key: str | None, route: str) -> Response:
    refuse_unsupported(body)
    check_env(body.env_vars or {})
    env = dict(body.env_vars or {})
    snapshot = from_snapshot(api, who, body.template_id)
    if snapshot is not None:
        # The snapshot's workspace, on the source's image and size; its environment
        # under the one asked for now.
        kept = snapshot.spec
        env = {**(kept.get("env") or {}), **env}
        request = CreateSandboxRequest(
            image=kept["image"],
            cpu_millis=kept["cpu_millis"],
            memory_mib=kept["memory_mib"],
            workspace=WorkspaceRequest(size_gib=kept["size_gib"], template=snapshot.workspace_id),
        )
    else:
        chosen = template(api.settings.templates, body.template_id)
        request = CreateSandboxRequest(
            image=chosen.image, cpu_millis=chosen.cpu_millis, memory_mib=chosen.memory_mib
        )
    ends = lifecycle(body, api.capture_refusal(request.image))
    if ends:
        api.need_workspaces("autoPause (the workspace outlives the processes)")
        with api.sessions() as session:
            ends["lifetime_cap_s"] = api.org_and_user(session, who)[0].max_lifetime_s
    extra = {
        "template": body.template_id,
        "metadata": dict(body.metadata or {}),
        "env": env,
        "max_lifetime_s": body.timeout or DEFAULT_TIMEOUT_S,
        **ends,
    }
    _, answer, _ = api.create(who, request, key, route=route, extra=extra)
    return JSONResponse(shapes(api).sandbox(running(api, who, answer["id"])), status_code=201)


@router.post("/sandboxes", status_code=201)
def create_v1(body: NewSandbox, who: Who, api: Api, key: IdempotencyKey = None) -> Response:
    return create(api, body, who, key, "/sandboxes")


@router.post("/v2/sandboxes", status_code=201)
def create_v2(body: NewSandbox, who: Who, api: Api, key: IdempotencyKey = None) -> Response:
    return create(api, body, who, key, "/v2/sandboxes")


@router.get("/sandboxes/{sandbox_id}")
def get(sandbox_id: str, who: Who, api: Api) -> Response:
    return JSONResponse(shapes(api).detail(record(api, who, sandbox_id)))


def matching(
    api: ApiService, who: Identity, query: ListQuery, *, descending: bool, limit: int, token: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Up to `limit` of the organization's sandboxes that match, and the token that
    continues after the last one returned (None when no more remain)."""
    found: list[dict[str, Any]] = []
    cursor = token
    while True:
        with api.sessions.begin() as session:
            try:
                page = store.list_sandboxes(
                    session, who.org, limit=store.MAX_PAGE, cursor=cursor, descending=descending
                )
            except store.InvalidCursorError as exc:
                raise ApiError(400, "invalid_request", f"nextToken: {exc}") from exc
            api.observe_page(session, who.org, page.items)
            for item in page.items:
                if query.matches(item):
                    found.append(api.public(item))
                    if len(found) == limit:
                        return found, store.cursor_after(item)
        if page.next_cursor is None:
            return found, None
        cursor = page.next_cursor


def metadata_filter(text: str | None) -> dict[str, str]:
    # The SDK percent-encodes each key and value, then URL-encodes the pairs.
    return {unquote(k): unquote(v) for k, v in parse_qsl(text or "", keep_blank_values=True)}


@router.get("/sandboxes")
def list_v1(who: Who, api: Api, metadata: Annotated[str | None, Query(max_length=4096)] = None) -> Response:
    query = ListQuery(states=frozenset({"running"}), metadata=metadata_filter(metadata))
    items, _ = matching(api, who, query, descending=False, limit=10_000, token=None)
    listed = shapes(api).listed
    return JSONResponse([listed(i) for i in items])


@router.get("/v2/sandboxes")
def list_v2(
    who: Who,
    api: Api,
    *,
    metadata: Annotated[str | None, Query(max_length=4096)] = None,
    state: Annotated[str | None, Query(max_length=64)] = None,
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    started_after: Annotated[datetime | None, Query(alias="startedAfter")] = None,
    template_name: Annotated[str | None, Query(alias="template", max_length=256)] = None,
    next_token: Annotated[str | None, Query(alias="nextToken", max_length=512)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = MAX_LIST,
) -> Response:
    states: frozenset[State] = frozenset(("running", "paused"))
    if state:
        asked = {s.strip() for s in state.split(",") if s.strip()}
        unknown = asked - states
        if unknown:
            raise ApiError(400, "invalid_request", f"state: {sorted(unknown)} unknown; give running, paused")
        states = frozenset(s for s in states if s in asked)
    if started_after is not None and started_after.tzinfo is None:
        raise ApiError(400, "invalid_request", "startedAfter: give a time with its zone (RFC 3339)")
    query = ListQuery(states, metadata_filter(metadata), template_name, started_after)
    items, token = matching(api, who, query, descending=order == "desc", limit=limit, token=next_token)
    headers = {"X-Next-Token": token} if token else {}
    listed = shapes(api).listed
    return JSONResponse([listed(i) for i in items], headers=headers)


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
def kill(sandbox_id: str, who: Who, api: Api) -> Response:
    record(api, who, sandbox_id)  # 404 for one that is gone already
    api.delete(who, warren_id(sandbox_id))
    return Response(status_code=204)


def set_end(
    api: ApiService, who: Identity, sandbox_id: str, seconds: int, *, only_later: bool = False
) -> None:
    """End the sandbox `seconds` from now (with `only_later`, unless it ends later already),
    within its organization's longest lifetime."""
    with api.sessions.begin() as session:
        found = api.find(session, who, warren_id(sandbox_id))
        if found.phase is SandboxPhase.DELETED:
            raise not_found(sandbox_id)
        org, _ = api.org_and_user(session, who)
        end = utcnow() + timedelta(seconds=seconds)
        latest = found.created_at + timedelta(seconds=org.max_lifetime_s)
        if end > latest:
            raise ApiError(
                400,
                "invalid_request",
                f"timeout: this sandbox may live until {latest.isoformat()} at most "
                f"(the organization's longest lifetime is {org.max_lifetime_s} s)",
            )
        if not only_later or end > found.expires_at:
            found.expires_at = end
            found.touch()


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
def set_timeout(sandbox_id: str, body: TimeoutBody, who: Who, api: Api) -> Response:
    set_end(api, who, sandbox_id, body.timeout)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
def refresh(sandbox_id: str, who: Who, api: Api, body: RefreshBody | None = None) -> Response:
    duration = body.duration if body is not None and body.duration is not None else DEFAULT_TIMEOUT_S
    set_end(api, who, sandbox_id, duration, only_later=True)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
def pause(sandbox_id: str, who: Who, api: Api, body: PauseBody | None = None) -> Response:
    asked = body.memory if body is not None else None
    answer = record(api, who, sandbox_id)
    refused = api.capture_refusal(answer["spec"]["image"])
    if asked and refused is not None:
        raise ApiError(
            400,
            "unsupported_capability",
            f"memory: this sandbox's memory cannot be kept ({refused}); pause with "
            'mode="filesystem" (memory false, or left out): the filesystem stays, processes end',
        )
    if _state(answer) == "paused":
        raise ApiError(409, "conflict", f"sandbox {sandbox_id} is already paused")
    api.need_workspaces("pausing (only the workspace outlives the processes)")
    # E2B's pause keeps memory: so does Warren's where it can, unless asked not to.
    memory = refused is None if asked is None else asked
    api.set_stopped(who, warren_id(sandbox_id), True, memory=memory)
    return Response(status_code=204)


def connect(api: ApiService, sandbox_id: str, who: Identity, body: ConnectBody | None) -> Response:
    answer = record(api, who, sandbox_id)
    timeout = body.timeout if body is not None and body.timeout is not None else DEFAULT_TIMEOUT_S
    if _state(answer) == "running":
        set_end(api, who, sandbox_id, timeout, only_later=True)
        return JSONResponse(shapes(api).sandbox(answer), status_code=200)
    set_end(api, who, sandbox_id, timeout)
    # on_resume="reboot" (memory false): start afresh from the files, not from the memory.
    cold = body is not None and body.memory is False
    api.set_stopped(who, warren_id(sandbox_id), False, cold=cold)
    return JSONResponse(shapes(api).sandbox(running(api, who, answer["id"])), status_code=201)


@router.post("/sandboxes/{sandbox_id}/connect")
def connect_v1(sandbox_id: str, who: Who, api: Api, body: ConnectBody | None = None) -> Response:
    return connect(api, sandbox_id, who, body)


@router.post("/v2/sandboxes/{sandbox_id}/connect")
def connect_v2(sandbox_id: str, who: Who, api: Api, body: ConnectBody | None = None) -> Response:
    return connect(api, sandbox_id, who, body)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
def resume(sandbox_id: str, who: Who, api: Api, body: ConnectBody | None = None) -> Response:
    if _state(record(api, who, sandbox_id)) == "running":
        raise ApiError(409, "conflict", f"sandbox {sandbox_id} is already running")
    return connect(api, sandbox_id, who, body)


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics(
    sandbox_id: str,
    who: Who,
    api: Api,
    start: Annotated[int | None, Query(ge=0)] = None,
    end: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """The samples the sandbox's agent keeps (every 5 s, the last hour of its current
    run): a paused sandbox, or one whose pod has no agent, has none."""
    answer = await run_in_threadpool(record, api, who, sandbox_id)
    if _state(answer) == "paused":
        return JSONResponse([])
    try:
        _, _, pod = await run_in_threadpool(api.running_pod, api.object_name(who, answer["id"]))
    except ApiError:
        return JSONResponse([])  # not running yet: nothing measured
    agent = api.agent_in(pod, answer["id"])
    if agent is None:
        return JSONResponse([])
    try:
        samples = await agentclient.metrics(api.agent_http, agent, start, end)
    except agentclient.AgentError as exc:
        log.warning("metrics of %s: %s", answer["id"], exc)
        raise ApiError(502, "unavailable", f"sandbox {sandbox_id}'s agent does not answer; retry") from exc
    return JSONResponse([Shapes.metric(s) for s in samples])


def stopped(api: ApiService, who: Identity, sandbox_id: str) -> None:
    """Wait until the sandbox's pod is gone (its workspace unmounted, so all of it is in
    storage), at most the deployment's start wait."""
    deadline = time.monotonic() + api.settings.start_wait_s
    while api.settings.start_wait_s > 0:
        obj = api.cluster.read(api.object_name(who, sandbox_id)) or {}
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        current = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
        if not obj or (status.get("phase") == SandboxPhase.STOPPED.value and current):
            return
        if time.monotonic() >= deadline:
            raise ApiError(
                504,
                "timeout",
                f"sandbox {e2b_id(sandbox_id)} did not stop within {api.settings.start_wait_s:.0f} s "
                "for its snapshot; it stays paused: connect to it to resume it",
                headers={"Should-Retry": "false"},
            )
        time.sleep(0.2)


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
def snapshot(sandbox_id: str, who: Who, api: Api, body: SnapshotBody | None = None) -> Response:
    """The sandbox's workspace as it stands, kept to start new sandboxes from. A running
    sandbox is paused for it (its writes all reach storage) and resumed after: with its
    memory where that can be captured, so its processes carry on; otherwise they restart."""
    body = body or SnapshotBody()
    if body.memory:
        raise ApiError(
            400,
            "unsupported_capability",
            'memory: this deployment cannot keep a sandbox\'s memory yet; snapshot with mode="filesystem"',
        )
    api.need_workspaces("a snapshot (it is of the workspace)")
    workspaces = api.settings.workspace_store
    if workspaces is None:
        raise ApiError(
            400,
            "unsupported_capability",
            "snapshots need the workspace store, which this control plane is not given",
        )
    api.workspace_of(who, warren_id(sandbox_id))  # a pooled sandbox's is bound when it starts
    answer = record(api, who, sandbox_id)
    if not answer.get("workspace_id"):
        raise ApiError(409, "conflict", f"sandbox {sandbox_id} has no workspace to snapshot")
    was_running = _state(answer) == "running"
    if was_running:
        keeps_memory = api.capture_refusal(answer["spec"]["image"]) is None
        api.set_stopped(who, answer["id"], True, memory=keeps_memory)
    copy_id = ids.new_workspace_id()
    try:
        if was_running:
            stopped(api, who, answer["id"])
        workspaces.copy(answer["workspace_id"], copy_id)
    except WorkspaceStoreError as exc:
        if exc.missing:
            raise ApiError(409, "conflict", f"sandbox {sandbox_id} has nothing in storage yet") from exc
        raise ApiError(503, "unavailable", f"the workspace store: {exc}") from exc
    finally:
        if was_running:
            api.set_stopped(who, answer["id"], False)
    spec = answer["spec"]
    kept = {
        "image": spec["image"],
        "cpu_millis": spec["cpu_millis"],
        "memory_mib": spec["memory_mib"],
        "size_gib": (spec.get("workspace") or {}).get("size_gib", 10),
        "env": spec.get("env") or {},
    }
    with api.sessions.begin() as session:
        source = api.find(session, who, answer["id"])
        made = store.create_snapshot(session, source, copy_id, body.name, kept)
        snapshot_id, names = made.id, [made.name] if made.name else []
    if was_running:
        running(api, who, answer["id"])
    return JSONResponse({"snapshotID": snapshot_id, "names": names}, status_code=201)


@router.get("/snapshots")
def list_snapshots(
    who: Who,
    api: Api,
    *,
    sandbox: Annotated[str | None, Query(alias="sandboxID", max_length=64)] = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = MAX_LIST,
    next_token: Annotated[str | None, Query(alias="nextToken", max_length=512)] = None,
) -> Response:
    with api.sessions() as session:
        try:
            items, token = store.list_snapshots(
                session,
                who.org,
                sandbox_id=warren_id(sandbox) if sandbox else None,
                name=name,
                limit=limit,
                cursor=next_token,
            )
        except store.InvalidCursorError as exc:
            raise ApiError(400, "invalid_request", f"nextToken: {exc}") from exc
        found = [{"snapshotID": i.id, "names": [i.name] if i.name else []} for i in items]
    return JSONResponse(found, headers={"X-Next-Token": token} if token else {})


@router.delete("/templates/{template_id}", status_code=204)
def delete_snapshot(template_id: str, who: Who, api: Api) -> Response:
    """A snapshot goes (sandboxes made from it keep what they stand on)."""
    with api.sessions() as session:
        found = session.get(Snapshot, template_id)
        if found is None or found.org_id != who.org:
            raise ApiError(404, "not_found", f"snapshot {template_id[:64]!r} not found")
        workspace_id = found.workspace_id
    if api.settings.workspace_store is not None:
        try:
            api.settings.workspace_store.release(workspace_id)
        except WorkspaceStoreError as exc:
            raise ApiError(503, "unavailable", f"the workspace store: {exc}; retry") from exc
    with api.sessions.begin() as session:
        found = session.get(Snapshot, template_id)
        if found is not None:
            session.delete(found)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
def fork(
    sandbox_id: str,
    who: Who,
    api: Api,
    body: ForkBody | None = None,
    key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)] = None,
) -> Response:
    """E2B's fork keeps memory: a running sandbox whose memory can be captured is paused with
    it until its image is a restore point, each child is restored from that image, and the
    sandbox resumes from it (it keeps its id and timeout). Otherwise the children start the
    command afresh on forks of its workspace."""
    body = body or ForkBody()
    parent = record(api, who, sandbox_id)
    held = (
        _state(parent) == "running"
        and api.settings.start_wait_s > 0  # a deployment that waits for nothing cannot wait for the image
        and api.capture_refusal(parent["spec"]["image"]) is None
        and not api.answered(who, key)  # a retry replays the first answer: no new pause
        and held_with_memory(api, who, parent["id"])
    )
    try:
        _, answer, _ = api.fork(
            who,
            warren_id(sandbox_id),
            body.count,
            key,
            route=f"/sandboxes/{sandbox_id}/fork",
            lifetime_s=body.timeout or DEFAULT_TIMEOUT_S,
        )
    finally:
        if held:
            api.set_stopped(who, parent["id"], False)
    results: list[dict[str, Any]] = []
    for result in answer["results"]:
        if result["ok"]:
            try:
                child = running(api, who, result["sandbox"]["id"])
            except ApiError as exc:
                results.append({"error": {"code": exc.status, "message": exc.message}})
                continue
            results.append({"sandbox": shapes(api).sandbox(child)})
        else:
            code = (
                429 if result["error"] == "quota_exceeded" else 400 if result["error"] == "forbidden" else 503
            )
            results.append({"error": {"code": code, "message": result["message"]}})
    if held:
        running(api, who, parent["id"])
    return JSONResponse(results, status_code=201)


def held_with_memory(api: ApiService, who: Identity, sandbox_id: str) -> bool:
    """Pause a running sandbox with its memory until its image is a restore point (proved by
    a restore), at most the deployment's start wait: whether it became one. If not (the
    capture failed, the image did not restore, or the wait ran out), it is started again."""
    api.set_stopped(who, sandbox_id, True, memory=True)
    name = api.object_name(who, sandbox_id)
    deadline = time.monotonic() + api.settings.start_wait_s
    why = f"not a restore point within {api.settings.start_wait_s:.0f} s"
    while time.monotonic() < deadline:
        obj = api.cluster.read(name) or {}
        if restore_point(obj) is not None:
            return True
        image = (obj.get("status") or {}).get("memoryImage") or {}
        if image.get("unrestorable"):
            why = f"its memory image did not restore: {image['unrestorable']}"
            break
        if image.get("error"):
            why = f"capturing its memory failed: {image['error']}"
            break
        time.sleep(0.2)
    log.warning("forking %s without its memory: %s", sandbox_id, why)
    # An image that did not restore cannot be resumed from: the sandbox starts afresh.
    api.set_stopped(who, sandbox_id, False, cold=why.startswith("its memory image did not restore"))
    return False


def not_found(sandbox_id: str) -> ApiError:
    return ApiError(404, "not_found", f"sandbox {sandbox_id[:64]!r} not found")
