"""Warm pools against the in-memory API server of test_controller.py: a SandboxPool keeps its
size of ready pods; a Sandbox that names it claims one (exclusively: the server applies a
claim only to the version chosen), or starts cold and says why. The scale tier
(test_pools_kwok.py) runs the same against a real API server under concurrent creates."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from typing import Any

import pytest
from test_controller import LOUD, NS, FakeKube, api_error, remember_all, run
from warren_control import agentclient
from warren_control.binder import BindError
from warren_control.controller import (
    REFILL_AT_THE_LATEST_S,
    ControllerOptions,
    Observation,
    Reconciler,
    observe,
    status_for,
)
from warren_control.kube import Obj
from warren_control.observation import with_pod
from warren_control.podspec import (
    BIND_AT_CLAIM_ANNOTATION,
    BIND_IN_PLACE_ANNOTATION,
    CLAIMED_FROM_ANNOTATION,
    FORK_SIBLINGS_ANNOTATION,
    HOLD_CONTAINER,
    POOL_LABEL,
    POOL_SKIPPED_ANNOTATION,
    SANDBOX_UID_LABEL,
    SPEC_HASH_ANNOTATION,
    WORKSPACE_LABEL,
    PodOptions,
    blockd_volume,
    claim_patch,
    controller_uid,
    pod_name,
    pod_workspace_id,
    pool_of,
    spec_hash,
    with_workspace_id,
)


def fresh(options: ControllerOptions | None = None) -> tuple[FakeKube, Reconciler]:
    """An in-memory API server and a controller on it."""
    kube = FakeKube()
    return kube, Reconciler(kube, options or LOUD)


def started(status: Obj) -> tuple[str, str, str]:
    """How the Sandbox's pod started, from its PoolClaimed condition: (pool or cold, reason,
    message)."""
    (condition,) = [c for c in status["conditions"] if c["type"] == "PoolClaimed"]
    return ("pool" if condition["status"] == "True" else "cold"), condition["reason"], condition["message"]


def add_pool(kube: FakeKube, reconciler: Reconciler, name: str = "base", **spec: Any) -> Obj:
    pool = {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": name, "namespace": NS, "uid": kube._uid(), "generation": 1},
        "spec": {"image": "busybox", "size": 3, "refillPerSecond": 100, **spec},
    }
    reconciler.pool_event("ADDED", pool)
    return pool


def fill(kube: FakeKube, reconciler: Reconciler, name: str = "base") -> list[Obj]:
    """A pool pass, its pods started and seen by the watch: the pool's pods."""
    reconciler.reconcile_pool(NS, name)
    for pod in kube.pods.values():
        if pool_of(pod) and "deletionTimestamp" not in pod["metadata"]:
            run(pod)
    remember_all(reconciler, kube)
    return [p for p in kube.pods.values() if (p["metadata"].get("labels") or {}).get(POOL_LABEL) == name]


def test_a_pool_keeps_its_size_of_ready_pods() -> None:
    kube, reconciler = fresh()
    pool = add_pool(kube, reconciler)
    pods = fill(kube, reconciler)
    assert len(pods) == 3
    for pod in pods:
        assert pool_of(pod) == ("base", pool["metadata"]["uid"])
        assert controller_uid(pod) is None
        assert pod["spec"]["runtimeClassName"] == "gvisor"
        assert pod["spec"]["containers"][0]["image"] == "busybox"
    reconciler.reconcile_pool(NS, "base")  # nothing missing: nothing made
    assert kube.creates == 3
    assert kube.pool_status["base"] == {"size": 3, "ready": 3, "starting": 0, "observedGeneration": 1}


def test_pods_made_but_not_yet_watched_count_as_the_pools() -> None:
    kube, reconciler = fresh()
    add_pool(kube, reconciler)
    reconciler.reconcile_pool(NS, "base")
    reconciler.reconcile_pool(NS, "base")  # the watch has shown none of the three yet
    assert kube.creates == 3


def test_a_pool_refills_no_faster_than_its_rate() -> None:
    kube, reconciler = fresh()
    add_pool(kube, reconciler, size=10, refillPerSecond=2)
    reconciler.reconcile_pool(NS, "base")
    assert kube.creates == 2  # a burst of one second's worth; a timer asks for the rest


def test_a_sandbox_naming_the_pool_claims_a_ready_pod() -> None:
    kube, reconciler = fresh()
    add_pool(kube, reconciler)
    fill(kube, reconciler)
    sbx = kube.add_sandbox("a", pool="base")
    remember_all(reconciler, kube)
    creates, writes = kube.creates, kube.status_patches
    seen = reconciler.reconcile(NS, "a")
    assert seen is not None and seen.phase == "Running"
    uid = sbx["metadata"]["uid"]
    (pod,) = [p for p in kube.pods.values() if controller_uid(p) == uid]
    assert pod["metadata"]["labels"][SANDBOX_UID_LABEL] == uid
    assert POOL_LABEL not in pod["metadata"]["labels"]
    assert pod["metadata"]["annotations"][CLAIMED_FROM_ANNOTATION] == "base"
    assert pool_of(pod) is None
    status = kube.status("a")
    assert status["podName"] == pod["metadata"]["name"]
    assert started(status)[:2] == ("pool", "Claimed") and "pool base" in started(status)[2]
    # No pod made for it; one claim and one status write.
    assert kube.creates == creates
    assert kube.pod_patches == 1 and kube.status_patches == writes + 1
    # The pool makes another; a second pass of the Sandbox keeps its claimed pod.
    fill(kube, reconciler)
    reconciler.reconcile(NS, "a")
    assert [p["metadata"]["name"] for p in kube.pods.values() if controller_uid(p) == uid] == [
        pod["metadata"]["name"]
    ]
    assert len([p for p in kube.pods.values() if pool_of(p)]) == 3


