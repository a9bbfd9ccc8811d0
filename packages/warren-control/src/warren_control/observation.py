"""What the cluster shows for a sandbox, in the client's words.

One function, `converge`, brings a product record to what its Sandbox resource (and, where
the status mirror has it, the pod) shows: phase, the Ready condition with every cluster name
scrubbed out, and a location hint coarse enough to name no node. The API's read-through and
the status mirror both use it, so the two can never describe the same state differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from warren_control import store
from warren_control.controller import observe, status_for
from warren_control.kube import Obj
from warren_control.models import Sandbox, SandboxPhase, utcnow
from warren_control.podspec import sandbox_pod_name, sandbox_workspace_id
from warren_control.scrub import scrub

# A record whose resource is missing this long after creation was never (or is no longer)
# in the cluster: a crash between the two writes, or a resource deleted behind our back.
MISSING_GRACE = timedelta(seconds=60)
# The node labels a location hint may repeat: topology, never identity.
LOCATION_LABELS = {"zone": "topology.kubernetes.io/zone", "region": "topology.kubernetes.io/region"}
# The cluster's reasons a pod will never start by waiting (its image cannot be had).
CANNOT_START = frozenset({"ErrImageNeverPull", "InvalidImageName"})


def start_report(obj: Obj) -> tuple[str, str, bool]:
    """(phase, Ready reason, whether that is the status of the resource's current
    generation: a stop or resume the controller has not seen yet is not) the Sandbox
    resource's status reports."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    current = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    return str(status.get("phase") or ""), str(ready.get("reason") or ""), current


def start_ended(obj: Obj) -> bool:
    """Whether the Sandbox's start has ended: it runs (as its current generation), it
    failed, or it cannot start."""
    phase, reason, current = start_report(obj)
    running = phase == SandboxPhase.RUNNING.value and current
    return running or phase == SandboxPhase.FAILED.value or reason in CANNOT_START


def location_of(node: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The topology a node's labels state, or None when they state none."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    hint = {key: str(labels[label]) for key, label in LOCATION_LABELS.items() if labels.get(label)}
    return hint or None


def with_pod(sandbox: Obj, pod: Obj | None) -> Obj:
    """The Sandbox as it will read once the controller has seen `pod`: its status computed by
    the controller's own pure function, so the mirror need not wait for the controller."""
    seen = observe(sandbox, pod, agent_answers=_agent_answered(sandbox, pod))
    status = status_for(sandbox, seen)
    written = sandbox.get("status") or {}
    for key in ("memoryImage", "restoredFrom"):  # the controller's word, not the pod's
        if key in written:
            status[key] = written[key]
    return {**sandbox, "status": status}


def _agent_answered(sandbox: Obj, pod: Obj | None) -> bool:
    """Whether the controller reported the Sandbox Running in this very pod. For a container
    added to a claimed pool pod that is the word of its agent, which the controller asks
    itself; the pod shows the container running only after kubelet's next look, a second
    or more later."""
    status = sandbox.get("status") or {}
    return (
        pod is not None
        and status.get("phase") == "Running"
        and status.get("podName") == pod["metadata"]["name"]
        and status.get("observedGeneration") == (sandbox.get("metadata") or {}).get("generation")
    )


def _same_conditions(new: list[dict[str, Any]], old: list[dict[str, Any]] | None) -> bool:
    """Equal but for transition times: the mirror computes a status itself before the
    controller has written one, and then every computation stamps the time it ran."""

    def timeless(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in c.items() if k != "last_transition_time"} for c in conditions]

    return old is not None and timeless(new) == timeless(old)


def memory_condition(status: Obj) -> dict[str, Any] | None:
    """The Sandbox's memory image (status.memoryImage; status.restoredFrom once a start
    used it) as a condition the API shows: the restore point a start resumes from."""
    record = status.get("memoryImage") or {}
    if record.get("error"):
        return _memory("False", "CaptureFailed", f"capturing its memory failed: {record['error']}")
    if record.get("image"):
        return _image_condition(record)
    if status.get("restoredFrom"):
        return _memory("False", "Restored", "resumed from its memory image")
    return None


