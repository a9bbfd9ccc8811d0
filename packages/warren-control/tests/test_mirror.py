"""The status mirror's converging, fed the events its informers would deliver, on SQLite and a
real PostgreSQL: the record follows the pod before the controller writes any status, in words
that name nothing of the cluster's; a deleted resource retires its record; a record whose
resource never appeared fails once the grace has passed; the location hint carries topology
labels only. test_api_cluster.py runs the mirror, informers and all, against a real cluster."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from api_stack import NAMESPACE, Stack, StandIn
from warren_control import controller
from warren_control.kube import Obj
from warren_control.mirror import Mirror, MirrorOptions
from warren_control.models import Sandbox, SandboxPhase
from warren_control.podspec import pod_for, pod_name

pytest_plugins = ["api_fixtures"]

IMAGE = "registry.example/tools/busybox:1.36"


@pytest.fixture
def mirror(stack: Stack, standin: StandIn) -> Iterator[Mirror]:
    found = Mirror(stack.sessions, standin.kube(), NAMESPACE, MirrorOptions())
    found._replace_pods([])
    yield found


def record(stack: Stack, sandbox_id: str) -> Sandbox:
    with stack.sessions() as session:
        found = session.get(Sandbox, sandbox_id)
        assert found is not None
        return found


def the_pod(obj: Obj, phase: str, *, ready: bool = False, node: str = "node-a", **status: Any) -> Obj:
    pod = pod_for(obj)
    pod["metadata"]["uid"] = "11111111-2222-3333-4444-555555555555"
    pod["spec"]["nodeName"] = node
    pod["status"] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        **status,
    }
    return pod


def test_the_record_follows_the_pod(
    stack: Stack, standin: StandIn, mirror: Mirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    name = stack.object_name(box.id)
    obj = copy.deepcopy(standin.get(name))
    assert obj is not None
    mirror._replace_sandboxes([obj])
    mirror.step(0)
    assert record(stack, box.id).phase is SandboxPhase.PENDING

    # The image cannot be had: the reason reaches the client, the pod's name does not.
    waiting = the_pod(
        obj,
        "Pending",
        containerStatuses=[
            {
                "name": "sandbox",
                "state": {
                    "waiting": {
                        "reason": "ErrImageNeverPull",
                        "message": f'pod "{pod_name(obj["metadata"]["uid"])}": image not present',
                    }
                },
            }
        ],
    )
    mirror._pod_event("ADDED", waiting)
    assert mirror.step(0) == 1
    seen = org.client.get(box.id)
    assert seen.phase == "Pending"
    assert seen.reason == "ErrImageNeverPull: the pod: image not present"
    assert pod_name(obj["metadata"]["uid"]) not in str(seen.raw)

    # Running and ready: Running, with the node's topology as the only location hint.
    mirror.kube.read_node = lambda node: {  # type: ignore[method-assign]
        "metadata": {
            "name": node,
            "labels": {
                "kubernetes.io/hostname": node,
                "topology.kubernetes.io/zone": "zone-1",
                "topology.kubernetes.io/region": "region-x",
            },
        }
    }
    mirror._pod_event("MODIFIED", the_pod(obj, "Running", ready=True, node="node-b"))
    assert mirror.step(0) == 1
    seen = org.client.get(box.id)
    assert seen.phase == "Running"
    assert seen.raw["location"] == {"zone": "zone-1", "region": "region-x"}
    assert "node-b" not in str(seen.raw)
    assert record(stack, box.id).started_at is not None
    # Nothing new: nothing written, even when the status computed again carries a later
    # transition time (the Sandbox here has no status of the controller's to keep one).
    monkeypatch.setattr(controller, "_now", lambda: "2099-01-01T00:00:00Z")
    mirror._pod_event("MODIFIED", the_pod(obj, "Running", ready=True, node="node-b"))
    assert mirror.step(0) == 0

    # The resource is deleted (the finalizer done): the record is retired.
    standin.hold_deletes = True  # as a finalizer would
    try:
        org.client.delete(box.id)
    finally:
        standin.hold_deletes = False
    deleting = {**obj, "metadata": {**obj["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    mirror._sandbox_event("MODIFIED", deleting)
    mirror.step(0)
    assert record(stack, box.id).phase is SandboxPhase.TERMINATING
    mirror._sandbox_event("DELETED", deleting)
    mirror.step(0)
    assert record(stack, box.id).phase is SandboxPhase.DELETED


def test_a_record_without_its_resource_fails_after_the_grace(
    stack: Stack, standin: StandIn, mirror: Mirror
) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    name = stack.object_name(box.id)
    mirror._replace_sandboxes([])  # the cluster holds nothing (a crash between the two writes)
    mirror.step(0)
    assert record(stack, box.id).phase is SandboxPhase.PENDING  # within the grace
    with stack.sessions.begin() as session:
        found = session.get(Sandbox, box.id)
        assert found is not None
        found.created_at = found.created_at - timedelta(minutes=5)
    mirror._full_pass = True
    mirror.step(0)
    failed = org.client.get(box.id)
    assert failed.phase == "Failed"
    assert failed.reason.startswith("ResourceMissing")
    assert name not in str(failed.raw)


def test_stopping_reads_as_the_controller_would_say_it(
    stack: Stack, standin: StandIn, mirror: Mirror
) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    obj = copy.deepcopy(standin.get(stack.object_name(box.id)))
    assert obj is not None
    mirror._replace_sandboxes([obj])
    pod = the_pod(obj, "Running", ready=True)
    mirror._pod_event("ADDED", pod)
    mirror.step(0)
    assert record(stack, box.id).phase is SandboxPhase.RUNNING
    stopped = copy.deepcopy(obj)
    stopped["spec"]["stopped"] = True
    mirror._sandbox_event("MODIFIED", stopped)
    going = copy.deepcopy(pod)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    mirror._pod_event("MODIFIED", going)
    mirror.step(0)
    assert record(stack, box.id).phase is SandboxPhase.TERMINATING
    mirror._pod_event("DELETED", going)
    mirror.step(0)
    assert record(stack, box.id).phase is SandboxPhase.STOPPED


def test_a_memory_image_the_controller_recorded_reaches_the_record(
    stack: Stack, standin: StandIn, mirror: Mirror
) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    obj = copy.deepcopy(standin.get(stack.object_name(box.id)))
    assert obj is not None
    obj["spec"]["stopped"] = True
    image = {"image": "ab" * 32, "bytes": 2 << 20, "workspaceSeq": 5, "sealedSeq": 8, "capturedAt": "x"}
    image |= {"verifiedAt": "y", "verification": {"workspace": "ws-v", "ms": 900, "done": True}}
    obj["status"] = {"phase": "Stopped", "memoryImage": image}
    mirror._replace_sandboxes([obj])
    mirror.step(0)
    (memory,) = [c for c in record(stack, box.id).conditions if c["type"] == "MemoryImage"]
    assert memory["reason"] == "Captured" and "write record 8" in memory["message"]
