"""The controller against a real cluster with a gVisor node: a Sandbox becomes exactly one
running gVisor pod; delete and stop clean up; a controller killed mid-reconcile and
restarted leaves no duplicate and no orphan. The controller runs as a subprocess with the
ServiceAccount and RBAC `warren apply` gives it."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import pytest
from k8s_helpers import Controller, live, pods_of, sandbox_body
from kubernetes import client
from kubernetes.stream import stream
from warren_common.testing import wait_for
from warren_control.controller import FINALIZER
from warren_control.kube import Kube, Obj
from warren_control.podspec import controller_uid, pod_name

pytest_plugins = ["k8s_fixtures"]
pytestmark = pytest.mark.cluster

START_TIMEOUT = 180  # a cold gVisor start on a small, busy test machine


def timing(what: str, seconds: float) -> None:
    print(f"timing: {what}: {seconds:.2f} s")


def create(kube: Kube, namespace: str, name: str, image: str, **spec: Any) -> Obj:
    return kube.create_sandbox(namespace, sandbox_body(name, image, **spec))


def wait_phase(kube: Kube, namespace: str, name: str, phase: str, timeout: float = START_TIMEOUT) -> Obj:
    def reached() -> Obj | None:
        sandbox = kube.read_sandbox(namespace, name)
        status = (sandbox or {}).get("status") or {}
        return sandbox if status.get("phase") == phase else None

    try:
        return wait_for(reached, timeout, f"Sandbox {name} to be {phase}")
    except AssertionError:
        sandbox = kube.read_sandbox(namespace, name) or {}
        raise AssertionError(f"Sandbox {name} is not {phase}: {sandbox.get('status')}") from None


def exec_in(kube: Kube, namespace: str, pod: str, argv: list[str]) -> str:
    core = client.CoreV1Api(kube.api)
    output: str = stream(
        core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        command=argv,
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    return output


def test_sandbox_becomes_one_running_gvisor_pod(
    kube: Kube, namespace: str, image: str, controller: Controller
) -> None:
    start = time.monotonic()
    create(kube, namespace, "one", image)
    sandbox = wait_phase(kube, namespace, "one", "Running")
    timing("create to Running", time.monotonic() - start)

    uid = sandbox["metadata"]["uid"]
    (pod,) = pods_of(kube, namespace, uid)
    assert pod["metadata"]["name"] == pod_name(uid)
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert controller_uid(pod) == uid
    assert pod["metadata"]["labels"]["warren.dev/sandbox"] == "true"
    limits = pod["spec"]["containers"][0]["resources"]
    assert limits["requests"] == limits["limits"] == {"cpu": "50m", "memory": "128Mi"}
    assert FINALIZER in sandbox["metadata"]["finalizers"]

    status = sandbox["status"]
    assert status["observedGeneration"] == sandbox["metadata"]["generation"]
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "PodReady")
    # Named no pool: started cold, and says so.
    (started,) = [c for c in status["conditions"] if c["type"] == "PoolClaimed"]
    assert (started["status"], started["reason"]) == ("False", "NoPool")
    assert "gVisor" in exec_in(kube, namespace, pod["metadata"]["name"], ["dmesg"])


def test_delete_stops_the_pod_before_the_sandbox_goes(
    kube: Kube, namespace: str, image: str, controller: Controller
) -> None:
    create(kube, namespace, "gone", image)
    uid = wait_phase(kube, namespace, "gone", "Running")["metadata"]["uid"]
    start = time.monotonic()
    kube.delete_sandbox(namespace, "gone")
    seen_terminating = False
    while True:
        sandbox = kube.read_sandbox(namespace, "gone")
        pods = pods_of(kube, namespace, uid)
        if sandbox is None:
            # The finalizer let the Sandbox go only once its pod was gone entirely.
            assert pods == [], [p["metadata"]["name"] for p in pods]
            break
        if (sandbox.get("status") or {}).get("phase") == "Terminating":
            seen_terminating = True
        assert time.monotonic() - start < 120, f"Sandbox still there: {sandbox.get('status')}"
        time.sleep(0.2)
    timing("delete to Sandbox gone", time.monotonic() - start)
    assert seen_terminating


def test_stop_removes_the_pod_and_keeps_the_sandbox(
    kube: Kube, namespace: str, image: str, controller: Controller
) -> None:
    create(kube, namespace, "nap", image)
    uid = wait_phase(kube, namespace, "nap", "Running")["metadata"]["uid"]
    (first,) = pods_of(kube, namespace, uid)

    start = time.monotonic()
    kube.patch_sandbox(namespace, "nap", {"spec": {"stopped": True}})
    sandbox = wait_phase(kube, namespace, "nap", "Stopped", timeout=60)
    timing("stop to Stopped", time.monotonic() - start)
    assert pods_of(kube, namespace, uid) == []
    assert sandbox["status"]["observedGeneration"] == sandbox["metadata"]["generation"]
    (ready,) = [c for c in sandbox["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "False"

    start = time.monotonic()
    kube.patch_sandbox(namespace, "nap", {"spec": {"stopped": False}})
    wait_phase(kube, namespace, "nap", "Running")
    timing("start to Running", time.monotonic() - start)
    (second,) = pods_of(kube, namespace, uid)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]


def test_pod_deleted_behind_the_controllers_back_is_made_again(
    kube: Kube, namespace: str, image: str, controller: Controller
) -> None:
    create(kube, namespace, "again", image)
    uid = wait_phase(kube, namespace, "again", "Running")["metadata"]["uid"]
    (first,) = pods_of(kube, namespace, uid)
    kube.delete_pod(namespace, first["metadata"]["name"])

    def replaced() -> bool:
        pods = live(pods_of(kube, namespace, uid))
        return len(pods) == 1 and pods[0]["metadata"]["uid"] != first["metadata"]["uid"]

    wait_for(replaced, 60, "a new pod")
    wait_phase(kube, namespace, "again", "Running")
    assert len(pods_of(kube, namespace, uid)) == 1


def test_killed_right_after_creating_a_pod_restarts_and_adopts_what_it_made(
    kube: Kube, namespace: str, image: str, controller: Controller
) -> None:
    """Four Sandboxes at once; the controller dies right after its second pod create
    returned: some Sandboxes have a pod and no status, some nothing yet."""
    names = [f"crash-{i}" for i in range(4)]
    controller.stop()
    controller.start(crash_after_creates=2)
    for name in names:
        create(kube, namespace, name, image)
    wait_for(lambda: not controller.running(), 60, "the controller to kill itself after its second create")
    assert controller.process is not None and controller.process.returncode == -9

    made: dict[str, str] = {}  # Sandbox name -> the uid of the pod the dead controller made
    for name in names:
        sandbox = kube.read_sandbox(namespace, name)
        assert sandbox is not None
        pods = pods_of(kube, namespace, sandbox["metadata"]["uid"])
        assert len(pods) <= 1, name
        if pods:
            made[name] = pods[0]["metadata"]["uid"]
            assert (sandbox.get("status") or {}).get("phase") != "Running", "the crash came too late"
    assert len(made) >= 2, made

    start = time.monotonic()
    controller.start()
    for name in names:
        wait_phase(kube, namespace, name, "Running")
    timing("restart to 4 Sandboxes Running", time.monotonic() - start)
    for name in names:
        uid = kube.read_sandbox(namespace, name)["metadata"]["uid"]  # type: ignore[index]
        (pod,) = pods_of(kube, namespace, uid)
        if name in made:
            assert pod["metadata"]["uid"] == made[name], f"{name}: the restarted controller replaced its pod"


class Sampler(threading.Thread):
    """Lists the namespace's pods over and over; remembers any moment a Sandbox had more
    than one live pod."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        super().__init__(daemon=True)
        self.kube, self.namespace = kube, namespace
        self.done = threading.Event()
        self.duplicates: list[dict[str, int]] = []
        self.samples = 0

    def run(self) -> None:
        while not self.done.is_set():
            counts: dict[str, int] = {}
            for pod in live(self.kube.list_pods(self.namespace, "")):
                owner = controller_uid(pod) or "none"
                counts[owner] = counts.get(owner, 0) + 1
            if any(n > 1 for n in counts.values()):
                self.duplicates.append(counts)
            self.samples += 1
            self.done.wait(0.3)


