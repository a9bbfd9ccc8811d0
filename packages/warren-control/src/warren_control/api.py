"""The API: sandboxes as the product sees them, behind the edge's identity stamp.

Every /v1 route depends on a verified stamp (identity.require_identity) and reads or writes
only inside the stamped organization: a sandbox id of another organization is simply not
found, exactly like an id nobody ever had. Records live in the database (store.py); the
cluster holds one Sandbox resource per live sandbox, named by the record's internal object
name, which no response ever shows (nor a pod, container, namespace or node name).

A request the deployment cannot carry out exactly is refused with 400
``unsupported_capability`` naming what is missing, never weakened in silence: a GPU where
there is none, memory capture where it is off, a runtime other than gVisor, and anything
that needs a workspace (size or template, fork, stop) where the deployment has no workspace
layer.

Errors are ``{"error": code, "message": text}``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

import anyio
import urllib3
from fastapi import APIRouter, Body, Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import HTTPException as StarletteHTTPException

from warren_control import agentclient, ids, keys, store
from warren_control.db import make_engine, session_factory
from warren_control.identity import EDGE, Identity, add_identity_error_handler, require_identity
from warren_control.kube import ApiException, Kube, Obj, error_message
from warren_control.models import (
    IdempotencyRecord,
    Organization,
    Sandbox,
    SandboxPhase,
    Snapshot,
    User,
    utcnow,
)
from warren_control.observation import converge, scrub
from warren_control.podspec import (
    AGENT_CONTAINER,
    FINALIZER,
    GROUP,
    KIND,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLURAL,
    VERSION,
    pod_name,
)
from warren_control.templates import Template
from warren_control.workspaces import DEFAULT_RETENTION_S, WorkspaceStore

log = logging.getLogger(__name__)

API_VERSION = "0.1.0"
DESCRIPTION = """Sandboxes on Warren: gVisor pods with a workspace, behind one authenticating edge.

Send `Authorization: Bearer <API key or OIDC token>` to the edge. Sandbox ids are opaque and
organization-scoped: another organization's id is not found. Errors are
`{"error": code, "message": text}`; a request this deployment cannot carry out exactly is
refused with `unsupported_capability` naming the capability."""
DEFAULT_NAMESPACE = "warren-sandboxes"
RUNTIME = "gvisor"
# The label that says which organization a Sandbox resource belongs to: a digest of the
# organization's id, so the cluster (and whoever reads it) learns neither id nor name.
ORG_LABEL = "warren.dev/org-hash"
MAX_FORK = 100
MAX_EXEC_TIMEOUT_S = 3600
FILE_TIMEOUT_S = 120
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024

_SCHEMAS = "#/components/schemas/"
_SANDBOX_ID = re.compile(r"sbx_[a-z2-7]{26}")
_WORKSPACE_ID = r"^ws_[a-z2-7]{26}$"


# --- settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiSettings:
    """What one API deployment is: its records, its stamp key, its cluster and what it can do.

    `kube` is a connected client; without one, `kubeconfig` names a kubeconfig file, and
    without that the pod's service account is used (connected on first use, so building
    the app, e.g. to print the OpenAPI document, needs no cluster).
    """

    database_url: str
    stamp_key: bytes
    kube: Kube | None = None
    kubeconfig: str | None = None
    namespace: str = DEFAULT_NAMESPACE
    gpu_available: bool = False
    memory_capture: bool = False
    # The workspace layer (warren-blockd): without it nothing outlives a pod, so sizes,
    # templates, forks and stops are refused rather than pretended.
    workspaces: bool = False
    # The bucket the nodes' blockd replicate to: what it holds is what a node loss spares.
    workspace_store: WorkspaceStore | None = None
    # How long a deleted sandbox's workspace stays in storage, still usable as a template.
    workspace_retention_s: float = DEFAULT_RETENTION_S
    # Reads converge the record from the Sandbox resource's status (what the controller
    # observed), so a reader sees what runs even where no status mirror is deployed.
    read_through: bool = True
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    engine_options: dict[str, Any] | None = None
    # What the E2B surface's templateID names (e2b.py), and the domain its sandboxes' hosts
    # are under ({port}-{id}.{domain}; None: the client's own E2B_DOMAIN).
    templates: Mapping[str, Template] = field(default_factory=dict)
    sandbox_domain: str | None = None
    # How long an E2B create, connect or fork waits for its sandboxes to run before it answers
    # (E2B's SDK uses a sandbox as soon as it has one); 0 answers at once.
    start_wait_s: float = 50.0


# --- errors ------------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": self.error, "message": self.message}, status_code=self.status, headers=self.headers
        )


def not_found(sandbox_id: str) -> ApiError:
    # The same answer for an id that never existed and for another organization's.
    return ApiError(404, "not_found", f"no sandbox {sandbox_id[:64]!r}")


def unsupported(capability: str, why: str) -> ApiError:
    return ApiError(400, "unsupported_capability", f"{capability}: {why}")


class ClusterError(Exception):
    """The cluster refused or could not be reached; `status` is the API server's, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# --- request and response shapes ---------------------------------------------------------------


