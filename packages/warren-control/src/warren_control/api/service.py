"""What the routes do, apart from HTTP: the service both surfaces (/v1 and E2B's) share."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from warren_control import agentclient, ids, keys, secret_records, store
from warren_control.api.cluster import Cluster, org_hash, resource_for
from warren_control.api.errors import ApiError, ClusterError, not_found, unsupported
from warren_control.api.shapes import RUNTIME, CreateSandboxRequest, SandboxOut, WorkspaceRequest
from warren_control.db import make_engine, session_factory
from warren_control.identity import Identity
from warren_control.kube import Kube, Obj
from warren_control.models import (
    IdempotencyRecord,
    Organization,
    Sandbox,
    SandboxPhase,
    Snapshot,
    User,
    utcnow,
)
from warren_control.observation import converge, start_ended, start_report
from warren_control.podspec import has_agent, sandbox_pod_name, starts_agent
from warren_control.scrub import scrub
from warren_control.templates import Template
from warren_control.vault import GATEWAY_ENV, SecretBox, placeholder
from warren_control.workspaces import DEFAULT_RETENTION_S, WorkspaceStore, WorkspaceStoreError

log = logging.getLogger(__name__)

# How long a fork, proof or snapshot waits for a new sandbox's workspace to be bound.
WORKSPACE_WAIT_S = 30.0


DEFAULT_NAMESPACE = "warren-sandboxes"
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
FORK_POOL_SUFFIX = "-forks"
MAX_PARALLEL_CREATES = 8  # a fork's Sandbox resources created at once
MAX_WAIT_S = 60.0  # the longest long poll (GET with wait_s)
WAIT_THREADS = 32  # long polls under way at once, each a thread and a watch
MIRROR_LAG_S = 1.0  # how long a long poll waits for the status mirror to write what it saw
SANDBOX_ID = re.compile(r"sbx_[a-z2-7]{26}")


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
    # The images whose sandboxes' memory can be captured: those that start the agent from
    # the image (--agent-in-image). None: every image (no agent is copied in by an init
    # container, which a restored pod could not run again).
    capturable_images: frozenset[str] | None = None
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
    # Templates with a warm pool (a SandboxPool of the template's name in `namespace`): a
    # create the template describes names it, and the controller claims one of its pods or
    # starts cold, saying why in the sandbox's PoolClaimed condition.
    pools: frozenset[str] = frozenset()
    # Templates whose forks' children claim from a pool (the SandboxPool <name>-forks, whose
    # pods take the child's workspace at the claim).
    fork_pools: frozenset[str] = frozenset()
    # Secrets (vault.py): the key material values are sealed under, and the URL sandbox pods
    # reach the egress gateway at. Without both, secrets are refused as unsupported.
    secrets_key: bytes | None = None
    gateway_url: str | None = None
    sandbox_domain: str | None = None
    # How long an E2B create, connect or fork waits for its sandboxes to run before it answers
    # (E2B's SDK uses a sandbox as soon as it has one); 0 answers at once.
    start_wait_s: float = 50.0


# --- the app -----------------------------------------------------------------------------------


@dataclass
class Target:
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
        # Secrets are sealed here; without a gateway to use them, they are refused.
        self.secret_box = (
            SecretBox(settings.secrets_key) if settings.secrets_key and settings.gateway_url else None
        )
        # Exec streams poll their websockets from worker threads of their own, so a
        # hundred long-running commands cannot starve the ordinary requests' thread pool.
        self.exec_threads = anyio.CapacityLimiter(256)
        # Long polls (GET with wait_s) each hold a thread and a watch of the cluster; past
        # this many at once, a GET answers at once instead (the client asks again).
        self.wait_threads = anyio.CapacityLimiter(WAIT_THREADS)
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
        if not SANDBOX_ID.fullmatch(sandbox_id):
            raise not_found(sandbox_id)
        record = store.get_sandbox(session, who.org, sandbox_id)
        if record is None:
            raise not_found(sandbox_id)
        return record

    def await_news(self, who: Identity, sandbox_id: str, wait_s: float) -> None:
        """A long poll: return once a starting sandbox runs, cannot start, or reports another
        state than when asked, at most `wait_s` later. The Sandbox resource is followed
        through one watch, not read again and again; where a status mirror writes the
        records, then until its record shows the same (a moment's lag, bounded)."""
        with self.sessions() as session:
            record = self.find(session, who, sandbox_id)
            if record.phase is not SandboxPhase.PENDING:
                return
            name = record.object_name
        try:
            start = self.cluster.read(name)
            if start is None or start_ended(start):
                return
            last = self.cluster.watch_start(name, start, wait_s)
        except ClusterError as exc:
            log.warning("cannot follow sandbox %s, answering from the records: %s", sandbox_id, exc)
            return
        phase, reason, _ = start_report(last) if last is not None else ("", "", False)
        if self.settings.read_through or not phase:
            return  # the answer reads the cluster itself (read-through), or has nothing to wait for
        deadline = time.monotonic() + MIRROR_LAG_S
        while time.monotonic() < deadline:
            with self.sessions() as session:
                record = self.find(session, who, sandbox_id)
                ready = next((c for c in record.conditions if c.get("type") == "Ready"), {})
            if phase != SandboxPhase.PENDING.value and record.phase.value == phase:
                return
            if phase == SandboxPhase.PENDING.value and ready.get("reason") == reason:
                return
            time.sleep(0.02)

    def public(self, record: Sandbox) -> dict[str, Any]:
        """What the API answers for a sandbox: its one public shape, checked on the way out."""
        return SandboxOut.of(record, self.settings.namespace).doc()

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
            raise unsupported(
                "memory_capture",
                'memory is captured by a stop that asks for it ({"memory_capture": true}) or, '
                'past the idle timeout, for a sandbox created with on_idle "pause"',
            )
        if body.on_idle == "pause":
            if (refused := self.capture_refusal(body.image)) is not None:
                raise unsupported("on_idle pause", refused)
            self.need_workspaces("pausing on idle (the workspace outlives the processes)")
        if body.on_idle == "stop":
            self.need_workspaces("stopping on idle (only the workspace outlives the processes)")
        if body.workspace is not None:
            self.need_workspaces("a workspace size or template")

    def image_of(self, who: Identity, sandbox_id: str) -> str:
        with self.sessions() as session:
            return str(self.find(session, who, sandbox_id).spec["image"])

    def capture_refusal(self, image: str) -> str | None:
        """Why the memory of a sandbox of `image` cannot be captured here, if it cannot."""
        if not self.settings.memory_capture:
            return "memory capture is off on this deployment"
        allowed = self.settings.capturable_images
        if allowed is not None and not starts_agent(image, allowed):
            return (
                f"image {image[:120]} does not start the agent itself (its sandboxes get it from an "
                "init container, which a restored pod cannot run again): use an image built with "
                "the agent's layer, such as the base template's"
            )
        return None

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
            "on_idle": body.on_idle,
            "max_lifetime_s": lifetime,
            "runtime": RUNTIME,
            "stopped": False,
        }
        if self.settings.workspaces:
            workspace = body.workspace or WorkspaceRequest()
            spec["workspace"] = {"size_gib": workspace.size_gib, "template": workspace.template}
        pool = self.pool_for(spec)
        if pool:
            spec["pool"] = pool
        return spec

    def need_secrets(self) -> SecretBox:
        """What secrets are sealed with; refused where no egress gateway runs to use them."""
        if self.secret_box is None:
            raise unsupported("secrets", "this deployment runs no egress gateway")
        return self.secret_box

    def bind_secrets(self, session: Session, org_id: str, names: Sequence[str], spec: dict[str, Any]) -> None:
        """Bind the organization's live secrets `names` to the sandbox being made: the
        gateway takes requests from it for them, and its environment holds placeholders
        (never a value) and the gateway's URL."""
        self.need_secrets()
        found, env = [], {GATEWAY_ENV: str(self.settings.gateway_url)}
        for name in dict.fromkeys(names):
            secret = secret_records.live(session, org_id, name)
            if secret is None:
                raise ApiError(
                    400, "invalid_request", f"no secret {name!r} in this organization (POST /v1/secrets)"
                )
            found.append(secret.id)
            if secret.env:
                env[secret.env] = placeholder(secret.name)
        spec["secrets"] = {"ids": found, "env": sorted(env)}
        spec["env"] = {**(spec.get("env") or {}), **env}

    def pool_for(self, spec: Mapping[str, Any]) -> str | None:
        """The warm pool whose template describes this sandbox (its image and size), if any.
        Whether a pod of it fits (its command, environment, workspace) is the controller's
        to say, in the sandbox's PoolClaimed condition."""
        for name in sorted(self.settings.pools):
            template = self.settings.templates[name]
            if (template.image, template.cpu_millis, template.memory_mib) == (
                spec["image"],
                spec["cpu_millis"],
                spec["memory_mib"],
            ):
                return name
        return None

    def new_record(self, session: Session, org: Organization, user: User, spec: dict[str, Any]) -> Sandbox:
        workspace_id = (
            ids.new_workspace_id() if self.settings.workspaces and not bound_at_start(spec) else None
        )
        return store.create_sandbox(session, org.id, user.id, spec, workspace_id=workspace_id)

    def workspace_of(self, who: Identity, sandbox_id: str, timeout_s: float = WORKSPACE_WAIT_S) -> str | None:
        """The sandbox's workspace id; for one bound when it starts (bound_at_start), once the
        controller has bound it, waiting up to `timeout_s`. None: the sandbox has none."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.sessions.begin() as session:
                record = self.find(session, who, sandbox_id)
                if not record.workspace_id and record.spec.get("workspace"):
                    self.observe(session, record)
                workspace_id, wanted = record.workspace_id, bool(record.spec.get("workspace"))
            if workspace_id or not wanted:
                return workspace_id
            if time.monotonic() > deadline:
                raise ApiError(
                    409,
                    "conflict",
                    "the sandbox's workspace is not attached yet (its pod has not started); "
                    "retry once the sandbox runs",
                )
            time.sleep(0.1)

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

    def answered(self, who: Identity, key: str | None) -> bool:
        """Whether a request under this idempotency key was answered already (a retry)."""
        if key is None:
            return False
        with self.sessions() as session:
            return session.get(IdempotencyRecord, (who.org, key)) is not None

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

    def write_resource(
        self, record: Sandbox, siblings: int | None = None, memory: Obj | None = None
    ) -> str | None:
        """Create the record's Sandbox resource (one of a fork into `siblings`, restored
        from `memory` if given); on failure, withdraw the record (and any resource a
        timed-out create may have left) and return why."""
        try:
            self.cluster.create(
                resource_for(
                    record, self.settings.namespace, self.settings.stamp_key, siblings=siblings, memory=memory
                )
            )
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
        name = sandbox_pod_name(obj)
        pod = self.cluster.read_pod(name)
        running = (
            pod is not None
            and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") == "Running"
        )
        if pod is None or not running:
            raise ApiError(409, "not_running", "the sandbox is not running yet (or any more)")
        return name, uid, pod

    def target(self, who: Identity, sandbox_id: str) -> Target:
        """The running pod of a sandbox, for exec and files (resumed first if its idle
        timeout paused it); touches its idle timer."""
        with self.sessions.begin() as session:
            record = self.find(session, who, sandbox_id)
            object_name, paused = record.object_name, wakes(record)
        if paused:
            self.wake(record.id, object_name)
        name, uid, pod = self.running_pod(object_name)
        with self.sessions.begin() as session:
            store.keep_alive(session, who.org, sandbox_id)
        agent = self.agent_in(pod, sandbox_id)
        return Target(pod=name, names=(name, object_name, uid, self.settings.namespace), agent=agent)

    def wake(self, sandbox_id: str, object_name: str) -> None:
        """Resume a sandbox its idle timeout paused, for the call that uses it, waiting at
        most the deployment's start wait: its processes come back from their memory."""
        if self.cluster.patch(object_name, {"spec": {"stopped": False, "coldStart": False}}) is None:
            raise ApiError(409, "not_running", "the cluster holds nothing for this sandbox")
        with self.sessions.begin() as session:
            record = session.get(Sandbox, sandbox_id)
            if record is not None:
                record.spec = {**record.spec, "stopped": False}
                record.touch()
        log.info("waking %s: paused on idle, used again", sandbox_id)
        deadline = time.monotonic() + self.settings.start_wait_s
        while True:
            obj = self.cluster.read(object_name) or {}
            phase, reason, current = start_report(obj)
            if phase == SandboxPhase.RUNNING.value and current:
                return
            left = deadline - time.monotonic()
            if start_ended(obj) or left <= 0:
                conditions = (obj.get("status") or {}).get("conditions") or []
                ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
                meta = obj.get("metadata") or {}
                why = scrub(
                    f"{reason or phase or 'Pending'}: {ready.get('message') or 'resuming'}",
                    object_name,
                    self.settings.namespace,
                    sandbox_pod_name(obj),
                    str(meta.get("uid") or "-"),
                )
                if left <= 0:
                    raise ApiError(504, "timeout", f"the sandbox is still resuming ({why}); try again")
                raise ApiError(409, "not_running", f"the sandbox paused on idle could not resume: {why}")
            if (obj.get("metadata") or {}).get("resourceVersion"):
                self.cluster.watch_start(object_name, obj, left)
            else:
                time.sleep(min(0.2, left))

    def agent_in(self, pod: Obj, sandbox_id: str) -> agentclient.Agent | None:
        """The agent of a sandbox's running pod, if the pod has one."""
        status = pod.get("status") or {}
        if not has_agent(pod) or not status.get("podIP"):
            return None
        return agentclient.Agent(str(status["podIP"]), keys.agent_token(self.settings.stamp_key, sandbox_id))

    def agent_address(self, sandbox_id: str, org: str | None = None) -> tuple[str, str]:
        """Where a sandbox's pod is and which organization owns it, for the edge to route
        sandbox traffic; any organization's sandbox (the edge has checked the sandbox's own
        token), or only `org`'s when the edge was shown that organization's key: another's
        is not found before anything else is said of it. Traffic is activity: the idle timer
        restarts."""
        with self.sessions.begin() as session:
            record = session.get(Sandbox, sandbox_id) if SANDBOX_ID.fullmatch(sandbox_id) else None
            if record is None or record.deleted_at is not None or org not in (None, record.org_id):
                raise not_found(sandbox_id)
            object_name, owner, paused = record.object_name, record.org_id, wakes(record)
            record.touch()
        if paused:
            self.wake(sandbox_id, object_name)
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
            if body.secrets:
                self.bind_secrets(session, org.id, body.secrets, spec)
            cap_pool(session, org, spec)
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
        status, response, replayed = store_errors(lambda: self.run(who, key, fingerprint, action))
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
            # Deleted records too: one with no pod is gone at once, and the status mirror
            # may have recorded that before this answer.
            deleted = store.get_sandbox(session, who.org, sandbox_id, include_deleted=True)
            if deleted is None:
                raise not_found(sandbox_id)
            if obj is None:
                store.set_phase(session, deleted, SandboxPhase.DELETED)
            else:
                converge(session, deleted, obj, self.settings.namespace)
            return self.public(deleted)

    def fork(
        self,
        who: Identity,
        sandbox_id: str,
        count: int,
        key: str | None,
        *,
        route: str | None = None,
        lifetime_s: int | None = None,
        secrets: bool = False,
    ) -> tuple[int, Any, bool]:
        """Fork a sandbox's workspace into `count` new sandboxes, each succeeding or failing
        on its own: (status, {"results": [...]}, whether it was a replay). `lifetime_s`
        gives the children a lifetime of their own (from now) instead of their parent's;
        `secrets` keeps the parent's secret bindings (without it the children have none)."""
        self.need_workspaces("a fork")
        self.workspace_of(who, sandbox_id)  # a pooled sandbox's is bound when it starts
        memory = restore_point(self.cluster.read(self.object_name(who, sandbox_id)))
        made: list[tuple[int, Sandbox]] = []

        def action(session: Session) -> tuple[int, Any]:
            org, user = self.org_and_user(session, who)
            parent = self.find(session, who, sandbox_id)
            if parent.being_deleted:
                raise ApiError(409, "conflict", "the sandbox is being deleted")
            if not parent.workspace_id:  # bound before this transaction, if it ever was
                raise ApiError(409, "conflict", "the sandbox has no workspace to fork")
            spec = fork_spec(parent, memory, secrets=secrets)
            if lifetime_s is not None:
                check_lifetime(org, lifetime_s)
                spec["max_lifetime_s"] = lifetime_s
            template = self.pool_for(parent.spec)
            from_pool = template in self.settings.fork_pools and memory is None
            if from_pool:
                spec["pool"] = fork_pool_name(str(template))
            results: list[dict[str, Any]] = []
            for index in range(count):
                child_spec = dict(spec)
                if from_pool:
                    cap_pool(session, org, child_spec)
                try:
                    child = self.new_record(session, org, user, child_spec)
                except store.QuotaExceeded as exc:
                    results.append({"ok": False, "error": "quota_exceeded", "message": str(exc)})
                    continue
                except store.PersistenceNotAllowedError as exc:
                    results.append({"ok": False, "error": "forbidden", "message": str(exc)})
                    continue
                made.append((index, child))
                results.append({"ok": True, "sandbox": self.public(child)})
            return 200, {"results": results}

        request: dict[str, Any] = {"user": who.user, "count": count, **({"secrets": True} if secrets else {})}
        if lifetime_s is not None:
            request["lifetime_s"] = lifetime_s
        fingerprint = store.request_hash("POST", route or f"/v1/sandboxes/{sandbox_id}/fork", request)
        status, response, replayed = store_errors(lambda: self.run(who, key, fingerprint, action))
        changed = False
        # The children's resources side by side: one after another, a fork into eight
        # reached the controller over a quarter of a second, and its children's binds too.
        children = [] if replayed else made
        with ThreadPoolExecutor(max(1, min(MAX_PARALLEL_CREATES, len(children)))) as pool:
            failures = list(pool.map(lambda item: self._write_child(item[1], count, memory), children))
        for (index, _), failure in zip(children, failures, strict=True):
            if failure is not None:
                code, message = failure.split(":", 1)
                response["results"][index] = {"ok": False, "error": code, "message": message}
                changed = True
        if changed:
            self.restate(who.org, key, status, response)
        return status, response, replayed

    def _write_child(self, child: Sandbox, siblings: int, memory: Obj | None) -> str | None:
        """Write a fork's child's resource. A child restored from memory gets its workspace
        now, while the parent is paused: a fork at exactly the generation its image is valid
        over, whatever the parent does next. (Without the store, the node forks it when the
        child is restored, if the parent has not moved on by then.)"""
        store_ = self.settings.workspace_store
        if memory is not None and store_ is not None and child.workspace_id:
            try:
                store_.copy(str(memory["workspace"]), child.workspace_id)
            except WorkspaceStoreError as exc:
                log.warning("forking the workspace of %s ahead of its restore failed: %s", child.id, exc)
        return self.write_resource(child, siblings=siblings, memory=memory)

    def set_stopped(
        self, who: Identity, sandbox_id: str, stopped: bool, *, memory: bool = False, cold: bool = False
    ) -> dict[str, Any]:
        """Stop a sandbox (its processes end, its workspace stays; with `memory`, its memory
        is captured first and the next start resumes from it) or start it again (`cold`: as
        a new start even where a memory image was captured); the record as /v1 shows it."""
        with self.sessions() as session:
            object_name = self.find(session, who, sandbox_id).object_name
        # The resource says whether it is being deleted (the record's Terminating may only
        # mean a stopping pod).
        obj = self.cluster.read(object_name)
        if obj is not None and (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise ApiError(409, "conflict", "the sandbox is being deleted")
        change = (
            {"stopped": stopped, "memoryCapture": memory}
            if stopped
            else {"stopped": False, "coldStart": cold}
        )
        if obj is None or self.cluster.patch(object_name, {"spec": change}) is None:
            raise ApiError(409, "conflict", "the cluster holds nothing for this sandbox")
        with self.sessions.begin() as session:
            record = self.find(session, who, sandbox_id)
            record.spec = {**record.spec, "stopped": stopped}
            if not stopped:
                record.touch()  # starting is activity, and restarts a timer the reaper paused
            session.flush()
            return self.public(record)


def fork_spec(parent: Sandbox, memory: Obj | None, *, secrets: bool = False) -> dict[str, Any]:
    """The spec of a fork's children: the parent's, over forks of its workspace, each
    restored from its memory image if it has one that is a restore point (`memory`). The
    parent's secret bindings only if `secrets` (the placeholders in the environment go
    with them)."""
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
    spec.pop("pool_skipped", None)
    spec.pop("memory_from", None)
    if not secrets and (bound := spec.pop("secrets", None)):
        held = set(bound.get("env") or [])
        env = {k: v for k, v in (spec.get("env") or {}).items() if k not in held}
        if env:
            spec["env"] = env
        else:
            spec.pop("env", None)
    if memory is not None:
        spec["memory_from"] = memory["image"]
    return spec


def restore_point(obj: Obj | None) -> Obj | None:
    """A paused Sandbox's memory image (status.memoryImage), if it is a restore point: sealed,
    proved by a restore, not dropped by a start. A fork's children are restored from it."""
    spec, status = (obj or {}).get("spec") or {}, (obj or {}).get("status") or {}
    record = status.get("memoryImage") or {}
    proved = record.get("verifiedAt") and (record.get("verification") or {}).get("done")
    if not spec.get("stopped") or not proved or record.get("unrestorable"):
        return None
    return dict(record)


def wakes(record: Sandbox) -> bool:
    """Whether using the sandbox resumes it: it is stopped, and pauses on idle or resumes
    on use (E2B's autoResume)."""
    spec = record.spec
    return bool(spec.get("stopped") and (spec.get("on_idle") == "pause" or spec.get("auto_resume")))


def check_lifetime(org: Organization, seconds: int) -> None:
    if seconds > org.max_lifetime_s:
        limit = org.max_lifetime_s
        raise ApiError(403, "forbidden", f"a lifetime may be at most {limit} s in this organization")


def store_errors(call: Callable[[], tuple[int, Any, bool]]) -> tuple[int, Any, bool]:
    try:
        return call()
    except store.OrgNotFoundError as exc:
        raise ApiError(403, "forbidden", "the organization of this identity does not exist") from exc
    except store.InvalidSpecError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from exc


def fork_pool_name(template: str) -> str:
    """The SandboxPool whose pods take the children of the template's forks."""
    return f"{template}{FORK_POOL_SUFFIX}"


def held_from_pool(spec: Mapping[str, Any]) -> bool:
    """Whether a sandbox counts against its organization's cap of sandboxes from warm pools:
    it claims a pool's pod with a new workspace, or a fork pool's with its fork."""
    workspace = spec.get("workspace") or {}
    forked = bool(workspace.get("fork_of")) and str(spec.get("pool") or "").endswith(FORK_POOL_SUFFIX)
    return claims_from_pool(spec) or forked


def claims_from_pool(spec: Mapping[str, Any]) -> bool:
    """Whether a sandbox can take a pool's pod: it names a pool, and its workspace (if any)
    is a new one, not a fork's or a template's, which the controller would start cold."""
    workspace = spec.get("workspace") or {}
    return bool(spec.get("pool")) and not workspace.get("template") and not workspace.get("fork_of")


def bound_at_start(spec: Mapping[str, Any]) -> bool:
    """Whether a new sandbox's workspace id is the controller's to choose: a new, empty
    workspace for a pooled template, bound to the workspace of the pool pod it claims (or a
    new one if it starts cold). Every other workspace's id is chosen here."""
    return claims_from_pool(spec) and bool(spec.get("workspace"))


def cap_pool(session: Session, org: Organization, spec: dict[str, Any]) -> None:
    """An organization at its cap of sandboxes from warm pools starts this one cold: its spec
    names no pool, and says why (the controller puts that in PoolClaimed)."""
    if not spec.get("pool") or org.pool_sandboxes_max is None:
        return
    held = sum(1 for held_spec in store.live_specs(session, org.id) if held_from_pool(held_spec))
    if held >= org.pool_sandboxes_max:
        spec["pool_skipped"] = (
            f"the organization holds {held} sandboxes from warm pools, its cap of {org.pool_sandboxes_max}"
        )
        del spec["pool"]
