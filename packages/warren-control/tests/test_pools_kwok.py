"""Warm pools against a real API server and scheduler, on kwok's simulated nodes: 50
Sandboxes created at once from a pool of 20 ready pods each get a pod of their own (the
claims stay exclusive), those that found the pool empty start cold and say so, the pool
refills, and a pool pod is used once: none of the pods it holds after the Sandboxes are
deleted was ever claimed. The real controller runs as a subprocess (tests/kwok_cluster.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from k8s_helpers import SMALL
from kwok_cluster import NAMESPACE, KwokCluster, api_requests, delete_all, list_all, reconcile, sandboxes_path
from warren_common.testing import wait_for
from warren_control.kube import Kube, Obj
from warren_control.podspec import (
    CLAIMED_FROM_ANNOTATION,
    POOL_LABEL,
    SANDBOX_UID_LABEL,
    controller_uid,
    pool_of,
)

pytestmark = pytest.mark.scale

POOL = "base"
SIZE = 20
CREATES = 50
NODES = 10


def pool_body() -> Obj:
    return {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": POOL},
        # What kwok_cluster's Sandboxes ask for (k8s_helpers.sandbox_body), so they fit.
        "spec": {
            "image": "busybox",
            "command": ["sleep", "86400"],
            "resources": dict(SMALL),
            "size": SIZE,
            "refillPerSecond": 50,
        },
    }


def pool_pods(kube: Kube) -> list[Obj]:
    return [
        p
        for p in list_all(kube, kube.pods_path(NAMESPACE))
        if pool_of(p) and not p["metadata"].get("deletionTimestamp")
    ]


def wait_for_ready_pool(kube: Kube) -> list[Obj]:
    def ready() -> list[Obj] | None:
        status = kube.request("GET", kube.pools_path(NAMESPACE, POOL)).get("status") or {}
        pods = pool_pods(kube)
        if status.get("ready") == SIZE and len(pods) == SIZE:
            return pods
        return None

    found: list[Obj] = wait_for(ready, 120, f"pool {POOL} to hold {SIZE} ready pods", interval=0.5)
    return found


def check_claims(kube: Kube) -> tuple[Counter[str], set[str]]:
    """Each Sandbox has exactly one pod, owned by it alone, that its status names; each says
    how it started. The paths taken, and the uids of the pool pods claimed."""
    pods = list_all(kube, kube.pods_path(NAMESPACE))
    paths: Counter[str] = Counter()
    claimed: set[str] = set()
    for sandbox in list_all(kube, sandboxes_path()):
        uid, status = sandbox["metadata"]["uid"], sandbox["status"]
        mine = [p for p in pods if controller_uid(p) == uid]
        assert len(mine) == 1, f"{sandbox['metadata']['name']} has {len(mine)} pods"
        (pod,) = mine
        assert status["podName"] == pod["metadata"]["name"]
        assert pod["metadata"]["labels"][SANDBOX_UID_LABEL] == uid
        owners = [ref for ref in pod["metadata"]["ownerReferences"] if ref.get("controller")]
        assert [ref["uid"] for ref in owners] == [uid], "a claimed pod has one owner"
        (start,) = [c for c in status["conditions"] if c["type"] == "PoolClaimed"]
        path = "pool" if start["status"] == "True" else "cold"
        paths[path] += 1
        if path == "pool":
            assert POOL_LABEL not in pod["metadata"]["labels"]
            assert pod["metadata"]["annotations"][CLAIMED_FROM_ANNOTATION] == POOL
            claimed.add(pod["metadata"]["uid"])
        else:
            assert start["reason"] == "PoolEmpty", start  # never a silent fallback
    return paths, claimed


def test_concurrent_creates_claim_a_pool_exclusively_and_the_pool_refills(
    kwok: KwokCluster, tmp_path: Path
) -> None:
    if not kwok.nodes:
        kwok.add_nodes(NODES)
    kube = kwok.kube
    kube.request("POST", kube.pools_path(NAMESPACE), body=pool_body())
    with kwok.controller(tmp_path, workers=16) as controller:
        try:
            before = {p["metadata"]["uid"] for p in wait_for_ready_pool(kube)}
            requests = api_requests(kube)
            result = reconcile(kwok, controller, CREATES, workers=16, prefix="pooled", spec={"pool": POOL})
            print(f"{CREATES} creates from a pool of {SIZE}: all Running after {result.seconds:.1f} s")
            assert not result.create_errors, result.create_errors[:10]
            patches = api_requests(kube)[("PATCH", "pods")] - requests[("PATCH", "pods")]

            paths, claimed_uids = check_claims(kube)
            print(f"paths: {dict(paths)}; pod claims (PATCH pods): {patches}")
            assert sum(paths.values()) == CREATES
            # The pool held SIZE ready pods when the burst began: each went to one Sandbox.
            assert paths["pool"] >= SIZE, paths
            assert len(claimed_uids) == paths["pool"]
            assert before <= claimed_uids | {p["metadata"]["uid"] for p in pool_pods(kube)}
            # A claim is one write; one that lost a race for a pod is a second.
            assert patches <= paths["pool"] + CREATES // 10, patches

            # The pool refills with new pods; then every Sandbox goes, and with it its pod.
            refilled = {p["metadata"]["uid"] for p in wait_for_ready_pool(kube)}
            assert not refilled & claimed_uids
            delete_all(kwok)
            left = [p for p in list_all(kube, kube.pods_path(NAMESPACE)) if controller_uid(p)]
            assert not left, f"claimed pods outlived their Sandboxes: {[p['metadata']['name'] for p in left]}"
            # No pod comes back to the pool: what it holds now was never claimed.
            now = {p["metadata"]["uid"] for p in wait_for_ready_pool(kube)}
            assert not now & claimed_uids
        except BaseException:
            print(controller.logs())
            raise
        finally:
            kube.request("DELETE", kube.pools_path(NAMESPACE, POOL))
    # This cluster runs no garbage collector: the pool's pods go by hand.
    for pod in list_all(kube, kube.pods_path(NAMESPACE)):
        kube.delete_pod(NAMESPACE, pod["metadata"]["name"])
    wait_for(lambda: not list_all(kube, kube.pods_path(NAMESPACE)), 60, "the pool's pods to go", interval=0.5)
    assert not list_all(kube, sandboxes_path())
