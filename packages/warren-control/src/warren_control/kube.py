"""The Kubernetes API, behind one module: plain JSON objects in and out, exactly as the API
server sends them, so callers never meet the client library's model classes and a client
upgrade touches only this file."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from warren_control.podspec import GROUP, PLURAL, POOL_PLURAL, VERSION

Obj = dict[str, Any]

FIELD_MANAGER = "warren-control"
REQUEST_TIMEOUT = (5.0, 30.0)  # connect, read (seconds)
POOL_SIZE = 64

__all__ = ["ApiException", "Kube", "Obj", "error_message"]


def error_message(exc: ApiException) -> str:
    """The API server's own explanation of a refusal (an admission policy's message,
    a validation error), falling back to the HTTP reason."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except ValueError:
        message = None
    return str(message or exc.body or exc.reason)


@dataclass
class Kube:
    api: client.ApiClient

    @classmethod
    def connect(cls, kubeconfig: str | None, pool: int = POOL_SIZE) -> Kube:
        """From a kubeconfig file, or from the pod's service account when None. `pool`
        connections are kept open: the controller's handler and finalizer threads share the
        client, and the library's default of 10 makes it open a TLS connection per call."""
        configuration = client.Configuration()
        if kubeconfig is None:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
        configuration.connection_pool_maxsize = pool
        return cls(client.ApiClient(configuration))

    @property
    def configuration(self) -> client.Configuration:
        configuration: client.Configuration = self.api.configuration
        return configuration

    def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        serialized = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*serialized, _request_timeout=REQUEST_TIMEOUT)
        data: bytes | None = response.read()  # type: ignore[no-untyped-call]
        text = data.decode() if data else ""
        if not HTTPStatus.OK <= response.status < HTTPStatus.MULTIPLE_CHOICES:
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        result: Obj = json.loads(text) if text else {}
        return result

    def list_with_version(self, path: str, query: Mapping[str, str] | None = None) -> tuple[list[Obj], str]:
        """A collection and the resourceVersion to watch it from."""
        result = self.request("GET", path, query=query)
        items: list[Obj] = result.get("items") or []
        return items, str((result.get("metadata") or {}).get("resourceVersion") or "")

    def watch(
        self,
        path: str,
        resource_version: str,
        *,
        query: Mapping[str, str] | None = None,
        timeout_s: int = 300,
        opened: Callable[[Any], object] = lambda _response: None,
    ) -> Iterator[Obj]:
        """Watch events ({"type", "object"}) of a collection from a resourceVersion, as they
        come, until the server ends the watch (after about timeout_s). Bookmarks are
        included (they carry the version to resume from); an ERROR event (410 Gone: the
        version is too old) is yielded for the caller to relist. `opened` gets the open
        response (urllib3's), whose `shutdown()` ends a wait for the next event at once."""
        params = {
            **(query or {}),
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        serialized = self.api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=list(params.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*serialized, _request_timeout=(5.0, timeout_s + 30.0))
        if not HTTPStatus.OK <= response.status < HTTPStatus.MULTIPLE_CHOICES:
            data: bytes | None = response.read()  # type: ignore[no-untyped-call]
            raise ApiException.from_response(http_resp=response, body=(data or b"").decode(), data=None)
        raw = response.response
        opened(raw)
        pending = b""
        try:
            for chunk in raw.stream(amt=None, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            raw.release_conn()

    # Nodes

    def read_node(self, name: str) -> Obj | None:
        try:
            return self.request("GET", f"/api/v1/nodes/{quote(name)}")
        except ApiException as exc:
            if exc.status == HTTPStatus.NOT_FOUND:
                return None
            raise

    # Pods

    @staticmethod
    def pods_path(namespace: str, name: str | None = None) -> str:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods"
        return f"{path}/{quote(name)}" if name else path

    def read_pod(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.request("GET", self.pods_path(namespace, name))
        except ApiException as exc:
            if exc.status == HTTPStatus.NOT_FOUND:
                return None
            raise

    def create_pod(self, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj:
        query = {"fieldManager": FIELD_MANAGER}
        if dry_run:
            query["dryRun"] = "All"
        return self.request("POST", self.pods_path(namespace), body=body, query=query)

    def delete_pod(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        force: bool = False,
    ) -> bool:
        """Delete a pod (gracefully, by its own grace period); False if it was gone. With
        a uid, only that incarnation is deleted: a newer pod of the same name survives; with
        a resourceVersion, only if nothing changed it since (a pool pod just claimed stays).
        `force`: at once, without its kubelet's confirmation (a lost node's pod)."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if force:
            options["gracePeriodSeconds"] = 0
        preconditions = {"uid": uid, "resourceVersion": resource_version}
        if preconditions := {k: v for k, v in preconditions.items() if v}:
            options["preconditions"] = preconditions
        try:
            self.request("DELETE", self.pods_path(namespace, name), body=options)
        except ApiException as exc:
            if exc.status in {HTTPStatus.NOT_FOUND, HTTPStatus.CONFLICT}:  # gone, or another incarnation
                return False
            raise
        return True

    def patch_pod(self, namespace: str, name: str, patch: Obj) -> Obj:
        """A merge patch of a pod's metadata. With metadata.resourceVersion in the patch, the
        server applies it only to that version (409 otherwise): how a claim stays exclusive."""
        return self.request(
            "PATCH",
            self.pods_path(namespace, name),
            body=patch,
            query={"fieldManager": FIELD_MANAGER},
            content_type="application/merge-patch+json",
        )

    def add_ephemeral_container(
        self, namespace: str, name: str, container: Obj, resource_version: str | None = None
    ) -> Obj:
        """Add a container to a running pod (its ephemeralcontainers subresource); with
        `resource_version`, only to that version of the pod (409 once it has changed)."""
        body: Obj = {"spec": {"ephemeralContainers": [container]}}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.request(
            "PATCH",
            self.pods_path(namespace, name) + "/ephemeralcontainers",
            body=body,
            query={"fieldManager": FIELD_MANAGER},
            content_type="application/strategic-merge-patch+json",
        )

    def list_pods(self, namespace: str, label_selector: str) -> list[Obj]:
        result = self.request("GET", self.pods_path(namespace), query={"labelSelector": label_selector})
        items: list[Obj] = result.get("items") or []
        return items

    # Sandboxes

    @staticmethod
    def sandboxes_path(namespace: str, name: str | None = None) -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}"
        return f"{path}/{quote(name)}" if name else path

    def read_sandbox(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.request("GET", self.sandboxes_path(namespace, name))
        except ApiException as exc:
            if exc.status == HTTPStatus.NOT_FOUND:
                return None
            raise

    def create_sandbox(self, namespace: str, body: Obj) -> Obj:
        return self.request("POST", self.sandboxes_path(namespace), body=body)

    def patch_sandbox(self, namespace: str, name: str, patch: Obj) -> Obj:
        return self.request(
            "PATCH",
            self.sandboxes_path(namespace, name),
            body=patch,
            content_type="application/merge-patch+json",
        )

    def json_patch_sandbox(self, namespace: str, name: str, ops: list[Obj]) -> Obj:
        """A JSON patch (RFC 6902): its "test" operations make a change conditional on
        what the object holds, which a merge patch cannot."""
        return self.request(
            "PATCH",
            self.sandboxes_path(namespace, name),
            body=ops,
            content_type="application/json-patch+json",
        )

    def delete_sandbox(self, namespace: str, name: str) -> bool:
        try:
            self.request("DELETE", self.sandboxes_path(namespace, name))
        except ApiException as exc:
            if exc.status == HTTPStatus.NOT_FOUND:
                return False
            raise
        return True

    def list_sandboxes(self, namespace: str) -> list[Obj]:
        items: list[Obj] = self.request("GET", self.sandboxes_path(namespace)).get("items") or []
        return items

    def patch_sandbox_status(self, namespace: str, name: str, status: Obj) -> Obj:
        return self._patch_status(self.sandboxes_path(namespace, name), status)

    def _patch_status(self, path: str, status: Obj) -> Obj:
        """A merge patch of an object's status subresource: only the fields given change, so
        what other writers keep there (a Sandbox's lastActivityTime) survives."""
        return self.request(
            "PATCH",
            path + "/status",
            body={"status": status},
            query={"fieldManager": FIELD_MANAGER},
            content_type="application/merge-patch+json",
        )

    # SandboxPools

    @staticmethod
    def pools_path(namespace: str, name: str | None = None) -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{POOL_PLURAL}"
        return f"{path}/{quote(name)}" if name else path

    def patch_pool_status(self, namespace: str, name: str, status: Obj) -> Obj:
        return self._patch_status(self.pools_path(namespace, name), status)
