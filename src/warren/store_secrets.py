"""The external stores' Secrets on the cluster (`services.stores: external`), made from the
credentials an installer read where the stores run: `warren-database` (key `url`) and
`warren-object-store` (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`; none with
`object_store_credentials: ambient`). `warren platform store-secrets` reads them on stdin.

Guarantees:
- No value is ever printed, logged, returned or put in an error message: only each Secret's
  name, what happened to it, and (for the URL) its host.
- A URL the pods cannot use is refused before anything is written: its driver must be the
  control plane's (`postgresql+psycopg`), and its host must not be loopback (a pod's
  loopback is its own, not the database host's).
- Idempotent: a Secret that already holds exactly these keys and values is left alone, so a
  second install changes nothing. One that differs (rotated credentials) is replaced, and the
  workloads that read it at start (warren-control, warren-blockd) are restarted as
  `kubectl rollout restart` does, so none keeps using the old value.
- The Secrets can be made before the workloads exist: the namespace is applied first, as
  `warren render` makes it, so the install Job finds them when it starts and the later
  `warren apply` finds the namespace as it is.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client

from warren import kube
from warren.config import SYSTEM_NAMESPACE, WarrenConfig
from warren.render import render

DATABASE = "warren-database"
OBJECT_STORE = "warren-object-store"
OBJECT_STORE_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
DRIVER = "postgresql+psycopg"
# The workloads that read these Secrets into their environment at start.
READERS = (("Deployment", "warren-control"), ("DaemonSet", "warren-blockd"))
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
FIELD_MANAGER = "warren-store-secrets"


class StoreSecretsError(ValueError):
    """The input cannot make the Secrets; the message names the fix (and never a value)."""


def parse_env(text: str) -> dict[str, str]:
    """KEY=value lines (an environment file such as the object store's credentials.env)."""
    found = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        found[key.strip().removeprefix("export ").strip()] = value.strip().strip("'\"")
    return found


def check_database_url(url: str) -> None:
    """Refuse a URL the control plane's pods cannot use (the message names its host only)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        raise StoreSecretsError(
            "the database URL is not a URL: the postgres role's URL file "
            "(postgres_url_file) should hold postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
        ) from None
    if parts.scheme != DRIVER:
        raise StoreSecretsError(
            f"the database URL's scheme is {parts.scheme or 'missing'}, not {DRIVER} (the control "
            "plane's driver): write it as postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
        )
    if not host or not parts.password or not parts.path.strip("/"):
        raise StoreSecretsError(
            "the database URL lacks a host, a password or a database name: "
            "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
        )
    if host == "localhost" or _loopback(host):
        raise StoreSecretsError(
            f"the database URL names {host}{f':{port}' if port else ''}, a loopback address: pods "
            "reach the database on the database host's own address. Set postgres_url_host to "
            "that address (and add it to postgres_listen_addresses) and run again."
        )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def wanted(document: object, config: WarrenConfig) -> dict[str, dict[str, str]]:
    """Secret name -> its data, from the input document
    {"database_url": "...", "object_store_credentials": "<credentials.env>"}."""
    services = config.services
    if not services.enabled or services.stores != "external":
        raise StoreSecretsError(
            "the stores' Secrets are for services.enabled with services.stores: external "
            f"(this configuration: enabled={services.enabled}, stores={services.stores})"
        )
    if not isinstance(document, Mapping):
        raise StoreSecretsError(
            'the input must be a JSON object: {"database_url": ..., "object_store_credentials": ...}'
        )
    unknown = sorted(set(document) - {"database_url", "object_store_credentials"})
    if unknown:
        raise StoreSecretsError(f"unknown input key(s) {', '.join(map(str, unknown))}")
    url = document.get("database_url")
    if not isinstance(url, str) or not url.strip():
        raise StoreSecretsError("database_url is missing: the URL file the postgres role writes")
    check_database_url(url.strip())
    result = {DATABASE: {"url": url.strip()}}
    if services.object_store_credentials == "secret":
        text = document.get("object_store_credentials")
        if not isinstance(text, str):
            raise StoreSecretsError(
                "object_store_credentials is missing: the credentials.env the object_store role writes"
            )
        env = parse_env(text)
        missing = [key for key in OBJECT_STORE_KEYS if not env.get(key)]
        if missing:
            raise StoreSecretsError(
                f"the object store's credentials lack {', '.join(missing)}: delete the object_store "
                "role's credentials file on the store host and run again to have it made"
            )
        result[OBJECT_STORE] = {key: env[key] for key in OBJECT_STORE_KEYS}
    return result


def _decoded(secret: Any) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}


def _body(name: str, data: Mapping[str, str], resource_version: str | None = None) -> client.V1Secret:
    return client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=SYSTEM_NAMESPACE,
            labels={"app.kubernetes.io/part-of": "warren"},
            resource_version=resource_version,
        ),
        type="Opaque",
        data={key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    )


def apply(
    api: client.ApiClient,
    config: WarrenConfig,
    secrets: Mapping[str, Mapping[str, str]],
    dry_run: bool = False,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, str]:
    """Make or update each Secret; name -> created | updated | unchanged (or, with
    `dry_run`, what would happen). Restarts the readers when one was updated."""
    core = client.CoreV1Api(api)
    namespace = [
        o for o in render(config) if o["kind"] == "Namespace" and o["metadata"]["name"] == SYSTEM_NAMESPACE
    ]
    kube.apply(api, namespace, progress=progress, dry_run=dry_run)
    try:
        core.read_namespace(SYSTEM_NAMESPACE)
        have_namespace = True
    except client.ApiException as exc:
        if exc.status != 404 or not dry_run:  # noqa: PLR2004
            raise
        have_namespace = False  # a dry run against a cluster without it yet
    outcome: dict[str, str] = {}
    for name, data in secrets.items():
        found: Any = None
        if have_namespace:
            try:
                found = core.read_namespaced_secret(name, SYSTEM_NAMESPACE)
            except client.ApiException as exc:
                if exc.status != 404:  # noqa: PLR2004
                    raise
        dry = "All" if dry_run else None
        if found is None:
            if have_namespace:
                core.create_namespaced_secret(SYSTEM_NAMESPACE, _body(name, data), dry_run=dry)
            outcome[name] = "created"
        elif _decoded(found) != dict(data):
            core.replace_namespaced_secret(
                name, SYSTEM_NAMESPACE, _body(name, data, found.metadata.resource_version), dry_run=dry
            )
            outcome[name] = "updated"
        else:
            outcome[name] = "unchanged"
        would = "would be " if dry_run and outcome[name] != "unchanged" else ""
        progress(f"secret {name}: {would}{outcome[name]}")
    if "updated" in outcome.values() and not dry_run:
        restart_readers(api, progress)
    return outcome


def restart_readers(api: client.ApiClient, progress: Callable[[str], None] = lambda _m: None) -> None:
    """Roll the workloads that read the Secrets at start, as `kubectl rollout restart` does
    (a pod template annotation of a field manager of its own, so `warren apply` neither owns
    nor removes it)."""
    apps = client.AppsV1Api(api)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}}
    patchers = {"Deployment": apps.patch_namespaced_deployment, "DaemonSet": apps.patch_namespaced_daemon_set}
    for kind, name in READERS:
        try:
            patchers[kind](
                name,
                SYSTEM_NAMESPACE,
                patch,
                field_manager=FIELD_MANAGER,
                _content_type="application/strategic-merge-patch+json",
            )
        except client.ApiException as exc:
            if exc.status == 404:  # noqa: PLR2004  # not applied yet: it starts with the new values
                continue
            raise
        progress(f"restarted {kind} {name}: it read the old credentials")
