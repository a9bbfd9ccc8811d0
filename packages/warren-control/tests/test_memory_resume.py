"""Pause and resume with memory against the in-memory API server of test_controller.py: a
stop that asks for it has the node capture the sandbox before its pod goes, the image is
sealed over the workspace's write record once the pod is gone, and a start restores a new
pod from it on that node, or says why not; never a cold start unless asked. The cluster tier
(tests/workloads/test_memory_images.py) does the same with runsc and warren-blockd."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from test_controller import NS, FakeKube, remember_all, run
from warren_control.binder import BindError
from warren_control.controller import SLOT_SETTLE_S, ControllerOptions, Reconciler
from warren_control.kube import Obj
from warren_control.podspec import (
    POOL_LABEL,
    RESTORE_ANNOTATION,
    RESTORE_WAIT_ANNOTATION,
    RESTORE_WAIT_S,
    RESUME_SLOT_RENEW_S,
    SANDBOX_UID_LABEL,
    VERIFIES_LABEL,
    PodOptions,
)

IMAGE = "ab" * 32
WORKSPACE = {"id": "ws-a", "size": "10Gi"}


class FakeBinder:
    """The nodes' memory calls as the controller makes them, each answered or refused."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.refuse: dict[str, str] = {}

    def _call(self, what: str, args: Any) -> None:
        self.calls.append((what, args))
        if what in self.refuse:
            raise BindError(self.refuse[what])

    def capture(self, pod: Obj, workspace: str) -> dict[str, Any]:
        self._call("capture", (pod["metadata"]["uid"], workspace))
        return {"image": IMAGE, "workspace": workspace, "workspace_seq": 5, "bytes": 3 << 20}

    def discard(self, pod: Obj) -> dict[str, Any]:
        self._call("discard", pod["metadata"]["uid"])
        return {}

    def stage(
        self, node: str, image: str, workspace: str, workspace_seq: int, into: str | None = None
    ) -> dict[str, Any]:
        self._call("stage", (node, image, workspace, workspace_seq, *([into] if into else [])))
        return {"image": image, "path": f"/state/images/{image}.0001"}

    def bind(
        self, pod: Obj, workspace: Any, siblings: int | None = None, container_id: str | None = None
    ) -> str:
        self._call("bind", (pod["metadata"]["name"], dict(workspace)))
        return "restored"

    def place(self, node: str, staged: str, slot: str) -> dict[str, Any]:
        self._call("place", (node, staged, slot))
        return {"slot": slot, "path": f"/state/images/slot-{slot}"}

    def release(self, node: str, slot: str) -> dict[str, Any]:
        self._call("release", (node, slot))
        return {"slot": slot, "released": True}

    def named(self, what: str) -> list[Any]:
        return [args for name, args in self.calls if name == what]


@pytest.fixture
def setup() -> tuple[FakeKube, Reconciler, FakeBinder]:
    kube = FakeKube()
    binder = FakeBinder()
    options = ControllerOptions(
        quiet_start_seconds=0,
        workspace_seq=lambda ws: 8,
        release_workspace=lambda ws: binder.calls.append(("release", ws)),
    )
    reconciler = Reconciler(kube, options)
    reconciler.binder = binder  # type: ignore[assignment]
    kube.add_sandbox("a", workspace=dict(WORKSPACE))
    reconciler.reconcile(NS, "a")
    (pod,) = kube.pods.values()
    pod["spec"]["nodeName"] = "node-b"
    run(pod)
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["phase"] == "Running"
    return kube, reconciler, binder


def pause(kube: FakeKube, reconciler: Reconciler, *, verify: bool = True) -> None:
    """Stop "a" with memory until its image is sealed and, with `verify`, proved by a
    restore that ran (the verifying pod run, deleted and gone)."""
    kube.update_spec("a", stopped=True, memoryCapture=True)
    reconciler.reconcile(NS, "a")
    kube.finish_deletions()
    reconciler.reconcile(NS, "a")
    if verify:
        run(verifier(kube))
        reconciler.reconcile(NS, "a")
        kube.finish_deletions()
        reconciler.reconcile(NS, "a")


def verifier(kube: FakeKube) -> Obj:
    (pod,) = [p for p in kube.pods.values() if VERIFIES_LABEL in p["metadata"]["labels"]]
    return pod