def _utf8(value: str) -> str:
    # A lone surrogate survives JSON decoding but no database or exec call can carry it.
    value.encode("utf-8")
    if "\x00" in value:
        raise ValueError("must not contain NUL")
    return value


Text = Annotated[str, AfterValidator(_utf8)]
Arg = Annotated[Text, Field(max_length=8192)]


class Strict(BaseModel):
    # Unknown fields are refused: a misspelt option must not be silently dropped.
    model_config = ConfigDict(extra="forbid", strict=True)


class WorkspaceRequest(Strict):
    size_gib: int = Field(default=10, ge=1, le=4096, description="Size of the workspace in GiB.")
    template: str | None = Field(
        default=None,
        pattern=_WORKSPACE_ID,
        description="A workspace of this organization (a sandbox's workspace_id) to start from.",
    )


class CreateSandboxRequest(Strict):
    image: str = Field(
        min_length=1, max_length=512, pattern=r"^[\x21-\x7e]+$", description="OCI image reference."
    )
    command: list[Arg] | None = Field(default=None, min_length=1, max_length=256)
    cpu_millis: int = Field(default=1000, ge=10, le=256_000, description="CPU in thousandths of a core.")
    memory_mib: int = Field(default=1024, ge=64, le=1_048_576, description="Memory in MiB.")
    persistent: bool = Field(default=False, description="Exempt from the idle timeout (if the org may).")
    idle_timeout_s: int | None = Field(
        default=None, ge=60, description="Stop after this long without activity (the org's limit at most)."
    )
    max_lifetime_s: int | None = Field(
        default=None, ge=60, description="Delete this long after creation (the org's limit at most)."
    )
    workspace: WorkspaceRequest | None = None
    runtime: Text = Field(default=RUNTIME, max_length=64, description="Only gvisor.")
    gpu: int = Field(default=0, ge=0, le=64, description="GPUs; refused where the deployment has none.")
    memory_capture: bool = Field(
        default=False, description="Capture memory on stop; refused where the deployment cannot."
    )


class ForkRequest(Strict):
    count: int = Field(default=1, ge=1, le=MAX_FORK)


class StopRequest(Strict):
    memory_capture: bool = False


class ExecRequest(Strict):
    command: list[Arg] = Field(min_length=1, max_length=256)
    timeout_s: int = Field(default=60, ge=1, le=MAX_EXEC_TIMEOUT_S)
    stdin_base64: str | None = Field(
        default=None,
        description="Bytes for the command's standard input (base64), closed after them; "
        "without it the command's stdin is empty.",
    )


Phase = Literal["Pending", "Running", "Stopped", "Failed", "Terminating", "Deleted"]


class ErrorOut(BaseModel):
    error: str
    message: str


class WorkspaceOut(BaseModel):
    size_gib: int
    template: str | None = None
    fork_of: str | None = None


class SpecOut(BaseModel):
    image: str
    command: list[str] | None = None
    cpu_millis: int
    memory_mib: int
    persistent: bool
    idle_timeout_s: int
    max_lifetime_s: int
    runtime: str
    stopped: bool = False
    workspace: WorkspaceOut | None = None
    forked_from: str | None = None


class ConditionOut(BaseModel):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class LocationOut(BaseModel):
    """Where the sandbox runs, as coarse as the cluster's topology labels: never a node."""

    zone: str | None = None
    region: str | None = None


class SandboxOut(BaseModel):
    id: str
    phase: Phase
    spec: SpecOut
    conditions: list[ConditionOut]
    workspace_id: str | None
    created_at: datetime
    started_at: datetime | None
    last_activity_at: datetime
    idle_deadline_at: datetime | None = Field(
        description="When the reaper acts if nothing happens: deletes it, or stops a persistent one"
    )
    expires_at: datetime = Field(description="The hard lifetime: the reaper deletes it then")
    deleted_at: datetime | None
    location: LocationOut | None


class PageOut(BaseModel):
    items: list[SandboxOut]
    next_cursor: str | None


class ForkResultOut(BaseModel):
    ok: bool
    sandbox: SandboxOut | None = None
    error: str | None = None
    message: str | None = None


class ForkOut(BaseModel):
    results: list[ForkResultOut]


class WorkspaceProofOut(BaseModel):
    """What object storage proves about a sandbox's workspace, read from storage now."""

    workspace_id: str
    replicated_sequence: int | None = Field(
        description=(
            "The newest batch of workspace writes confirmed in object storage (a `replicated` "
            "receipt names such a number; 0: none since the workspace was made or forked; null: "
            "the workspace is not in storage yet). Every write at or below it survives the loss "
            "of the node the sandbox runs on."
        )
    )
    checked_at: datetime


