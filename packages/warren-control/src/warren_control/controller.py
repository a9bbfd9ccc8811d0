"""The controller: every Sandbox resource becomes exactly one gVisor pod.

Exactly one, even across crashes, because nothing here remembers anything: the pod's name
is a function of the Sandbox's uid (podspec.pod_name), so every pass reads the cluster,
finds the pod it made or meets AlreadyExists, and converges from there. The pod's owner
reference lets the garbage collector remove a pod whose Sandbox vanished while no
controller ran. A finalizer keeps the Sandbox until its pod has stopped; its workspace
outlives it in object storage for the control plane's retention period.

Every trigger runs the same level-based pass: Sandbox create/update/resume, a periodic
resync, and every event of a pod this controller made (so pod phase changes reach the
Sandbox's status, and a pod deleted behind our back is made again).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Literal, cast

import kopf

from warren_control import leader
from warren_control.kube import ApiException, Kube, Obj, error_message
from warren_control.podspec import (
    FINALIZER,
    GROUP,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLURAL,
    SPEC_HASH_ANNOTATION,
    VERSION,
    WORKSPACE_LABEL,
    PodOptions,
    PullPolicy,
    SandboxSpecError,
    add_request_arguments,
    blockd_volume,
    controller_uid,
    pod_for,
    pod_name,
    spec_hash,
)

log = logging.getLogger(__name__)

Phase = Literal["Pending", "Running", "Stopped", "Failed", "Terminating"]

# kopf treats every annotation under its prefix as its own state: a prefix of its own
# keeps annotations other parts of Warren put on a Sandbox meaningful to kopf's diffs.
ANNOTATION_PREFIX = "controller.warren.dev"
READY = "Ready"

# The workspace hook: the pod volume source for a Sandbox (podspec.blockd_volume, the
# warren-blockd CSI driver's), or None for no workspace volume.
WorkspaceFn = Callable[[Mapping[str, Any]], Obj | None]


def no_workspace(_: Mapping[str, Any]) -> Obj | None:
    return None


@dataclass(frozen=True)
class ControllerOptions:
    pod: PodOptions = field(default_factory=PodOptions)
    # A safety net under the event-driven passes (a missed watch event, a refused create
    # that may now succeed); each pass is a couple of GETs when nothing changed.
    resync_seconds: float = 60.0
    # Backoff for a handler that failed (the API server unreachable, say).
    retry_seconds: float = 2.0
    # The finalizer waits for its pod's DELETED event, and polls as a fallback: first after
    # this long, doubling up to the maximum, for up to `patience` before it reports the pod
    # stuck and retries.
    finalize_poll_seconds: float = 0.5
    finalize_poll_max_seconds: float = 8.0
    finalize_patience_seconds: float = 120.0
    # Threads for the handlers, which make blocking API calls.
    workers: int = 16
    workspace: WorkspaceFn = no_workspace


@dataclass(frozen=True)
class Observation:
    """What the cluster shows for a Sandbox, as its status will say it."""

    phase: Phase
    ready: bool
    reason: str
    message: str


def _terminating(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _stopped(sandbox: Mapping[str, Any]) -> bool:
    return bool((sandbox.get("spec") or {}).get("stopped"))


def _waiting(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first container's waiting or terminated reason: why a pod is not running."""
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = container.get("state") or {}
        for key in ("waiting", "terminated"):
            detail = state.get(key)
            if key == "terminated" and detail and detail.get("exitCode") == 0:
                continue  # an init container that did its work (the agent's install) is no reason
            if detail and detail.get("reason"):
                return str(detail["reason"]), str(detail.get("message") or detail["reason"])
    return None


