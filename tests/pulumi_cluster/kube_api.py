"""A minimal client for the install-path tests: any object by its apiVersion, kind and name,
as the throw-away cluster's admin (warren_common.kubecluster's client, the standard library
over a client certificate), so the tests need neither a discovery cache in /tmp nor the
Kubernetes client's untyped API."""

from __future__ import annotations

from dataclasses import dataclass

from warren_common.kubecluster import ApiError, Client, Obj

__all__ = ["Api", "Obj"]


@dataclass(frozen=True)
class Resource:
    """Where objects of one kind live in the API."""

    group_version: str  # "v1" or "group/version"
    plural: str
    namespaced: bool

    def path(self, name: str, namespace: str | None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        scope = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{base}{scope}/{self.plural}/{name}"


class Api:
    """Objects read and deleted by what they are, the kinds found by discovery."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._resources: dict[tuple[str, str], Resource] = {}

    def resource(self, api_version: str, kind: str) -> Resource:
        """Discovery for one kind (asked again for every miss: a CRD adds kinds at run time)."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for item in self.client.request("GET", base).get("resources") or []:
                if "/" in item["name"]:
                    continue  # a subresource (namespaces/status)
                self._resources[(api_version, item["kind"])] = Resource(
                    api_version, item["name"], bool(item["namespaced"])
                )
        if key not in self._resources:
            raise LookupError(f"the API server serves no {kind} in {api_version}")
        return self._resources[key]

    def path_of(self, obj: Obj) -> str:
        meta = obj["metadata"]
        return self.resource(obj["apiVersion"], obj["kind"]).path(meta["name"], meta.get("namespace"))

    def get(self, obj: Obj) -> Obj | None:
        """The live object `obj` names (its kind, namespace and name), or None."""
        try:
            return self.client.request("GET", self.path_of(obj))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, obj: Obj) -> None:
        try:
            self.client.request("DELETE", self.path_of(obj))
        except ApiError as exc:
            if exc.status != 404:
                raise