class FileWrittenOut(BaseModel):
    path: str
    size: int


class ExecEventOut(BaseModel):
    """One line of an exec stream: output (`stream` with `text`, or `base64` for bytes that
    are not UTF-8), then one last line with `exit_code` (null with `error` if the command
    could not run, timed out or the connection was lost)."""

    stream: Literal["stdout", "stderr"] | None = None
    text: str | None = None
    base64: str | None = None
    exit_code: int | None = None
    error: str | None = None
    message: str | None = None


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    described = {
        400: "Invalid request, or a capability this deployment cannot provide",
        401: "Missing or invalid identity",
        403: "Forbidden by policy or quota",
        404: "No such sandbox in this organization",
        409: "The sandbox is not in a state that allows this",
        413: "Too large",
        422: "Idempotency key reused with a different request",
        503: "The cluster is unavailable",
    }
    return {code: {"model": ErrorOut, "description": described[code]} for code in codes}


# --- the cluster side --------------------------------------------------------------------------


class Cluster:
    """The Sandbox resources and pods of one namespace, through kube.Kube."""

    def __init__(self, settings: ApiSettings) -> None:
        self.namespace = settings.namespace
        self._kube = settings.kube
        self._kubeconfig = settings.kubeconfig
        self._lock = threading.Lock()

    @property
    def kube(self) -> Kube:
        with self._lock:
            if self._kube is None:
                self._kube = Kube.connect(self._kubeconfig)
            return self._kube

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except ApiException as exc:
            raise ClusterError(f"{what}: {error_message(exc)}", exc.status) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterError(f"{what}: {exc}") from exc

    def _path(self, name: str | None = None) -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}"
        return f"{path}/{name}" if name else path

    def create(self, body: Obj) -> Obj:
        result: Obj = self._call("create", lambda: self.kube.create_sandbox(self.namespace, body))
        return result

    def read(self, name: str) -> Obj | None:
        result: Obj | None = self._call("read", lambda: self.kube.read_sandbox(self.namespace, name))
        return result

    def list_org(self, org_hash: str) -> list[Obj]:
        query = {"labelSelector": f"{ORG_LABEL}={org_hash}"}
        result: Obj = self._call("list", lambda: self.kube.request("GET", self._path(), query=query))
        items: list[Obj] = result.get("items") or []
        return items

    def patch(self, name: str, patch: Obj) -> Obj | None:
        try:
            result: Obj = self._call("update", lambda: self.kube.patch_sandbox(self.namespace, name, patch))
        except ClusterError as exc:
            if exc.status == 404:  # noqa: PLR2004
                return None
            raise
        return result

    def delete(self, name: str) -> bool:
        deleted: bool = self._call("delete", lambda: self.kube.delete_sandbox(self.namespace, name))
        return deleted

    def read_pod(self, name: str) -> Obj | None:
        result: Obj | None = self._call("read pod", lambda: self.kube.read_pod(self.namespace, name))
        return result


def check_lifetime(org: Organization, seconds: int) -> None:
    if seconds > org.max_lifetime_s:
        limit = org.max_lifetime_s
        raise ApiError(403, "forbidden", f"a lifetime may be at most {limit} s in this organization")


def org_hash(org_id: str) -> str:
    return hashlib.sha256(org_id.encode()).hexdigest()[:32]


def _resource(record: Sandbox, namespace: str, stamp_key: bytes) -> Obj:
    spec = record.spec
    body: Obj = {
        "image": spec["image"],
        "resources": {"cpu": f"{spec['cpu_millis']}m", "memory": f"{spec['memory_mib']}Mi"},
        "persistent": bool(spec.get("persistent")),
        "idleTimeoutSeconds": spec["idle_timeout_s"],
        "maxLifetimeSeconds": spec["max_lifetime_s"],
        "stopped": bool(spec.get("stopped")),
    }
    if spec.get("command"):
        body["command"] = list(spec["command"])
    if spec.get("env"):
        body["env"] = dict(spec["env"])
    body["agentTokenSha256"] = keys.agent_token_sha256(stamp_key, record.id)
    workspace = spec.get("workspace")
    if workspace:
        body["workspace"] = {"id": record.workspace_id or "", "size": f"{workspace['size_gib']}Gi"}
        source = workspace.get("fork_of") or workspace.get("template")
        if source:
            body["workspace"]["forkOf"] = source
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": record.object_name,
            "namespace": namespace,
            "labels": {ORG_LABEL: org_hash(record.org_id), MANAGED_BY_LABEL: MANAGED_BY},
            "finalizers": [FINALIZER],
        },
        "spec": body,
    }


# --- exec output -------------------------------------------------------------------------------


# --- the app -----------------------------------------------------------------------------------


@dataclass
class _Target:
    pod: str
    names: tuple[str, ...]
    # The sandbox's agent, when its pod has one: exec and files go through it, and through
    # Kubernetes exec only where there is none (a pod made before the agent, or without it).
    agent: agentclient.Agent | None = None