def test_a_pod_claimed_meanwhile_is_passed_over() -> None:
    kube, reconciler = fresh()
    add_pool(kube, reconciler, size=2)
    first, second = sorted(fill(kube, reconciler), key=lambda pod: pod["metadata"]["name"])
    # Another controller claimed the first pod after our watch showed it: its version moved.
    kube.patch_pod(NS, first["metadata"]["name"], {"metadata": {"labels": {"elsewhere": "yes"}}})
    sbx = kube.add_sandbox("a", pool="base")
    remember_all(reconciler, kube)
    stale = copy.deepcopy(first)
    stale["metadata"]["resourceVersion"] = "0"
    reconciler.watched_pod("MODIFIED", stale)
    reconciler.reconcile(NS, "a")
    uid = sbx["metadata"]["uid"]
    claimed = [p["metadata"]["name"] for p in kube.pods.values() if controller_uid(p) == uid]
    assert claimed == [second["metadata"]["name"]]
    assert started(kube.status("a"))[0] == "pool"
    # The pod passed over is still the pool's, and may be claimed once the watch catches up.
    assert pool_of(kube.pods[first["metadata"]["name"]]) is not None
    assert (NS, first["metadata"]["name"]) not in reconciler._taken


def test_a_pod_that_only_looks_like_the_pools_is_deleted_never_claimed() -> None:
    kube, reconciler = fresh()
    pool = add_pool(kube, reconciler, size=1)
    fill(kube, reconciler)
    # Made by someone else who may create pods here, with the pool's labels and owner.
    forged = copy.deepcopy(next(iter(kube.pods.values())))
    forged["metadata"] = {k: forged["metadata"][k] for k in ("labels", "annotations", "ownerReferences")}
    forged["metadata"]["name"] = "forged"
    forged["spec"]["containers"][0]["image"] = "attacker/image"
    made = kube.create_pod(NS, forged)
    run(kube.pods["forged"])
    assert pool_of(made) == ("base", pool["metadata"]["uid"])
    (ours,) = [name for name in kube.pods if name != "forged"]
    kube.pods[ours]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # ours is going
    remember_all(reconciler, kube)
    reconciler.reconcile_pool(NS, "base")
    assert "deletionTimestamp" in kube.pods["forged"]["metadata"]
    kube.add_sandbox("a", pool="base")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert controller_uid(kube.pods["forged"]) is None
    assert started(kube.status("a"))[1] == "PoolEmpty"


def test_an_empty_pool_means_a_cold_start_that_says_so() -> None:
    kube, reconciler = fresh()
    add_pool(kube, reconciler, size=1)
    fill(kube, reconciler)
    kube.add_sandbox("a", pool="base")
    kube.add_sandbox("b", pool="base")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    reconciler.reconcile(NS, "b")  # the one pod is a's, even before the watch shows it
    assert started(kube.status("a"))[0] == "pool"
    assert started(kube.status("b"))[:2] == ("cold", "PoolEmpty")
    pods = {controller_uid(p) for p in kube.pods.values() if controller_uid(p)}
    assert len(pods) == 2  # each its own pod


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"pool": "none"}, "PoolNotFound"),
        ({"pool": "base", "image": "alpine"}, "PoolMismatch"),
        ({"pool": "base", "resources": {"cpu": "2"}}, "PoolMismatch"),
        ({"pool": "base", "resources": {"cpu": "1000m", "memory": "1Gi"}}, "Claimed"),
        ({"pool": "base", "workspace": {"id": "w1"}}, "Claimed"),  # no workspace layer: no volume
        ({"pool": "base", "reservation": {"cpuPercent": 50}}, "PoolMismatch"),
        ({}, "NoPool"),
    ],
)
def test_a_sandbox_the_pool_cannot_take_starts_cold_with_the_reason_and_equal_sizes_fit(
    spec: Obj, reason: str
) -> None:
    kube, reconciler = fresh()
    add_pool(kube, reconciler)
    fill(kube, reconciler)
    kube.add_sandbox("a", **spec)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    path, found, _ = started(kube.status("a"))
    assert found == reason
    assert kube.pod_patches == (1 if path == "pool" else 0)


def test_deleting_a_sandbox_deletes_its_claimed_pod_and_no_pool_pod() -> None:
    kube, reconciler = fresh()
    add_pool(kube, reconciler, size=2)
    fill(kube, reconciler)
    sbx = kube.add_sandbox("a", pool="base")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    uid = sbx["metadata"]["uid"]
    remember_all(reconciler, kube)
    assert reconciler.finalize(NS, "a", uid) is False
    going = [p for p in kube.pods.values() if "deletionTimestamp" in p["metadata"]]
    assert [controller_uid(p) for p in going] == [uid]
    kube.finish_deletions()
    remember_all(reconciler, kube)
    assert reconciler.finalize(NS, "a", uid) is True


def test_a_changed_pool_replaces_only_its_unclaimed_pods() -> None:
    kube, reconciler = fresh()
    pool = add_pool(kube, reconciler, size=2)
    fill(kube, reconciler)
    sbx = kube.add_sandbox("a", pool="base")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    remember_all(reconciler, kube)
    changed = copy.deepcopy(pool)
    changed["spec"]["image"] = "alpine"
    changed["metadata"]["generation"] = 2
    reconciler.pool_event("MODIFIED", changed)
    reconciler.reconcile_pool(NS, "base")
    claimed = [p for p in kube.pods.values() if controller_uid(p) == sbx["metadata"]["uid"]]
    assert "deletionTimestamp" not in claimed[0]["metadata"]
    stale = [p for p in kube.pods.values() if pool_of(p) and p["spec"]["containers"][0]["image"] == "busybox"]
    assert stale and all("deletionTimestamp" in p["metadata"] for p in stale)
    replacements = [
        p for p in kube.pods.values() if pool_of(p) and p["spec"]["containers"][0]["image"] == "alpine"
    ]
    assert len(replacements) == 2


# With the agent: the claim gives the pod's agent the Sandbox's token and environment. The
# agent's side (one claim, then only that token) is proven against the real agent in
# agent/tests; here agentclient.claim is replaced to see what the controller sends, and to
# make the agent refuse, which a real one does only after a claim the test cannot undo.

AGENTED = PodOptions(agent_image="warren.dev/agent:test")


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str, dict[str, str]]]:
    sent: list[tuple[str, str, str, dict[str, str]]] = []
    monkeypatch.setattr(agentclient, "claim", lambda *args: sent.append(args))
    return sent