def _pod_condition(pod: Mapping[str, Any], kind: str) -> Obj | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def observe(sandbox: Mapping[str, Any], pod: Mapping[str, Any] | None) -> Observation:
    """The Sandbox's phase from what its pod shows. Pure: the unit tests drive it with
    pods as the API returns them."""
    name = pod_name(str(sandbox["metadata"]["uid"]))
    if _terminating(sandbox):
        return Observation("Terminating", False, "Deleting", "the sandbox is being deleted")
    if pod is None:
        if _stopped(sandbox):
            return Observation("Stopped", False, "Stopped", "the sandbox is stopped and runs no pod")
        return Observation("Pending", False, "PodCreating", f"creating pod {name}")
    if _terminating(pod):
        if _stopped(sandbox):
            return Observation("Terminating", False, "Stopping", f"pod {name} is stopping")
        return Observation("Pending", False, "PodReplacing", f"pod {name} is stopping and will be made again")
    return _observe_pod(name, pod)


def _observe_pod(name: str, pod: Mapping[str, Any]) -> Observation:
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    waiting = _waiting(pod)
    if phase == "Running":
        ready = _pod_condition(pod, "Ready")
        if ready and ready.get("status") == "True":
            return Observation("Running", True, "PodReady", f"pod {name} is running")
        reason, message = waiting or ("ContainersNotReady", f"pod {name} runs but is not ready")
        return Observation("Pending", False, reason, message)
    if phase in {"Failed", "Succeeded"}:
        status = pod.get("status") or {}
        reason = str(status.get("reason") or ("PodFailed" if phase == "Failed" else "PodExited"))
        message = str(status.get("message") or (waiting[1] if waiting else f"pod {name} ended: {phase}"))
        return Observation("Failed", False, reason, message)
    scheduled = _pod_condition(pod, "PodScheduled")
    if not waiting and scheduled and scheduled.get("status") == "False":
        waiting = (
            str(scheduled.get("reason") or "Unschedulable"),
            str(scheduled.get("message") or "no node can take the pod"),
        )
    reason, message = waiting or ("PodPending", f"pod {name} is {phase}")
    return Observation("Pending", False, reason, message)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_for(sandbox: Mapping[str, Any], seen: Observation, now: str | None = None) -> Obj:
    """The status fields this controller owns. The Ready condition keeps its transition
    time while its value holds, as Kubernetes conditions do; conditions of other types
    are carried over (a merge patch replaces the whole list)."""
    generation = (sandbox.get("metadata") or {}).get("generation")
    conditions = list((sandbox.get("status") or {}).get("conditions") or [])
    value = "True" if seen.ready else "False"
    before = next((c for c in conditions if c.get("type") == READY), None)
    transition = now or _now()
    if before is not None and before.get("status") == value and before.get("lastTransitionTime"):
        transition = str(before["lastTransitionTime"])
    condition: Obj = {
        "type": READY,
        "status": value,
        "reason": seen.reason,
        "message": seen.message,
        "lastTransitionTime": transition,
    }
    status: Obj = {
        "phase": seen.phase,
        "conditions": [c for c in conditions if c.get("type") != READY] + [condition],
    }
    if generation is not None:
        condition["observedGeneration"] = generation
        status["observedGeneration"] = generation
    return status