class ApiService:
    """What the routes do, apart from HTTP: Warren's own /v1 routes and the E2B-compatible
    ones (e2b.py) share it."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        options = settings.engine_options
        if options is None:
            options = {"pool_size": 20, "max_overflow": 20}
        self.engine = make_engine(settings.database_url, **options)
        self.sessions: sessionmaker[Session] = session_factory(self.engine)
        self.cluster = Cluster(settings)
        # Exec streams poll their websockets from worker threads of their own, so a
        # hundred long-running commands cannot starve the ordinary requests' thread pool.
        self.exec_threads = anyio.CapacityLimiter(256)
        self.agent_http = agentclient.client()

    # ---- records

    @staticmethod
    def org_and_user(session: Session, who: Identity) -> tuple[Organization, User]:
        org = store.get_org(session, who.org)
        if org is None:
            raise ApiError(403, "forbidden", "the organization of this identity does not exist")
        user = store.get_user(session, org.id, who.user) or store.ensure_user(session, org.id, who.user)
        return org, user

    @staticmethod
    def find(session: Session, who: Identity, sandbox_id: str) -> Sandbox:
        if not _SANDBOX_ID.fullmatch(sandbox_id):
            raise not_found(sandbox_id)
        record = store.get_sandbox(session, who.org, sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        return record

    def public(self, record: Sandbox) -> dict[str, Any]:
        out = record.public()
        names = (record.object_name, self.settings.namespace)
        out["conditions"] = [
            {
                **condition,
                "reason": scrub(str(condition.get("reason") or ""), *names),
                "message": scrub(str(condition.get("message") or ""), *names),
            }
            for condition in out.get("conditions") or []
        ]
        return out

    def observe(self, session: Session, record: Sandbox) -> None:
        if not self.settings.read_through:
            return
        try:
            obj = self.cluster.read(record.object_name)
        except ClusterError as exc:
            log.warning("cannot read the cluster, answering from the records: %s", exc)
            return
        converge(session, record, obj, self.settings.namespace)

    def observe_page(self, session: Session, org_id: str, records: list[Sandbox]) -> None:
        if not self.settings.read_through or not records:
            return
        try:
            objects = {o["metadata"]["name"]: o for o in self.cluster.list_org(org_hash(org_id))}
        except ClusterError as exc:
            log.warning("cannot list the cluster, answering from the records: %s", exc)
            return
        for record in records:
            converge(session, record, objects.get(record.object_name), self.settings.namespace)

    def check_capabilities(self, body: CreateSandboxRequest) -> None:
        if body.runtime != RUNTIME:
            raise unsupported(
                f"runtime {body.runtime[:64]!r}", f"sandboxes run only under {RUNTIME} on this deployment"
            )
        if body.gpu:
            if not self.settings.gpu_available:
                raise unsupported("gpu", "this deployment has no GPUs")
            raise unsupported("gpu", "this version of the controller cannot attach GPUs to a sandbox")
        if body.memory_capture:
            if not self.settings.memory_capture:
                raise unsupported("memory_capture", "memory capture is off on this deployment")
            raise unsupported("memory_capture", "this version cannot capture a gVisor sandbox's memory")
        if body.workspace is not None:
            self.need_workspaces("a workspace size or template")

    def need_workspaces(self, what: str) -> None:
        if not self.settings.workspaces:
            raise unsupported(
                "workspaces", f"{what} needs the workspace layer, which this deployment does not have"
            )

    def spec(self, body: CreateSandboxRequest, org: Organization) -> dict[str, Any]:
        idle = body.idle_timeout_s or org.idle_timeout_s
        lifetime = body.max_lifetime_s or org.max_lifetime_s
        if idle > org.idle_timeout_s:
            raise ApiError(
                403, "forbidden", f"idle_timeout_s may be at most {org.idle_timeout_s} in this organization"
            )
        if lifetime > org.max_lifetime_s:
            raise ApiError(
                403, "forbidden", f"max_lifetime_s may be at most {org.max_lifetime_s} in this organization"
            )
        spec: dict[str, Any] = {
            "image": body.image,
            "command": list(body.command) if body.command else None,
            "cpu_millis": body.cpu_millis,
            "memory_mib": body.memory_mib,
            "persistent": body.persistent,
            "idle_timeout_s": idle,
            "max_lifetime_s": lifetime,
            "runtime": RUNTIME,
            "stopped": False,
        }
        if self.settings.workspaces:
            workspace = body.workspace or WorkspaceRequest()
            spec["workspace"] = {"size_gib": workspace.size_gib, "template": workspace.template}
        return spec

    def new_record(self, session: Session, org: Organization, user: User, spec: dict[str, Any]) -> Sandbox:
        workspace_id = ids.new_workspace_id() if self.settings.workspaces else None
        return store.create_sandbox(session, org.id, user.id, spec, workspace_id=workspace_id)

    def check_template(self, session: Session, org_id: str, template: str | None) -> None:
        if template is None:
            return
        # A deleted sandbox's workspace stays a template until the retention releases it.
        retained = utcnow() - timedelta(seconds=self.settings.workspace_retention_s)
        found = session.scalars(
            select(Sandbox.id).where(
                Sandbox.org_id == org_id,
                Sandbox.workspace_id == template,
                or_(
                    Sandbox.deleted_at.is_(None),
                    and_(Sandbox.deleted_at > retained, Sandbox.workspace_released_at.is_(None)),
                ),
            )
        ).first()
        if found is None:  # or a snapshot's
            found = session.scalars(
                select(Snapshot.id).where(Snapshot.org_id == org_id, Snapshot.workspace_id == template)
            ).first()
        if found is None:
            raise ApiError(404, "not_found", f"no workspace {template!r} in this organization")

    # ---- idempotency

    def run(
        self, who: Identity, key: str | None, fingerprint: str, action: Callable[[Session], tuple[int, Any]]
    ) -> tuple[int, Any, bool]:
        if key is None:
            with self.sessions.begin() as session:
                status, response = action(session)
            return status, response, False
        try:
            answer, replayed = store.run_idempotent(self.sessions, who.org, key, fingerprint, action)
        except store.IdempotencyConflict as exc:
            raise ApiError(422, "idempotency_conflict", str(exc)) from exc
        return answer.status_code, answer.response, replayed

    def restate(self, org_id: str, key: str | None, status: int | None, response: Any) -> None:
        """Change (or with status None, forget) the answer stored for an idempotency key."""
        if key is None:
            return
        with self.sessions.begin() as session:
            record = session.get(IdempotencyRecord, (org_id, key))
            if record is None:
                return
            if status is None:
                session.delete(record)
            else:
                record.status_code = status
                record.response = response

    # ---- writing resources

    def write_resource(self, record: Sandbox) -> str | None:
        """Create the record's Sandbox resource; on failure, withdraw the record (and any
        resource a timed-out create may have left) and return why."""
        try:
            self.cluster.create(_resource(record, self.settings.namespace, self.settings.stamp_key))
        except ClusterError as exc:
            log.warning("creating the Sandbox resource failed: %s", exc)
            try:
                self.cluster.delete(record.object_name)
            except ClusterError:
                log.warning("could not clean up after the failed create; the mirror will")
            with self.sessions.begin() as session:
                again = session.get(Sandbox, record.id)
                if again is not None:
                    condition = {
                        "type": "Ready",
                        "status": "False",
                        "reason": "ClusterRefused",
                        "message": scrub(str(exc), record.object_name, self.settings.namespace),
                        "last_transition_time": utcnow().isoformat(),
                    }
                    store.set_phase(session, again, SandboxPhase.DELETED, conditions=[condition])
            if exc.status in {400, 422}:
                return "invalid_request:" + scrub(str(exc), record.object_name, self.settings.namespace)
            return "unavailable:the cluster did not accept the sandbox; retry later"
        return None

    def object_name(self, who: Identity, sandbox_id: str) -> str:
        with self.sessions() as session:
            return self.find(session, who, sandbox_id).object_name

    def running_pod(self, object_name: str) -> tuple[str, str, Obj]:
        """The running pod of a Sandbox resource: (its name, the Sandbox's uid, the pod);
        409 not_running otherwise."""
        # The cluster decides, not the record (which may not have caught up yet).
        obj = self.cluster.read(object_name)
        meta = (obj or {}).get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if obj is None or not uid or meta.get("deletionTimestamp") or (obj.get("spec") or {}).get("stopped"):
            raise ApiError(409, "not_running", "the sandbox is not running (stopped, or being deleted)")
        name = pod_name(uid)
        pod = self.cluster.read_pod(name)
        running = (
            pod is not None
            and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") == "Running"
        )
        if pod is None or not running:
            raise ApiError(409, "not_running", "the sandbox is not running yet (or any more)")
        return name, uid, pod

    def target(self, who: Identity, sandbox_id: str) -> _Target:
        """The running pod of a sandbox, for exec and files; touches its idle timer."""
        with self.sessions.begin() as session:
            object_name = self.find(session, who, sandbox_id).object_name
        name, uid, pod = self.running_pod(object_name)
        with self.sessions.begin() as session:
            store.keep_alive(session, who.org, sandbox_id)
        agent = self.agent_in(pod, sandbox_id)
        return _Target(pod=name, names=(name, object_name, uid, self.settings.namespace), agent=agent)

    def agent_in(self, pod: Obj, sandbox_id: str) -> agentclient.Agent | None:
        """The agent of a sandbox's running pod, if the pod has one (its init container)."""
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        has_agent = any(c.get("name") == AGENT_CONTAINER for c in spec.get("initContainers") or [])
        if not has_agent or not status.get("podIP"):
            return None
        return agentclient.Agent(str(status["podIP"]), keys.agent_token(self.settings.stamp_key, sandbox_id))

    def agent_address(self, sandbox_id: str, org: str | None = None) -> tuple[str, str]:
        """Where a sandbox's pod is and which organization owns it, for the edge to route
        sandbox traffic; any organization's sandbox (the edge has checked the sandbox's own
        token), or only `org`'s when the edge was shown that organization's key: another's
        is not found before anything else is said of it. Traffic is activity: the idle timer
        restarts."""
        with self.sessions.begin() as session:
            record = session.get(Sandbox, sandbox_id) if _SANDBOX_ID.fullmatch(sandbox_id) else None
            if record is None or record.deleted_at is not None or org not in (None, record.org_id):
                raise not_found(sandbox_id)
            object_name, owner = record.object_name, record.org_id
            record.touch()
        _, _, pod = self.running_pod(object_name)
        address = (pod.get("status") or {}).get("podIP")
        if not address:
            raise ApiError(409, "not_running", "the sandbox has no address yet")
        return str(address), owner

    # ---- the operations both surfaces offer

    def create(
        self,
        who: Identity,
        body: CreateSandboxRequest,
        key: str | None,
        *,
        route: str = "/v1/sandboxes",
        extra: dict[str, Any] | None = None,
    ) -> tuple[int, Any, bool]:
        """Record a sandbox and write its resource: (status, the record as /v1 shows it,
        whether it was a replay). `extra` joins the spec (the E2B surface's metadata, env,
        template name and lifetime)."""
        self.check_capabilities(body)
        made: list[Sandbox] = []

        def action(session: Session) -> tuple[int, Any]:
            org, user = self.org_and_user(session, who)
            spec = self.spec(body, org)
            if extra:
                spec.update(extra)
                check_lifetime(org, int(spec["max_lifetime_s"]))
            self.check_template(session, org.id, body.workspace.template if body.workspace else None)
            try:
                record = self.new_record(session, org, user, spec)
            except store.QuotaExceeded as exc:
                raise ApiError(403, "quota_exceeded", str(exc)) from exc
            except store.PersistenceNotAllowedError as exc:
                raise ApiError(403, "forbidden", str(exc)) from exc
            made.append(record)
            return 201, self.public(record)

        request = {"user": who.user, "body": body.model_dump(mode="json")}
        if extra:
            request["extra"] = extra
        fingerprint = store.request_hash("POST", route, request)
        status, response, replayed = _store_errors(lambda: self.run(who, key, fingerprint, action))
        if made and not replayed:
            failure = self.write_resource(made[0])
            if failure is not None:
                self.restate(who.org, key, None, None)  # a retry with the same key may act again
                code, message = failure.split(":", 1)
                raise ApiError(400 if code == "invalid_request" else 503, code, message)
        return status, response, replayed

    def delete(self, who: Identity, sandbox_id: str) -> dict[str, Any]:
        """Delete a sandbox (Terminating until its resource is gone); the record as /v1 shows it."""
        with self.sessions.begin() as session:
            record = self.find(session, who, sandbox_id)
            if not record.being_deleted:
                store.begin_delete(session, record)
            object_name = record.object_name
        # Terminating until the resource is gone: its pod may still hold what the quota counts.
        self.cluster.delete(object_name)
        obj = self.cluster.read(object_name)
        with self.sessions.begin() as session:
            record = self.find(session, who, sandbox_id)
            if obj is None:
                store.set_phase(session, record, SandboxPhase.DELETED)
            else:
                converge(session, record, obj, self.settings.namespace)
            return self.public(record)

    def fork(
        self,
        who: Identity,
        sandbox_id: str,
        count: int,
        key: str | None,
        *,
        route: str | None = None,
        lifetime_s: int | None = None,
    ) -> tuple[int, Any, bool]:
        """Fork a sandbox's workspace into `count` new sandboxes, each succeeding or failing
        on its own: (status, {"results": [...]}, whether it was a replay). `lifetime_s`
        gives the children a lifetime of their own (from now) instead of their parent's."""
        self.need_workspaces("a fork")
        made: list[tuple[int, Sandbox]] = []

        def action(session: Session) -> tuple[int, Any]:
            org, user = self.org_and_user(session, who)
            parent = self.find(session, who, sandbox_id)
            if parent.being_deleted:
                raise ApiError(409, "conflict", "the sandbox is being deleted")
            if not parent.workspace_id:
                raise ApiError(409, "conflict", "the sandbox has no workspace to fork")
            spec = {
                **parent.spec,
                "stopped": False,
                "workspace": {
                    "size_gib": (parent.spec.get("workspace") or {}).get("size_gib", 10),
                    "template": None,
                    "fork_of": parent.workspace_id,
                },
                "forked_from": parent.id,
            }
            if lifetime_s is not None:
                check_lifetime(org, lifetime_s)
                spec["max_lifetime_s"] = lifetime_s
            results: list[dict[str, Any]] = []
            for index in range(count):
                try:
                    child = self.new_record(session, org, user, spec)
                except store.QuotaExceeded as exc:
                    results.append({"ok": False, "error": "quota_exceeded", "message": str(exc)})
                    continue
                except store.PersistenceNotAllowedError as exc:
                    results.append({"ok": False, "error": "forbidden", "message": str(exc)})
                    continue
                made.append((index, child))
                results.append({"ok": True, "sandbox": self.public(child)})
            return 200, {"results": results}

        request: dict[str, Any] = {"user": who.user, "count": count}
        if lifetime_s is not None:
            request["lifetime_s"] = lifetime_s
        fingerprint = store.request_hash("POST", route or f"/v1/sandboxes/{sandbox_id}/fork", request)
        status, response, replayed = _store_errors(lambda: self.run(who, key, fingerprint, action))
        changed = False
        for index, child in [] if replayed else made:
            failure = self.write_resource(child)
            if failure is not None:
                code, message = failure.split(":", 1)
                response["results"][index] = {"ok": False, "error": code, "message": message}
                changed = True
        if changed:
            self.restate(who.org, key, status, response)
        return status, response, replayed

    def set_stopped(self, who: Identity, sandbox_id: str, stopped: bool) -> dict[str, Any]:
        """Stop a sandbox (its processes end, its workspace stays) or start it again; the
        record as /v1 shows it."""
        with self.sessions() as session:
            object_name = self.find(session, who, sandbox_id).object_name
        # The resource says whether it is being deleted (the record's Terminating may only
        # mean a stopping pod).
        obj = self.cluster.read(object_name)
        if obj is not None and (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise ApiError(409, "conflict", "the sandbox is being deleted")
        if obj is None or self.cluster.patch(object_name, {"spec": {"stopped": stopped}}) is None:
            raise ApiError(409, "conflict", "the cluster holds nothing for this sandbox")
        with self.sessions.begin() as session:
            record = self.find(session, who, sandbox_id)
            record.spec = {**record.spec, "stopped": stopped}
            if not stopped:
                record.touch()  # starting is activity, and restarts a timer the reaper paused
            session.flush()
            return self.public(record)


async def _identity(request: Request) -> Identity:
    """The verified identity of the request: the stamp, checked with this app's key."""
    verify: Callable[[Request], Any] = request.app.state.identity
    who: Identity = await verify(request)
    return who


Who = Annotated[Identity, Depends(_identity)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="Repeat a request safely: the same key and request get the first answer again.",
    ),
]
FilePath = Annotated[str, Query(min_length=1, max_length=4096, description="An absolute path.")]


def make_api(settings: ApiSettings) -> FastAPI:  # noqa: PLR0915 (the routes are the app)
    """The API as an ASGI app. The database must be migrated already (db.upgrade)."""
    api = ApiService(settings)

    app = FastAPI(
        title="Warren API",
        version=API_VERSION,
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
    )
    add_identity_error_handler(app)
    app.state.api = api
    app.state.identity = require_identity(settings.stamp_key)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: Exception) -> Response:
        return exc.response() if isinstance(exc, ApiError) else _internal()

    @app.exception_handler(ClusterError)
    async def cluster_error(request: Request, exc: Exception) -> Response:
        log.warning("cluster call failed: %s", exc)
        return ApiError(503, "unavailable", "the cluster is unavailable; retry later").response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: Exception) -> Response:
        if not isinstance(exc, RequestValidationError):
            return _internal()
        parts = []
        for error in exc.errors()[:5]:
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
            parts.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg")))
        return ApiError(400, "invalid_request", "; ".join(parts) or "invalid request").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: Exception) -> Response:
        if not isinstance(exc, StarletteHTTPException):
            return _internal()
        codes = {404: "not_found", 405: "method_not_allowed"}
        return ApiError(exc.status_code, codes.get(exc.status_code, "error"), str(exc.detail)).response()

    router = APIRouter(prefix="/v1", dependencies=[Depends(_identity)], tags=["sandboxes"])

    @router.post(
        "/sandboxes",
        status_code=201,
        response_model=SandboxOut,
        responses=_errors(400, 401, 403, 404, 422, 503),
        summary="Create a sandbox",
    )
    def create_sandbox(body: CreateSandboxRequest, who: Who, key: IdempotencyKey = None) -> Response:
        status, response, replayed = api.create(who, body, key)
        headers = {"Location": f"/v1/sandboxes/{response['id']}"} if status == 201 else {}  # noqa: PLR2004
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        return JSONResponse(response, status_code=status, headers=headers)

    @router.get(
        "/sandboxes",
        response_model=PageOut,
        responses=_errors(400, 401),
        summary="List the organization's sandboxes, oldest first",
    )
    def list_sandboxes(
        who: Who,
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
        responses=_errors(401, 404),
        summary="One sandbox, as the cluster shows it",
    )
    def get_sandbox(sandbox_id: str, who: Who) -> Response:
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
        responses=_errors(401, 404, 503),
        summary="Delete a sandbox and its workspace",
    )
    def delete_sandbox(sandbox_id: str, who: Who) -> Response:
        return JSONResponse(api.delete(who, sandbox_id), status_code=202)

    @router.post(
        "/sandboxes/{sandbox_id}/fork",
        response_model=ForkOut,
        responses=_errors(400, 401, 403, 404, 409, 422, 503),
        summary="Fork a sandbox's workspace into `count` new sandboxes, each on its own",
    )
    def fork_sandbox(
        sandbox_id: str, who: Who, body: Annotated[ForkRequest, Body()], key: IdempotencyKey = None
    ) -> Response:
        status, response, replayed = api.fork(who, sandbox_id, body.count, key)
        headers = {"Idempotent-Replayed": "true"} if replayed else {}
        return JSONResponse(response, status_code=status, headers=headers)

    @router.post(
        "/sandboxes/{sandbox_id}/stop",
        status_code=202,
        response_model=SandboxOut,
        responses=_errors(400, 401, 404, 409, 503),
        summary="Stop a sandbox: its processes end, its workspace stays",
    )
    def stop_sandbox(
        sandbox_id: str, who: Who, body: Annotated[StopRequest | None, Body()] = None
    ) -> Response:
        if body is not None and body.memory_capture:
            if not settings.memory_capture:
                raise unsupported("memory_capture", "memory capture is off on this deployment")
            raise unsupported("memory_capture", "this version cannot capture a gVisor sandbox's memory")
        api.need_workspaces("stopping (only the workspace outlives the processes)")
        return JSONResponse(api.set_stopped(who, sandbox_id, True), status_code=202)

    @router.post(
        "/sandboxes/{sandbox_id}/start",
        status_code=202,
        response_model=SandboxOut,
        responses=_errors(401, 404, 409, 503),
        summary="Start a stopped sandbox again, on the same workspace",
    )
    def start_sandbox(sandbox_id: str, who: Who) -> Response:
        return JSONResponse(api.set_stopped(who, sandbox_id, False), status_code=202)

    @router.post(
        "/sandboxes/{sandbox_id}/keepalive",
        response_model=SandboxOut,
        responses=_errors(401, 404),
        summary="Restart the sandbox's idle timer",
    )
    def keepalive(sandbox_id: str, who: Who) -> Response:
        with api.sessions.begin() as session:
            record = api.find(session, who, sandbox_id)
            record.touch()
            session.flush()
            return JSONResponse(api.public(record))

    app.include_router(router)
    # Exec, files and the workspace proof (sandbox_io builds on this module, as e2b does).
    from warren_control import sandbox_io

    app.include_router(sandbox_io.make_router(api))

    @app.get("/internal/agents/{sandbox_id}", include_in_schema=False)
    def agent_address(
        sandbox_id: str, who: Who, org: Annotated[str | None, Query(max_length=64)] = None
    ) -> Response:
        if who != EDGE:
            raise ApiError(403, "forbidden", "only the edge asks where a sandbox's agent is")
        address, owner = api.agent_address(sandbox_id, org)
        return JSONResponse({"address": address, "org": owner})

    # The E2B SDK's routes, at the root where it looks for them (E2B_API_URL is the edge).
    from warren_control import e2b  # e2b builds on this module: imported once both exist

    app.include_router(e2b.make_router(api, settings.templates, settings.sandbox_domain))

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _internal() -> Response:
    return ApiError(500, "internal", "internal error").response()


