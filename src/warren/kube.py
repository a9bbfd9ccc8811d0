"""The one module that talks to the Kubernetes API for the CLI (apply, wait)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

FIELD_MANAGER = "warren"


def api_client(kubeconfig: Path, as_user: str | None = None) -> client.ApiClient:
    """A client for the cluster in `kubeconfig`; `as_user` impersonates that user (who
    then has only the groups every authenticated user has)."""
    if not kubeconfig.is_file():
        raise FileNotFoundError(
            f"kubeconfig {kubeconfig} does not exist: run `warren cluster up` or pass --kubeconfig"
        )
    api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    if as_user:
        api.set_default_header("Impersonate-User", as_user)  # type: ignore[no-untyped-call]
    return api


# What the server fills in or moves on every write: not part of "did this apply change it".
_VOLATILE = ("resourceVersion", "managedFields", "generation", "creationTimestamp", "uid")


def _content(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _VOLATILE}
    return {**obj, "metadata": meta}


def apply(
    api: client.ApiClient,
    objects: Iterable[dict[str, Any]],
    progress: Callable[[str], None] = lambda _m: None,
    dry_run: bool = False,
) -> list[str]:
    """Server-side apply each object in order; CRDs are waited for until Established.
    Returns the labels of the objects this apply changed (or, with `dry_run`, would change)."""
    dyn = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    changed = []
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace")
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=kind)
        try:
            before = _read(resource, name, namespace)
            result = resource.server_side_apply(
                body=obj,
                name=name,
                namespace=namespace,
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                dry_run="All" if dry_run else None,
            ).to_dict()
        except ApiException as exc:
            raise RuntimeError(
                f"applying {kind} {name} failed: {exc.status} {exc.reason}: {exc.body}"
            ) from None
        label = f"{kind}/{name}" + (f" -n {namespace}" if namespace else "")
        # A no-op server-side apply leaves the object (and its resourceVersion) as it was.
        if _content(before) != _content(result):
            changed.append(label)
            progress(f"{'would change' if dry_run else 'applied'} {label}")
        if kind == "CustomResourceDefinition" and not dry_run:
            wait_crd_established(api, name)
            dyn = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]  # rediscover so the new kind resolves
    return changed


def _read(resource: Any, name: str, namespace: str | None) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = resource.get(name=name, namespace=namespace).to_dict()
    except ApiException as exc:
        if exc.status == 404:  # noqa: PLR2004
            return None
        raise
    return found


def wait_crd_established(api: client.ApiClient, name: str, timeout: float = 60) -> None:
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(name)
        for cond in (crd.status and crd.status.conditions) or []:
            if cond.type == "Established" and cond.status == "True":
                return
        time.sleep(0.5)
    raise TimeoutError(f"CRD {name} not Established after {timeout}s")