@pytest.mark.parametrize("in_image", [False, True], ids=["copied-in", "in-the-image"])
def test_a_claim_gives_the_agent_the_sandboxs_token_and_env(
    claims: list[tuple[str, str, str, dict[str, str]]], in_image: bool
) -> None:
    options = dataclasses.replace(AGENTED, agent_in_images=frozenset({"busybox"} if in_image else ()))
    kube, reconciler = fresh(ControllerOptions(pod=options, quiet_start_seconds=0))
    add_pool(kube, reconciler, size=1)
    (pod,) = fill(kube, reconciler)
    assert ("initContainers" in pod["spec"]) is not in_image
    pod["status"]["podIP"] = "10.0.0.7"
    start = pod["spec"]["containers"][0]["lifecycle"]["postStart"]["exec"]["command"]
    claim_sha256 = start[start.index("-claim-token-sha256") + 1]
    assert "-access-token-sha256" not in start
    token_sha256 = hashlib.sha256(b"the sandbox's token").hexdigest()
    kube.add_sandbox("a", pool="base", agentTokenSha256=token_sha256, env={"GREETING": "hi"})
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    ((address, claim_token, sent_sha256, env),) = claims
    assert address == "10.0.0.7"
    assert hashlib.sha256(claim_token.encode()).hexdigest() == claim_sha256  # only the maker knows it
    assert (sent_sha256, env) == (token_sha256, {"GREETING": "hi"})
    assert started(kube.status("a"))[0] == "pool"


def test_an_agent_that_refuses_the_claim_costs_its_pod_and_the_sandbox_starts_cold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: object) -> None:
        raise agentclient.AgentRefused(409, "this agent is claimed already")

    monkeypatch.setattr(agentclient, "claim", refuse)
    kube, reconciler = fresh(ControllerOptions(pod=AGENTED, quiet_start_seconds=0))
    add_pool(kube, reconciler, size=1)
    (pod,) = fill(kube, reconciler)
    pod["status"]["podIP"] = "10.0.0.7"
    sbx = kube.add_sandbox("a", pool="base", agentTokenSha256="0" * 64)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert "deletionTimestamp" in kube.pods[pod["metadata"]["name"]]["metadata"]
    path, reason, message = started(kube.status("a"))
    assert (path, reason) == ("cold", "ClaimFailed")
    assert "claimed already" in message
    assert (
        kube.pods[pod_name(sbx["metadata"]["uid"])]["metadata"]["labels"][SANDBOX_UID_LABEL]
        == sbx["metadata"]["uid"]
    )


# --- pools whose pods come with a new, empty workspace -------------------------------------

WITH_WORKSPACES = ControllerOptions(quiet_start_seconds=0, workspace=blockd_volume)
NEW_WORKSPACE = {"id": "", "size": "10Gi"}


def test_each_pool_pod_mounts_a_workspace_of_its_own() -> None:
    kube, reconciler = fresh(WITH_WORKSPACES)
    add_pool(kube, reconciler, workspace={"size": "10Gi"})
    pods = fill(kube, reconciler)
    found = [pod_workspace_id(pod) for pod in pods]
    assert all(found) and len(set(found)) == 3
    for pod, workspace_id in zip(pods, found, strict=True):
        assert pod["metadata"]["labels"][WORKSPACE_LABEL] == workspace_id
        (volume,) = pod["spec"]["volumes"]
        assert volume["csi"]["volumeAttributes"] == {"workspace": workspace_id, "size": "10Gi"}
        assert pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == "/workspace"


