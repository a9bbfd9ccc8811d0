"""The controller: every Sandbox resource becomes exactly one gVisor pod.

Exactly one, even across crashes, because nothing here remembers anything: the pod's name
is a function of the Sandbox's uid (podspec.pod_name), so every pass reads the cluster,
finds the pod it made or meets AlreadyExists, and converges from there. The pod's owner
reference lets the garbage collector remove a pod whose Sandbox vanished while no
controller ran. A finalizer keeps the Sandbox until its pod has stopped; its workspace
outlives it in object storage for the control plane's retention period.

Every trigger runs the same level-based pass: every event of a Sandbox (a list at the
start included), a periodic resync, and every event of a pod this controller made (so pod
phase changes reach the Sandbox's status, and a pod deleted behind our back is made again).

A pass reads from memory, not from the API server: Sandboxes and pods as the controller's
own informers deliver them (informer.Store, fed by Watches), each in the order the server
made the changes, so a pass never sees an older state than the one before it. It asks the
server only where memory cannot answer: before the pod informer has listed, and before it
deletes a pod whose Sandbox it does not hold (an orphan, or a Sandbox whose event is late).
The status it last wrote is remembered too, because the watch may not have brought it back
yet; only this controller writes those fields.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import hashlib
import hmac
import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Literal, cast

from warren_common import logs

from warren_control import agentclient, ids, leader
from warren_control.binder import Binder, BindError, BindOptions
from warren_control.informer import CoalescingQueue, Informer, Later, Store
from warren_control.kube import ApiException, Kube, Obj, error_message
from warren_control.podspec import (
    BIND_AT_CLAIM_ANNOTATION,
    CONTAINER,
    FINALIZER,
    FORK_SIBLINGS_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    POOL_LABEL,
    POOL_SKIPPED_ANNOTATION,
    RESTORE_ANNOTATION,
    RESUME_SLOT_ANNOTATION,
    RESUME_SLOT_RENEW_S,
    SANDBOX_UID_LABEL,
    SPEC_HASH_ANNOTATION,
    WORKSPACE_LABEL,
    PodOptions,
    PullPolicy,
    SandboxSpecError,
    add_request_arguments,
    binds_at_claim,
    binds_in_place,
    blockd_volume,
    claim_patch,
    controller_uid,
    ephemeral_container_for,
    fork_siblings,
    has_agent,
    pod_for,
    pod_name,
    pod_workspace_id,
    pool_hash,
    pool_misfit,
    pool_of,
    pool_pod_for,
    pool_pod_name,
    pool_refill_per_second,
    pool_size,
    restored_from,
    resume_misfit,
    resumes,
    sandbox_container_id,
    sandbox_workspace_id,
    spec_hash,
    unbound,
    verifier_of,
    verify_pod_name,
    with_workspace_id,
)
from warren_control.workspaces import WorkspaceStoreError

log = logging.getLogger(__name__)

Phase = Literal["Pending", "Running", "Stopped", "Failed", "Terminating"]

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
    # A new Sandbox's status is first written when its pod runs, or when it shows something
    # other than a normal start (unschedulable, an image that cannot be pulled), or after
    # this long, whichever comes first: a pod that starts in time costs one status write,
    # not one per step of its start. A minute, because starts are slow exactly when the API
    # server is busiest (a burst of creates, whose rate its work per create limits): at 10 s,
    # 5,000 Sandboxes created at once on two cores cost 9,830 status writes, not 5,000. The
    # API reads a starting sandbox's phase from its pod, so only the resource waits.
    quiet_start_seconds: float = 60.0
    workspace: WorkspaceFn = no_workspace
    # Removes a workspace from object storage (the workspace store's release): a pool pod
    # that goes unclaimed takes its new, empty workspace with it. None: they stay there.
    release_workspace: Callable[[str], object] | None = None
    # The newest write record of a workspace proven in storage (the workspace store's
    # proof): the generation a memory image is valid over, read once its pod is gone.
    workspace_seq: Callable[[str], int] | None = None
    # A sandbox whose node has not been Ready for this long (its kubelet stopped answering)
    # gets a new pod on another node: the old one is deleted without waiting for that
    # kubelet, which will not confirm. Longer than warren-blockd's hold of a workspace, so
    # the new node can take the workspace over as soon as the pod lands there.
    node_lost_seconds: float = 60.0
    # How to reach the nodes' bind API, for pools whose pods take their workspace at the
    # claim (bindAtClaim), and for memory capture and resume. None: neither is done.
    bind: BindOptions | None = None


@dataclass(frozen=True)
class Observation:
    """What the cluster shows for a Sandbox, as its status will say it."""

    phase: Phase
    ready: bool
    reason: str
    message: str
    # The pod it runs in (a claimed pool pod's name is not the Sandbox's own), and, from the
    # pass that made or claimed that pod, how it started (the POOL_CONDITION condition).
    pod: str | None = None
    start: Obj | None = None
    # From the pass that replaced a pod its node lost: the NODE_LOST_CONDITION condition.
    moved: Obj | None = None


# Why a pod is Pending while it starts as it should (observe's reasons): a new Sandbox's
# status does not report them before ControllerOptions.quiet_start_seconds.
STARTING = frozenset(
    {
        "PodCreating",
        "PodPending",
        "ContainerCreating",
        "PodInitializing",
        "ContainersNotReady",
        "ContainerStarting",
    }
)

# A memory image is a restore point only once a pod restored from it runs (onto a fork of
# its workspace, which is then released); one that has not run after this long never will.
VERIFY_TIMEOUT_SECONDS = 120.0
# Why a restored container is not running yet, while its restore is still under way.
RESTORING = frozenset({"ContainerCreating", "PodInitializing"})

# A claim tries this many ready pool pods (each one another claim may have taken first)
# before the Sandbox starts cold.
CLAIM_ATTEMPTS = 5
# A pool pod created but not yet seen by the watch counts as the pool's for this long.
POOL_CREATE_GRACE_SECONDS = 60.0


# How a Sandbox's pod started, as a condition, so the API shows it with the others: True,
# a pool's ready pod was claimed; False, the pod was started cold, and the reason says why.
POOL_CONDITION = "PoolClaimed"
# Set on a Sandbox whose pod was replaced because its node was lost: when, and what its
# workspace came back with.
NODE_LOST_CONDITION = "NodeLost"


def _cold(reason: str, message: str) -> Obj:
    return {"type": POOL_CONDITION, "status": "False", "reason": reason, "message": message}


def _ready(pod: Mapping[str, Any]) -> bool:
    ready = _pod_condition(pod, "Ready") or {}
    return (pod.get("status") or {}).get("phase") == "Running" and ready.get("status") == "True"


def _node(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


def _ready_condition(node: Mapping[str, Any]) -> Obj | None:
    """A Node's Ready condition, if it reports one."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == READY), None)