def _same_status(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(current.get(key) == value for key, value in wanted.items())


class Reconciler:
    """The one pass every trigger runs. Safe to run any number of times, concurrently and
    after a crash at any point: it acts only on what it reads from the API server."""

    def __init__(self, kube: Kube, options: ControllerOptions | None = None) -> None:
        self.kube = kube
        self.options = options or ControllerOptions()
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        # Sandbox uid -> wakes its finalizer, for as long as one waits for the pod to go.
        self._finalizing: dict[str, Callable[[], object]] = {}

    @contextmanager
    def _serialized(self, namespace: str, name: str) -> Iterator[None]:
        # kopf's handlers, the pod watch and the resync timer reach the same Sandbox from
        # different threads; one pass at a time keeps their status writes in order.
        with self._guard:
            lock = self._locks.setdefault(f"{namespace}/{name}", threading.Lock())
        with lock:
            yield

    def reconcile(self, namespace: str, name: str) -> Observation | None:
        """Converge one Sandbox and write its status; None if it is gone or being
        deleted (the finalizer's business)."""
        with self._serialized(namespace, name):
            sandbox = self.kube.read_sandbox(namespace, name)
            if sandbox is None or _terminating(sandbox):
                return None
            return self._pass(sandbox)

    def _pass(self, sandbox: Obj) -> Observation:
        seen = self.converge(sandbox)
        self.write_status(sandbox, seen)
        return seen

    def converge(self, sandbox: Obj) -> Observation:
        namespace = sandbox["metadata"]["namespace"]
        uid = str(sandbox["metadata"]["uid"])
        name = pod_name(uid)
        # Read afresh, never taken from a pod event: a pass from another trigger may already
        # have seen a later state, and an event's older one would set the status back.
        pod = self.kube.read_pod(namespace, name)
        if pod is not None and controller_uid(pod) != uid:
            return self._not_ours(name)

        if _stopped(sandbox):
            if pod is not None and not _terminating(pod):
                self.kube.delete_pod(namespace, name, uid=pod["metadata"]["uid"])
                log.info("stopping %s/%s: deleted pod %s", namespace, sandbox["metadata"]["name"], name)
                pod = self.kube.read_pod(namespace, name)
            return observe(sandbox, pod)

        if pod is not None and not _terminating(pod):
            annotations = pod["metadata"].get("annotations") or {}
            if annotations.get(SPEC_HASH_ANNOTATION) != spec_hash(sandbox):
                # A pod's spec is immutable: replace it. The new one is made once the
                # old one is gone (its DELETED event, or the next pass).
                self.kube.delete_pod(namespace, name, uid=pod["metadata"]["uid"])
                log.info(
                    "the spec of %s/%s changed: replacing pod %s",
                    namespace,
                    sandbox["metadata"]["name"],
                    name,
                )
                pod = self.kube.read_pod(namespace, name)
        if pod is None:
            created = self._create(sandbox)
            if isinstance(created, Observation):
                return created
            pod = created
        return observe(sandbox, pod)

    def _create(self, sandbox: Obj) -> Obj | Observation:
        namespace = sandbox["metadata"]["namespace"]
        uid = str(sandbox["metadata"]["uid"])
        try:
            body = pod_for(
                sandbox,
                options=self.options.pod,
                workspace_volume=self.options.workspace(sandbox),
                node=self._parent_node(sandbox),
            )
        except SandboxSpecError as exc:
            return Observation("Failed", False, "InvalidSpec", str(exc))
        try:
            pod = self.kube.create_pod(namespace, body)
        except ApiException as exc:
            if exc.status == HTTPStatus.CONFLICT:
                # Made by an earlier pass (this one raced it, or a crash came between
                # the create and the status write): adopt it if it is ours.
                existing = self.kube.read_pod(namespace, body["metadata"]["name"])
                if existing is None:
                    return Observation("Pending", False, "PodCreating", "the pod was replaced; retrying")
                if controller_uid(existing) != uid:
                    return self._not_ours(body["metadata"]["name"])
                return existing
            if exc.status in {HTTPStatus.BAD_REQUEST, HTTPStatus.FORBIDDEN, HTTPStatus.UNPROCESSABLE_ENTITY}:
                # The admission floor, a quota or validation refused the pod: say so in
                # the status instead of retrying blindly; the resync tries again.
                return Observation("Failed", False, "PodRefused", error_message(exc))
            raise
        log.info("created pod %s for %s/%s", body["metadata"]["name"], namespace, sandbox["metadata"]["name"])
        return pod

    def _parent_node(self, sandbox: Obj) -> str | None:
        """Where the workspace a new sandbox forks is mounted now, if anywhere: the child
        goes there, so its fork is taken by the blockd that holds every parent write."""
        workspace = (sandbox.get("spec") or {}).get("workspace") or {}
        source = workspace.get("forkOf")
        if not source or self.options.workspace is no_workspace:
            return None
        namespace = sandbox["metadata"]["namespace"]
        for pod in self.kube.list_pods(namespace, f"{WORKSPACE_LABEL}={source}"):
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not _terminating(pod):
                return str(node)
        return None

    @staticmethod
    def _not_ours(name: str) -> Observation:
        return Observation(
            "Failed",
            False,
            "PodNameTaken",
            f"a pod named {name} exists that this Sandbox does not own: delete it to let the sandbox start",
        )

    def write_status(self, sandbox: Obj, seen: Observation) -> None:
        current = sandbox.get("status") or {}
        wanted = status_for(sandbox, seen)
        if _same_status(current, wanted):
            return
        meta = sandbox["metadata"]
        try:
            self.kube.patch_sandbox_status(meta["namespace"], meta["name"], wanted)
        except ApiException as exc:
            if exc.status != HTTPStatus.NOT_FOUND:  # gone meanwhile: nothing to report on
                raise

    def finalize(self, namespace: str, name: str, uid: str, *, report: bool = True) -> bool:
        """Stop the Sandbox's pod; True once it is gone and the Sandbox may go too. With
        `report`, first write the Terminating status (once per wait is enough)."""
        with self._serialized(namespace, name):
            sandbox = self.kube.read_sandbox(namespace, name) if report else None
            if sandbox is not None and sandbox["metadata"]["uid"] == uid:
                self.write_status(sandbox, observe(sandbox, None))
            pod = self.kube.read_pod(namespace, pod_name(uid))
            if pod is not None and controller_uid(pod) == uid:
                if not _terminating(pod):
                    self.kube.delete_pod(namespace, pod["metadata"]["name"], uid=pod["metadata"]["uid"])
                    log.info("deleting %s/%s: deleted pod %s", namespace, name, pod["metadata"]["name"])
                return False
        with self._guard:
            self._locks.pop(f"{namespace}/{name}", None)
        return True

    @contextmanager
    def finalizing(self, uid: str, wake: Callable[[], object]) -> Iterator[None]:
        """While the Sandbox `uid` is finalized, its pod's events only wake the finalizer."""
        with self._guard:
            self._finalizing[uid] = wake
        try:
            yield
        finally:
            with self._guard:
                self._finalizing.pop(uid, None)

    def pod_changed(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """A pod this controller made changed: bring its Sandbox's status up to date, make
        the pod again if it vanished, or delete it if its Sandbox is gone."""
        uid = controller_uid(pod)
        with self._guard:
            wake = self._finalizing.get(uid or "")
        if wake is not None:
            # The Sandbox is being deleted and its finalizer owns the pod: reading the
            # Sandbox here would only find it terminating.
            if event_type == "DELETED":
                wake()
            return
        meta = pod.get("metadata") or {}
        owner = next(
            (
                ref
                for ref in meta.get("ownerReferences") or []
                if ref.get("uid") == uid and ref.get("controller")
            ),
            None,
        )
        if uid is None or owner is None:
            return
        namespace, name = str(meta["namespace"]), str(owner["name"])
        with self._serialized(namespace, name):
            sandbox = self.kube.read_sandbox(namespace, name)
            if sandbox is None or sandbox["metadata"]["uid"] != uid:
                # An orphan (its Sandbox went while no controller ran). The garbage collector
                # would remove it too; doing it now keeps "no pod without a Sandbox" prompt.
                if event_type != "DELETED" and not _terminating(pod):
                    self.kube.delete_pod(namespace, str(meta["name"]), uid=str(meta["uid"]))
                    log.info("deleted orphan pod %s/%s", namespace, meta["name"])
                return
            if not _terminating(sandbox):
                self._pass(sandbox)


def connection_info(kube: Kube) -> kopf.ConnectionInfo:
    """kopf's credentials from the same client configuration the handlers use, so the
    operator and its handlers always talk to the same cluster as the same identity."""
    configuration = kube.configuration
    header = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix(
        "authorization"
    )
    scheme: str | None = None
    token = header or None
    if header and " " in header:  # "Bearer <token>"; a bare token otherwise
        scheme, token = header.split(" ", 1)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


class MemoryDiffBase(kopf.DiffBaseStorage):
    """kopf's record of the last spec it handled, per Sandbox, kept in memory instead of an
    annotation: every pass is level-based, so a restarted controller that has forgotten it
    simply handles each Sandbox again, and each create is one API write cheaper. A deleting
    Sandbox needs none (deletion is its only cause from then on), so its entry goes then; one
    removed without its finalizer leaves its small entry until the next restart."""

    def __init__(self) -> None:
        super().__init__()
        self._essences: dict[str, kopf.BodyEssence] = {}

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        # Our progress annotations are kopf's state, not the Sandbox's (ProgressAnnotations
        # writes no marker for kopf to find them by).
        essence = super().build(body=body, extra_fields=extra_fields)
        annotations = (essence.get("metadata") or {}).get("annotations") or {}
        self.remove_annotations(essence, {k for k in annotations if k.startswith(f"{ANNOTATION_PREFIX}/")})
        self.remove_empty_stanzas(essence)
        return essence

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return self._essences.get(str(body.metadata.uid))

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        uid = str(body.metadata.uid)
        if body.metadata.get("deletionTimestamp"):
            self._essences.pop(uid, None)
        else:
            self._essences[uid] = essence

    def __len__(self) -> int:
        return len(self._essences)


class ProgressAnnotations(kopf.AnnotationsProgressStorage):
    """Handler progress in annotations under our prefix, written only while a handler
    retries, without the marker annotation kopf otherwise puts on every object it handles
    once (one more write per create). The marker's one use is to keep the prefix out of diff
    bases, which MemoryDiffBase does itself."""

    def _store_marker(self, prefix: str, patch: kopf.Patch, body: kopf.Body) -> None:
        return None


def settings_for(options: ControllerOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True  # one controller per deployment; no peering objects
    settings.persistence.finalizer = FINALIZER
    # Handler progress (written only while a handler retries) lives in annotations under our
    # prefix: the CRD's structural schema would prune kopf's default status fields anyway.
    settings.persistence.progress_storage = ProgressAnnotations(prefix=ANNOTATION_PREFIX, v1=False)
    settings.persistence.diffbase_storage = MemoryDiffBase()
    # The CRD is installed before the controller runs (`warren apply`); watching CRDs for
    # new resources would need a cluster-wide permission the controller has no use for.
    settings.scanning.disabled = True
    settings.posting.level = logging.WARNING  # Kubernetes events only for what went wrong
    settings.execution.max_workers = options.workers
    return settings


def build_registry(reconciler: Reconciler) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    kube = reconciler.kube
    retry = reconciler.options.retry_seconds

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(kube)

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="ensure", registry=registry, backoff=retry)
    @kopf.on.create(GROUP, VERSION, PLURAL, id="ensure", registry=registry, backoff=retry)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="ensure", registry=registry, backoff=retry)
    def ensure(namespace: str | None, name: str, **_: Any) -> None:
        reconciler.reconcile(str(namespace), name)

    # The first resync one interval after a Sandbox appears: the create or resume handler
    # has just made the same pass, and thousands of Sandboxes appearing at once (a start,
    # a burst of creates) would otherwise double the load exactly when it peaks.
    @kopf.timer(
        GROUP,
        VERSION,
        PLURAL,
        id="resync",
        registry=registry,
        interval=reconciler.options.resync_seconds,
        initial_delay=reconciler.options.resync_seconds,
        backoff=retry,
    )
    def resync(namespace: str | None, name: str, **_: Any) -> None:
        reconciler.reconcile(str(namespace), name)

    # Finalizers make their API calls on threads of their own: asyncio's default pool has
    # only a few, and a mass delete must not starve the other handlers either.
    finalize_pool = ThreadPoolExecutor(reconciler.options.workers, thread_name_prefix="finalize")

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="finalize", registry=registry, backoff=retry)
    async def finalize(namespace: str | None, name: str, uid: str, **_: Any) -> None:
        # Waiting for the pod is the normal case (its grace period), not a failure: wait
        # here, without holding a thread, rather than raise kopf's retry error each time.
        # The pod's DELETED event ends the wait; polls that back off are the fallback, so
        # thousands of Sandboxes deleted at once do not poll the API server in a loop.
        # Patience counts only the time spent waiting for the pod, not for a thread: in a
        # mass delete the queue for threads is long, and counting it would call healthy
        # pods stuck and retry their finalizers (half of them, at 5,000 at once).
        options = reconciler.options
        loop = asyncio.get_running_loop()
        gone = asyncio.Event()
        poll, waited, report = options.finalize_poll_seconds, 0.0, True
        step = functools.partial(reconciler.finalize, str(namespace), name, uid)
        with reconciler.finalizing(uid, lambda: loop.call_soon_threadsafe(gone.set)):
            while not await loop.run_in_executor(finalize_pool, functools.partial(step, report=report)):
                report = False
                if waited > options.finalize_patience_seconds:
                    raise kopf.TemporaryError(f"the pod of {namespace}/{name} has not stopped", delay=retry)
                started = time.monotonic()
                with suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), poll)
                waited += time.monotonic() - started
                gone.clear()
                poll = min(poll * 2, options.finalize_poll_max_seconds)

    @kopf.on.event("v1", "pods", id="pod-event", registry=registry, labels={MANAGED_BY_LABEL: MANAGED_BY})
    def pod_event(event: kopf.RawEvent, **_: Any) -> None:
        reconciler.pod_changed(str(event.get("type") or ""), event["object"])

    return registry