def test_a_claim_binds_the_sandbox_to_its_pods_workspace_in_three_writes() -> None:
    kube, reconciler = fresh(WITH_WORKSPACES)
    add_pool(kube, reconciler, workspace={"size": "10Gi"})
    fill(kube, reconciler)
    kube.add_sandbox("a", pool="base", workspace=dict(NEW_WORKSPACE))
    remember_all(reconciler, kube)
    creates = kube.creates
    seen = reconciler.reconcile(NS, "a")
    assert seen is not None and seen.phase == "Running"
    (pod,) = [p for p in kube.pods.values() if controller_uid(p) == kube.sandboxes["a"]["metadata"]["uid"]]
    bound = kube.sandboxes["a"]["spec"]["workspace"]
    assert bound == {"id": pod_workspace_id(pod), "size": "10Gi"}
    assert pod["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == spec_hash(kube.sandboxes["a"])
    assert started(kube.status("a"))[:2] == ("pool", "Claimed")
    # The claim, the binding and the status: nothing made.
    assert (kube.creates - creates, kube.pod_patches, kube.spec_patches, kube.status_patches) == (0, 1, 1, 1)
    # The next passes keep the pod, whether or not the watch has shown the binding yet.
    reconciler.reconcile(NS, "a")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert "deletionTimestamp" not in kube.pods[pod["metadata"]["name"]]["metadata"]
    assert kube.spec_patches == 1


def test_concurrent_claims_bind_distinct_workspaces() -> None:
    kube, reconciler = fresh(WITH_WORKSPACES)
    add_pool(kube, reconciler, workspace={"size": "10Gi"})
    fill(kube, reconciler)
    for name in ("a", "b", "c"):
        kube.add_sandbox(name, pool="base", workspace=dict(NEW_WORKSPACE))
    remember_all(reconciler, kube)
    for name in ("a", "b", "c"):
        reconciler.reconcile(NS, name)
    bound = [kube.sandboxes[name]["spec"]["workspace"]["id"] for name in ("a", "b", "c")]
    assert all(bound) and len(set(bound)) == 3
    assert all(started(kube.status(name))[0] == "pool" for name in ("a", "b", "c"))


def test_a_cold_start_binds_a_new_workspace_before_its_pod_is_made() -> None:
    kube, reconciler = fresh(WITH_WORKSPACES)
    add_pool(kube, reconciler, size=0, workspace={"size": "10Gi"})
    sbx = kube.add_sandbox("a", pool="base", workspace=dict(NEW_WORKSPACE))
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert started(kube.status("a"))[:2] == ("cold", "PoolEmpty")
    bound = kube.sandboxes["a"]["spec"]["workspace"]["id"]
    assert bound.startswith("ws_")
    assert pod_workspace_id(kube.pods[pod_name(sbx["metadata"]["uid"])]) == bound
    assert (kube.creates, kube.spec_patches, kube.status_patches) == (1, 1, 1)


def test_a_claim_whose_binding_a_crash_lost_is_bound_from_the_pod_and_kept() -> None:
    kube, reconciler = fresh(WITH_WORKSPACES)
    add_pool(kube, reconciler, size=1, workspace={"size": "10Gi"})
    (pod,) = fill(kube, reconciler)
    sbx = kube.add_sandbox("a", pool="base", workspace=dict(NEW_WORKSPACE))
    workspace_id = str(pod_workspace_id(pod))
    # The claim landed, and the controller stopped before it wrote the binding.
    kube.patch_pod(
        NS, pod["metadata"]["name"], claim_patch(with_workspace_id(sbx, workspace_id), pod, "base")
    )
    restarted = Reconciler(kube, WITH_WORKSPACES)
    remember_all(restarted, kube)
    restarted.reconcile(NS, "a")
    assert kube.sandboxes["a"]["spec"]["workspace"]["id"] == workspace_id
    assert "deletionTimestamp" not in kube.pods[pod["metadata"]["name"]]["metadata"]
    assert kube.status("a")["podName"] == pod["metadata"]["name"]


@pytest.mark.parametrize(
    ("workspace", "pool_workspace", "reason", "says"),
    [
        (NEW_WORKSPACE, {"size": "10240Mi"}, "Claimed", ""),
        ({"id": "", "size": "20Gi"}, {"size": "10Gi"}, "PoolMismatch", "workspace size differs"),
        ({"id": "ws_made", "size": "10Gi"}, {"size": "10Gi"}, "PoolMismatch", "already made"),
        ({"id": "ws_child", "forkOf": "ws_parent"}, {"size": "10Gi"}, "PoolMismatch", "is a fork"),
        (None, {"size": "10Gi"}, "PoolMismatch", "this sandbox has none"),
        (NEW_WORKSPACE, None, "PoolMismatch", "have no workspace"),
    ],
)
def test_only_a_new_workspace_of_the_pools_size_fits_its_pods(
    workspace: Obj | None, pool_workspace: Obj | None, reason: str, says: str
) -> None:
    kube, reconciler = fresh(WITH_WORKSPACES)
    add_pool(kube, reconciler, **({"workspace": pool_workspace} if pool_workspace else {}))
    fill(kube, reconciler)
    kube.add_sandbox("a", pool="base", **({"workspace": dict(workspace)} if workspace else {}))
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    _, found, message = started(kube.status("a"))
    assert found == reason and says in message


def test_a_sandbox_its_organizations_cap_kept_from_the_pool_says_so() -> None:
    kube, reconciler = fresh()
    add_pool(kube, reconciler)
    fill(kube, reconciler)
    sbx = kube.add_sandbox("a")
    sbx["metadata"]["annotations"] = {
        POOL_SKIPPED_ANNOTATION: "the organization holds 3 sandboxes from warm pools, its cap of 3"
    }
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    assert started(kube.status("a")) == (
        "cold",
        "OrganizationCap",
        sbx["metadata"]["annotations"][POOL_SKIPPED_ANNOTATION],
    )
    assert kube.pod_patches == 0


def test_pool_pods_deleted_unclaimed_take_their_workspaces_and_claimed_ones_never() -> None:
    released: list[str] = []
    kube, reconciler = fresh(dataclasses.replace(WITH_WORKSPACES, release_workspace=released.append))
    pool = add_pool(kube, reconciler, workspace={"size": "10Gi"})
    pods = fill(kube, reconciler)
    kube.add_sandbox("a", pool="base", workspace=dict(NEW_WORKSPACE))
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    claimed = kube.pods[kube.status("a")["podName"]]
    # A copy a relist found gone, not the server's last word: never released.
    (unclaimed, *_) = [p for p in pods if p["metadata"]["name"] != claimed["metadata"]["name"]]
    reconciler.pod_changed("DELETED", copy.deepcopy(unclaimed))
    assert released == []
    # The pool shrinks to nothing: its unclaimed pods go, each with its workspace.
    reconciler.pool_event("MODIFIED", {**pool, "spec": {**pool["spec"], "size": 0}})
    reconciler.reconcile_pool(NS, "base")
    deleted = [p for p in kube.pods.values() if "deletionTimestamp" in p["metadata"]]
    assert len(deleted) == 2 and claimed not in deleted
    for pod in deleted:
        reconciler.pod_changed("DELETED", copy.deepcopy(pod))
    assert sorted(released) == sorted(str(pod_workspace_id(p)) for p in deleted)
    # The claimed pod's workspace is its Sandbox's, deleted or not.
    kube.delete_pod(NS, claimed["metadata"]["name"])
    reconciler.pod_changed("DELETED", copy.deepcopy(kube.pods[claimed["metadata"]["name"]]))
    assert pod_workspace_id(claimed) not in released


# --- pools whose pods take their workspace at the claim (the children of forks) -------------


class FakeBinder:
    """The nodes' bind API as the controller calls it: what was bound, or a refusal."""

    def __init__(self, refuse: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.siblings: list[int | None] = []
        self.containers: list[str | None] = []  # the running container named, binding in place
        self.refuse = refuse

        self.forks: list[tuple[str, str, str, int | None]] = []

    def bind(
        self, pod: Obj, workspace: Obj, siblings: int | None = None, container_id: str | None = None
    ) -> str:
        self.calls.append((pod["metadata"]["uid"], dict(workspace)))
        self.siblings.append(siblings)
        self.containers.append(container_id)
        if self.refuse:
            raise BindError(self.refuse)
        return "forked"

    def fork(self, node: str, source: str, child: str, siblings: int | None = None) -> int:
        self.forks.append((node, source, child, siblings))
        return 42


def with_ephemeral_containers(kube: FakeKube) -> list[tuple[str, Obj]]:
    """The pods/ephemeralcontainers subresource on the in-memory server."""
    added: list[tuple[str, Obj]] = []

    def add(namespace: str, name: str, container: Obj, resource_version: str | None = None) -> Obj:
        pod = kube.pods[name]
        if resource_version not in {None, pod["metadata"]["resourceVersion"]}:
            raise api_error(409, "the object has been modified")
        pod["spec"].setdefault("ephemeralContainers", []).append(copy.deepcopy(container))
        added.append((name, container))
        kube._version(pod)
        return copy.deepcopy(pod)

    kube.add_ephemeral_container = add  # type: ignore[method-assign]
    return added


FORK_CHILD = {"id": "ws-child", "forkOf": "ws-parent", "size": "10Gi"}
BIND_POOL = {"size": "10Gi", "bindAtClaim": True}


def bind_pool(
    options: PodOptions = AGENTED,
) -> tuple[FakeKube, Reconciler, FakeBinder, list[tuple[str, Obj]]]:
    kube, reconciler = fresh(ControllerOptions(pod=options, quiet_start_seconds=0, workspace=blockd_volume))
    binder = FakeBinder()
    reconciler.binder = binder  # type: ignore[assignment]
    added = with_ephemeral_containers(kube)
    add_pool(kube, reconciler, "base-forks", size=2, workspace=BIND_POOL)
    return kube, reconciler, binder, added


def test_a_bind_at_claim_pool_pod_holds_an_empty_workspace_volume_and_runs_no_sandbox() -> None:
    kube, reconciler, _, _ = bind_pool()
    pods = fill(kube, reconciler, "base-forks")
    assert len(pods) == 2
    for pod in pods:
        (holder,) = pod["spec"]["containers"]
        assert holder["name"] == HOLD_CONTAINER and holder["command"][-1] == "-hold"
        # Mounted (kubelet publishes only what a container mounts), read-only, and empty: a
        # container's view under gVisor is what it started with (the cluster tier proves it).
        assert holder["volumeMounts"] == [{"name": "workspace", "mountPath": "/workspace", "readOnly": True}]
        assert holder["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "workspace"]
        assert volume["csi"]["volumeAttributes"] == {"bindAtClaim": "true"}
        assert pod["metadata"]["annotations"][BIND_AT_CLAIM_ANNOTATION] == "true"
        assert pod_workspace_id(pod) is None and WORKSPACE_LABEL not in pod["metadata"]["labels"]


@pytest.mark.parametrize("in_image", [False, True], ids=["copied-in", "in-the-image"])
def test_a_forks_child_claims_a_pod_binds_its_fork_there_and_then_starts_its_container(
    in_image: bool,
) -> None:
    images = frozenset({"busybox"} if in_image else ())
    kube, reconciler, binder, added = bind_pool(dataclasses.replace(AGENTED, agent_in_images=images))
    (first, _) = fill(kube, reconciler, "base-forks")
    token_sha256 = hashlib.sha256(b"the child's token").hexdigest()
    sbx = kube.add_sandbox(
        "child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256=token_sha256, env={"A": "b"}
    )
    sbx["metadata"]["annotations"] = {FORK_SIBLINGS_ANNOTATION: "8"}  # one of a fork into eight
    remember_all(reconciler, kube)
    seen = reconciler.reconcile(NS, "child")
    (claimed,) = [p for p in kube.pods.values() if controller_uid(p) == sbx["metadata"]["uid"]]
    assert binder.calls == [(claimed["metadata"]["uid"], FORK_CHILD)]
    assert binder.siblings == [8]  # the node forks the eight with one freeze
    ((name, container),) = added
    assert name == claimed["metadata"]["name"]
    assert container["name"] == "sandbox" and container["image"] == "busybox"
    assert container["command"][-2:] == ["-access-token-sha256", token_sha256]
    assert container["command"][0] == ("/warren/agent" if in_image else "/.warren/agent")
    assert {"name": "workspace", "mountPath": "/workspace"} in container["volumeMounts"]
    assert container["env"] == [{"name": "A", "value": "b"}]
    assert not {"resources", "lifecycle", "ports", "readinessProbe"} & set(container)  # not allowed there
    # The holder is Ready, but the sandbox runs only once its own container does.
    assert seen is not None and seen.phase == "Pending" and seen.reason == "ContainerStarting"
    # Its agent answering is as good as kubelet's report (which comes at kubelet's next look).
    as_claimed = kube.pods[claimed["metadata"]["name"]]
    assert observe(kube.sandboxes["child"], as_claimed, agent_answers=True).phase == "Running"
    status = kube.status("child")
    assert started(status)[:2] == ("pool", "Claimed") and "bound its workspace" in started(status)[2]
    pod = kube.pods[claimed["metadata"]["name"]]
    pod["status"]["ephemeralContainerStatuses"] = [{"name": "sandbox", "state": {"running": {}}}]
    remember_all(reconciler, kube)
    seen = reconciler.reconcile(NS, "child")
    assert seen is not None and seen.phase == "Running"
    assert binder.calls == [(claimed["metadata"]["uid"], FORK_CHILD)]  # one bind, one container
    assert len(added) == 1
    assert first["metadata"]["name"] in kube.pods


# With the nodes' warren-blockd able to bind beneath a running container (bind_in_place),
# a fork pool's pods run the sandbox's own container from the start; that a workspace
# mounted there on the host shows inside gVisor is the cluster tier's to prove.

IN_PLACE = dataclasses.replace(AGENTED, bind_in_place=True)


def running_sandbox_container(pod: Obj, container_id: str) -> None:
    pod["status"]["podIP"] = "10.0.0.9"
    pod["status"]["containerStatuses"] = [
        {"name": "sandbox", "containerID": f"containerd://{container_id}", "state": {"running": {}}}
    ]


def test_a_bind_in_place_pool_pod_runs_the_sandboxs_container_and_nothing_looks_at_its_workspace() -> None:
    kube, reconciler, _, _ = bind_pool(IN_PLACE)
    pods = fill(kube, reconciler, "base-forks")
    assert len(pods) == 2
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["name"] == "sandbox" and container["image"] == "busybox"
        # The agent holds the pod up (the image's own command must not run before there is a
        # workspace) and its unclaimed twin serves; neither starts in /workspace.
        assert container["command"] == ["/.warren/agent", "-hold"] and container["workingDir"] == "/"
        assert "-claim-token-sha256" in container["lifecycle"]["postStart"]["exec"]["command"]
        hold = {"name": "workspace", "mountPath": "/.warren-claim", "readOnly": True}
        assert {**hold, "mountPropagation": "HostToContainer"} in container["volumeMounts"]
        assert all(m["mountPath"] != "/workspace" for m in container["volumeMounts"])
        annotations = pod["metadata"]["annotations"]
        assert annotations[BIND_IN_PLACE_ANNOTATION] == "true"
        assert annotations["dev.gvisor.flag.overlay2"] == "none"  # writes reach the workspace
        assert BIND_AT_CLAIM_ANNOTATION not in annotations


def test_a_forks_child_takes_an_in_place_pod_its_fork_bound_beneath_the_running_container(
    claims: list[tuple[str, str, str, dict[str, str]]],
) -> None:
    kube, reconciler, binder, added = bind_pool(IN_PLACE)
    for index, pod in enumerate(fill(kube, reconciler, "base-forks")):
        running_sandbox_container(pod, f"{index + 1:064x}")
    writes: list[str] = []
    patch = kube.patch_pod

    def patching(namespace: str, name: str, body: Obj) -> Obj:
        writes.append("claim" + ("@guarded" if "resourceVersion" in body["metadata"] else ""))
        return patch(namespace, name, body)

    kube.patch_pod = patching  # type: ignore[method-assign]
    token_sha256 = hashlib.sha256(b"the child's token").hexdigest()
    sbx = kube.add_sandbox(
        "child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256=token_sha256, env={"A": "b"}
    )
    sbx["metadata"]["annotations"] = {FORK_SIBLINGS_ANNOTATION: "8"}
    remember_all(reconciler, kube)
    seen = reconciler.reconcile(NS, "child")
    (claimed,) = [p for p in kube.pods.values() if controller_uid(p) == sbx["metadata"]["uid"]]
    assert writes == ["claim@guarded"]  # the claim takes the pod; no container is added
    assert added == []
    assert binder.calls == [(claimed["metadata"]["uid"], FORK_CHILD)] and binder.siblings == [8]
    (status,) = claimed["status"]["containerStatuses"]
    assert binder.containers == [status["containerID"].removeprefix("containerd://")]
    ((address, _, sent_sha256, env),) = claims
    assert (address, sent_sha256, env) == ("10.0.0.9", token_sha256, {"A": "b"})
    assert seen is not None and seen.phase == "Running"
    path, reason, message = started(kube.status("child"))
    assert (path, reason) == ("pool", "Claimed") and "beneath its running container" in message


def test_a_child_in_an_in_place_pod_is_not_captured_with_memory_and_says_why(
    claims: list[tuple[str, str, str, dict[str, str]]],
) -> None:
    """A restore rebuilds a sandbox's pod as a cold start makes it (/workspace a volume); a
    workspace bound into a pool pod at the claim is not that, so no image is taken of it."""
    kube, reconciler, _, _ = bind_pool(IN_PLACE)
    for index, pod in enumerate(fill(kube, reconciler, "base-forks")):
        running_sandbox_container(pod, f"{index + 1:064x}")
    kube.add_sandbox("child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256="0" * 64)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "child")
    kube.update_spec("child", stopped=True, memoryCapture=True)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "child")
    status = kube.status("child")
    condition = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert status["phase"] == "Running" and condition["reason"] == "MemoryCaptureFailed"
    assert "fork pool" in condition["message"] and "without memory capture" in condition["message"]


def test_a_bind_in_place_the_node_refuses_costs_the_pod_and_the_child_starts_cold(
    claims: list[tuple[str, str, str, dict[str, str]]],
) -> None:
    kube, reconciler, binder, _ = bind_pool(IN_PLACE)
    binder.refuse = "the bind refused: workspace ws-parent is not on this node"
    for index, pod in enumerate(fill(kube, reconciler, "base-forks")):
        running_sandbox_container(pod, f"{index + 1:064x}")
    sbx = kube.add_sandbox("child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256="0" * 64)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "child")
    taken = [p for p in kube.pods.values() if controller_uid(p) == sbx["metadata"]["uid"]]
    assert any("deletionTimestamp" in p["metadata"] for p in taken)  # its workspace may be bound there
    assert claims == []  # the agent never served it
    path, reason, message = started(kube.status("child"))
    assert (path, reason) == ("cold", "ClaimFailed") and "ws-parent is not on this node" in message


def test_a_childs_container_is_added_to_the_chosen_pod_before_its_claim_is_written() -> None:
    """kubelet acts on a change to a pod it synced less than a relist ago only after that
    relist: the container goes first (to the version of the pod that was chosen, which
    takes it), and the claim's labels and owner after, so the claim never holds it back."""
    kube, reconciler, binder, added = bind_pool()
    fill(kube, reconciler, "base-forks")
    writes: list[str] = []
    add, patch = kube.add_ephemeral_container, kube.patch_pod

    def adding(namespace: str, name: str, container: Obj, resource_version: str | None = None) -> Obj:
        writes.append(f"container@{resource_version}")
        return add(namespace, name, container, resource_version)

    def patching(namespace: str, name: str, body: Obj) -> Obj:
        writes.append("claim" + ("@guarded" if "resourceVersion" in body["metadata"] else ""))
        return patch(namespace, name, body)

    kube.add_ephemeral_container = adding  # type: ignore[method-assign]
    kube.patch_pod = patching  # type: ignore[method-assign]
    chosen = {name: pod["metadata"]["resourceVersion"] for name, pod in kube.pods.items()}
    sbx = kube.add_sandbox("child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256="0" * 64)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "child")
    (claimed,) = [p for p in kube.pods.values() if controller_uid(p) == sbx["metadata"]["uid"]]
    assert writes == [f"container@{chosen[claimed['metadata']['name']]}", "claim"]
    assert len(binder.calls) == 1 and len(added) == 1
    assert claimed["metadata"]["labels"][SANDBOX_UID_LABEL] == sbx["metadata"]["uid"]
    assert started(kube.status("child"))[:2] == ("pool", "Claimed")


def test_a_childs_first_status_is_the_one_that_says_it_runs_and_how_it_started() -> None:
    """While its container starts as it should, a claimed child's status is left unwritten
    (as a cold start's is): the first status written says it runs, with how it started."""
    kube, reconciler, _, _ = bind_pool()
    reconciler.options = dataclasses.replace(reconciler.options, quiet_start_seconds=60)
    fill(kube, reconciler, "base-forks")
    sbx = kube.add_sandbox("child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256="0" * 64)
    remember_all(reconciler, kube)
    seen = reconciler.reconcile(NS, "child")
    assert seen is not None and (seen.phase, seen.reason) == ("Pending", "ContainerStarting")
    assert not kube.sandboxes["child"].get("status")
    (claimed,) = [p for p in kube.pods.values() if controller_uid(p) == sbx["metadata"]["uid"]]
    reconciler._agent_answers.add(claimed["metadata"]["uid"])  # what the agent's answer records
    remember_all(reconciler, kube)
    seen = reconciler.reconcile(NS, "child")
    assert seen is not None and seen.phase == "Running"
    status = kube.status("child")
    assert status["phase"] == "Running"
    assert started(status)[:2] == ("pool", "Claimed") and "bound its workspace" in started(status)[2]


def test_a_pool_pod_changed_while_its_workspace_was_bound_is_given_up_and_the_child_starts_cold() -> None:
    kube, reconciler, binder, added = bind_pool()
    pods = fill(kube, reconciler, "base-forks")
    remember_all(reconciler, kube)  # the controller chooses from what it has seen
    for pod in pods:
        kube._version(kube.pods[pod["metadata"]["name"]])  # kubelet wrote its status since
    sbx = kube.add_sandbox("child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256="0" * 64)
    reconciler.sandboxes.apply("ADDED", sbx)
    reconciler.reconcile(NS, "child")
    path, reason, message = started(kube.status("child"))
    assert (path, reason) == ("cold", "ClaimFailed") and "modified" in message, message
    assert added == [] and len(binder.calls) == 1
    # The pod its workspace was bound at goes (it is no pool's any more); the other stays.
    deleting = [p for p in pods if "deletionTimestamp" in kube.pods[p["metadata"]["name"]]["metadata"]]
    assert len(deleting) == 1
    assert pod_name(sbx["metadata"]["uid"]) in kube.pods


def test_a_forks_child_claims_beside_its_source_first_and_elsewhere_forks_on_the_sources_node() -> None:
    """Two nodes: the parent's workspace is mounted on node a. A child claims a pool pod on
    a while there is one, and its node forks it; on node b, the parent's node makes the
    child (it holds every write the parent made) and b binds the child as storage has it."""
    kube, reconciler, binder, _ = bind_pool()
    kube.add_sandbox("parent", workspace={"id": "ws-parent", "size": "10Gi"})
    reconciler.reconcile(NS, "parent")
    (parent_pod,) = [p for p in kube.pods.values() if pod_workspace_id(p) == "ws-parent"]
    parent_pod["spec"]["nodeName"] = "a"
    pods = fill(kube, reconciler, "base-forks")
    for pod, node in zip(sorted(pods, key=lambda p: p["metadata"]["name"]), ("b", "a"), strict=True):
        pod["spec"]["nodeName"] = node
    remember_all(reconciler, kube)

    def child(name: str) -> tuple[Obj, Obj]:
        workspace = {**FORK_CHILD, "id": f"ws-{name}"}
        token_sha256 = hashlib.sha256(name.encode()).hexdigest()
        sbx = kube.add_sandbox(name, pool="base-forks", workspace=workspace, agentTokenSha256=token_sha256)
        sbx["metadata"]["annotations"] = {FORK_SIBLINGS_ANNOTATION: "2"}
        remember_all(reconciler, kube)
        reconciler.reconcile(NS, name)
        mine = [p for p in kube.pods.values() if controller_uid(p) == sbx["metadata"]["uid"]]
        (claimed,) = mine
        return claimed, workspace

    near, workspace = child("near")
    assert near["spec"]["nodeName"] == "a" and binder.forks == []
    assert binder.calls[-1] == (near["metadata"]["uid"], workspace) and binder.siblings[-1] == 2
    far, workspace = child("far")
    assert far["spec"]["nodeName"] == "b"
    assert binder.forks == [("a", "ws-parent", "ws-far", 2)]
    assert binder.calls[-1] == (far["metadata"]["uid"], {"id": "ws-far"}) and binder.siblings[-1] is None
    how = started(kube.status("far"))
    assert how[:2] == ("pool", "Claimed") and "forked on its source's node" in how[2], how
    assert "forked on its source's node" not in started(kube.status("near"))[2]


def test_the_mirror_takes_the_controllers_word_that_a_claimed_pods_agent_answered() -> None:
    """The API reads the status mirror, which computes the phase from the pod itself: for a
    container added to a claimed pool pod, the controller's report that the sandbox runs in
    that very pod (its agent answered) counts, without waiting for kubelet's next look."""
    kube, reconciler, _, _ = bind_pool()
    fill(kube, reconciler, "base-forks")
    kube.add_sandbox("child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256="0" * 64)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "child")
    sandbox = {**kube.sandboxes["child"], "status": kube.status("child")}
    (pod,) = [p for p in kube.pods.values() if controller_uid(p) == sandbox["metadata"]["uid"]]
    assert with_pod(sandbox, pod)["status"]["phase"] == "Pending"
    running = status_for(sandbox, Observation("Running", True, "PodReady", "", pod=pod["metadata"]["name"]))
    assert with_pod({**sandbox, "status": running}, pod)["status"]["phase"] == "Running"
    # Not a report about another pod, nor one about an older spec of the Sandbox.
    elsewhere = {**running, "podName": "pool-base-forks-0000000000"}
    assert with_pod({**sandbox, "status": elsewhere}, pod)["status"]["phase"] == "Pending"
    older = {**running, "observedGeneration": -1}
    assert with_pod({**sandbox, "status": older}, pod)["status"]["phase"] == "Pending"
    # Nor against the pod's own word that the container ended.
    ended = copy.deepcopy(pod)
    ended["status"]["ephemeralContainerStatuses"] = [
        {"name": "sandbox", "state": {"terminated": {"exitCode": 1}}}
    ]
    assert with_pod({**sandbox, "status": running}, ended)["status"]["phase"] == "Failed"


def test_a_refused_bind_costs_the_pod_and_the_child_starts_cold_saying_why() -> None:
    kube, reconciler, binder, added = bind_pool()
    binder.refuse = "warren-blockd on node n refused the bind: workspace ws-parent does not exist"
    fill(kube, reconciler, "base-forks")
    sbx = kube.add_sandbox("child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256="0" * 64)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "child")
    path, reason, message = started(kube.status("child"))
    assert (path, reason) == ("cold", "ClaimFailed") and "does not exist" in message
    assert added == []
    claimed = [
        p for p in kube.pods.values() if (p["metadata"].get("annotations") or {}).get(CLAIMED_FROM_ANNOTATION)
    ]
    assert all("deletionTimestamp" in p["metadata"] for p in claimed)
    cold = kube.pods[pod_name(sbx["metadata"]["uid"])]
    assert cold["spec"]["volumes"][0]["csi"]["volumeAttributes"]["forkOf"] == "ws-parent"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"workspace": {"id": "", "size": "10Gi"}}, "is not named yet"),
        ({"workspace": {**FORK_CHILD, "size": "20Gi"}}, "workspace size differs"),
        ({"workspace": FORK_CHILD, "command": ["sleep", "1"]}, "start only the agent"),
        ({}, "this sandbox has none"),
    ],
)
def test_only_a_named_workspace_of_the_pools_size_and_no_command_fit_a_bind_at_claim_pool(
    spec: dict[str, Any], problem: str
) -> None:
    kube, reconciler, binder, _ = bind_pool()
    fill(kube, reconciler, "base-forks")
    kube.add_sandbox("a", pool="base-forks", agentTokenSha256="0" * 64, **spec)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    path, reason, message = started(kube.status("a"))
    assert (path, reason) == ("cold", "PoolMismatch") and problem in message
    assert binder.calls == []


def test_without_a_bind_token_a_bind_at_claim_pool_is_never_claimed_from() -> None:
    kube, reconciler, _, added = bind_pool()
    reconciler.binder = None
    fill(kube, reconciler, "base-forks")
    kube.add_sandbox("a", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256="0" * 64)
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "a")
    path, reason, message = started(kube.status("a"))
    assert (path, reason) == ("cold", "PoolMismatch") and "no bind token" in message
    assert added == []


def test_a_pod_claimed_before_its_container_was_added_is_finished_by_the_next_pass() -> None:
    """A bindAtClaim pod claimed without the sandbox's container (an older controller wrote
    the claim first, and stopped before the container): the next pass binds and adds it, once."""
    kube, reconciler, binder, added = bind_pool()
    (pod, _) = fill(kube, reconciler, "base-forks")
    sbx = kube.add_sandbox("child", pool="base-forks", workspace=FORK_CHILD, agentTokenSha256="0" * 64)
    kube.patch_pod(
        NS, pod["metadata"]["name"], claim_patch(sbx, kube.pods[pod["metadata"]["name"]], "base-forks")
    )
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "child")
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "child")
    assert len(added) == 1 and len(binder.calls) == 1
    assert added[0][0] == pod["metadata"]["name"]


def test_a_bind_at_claim_pool_refills_once_its_claimed_pods_run() -> None:
    """New pool pods would take the CPU from the claimed pods' containers starting: the
    pool pass that refills comes once the last of them runs (or never will)."""
    kube, reconciler, _, _ = bind_pool()
    passes: list[tuple[str, str]] = []
    reconciler.request_pool_pass = lambda namespace, name: passes.append((namespace, name))
    reconciler._await_agent = lambda sandbox, pod, pool: None  # type: ignore[method-assign]  # still starting
    fill(kube, reconciler, "base-forks")
    for name in ("one", "two"):
        kube.add_sandbox(
            name, pool="base-forks", workspace={**FORK_CHILD, "id": f"ws-{name}"}, agentTokenSha256="0" * 64
        )
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "one")
    reconciler.reconcile(NS, "two")
    remember_all(reconciler, kube)

    def unclaimed() -> int:
        return sum(1 for p in kube.pods.values() if (p["metadata"].get("labels") or {}).get(POOL_LABEL))

    assert passes == []  # both still starting
    # Nor does a pass that something else brings (its pods' events, its own) refill it.
    reconciler.reconcile_pool(NS, "base-forks")
    assert unclaimed() == 0
    reconciler._one_started((NS, "base-forks"))
    reconciler.reconcile_pool(NS, "base-forks")
    assert passes == [] and unclaimed() == 0
    reconciler._one_started((NS, "base-forks"))
    assert passes == [(NS, "base-forks")]
    reconciler.reconcile_pool(NS, "base-forks")
    assert unclaimed() == 2


def test_a_bind_at_claim_pool_refills_at_the_latest_a_while_after_a_claim() -> None:
    """A claimed pod that never reports keeps its pool from refilling only so long."""
    kube, reconciler, _, _ = bind_pool()
    reconciler._await_agent = lambda sandbox, pod, pool: None  # type: ignore[method-assign]  # never answers
    fill(kube, reconciler, "base-forks")
    kube.add_sandbox(
        "one", pool="base-forks", workspace={**FORK_CHILD, "id": "ws-one"}, agentTokenSha256="0" * 64
    )
    remember_all(reconciler, kube)
    reconciler.reconcile(NS, "one")
    remember_all(reconciler, kube)
    reconciler.reconcile_pool(NS, "base-forks")
    assert sum(1 for p in kube.pods.values() if (p["metadata"].get("labels") or {}).get(POOL_LABEL)) == 1
    count, _ = reconciler._pool_starting[(NS, "base-forks")]
    reconciler._pool_starting[(NS, "base-forks")] = (count, time.monotonic() - REFILL_AT_THE_LATEST_S)
    reconciler.reconcile_pool(NS, "base-forks")
    assert sum(1 for p in kube.pods.values() if (p["metadata"].get("labels") or {}).get(POOL_LABEL)) == 2
