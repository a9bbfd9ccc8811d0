"""Waiting for Warren's workloads to be rolled out and serving, as an installer must.

`kubectl rollout status` semantics per kind (the controller has seen the newest spec, every
replica runs it and is available), plus the install Job of the current version complete. A
pod that can never start as specified (its image missing on a node that never pulls, an
invalid image name, a Secret or ConfigMap that is not there) ends the wait at once with its
reason; anything else is waited for until the deadline, which then names what was not ready
and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from warren.config import SYSTEM_NAMESPACE, WarrenConfig

# Waiting reasons that no amount of waiting fixes.
HOPELESS = {"ErrImageNeverPull", "InvalidImageName"}
EDGE_SERVICE = "warren-control"
INSTALL = "warren-install"  # the install Job's name label (manifests/warren-system.yaml.j2)
EDGE_PORT = 8080


class RolloutError(RuntimeError):
    """The workloads did not become ready; the message says which and why."""


@dataclass(frozen=True)
class Workload:
    kind: str
    name: str


def workloads(config: WarrenConfig) -> list[Workload]:
    """What must be ready, in the order it becomes ready (stores, install, services)."""
    found = []
    if config.services.stores == "embedded":
        found += [Workload("StatefulSet", "warren-objects"), Workload("StatefulSet", "warren-postgres")]
    found += [
        Workload("Job", INSTALL),
        Workload("Deployment", "warren-control"),
        Workload("DaemonSet", "warren-blockd"),
    ]
    return found


def _install_job(api: client.ApiClient) -> Any:
    """The install Job of the warren-control image the Deployment runs, or None. Found by that
    image, not by name: a Job's name carries the image's digest where the images are pinned
    at apply (the local node, a bundle), which the configuration alone does not say."""
    try:
        deployment: Any = client.AppsV1Api(api).read_namespaced_deployment("warren-control", SYSTEM_NAMESPACE)
    except client.ApiException as exc:
        if exc.status == 404:  # noqa: PLR2004
            return None
        raise
    image = deployment.spec.template.spec.containers[0].image
    jobs: Any = client.BatchV1Api(api).list_namespaced_job(
        SYSTEM_NAMESPACE, label_selector=f"app.kubernetes.io/name={INSTALL}"
    )
    return next((j for j in jobs.items if j.spec.template.spec.containers[0].image == image), None)


def _ready(kind: str, obj: Any) -> bool:
    status, spec = obj.status, obj.spec
    if kind == "Job":
        return bool(status and (status.succeeded or 0) >= 1)
    if (status.observed_generation or 0) < obj.metadata.generation:
        return False
    if kind == "Deployment":
        want = spec.replicas or 0
        return (
            (status.updated_replicas or 0) == want
            and (status.available_replicas or 0) == want
            and (status.replicas or 0) == want
        )
    if kind == "DaemonSet":
        want = status.desired_number_scheduled or 0
        return (
            want > 0
            and (status.updated_number_scheduled or 0) == want
            and (status.number_available or 0) == want
        )
    # StatefulSet
    return (status.ready_replicas or 0) == (spec.replicas or 0) and (
        status.update_revision is None or status.update_revision == status.current_revision
    )


def _read(api: client.ApiClient, workload: Workload) -> Any:
    if workload.kind == "Job":
        return _install_job(api)
    apps = client.AppsV1Api(api)
    reader = {
        "Deployment": apps.read_namespaced_deployment,
        "DaemonSet": apps.read_namespaced_daemon_set,
        "StatefulSet": apps.read_namespaced_stateful_set,
    }[workload.kind]
    try:
        return reader(workload.name, SYSTEM_NAMESPACE)
    except client.ApiException as exc:
        if exc.status == 404:  # noqa: PLR2004
            return None
        raise


@dataclass(frozen=True)
class Problem:
    reason: str  # the kubelet's waiting reason, or Unschedulable
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


def pod_problems(api: client.ApiClient) -> dict[str, Problem]:
    """Pod name -> why one of its containers is not running yet."""
    problems: dict[str, Problem] = {}
    pods: list[Any] = client.CoreV1Api(api).list_namespaced_pod(SYSTEM_NAMESPACE).items
    for pod in pods:
        statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
        for status in statuses:
            waiting = status.state.waiting if status.state else None
            if waiting and waiting.reason not in (None, "ContainerCreating", "PodInitializing"):
                detail = f"container {status.name}" + (f": {waiting.message}" if waiting.message else "")
                problems[pod.metadata.name] = Problem(waiting.reason, detail)
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                problems[pod.metadata.name] = Problem("Unschedulable", condition.message or "")
    return problems


def wait_ready(
    api: client.ApiClient,
    config: WarrenConfig,
    timeout: float,
    progress: Callable[[str], None] = lambda _m: None,
    interval: float = 2.0,
) -> None:
    """Return once every workload is rolled out and ready; RolloutError otherwise."""
    deadline = time.monotonic() + timeout
    pending = workloads(config)
    said: set[tuple[str, str]] = set()
    while True:
        for workload in list(pending):
            found = _read(api, workload)
            if found is not None and _ready(workload.kind, found):
                pending.remove(workload)
                progress(f"{workload.kind} {found.metadata.name} ready")
        if not pending:
            return
        problems = pod_problems(api)
        hopeless = {pod: p for pod, p in problems.items() if p.reason in HOPELESS}
        if hopeless:
            raise RolloutError(_describe("cannot start", hopeless))
        for pod, problem in problems.items():
            if (pod, str(problem)) not in said:
                said.add((pod, str(problem)))
                progress(f"waiting: {pod}: {problem}")
        if time.monotonic() > deadline:
            waiting = ", ".join(f"{w.kind} {w.name}" for w in pending)
            detail = _describe("; pods", problems) if problems else ""
            raise RolloutError(f"not ready within {timeout:.0f} s: {waiting}{detail}")
        time.sleep(interval)


def _describe(head: str, problems: dict[str, Problem]) -> str:
    return f"{head}: " + "; ".join(f"{pod} ({problem})" for pod, problem in sorted(problems.items()))


def edge_url(api: client.ApiClient) -> str:
    """The edge's address inside the cluster (its Service's cluster IP): reachable from the
    cluster's nodes, the local machine included."""
    service: Any = client.CoreV1Api(api).read_namespaced_service(EDGE_SERVICE, SYSTEM_NAMESPACE)
    return f"http://{service.spec.cluster_ip}:{EDGE_PORT}"