def run(
    namespaces: Sequence[str],
    kubeconfig: str | None,
    *,
    options: ControllerOptions | None = None,
    liveness_endpoint: str | None = None,
) -> None:
    """Run the controller for Sandboxes in `namespaces` until SIGINT/SIGTERM. A kubeconfig
    path, or None for the pod's service account."""
    if not namespaces:
        raise ValueError("name at least one sandbox namespace to watch")
    options = options or ControllerOptions()
    reconciler = Reconciler(Kube.connect(kubeconfig), options)
    kopf.run(
        registry=build_registry(reconciler),
        settings=settings_for(options),
        standalone=True,
        namespaces=list(namespaces),
        liveness_endpoint=liveness_endpoint,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="warren-control controller", description="Reconcile Sandbox resources into gVisor pods."
    )
    parser.add_argument(
        "--namespace", action="append", required=True, help="a sandbox namespace (repeatable)"
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file; the pod's service account when absent")
    parser.add_argument("--runtime-class", default=PodOptions.runtime_class)
    parser.add_argument(
        "--image-pull-policy", choices=["Always", "IfNotPresent", "Never"], default="IfNotPresent"
    )
    add_request_arguments(parser)
    parser.add_argument("--resync-seconds", type=float, default=ControllerOptions.resync_seconds)
    parser.add_argument(
        "--workers", type=int, default=ControllerOptions.workers, help="threads for the handlers"
    )
    parser.add_argument(
        "--workspaces",
        action="store_true",
        help="give every sandbox its workspace through the blockd CSI driver (the node runs it)",
    )
    parser.add_argument("--liveness", help="serve liveness here, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--log-format", choices=["json", "plain"], default="json")
    parser.add_argument("--verbose", action="store_true")
    leader.add_arguments(parser)
    args = parser.parse_args(argv)
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    options = ControllerOptions(
        pod=PodOptions(
            runtime_class=args.runtime_class,
            image_pull_policy=cast(PullPolicy, args.image_pull_policy),
            cpu_request_percent=args.cpu_request_percent,
            memory_request_percent=args.memory_request_percent,
            agent_image=args.agent_image,
        ),
        resync_seconds=args.resync_seconds,
        workers=args.workers,
        workspace=blockd_volume if args.workspaces else no_workspace,
    )
    leader.lead_if_asked(args)
    run(args.namespace, args.kubeconfig, options=options, liveness_endpoint=args.liveness)


if __name__ == "__main__":
    main()