class Killer(threading.Thread):
    """SIGKILLs the controller at random moments, starting it again after each, until told
    to stop; the controller is left running."""

    def __init__(self, controller: Controller, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.controller, self.rng = controller, rng
        self.done = threading.Event()
        self.kills: list[float] = []
        self.started = time.monotonic()

    def run(self) -> None:
        while not self.done.is_set():
            self.done.wait(self.rng.uniform(0.2, 2.0))  # let it get some way into its work
            self.controller.kill()
            self.kills.append(time.monotonic() - self.started)
            self.done.wait(self.rng.uniform(0.0, 1.0))  # sometimes events pile up while it is down
            self.controller.start()

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=60)
        if not self.controller.running():
            self.controller.start()
        print(f"kills at: {', '.join(f'{t:.1f}' for t in self.kills)} s")


def test_killed_at_random_points_leaves_no_duplicate_and_no_orphan(
    kube: Kube, namespace: str, image: str, controller: Controller
) -> None:
    seed = int(os.environ.get("WARREN_TEST_SEED") or time.time())
    print(f"seed: {seed} (set WARREN_TEST_SEED to replay)")
    rng = random.Random(seed)  # noqa: S311  # a reproducible schedule, not a secret
    names = [f"crowd-{i}" for i in range(10)]
    deleted, stopped = set(names[:2]), set(names[2:4])
    running = [n for n in names if n not in deleted | stopped]

    sampler = Sampler(kube, namespace)
    sampler.start()
    killer = Killer(controller, rng)
    killer.start()
    try:
        for name in names:
            create(kube, namespace, name, image)
            time.sleep(rng.uniform(0.0, 0.4))
        time.sleep(rng.uniform(1.0, 3.0))
        for name in sorted(stopped):
            kube.patch_sandbox(namespace, name, {"spec": {"stopped": True}})
        for name in sorted(deleted):
            kube.delete_sandbox(namespace, name)
        time.sleep(rng.uniform(2.0, 5.0))
    finally:
        killer.stop()
    assert len(killer.kills) >= 3

    settle = time.monotonic()
    for name in running:
        wait_phase(kube, namespace, name, "Running", timeout=300)
    for name in sorted(stopped):
        wait_phase(kube, namespace, name, "Stopped", timeout=120)
    wait_for(lambda: all(kube.read_sandbox(namespace, n) is None for n in deleted), 120, "deleted Sandboxes")
    timing(f"last kill to all {len(names)} Sandboxes settled", time.monotonic() - settle)
    sampler.done.set()
    sampler.join(timeout=10)

    sandboxes = {s["metadata"]["name"]: s for s in kube.list_sandboxes(namespace)}
    assert set(sandboxes) == set(running) | stopped
    for name in running:
        assert len(pods_of(kube, namespace, sandboxes[name]["metadata"]["uid"])) == 1, name
    for name in stopped:
        assert pods_of(kube, namespace, sandboxes[name]["metadata"]["uid"]) == [], name
    uids = {s["metadata"]["uid"] for s in sandboxes.values()}
    orphans = [p["metadata"]["name"] for p in kube.list_pods(namespace, "") if controller_uid(p) not in uids]
    assert orphans == []
    assert sampler.duplicates == [], sampler.duplicates[:3]
    print(f"pod listings sampled during the chaos: {sampler.samples}")