def _store_errors(call: Callable[[], tuple[int, Any, bool]]) -> tuple[int, Any, bool]:
    try:
        return call()
    except store.OrgNotFoundError as exc:
        raise ApiError(403, "forbidden", "the organization of this identity does not exist") from exc
    except store.InvalidSpecError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from exc


def _document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, told the truth: malformed requests are 400 {error, message} (not
    FastAPI's 422 shape) and every /v1 operation needs a bearer credential at the edge."""
    document = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    for item in document.get("paths", {}).values():
        for operation in item.values():
            responses = operation.get("responses", {})
            auto = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if auto.get("$ref", "").endswith("/HTTPValidationError"):
                del responses["422"]
            responses.setdefault("400", {"description": "Invalid request", **_error_content()})
            operation["security"] = [{"bearer": []}]
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["ExecEventOut"] = ExecEventOut.model_json_schema(ref_template="#/components/schemas/{model}")
    document["components"]["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key (wk_...) or an OIDC token, checked by the edge.",
        }
    }
    return document


def _error_content() -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}


def document(settings: ApiSettings | None = None) -> dict[str, Any]:
    """The OpenAPI document (it does not depend on the settings)."""
    app = make_api(settings or ApiSettings(database_url="sqlite://", stamp_key=b"\0" * 32, engine_options={}))
    return app.openapi()
