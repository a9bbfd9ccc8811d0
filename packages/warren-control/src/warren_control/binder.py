"""Naming a claimed pool pod's workspace: the bind API of warren-blockd's CSI plugin on the
pod's node (warren_blockd.csi.bindapi), for pools whose pods take their workspace at the
claim (spec.workspace.bindAtClaim). The plugin is found by its pod on that node; the call
carries the token both sides mount from the Secret warren-blockd-bind.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from warren_control.kube import Kube

# The bind forks (or restores) a workspace and mounts it: a fork waits for its source's
# writes to reach object storage, which the node's daemon bounds itself.
BIND_TIMEOUT_S = 90.0


class BindError(RuntimeError):
    """The workspace could not be bound; the message says why, for the Sandbox's condition."""


@dataclass(frozen=True)
class BindOptions:
    token: str
    namespace: str = "warren-system"
    selector: str = "app.kubernetes.io/part-of=warren,app.kubernetes.io/name=warren-blockd"
    port: int = 9810


class Binder:
    def __init__(self, kube: Kube, options: BindOptions) -> None:
        self.kube, self.options = kube, options
        self._addresses: dict[str, str] = {}  # node -> its plugin's pod address
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=httpx.Timeout(BIND_TIMEOUT_S, connect=5.0))

    def bind(
        self,
        pod: Mapping[str, Any],
        workspace: Mapping[str, Any],
        siblings: int | None = None,
        container_id: str | None = None,
    ) -> str:
        """Bind `workspace` (a Sandbox's spec.workspace: id, and forkOf or size) at the
        claimed pod's awaiting volume, or with `container_id` at /workspace of that running
        container; how the plugin made it (forked, restored, ...). A fork's child names its
        `siblings`, so that the node forks them all with one freeze."""
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if not node:
            raise BindError("the pool pod has no node")
        body: dict[str, Any] = {"pod_uid": pod["metadata"]["uid"], "workspace": str(workspace["id"])}
        if workspace.get("forkOf"):
            body["forkOf"] = str(workspace["forkOf"])
            if siblings:
                body["siblings"] = siblings
        elif workspace.get("size"):
            body["size"] = str(workspace["size"])
        if container_id:
            body["container_id"] = container_id
        return str(self._post(node, "/v1/bind", body, "the bind").get("how"))

    def fork(self, node: str, source: str, child: str, siblings: int | None = None) -> int:
        """Make `child` a fork of `source` in object storage on `node`, where the source is
        mounted: that node's daemon freezes it until its writes are replicated, so a child
        bound on another node starts from every write made before the fork. The fork's time
        in milliseconds; a child that exists already (an earlier pass made it) is kept."""
        body: dict[str, Any] = {"source": source, "children": [child]}
        if siblings:
            body["siblings"] = siblings
        answer = self._post(node, "/v1/fork", body, "the fork")
        error = (answer.get("children") or {}).get(child)
        if error and "already exists" not in str(error):
            raise BindError(f"warren-blockd on node {node} could not fork {source} into {child}: {error}")
        return int(answer.get("fork_ms") or 0)

    def capture(self, pod: Mapping[str, Any], workspace: str) -> dict[str, Any]:
        """Freeze and checkpoint the running pod's gVisor sandbox and store the image, bound
        to `workspace` as proven in storage after it (warren_blockd.memory): the image's
        id, workspace_seq, bytes and times. The sandbox stays frozen."""
        body = {"pod_uid": pod["metadata"]["uid"], "workspace": workspace}
        return self._post(_node_of(pod), "/v1/capture", body, "the capture")

    def discard(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Kill the sandbox a capture left frozen, once its pod is being deleted (a frozen
        sandbox answers none of the runtime's signals)."""
        return self._post(_node_of(pod), "/v1/discard", {"pod_uid": pod["metadata"]["uid"]}, "the discard")

    def stage(
        self, node: str, image: str, workspace: str, workspace_seq: int, into: str | None = None
    ) -> dict[str, Any]:
        """Fetch and verify `image` on `node` for a pod to be restored from: its `path` there.
        Refused (BindError, naming why) unless `workspace` is at write record `workspace_seq`
        (what storage proved once the captured pod was gone). With `into`, the pod gets that
        new workspace, a fork of `workspace` at that record, instead."""
        body: dict[str, Any] = {"image": image, "workspace": workspace, "workspace_seq": workspace_seq}
        if into is not None:
            body["into"] = into
        return self._post(node, "/v1/stage", body, "the staging")

    def place(self, node: str, staged: str, slot: str) -> dict[str, Any]:
        """Put the image staged at `staged` on `node` where the resume slot `slot` (a pod's
        name) waits for it: that pod's sandbox restores from it at once."""
        body = {"staged": staged, "slot": slot}
        return self._post(node, "/v1/place", body, "placing the image in the slot")

    def release(self, node: str, slot: str) -> dict[str, Any]:
        """End the wait of the resume slot `slot` on `node` without an image: its containers
        start afresh at once, so that its pod, being deleted, can go."""
        return self._post(node, "/v1/release", {"slot": slot}, "releasing the slot")

    def _post(self, node: str, path: str, body: Mapping[str, Any], doing: str) -> dict[str, Any]:
        for attempt in range(2):
            address = self._address(node, fresh=attempt > 0)
            try:
                answer = self._http.post(
                    f"http://{address}:{self.options.port}{path}",
                    json=body,
                    headers={"Authorization": f"Bearer {self.options.token}"},
                )
            except httpx.ConnectError:
                continue  # the plugin's pod was replaced (a rollout): look again, once
            except httpx.HTTPError as exc:
                raise BindError(f"warren-blockd on node {node} did not answer {doing}: {exc}") from exc
            if answer.status_code != httpx.codes.OK:
                raise BindError(f"warren-blockd on node {node} refused {doing}: {_message(answer)}")
            found: dict[str, Any] = answer.json()
            return found
        raise BindError(f"warren-blockd on node {node} could not be reached for {doing}")

    def _address(self, node: str, *, fresh: bool) -> str:
        with self._lock:
            if not fresh and node in self._addresses:
                return self._addresses[node]
        found = self.kube.request(
            "GET",
            self.kube.pods_path(self.options.namespace),
            query={"labelSelector": self.options.selector, "fieldSelector": f"spec.nodeName={node}"},
        )
        ready = [
            p
            for p in found.get("items") or []
            if (p.get("status") or {}).get("podIP")
            and not p["metadata"].get("deletionTimestamp")
            and _ready(p)
        ]
        if not ready:
            raise BindError(f"no ready warren-blockd pod on node {node}")
        # During a rollout the newest one serves: it has taken the node's workspaces over.
        newest = max(ready, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
        address = str(newest["status"]["podIP"])
        with self._lock:
            self._addresses[node] = address
        return address


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _message(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("message") or answer.text)
    except ValueError:
        return answer.text[:500]


def _node_of(pod: Mapping[str, Any]) -> str:
    """The node a pod runs on; a pod not placed yet has no sandbox to capture or discard."""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if not node:
        raise BindError("the pod has no node")
    return node
