"""The cluster side of the API: Sandbox resources (one per live sandbox) and their pods."""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import urllib3

from warren_control import keys
from warren_control.api.errors import ClusterError
from warren_control.kube import ApiException, Kube, Obj, error_message
from warren_control.models import (
    Sandbox,
)
from warren_control.observation import start_report
from warren_control.podspec import (
    FINALIZER,
    FORK_SIBLINGS_ANNOTATION,
    GROUP,
    KIND,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLURAL,
    POOL_SKIPPED_ANNOTATION,
    VERSION,
)

if TYPE_CHECKING:
    from warren_control.api.service import ApiSettings


# The label that says which organization a Sandbox resource belongs to: a digest of the
# organization's id, so the cluster (and whoever reads it) learns neither id nor name.
ORG_LABEL = "warren.dev/org-hash"


class Cluster:
    """The Sandbox resources and pods of one namespace, through kube.Kube."""

    def __init__(self, settings: ApiSettings) -> None:
        self.namespace = settings.namespace
        self._kube = settings.kube
        self._kubeconfig = settings.kubeconfig
        self._lock = threading.Lock()

    @property
    def kube(self) -> Kube:
        with self._lock:
            if self._kube is None:
                self._kube = Kube.connect(self._kubeconfig)
            return self._kube

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except ApiException as exc:
            raise ClusterError(f"{what}: {error_message(exc)}", exc.status) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterError(f"{what}: {exc}") from exc

    def _path(self, name: str | None = None) -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}"
        return f"{path}/{name}" if name else path

    def create(self, body: Obj) -> Obj:
        result: Obj = self._call("create", lambda: self.kube.create_sandbox(self.namespace, body))
        return result

    def read(self, name: str) -> Obj | None:
        result: Obj | None = self._call("read", lambda: self.kube.read_sandbox(self.namespace, name))
        return result

    def watch_until(
        self, name: str, start: Obj, done: Callable[[Obj | None], bool], timeout_s: float
    ) -> Obj | None:
        """The Sandbox `name` as the cluster changes it after `start` (a version read of it),
        followed through one watch until `done` holds for a version (None: it is gone) or
        `timeout_s` has passed; the last version seen."""
        deadline = time.monotonic() + timeout_s
        current: Obj | None = start
        version = str(start["metadata"]["resourceVersion"])
        query = {"fieldSelector": f"metadata.name={name}"}
        try:
            while (left := deadline - time.monotonic()) > 0:
                for event in self.kube.watch(self._path(), version, query=query, timeout_s=math.ceil(left)):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":  # the version is too old: read it again
                        current = self.read(name)
                        if current is None or done(current):
                            return current
                        version = str(current["metadata"]["resourceVersion"])
                        break
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") == "BOOKMARK":
                        continue
                    current = None if event.get("type") == "DELETED" else obj
                    if done(current):
                        return current
        except ApiException as exc:
            raise ClusterError(f"watch: {error_message(exc)}", exc.status) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterError(f"watch: {exc}") from exc
        return current

    def watch_start(self, name: str, start: Obj, timeout_s: float) -> Obj | None:
        """watch_until the Sandbox's start report (observation.start_report) differs from
        `start`'s: it ran, failed, could not start or changed its reason (None: it is gone)."""
        first = start_report(start)
        return self.watch_until(name, start, lambda obj: obj is None or start_report(obj) != first, timeout_s)

    def list_org(self, org_hash: str) -> list[Obj]:
        query = {"labelSelector": f"{ORG_LABEL}={org_hash}"}
        result: Obj = self._call("list", lambda: self.kube.request("GET", self._path(), query=query))
        items: list[Obj] = result.get("items") or []
        return items

    def patch(self, name: str, patch: Obj) -> Obj | None:
        try:
            result: Obj = self._call("update", lambda: self.kube.patch_sandbox(self.namespace, name, patch))
        except ClusterError as exc:
            if exc.status == 404:  # noqa: PLR2004
                return None
            raise
        return result

    def delete(self, name: str) -> bool:
        deleted: bool = self._call("delete", lambda: self.kube.delete_sandbox(self.namespace, name))
        return deleted

    def read_pod(self, name: str) -> Obj | None:
        result: Obj | None = self._call("read pod", lambda: self.kube.read_pod(self.namespace, name))
        return result


def org_hash(org_id: str) -> str:
    return hashlib.sha256(org_id.encode()).hexdigest()[:32]


def resource_for(
    record: Sandbox,
    namespace: str,
    stamp_key: bytes,
    *,
    siblings: int | None = None,
    memory: Obj | None = None,
) -> Obj:
    """The record's Sandbox resource; a fork's child also says how many children its fork
    makes (`siblings`), for the node to fork them with one freeze, and the memory image it
    is restored from (`memory`: its parent's status.memoryImage), if it is."""
    spec = record.spec
    body: Obj = {
        "image": spec["image"],
        "resources": {"cpu": f"{spec['cpu_millis']}m", "memory": f"{spec['memory_mib']}Mi"},
        "persistent": bool(spec.get("persistent")),
        "idleTimeoutSeconds": spec["idle_timeout_s"],
        "maxLifetimeSeconds": spec["max_lifetime_s"],
        "stopped": bool(spec.get("stopped")),
    }
    if spec.get("command"):
        body["command"] = list(spec["command"])
    if spec.get("pool"):
        body["pool"] = spec["pool"]
    annotations = {POOL_SKIPPED_ANNOTATION: spec["pool_skipped"]} if spec.get("pool_skipped") else {}
    if (spec.get("workspace") or {}).get("fork_of") and siblings and siblings > 1:
        annotations[FORK_SIBLINGS_ANNOTATION] = str(siblings)
    if spec.get("env"):
        body["env"] = dict(spec["env"])
    reservation = spec.get("reservation") or {}
    if reservation:
        body["reservation"] = {
            name: reservation[key]
            for key, name in (("cpu_percent", "cpuPercent"), ("memory_percent", "memoryPercent"))
            if key in reservation
        }
    body["agentTokenSha256"] = keys.agent_token_sha256(stamp_key, record.id)
    workspace = spec.get("workspace")
    if workspace:
        body["workspace"] = {"id": record.workspace_id or "", "size": f"{workspace['size_gib']}Gi"}
        source = workspace.get("fork_of") or workspace.get("template")
        if source:
            body["workspace"]["forkOf"] = source
    if memory is not None:
        body["memoryFrom"] = {
            "image": memory["image"],
            "workspace": memory["workspace"],
            "workspaceSeq": memory["sealedSeq"],
            "node": memory["node"],
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": record.object_name,
            "namespace": namespace,
            "labels": {ORG_LABEL: org_hash(record.org_id), MANAGED_BY_LABEL: MANAGED_BY},
            **({"annotations": annotations} if annotations else {}),
            "finalizers": [FINALIZER],
        },
        "spec": body,
    }
