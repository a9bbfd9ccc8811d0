"""The control plane's own identity on the local cluster: not the admin's.

`warren apply` made the warren-controller ServiceAccount and bound it to the
warren:controller ClusterRole (manifests/rbac.yaml.j2): Sandboxes, their pods, exec and
events, nothing of the floor. The control plane gets a kubeconfig for exactly that account,
through a token Secret that the cluster's token controller fills in. The token lives as long
as the Secret: deleting the Secret revokes it, and the next `up` makes a new one.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from warren import kube

NAMESPACE = "warren-system"
SERVICE_ACCOUNT = "warren-controller"
TOKEN_SECRET = "warren-control-token"  # noqa: S105  # the Secret's name, not a secret
HTTP_NOT_FOUND, HTTP_CONFLICT = 404, 409


class AccessError(RuntimeError):
    pass


def _secret_body() -> client.V1Secret:
    return client.V1Secret(
        type="kubernetes.io/service-account-token",
        metadata=client.V1ObjectMeta(
            name=TOKEN_SECRET,
            namespace=NAMESPACE,
            labels={"app.kubernetes.io/part-of": "warren"},
            annotations={"kubernetes.io/service-account.name": SERVICE_ACCOUNT},
        ),
    )


def service_account_token(admin_kubeconfig: Path, timeout: float = 60.0) -> str:
    """The token of the warren-controller ServiceAccount, making its Secret if needed."""
    core = client.CoreV1Api(kube.api_client(admin_kubeconfig))
    try:
        return _token(core, timeout)
    except urllib3.exceptions.HTTPError as exc:
        raise AccessError(f"the cluster's API server does not answer ({exc}): is the cluster up?") from None
    except ApiException as exc:
        raise AccessError(f"the cluster refused: {exc.status} {exc.reason}: {exc.body}") from None


def _token(core: client.CoreV1Api, timeout: float) -> str:
    try:
        core.read_namespaced_service_account(SERVICE_ACCOUNT, NAMESPACE)
    except ApiException as exc:
        if exc.status == HTTP_NOT_FOUND:
            raise AccessError(
                f"ServiceAccount {NAMESPACE}/{SERVICE_ACCOUNT} does not exist: run `warren apply` first"
            ) from None
        raise
    try:
        core.create_namespaced_secret(NAMESPACE, _secret_body())
    except ApiException as exc:
        if exc.status != HTTP_CONFLICT:
            raise
    deadline = time.monotonic() + timeout
    while True:
        secret = core.read_namespaced_secret(TOKEN_SECRET, NAMESPACE)
        token = (secret.data or {}).get("token")
        if token:
            return base64.b64decode(token).decode()
        if time.monotonic() > deadline:
            raise AccessError(
                f"Secret {NAMESPACE}/{TOKEN_SECRET} got no token within {timeout:.0f}s: "
                "is kube-controller-manager running (`warren cluster status`)?"
            )
        time.sleep(0.5)


def kubeconfig_for_token(admin_kubeconfig: Path, token: str) -> str:
    """A kubeconfig for the same API server and CA as the admin's, as the token's account."""
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"])
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "warren", "cluster": cluster}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "warren-control", "context": {"cluster": "warren", "user": SERVICE_ACCOUNT}}],
        "current-context": "warren-control",
    }
    return yaml.safe_dump(doc, sort_keys=False)
