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


def apply(
    api: client.ApiClient,
    objects: Iterable[dict[str, Any]],
    progress: Callable[[str], None] = lambda _m: None,
    dry_run: bool = False,
) -> list[str]:
    """Server-side apply each object in order; CRDs are waited for until Established."""
    dyn = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    applied = []
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace")
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=kind)
        try:
            resource.server_side_apply(
                body=obj,
                name=name,
                namespace=namespace,
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                dry_run="All" if dry_run else None,
            )
        except ApiException as exc:
            raise RuntimeError(
                f"applying {kind} {name} failed: {exc.status} {exc.reason}: {exc.body}"
            ) from None
        label = f"{kind}/{name}" + (f" -n {namespace}" if namespace else "")
        applied.append(label)
        progress(f"applied {label}")
        if kind == "CustomResourceDefinition" and not dry_run:
            wait_crd_established(api, name)
            dyn = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]  # rediscover so the new kind resolves
    return applied


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