def _image_condition(record: Obj) -> dict[str, Any]:
    """A captured image: its workspace still stopping, being proved by a restore, proved
    (a restore point), or found not to restore."""
    size = f"{int(record.get('bytes') or 0) / (1 << 20):.1f} MiB"
    check = record.get("verification") or {}
    if "sealedSeq" not in record:
        return _memory("Unknown", "Sealing", f"a memory image of {size}: its workspace is still stopping")
    if record.get("unrestorable"):
        return _memory(
            "False",
            "Unrestorable",
            f"a memory image of {size} that did not restore ({record['unrestorable']}): "
            "no start resumes from it; start the sandbox cold",
        )
    if not (record.get("verifiedAt") and check.get("done")):
        return _memory("Unknown", "Verifying", f"a memory image of {size}: proving it restores")
    return _memory(
        "True",
        "Captured",
        f"a memory image of {size}, captured at {record.get('capturedAt')}, valid over "
        f"the workspace's write record {record['sealedSeq']}, restored in "
        f"{int(check.get('ms') or 0)} ms when it was made: a start resumes from it",
    )


def _memory(state: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": "MemoryImage",
        "status": state,
        "reason": reason,
        "message": message,
        "last_transition_time": None,
    }


def converge(
    session: Session,
    record: Sandbox,
    obj: Obj | None,
    namespace: str,
    *,
    location: dict[str, str] | None = None,
) -> bool:
    """Bring the record's phase and conditions to what the Sandbox resource's status says,
    in the client's words; True if the record changed."""
    if record.phase is SandboxPhase.DELETED:
        return False
    if obj is None:
        if record.phase is SandboxPhase.TERMINATING:
            store.set_phase(session, record, SandboxPhase.DELETED)
            return True
        if record.phase is not SandboxPhase.FAILED and utcnow() - record.created_at > MISSING_GRACE:
            condition = {
                "type": "Ready",
                "status": "False",
                "reason": "ResourceMissing",
                "message": "the cluster holds nothing for this sandbox",
                "last_transition_time": utcnow().isoformat(),
            }
            store.set_phase(session, record, SandboxPhase.FAILED, conditions=[condition])
            return True
        return False
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    uid = str(meta.get("uid") or "")
    names = (record.object_name, sandbox_pod_name(obj) if uid else "", uid, namespace)
    conditions = [
        {
            "type": str(c.get("type", "")),
            "status": str(c.get("status", "")),
            "reason": scrub(str(c.get("reason") or ""), *names),
            "message": scrub(str(c.get("message") or ""), *names),
            "last_transition_time": c.get("lastTransitionTime"),
        }
        for c in status.get("conditions") or []
        if isinstance(c, dict)
    ]
    memory = memory_condition(status)
    if memory is not None:
        conditions.append(memory)
    observed = status.get("phase")
    if meta.get("deletionTimestamp"):
        # Being deleted, whatever the status still says. (The controller also reports
        # Terminating while a stopped sandbox's pod goes away: that one passes.)
        phase = SandboxPhase.TERMINATING
    elif observed in {p.value for p in SandboxPhase} and observed != SandboxPhase.DELETED.value:
        phase = SandboxPhase(observed)
    else:
        phase = record.phase
    changed = False
    if meta.get("deletionTimestamp") and not record.being_deleted:
        store.begin_delete(session, record, conditions=conditions or None)  # deleted behind our back
        changed = True
    elif phase is not record.phase or (conditions and not _same_conditions(conditions, record.conditions)):
        store.set_phase(session, record, phase, conditions=conditions or None)
        changed = True
    if location is not None and location != record.location:
        record.location = location
        changed = True
    # A workspace bound when the sandbox started (a pool pod's, or a new one): recorded once.
    bound = sandbox_workspace_id(obj)
    if bound and not record.workspace_id:
        record.workspace_id = bound
        changed = True
    return changed