def test_a_stop_with_memory_captures_then_deletes_and_seals_the_image_once_the_pod_is_gone(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    (pod,) = kube.pods.values()
    kube.update_spec("a", stopped=True, memoryCapture=True)
    reconciler.reconcile(NS, "a")
    assert binder.named("capture") == [(pod["metadata"]["uid"], "ws-a")]
    assert binder.named("discard") == [pod["metadata"]["uid"]]  # after the delete: it was frozen
    assert "deletionTimestamp" in kube.pods[pod["metadata"]["name"]]["metadata"]
    record = kube.status("a")["memoryImage"]
    assert record["image"] == IMAGE and record["node"] == "node-b" and record["workspaceSeq"] == 5
    assert "sealedSeq" not in record  # the pod still unmounts its workspace
    reconciler.reconcile(NS, "a")  # still going: the discard is asked again, harmlessly
    assert len(binder.named("discard")) == 2
    kube.finish_deletions()
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["phase"] == "Stopped"
    assert kube.status("a")["memoryImage"]["sealedSeq"] == 8
    assert len(binder.named("capture")) == 1


def test_a_start_restores_a_new_pod_from_the_image_on_its_node(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    pause(kube, reconciler)
    kube.update_spec("a", stopped=False, coldStart=False)
    reconciler.reconcile(NS, "a")
    assert binder.named("stage")[-1] == ("node-b", IMAGE, "ws-a", 8)  # after the proof's, onto a fork
    (pod,) = kube.pods.values()
    notes = pod["metadata"]["annotations"]
    assert notes[RESTORE_ANNOTATION] == f"/state/images/{IMAGE}.0001"
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"][0]["values"] == ["node-b"]  # where the image is staged
    run(pod)
    reconciler.reconcile(NS, "a")
    status = kube.status("a")
    assert status["phase"] == "Running" and status["restoredFrom"] == IMAGE
    assert status["memoryImage"] is None  # used: the next stop captures anew


def node(name: str, ready: bool = True, cordoned: bool = False) -> Obj:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": cordoned},
        "status": {"conditions": [condition]},
    }


def test_a_start_restores_on_another_node_once_the_capturing_node_takes_no_pods(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    """node-b (where the image was captured) cordoned: the image is staged on the Ready node
    with the fewest sandbox pods, and the pod restored there; node-c is not Ready."""
    kube, reconciler, binder = setup
    pause(kube, reconciler)
    reconciler.nodes.replace("", [node("node-a"), node("node-b", cordoned=True), node("node-c", ready=False)])
    kube.update_spec("a", stopped=False, coldStart=False)
    reconciler.reconcile(NS, "a")
    assert binder.named("stage")[-1] == ("node-a", IMAGE, "ws-a", 8)
    (pod,) = kube.pods.values()
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"][0]["values"] == ["node-a"]


def test_a_start_with_no_node_to_restore_on_waits_and_says_so(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    pause(kube, reconciler)
    reconciler.nodes.replace("", [node("node-a", ready=False), node("node-b", cordoned=True)])
    kube.update_spec("a", stopped=False, coldStart=False)
    staged = len(binder.named("stage"))
    seen = reconciler.reconcile(NS, "a")
    assert seen is not None and (seen.phase, seen.reason) == ("Pending", "Resuming"), seen
    assert kube.pods == {} and len(binder.named("stage")) == staged  # never a cold start


def test_a_refused_stage_fails_the_start_by_name_and_only_a_cold_start_drops_the_image(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    pause(kube, reconciler)
    binder.refuse["stage"] = "warren-blockd on node node-b refused: workspace ws-a is at write record 9"
    kube.update_spec("a", stopped=False)
    reconciler.reconcile(NS, "a")
    status = kube.status("a")
    assert status["phase"] == "Failed" and not kube.pods
    condition = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert condition["reason"] == "ResumeRefused" and "write record 9" in condition["message"]
    assert status["memoryImage"]["image"] == IMAGE  # kept: the caller chooses
    kube.update_spec("a", coldStart=True)
    reconciler.reconcile(NS, "a")
    (pod,) = kube.pods.values()
    assert RESTORE_ANNOTATION not in (pod["metadata"].get("annotations") or {})
    assert kube.status("a")["memoryImage"] is None


def test_a_failed_capture_leaves_the_sandbox_running_and_says_why(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    binder.refuse["capture"] = "warren-blockd on node node-b refused: runsc checkpoint failed"
    kube.update_spec("a", stopped=True, memoryCapture=True)
    reconciler.reconcile(NS, "a")
    reconciler.reconcile(NS, "a")
    assert len(binder.named("capture")) == 1  # not tried again for this pod
    (pod,) = kube.pods.values()
    assert "deletionTimestamp" not in pod["metadata"] and not binder.named("discard")
    status = kube.status("a")
    condition = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert status["phase"] == "Running" and condition["reason"] == "MemoryCaptureFailed"
    assert "runsc checkpoint failed" in condition["message"]
    # Stopped without memory: it stops, and the next start is a cold one.
    kube.update_spec("a", memoryCapture=False)
    reconciler.reconcile(NS, "a")
    kube.finish_deletions()
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["phase"] == "Stopped"
    kube.update_spec("a", stopped=False)
    reconciler.reconcile(NS, "a")
    assert len(kube.pods) == 1 and not binder.named("stage")


def test_without_the_nodes_bind_api_a_stop_with_memory_says_so(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, _ = setup
    reconciler.binder = None
    kube.update_spec("a", stopped=True, memoryCapture=True)
    reconciler.reconcile(NS, "a")
    condition = next(c for c in kube.status("a")["conditions"] if c["type"] == "Ready")
    assert condition["reason"] == "MemoryCaptureFailed" and "no bind token" in condition["message"]


def test_a_restore_that_never_runs_gives_way_to_a_cold_start_when_asked(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, _ = setup
    pause(kube, reconciler)
    kube.update_spec("a", stopped=False, coldStart=False)
    reconciler.reconcile(NS, "a")
    (pod,) = kube.pods.values()
    pod["status"] = {  # runsc could not restore it
        "phase": "Pending",
        "containerStatuses": [
            {"name": "sandbox", "state": {"waiting": {"reason": "RunContainerError", "message": "restoring"}}}
        ],
    }
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["memoryImage"]["image"] == IMAGE  # not restored: kept
    assert "deletionTimestamp" not in kube.pods[pod["metadata"]["name"]]["metadata"]
    kube.update_spec("a", coldStart=True)
    reconciler.reconcile(NS, "a")
    assert "deletionTimestamp" in kube.pods[pod["metadata"]["name"]]["metadata"]
    kube.finish_deletions()
    reconciler.reconcile(NS, "a")
    (fresh,) = kube.pods.values()
    assert RESTORE_ANNOTATION not in (fresh["metadata"].get("annotations") or {})
    assert kube.status("a")["memoryImage"] is None


def test_an_image_is_a_restore_point_only_once_a_pod_restored_from_it_runs(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    pause(kube, reconciler, verify=False)
    record = kube.status("a")["memoryImage"]
    fork = record["verification"]["workspace"]
    assert fork.startswith("ws-a-v") and "verifiedAt" not in record
    # Staged onto a new fork of the workspace at the sealed record, on the image's node.
    assert binder.named("stage") == [("node-b", IMAGE, "ws-a", 8, fork)]
    pod = verifier(kube)
    assert pod["metadata"]["annotations"][RESTORE_ANNOTATION] == f"/state/images/{IMAGE}.0001"
    assert SANDBOX_UID_LABEL not in pod["metadata"]["labels"]  # never served as the sandbox
    assert pod["spec"]["terminationGracePeriodSeconds"] == 0
    assert kube.status("a")["phase"] == "Stopped"
    # A start meanwhile waits for the proof.
    kube.update_spec("a", stopped=False, coldStart=False)
    reconciler.reconcile(NS, "a")
    condition = next(c for c in kube.status("a")["conditions"] if c["type"] == "Ready")
    assert condition["reason"] == "Resuming" and "proving" in condition["message"]
    assert len(binder.named("stage")) == 1
    run(pod)
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["memoryImage"]["verifiedAt"]
    assert "deletionTimestamp" in verifier(kube)["metadata"]
    kube.finish_deletions()
    reconciler.reconcile(NS, "a")  # the proof's workspace goes, then the resume
    assert binder.named("release") == [fork]
    assert binder.named("stage")[-1] == ("node-b", IMAGE, "ws-a", 8)
    (resumed,) = kube.pods.values()
    run(resumed)
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["restoredFrom"] == IMAGE


def test_an_image_that_does_not_restore_is_never_resumed_from(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    pause(kube, reconciler, verify=False)
    pod = verifier(kube)
    pod["status"] = {
        "phase": "Pending",
        "containerStatuses": [
            {"name": "sandbox", "state": {"waiting": {"reason": "RunContainerError", "message": "bad image"}}}
        ],
    }
    reconciler.reconcile(NS, "a")
    assert "bad image" in kube.status("a")["memoryImage"]["unrestorable"]
    kube.finish_deletions()
    reconciler.reconcile(NS, "a")
    assert len(binder.named("release")) == 1
    kube.update_spec("a", stopped=False, coldStart=False)
    reconciler.reconcile(NS, "a")
    status = kube.status("a")
    condition = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert status["phase"] == "Failed" and condition["reason"] == "ResumeRefused"
    assert "did not restore" in condition["message"] and not kube.pods
    kube.update_spec("a", coldStart=True)
    reconciler.reconcile(NS, "a")
    (pod,) = kube.pods.values()
    assert RESTORE_ANNOTATION not in (pod["metadata"].get("annotations") or {})


def test_a_sandbox_deleted_while_its_image_is_proved_takes_the_proof_with_it(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    pause(kube, reconciler, verify=False)
    fork = kube.status("a")["memoryImage"]["verification"]["workspace"]
    uid = kube.sandboxes["a"]["metadata"]["uid"]
    assert not reconciler.finalize(NS, "a", uid)
    assert "deletionTimestamp" in verifier(kube)["metadata"]
    kube.finish_deletions()
    assert reconciler.finalize(NS, "a", uid)
    assert binder.named("release") == [fork]


def test_a_forks_child_is_restored_from_its_parents_image_onto_its_own_workspace(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    origin = {"image": IMAGE, "workspace": "ws-a", "workspaceSeq": 8, "node": "node-b"}
    kube.add_sandbox("c", workspace={"id": "ws-c", "forkOf": "ws-a", "size": "10Gi"}, memoryFrom=origin)
    reconciler.reconcile(NS, "c")
    assert binder.named("stage") == [("node-b", IMAGE, "ws-a", 8, "ws-c")]
    (pod,) = [p for p in kube.pods.values() if RESTORE_ANNOTATION in (p["metadata"].get("annotations") or {})]
    run(pod)
    reconciler.reconcile(NS, "c")
    assert kube.status("c")["restoredFrom"] == IMAGE
    # Restored once: a pod made again later (a changed spec) starts cold.
    kube.update_spec("c", image="busybox:2")
    reconciler.reconcile(NS, "c")
    kube.finish_deletions()
    reconciler.reconcile(NS, "c")
    (again,) = [p for p in kube.pods.values() if p["metadata"]["ownerReferences"][0]["name"] == "c"]
    assert RESTORE_ANNOTATION not in (again["metadata"].get("annotations") or {})
    assert len(binder.named("stage")) == 1


def test_a_forks_child_whose_restore_is_refused_says_why(
    setup: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = setup
    binder.refuse["stage"] = "workspace ws-c stands on ws-a at record 9, not on ws-a at record 8"
    origin = {"image": IMAGE, "workspace": "ws-a", "workspaceSeq": 8, "node": "node-b"}
    kube.add_sandbox("c", workspace={"id": "ws-c", "forkOf": "ws-a", "size": "10Gi"}, memoryFrom=origin)
    reconciler.reconcile(NS, "c")
    status = kube.status("c")
    condition = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert status["phase"] == "Failed" and condition["reason"] == "ResumeRefused"
    assert "record 9" in condition["message"] and "start it cold" in condition["message"]


# -- resume slots: pods made ahead that a resume restores into ------------------------------

SLOTTED = PodOptions(
    agent_image="agent", agent_in_images=frozenset({"busybox"}), memory_images_dir="/state/images"
)


@pytest.fixture
def slotted() -> tuple[FakeKube, Reconciler, FakeBinder]:
    """setup's paused Sandbox "a" (its image with the agent in it, as a capture needs), with
    a resume pool of its image and size: one slot on each of two nodes, settled."""
    kube = FakeKube()
    binder = FakeBinder()
    options = ControllerOptions(quiet_start_seconds=0, workspace_seq=lambda ws: 8, pod=SLOTTED)
    reconciler = Reconciler(kube, options)
    reconciler.binder = binder  # type: ignore[assignment]
    reconciler.nodes.replace("", [node("node-b"), node("node-c")])
    kube.add_sandbox("a", workspace=dict(WORKSPACE), agentTokenSha256="1" * 64)
    reconciler.reconcile(NS, "a")
    (pod,) = kube.pods.values()
    pod["spec"]["nodeName"] = "node-b"
    run(pod)
    reconciler.reconcile(NS, "a")
    pause(kube, reconciler)
    pool = {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": "resumes", "namespace": NS, "uid": kube._uid(), "generation": 1},
        "spec": {"image": "busybox", "resume": True, "size": 2, "refillPerSecond": 100},
    }
    reconciler.pool_event("ADDED", pool)
    reconciler.reconcile_pool(NS, "resumes")
    for slot, on in zip(slots(kube), ("node-c", "node-b"), strict=True):
        settle(slot, on)
    remember_all(reconciler, kube)
    return kube, reconciler, binder


def slots(kube: FakeKube) -> list[Obj]:
    return [p for p in kube.pods.values() if p["metadata"].get("labels", {}).get(POOL_LABEL) == "resumes"]


def settle(slot: Obj, on: str, age_s: float = 10.0) -> None:
    """As kubelet leaves a slot: scheduled, its sandbox made and waiting for its image."""
    made = datetime.now(UTC) - timedelta(seconds=age_s)
    slot["metadata"]["creationTimestamp"] = made.strftime("%Y-%m-%dT%H:%M:%SZ")
    slot["spec"]["nodeName"] = on
    slot["status"] = {
        "phase": "Pending",
        "containerStatuses": [{"name": "sandbox", "state": {"waiting": {"reason": "ContainerCreating"}}}],
    }


def test_a_slot_is_the_sandboxs_pod_waiting_for_an_image_at_its_own_path(
    slotted: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, _, _ = slotted
    for slot in slots(kube):
        name, notes = slot["metadata"]["name"], slot["metadata"]["annotations"]
        assert notes[RESTORE_ANNOTATION] == f"/state/images/slot-{name}"
        assert notes[RESTORE_WAIT_ANNOTATION] == str(RESTORE_WAIT_S)
        (volume,) = slot["spec"]["volumes"]
        assert volume["csi"]["volumeAttributes"] == {"bindAtClaim": "true"}
        (container,) = slot["spec"]["containers"]
        assert container["volumeMounts"] == [{"name": "workspace", "mountPath": "/workspace"}]
        start = container["lifecycle"]["postStart"]["exec"]["command"]
        assert "-claim-token-sha256" in start  # its agent is claimed once restored


def test_a_resume_claims_a_slot_binds_the_workspace_then_places_the_image(
    slotted: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = slotted
    claims: list[str] = []
    reconciler._await_slot = lambda sandbox, pod, pool: claims.append(pod["metadata"]["name"])  # type: ignore[method-assign]
    creates = kube.creates
    kube.update_spec("a", stopped=False)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    claimed = kube.pods[claims[0]]
    assert claimed["spec"]["nodeName"] == "node-b"  # the capturing node's slot: its copy stages at once
    assert kube.creates == creates  # no pod made at the resume
    assert claimed["metadata"]["labels"][SANDBOX_UID_LABEL] == kube.sandboxes["a"]["metadata"]["uid"]
    order = [name for name, _ in binder.calls if name in {"stage", "bind", "place"}]
    assert order[-3:] == ["stage", "bind", "place"]  # the workspace there before the restore begins
    assert binder.named("stage")[-1] == ("node-b", IMAGE, "ws-a", 8)
    assert binder.named("bind")[-1] == (claims[0], {"id": "ws-a"})
    assert binder.named("place")[-1] == ("node-b", f"/state/images/{IMAGE}.0001", claims[0])
    # Restored (kubelet says it runs), but its agent not claimed yet: not Running.
    remember_all(reconciler, kube)
    reconciler._slot_claiming.add(claimed["metadata"]["uid"])
    run(kube.pods[claims[0]])
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["phase"] == "Pending"
    reconciler._slot_claiming.discard(claimed["metadata"]["uid"])
    reconciler._agent_answers.add(claimed["metadata"]["uid"])
    reconciler.reconcile(NS, "a")
    status = kube.status("a")
    assert status["phase"] == "Running" and status["restoredFrom"] == IMAGE
    assert status["podName"] == claims[0]


def test_a_resume_takes_a_slot_on_another_node_when_its_own_takes_no_pods(
    slotted: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = slotted
    reconciler.nodes.replace("", [node("node-b", cordoned=True), node("node-c")])
    reconciler._await_slot = lambda sandbox, pod, pool: None  # type: ignore[method-assign]
    kube.update_spec("a", stopped=False)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert binder.named("place")[-1][0] == "node-c"
    assert binder.named("stage")[-1][0] == "node-c"  # staged where it restores


def test_a_slot_not_settled_or_of_another_shape_is_passed_over_and_a_pod_made(
    slotted: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = slotted
    for slot in slots(kube):
        settle(slot, slot["spec"]["nodeName"], age_s=0.5)  # its volume maybe not published yet
    remember_all(reconciler, kube)
    kube.update_spec("a", stopped=False)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert binder.named("place") == []
    restored = [p for p in kube.pods.values() if p["metadata"]["name"].startswith("sbx-")]
    assert restored and restored[0]["metadata"]["annotations"][RESTORE_ANNOTATION].endswith(".0001")


def test_a_slot_whose_bind_fails_goes_and_the_next_pass_resumes_anew(
    slotted: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, binder = slotted
    reconciler._await_slot = lambda sandbox, pod, pool: None  # type: ignore[method-assign]
    binder.refuse["bind"] = "no volume of pod x is published on this node"
    kube.update_spec("a", stopped=False)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert binder.named("place") == []
    (claimed,) = [p for p in kube.pods.values() if SANDBOX_UID_LABEL in p["metadata"]["labels"]]
    assert "deletionTimestamp" in claimed["metadata"]
    assert kube.status("a")["memoryImage"]["image"] == IMAGE  # kept for the next try
    del binder.refuse["bind"]
    remember_all(reconciler, kube)  # the watch shows it claimed and going, then gone
    kube.finish_deletions()
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert len(binder.named("place")) == 1


def test_a_resume_pool_renews_its_slots_before_their_wait_ends_and_serves_no_create(
    slotted: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    kube, reconciler, _ = slotted
    old = slots(kube)[0]
    settle(old, "node-b", age_s=RESUME_SLOT_RENEW_S + 1)
    remember_all(reconciler, kube)
    reconciler.reconcile_pool(NS, "resumes")
    assert "deletionTimestamp" in kube.pods[old["metadata"]["name"]]["metadata"]
    assert len([s for s in slots(kube) if "deletionTimestamp" not in s["metadata"]]) == 2  # one new
    kube.add_sandbox("b", pool="resumes", agentTokenSha256="2" * 64)
    reconciler.reconcile(NS, "b")
    (condition,) = [c for c in kube.status("b")["conditions"] if c["type"] == "PoolClaimed"]
    assert condition["reason"] == "PoolMismatch" and "resume" in condition["message"]


def test_a_slot_being_deleted_is_released_once_so_that_its_pod_can_go(
    slotted: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    """A slot's runsc waits for an image inside kubelet's request to make its sandbox, which
    a deletion does not end: the pool's pass has the node end the wait, once per slot."""
    kube, reconciler, binder = slotted
    one, other = slots(kube)
    kube.pods[one["metadata"]["name"]]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    remember_all(reconciler, kube)
    reconciler.reconcile_pool(NS, "resumes")
    reconciler.reconcile_pool(NS, "resumes")
    assert binder.named("release") == [(one["spec"]["nodeName"], one["metadata"]["name"])]
    # The pool deleted: the garbage collector deletes its slots, and each is released.
    reconciler.pool_event("DELETED", reconciler.pools.get(NS, "resumes"))
    kube.pods[other["metadata"]["name"]]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    remember_all(reconciler, kube)
    reconciler.reconcile_pool(NS, "resumes")
    assert binder.named("release")[-1] == (other["spec"]["nodeName"], other["metadata"]["name"])
    assert len(binder.named("release")) == 2


def test_a_resume_pool_passes_again_when_a_slot_settles_to_count_it_ready(
    slotted: tuple[FakeKube, Reconciler, FakeBinder],
) -> None:
    """A slot's last event may come before it settles: the pool asks for its own pass then,
    so that its status counts the slot ready without waiting for the renewal's."""
    kube, reconciler, _ = slotted
    young = slots(kube)[0]
    settle(young, "node-b", age_s=1.0)
    remember_all(reconciler, kube)
    reconciler.reconcile_pool(NS, "resumes")
    pool = reconciler.pools.get(NS, "resumes")
    assert kube.pool_status["resumes"]["ready"] == 1  # the settled one only
    due = reconciler._renewals[pool["metadata"]["uid"]] - time.monotonic()
    assert 0 < due <= SLOT_SETTLE_S
