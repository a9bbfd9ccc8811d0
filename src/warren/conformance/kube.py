"""Helpers the conformance tests share: clients, object builders, refusal checks."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from warren_common.testing import wait_for

Obj = dict[str, Any]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str


def refusal(call: Callable[[], object]) -> Refusal | None:
    """Run an API call; the refusal it met, or None if the server accepted it."""
    try:
        call()
    except ApiException as exc:
        try:
            message = json.loads(exc.body or "{}").get("message", "")
        except ValueError:
            message = str(exc.body)
        return Refusal(exc.status, message)
    return None


def sandbox_pod(name: str, runtime_class: str = "gvisor") -> Obj:
    """A pod that satisfies every rule of the floor."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "warren-conformance"}},
        "spec": {
            "runtimeClassName": runtime_class,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:stable",
                    "command": ["sleep", "3600"],
                    "securityContext": {"allowPrivilegeEscalation": False},
                }
            ],
        },
    }


def with_init(pod: Obj) -> Obj:
    pod = copy.deepcopy(pod)
    init = copy.deepcopy(pod["spec"]["containers"][0])
    init.update(name="init", command=["true"])
    pod["spec"]["initContainers"] = [init]
    return pod


def ephemeral_container(name: str = "debug") -> Obj:
    return {
        "name": name,
        "image": "busybox:stable",
        "command": ["sh"],
        "securityContext": {"allowPrivilegeEscalation": False},
    }


@contextmanager
def namespace(core: client.CoreV1Api, name: str, labels: dict[str, str]) -> Iterator[str]:
    core.create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    )
    try:
        # Pods are admitted only once the namespace's default ServiceAccount exists.
        wait_for(
            lambda: refusal(lambda: core.read_namespaced_service_account("default", name)) is None,
            timeout=60,
            what=f"the default ServiceAccount of {name}",
            interval=0.2,
        )
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@dataclass(frozen=True)
class ExecResult:
    code: int
    output: str


def exec_in(
    core: client.CoreV1Api, namespace: str, pod: str, argv: list[str], timeout: float = 30
) -> ExecResult:
    """Run a command in a pod's first container through the API server's exec."""
    from kubernetes.stream import stream

    ws = stream(
        core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        command=argv,
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _preload_content=False,
    )
    ws.run_forever(timeout=timeout)
    output = ws.read_stdout() + ws.read_stderr()
    code = ws.returncode
    ws.close()
    return ExecResult(code if code is not None else -1, output)


def ready_nodes(core: client.CoreV1Api) -> list[str]:
    """The names of every Ready node that takes pods (not cordoned), sorted."""
    return sorted(
        str(node.metadata.name)
        for node in core.list_node().items
        if not node.spec.unschedulable
        and any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    )


def running_pod(core: client.CoreV1Api, namespace: str, body: Obj, timeout: float = 180) -> Obj:
    """Create a pod and wait until it runs; its events are in the failure message if not."""
    name = body["metadata"]["name"]
    core.create_namespaced_pod(namespace, body)

    def running() -> bool:
        status = core.read_namespaced_pod(name, namespace).status
        phase = str(status.phase)
        if phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {namespace}/{name} ended: {phase}")
        return phase == "Running" and all(c.ready for c in status.container_statuses or [])

    try:
        wait_for(running, timeout=timeout, what=f"pod {namespace}/{name} to run", interval=0.5)
    except AssertionError:
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        detail = "; ".join(f"{e.reason}: {e.message}" for e in events[-5:])
        raise AssertionError(f"pod {namespace}/{name} is not running ({detail})") from None
    return body


def busybox_pod(name: str, image: str, runtime_class: str | None = "gvisor") -> Obj:
    """A long-running busybox pod with /workspace; a sandbox pod unless runtime_class is None."""
    pod = sandbox_pod(name, runtime_class=runtime_class or "unused")
    if runtime_class is None:
        del pod["spec"]["runtimeClassName"]
    container = pod["spec"]["containers"][0]
    container.update(image=image, imagePullPolicy="IfNotPresent", command=["sleep", "86400"])
    container["volumeMounts"] = [{"name": "workspace", "mountPath": "/workspace"}]
    pod["spec"]["volumes"] = [{"name": "workspace", "emptyDir": {}}]
    return pod