def _terminating(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _stopped(sandbox: Mapping[str, Any]) -> bool:
    return bool((sandbox.get("spec") or {}).get("stopped"))


def _memory_image(sandbox: Mapping[str, Any]) -> Obj | None:
    """The Sandbox's memory image record (status.memoryImage), if it has one."""
    record = (sandbox.get("status") or {}).get("memoryImage")
    return dict(record) if record else None


def _cold_start(sandbox: Mapping[str, Any]) -> bool:
    """Whether the start asks to start afresh rather than resume from a memory image."""
    return bool((sandbox.get("spec") or {}).get("coldStart"))


def _restored(pod: Mapping[str, Any]) -> bool:
    return bool(((pod.get("metadata") or {}).get("annotations") or {}).get(RESTORE_ANNOTATION))


def _memory_from(sandbox: Mapping[str, Any]) -> Obj | None:
    """The memory image a fork's child is to be restored from (spec.memoryFrom), until a
    pod restored from it has run, or the child asked to start afresh."""
    spec, status = sandbox.get("spec") or {}, sandbox.get("status") or {}
    origin = spec.get("memoryFrom")
    if not origin or status.get("restoredFrom") or spec.get("coldStart"):
        return None
    return dict(origin)


def _restore_verdict(pod: Mapping[str, Any]) -> str | None:
    """ "" once a restored pod runs (every container restored), why not if its restore
    failed, None while it is still under way."""
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    if (
        status.get("phase") == "Running"
        and containers
        and all("running" in (c.get("state") or {}) for c in containers)
    ):
        return ""
    if status.get("phase") in {"Failed", "Succeeded"}:
        return f"its pod ended ({status.get('reason') or status.get('phase')})"
    waiting = _waiting(pod)
    if waiting is not None and waiting[0] not in RESTORING:
        return f"{waiting[0]}: {waiting[1]}"
    return None


def _since(stamp: str) -> float:
    """Seconds since an RFC 3339 time this controller wrote (_now)."""
    return (datetime.now(UTC) - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()


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


def observe(
    sandbox: Mapping[str, Any], pod: Mapping[str, Any] | None, *, agent_answers: bool = False
) -> Observation:
    """The Sandbox's phase from what its pod shows (and, for a sandbox container added to a
    claimed pool pod, whether its agent has answered: `agent_answers`). Pure: the unit tests
    drive it with pods as the API returns them."""
    name = pod["metadata"]["name"] if pod is not None else pod_name(str(sandbox["metadata"]["uid"]))
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
    return _observe_pod(name, pod, agent_answers)


def _observe_pod(name: str, pod: Mapping[str, Any], agent_answers: bool = False) -> Observation:
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    waiting = _waiting(pod)
    if phase == "Running" and (pod["metadata"].get("annotations") or {}).get(BIND_AT_CLAIM_ANNOTATION):
        return _observe_started(name, pod, agent_answers)
    if (
        agent_answers
        and _slot(pod)
        and phase == "Pending"
        and (waiting or ("ContainerCreating",))[0] == "ContainerCreating"
    ):
        # A resumed slot whose agent (started after the restore) answered and was claimed:
        # kubelet reports the containers at its next look.
        return Observation("Running", True, "PodReady", f"pod {name} is running")
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


# A bindAtClaim pool refills once the pods claimed from it run, or this long after a claim
# at the latest (_refill_after_claim).
REFILL_AT_THE_LATEST_S = 20.0
# How long a claimed bindAtClaim pod's agent is asked for before kubelet's report is left
# to say whether its container runs.
AGENT_START_WAIT_S = 30.0


# A resume slot is claimed only this long after it was made (its volume published and its
# sandbox made by then, the bind finds it) and no later than this before it is renewed.
SLOT_SETTLE_S = 3.0
SLOT_CLAIM_MARGIN_S = 10.0
SLOT_POLL_S = 0.02


def _slot(pod: Mapping[str, Any]) -> bool:
    return bool(((pod.get("metadata") or {}).get("annotations") or {}).get(RESUME_SLOT_ANNOTATION))


def _age(pod: Mapping[str, Any]) -> float:
    made = (pod.get("metadata") or {}).get("creationTimestamp")
    return _since(str(made)) if made else 0.0


def _slot_ready(pod: Mapping[str, Any]) -> bool:
    """A resume slot a resume may claim: on a node, waiting for its image (no container of
    it started or ended), settled, and not about to be renewed."""
    status = pod.get("status") or {}
    if not _node(pod) or _terminating(pod) or status.get("phase") != "Pending":
        return False
    waiting = _waiting(pod)
    if waiting is not None and waiting[0] != "ContainerCreating":
        return False
    return SLOT_SETTLE_S <= _age(pod) <= RESUME_SLOT_RENEW_S - SLOT_CLAIM_MARGIN_S


def _ready_test(pool: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool]:
    """What makes the pool's pod ready to hand out: a resume slot waiting, else a pod Ready."""
    return _slot_ready if resumes(pool) else _ready


def _awaiting_its_container(pod: Mapping[str, Any]) -> bool:
    """A bindAtClaim pool pod a Sandbox claimed, whose sandbox container is not there yet."""
    if not (pod["metadata"].get("annotations") or {}).get(BIND_AT_CLAIM_ANNOTATION):
        return False
    if pool_of(pod) is not None:
        return False  # still the pool's
    added = (pod.get("spec") or {}).get("ephemeralContainers") or []
    return not any(c.get("name") == CONTAINER for c in added)


def _observe_started(name: str, pod: Mapping[str, Any], agent_answers: bool) -> Observation:
    """A claimed bindAtClaim pool pod: the sandbox runs once its own container does (the
    pod's readiness is the holding container's), or once its agent, that container's
    process, has answered (kubelet reports the container only at its next look)."""
    statuses = (pod.get("status") or {}).get("ephemeralContainerStatuses") or []
    state = next((s.get("state") or {} for s in statuses if s.get("name") == CONTAINER), {})
    if "running" in state or (agent_answers and "terminated" not in state):
        return Observation("Running", True, "PodReady", f"pod {name} is running")
    if "terminated" in state:
        ended = state["terminated"]
        message = str(ended.get("message") or f"the sandbox's container ended ({ended.get('exitCode')})")
        return Observation("Failed", False, str(ended.get("reason") or "ContainerEnded"), message)
    waiting = state.get("waiting") or {}
    if waiting.get("reason") and waiting["reason"] != "ContainerCreating":
        return Observation("Pending", False, str(waiting["reason"]), str(waiting.get("message") or ""))
    return Observation(
        "Pending", False, "ContainerStarting", f"starting the sandbox's container in pod {name}"
    )


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_for(sandbox: Mapping[str, Any], seen: Observation, now: str | None = None) -> Obj:
    """The status fields this controller owns. The Ready condition keeps its transition
    time while its value holds, as Kubernetes conditions do; conditions of other types
    are carried over (a merge patch replaces the whole list)."""
    generation = (sandbox.get("metadata") or {}).get("generation")
    conditions = list((sandbox.get("status") or {}).get("conditions") or [])
    for given in (seen.start, seen.moved):
        if given is not None:
            stamped = {**given, "lastTransitionTime": now or _now()}
            conditions = [c for c in conditions if c.get("type") != stamped["type"]] + [stamped]
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
    if seen.pod is not None:
        status["podName"] = seen.pod
    return status


def _same_status(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(current.get(key) == value for key, value in wanted.items())


def _deleting(pod: Obj) -> Obj:
    """The pod as the server holds it once it accepted a graceful delete; its own events
    follow, so a pass need not read it again."""
    return {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": _now()}}


class Reconciler:
    """The one pass every trigger runs. Safe to run any number of times, concurrently and
    after a crash at any point: it acts only on what the watches delivered or the API server
    answered."""

    def __init__(self, kube: Kube, options: ControllerOptions | None = None) -> None:
        self.kube = kube
        self.options = options or ControllerOptions()
        self.binder = Binder(kube, self.options.bind) if self.options.bind else None
        # Filled by the informers of Watches.
        self.sandboxes = Store()
        self.pods = Store(index=SANDBOX_UID_LABEL)
        self.pools = Store()
        self.nodes = Store()  # cluster-scoped: namespace ""
        # Sandbox uid -> the NODE_LOST_CONDITION its next status carries, once its pod was
        # replaced for a lost node.
        self._moved: dict[str, Obj] = {}
        # Asks for a pass of a pool (namespace, name); PodEvents queues it.
        self.request_pool_pass: Callable[[str, str], object] = lambda _namespace, _name: None
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        # Sandbox uid -> wakes its finalizer, for as long as one waits for the pod to go.
        self._finalizing: dict[str, Callable[[], object]] = {}
        # Sandbox uid -> the status this controller last wrote there.
        self._written: dict[str, Obj] = {}
        # Sandbox uid -> the pod made for it or the pool pod it claimed, until the watch
        # shows that pod (a second pass in between would make it again, or claim another);
        # and the names of pool pods claimed here that the watch may still show unclaimed.
        self._unseen: dict[str, Obj] = {}
        # bindAtClaim pool pods (uid) given their sandbox's container here, until they go:
        # the watch may show such a pod as it was before, and the container goes in once.
        self._started_pods: set[str] = set()
        # Of those, and of resumed slots, the ones whose agent has answered (_await_agent,
        # _await_slot); resumed slots (uid) whose agent is being claimed.
        self._agent_answers: set[str] = set()
        self._slot_claiming: set[str] = set()
        # bindAtClaim pools (namespace, name) -> their claimed pods still starting.
        # bindAtClaim pools whose claimed pods are still starting: (how many, since when).
        self._pool_starting: dict[tuple[str, str], tuple[int, float]] = {}
        # Sandbox uid -> (when its pod was made here, how it started (POOL_CONDITION)), while
        # no status has been written for it (see _quiet).
        self._starting: dict[str, tuple[float, Obj | None]] = {}
        # Asks for a pass of the Sandbox whose pod this is, after a delay; PodEvents does it.
        self.request_pass_later: Callable[[Obj, float], object] = lambda _pod, _delay: None
        self._taken: set[tuple[str, str]] = set()  # (namespace, name)
        # Pool uid -> {pod name: (created at, pod)} for pods the watch has not shown yet;
        # pool uid -> (refill tokens, when counted); pool uid -> the status written last.
        self._pool_creating: dict[str, dict[str, tuple[float, Obj]]] = {}
        self._pool_tokens: dict[str, tuple[float, float]] = {}
        self._pool_written: dict[str, Obj] = {}
        # Pool uid -> the uids of the pods this process made for it: the only ones it hands out.
        self._pool_made: dict[str, set[str]] = {}
        # Resume pool uid -> when a pass comes to renew its oldest slot (_renew_later); resume
        # pool (namespace, name) -> its slots being deleted whose wait was ended here.
        self._renewals: dict[str, float] = {}
        self._released: dict[tuple[str, str], set[str]] = {}
        # A pool pod's claim token is this key's HMAC of the pod's name: never stored, and
        # gone with the process, as the pods it made may no longer be handed out.
        self._claim_key = secrets.token_bytes(32)

    @contextmanager
    def _serialized(self, namespace: str, name: str) -> Iterator[None]:
        # The Sandbox's own events, its pod's events and the resync reach the same Sandbox from
        # different threads; one pass at a time keeps their status writes in order.
        with self._guard:
            lock = self._locks.setdefault(f"{namespace}/{name}", threading.Lock())
        with lock:
            yield

    def _sandbox(self, namespace: str, name: str) -> Obj | None:
        # A Sandbox's event fills the store before its pass is queued, so a miss here is a
        # Sandbox whose event has not come (a pass from its pod's event): ask the server.
        return self.sandboxes.get(namespace, name) or self.kube.read_sandbox(namespace, name)

    def _pods_of(self, namespace: str, uid: str) -> list[Obj]:
        """The pods the Sandbox `uid` controls, the live ones first: the one made for it
        (named for its uid) or the pool pod it claimed. More than one only for a moment
        (a replaced pod still stopping)."""
        if self.pods.synced(namespace):
            pods = self.pods.indexed(namespace, uid)
        else:  # the pod informer has not listed yet
            pods = self.kube.list_pods(namespace, f"{SANDBOX_UID_LABEL}={uid}")
        pods = [pod for pod in pods if controller_uid(pod) == uid]
        with self._guard:
            unseen = self._unseen.get(uid)
            if unseen is not None and any(p["metadata"]["name"] == unseen["metadata"]["name"] for p in pods):
                del self._unseen[uid]  # the watch has shown it
            elif unseen is not None:
                pods.append(unseen)
        return sorted(pods, key=_terminating)

    def watched_pod(self, event_type: str, pod: Obj) -> None:
        """A pod event from the watch, into memory: a pod made or claimed here is now in
        the store (or, deleted before a pass looked, gone from it) and no longer unseen."""
        self.pods.apply(event_type, pod)
        self._seen(pod)

    def watched_pods(self, namespace: str, pods: list[Obj]) -> list[Obj]:
        """A (re)list of the namespace's pods, into memory; the ones it no longer has."""
        gone = self.pods.replace(namespace, pods)
        for pod in [*gone, *pods]:
            self._seen(pod)
        return gone

    def _seen(self, pod: Mapping[str, Any]) -> None:
        uid = controller_uid(pod)
        if uid is None:
            return
        with self._guard:
            unseen = self._unseen.get(uid)
            if unseen is not None and unseen["metadata"]["name"] == pod["metadata"]["name"]:
                del self._unseen[uid]

    def _pod_of(self, namespace: str, uid: str) -> Obj | None:
        pods = self._pods_of(namespace, uid)
        return pods[0] if pods else None

    def sandbox_event(self, event_type: str, sandbox: Obj) -> None:
        """A Sandbox as the watch delivered it."""
        self.sandboxes.apply(event_type, sandbox)
        if event_type == "DELETED":
            with self._guard:
                self._written.pop(str(sandbox["metadata"]["uid"]), None)
                self._starting.pop(str(sandbox["metadata"]["uid"]), None)
                self._finalizing.pop(str(sandbox["metadata"]["uid"]), None)

    def reconcile(self, namespace: str, name: str) -> Observation | None:
        """Converge one Sandbox and write its status; None if it is gone or being
        deleted (the finalizer's business)."""
        with self._serialized(namespace, name):
            sandbox = self._sandbox(namespace, name)
            if sandbox is None or _terminating(sandbox):
                return None
            return self._pass(sandbox)

    def _pass(self, sandbox: Obj) -> Observation:
        sandbox, seen = self.converge(sandbox)
        if not self._quiet(sandbox, seen):
            self.write_status(sandbox, seen)
        return seen

    def _quiet(self, sandbox: Obj, seen: Observation) -> bool:
        """Whether this pass leaves the status unwritten: a Sandbox with none yet whose pod
        this process made is starting as it should, and not for long. Its pod's events
        bring the next passes, and a pass requested at its making comes when the quiet
        ends (_create), so a slow start is reported then."""
        uid = str(sandbox["metadata"]["uid"])
        with self._guard:
            starting = self._starting.get(uid)
            if starting is None or sandbox.get("status") or uid in self._written:
                return False
            made, start = starting
            if seen.phase != "Pending" or seen.reason not in STARTING:
                return False
            if time.monotonic() - made >= self.options.quiet_start_seconds:
                return False
            if seen.start is not None and start is None:
                self._starting[uid] = (made, seen.start)
            return True

    def converge(self, sandbox: Obj) -> tuple[Obj, Observation]:
        """Bring the Sandbox's pod to what its spec says: (the Sandbox, its workspace bound if
        this pass bound it; what the cluster shows)."""
        namespace = sandbox["metadata"]["namespace"]
        uid = str(sandbox["metadata"]["uid"])
        # Never the pod of the event that triggered this pass: a pass from another trigger
        # may already have seen a later state, and an event's older one would set it back.
        pods = self._pods_of(namespace, uid)
        pod = pods[0] if pods else None
        for extra in pods[1:]:
            if not _terminating(extra):  # one pod per Sandbox, whatever raced
                self._delete(extra)
        if pod is not None and self._workspaces and unbound(sandbox) and (found := pod_workspace_id(pod)):
            # A claimed pool pod whose binding a crash (or a watch still behind) kept from
            # the spec: the pod is the Sandbox's, and so is its workspace.
            sandbox = self._bind(sandbox, found)

        if _stopped(sandbox):
            kept = self._stop(sandbox, pod)
            return sandbox, kept if isinstance(kept, Observation) else observe(sandbox, kept)

        if pod is not None and not _terminating(pod) and _restored(pod) and _cold_start(sandbox):
            # A restore that never ran (its image would not restore): the caller chose a cold
            # start instead, which the next pass makes once this pod is gone.
            pod = self._delete(pod)
        if pod is not None:
            pod = self._kept(sandbox, pod)
        start: Obj | None = None
        if pod is None:
            sandbox, restored = self._start_from_memory(sandbox)
            if isinstance(restored, Observation):
                return sandbox, restored
            pod = restored
        if pod is None:
            sandbox, pod, start = self._claim(sandbox)
        if pod is None:
            if self._workspaces and unbound(sandbox):
                sandbox = self._bind(sandbox, ids.new_workspace_id())
            created = self._create(sandbox)
            if isinstance(created, Observation):
                return sandbox, created
            pod = created
        with self._guard:
            moved = self._moved.pop(uid, None)
        seen = self._observed(sandbox, pod)
        self._memory_used(sandbox, pod, seen)
        return sandbox, dataclasses.replace(seen, pod=pod["metadata"]["name"], start=start, moved=moved)

    def _observed(self, sandbox: Obj, pod: Obj) -> Observation:
        """observe(), knowing which agents answered here: a resumed slot whose agent is
        still being claimed (_await_slot) is not Running yet, whatever kubelet says."""
        with self._guard:
            answers = pod["metadata"]["uid"] in self._agent_answers
            claiming = pod["metadata"]["uid"] in self._slot_claiming
        seen = observe(sandbox, pod, agent_answers=answers)
        if claiming and seen.phase == "Running":
            return Observation("Pending", False, "ContainerStarting", "claiming the resumed sandbox's agent")
        return seen

    def _kept(self, sandbox: Obj, pod: Obj) -> Obj | None:
        """The Sandbox's pod as this pass leaves it: replaced if its node was lost (even one
        being deleted: that kubelet will never confirm), else kept or replaced by its spec."""
        if (lost := self._lost_node(pod)) is not None:
            return self._replace_lost(sandbox, pod, lost)
        return pod if _terminating(pod) else self._keep_or_replace(sandbox, pod)

    def _lost_node(self, pod: Obj) -> str | None:
        """Since when the pod's node has not been Ready, once that is `node_lost_seconds` or
        more ago; None while it is Ready, not yet that long (a pass is asked for then), or
        unknown (the nodes' watch has not listed them yet)."""
        node = _node(pod)
        if not node or not self.nodes.synced(""):
            return None
        found = self.nodes.get("", node)
        if found is None:
            return _now()  # the Node object was deleted: the node is gone for good
        ready = _ready_condition(found)
        if ready is None or ready.get("status") == "True":
            return None
        since = str(ready.get("lastTransitionTime") or _now())
        left = self.options.node_lost_seconds - _since(since)
        if left > 0:
            self.request_pass_later(pod, left + 1)
            return None
        return since

    def _replace_lost(self, sandbox: Obj, pod: Obj, since: str) -> Obj | None:
        """Delete the pod of a lost node at once (its kubelet will never confirm a graceful
        delete), so that a new one is made on another node; its workspace is restored
        there from object storage, taken over from the lost node (warren-blockd's hold)."""
        meta = pod["metadata"]
        log.warning(
            "node %s of pod %s has not been Ready since %s: replacing the pod on another node",
            _node(pod),
            meta["name"],
            since,
        )
        self.kube.delete_pod(meta["namespace"], meta["name"], uid=meta["uid"], force=True)
        with self._guard:
            self._moved[str(sandbox["metadata"]["uid"])] = {
                "type": NODE_LOST_CONDITION,
                "status": "True",
                "reason": "Rescheduled",
                "message": f"its node stopped answering at {since}; a new pod was made on another node, "
                "and its workspace is restored there with every write object storage had proven",
            }
        return _deleting(pod)

    def _stop(self, sandbox: Obj, pod: Obj | None) -> Obj | Observation | None:
        """The stopped Sandbox's pod as this pass leaves it: deleted (its memory captured
        first if the stop asks for that); or, if the capture failed, running on, and why."""
        if pod is None:
            self._seal(sandbox)
            self._verify(sandbox)
            return None
        if _terminating(pod):
            self._discard(sandbox, pod)  # again: a restart between delete and discard left it frozen
            return pod
        if self._capture(sandbox, pod) == "failed":
            error = (_memory_image(sandbox) or {}).get("error")
            return Observation(
                "Running",
                True,
                "MemoryCaptureFailed",
                f"not stopped: capturing its memory failed ({error}); stop it without "
                "memory capture to stop it anyway",
                pod=pod["metadata"]["name"],
            )
        deleted = self._delete(pod)
        log.info("stopping %s: deleted pod %s", sandbox["metadata"]["name"], pod["metadata"]["name"])
        self._discard(sandbox, deleted)
        return deleted

    # -- memory: capture on a stop that asks for it, resume from the image ----------------

    def _memory_used(self, sandbox: Obj, pod: Obj, seen: Observation) -> None:
        """Drop the memory image record of a started Sandbox once it is done with: its pod
        restored from it runs (status.restoredFrom names it), or it says a capture failed
        (a later stop may try anew)."""
        image = _memory_image(sandbox)
        if image is None:
            origin = _memory_from(sandbox)
            if origin is not None and seen.phase == "Running" and _restored(pod):
                self._patch_memory(sandbox, None, restored_from=str(origin["image"]))
            return
        if seen.phase == "Running" and _restored(pod):
            self._patch_memory(sandbox, None, restored_from=str(image.get("image")))
        elif image.get("error"):
            self._patch_memory(sandbox, None)

    def _capture(self, sandbox: Obj, pod: Obj) -> str | None:
        """Capture the running pod's memory if the stop asks for it: "captured" (the sandbox
        is frozen until _discard), "failed" (it runs on, and status.memoryImage.error says
        why; not tried again for this pod), or None (not asked, or already done)."""
        spec = sandbox.get("spec") or {}
        workspace = sandbox_workspace_id(sandbox)
        if not spec.get("memoryCapture") or workspace is None:
            return None
        if (pod.get("status") or {}).get("phase") != "Running":
            return None  # nothing ran yet whose memory would be worth keeping
        record = _memory_image(sandbox) or {}
        if record.get("podUid") == pod["metadata"]["uid"]:
            return "failed" if record.get("error") else None
        try:
            if self.binder is None:
                raise BindError("this controller cannot reach the nodes' warren-blockd (no bind token)")
            restored_from(pod, "")  # a pod that could never be restored is not captured
            captured = self.binder.capture(pod, workspace)
        except (BindError, SandboxSpecError) as exc:
            log.warning("capturing the memory of %s failed: %s", sandbox["metadata"]["name"], exc)
            self._patch_memory(sandbox, {"podUid": pod["metadata"]["uid"], "error": str(exc)})
            return "failed"
        self._patch_memory(
            sandbox,
            {
                "image": captured["image"],
                "workspace": workspace,
                "workspaceSeq": captured["workspace_seq"],
                "bytes": captured["bytes"],
                "node": pod["spec"]["nodeName"],
                "podUid": pod["metadata"]["uid"],
                "capturedAt": _now(),
            },
        )
        log.info("captured the memory of %s: %s", sandbox["metadata"]["name"], captured)
        return "captured"

    def _discard(self, sandbox: Obj, pod: Obj | None) -> None:
        """Kill the sandbox its capture left frozen, now that its pod is being deleted (it
        answers none of the runtime's signals: its pod would never finish going)."""
        record = _memory_image(sandbox)
        if pod is None or self.binder is None or not record or record.get("error"):
            return
        if record.get("podUid") != pod["metadata"]["uid"]:
            return  # another pod's image (a resumed sandbox stopped again without capture)
        try:
            self.binder.discard(pod)
        except BindError as exc:
            log.warning("discarding the frozen sandbox of %s failed: %s", sandbox["metadata"]["name"], exc)

    def _seal(self, sandbox: Obj) -> None:
        """Once the captured pod is gone (its workspace unmounted, which writes ext4's own
        bookkeeping, and proven in storage): record the write record the image is valid over."""
        record = _memory_image(sandbox)
        if not record or record.get("error") or "sealedSeq" in record or self.options.workspace_seq is None:
            return
        try:
            sealed = self.options.workspace_seq(str(record["workspace"]))
        except WorkspaceStoreError as exc:  # the next pass tries again
            log.warning("reading the workspace of %s failed: %s", sandbox["metadata"]["name"], exc)
            return
        self._patch_memory(sandbox, {**record, "sealedSeq": sealed})

    def _start_from_memory(self, sandbox: Obj) -> tuple[Obj, Obj | Observation | None]:
        """(the Sandbox; its pod resumed from its own memory image or, a fork's child,
        restored from its parent's; why not; or None: it has no image to start from)."""
        if _memory_image(sandbox) is not None:
            return sandbox, self._resume(sandbox)
        if (origin := _memory_from(sandbox)) is not None:
            return self._restore_fork(sandbox, origin)
        return sandbox, None

    def _resume(self, sandbox: Obj) -> Obj | Observation:
        """A pod restored from the Sandbox's memory image, on the node it was captured on,
        or on another if that one takes no pods now (not Ready, or cordoned): the image and
        the workspace come from object storage. Why not, if the image cannot be restored
        (never a cold start in its place)."""
        record = _memory_image(sandbox) or {}
        if record.get("error") or _cold_start(sandbox):
            # Nothing was captured, or the caller asked to start afresh: a cold start.
            if not self._end_verification(sandbox):
                return Observation(
                    "Pending", False, "PodCreating", "ending the restore proving its memory image"
                )
            self._patch_memory(sandbox, None)
            return self._create(sandbox)
        unproven = self._unproven(sandbox)
        if unproven is not None:
            return unproven
        record = _memory_image(sandbox) or {}
        node = self._resume_node(str(record["node"]))
        if node is None:
            return Observation("Pending", False, "Resuming", "no node takes pods now: waiting for one")
        return self._resume_on(sandbox, record, node)

    def _resume_on(self, sandbox: Obj, record: Obj, node: str) -> Obj | Observation:
        """The Sandbox resumed in a resume slot, else in a pod made for it on `node`."""
        in_slot = self._resume_in_slot(sandbox, record, node)
        if in_slot is not None:
            return in_slot
        try:
            if self.binder is None:
                raise BindError("this controller cannot reach the nodes' warren-blockd (no bind token)")
            staged = self.binder.stage(
                node, str(record["image"]), str(record["workspace"]), int(record["sealedSeq"])
            )
        except BindError as exc:
            return Observation("Failed", False, "ResumeRefused", str(exc))
        return self._create(sandbox, restore=(node, str(staged["path"])))

    def _resume_in_slot(self, sandbox: Obj, record: Obj, near: str) -> Obj | Observation | None:
        """The Sandbox resumed in a slot of a resume pool it fits (podspec.RESUME_SLOT_ANNOTATION):
        its image staged on the slot's node, the slot claimed, its workspace bound at the
        slot's awaiting volume, and only then the image put where the slot waits, so that the
        sandbox's container, made once the root is restored, mounts the workspace. The pod
        claimed (or, if the bind or the image's placing failed, being deleted: the next pass
        resumes anew); why not, if the image cannot be staged; None if no slot fits or the
        claim was lost: a pod is made for the resume instead."""
        found = self._free_slot(sandbox, near)
        if found is None or self.binder is None:
            return None
        slot, pool = found
        namespace, name, node = slot["metadata"]["namespace"], slot["metadata"]["name"], str(_node(slot))
        began = time.monotonic()
        try:
            staged = self.binder.stage(
                node, str(record["image"]), str(record["workspace"]), int(record["sealedSeq"])
            )
            claimed = self.kube.patch_pod(namespace, name, claim_patch(sandbox, slot, pool))
        except BindError as exc:
            with self._guard:
                self._taken.discard((namespace, name))
            return Observation("Failed", False, "ResumeRefused", str(exc))
        except ApiException as exc:
            with self._guard:
                self._taken.discard((namespace, name))
            if exc.status not in {HTTPStatus.CONFLICT, HTTPStatus.NOT_FOUND}:
                raise
            return None  # renewed or deleted since the watch showed it
        with self._guard:
            self._unseen[str(sandbox["metadata"]["uid"])] = claimed
            self._slot_claiming.add(str(claimed["metadata"]["uid"]))
        self._refill_after_claim(namespace, pool, later=True)
        try:
            self.binder.bind(claimed, {"id": record["workspace"]})
            self.binder.place(node, str(staged["path"]), name)
        except BindError as exc:
            with self._guard:
                self._slot_claiming.discard(str(claimed["metadata"]["uid"]))
            self._one_started((namespace, pool))
            log.warning("resuming %s in slot %s failed (%s): anew", sandbox["metadata"]["name"], name, exc)
            deleting = self._delete(claimed)
            self._release_slot(claimed)
            return deleting
        log.info(
            "resuming %s/%s in slot %s of pool %s on %s (image staged %s): %d ms to the image in place",
            namespace,
            sandbox["metadata"]["name"],
            name,
            pool,
            node,
            "from this node's copy" if staged.get("local") else "from object storage",
            (time.monotonic() - began) * 1000,
        )
        self._await_slot(sandbox, claimed, (namespace, pool))
        return claimed

    def _free_slot(self, sandbox: Obj, near: str) -> tuple[Obj, str] | None:
        """(a slot of a resume pool the paused Sandbox fits, on a node that takes pods, one on
        `near` (where its image was captured, whose copy of it stages at once) first; its
        pool's name), taken for this claim; None if there is none."""
        namespace = sandbox["metadata"]["namespace"]
        slots = [
            (pod, str(pool["metadata"]["name"]))
            for pool in self.pools.all()
            if pool["metadata"]["namespace"] == namespace
            and not _terminating(pool)
            and resume_misfit(sandbox, pool, self.options.pod) is None
            for pod in self._ready_pool_pods(pool)
            if self._takes_pods(str(_node(pod)))
        ]
        slots.sort(key=lambda found: (_node(found[0]) != near, -_age(found[0])))
        for pod, pool in slots:
            with self._guard:
                if (namespace, pod["metadata"]["name"]) in self._taken:
                    continue
                self._taken.add((namespace, pod["metadata"]["name"]))
            return pod, pool
        return None

    def _await_slot(self, sandbox: Obj, pod: Obj, pool: tuple[str, str]) -> None:
        """Once the resumed slot has its address and its agent (started by the postStart hook
        after the restore) answers: give the agent the Sandbox's token and environment and
        pass over the Sandbox, which runs from then on. An agent that cannot be claimed costs
        the pod (the next pass resumes anew, if the workspace still allows it)."""
        meta = pod["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], str(meta["uid"])
        began = time.monotonic()

        def claim() -> None:
            refused: str | None = f"no address within {AGENT_START_WAIT_S:.0f} s"
            try:
                while time.monotonic() - began < AGENT_START_WAIT_S:
                    seen = self.pods.get(namespace, name)
                    if seen is None or seen["metadata"]["uid"] != uid or _terminating(seen):
                        return
                    address = (seen.get("status") or {}).get("podIP")
                    if address:
                        left = AGENT_START_WAIT_S - (time.monotonic() - began)
                        answered = agentclient.wait_healthy(str(address), max(left, 1.0))
                        refused = self._claim_agent(sandbox, seen) if answered else "its agent did not answer"
                        break
                    time.sleep(SLOT_POLL_S)
                if refused:
                    log.warning(
                        "the agent of resumed slot %s was not claimed (%s): the pod goes", name, refused
                    )
                    self.kube.delete_pod(namespace, name, uid=uid)
                    return
                with self._guard:
                    self._agent_answers.add(uid)
                took = (time.monotonic() - began) * 1000
                log.info("resumed slot %s answers: %d ms after its image was in place", name, took)
            finally:
                with self._guard:
                    self._slot_claiming.discard(uid)
                self._one_started(pool)
            self.reconcile(sandbox["metadata"]["namespace"], sandbox["metadata"]["name"])

        threading.Thread(target=claim, name=f"slot-{name}", daemon=True).start()

    def _resume_node(self, captured: str) -> str | None:
        """The node a resume restores on: the one the image was captured on while it takes
        pods (its chunk cache may hold the image), else the Ready, uncordoned node with the
        fewest sandbox pods; None if there is none."""
        if self._takes_pods(captured) or not self.nodes.synced(""):
            return captured
        others = [
            str(n["metadata"]["name"])
            for n in self.nodes.all()
            if self._takes_pods(str(n["metadata"]["name"]))
        ]
        return min(others, key=lambda name: (len(self.pods_on(name)), name), default=None)

    def _takes_pods(self, name: str) -> bool:
        found = self.nodes.get("", name)
        return (
            found is not None and self.node_ready(name) and not (found.get("spec") or {}).get("unschedulable")
        )

    def _unproven(self, sandbox: Obj) -> Observation | None:
        """Why the Sandbox cannot resume from its memory image yet (it is still sealed, or
        proved by a restore), or never (it did not restore); None once it is a restore point."""
        if "sealedSeq" not in (_memory_image(sandbox) or {}):
            self._seal(sandbox)
            return Observation("Pending", False, "Resuming", "sealing the memory image's workspace")
        self._verify(sandbox)
        record = _memory_image(sandbox) or {}
        if record.get("unrestorable"):
            return Observation(
                "Failed",
                False,
                "ResumeRefused",
                f"its memory image did not restore when it was made ({record['unrestorable']}): "
                "start it cold to start afresh over its workspace",
            )
        if not (record.get("verification") or {}).get("done"):
            return Observation("Pending", False, "Resuming", "proving its memory image restores first")
        return None

    def _verify(self, sandbox: Obj) -> None:
        """Prove the sealed memory image restores: a pod restored from it onto a new fork of
        its workspace at its generation (the sandbox's own workspace is not touched), killed
        once it runs, its workspace then released. Only then is the image a restore point
        (verification.done with verifiedAt); one that does not restore is marked
        unrestorable, and no start resumes from it."""
        record = _memory_image(sandbox)
        if not record or record.get("error") or "sealedSeq" not in record:
            return
        check: Obj = dict(record.get("verification") or {})
        if check.get("done"):
            return
        meta = sandbox["metadata"]
        pod = self._verifier(str(meta["namespace"]), str(meta["uid"]))
        if record.get("verifiedAt") or record.get("unrestorable"):
            if pod is None:  # its work is done and its pod gone: its workspace goes too
                self._release(str(check["workspace"]))
                self._patch_memory(sandbox, {**record, "verification": {**check, "done": True}})
            elif not _terminating(pod):
                self._delete(pod)
        elif pod is None:
            if check.get("workspace"):  # its pod went before it proved anything: anew
                self._release(str(check["workspace"]))
            self._start_verification(sandbox, record)
        elif not _terminating(pod):
            self._judge(sandbox, record, pod)

    def _end_verification(self, sandbox: Mapping[str, Any]) -> bool:
        """End a verification that will not finish (its image is dropped, or the Sandbox
        deleted): True once its pod is gone and its workspace released."""
        check = (_memory_image(sandbox) or {}).get("verification") or {}
        if not check.get("workspace") or check.get("done"):
            return True
        meta = sandbox["metadata"]
        pod = self._verifier(str(meta["namespace"]), str(meta["uid"]))
        if pod is not None:
            if not _terminating(pod):
                self._delete(pod)
            return False
        self._release(str(check["workspace"]))
        return True

    def _judge(self, sandbox: Obj, record: Obj, pod: Obj) -> None:
        """Record what the verifying pod showed, once it shows it, and let the pod go."""
        check: Obj = dict(record.get("verification") or {})
        verdict = _restore_verdict(pod)
        if verdict is None and _since(str(check["startedAt"])) >= VERIFY_TIMEOUT_SECONDS:
            verdict = f"a pod restored from it did not run within {VERIFY_TIMEOUT_SECONDS:.0f} s"
        if verdict is None:
            return  # its pod's events bring the next pass, and the timeout's pass comes
        name = sandbox["metadata"]["name"]
        if verdict:
            log.warning("the memory image of %s did not restore: %s", name, verdict)
            self._patch_memory(sandbox, {**record, "unrestorable": verdict})
        else:
            took = round(_since(str(check["startedAt"])) * 1000)
            self._patch_memory(
                sandbox, {**record, "verifiedAt": _now(), "verification": {**check, "ms": took}}
            )
            log.info("the memory image of %s restores (%d ms)", name, took)
        self._delete(pod)

    def _start_verification(self, sandbox: Obj, record: Obj) -> None:
        """Stage the image onto a new fork of its workspace and make the pod that proves it."""
        uid = str(sandbox["metadata"]["uid"])
        workspace = f"{record['workspace']}-v{secrets.token_hex(3)}"
        node = str(record["node"])
        # Recorded before the fork exists, so that it is released whatever happens next.
        self._patch_memory(sandbox, {**record, "verification": {"workspace": workspace, "startedAt": _now()}})
        try:
            if self.binder is None:
                raise BindError("this controller cannot reach the nodes' warren-blockd (no bind token)")
            staged = self.binder.stage(
                node, str(record["image"]), str(record["workspace"]), int(record["sealedSeq"]), into=workspace
            )
            body = self._restored_pod(sandbox, workspace, str(record["workspace"]), node, str(staged["path"]))
        except (BindError, SandboxSpecError) as exc:
            self._patch_memory(sandbox, {**(_memory_image(sandbox) or {}), "unrestorable": str(exc)})
            return
        try:
            pod = self.kube.create_pod(str(sandbox["metadata"]["namespace"]), verifier_of(body, uid))
        except ApiException as exc:
            if exc.status != HTTPStatus.CONFLICT:  # made by a pass that raced this one
                raise
            return
        self.request_pass_later(pod, VERIFY_TIMEOUT_SECONDS + 1)
        log.info(
            "verifying the memory image of %s in pod %s", sandbox["metadata"]["name"], pod["metadata"]["name"]
        )

    def _restored_pod(self, sandbox: Obj, workspace: str, source: str, node: str, path: str) -> Obj:
        """The Sandbox's pod restored from the image staged at `path` on `node`, over
        `workspace`, a fork of the image's own workspace `source`."""
        shadow = copy.deepcopy(sandbox)
        spec = shadow["spec"]
        spec["workspace"] = {**(spec.get("workspace") or {}), "id": workspace, "forkOf": source}
        (shadow["metadata"].get("annotations") or {}).pop(FORK_SIBLINGS_ANNOTATION, None)
        body = pod_for(
            shadow, options=self.options.pod, workspace_volume=self.options.workspace(shadow), node=node
        )
        return restored_from(body, path)

    def _verifier(self, namespace: str, uid: str) -> Obj | None:
        name = verify_pod_name(uid)
        pod = (
            self.pods.get(namespace, name)
            if self.pods.synced(namespace)
            else self.kube.read_pod(namespace, name)
        )
        return pod if pod is not None and controller_uid(pod) == uid else None

    def _release(self, workspace: str) -> bool:
        """Remove a workspace only this controller made (an unclaimed pool pod's, a
        verification's fork) from storage; whether it did."""
        release = self.options.release_workspace
        if release is None:
            log.warning("workspace %s stays in storage: this controller cannot release workspaces", workspace)
            return False
        try:
            release(workspace)
        except Exception:  # the store away: the workspace stays, and the log says so
            log.warning("releasing workspace %s failed", workspace, exc_info=True)
            return False
        return True

    def _restore_fork(self, sandbox: Obj, origin: Obj) -> tuple[Obj, Obj | Observation]:
        """(the Sandbox, its workspace bound; its pod restored from its parent's memory image,
        spec.memoryFrom, onto its own workspace, forked from the parent's at the image's
        generation on the image's node, or why not)."""
        if self._workspaces and unbound(sandbox):
            sandbox = self._bind(sandbox, ids.new_workspace_id())
        workspace = sandbox_workspace_id(sandbox)
        try:
            if self.binder is None or workspace is None:
                raise BindError("this controller cannot reach the nodes' warren-blockd (no bind token)")
            staged = self.binder.stage(
                str(origin["node"]),
                str(origin["image"]),
                str(origin["workspace"]),
                int(origin["workspaceSeq"]),
                into=workspace,
            )
        except BindError as exc:
            return sandbox, Observation(
                "Failed",
                False,
                "ResumeRefused",
                f"restoring it from its parent's memory image failed ({exc}); start it cold to start afresh",
            )
        return sandbox, self._create(sandbox, restore=(str(origin["node"]), str(staged["path"])))

    def _patch_memory(self, sandbox: Obj, record: Obj | None, restored_from: str | None = None) -> None:
        """status.memoryImage (None removes it) and, after a resume, status.restoredFrom."""
        meta = sandbox["metadata"]
        patch: Obj = {"memoryImage": record}
        if restored_from is not None:
            patch["restoredFrom"] = restored_from
        try:
            self.kube.patch_sandbox_status(meta["namespace"], meta["name"], patch)
        except ApiException as exc:
            if exc.status != HTTPStatus.NOT_FOUND:
                raise
        sandbox.setdefault("status", {})["memoryImage"] = record

    def _keep_or_replace(self, sandbox: Obj, pod: Obj) -> Obj | None:
        """The Sandbox's running pod as this pass leaves it: kept, finished (a claimed
        bindAtClaim pod given its container), or deleted to be made again (None, or the
        pod as it is being deleted)."""
        namespace, name = sandbox["metadata"]["namespace"], pod["metadata"]["name"]
        annotations = pod["metadata"].get("annotations") or {}
        if annotations.get(SPEC_HASH_ANNOTATION) != spec_hash(sandbox):
            # A pod's spec is immutable: replace it. The new one is made once the old one
            # is gone (its DELETED event, or the next pass).
            log.info(
                "the spec of %s/%s changed: replacing pod %s", namespace, sandbox["metadata"]["name"], name
            )
            return self._delete(pod)
        with self._guard:
            started_here = pod["metadata"]["uid"] in self._started_pods
        if not started_here and _awaiting_its_container(pod):
            # Claimed from a bindAtClaim pool, but the pass that claimed it ended before the
            # sandbox's container was added (a crash, a lost leadership): finish, or give
            # the pod up and start cold.
            started = self._start_in(sandbox, pod)
            if isinstance(started, str):
                log.warning("pod %s could not take its sandbox: %s", name, started)
                return self._delete(pod)
            return started[0]
        return pod

    def _claim(self, sandbox: Obj) -> tuple[Obj, Obj | None, Obj]:
        """(the Sandbox, bound to the claimed pod's workspace if it has one; a ready pod of
        the pool the Sandbox names, made its own, else None; the PoolClaimed condition: how it
        was claimed, or why the Sandbox starts cold). The server applies a claim only to the
        pod's version that was chosen, so a pod goes to one Sandbox even if two controllers
        raced for it."""
        namespace = sandbox["metadata"]["namespace"]
        uid = str(sandbox["metadata"]["uid"])
        pool, cold = self._pool_for(sandbox)
        if pool is None:
            return sandbox, None, cold
        pool_name = pool["metadata"]["name"]
        attempts = 0
        # A fork's child takes a pod beside its source first: its fork needs no other node.
        near = self._parent_node(sandbox)
        ready = sorted(self._ready_pool_pods(pool), key=lambda pod: _node(pod) != near)
        for candidate in ready:
            name = candidate["metadata"]["name"]
            with self._guard:
                if (namespace, name) in self._taken:
                    continue
                self._taken.add((namespace, name))
            attempts += 1
            bind_at_claim = binds_at_claim(pool)
            workspace_id = pod_workspace_id(candidate) if self._workspaces and not bind_at_claim else None
            # The pod's spec hash is the bound Sandbox's, so the passes after keep it.
            owner = with_workspace_id(sandbox, workspace_id) if workspace_id else sandbox
            if bind_at_claim and not binds_in_place(candidate):
                taken = self._take_and_start(sandbox, candidate, (namespace, str(pool_name)))
                if isinstance(taken, str):
                    return sandbox, None, _cold("ClaimFailed", taken)
                claimed, how, patched_ms = taken
                bound = " and bound its workspace there" + (f"; {how}" if how else "")
            else:
                patching = time.monotonic()
                try:
                    claimed = self.kube.patch_pod(
                        namespace, name, claim_patch(owner, candidate, str(pool_name))
                    )
                except ApiException as exc:
                    with self._guard:
                        self._taken.discard((namespace, name))  # not ours: the watch shows what became of it
                    # Changed since the watch showed it (claimed elsewhere, deleted): another.
                    if exc.status not in {HTTPStatus.CONFLICT, HTTPStatus.NOT_FOUND}:
                        raise
                    if attempts >= CLAIM_ATTEMPTS:
                        break
                    continue
                patched_ms = round((time.monotonic() - patching) * 1000)
                bound, refused = self._serve_claimed(
                    sandbox, claimed, (namespace, str(pool_name)), bind_at_claim
                )
                if refused:
                    # The pod is the Sandbox's but could not serve it (its workspace may be
                    # bound there): it goes, and the Sandbox starts cold.
                    self.kube.delete_pod(namespace, name, uid=claimed["metadata"]["uid"])
                    return sandbox, None, _cold("ClaimFailed", refused)
            if workspace_id:
                sandbox = self._bind(sandbox, workspace_id)
            with self._guard:
                self._unseen[uid] = claimed
            if bind_at_claim and not binds_in_place(claimed):
                self._start_quietly(sandbox, claimed)  # its container starts: most likely Running next
            log.info(
                "claimed pod %s of pool %s for %s/%s (the claim's patch took %d ms)",
                name,
                pool_name,
                namespace,
                sandbox["metadata"]["name"],
                patched_ms,
            )
            return (
                sandbox,
                claimed,
                {
                    "type": POOL_CONDITION,
                    "status": "True",
                    "reason": "Claimed",
                    "message": f"claimed a ready pod of pool {pool_name}" + bound,
                },
            )
        return sandbox, None, _cold("PoolEmpty", f"pool {pool_name} had no ready pod")

    def _take_and_start(
        self, sandbox: Obj, pod: Obj, pool: tuple[str, str]
    ) -> tuple[Obj, str | None, int] | str:
        """Take the bindAtClaim pool pod `pod` for the Sandbox: its workspace bound there, its
        container added to the version of the pod that was chosen (that write takes the pod:
        it fails once anything changed it), then the claim's labels and owner. (The pod as
        claimed, how a fork crossed nodes if it did, ms the claim's patch took), or why the
        Sandbox starts cold, the pod gone.

        The container goes before the claim: kubelet acts on a change to a pod it synced
        less than a relist ago only after that relist (a second upstream, 200 ms with our
        patch), so a claim written first held the container's start back until then."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self._refill_after_claim(*pool, later=True)  # ended when the container starts, or fails
        started = self._start_in(sandbox, pod, pool, version=str(pod["metadata"]["resourceVersion"]))
        if isinstance(started, str):
            # Its workspace may be bound there: the pod is no pool's any more.
            self.kube.delete_pod(namespace, name, uid=pod["metadata"]["uid"])
            return started
        with_container, how = started
        patching = time.monotonic()
        try:
            claimed = self.kube.patch_pod(
                namespace, name, claim_patch(sandbox, with_container, pool[1], guarded=False)
            )
        except ApiException as exc:
            self.kube.delete_pod(namespace, name, uid=pod["metadata"]["uid"])
            return f"claiming pool {pool[1]}'s pod {name} failed: {error_message(exc)}"
        return claimed, how, round((time.monotonic() - patching) * 1000)

    def _pool_for(self, sandbox: Obj) -> tuple[Obj | None, Obj]:
        """(the pool the Sandbox may claim from, or None and why it starts cold)."""
        namespace = sandbox["metadata"]["namespace"]
        pool_name = (sandbox.get("spec") or {}).get("pool")
        if not pool_name:
            skipped = (sandbox["metadata"].get("annotations") or {}).get(POOL_SKIPPED_ANNOTATION)
            if skipped:
                return None, _cold("OrganizationCap", str(skipped))
            return None, _cold("NoPool", "the sandbox names no pool")
        pool = self.pools.get(namespace, str(pool_name))
        if pool is None or _terminating(pool):
            return None, _cold("PoolNotFound", f"no SandboxPool {pool_name} in {namespace}")
        resume_pool = f"pool {pool_name} keeps slots for paused sandboxes to resume in, not pods to claim"
        if misfit := (resume_pool if resumes(pool) else None) or pool_misfit(
            sandbox, pool, self.options.pod, workspaces=self._workspaces
        ):
            return None, _cold("PoolMismatch", misfit)
        if binds_at_claim(pool) and self.binder is None:
            return None, _cold(
                "PoolMismatch",
                f"pool {pool_name} binds workspaces at the claim and this controller has no bind token",
            )
        return pool, {}

    def _refill_after_claim(self, namespace: str, pool: str, *, later: bool) -> None:
        """A pool pass to refill what a claim took: at once, or for a bindAtClaim pool once
        every pod claimed from it lately runs (_one_started), REFILL_AT_THE_LATEST_S after
        the claim at the latest: new pool pods starting would take the CPU from the claimed
        pods' containers starting (on two cores, eight of each at once doubled the time a
        fork's children took to answer)."""
        if not later:
            self.request_pool_pass(namespace, pool)
            return
        now = time.monotonic()
        with self._guard:
            count, since = self._pool_starting.get((namespace, pool), (0, now))
            self._pool_starting[(namespace, pool)] = (count + 1, since)
        timer = threading.Timer(REFILL_AT_THE_LATEST_S, self.request_pool_pass, (namespace, pool))
        timer.daemon = True
        timer.start()

    def _one_started(self, pool: tuple[str, str] | None) -> None:
        """A pod claimed from the bindAtClaim pool `pool` runs, or never will: the last of
        them lets the pool refill."""
        if pool is None:
            return
        with self._guard:
            count, since = self._pool_starting.get(pool, (1, 0.0))
            left = count - 1
            if left > 0:
                self._pool_starting[pool] = (left, since)
            else:
                self._pool_starting.pop(pool, None)
        if left <= 0:
            self.request_pool_pass(*pool)

    def _refill_held(self, namespace: str, pool: str) -> bool:
        """Whether the pool's refill waits for the pods claimed from it to start (every pass
        would otherwise refill: its pods' and its own events each bring one)."""
        with self._guard:
            held = self._pool_starting.get((namespace, pool))
        return held is not None and time.monotonic() - held[1] < REFILL_AT_THE_LATEST_S

    def _start_in(
        self, sandbox: Obj, pod: Obj, pool: tuple[str, str] | None = None, version: str | None = None
    ) -> tuple[Obj, str | None] | str:
        """Start the Sandbox in the bindAtClaim pool pod it claimed: its workspace bound at
        the pod's awaiting volume by the node's warren-blockd (_bind_workspace), then its own
        container added (the pod as it is then, and how a fork crossed nodes if it did); why
        not, if it could not be done."""
        if self.binder is None:
            return "this controller cannot bind workspaces (no bind token)"
        binding = time.monotonic()
        try:
            how, crossed = self._bind_workspace(sandbox, pod)
            adding = time.monotonic()
            container = ephemeral_container_for(sandbox, self.options.pod)
            started = self.kube.add_ephemeral_container(
                pod["metadata"]["namespace"], pod["metadata"]["name"], container, resource_version=version
            )
        except (BindError, SandboxSpecError) as exc:
            self._one_started(pool)
            return str(exc)
        except ApiException as exc:
            self._one_started(pool)
            return f"adding the sandbox's container to the pool pod failed: {error_message(exc)}"
        with self._guard:
            self._started_pods.add(str(pod["metadata"]["uid"]))
        added = time.monotonic()
        self._await_agent(sandbox, started, pool)
        log.info(
            "bound workspace %s (%s) in pod %s: bind %d ms, container added %d ms",
            ((sandbox.get("spec") or {}).get("workspace") or {}).get("id"),
            how,
            pod["metadata"]["name"],
            (adding - binding) * 1000,
            (added - adding) * 1000,
        )
        return started, crossed

    def _bind_workspace(
        self, sandbox: Obj, pod: Obj, container_id: str | None = None
    ) -> tuple[str, str | None]:
        """Have the pod's node bind the Sandbox's workspace in the claimed pool pod (at its
        awaiting volume, or beneath its running container `container_id`): (how the plugin
        made it, how a fork crossed nodes if it did). BindError if it could not.

        A fork's child on another node than its source's: the source's node forks it (its
        daemon holds every write the source made, and freezes it until they are in object
        storage), and the pod's node binds the child as storage has it. Forked on the pod's
        own node instead, it would start from what the source had replicated so far."""
        if self.binder is None:  # _pool_for refuses such a pool: no claim gets here
            raise BindError("this controller cannot bind workspaces (no bind token)")
        workspace = (sandbox.get("spec") or {}).get("workspace") or {}
        source, near, crossed = workspace.get("forkOf"), self._parent_node(sandbox), None
        if source and near and near != _node(pod):
            fork_ms = self.binder.fork(near, str(source), str(workspace["id"]), fork_siblings(sandbox))
            crossed = (
                f"forked on its source's node once the source's writes were in object storage "
                f"({fork_ms} ms), then bound on another node"
            )
            workspace = {"id": workspace["id"]}
        siblings = fork_siblings(sandbox) if source and not crossed else None
        return self.binder.bind(pod, workspace, siblings, container_id), crossed

    def _serve_claimed(
        self, sandbox: Obj, claimed: Obj, pool: tuple[str, str], bind_at_claim: bool
    ) -> tuple[str, str | None]:
        """Make the pool pod the Sandbox just claimed serve it: a bind-in-place pod's
        workspace bound beneath its running sandbox container first, then its agent given
        the Sandbox's token and environment. (What the PoolClaimed condition adds about the
        workspace, why the pod cannot serve the Sandbox or None). Nothing starts: the pod
        already runs."""
        name = claimed["metadata"]["name"]
        if not bind_at_claim:
            self._refill_after_claim(*pool, later=False)
            refused = self._claim_agent(sandbox, claimed)
            return "", f"the agent of pool {pool[1]}'s pod refused: {refused}" if refused else None
        # Held until the agent is claimed: pods starting would take the CPU from the child.
        self._refill_after_claim(*pool, later=True)
        binding = time.monotonic()
        try:
            container_id = sandbox_container_id(claimed)
            if container_id is None:
                return "", f"pool {pool[1]}'s pod {name} has no running sandbox container"
            how, crossed = self._bind_workspace(sandbox, claimed, container_id)
            refused = self._claim_agent(sandbox, claimed)
        except BindError as exc:
            return "", str(exc)
        finally:
            self._one_started(pool)
        if refused:
            return "", f"the agent of pool {pool[1]}'s pod refused: {refused}"
        log.info(
            "bound workspace %s (%s) beneath pod %s's container and claimed its agent: %d ms",
            ((sandbox.get("spec") or {}).get("workspace") or {}).get("id"),
            how,
            name,
            (time.monotonic() - binding) * 1000,
        )
        said = " and bound its workspace beneath its running container"
        return said + (f"; {crossed}" if crossed else ""), None

    def _await_agent(self, sandbox: Obj, pod: Obj, pool: tuple[str, str] | None) -> None:
        """Ask the new container's agent until it answers, then pass over the Sandbox again:
        it runs from then on, without waiting for kubelet's next look at the pod."""
        address = (pod.get("status") or {}).get("podIP")
        if not address:
            self._one_started(pool)
            return
        uid, meta = str(pod["metadata"]["uid"]), sandbox["metadata"]

        def ask() -> None:
            asking = time.monotonic()
            answered = agentclient.wait_healthy(str(address), AGENT_START_WAIT_S)
            try:
                if answered:
                    log.info(
                        "the agent in pod %s answered %d ms after its container was added",
                        pod["metadata"]["name"],
                        (time.monotonic() - asking) * 1000,
                    )
                    with self._guard:
                        self._agent_answers.add(uid)
                    self.reconcile(meta["namespace"], meta["name"])
            finally:
                # Only once the Sandbox reports Running: new pool pods starting would take
                # the CPU from that report and from the caller's first command.
                self._one_started(pool)

        threading.Thread(target=ask, name=f"agent-{meta['name']}", daemon=True).start()

    def _claim_token(self, pod_name: str) -> str:
        return hmac.new(self._claim_key, pod_name.encode(), hashlib.sha256).hexdigest()

    def _claim_agent(self, sandbox: Obj, pod: Obj) -> str | None:
        """Give the claimed pod's agent the Sandbox's token and environment; why not, if it
        could not be done. Pods without an agent, and Sandboxes without a token, need none."""
        spec = sandbox.get("spec") or {}
        token_sha256 = spec.get("agentTokenSha256")
        if not token_sha256 or not has_agent(pod):
            return None
        address = (pod.get("status") or {}).get("podIP")
        if not address:
            return "the pod has no address"
        try:
            agentclient.claim(
                str(address),
                self._claim_token(pod["metadata"]["name"]),
                str(token_sha256),
                dict(spec.get("env") or {}),
            )
        except agentclient.AgentError as exc:
            return str(exc)
        return None

    def _pool_pods(self, pool: Obj) -> list[Obj]:
        """The pool's unclaimed pods as the watch shows them, less those claimed here since."""
        meta = pool["metadata"]
        owned = [
            pod
            for pod in self.pods.select(meta["namespace"], {POOL_LABEL: meta["name"]})
            if pool_of(pod) == (meta["name"], meta["uid"])
        ]
        with self._guard:
            return [pod for pod in owned if (meta["namespace"], pod["metadata"]["name"]) not in self._taken]

    def _ready_pool_pods(self, pool: Obj) -> list[Obj]:
        current = pool_hash(pool)
        with self._guard:
            made = set(self._pool_made.get(str(pool["metadata"]["uid"]), ()))
        ready = _ready_test(pool)
        return [
            pod
            for pod in self._pool_pods(pool)
            if pod["metadata"]["uid"] in made
            and ready(pod)
            and not _terminating(pod)
            and (pod["metadata"].get("annotations") or {}).get(SPEC_HASH_ANNOTATION) == current
        ]

    def reconcile_pool(self, namespace: str, name: str) -> None:
        """Keep the pool's size of unclaimed pods of its current spec, made no faster than
        its refill rate; replace pods of an older spec; report the counts in its status.

        Only pods this process made are kept and handed out: a pod that merely looks like
        the pool's (its labels and owner can be written by anyone who may create pods in the
        namespace) is deleted, and so, after a restart, are the pods made before it."""
        with self._serialized(f"pool:{namespace}", name):
            self._release_going_slots(namespace, name)
            pool = self.pools.get(namespace, name)
            if pool is None or _terminating(pool):
                return  # its pods go with it (they are the garbage collector's: it owns them)
            uid, current, size = str(pool["metadata"]["uid"]), pool_hash(pool), pool_size(pool)
            self._forget_taken(namespace)
            with self._guard:
                made = set(self._pool_made.get(uid, ()))
            keep: list[Obj] = []
            drop: list[Obj] = []
            for pod in self._pool_pods(pool):
                if _terminating(pod):
                    continue
                annotations = pod["metadata"].get("annotations") or {}
                ours = pod["metadata"]["uid"] in made and annotations.get(SPEC_HASH_ANNOTATION) == current
                if resumes(pool) and _age(pod) >= RESUME_SLOT_RENEW_S:
                    ours = False  # renewed before its wait for an image ends (RESTORE_WAIT_S)
                (keep if ours else drop).append(pod)
            creating = self._creating(pool)
            if (excess := len(keep) + len(creating) - size) > 0:  # the pool shrank: unready ones first
                keep.sort(key=_ready)
                drop, keep = drop + keep[:excess], keep[excess:]
            for pod in drop:
                self._delete_pool_pod(pod)
            with self._guard:
                self._pool_made[uid] = made & {p["metadata"]["uid"] for p in keep + creating}
            if (missing := size - len(keep) - len(creating)) > 0 and not self._refill_held(namespace, name):
                self._refill(pool, missing)
            ready = sum(1 for pod in keep if _ready_test(pool)(pod))
            if resumes(pool) and keep:
                # A pass when the next slot settles (its status counts it ready then: no
                # event of its own may come) or is due to be renewed, whichever is first.
                due = [RESUME_SLOT_RENEW_S - _age(pod) for pod in keep]
                due += [SLOT_SETTLE_S - _age(pod) for pod in keep if _age(pod) < SLOT_SETTLE_S]
                self._renew_later(pool, min(due))
            self._write_pool_status(
                pool, {"size": size, "ready": ready, "starting": len(keep) + len(creating) - ready}
            )

    def _release_going_slots(self, namespace: str, pool: str) -> None:
        """End the wait of the pool's resume slots being deleted (renewed, the pool shrunk or
        gone): kubelet can stop a slot only once its runsc stops waiting for an image, which
        a release makes it do at once (it starts afresh, then is stopped). Once per slot."""
        if self.binder is None:
            return
        going = [
            pod
            for pod in self.pods.select(namespace, {POOL_LABEL: pool})
            if _slot(pod) and _terminating(pod) and _node(pod)
        ]
        with self._guard:
            released = self._released.setdefault((namespace, pool), set())
            released &= {str(pod["metadata"]["uid"]) for pod in going}
        for pod in going:
            uid = str(pod["metadata"]["uid"])
            with self._guard:
                if uid in released:
                    continue
                released.add(uid)
            self._release_slot(pod)

    def _release_slot(self, slot: Obj) -> None:
        if self.binder is None:
            return
        try:
            self.binder.release(str(_node(slot)), str(slot["metadata"]["name"]))
        except BindError as exc:  # it starts afresh when its wait ends, and goes then
            log.warning("releasing resume slot %s failed: %s", slot["metadata"]["name"], exc)

    def _renew_later(self, pool: Obj, delay: float) -> None:
        """A pass of the resume pool in `delay` seconds (a slot settles or is due to be
        renewed then); none if one comes sooner (every pass would otherwise add one)."""
        meta = pool["metadata"]
        now = time.monotonic()
        due = now + max(delay, 0.5)
        with self._guard:
            pending = self._renewals.get(str(meta["uid"]))
            if pending is not None and now < pending <= due:
                return
            self._renewals[str(meta["uid"])] = due
        timer = threading.Timer(due - now, self.request_pool_pass, (meta["namespace"], meta["name"]))
        timer.daemon = True
        timer.start()

    def _forget_taken(self, namespace: str) -> None:
        """Forget the namespace's claimed pods once the watch shows them claimed or gone."""
        with self._guard:
            taken = [key for key in self._taken if key[0] == namespace]
        for key in taken:
            pod = self.pods.get(*key)
            if pod is None or POOL_LABEL not in (pod["metadata"].get("labels") or {}):
                with self._guard:
                    self._taken.discard(key)

    def _creating(self, pool: Obj) -> list[Obj]:
        """Pods this controller made for the pool that the watch has not shown yet."""
        namespace, uid = pool["metadata"]["namespace"], str(pool["metadata"]["uid"])
        now = time.monotonic()
        with self._guard:
            made = dict(self._pool_creating.get(uid, {}))
        waiting = {
            name: (at, pod)
            for name, (at, pod) in made.items()
            if self.pods.get(namespace, name) is None and now - at <= POOL_CREATE_GRACE_SECONDS
        }
        with self._guard:
            self._pool_creating[uid] = waiting
        return [pod for _, pod in waiting.values()]

    def _pool_workspace(self, pool: Obj) -> tuple[str, Obj] | None:
        """(id, volume source) of a new, empty workspace for a pool pod, if the pool's pods
        have one."""
        workspace = (pool.get("spec") or {}).get("workspace")
        if not workspace or not self._workspaces:
            return None
        workspace_id = ids.new_workspace_id()
        volume = self.options.workspace({"spec": {"workspace": {**workspace, "id": workspace_id}}})
        return (workspace_id, volume) if volume is not None else None

    @property
    def _workspaces(self) -> bool:
        return self.options.workspace is not no_workspace

    def _bind(self, sandbox: Obj, workspace_id: str) -> Obj:
        """Bind the Sandbox's new workspace to `workspace_id` for good (spec.workspace.id,
        which the CRD keeps from changing once set); the Sandbox as it is now."""
        meta = sandbox["metadata"]
        try:
            bound = self.kube.patch_sandbox(
                meta["namespace"], meta["name"], {"spec": {"workspace": {"id": workspace_id}}}
            )
        except ApiException as exc:
            if exc.status != HTTPStatus.NOT_FOUND:
                raise
            return with_workspace_id(sandbox, workspace_id)  # gone: its pod goes with it
        self.sandboxes.apply("MODIFIED", bound)
        log.info("bound %s/%s to workspace %s", meta["namespace"], meta["name"], workspace_id)
        return bound

    def _refill(self, pool: Obj, missing: int) -> None:
        """Make up to `missing` pods, as many as the pool's refill rate allows now; the rest
        on a later pass, when the rate allows them."""
        meta = pool["metadata"]
        uid, rate = str(meta["uid"]), pool_refill_per_second(pool)
        now = time.monotonic()
        burst = max(1.0, rate)
        with self._guard:
            tokens, counted = self._pool_tokens.get(uid, (burst, now))
            tokens = min(burst, tokens + (now - counted) * rate)
            allowed = min(missing, int(tokens))
            self._pool_tokens[uid] = (tokens - allowed, now)
        for _ in range(allowed):
            name = pool_pod_name(str(meta["name"]), secrets.token_hex(5))
            claim_sha256 = hashlib.sha256(self._claim_token(name).encode()).hexdigest()
            body = pool_pod_for(
                pool,
                name=name,
                claim_sha256=claim_sha256,
                options=self.options.pod,
                workspace=self._pool_workspace(pool),
            )
            try:
                pod = self.kube.create_pod(meta["namespace"], body)
            except ApiException as exc:
                if exc.status in {
                    HTTPStatus.BAD_REQUEST,
                    HTTPStatus.FORBIDDEN,
                    HTTPStatus.UNPROCESSABLE_ENTITY,
                }:
                    log.warning(
                        "pool %s/%s: its pod was refused: %s",
                        meta["namespace"],
                        meta["name"],
                        error_message(exc),
                    )
                    return  # the resync tries again
                raise
            with self._guard:
                self._pool_creating.setdefault(uid, {})[pod["metadata"]["name"]] = (time.monotonic(), pod)
                self._pool_made.setdefault(uid, set()).add(pod["metadata"]["uid"])
        if allowed < missing:
            delay = (missing - allowed) / rate if allowed else 1.0 / rate
            timer = threading.Timer(
                min(delay, 1.0), self.request_pool_pass, (meta["namespace"], meta["name"])
            )
            timer.daemon = True
            timer.start()

    def _delete_pool_pod(self, pod: Obj) -> None:
        # Only the version seen: a pod claimed meanwhile is the Sandbox's now, and stays.
        meta = pod["metadata"]
        self.kube.delete_pod(meta["namespace"], meta["name"], resource_version=meta.get("resourceVersion"))

    def _write_pool_status(self, pool: Obj, counts: Obj) -> None:
        meta = pool["metadata"]
        uid = str(meta["uid"])
        wanted = {**counts, "observedGeneration": meta.get("generation")}
        with self._guard:
            written = self._pool_written.get(uid)
        current = written if written is not None else (pool.get("status") or {})
        if _same_status(current, wanted):
            return
        try:
            self.kube.patch_pool_status(meta["namespace"], meta["name"], wanted)
        except ApiException as exc:
            if exc.status != HTTPStatus.NOT_FOUND:
                raise
            return
        with self._guard:
            self._pool_written[uid] = wanted

    def pool_event(self, event_type: str, pool: Obj) -> None:
        """A SandboxPool as its watch delivered it."""
        self.pools.apply(event_type, pool)
        if event_type == "DELETED":
            uid = str(pool["metadata"]["uid"])
            with self._guard:
                for held in (
                    self._pool_creating,
                    self._pool_tokens,
                    self._pool_written,
                    self._pool_made,
                    self._renewals,
                ):
                    held.pop(uid, None)

    def _delete(self, pod: Obj) -> Obj | None:
        """Delete this incarnation of the pod; the pod as it is now."""
        meta = pod["metadata"]
        if self.kube.delete_pod(meta["namespace"], meta["name"], uid=meta["uid"]):
            return _deleting(pod)
        return self.kube.read_pod(meta["namespace"], meta["name"])  # gone, or another incarnation

    def _create(self, sandbox: Obj, restore: tuple[str, str] | None = None) -> Obj | Observation:
        """Make the Sandbox's pod; with `restore` (a node, and the memory image staged there),
        one restored from the image on that node."""
        namespace = sandbox["metadata"]["namespace"]
        uid = str(sandbox["metadata"]["uid"])
        try:
            body = pod_for(
                sandbox,
                options=self.options.pod,
                workspace_volume=self.options.workspace(sandbox),
                node=restore[0] if restore else self._parent_node(sandbox),
            )
            if restore:
                body = restored_from(body, restore[1])
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
        with self._guard:
            self._unseen[uid] = pod
        self._start_quietly(sandbox, pod)
        log.info("created pod %s for %s/%s", body["metadata"]["name"], namespace, sandbox["metadata"]["name"])
        return pod

    def _start_quietly(self, sandbox: Obj, pod: Obj) -> None:
        """Leave a new Sandbox's status unwritten while its pod starts as it should (_quiet):
        the status written next is the one that says it runs, or that it has been starting
        too long, which the pass asked for here reports."""
        uid = str(sandbox["metadata"]["uid"])
        with self._guard:
            quiet = not sandbox.get("status") and uid not in self._written
            if quiet:
                self._starting[uid] = (time.monotonic(), None)
        if quiet:
            self.request_pass_later(pod, self.options.quiet_start_seconds)

    def _parent_node(self, sandbox: Obj) -> str | None:
        """Where the workspace a new sandbox forks is mounted now, if anywhere: the child
        goes there, so its fork is taken by the blockd that holds every parent write."""
        workspace = (sandbox.get("spec") or {}).get("workspace") or {}
        source = workspace.get("forkOf")
        if not source or self.options.workspace is no_workspace:
            return None
        namespace = sandbox["metadata"]["namespace"]
        if self.pods.synced(namespace):
            pods = self.pods.select(namespace, {WORKSPACE_LABEL: str(source)})
        else:
            pods = self.kube.list_pods(namespace, f"{WORKSPACE_LABEL}={source}")
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not _terminating(pod) and self.node_ready(str(node)):
                return str(node)
        return None

    def node_ready(self, name: str) -> bool:
        """Whether the node is Ready, as far as the nodes' watch shows (unknown: yes)."""
        found = self.nodes.get("", name)
        if found is None:
            return not self.nodes.synced("")
        return (_ready_condition(found) or {}).get("status") == "True"

    def pods_on(self, node: str) -> list[Obj]:
        return [pod for pod in self.pods.all() if _node(pod) == node]

    @staticmethod
    def _not_ours(name: str) -> Observation:
        return Observation(
            "Failed",
            False,
            "PodNameTaken",
            f"a pod named {name} exists that this Sandbox does not own: delete it to let the sandbox start",
        )

    def write_status(self, sandbox: Obj, seen: Observation) -> None:
        meta = sandbox["metadata"]
        uid = str(meta["uid"])
        with self._guard:
            written = self._written.get(uid)
        # What this controller wrote last is the status now, even before the watch brings
        # it back: no other writer touches these fields.
        current = written if written is not None else (sandbox.get("status") or {})
        with self._guard:
            _, start = self._starting.get(uid, (0.0, None))
        if seen.start is None and start is not None:  # from a quiet pass (_quiet)
            seen = dataclasses.replace(seen, start=start)
        wanted = status_for({**sandbox, "status": current}, seen)
        if _same_status(current, wanted):
            with self._guard:
                self._starting.pop(uid, None)
            return
        try:
            self.kube.patch_sandbox_status(meta["namespace"], meta["name"], wanted)
        except ApiException as exc:
            if exc.status != HTTPStatus.NOT_FOUND:  # gone meanwhile: nothing to report on
                raise
            return
        with self._guard:
            self._written[uid] = wanted
            self._starting.pop(uid, None)

    def finalize(self, namespace: str, name: str, uid: str, *, report: bool = True) -> bool:
        """Stop the Sandbox's pod; True once it is gone and the Sandbox may go too. With
        `report`, first write the Terminating status (once per wait is enough)."""
        with self._serialized(namespace, name):
            sandbox = self._sandbox(namespace, name) if report else None
            if sandbox is not None and sandbox["metadata"]["uid"] == uid:
                self.write_status(sandbox, observe(sandbox, None))
            pods = self._pods_of(namespace, uid)
            for pod in pods:
                if not _terminating(pod):
                    self.kube.delete_pod(namespace, pod["metadata"]["name"], uid=pod["metadata"]["uid"])
                    log.info("deleting %s/%s: deleted pod %s", namespace, name, pod["metadata"]["name"])
            if pods:
                return False
            known = sandbox if sandbox is not None else self.sandboxes.get(namespace, name)
            if known is not None and known["metadata"]["uid"] == uid and not self._end_verification(known):
                return False
        with self._guard:
            self._locks.pop(f"{namespace}/{name}", None)
            self._written.pop(uid, None)
            self._unseen.pop(uid, None)
            self._starting.pop(uid, None)
            self._finalizing.pop(uid, None)
        return True

    def await_pod_gone(self, uid: str, wake: Callable[[], object]) -> None:
        """While the Sandbox `uid` is finalized, its pod's events only call `wake` (at its
        pod's DELETED event); until finalize() finds the pod gone or the Sandbox goes."""
        with self._guard:
            self._finalizing[uid] = wake

    def ensure_finalizer(self, sandbox: Obj) -> bool:
        """Whether the Sandbox carries this controller's finalizer, adding it if not: the
        API creates Sandboxes with it, so the write is only for ones made otherwise
        (kubectl). False when another change came first: its event brings the next pass."""
        meta = sandbox["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER in finalizers:
            return True
        # Only onto the version this pass read: a finalizer list changed meanwhile is
        # never overwritten.
        ops: list[Obj] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}
        ]
        if finalizers:
            ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER})
        else:
            ops.append({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]})
        return self._patch_finalizers(sandbox, ops)

    def remove_finalizer(self, sandbox: Obj) -> bool:
        """Let the Sandbox go (its pod is gone); False when its finalizers changed meanwhile."""
        finalizers = list(sandbox["metadata"].get("finalizers") or [])
        if FINALIZER not in finalizers:
            return True
        at = f"/metadata/finalizers/{finalizers.index(FINALIZER)}"
        return self._patch_finalizers(
            sandbox, [{"op": "test", "path": at, "value": FINALIZER}, {"op": "remove", "path": at}]
        )

    def _patch_finalizers(self, sandbox: Obj, ops: list[Obj]) -> bool:
        meta = sandbox["metadata"]
        try:
            self.kube.json_patch_sandbox(str(meta["namespace"]), str(meta["name"]), ops)
        except ApiException as exc:
            if exc.status == HTTPStatus.NOT_FOUND:
                return True  # gone already: nothing left to hold
            if exc.status in {HTTPStatus.CONFLICT, HTTPStatus.UNPROCESSABLE_ENTITY}:
                return False  # a "test" failed: the Sandbox changed, and its event is coming
            raise
        return True

    def pod_deleted(self, pod: Mapping[str, Any]) -> bool:
        """Wake the finalizer waiting for this pod, if one is; whether one was."""
        with self._guard:
            self._started_pods.discard(str(pod["metadata"].get("uid")))
            self._agent_answers.discard(str(pod["metadata"].get("uid")))
            wake = self._finalizing.get(controller_uid(pod) or "")
        if wake is not None:
            wake()
        return wake is not None

    def _release_unclaimed(self, pod: Mapping[str, Any]) -> None:
        """A pool pod deleted unclaimed: its workspace was never anyone's, so it goes from
        storage too. Only on the server's own last word on the pod (its deletion under way,
        still the pool's), never on a copy a relist found gone: a claim that raced the
        deletion would show there, and its workspace is its Sandbox's."""
        release = self.options.release_workspace
        workspace_id = pod_workspace_id(pod)
        meta = pod.get("metadata") or {}
        if release is None or not workspace_id or not meta.get("deletionTimestamp"):
            return
        if POOL_LABEL not in (meta.get("labels") or {}):
            return
        namespace = str(meta.get("namespace"))
        if any(sandbox_workspace_id(s) == workspace_id for s in self.sandboxes.select(namespace, {})):
            return
        if self._release(workspace_id):
            log.info("released workspace %s of unclaimed pool pod %s", workspace_id, meta.get("name"))

    def pod_changed(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """A pod this controller made changed: bring its Sandbox's status up to date, make
        the pod again if it vanished, or delete it if its Sandbox is gone."""
        uid = controller_uid(pod)
        if uid is None and (pool := pool_of(pod)) is not None:
            if event_type == "DELETED":
                self._release_unclaimed(pod)
            self.request_pool_pass(str(pod["metadata"]["namespace"]), pool[0])
            return
        with self._guard:
            finalizing = (uid or "") in self._finalizing
        if finalizing:
            # The Sandbox is being deleted and its finalizer owns the pod: reading the
            # Sandbox here would only find it terminating.
            if event_type == "DELETED":
                self.pod_deleted(pod)
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
            sandbox = self.sandboxes.get(namespace, name)
            if sandbox is None or sandbox["metadata"]["uid"] != uid:
                # Not in memory as this pod's owner: the Sandbox is gone, or its event is late
                # (its own event then brings its pass). A pod that is going
                # needs nothing either way; one that stays may be an orphan, which only the
                # server can tell, and a pod is deleted on nothing less. (Under load, a gone
                # pod's event often comes after its Sandbox's: no GET for each of those.)
                if event_type == "DELETED" or _terminating(pod):
                    return
                sandbox = self.kube.read_sandbox(namespace, name)
            if sandbox is None or sandbox["metadata"]["uid"] != uid:
                # An orphan (its Sandbox went while no controller ran). The garbage collector
                # would remove it too; doing it now keeps "no pod without a Sandbox" prompt.
                self.kube.delete_pod(namespace, str(meta["name"]), uid=str(meta["uid"]))
                log.info("deleted orphan pod %s/%s", namespace, meta["name"])
                return
            if not _terminating(sandbox):
                self._pass(sandbox)


@dataclass
class _Finalizing:
    """A Sandbox's finalizer waiting for its pod: since when, and the next fallback poll."""

    since: float
    poll: float


class Watches:
    """What the controller watches and the work each change becomes. The Sandboxes, the pods
    it made and the SandboxPools, one informer each per namespace, are kept in the
    reconciler's stores. A change of a Sandbox is a pass of it (a step of its finalizer once
    it is being deleted); a change of a Sandbox's pod a pass of that Sandbox; a change of a
    pool or of one of its pods a pass of the pool. Passes run on pools of threads, a burst of
    changes of one object is a single pass, a pass that failed is tried again after
    `retry_seconds`, and every Sandbox and pool gets a pass each `resync_seconds`."""

    def __init__(self, reconciler: Reconciler, namespaces: Sequence[str]) -> None:
        self.reconciler = reconciler
        options = reconciler.options
        self.sandbox_queue: CoalescingQueue[tuple[str, str], tuple[str, str]] = CoalescingQueue(
            options.workers, lambda key: self.sandbox_pass(*key), "sandbox"
        )
        self.queue: CoalescingQueue[tuple[str, str], tuple[str, Obj]] = CoalescingQueue(
            options.workers, lambda item: reconciler.pod_changed(*item), "pod-event"
        )
        self.pool_queue: CoalescingQueue[tuple[str, str], tuple[str, str]] = CoalescingQueue(
            max(1, options.workers // 4), lambda key: reconciler.reconcile_pool(*key), "pool"
        )
        reconciler.request_pool_pass = lambda namespace, name: self.pool_queue.put(
            (namespace, name), (namespace, name)
        )
        self.later: Later[Callable[[], object]] = Later(lambda then: then())
        reconciler.request_pass_later = lambda pod, delay: self.later.put(
            delay, functools.partial(self._queue, "", pod)
        )
        self._guard = threading.Lock()
        self._finalizing: dict[str, _Finalizing] = {}  # Sandbox uid ->
        self.namespaces = list(namespaces)
        kube = reconciler.kube
        retry = options.retry_seconds

        def informer(
            path: str,
            replace: Callable[[str, list[Obj]], None],
            event: Callable[[str, Obj], None],
            namespace: str,
            query: dict[str, str] | None = None,
        ) -> Informer:
            return Informer(
                kube,
                path,
                query=query,
                on_replace=functools.partial(replace, namespace),
                on_event=event,
                retry_seconds=retry,
            )

        ours = {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"}
        self.informers = [
            *(
                informer(kube.sandboxes_path(ns), self._replace_sandboxes, self._sandbox_event, ns)
                for ns in namespaces
            ),
            *(informer(kube.pods_path(ns), self._replace, self._event, ns, ours) for ns in namespaces),
            *(informer(kube.pools_path(ns), self._replace_pools, self._pool_event, ns) for ns in namespaces),
            informer("/api/v1/nodes", self._replace_nodes, self._node_event, ""),
        ]

    # --- Sandboxes

    def _sandbox_event(self, event_type: str, sandbox: Obj) -> None:
        self.reconciler.sandbox_event(event_type, sandbox)
        meta = sandbox["metadata"]
        if event_type == "DELETED":
            with self._guard:
                self._finalizing.pop(str(meta["uid"]), None)
            return
        self.queue_sandbox(str(meta["namespace"]), str(meta["name"]))

    def _replace_sandboxes(self, namespace: str, sandboxes: list[Obj]) -> None:
        # A (re)list: every Sandbox gets a pass, as after a start; gone ones leave memory.
        for gone in self.reconciler.sandboxes.replace(namespace, sandboxes):
            self._sandbox_event("DELETED", gone)
        for sandbox in sandboxes:
            self.queue_sandbox(namespace, str(sandbox["metadata"]["name"]))

    def queue_sandbox(self, namespace: str, name: str) -> None:
        self.sandbox_queue.put((namespace, name), (namespace, name))

    def sandbox_pass(self, namespace: str, name: str) -> None:
        """The Sandbox as memory holds it now, converged, or its finalizer's next step; a
        failure is logged and tried again after `retry_seconds`."""
        sandbox = self.reconciler.sandboxes.get(namespace, name)
        if sandbox is None:
            return
        try:
            if _terminating(sandbox):
                self._finalize_step(sandbox)
            elif self.reconciler.ensure_finalizer(sandbox):
                self.reconciler.reconcile(namespace, name)
        except Exception as exc:
            retry = self.reconciler.options.retry_seconds
            if isinstance(exc, ApiException):  # the API server away or busy: its word is enough
                log.warning(
                    "the pass of %s/%s failed, again in %g s: %s", namespace, name, retry, error_message(exc)
                )
            else:
                log.exception("the pass of %s/%s failed, again in %g s", namespace, name, retry)
            self.later.put(retry, functools.partial(self.queue_sandbox, namespace, name))

    def _finalize_step(self, sandbox: Obj) -> None:
        """Stop the pod of a Sandbox being deleted, then let the Sandbox go. Waiting for
        the pod is the normal case (its grace period), not a failure: its DELETED event
        brings the next step, and polls that back off are the fallback, so thousands of
        Sandboxes deleted at once do not poll the API server in a loop. A pod still there
        after `finalize_patience_seconds` is reported (and the Sandbox kept) each time."""
        meta = sandbox["metadata"]
        if FINALIZER not in (meta.get("finalizers") or []):
            return  # not this controller's to hold (the garbage collector takes the pod)
        namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
        options = self.reconciler.options
        now = time.monotonic()
        with self._guard:
            state = self._finalizing.get(uid)
            report = state is None
            if state is None:
                state = self._finalizing[uid] = _Finalizing(now, options.finalize_poll_seconds)
            elif now - state.since > options.finalize_patience_seconds:
                log.warning(
                    "the pod of %s/%s has not stopped %.0f s after its deletion; the Sandbox waits for it",
                    namespace,
                    name,
                    now - state.since,
                )
                state.since, report = now, True
            delay, state.poll = state.poll, min(state.poll * 2, options.finalize_poll_max_seconds)
        if report:
            self.reconciler.await_pod_gone(uid, functools.partial(self.queue_sandbox, namespace, name))
        if self.reconciler.finalize(namespace, name, uid, report=report):
            if not self.reconciler.remove_finalizer(sandbox):
                self.later.put(options.retry_seconds, functools.partial(self.queue_sandbox, namespace, name))
            return
        self.later.put(delay, functools.partial(self.queue_sandbox, namespace, name))

    # --- pods and pools

    def _node_event(self, event_type: str, node: Obj) -> None:
        """A node that turned Ready or not: a pass of every Sandbox with a pod there (one
        not Ready for long enough is replaced on another node)."""
        name = str(node["metadata"]["name"])
        was = self.reconciler.node_ready(name)
        self.reconciler.nodes.apply(event_type, node)
        if self.reconciler.node_ready(name) != was or event_type == "DELETED":
            for pod in self.reconciler.pods_on(name):
                self._queue("", pod)

    def _replace_nodes(self, namespace: str, nodes: list[Obj]) -> None:
        self.reconciler.nodes.replace(namespace, nodes)
        for node in nodes:
            if not self.reconciler.node_ready(str(node["metadata"]["name"])):
                for pod in self.reconciler.pods_on(str(node["metadata"]["name"])):
                    self._queue("", pod)

    def _pool_event(self, event_type: str, pool: Obj) -> None:
        self.reconciler.pool_event(event_type, pool)
        meta = pool["metadata"]
        self.reconciler.request_pool_pass(str(meta["namespace"]), str(meta["name"]))

    def _replace_pools(self, namespace: str, pools: list[Obj]) -> None:
        for gone in self.reconciler.pools.replace(namespace, pools):
            self.reconciler.pool_event("DELETED", gone)
        for pool in pools:
            self.reconciler.pool_event("", pool)
            self.reconciler.request_pool_pass(namespace, str(pool["metadata"]["name"]))

    def _event(self, event_type: str, pod: Obj) -> None:
        self.reconciler.watched_pod(event_type, pod)
        if event_type == "DELETED":
            self.reconciler.pod_deleted(pod)  # at once, not after the queue
        self._queue(event_type, pod)

    def _replace(self, namespace: str, pods: list[Obj]) -> None:
        # A (re)list: pods deleted while no watch ran are gone now, and each listed one
        # gets a pass, as after a start (an orphan, a pod of a stopped Sandbox).
        for pod in self.reconciler.watched_pods(namespace, pods):
            self.reconciler.pod_deleted(pod)
            self._queue("DELETED", pod)
        for pod in pods:
            self._queue("", pod)

    def _queue(self, event_type: str, pod: Obj) -> None:
        meta = pod["metadata"]
        self.queue.put((str(meta["namespace"]), str(meta["name"])), (event_type, pod))

    def _resync(self, stop: threading.Event) -> None:
        # A safety net under the passes the watches bring: a pass that failed and a missed
        # event are made good, a refused create is tried again.
        while not stop.wait(self.reconciler.options.resync_seconds):
            for namespace in self.namespaces:
                for sandbox in self.reconciler.sandboxes.select(namespace, {}):
                    self.queue_sandbox(namespace, str(sandbox["metadata"]["name"]))
                for pool in self.reconciler.pools.select(namespace, {}):
                    self.reconciler.request_pool_pass(namespace, str(pool["metadata"]["name"]))

    @contextmanager
    def running(self) -> Iterator[None]:
        stop = threading.Event()
        threads = [informer.start(stop, "informer") for informer in self.informers]
        for target, name in ((self._resync, "resync"), (self.later.run, "later")):
            thread = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
            thread.start()
            threads.append(thread)
        try:
            yield
        finally:
            stop.set()
            for queue in (self.sandbox_queue, self.queue, self.pool_queue):
                queue.shutdown()
            for thread in threads:
                thread.join(timeout=5)


def run(
    namespaces: Sequence[str], kubeconfig: str | None, *, options: ControllerOptions | None = None
) -> None:
    """Run the controller for Sandboxes in `namespaces` until SIGINT/SIGTERM. A kubeconfig
    path, or None for the pod's service account."""
    if not namespaces:
        raise ValueError("name at least one sandbox namespace to watch")
    options = options or ControllerOptions()
    reconciler = Reconciler(Kube.connect(kubeconfig), options)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    log.info("watching Sandboxes in %s with %d workers", ", ".join(namespaces), options.workers)
    with Watches(reconciler, namespaces).running():
        while not stop.wait(3600):
            pass
    log.info("stopped")


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
    parser.add_argument("--log-format", choices=["json", "plain"], default="json")
    parser.add_argument("--verbose", action="store_true")
    leader.add_arguments(parser)
    args = parser.parse_args(argv)
    level = "debug" if args.verbose else "info"
    if args.log_format == "json":
        logs.configure(level, quiet=("urllib3", "kubernetes"))
    else:
        logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = ControllerOptions(
        pod=PodOptions(
            runtime_class=args.runtime_class,
            image_pull_policy=cast(PullPolicy, args.image_pull_policy),
            cpu_request_percent=args.cpu_request_percent,
            memory_request_percent=args.memory_request_percent,
            agent_image=args.agent_image,
            agent_in_images=frozenset(args.agent_in_image),
        ),
        resync_seconds=args.resync_seconds,
        workers=args.workers,
        node_lost_seconds=args.node_lost_seconds,
        workspace=blockd_volume if args.workspaces else no_workspace,
    )
    leader.lead_if_asked(args)
    run(args.namespace, args.kubeconfig, options=options)


if __name__ == "__main__":
    main()
