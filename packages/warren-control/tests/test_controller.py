"""The controller's pass against an in-memory API server: one pod per Sandbox whatever the
order of triggers and crashes, status from what the pod shows, and the finalizer. The
cluster tests (test_controller_cluster.py) run the same against a real cluster."""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from warren_common.testing import wait_for
from warren_control.controller import (
    FINALIZER,
    ControllerOptions,
    Observation,
    Reconciler,
    Watches,
    observe,
    status_for,
)
from warren_control.kube import ApiException, Kube, Obj
from warren_control.podspec import blockd_volume, pod_for, pod_name

NS = "warren-sandboxes"


def api_error(status: int, message: str) -> ApiException:
    return ApiException(status=status, reason="refused", body=json.dumps({"message": message}))


class FakeKube(Kube):
    """Pods and Sandboxes in dicts, with the API server's answers the controller relies on:
    AlreadyExists, NotFound, graceful deletion, uid preconditions."""

    def __init__(self) -> None:
        super().__init__(api=None)  # type: ignore[arg-type]
        self.pods: dict[str, Obj] = {}
        self.sandboxes: dict[str, Obj] = {}
        self.creates = 0
        self.status_patches = 0
        self.reads = 0  # single-object GETs: what the stores are there to spare
        self.refuse: ApiException | None = None
        self.hide_next_read = False  # a create raced by another pass: read misses, create 409s
        self.lists = 0
        self.pod_patches = 0
        self.spec_patches = 0
        self.json_patches = 0
        self.forced: list[str] = []  # pods deleted without their kubelet's word
        self.pool_status: dict[str, Obj] = {}
        self._uids = 0
        self._versions = 0

    def _uid(self) -> str:
        self._uids += 1
        return f"00000000-0000-0000-0000-{self._uids:012d}"

    def add_sandbox(self, name: str, **spec: Any) -> Obj:
        obj = {
            "apiVersion": "warren.dev/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": name, "namespace": NS, "uid": self._uid(), "generation": 1},
            "spec": {"image": "busybox", **spec},
        }
        self._version(obj)
        self.sandboxes[name] = obj
        return obj

    def update_spec(self, name: str, **spec: Any) -> None:
        self.sandboxes[name]["spec"].update(spec)
        self.sandboxes[name]["metadata"]["generation"] += 1

    def read_pod(self, namespace: str, name: str) -> Obj | None:
        self.reads += 1
        if self.hide_next_read:
            self.hide_next_read = False
            return None
        pod = self.pods.get(name)
        return copy.deepcopy(pod) if pod else None

    def list_pods(self, namespace: str, label_selector: str) -> list[Obj]:
        self.lists += 1
        if self.hide_next_read:
            self.hide_next_read = False
            return []
        key, _, value = label_selector.partition("=")
        return [
            copy.deepcopy(p) for p in self.pods.values() if p["metadata"].get("labels", {}).get(key) == value
        ]

    def _version(self, obj: Obj) -> None:
        self._versions += 1
        obj["metadata"]["resourceVersion"] = str(self._versions)

    def create_pod(self, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj:
        if self.refuse:
            raise self.refuse
        pod = copy.deepcopy(body)
        if "generateName" in pod["metadata"]:
            pod["metadata"]["name"] = f"{pod['metadata'].pop('generateName')}{self._versions + 1:05d}"
        name = pod["metadata"]["name"]
        if name in self.pods:
            raise api_error(409, f'pods "{name}" already exists')
        self.creates += 1
        pod["metadata"]["uid"] = self._uid()
        pod["metadata"]["namespace"] = namespace
        pod["status"] = {"phase": "Pending"}
        self._version(pod)
        self.pods[name] = pod
        return copy.deepcopy(pod)

    def patch_pod(self, namespace: str, name: str, patch: Obj) -> Obj:
        """A merge patch of metadata, with the resourceVersion precondition the server applies."""
        pod = self.pods.get(name)
        if pod is None:
            raise api_error(404, f'pods "{name}" not found')
        meta = patch["metadata"]
        if meta.get("resourceVersion") not in {None, pod["metadata"]["resourceVersion"]}:
            raise api_error(409, "the object has been modified")
        self.pod_patches += 1
        for key in ("labels", "annotations"):
            merged = {**pod["metadata"].get(key, {}), **meta.get(key, {})}
            pod["metadata"][key] = {k: v for k, v in merged.items() if v is not None}
        if "ownerReferences" in meta:
            pod["metadata"]["ownerReferences"] = copy.deepcopy(meta["ownerReferences"])
        self._version(pod)
        return copy.deepcopy(pod)

    def delete_pod(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        force: bool = False,
    ) -> bool:
        if force:
            self.forced.append(name)
        pod = self.pods.get(name)
        if pod is None or (uid and pod["metadata"]["uid"] != uid):
            return False
        if resource_version and pod["metadata"]["resourceVersion"] != resource_version:
            return False
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # graceful: still there
        self._version(pod)
        return True

    def patch_pool_status(self, namespace: str, name: str, status: Obj) -> Obj:
        self.pool_status[name] = {**self.pool_status.get(name, {}), **copy.deepcopy(status)}
        return {"status": self.pool_status[name]}

    def finish_deletions(self) -> None:
        self.pods = {k: v for k, v in self.pods.items() if "deletionTimestamp" not in v["metadata"]}

    def read_sandbox(self, namespace: str, name: str) -> Obj | None:
        self.reads += 1
        obj = self.sandboxes.get(name)
        return copy.deepcopy(obj) if obj else None

    def patch_sandbox(self, namespace: str, name: str, patch: Obj) -> Obj:
        """A merge patch of spec.workspace, refused as the CRD's rule refuses it once the id is set."""
        obj = self.sandboxes.get(name)
        if obj is None:
            raise api_error(404, "not found")
        workspace = obj["spec"].setdefault("workspace", {})
        wanted = patch["spec"]["workspace"]
        if workspace.get("id") and wanted.get("id") != workspace["id"]:
            raise api_error(422, "spec.workspace.id cannot change once bound")
        self.spec_patches += 1
        workspace.update(copy.deepcopy(wanted))
        obj["metadata"]["generation"] += 1
        return copy.deepcopy(obj)

    def json_patch_sandbox(self, namespace: str, name: str, ops: list[Obj]) -> Obj:
        """The operations on metadata the controller makes (test, add, remove), all or none;
        a Sandbox being deleted goes once its last finalizer does."""
        obj = self.sandboxes.get(name)
        if obj is None:
            raise api_error(404, "not found")
        patched = copy.deepcopy(obj)
        for op in ops:
            *parents, last = op["path"].strip("/").split("/")
            target = patched
            for part in parents:
                target = target.setdefault(part, {})
            if isinstance(target, list):
                at = len(target) if last == "-" else int(last)
                held = target[at] if at < len(target) else None
            else:
                held = target.get(last)
            if op["op"] == "test" and held != op["value"]:
                raise api_error(422, f"the test of {op['path']} failed")
            if op["op"] == "add" and isinstance(target, list):
                target.insert(at, op["value"])
            elif op["op"] == "add":
                target[last] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del target[at if isinstance(target, list) else last]
        self.json_patches += 1
        obj.clear()
        obj.update(patched)
        self._version(obj)
        if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            del self.sandboxes[name]
        return copy.deepcopy(obj)

    def patch_sandbox_status(self, namespace: str, name: str, status: Obj) -> Obj:
        if name not in self.sandboxes:
            raise api_error(404, "not found")
        self.status_patches += 1
        self.sandboxes[name].setdefault("status", {}).update(copy.deepcopy(status))
        return copy.deepcopy(self.sandboxes[name])

    def status(self, name: str) -> Obj:
        status: Obj = self.sandboxes[name]["status"]
        return status


def run(pod: Obj, *, ready: bool = True) -> None:
    pod["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "sandbox", "state": {"running": {}}}],
    }


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


# What a pass writes, without the quiet of a new Sandbox's start (tested on its own below).
LOUD = ControllerOptions(quiet_start_seconds=0)


@pytest.fixture
def reconciler(kube: FakeKube) -> Reconciler:
    return Reconciler(kube, LOUD)


def ready(status: Obj) -> Obj:
    (condition,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    return condition


def test_first_pass_creates_the_pod_and_reports_pending(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    seen = reconciler.reconcile(NS, "a")
    assert seen is not None and seen.phase == "Pending"
    assert list(kube.pods) == [pod_name(sbx["metadata"]["uid"])]
    status = kube.status("a")
    assert status["phase"] == "Pending"
    assert status["observedGeneration"] == 1
    assert ready(status)["status"] == "False"


def test_running_pod_makes_the_sandbox_running(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    run(kube.pods[pod_name(sbx["metadata"]["uid"])])
    reconciler.reconcile(NS, "a")
    status = kube.status("a")
    assert status["phase"] == "Running"
    assert ready(status)["status"] == "True"
    assert ready(status)["reason"] == "PodReady"


def test_repeated_passes_make_no_second_pod_and_no_needless_writes(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    kube.add_sandbox("a")
    for _ in range(5):
        reconciler.reconcile(NS, "a")
    assert kube.creates == 1
    assert len(kube.pods) == 1
    assert kube.status_patches == 1


def test_restart_after_crash_between_create_and_status_adopts_the_pod(kube: FakeKube) -> None:
    sbx = kube.add_sandbox("a")
    kube.create_pod(NS, pod_for(sbx))  # the crashed controller got this far
    assert "status" not in kube.sandboxes["a"]
    Reconciler(kube, LOUD).reconcile(NS, "a")  # a fresh process
    assert kube.creates == 1
    assert kube.status("a")["phase"] == "Pending"


def test_create_that_meets_already_exists_adopts_our_pod(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    kube.create_pod(NS, pod_for(sbx))
    kube.hide_next_read = True  # another pass created it between our read and our create
    seen = reconciler.reconcile(NS, "a")
    assert seen is not None and seen.phase == "Pending" and seen.reason != "PodNameTaken"
    assert kube.creates == 1


def test_a_foreign_pod_under_our_name_is_reported_and_left_alone(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    sbx = kube.add_sandbox("a")
    foreign = pod_for(sbx)
    foreign["metadata"]["ownerReferences"] = []
    kube.create_pod(NS, foreign)
    seen = reconciler.reconcile(NS, "a")
    assert seen is not None and (seen.phase, seen.reason) == ("Failed", "PodNameTaken")
    assert "delete it" in kube.status("a")["conditions"][0]["message"]
    assert "deletionTimestamp" not in next(iter(kube.pods.values()))["metadata"]


def test_refused_pod_fails_the_sandbox_with_the_servers_message(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    kube.add_sandbox("a")
    kube.refuse = api_error(403, "[warren:runtime-class] sandbox pods must run under gVisor")
    reconciler.reconcile(NS, "a")
    status = kube.status("a")
    assert status["phase"] == "Failed"
    assert ready(status)["reason"] == "PodRefused"
    assert "[warren:runtime-class]" in ready(status)["message"]


def test_server_errors_propagate_for_the_pass_to_be_tried_again(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    kube.add_sandbox("a")
    kube.refuse = api_error(500, "etcd is down")
    with pytest.raises(ApiException):
        reconciler.reconcile(NS, "a")


def test_invalid_spec_fails_the_sandbox(kube: FakeKube, reconciler: Reconciler) -> None:
    kube.add_sandbox("a", command="not a list")
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["phase"] == "Failed"
    assert ready(kube.status("a"))["reason"] == "InvalidSpec"
    assert not kube.pods


def test_stop_removes_the_pod_and_keeps_the_sandbox(kube: FakeKube, reconciler: Reconciler) -> None:
    kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    kube.update_spec("a", stopped=True)
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["phase"] == "Terminating"
    assert ready(kube.status("a"))["reason"] == "Stopping"
    kube.finish_deletions()
    reconciler.reconcile(NS, "a")
    assert not kube.pods
    assert kube.status("a")["phase"] == "Stopped"
    assert kube.status("a")["observedGeneration"] == 2
    kube.update_spec("a", stopped=False)
    reconciler.reconcile(NS, "a")
    assert len(kube.pods) == 1
    assert kube.status("a")["phase"] == "Pending"


def test_spec_change_replaces_the_pod(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    name = pod_name(sbx["metadata"]["uid"])
    reconciler.reconcile(NS, "a")
    kube.update_spec("a", image="other")
    seen = reconciler.reconcile(NS, "a")
    assert seen is not None and seen.reason == "PodReplacing"
    kube.finish_deletions()
    reconciler.reconcile(NS, "a")
    assert kube.pods[name]["spec"]["containers"][0]["image"] == "other"
    assert kube.creates == 2


def test_stop_toggle_does_not_count_as_a_spec_change(kube: FakeKube, reconciler: Reconciler) -> None:
    kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    kube.update_spec("a", persistent=True)
    reconciler.reconcile(NS, "a")
    assert "deletionTimestamp" not in next(iter(kube.pods.values()))["metadata"]


def test_finalizer_waits_for_the_pod_to_go(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    uid = sbx["metadata"]["uid"]
    reconciler.reconcile(NS, "a")
    kube.sandboxes["a"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert reconciler.finalize(NS, "a", uid) is False
    assert kube.status("a")["phase"] == "Terminating"
    assert reconciler.finalize(NS, "a", uid) is False  # still stopping: no second delete needed
    kube.finish_deletions()
    assert reconciler.finalize(NS, "a", uid) is True


def test_reconcile_leaves_a_deleting_sandbox_to_the_finalizer(kube: FakeKube, reconciler: Reconciler) -> None:
    kube.add_sandbox("a")
    kube.sandboxes["a"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert reconciler.reconcile(NS, "a") is None
    assert not kube.pods


def test_pod_event_for_an_orphan_deletes_it(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    del kube.sandboxes["a"]
    pod = next(iter(kube.pods.values()))
    reconciler.pod_changed("MODIFIED", pod)
    assert "deletionTimestamp" in kube.pods[pod_name(sbx["metadata"]["uid"])]["metadata"]


def test_pod_event_for_a_recreated_sandbox_of_the_same_name_deletes_the_old_pod(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    old = copy.deepcopy(next(iter(kube.pods.values())))
    kube.add_sandbox("a")  # same name, new uid
    reconciler.pod_changed("MODIFIED", old)
    assert "deletionTimestamp" in kube.pods[old["metadata"]["name"]]["metadata"]


def test_a_second_pass_before_the_watch_shows_the_pod_makes_none(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    """Under load the pod's ADDED event can come after another trigger for its Sandbox: that
    pass must not try to make the pod again (a refused POST, a GET, a second status)."""
    kube.add_sandbox("a")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    statuses = kube.status_patches
    reconciler.reconcile(NS, "a")  # the pod watch has shown nothing yet
    assert (kube.creates, kube.reads, kube.status_patches) == (1, 0, statuses)
    # Once the watch has shown the pod, and then its deletion, it is made again.
    (pod,) = kube.pods.values()
    reconciler.watched_pod("ADDED", copy.deepcopy(pod))
    del kube.pods[pod["metadata"]["name"]]
    reconciler.watched_pod("DELETED", pod)
    reconciler.reconcile(NS, "a")
    assert kube.creates == 2


def test_pod_deleted_behind_our_back_is_made_again(kube: FakeKube, reconciler: Reconciler) -> None:
    kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    remember_all(reconciler, kube)
    gone = kube.pods.popitem()[1]
    reconciler.watched_pod("DELETED", gone)
    reconciler.pod_changed("DELETED", gone)
    assert len(kube.pods) == 1
    assert kube.creates == 2


def test_a_gone_pod_whose_sandbox_memory_lacks_costs_no_read(kube: FakeKube, reconciler: Reconciler) -> None:
    # Under load a pod's DELETED event is often handled after its Sandbox's: the Sandbox is
    # gone, or (if its event is late) its own pass makes the pod again when it comes.
    kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    pod = copy.deepcopy(next(iter(kube.pods.values())))
    reads = kube.reads
    reconciler.pod_changed("DELETED", pod)
    reconciler.pod_changed("MODIFIED", {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "x"}})
    assert kube.reads == reads
    assert kube.creates == 1


def test_pod_event_updates_status(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    pod = kube.pods[pod_name(sbx["metadata"]["uid"])]
    run(pod)
    reconciler.pod_changed("MODIFIED", pod)
    assert kube.status("a")["phase"] == "Running"


def test_a_late_pod_event_does_not_set_the_status_back(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    pod = kube.pods[pod_name(sbx["metadata"]["uid"])]
    pending = copy.deepcopy(pod)
    run(pod)
    reconciler.reconcile(NS, "a")  # the resync, say, sees it running first
    writes = kube.status_patches
    reconciler.pod_changed("MODIFIED", pending)  # then the pod's older event arrives
    assert kube.status("a")["phase"] == "Running"
    assert kube.status_patches == writes


def test_pod_events_for_pods_without_a_sandbox_owner_are_ignored(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    reconciler.pod_changed("ADDED", {"metadata": {"name": "x", "namespace": NS, "uid": "u"}})
    assert not kube.pods


SBX = {"metadata": {"name": "a", "namespace": NS, "uid": "u1", "generation": 3}, "spec": {"image": "i"}}


def pod_with(status: Obj) -> Obj:
    return {"metadata": {"name": "sbx-u1", "uid": "p"}, "status": status}


@pytest.mark.parametrize(
    ("status", "phase", "reason"),
    [
        ({"phase": "Pending"}, "Pending", "PodPending"),
        (
            {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "cpu"}
                ],
            },
            "Pending",
            "Unschedulable",
        ),
        (
            {
                "phase": "Pending",
                "containerStatuses": [
                    {"state": {"waiting": {"reason": "ErrImageNeverPull", "message": "m"}}}
                ],
            },
            "Pending",
            "ErrImageNeverPull",
        ),
        (  # the agent's init container completed: the sandbox's own container says why
            {
                "phase": "Pending",
                "initContainerStatuses": [{"state": {"terminated": {"reason": "Completed", "exitCode": 0}}}],
                "containerStatuses": [
                    {"state": {"waiting": {"reason": "ErrImageNeverPull", "message": "m"}}}
                ],
            },
            "Pending",
            "ErrImageNeverPull",
        ),
        (
            {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
            },
            "Pending",
            "CrashLoopBackOff",
        ),
        ({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}, "Running", "PodReady"),
        ({"phase": "Failed", "reason": "Evicted", "message": "memory"}, "Failed", "Evicted"),
        ({"phase": "Succeeded"}, "Failed", "PodExited"),
    ],
)
def test_observe_maps_pod_states(status: Obj, phase: str, reason: str) -> None:
    seen = observe(SBX, pod_with(status))
    assert (seen.phase, seen.reason) == (phase, reason)
    assert seen.ready == (phase == "Running")
    assert seen.message


def test_status_keeps_transition_time_while_the_condition_holds() -> None:
    first = status_for(SBX, Observation("Pending", False, "PodPending", "m"), now="2026-01-01T00:00:00Z")
    later = {**SBX, "status": first}
    same = status_for(
        later, Observation("Pending", False, "ContainerCreating", "m"), now="2026-01-01T00:01:00Z"
    )
    assert ready(same)["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    flipped = status_for(later, Observation("Running", True, "PodReady", "m"), now="2026-01-01T00:02:00Z")
    assert ready(flipped)["lastTransitionTime"] == "2026-01-01T00:02:00Z"
    assert flipped["observedGeneration"] == ready(flipped)["observedGeneration"] == 3


def test_status_carries_over_conditions_of_other_types() -> None:
    other = {
        "type": "WorkspaceReady",
        "status": "True",
        "reason": "r",
        "message": "m",
        "lastTransitionTime": "t",
    }
    with_other = {**SBX, "status": {"conditions": [other]}}
    status = status_for(with_other, Observation("Running", True, "PodReady", "m"))
    assert status["conditions"][0] == other
    assert [c["type"] for c in status["conditions"]] == ["WorkspaceReady", "Ready"]


# ---- the watches: what each change becomes


def with_finalizer(sandbox: Obj) -> Obj:
    sandbox["metadata"]["finalizers"] = [FINALIZER]  # as the API makes Sandboxes
    return sandbox


def deleting(kube: FakeKube, name: str) -> Obj:
    kube.sandboxes[name]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return copy.deepcopy(kube.sandboxes[name])


def test_the_watches_cover_sandboxes_pools_nodes_and_only_the_pods_made_here(kube: FakeKube) -> None:
    sandboxes, pods, pools, nodes = Watches(Reconciler(kube), [NS]).informers
    assert sandboxes.path == f"/apis/warren.dev/v1alpha1/namespaces/{NS}/sandboxes"
    assert pods.query == {"labelSelector": "app.kubernetes.io/managed-by=warren-control"}
    assert pools.path == f"/apis/warren.dev/v1alpha1/namespaces/{NS}/sandboxpools"
    assert nodes.path == "/api/v1/nodes"


def test_a_node_that_stops_being_ready_brings_a_pass_of_each_sandbox_with_a_pod_there(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    watches = Watches(reconciler, [NS])
    queued: list[str] = []
    watches._queue = lambda _event, pod: queued.append(pod["metadata"]["name"])  # type: ignore[method-assign]
    for name in ("a", "b"):
        kube.add_sandbox(name)
    remember_all(reconciler, kube)
    for name in ("a", "b"):
        reconciler.reconcile(NS, name)
    on_a, on_b = sorted(kube.pods.values(), key=lambda p: p["metadata"]["name"])
    on_a["spec"]["nodeName"], on_b["spec"]["nodeName"] = "node-a", "node-b"
    remember_all(reconciler, kube)
    watches._replace_nodes("", [node("node-a", True, 600), node("node-b", True, 600)])
    assert queued == []
    watches._node_event("MODIFIED", node("node-a", True, 600))  # a heartbeat: nothing changed
    assert queued == []
    watches._node_event("MODIFIED", node("node-a", False, 0))
    assert queued == [on_a["metadata"]["name"]]


def test_a_sandbox_event_is_a_pass_with_no_write_for_the_finalizer(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    sbx = with_finalizer(kube.add_sandbox("a"))
    watches = Watches(reconciler, [NS])
    watches._sandbox_event("ADDED", copy.deepcopy(sbx))
    wait_for(lambda: kube.creates == 1, 10, "the Sandbox's pod made")
    watches.sandbox_queue.shutdown()
    assert kube.json_patches == 0
    assert reconciler.sandboxes.get(NS, "a") is not None


def test_a_sandbox_made_without_the_finalizer_gets_it_before_its_pod(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    reconciler.sandbox_event("ADDED", copy.deepcopy(kube.add_sandbox("a")))  # as kubectl makes it
    # Someone else's finalizer arrives before the pass: it must not be overwritten.
    kube.sandboxes["a"]["metadata"]["finalizers"] = ["team.example/keep"]
    kube._version(kube.sandboxes["a"])
    watches = Watches(reconciler, [NS])
    watches.sandbox_pass(NS, "a")
    assert kube.sandboxes["a"]["metadata"]["finalizers"] == ["team.example/keep"]
    assert kube.creates == 0  # no pod while the Sandbox could go without the controller
    reconciler.sandbox_event("MODIFIED", copy.deepcopy(kube.sandboxes["a"]))  # its event
    watches.sandbox_pass(NS, "a")
    assert kube.sandboxes["a"]["metadata"]["finalizers"] == ["team.example/keep", FINALIZER]
    assert kube.creates == 1


def test_a_pass_that_failed_is_tried_again(kube: FakeKube, caplog: pytest.LogCaptureFixture) -> None:
    reconciler = Reconciler(kube, ControllerOptions(quiet_start_seconds=0, retry_seconds=0.05))
    reconciler.sandbox_event("ADDED", copy.deepcopy(with_finalizer(kube.add_sandbox("a"))))
    watches = Watches(reconciler, [NS])
    stop = threading.Event()
    threading.Thread(target=watches.later.run, args=(stop,), daemon=True).start()
    kube.refuse = api_error(500, "etcd is down")
    watches.sandbox_pass(NS, "a")
    assert "etcd is down" in caplog.text
    kube.refuse = None
    wait_for(lambda: kube.creates == 1, 10, "the pod made by the pass tried again")
    stop.set()
    watches.sandbox_queue.shutdown()


def test_the_finalizer_ends_on_the_pods_deleted_event_not_its_next_poll(kube: FakeKube) -> None:
    # A poll far later than the test may take, and no thread to run it: only the event can
    # end the wait.
    options = ControllerOptions(quiet_start_seconds=0, finalize_poll_seconds=60, finalize_poll_max_seconds=60)
    reconciler = Reconciler(kube, options)
    uid = with_finalizer(kube.add_sandbox("a"))["metadata"]["uid"]
    reconciler.reconcile(NS, "a")
    remember_all(reconciler, kube)
    watches = Watches(reconciler, [NS])
    watches._sandbox_event("MODIFIED", deleting(kube, "a"))
    wait_for(lambda: "deletionTimestamp" in kube.pods[pod_name(uid)]["metadata"], 10, "the pod deleted")
    assert kube.status("a")["phase"] == "Terminating"
    pod = copy.deepcopy(kube.pods[pod_name(uid)])
    kube.finish_deletions()
    watches._event("DELETED", pod)
    wait_for(lambda: "a" not in kube.sandboxes, 10, "the finalizer removed and the Sandbox gone")
    for queue in (watches.sandbox_queue, watches.queue):
        queue.shutdown()
    assert kube.creates == 1  # the DELETED event did not make the pod again


def test_a_pod_that_outlasts_the_finalizers_patience_is_reported(
    kube: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    reconciler = Reconciler(kube, ControllerOptions(quiet_start_seconds=0, finalize_patience_seconds=0))
    with_finalizer(kube.add_sandbox("a"))
    reconciler.reconcile(NS, "a")
    remember_all(reconciler, kube)
    reconciler.sandbox_event("MODIFIED", deleting(kube, "a"))
    watches = Watches(reconciler, [NS])
    watches.sandbox_pass(NS, "a")
    assert kube.status("a")["phase"] == "Terminating"
    assert "has not stopped" not in caplog.text
    watches.sandbox_pass(NS, "a")  # the pod is still there, past the patience
    assert "has not stopped" in caplog.text
    assert "a" in kube.sandboxes  # kept while its pod is there


def test_the_resync_passes_every_sandbox_each_interval_not_at_once(kube: FakeKube) -> None:
    reconciler = Reconciler(kube, ControllerOptions(resync_seconds=0.3))
    for name in "abc":
        kube.add_sandbox(name)
    remember_all(reconciler, kube)
    watches = Watches(reconciler, [NS])
    queued: list[str] = []
    watches.queue_sandbox = lambda _namespace, name: queued.append(name)  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=watches._resync, args=(stop,), daemon=True)
    thread.start()
    assert queued == []  # a start has just passed every Sandbox (the list)
    wait_for(lambda: len(queued) >= 3, 10, "a resync")
    stop.set()
    thread.join(5)
    assert sorted(queued[:3]) == ["a", "b", "c"]


def test_pod_events_of_a_sandbox_being_finalized_only_wake_its_finalizer(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    sbx = kube.add_sandbox("a")
    uid = sbx["metadata"]["uid"]
    reconciler.reconcile(NS, "a")
    kube.sandboxes["a"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    woken: list[str] = []
    reconciler.await_pod_gone(uid, lambda: woken.append(uid))
    assert reconciler.finalize(NS, "a", uid) is False
    pod = kube.pods[pod_name(uid)]
    reconciler.pod_changed("MODIFIED", pod)
    assert woken == []
    kube.finish_deletions()
    reconciler.pod_changed("DELETED", pod)
    assert woken == [uid]
    assert kube.creates == 1  # the DELETED event did not make the pod again


# ---- passes from the watches' memory


def remember_all(reconciler: Reconciler, kube: FakeKube) -> None:
    """Feed the stores what the watches would have delivered by now."""
    reconciler.watched_pods(NS, copy.deepcopy(list(kube.pods.values())))
    for sandbox in kube.sandboxes.values():
        reconciler.sandbox_event("MODIFIED", copy.deepcopy(sandbox))


def test_a_sandbox_reaches_running_without_reading_the_server(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    pod = kube.pods[pod_name(sbx["metadata"]["uid"])]
    run(pod)
    reconciler.watched_pod("MODIFIED", copy.deepcopy(pod))
    reconciler.pod_changed("MODIFIED", pod)
    assert kube.status("a")["phase"] == "Running"
    assert (kube.reads, kube.creates, kube.status_patches) == (0, 1, 2)


def test_the_status_written_last_is_not_written_again_before_the_watch_brings_it(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    kube.add_sandbox("a")
    remember_all(reconciler, kube)
    for _ in range(3):  # the remembered Sandbox still has no status: the watch is behind
        reconciler.reconcile(NS, "a")
    assert kube.status_patches == 1
    assert "status" not in reconciler.sandboxes.get(NS, "a")  # type: ignore[operator]


def test_a_pod_gone_from_a_relist_is_made_again_and_wakes_no_one(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    kube.add_sandbox("a")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    remember_all(reconciler, kube)
    events = Watches(reconciler, [NS])
    kube.pods.clear()  # deleted while no watch ran: only the relist shows it
    events._replace(NS, [])
    wait_for(lambda: kube.creates == 2, 10, "the pod made again")
    events.queue.shutdown()
    assert len(kube.pods) == 1


def test_a_relist_without_the_pod_wakes_its_finalizer(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    uid = sbx["metadata"]["uid"]
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    remember_all(reconciler, kube)
    woken: list[str] = []
    events = Watches(reconciler, [NS])
    reconciler.await_pod_gone(uid, lambda: woken.append(uid))
    events._replace(NS, [])
    assert set(woken) == {uid}  # at once; the queued pass may wake it again
    assert reconciler.finalize(NS, "a", uid, report=False) is True
    events.queue.shutdown()


def test_a_pod_whose_owner_memory_lacks_is_deleted_only_on_the_servers_word(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    kube.add_sandbox("a")
    reconciler.reconcile(NS, "a")
    pod = copy.deepcopy(next(iter(kube.pods.values())))
    remember_all(reconciler, kube)
    reconciler.sandboxes.apply("DELETED", reconciler.sandboxes.get(NS, "a"))  # type: ignore[arg-type]
    reconciler.pod_changed("MODIFIED", pod)  # the Sandbox's event is late, not gone
    assert "deletionTimestamp" not in kube.pods[pod["metadata"]["name"]]["metadata"]
    del kube.sandboxes["a"]
    reconciler.pod_changed("MODIFIED", pod)  # now the server says it is gone
    assert "deletionTimestamp" in kube.pods[pod["metadata"]["name"]]["metadata"]


def test_a_deleted_sandbox_forgets_the_status_written_for_it(kube: FakeKube, reconciler: Reconciler) -> None:
    sbx = kube.add_sandbox("a")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert reconciler._written
    reconciler.sandbox_event("DELETED", copy.deepcopy(sbx))
    assert not reconciler._written
    assert reconciler.sandboxes.get(NS, "a") is None


# ---- a new Sandbox's quiet start


def starting(kube: FakeKube, quiet: float) -> tuple[Reconciler, Obj]:
    """A Sandbox whose pod was just made by a controller with this quiet, the watches caught
    up (the pod's ADDED event handled); the pod as the server has it."""
    reconciler = Reconciler(kube, ControllerOptions(quiet_start_seconds=quiet))
    kube.add_sandbox("a")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    remember_all(reconciler, kube)
    pod = next(iter(kube.pods.values()))
    reconciler.pod_changed("ADDED", copy.deepcopy(pod))
    return reconciler, pod


def test_a_pod_that_runs_within_the_quiet_costs_its_sandbox_one_status_write(kube: FakeKube) -> None:
    reconciler, pod = starting(kube, quiet=60)
    assert kube.status_patches == 0  # nothing to say yet but "starting"
    run(pod)
    reconciler.watched_pod("MODIFIED", copy.deepcopy(pod))
    reconciler.pod_changed("MODIFIED", pod)
    assert kube.status("a")["phase"] == "Running"
    assert kube.status_patches == 1


def test_a_start_that_goes_wrong_is_reported_at_once(kube: FakeKube) -> None:
    reconciler, pod = starting(kube, quiet=60)
    pod["status"] = {
        "phase": "Pending",
        "containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}}],
    }
    reconciler.watched_pod("MODIFIED", copy.deepcopy(pod))
    reconciler.pod_changed("MODIFIED", pod)
    assert ready(kube.status("a"))["reason"] == "ErrImagePull"


def test_a_start_still_under_way_when_the_quiet_ends_is_reported(kube: FakeKube) -> None:
    reconciler = Reconciler(kube, ControllerOptions(quiet_start_seconds=0.3))
    events = Watches(reconciler, [NS])  # its delayed pass, asked for when the pod is made
    stop = threading.Event()
    threading.Thread(target=events.later.run, args=(stop,), daemon=True).start()
    try:
        kube.add_sandbox("a")
        remember_all(reconciler, kube)
        reconciler.reconcile(NS, "a")
        remember_all(reconciler, kube)
        reconciler.pod_changed("ADDED", copy.deepcopy(next(iter(kube.pods.values()))))
        assert kube.status_patches == 0
        wait_for(lambda: kube.status_patches == 1, 10, "the pass when the quiet ends")
    finally:
        stop.set()
        events.queue.shutdown()
    assert (kube.status("a")["phase"], ready(kube.status("a"))["reason"]) == ("Pending", "PodPending")


def test_a_sandbox_that_had_a_status_is_not_quiet_when_its_pod_is_made_again(kube: FakeKube) -> None:
    reconciler = Reconciler(kube, ControllerOptions(quiet_start_seconds=60))
    kube.add_sandbox("a", stopped=True)
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["phase"] == "Stopped"
    kube.update_spec("a", stopped=False)
    reconciler.reconcile(NS, "a")
    assert kube.status("a")["phase"] == "Pending"  # not left saying Stopped while it starts


# --- nodes lost ------------------------------------------------------------------------------


def node(name: str, ready: bool, since_seconds: float) -> Obj:
    """A Node whose Ready condition took its value `since_seconds` ago."""
    stamp = (datetime.now(UTC) - timedelta(seconds=since_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Ready", "status": "True" if ready else "Unknown", "lastTransitionTime": stamp}
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "status": {"conditions": [condition]}}


def test_a_sandbox_whose_node_is_lost_gets_a_new_pod_once_the_node_was_not_ready_long_enough(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    later: list[tuple[str, float]] = []
    reconciler.request_pass_later = lambda pod, delay: later.append((pod["metadata"]["name"], delay))
    sbx = kube.add_sandbox("a")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    first = kube.pods[pod_name(sbx["metadata"]["uid"])]
    first["spec"]["nodeName"] = "node-a"
    run(first)
    remember_all(reconciler, kube)

    # The nodes' watch has listed nothing yet: a node it does not know is not lost.
    assert reconciler.reconcile(NS, "a").phase == "Running" and kube.forced == []
    reconciler.nodes.replace("", [node("node-a", True, 600), node("node-b", True, 600)])
    assert reconciler.reconcile(NS, "a").phase == "Running" and kube.forced == []
    # Not Ready, but not for long: a pass is asked for when the grace ends.
    reconciler.nodes.replace("", [node("node-a", False, 20), node("node-b", True, 600)])
    later.clear()
    assert reconciler.reconcile(NS, "a").phase == "Running" and kube.forced == []
    assert [(name, round(delay)) for name, delay in later] in (
        [(first["metadata"]["name"], 41)],
        [(first["metadata"]["name"], 40)],
    ), later

    reconciler.nodes.replace("", [node("node-a", False, 61), node("node-b", True, 600)])
    reconciler.reconcile(NS, "a")
    assert kube.forced == [first["metadata"]["name"]]  # at once: that kubelet will not confirm
    kube.finish_deletions()
    remember_all(reconciler, kube)
    creates = kube.creates
    reconciler.reconcile(NS, "a")
    assert kube.creates == creates + 1
    second = kube.pods[pod_name(sbx["metadata"]["uid"])]
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert "affinity" not in second["spec"]  # wherever the scheduler finds room: never node-a, NotReady
    (moved,) = [c for c in kube.status("a")["conditions"] if c["type"] == "NodeLost"]
    assert moved["reason"] == "Rescheduled" and "node-a" not in json.dumps(kube.status("a")), moved
    assert "restored there with every write object storage had proven" in moved["message"]


def test_a_forks_child_is_not_sent_to_its_sources_node_once_that_node_is_not_ready(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    reconciler = Reconciler(kube, dataclasses.replace(LOUD, workspace=blockd_volume))
    kube.add_sandbox("parent", workspace={"id": "ws-parent", "size": "1Gi"})
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "parent")
    (parent,) = kube.pods.values()
    parent["spec"]["nodeName"] = "node-a"
    remember_all(reconciler, kube)
    reconciler.nodes.replace("", [node("node-a", True, 600)])
    assert (
        reconciler._parent_node(kube.add_sandbox("child", workspace={"id": "ws-c", "forkOf": "ws-parent"}))
        == "node-a"
    )
    reconciler.nodes.replace("", [node("node-a", False, 5)])
    assert reconciler._parent_node(kube.sandboxes["child"]) is None
