"""`warren-control install`: what an install makes on the cluster itself, run by the
rendered install Job in warren-system, so that no secret value is ever in rendered output,
the repository or the bundle.

1. The Secrets that are missing (an existing one is never replaced: rotation is its own act):
   warren-stamp-key (the edge's identity stamp key), warren-secrets-key (what organization
   secrets are sealed under, vault.py), warren-blockd-bind (the token of the
   workspace daemons' bind API, which the controller calls at a claim); with embedded stores also
   warren-postgres (the superuser's password), warren-database (its URL) and
   warren-object-store (S3 credentials, and SeaweedFS's identity file). With external
   stores, warren-database and warren-object-store are the operator's: their absence is an
   error that names them. With ambient object-store credentials (the pods' cloud identity,
   e.g. EKS Pod Identity) there is no warren-object-store to look for.
2. Once the database answers: the records schema, then on the first run only the first
   organization and its API key, which goes into the Secret warren-first-key.
"""

from __future__ import annotations

import argparse
import base64
import json
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from urllib.parse import quote

from warren_control.kube import ApiException, Kube, error_message

FIRST_KEY = "warren-first-key"
DATABASE_PORT = 5432


class InstallError(RuntimeError):
    """What stops an install, phrased for the operator."""


@dataclass(frozen=True)
class Plan:
    namespace: str
    stores: str  # embedded | external
    database_host: str  # embedded: the database's Service
    org: str = "default"
    user: str = "admin"
    database_wait_s: float = 600.0
    object_store_credentials: str = "secret"  # secret | ambient (external stores only)


def _secret_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/secrets" + (f"/{name}" if name else "")


def read_secret(kube: Kube, namespace: str, name: str) -> dict[str, str] | None:
    try:
        secret = kube.request("GET", _secret_path(namespace, name))
    except ApiException as exc:
        if exc.status == HTTPStatus.NOT_FOUND:
            return None
        raise
    return {key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}


def ensure_secret(kube: Kube, namespace: str, name: str, make: Callable[[], dict[str, str]]) -> bool:
    """Create the Secret from `make()` unless it exists; True if this call made it."""
    if read_secret(kube, namespace, name) is not None:
        return False
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "warren"}},
        "type": "Opaque",
        "stringData": make(),
    }
    try:
        kube.request("POST", _secret_path(namespace), body=body)
    except ApiException as exc:
        if exc.status == HTTPStatus.CONFLICT:  # another run made it first: theirs stands
            return False
        raise
    return True


def _object_store() -> dict[str, str]:
    access, secret = "warren" + secrets.token_hex(8), secrets.token_urlsafe(32)
    identity = {
        "identities": [
            {
                "name": "warren",
                "credentials": [{"accessKey": access, "secretKey": secret}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    return {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret, "s3.json": json.dumps(identity)}


def _report(say: Callable[[str], None], name: str, made: bool) -> None:
    say(f"secret {name}: {'made' if made else 'exists'}")


def _database_url(password: str, host: str) -> str:
    return f"postgresql+psycopg://postgres:{quote(password, safe='')}@{host}:{DATABASE_PORT}/postgres"


# With external stores: the operator's Secrets, and the keys each must have.
EXTERNAL = {
    "warren-database": ("url",),
    "warren-object-store": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
}


def make_secrets(kube: Kube, plan: Plan, say: Callable[[str], None]) -> None:
    ns = plan.namespace
    _report(
        say,
        "warren-stamp-key",
        ensure_secret(kube, ns, "warren-stamp-key", lambda: {"key": secrets.token_hex(32)}),
    )
    _report(
        say,
        "warren-secrets-key",
        ensure_secret(kube, ns, "warren-secrets-key", lambda: {"key": secrets.token_hex(32)}),
    )
    _report(
        say,
        "warren-blockd-bind",
        ensure_secret(kube, ns, "warren-blockd-bind", lambda: {"token": secrets.token_hex(32)}),
    )
    if plan.stores == "embedded":
        made = ensure_secret(kube, ns, "warren-postgres", lambda: {"password": secrets.token_urlsafe(32)})
        _report(say, "warren-postgres", made)
        password = (read_secret(kube, ns, "warren-postgres") or {}).get("password")
        if not password:
            raise InstallError("Secret warren-postgres has no key 'password': delete it to have one made")
        url = _database_url(password, plan.database_host)
        _report(say, "warren-database", ensure_secret(kube, ns, "warren-database", lambda: {"url": url}))
        _report(say, "warren-object-store", ensure_secret(kube, ns, "warren-object-store", _object_store))
        return
    if plan.object_store_credentials == "ambient":
        say("object store: the pods' own cloud identity (no warren-object-store Secret)")
    for name, keys in EXTERNAL.items():
        if name == "warren-object-store" and plan.object_store_credentials == "ambient":
            continue
        found = read_secret(kube, ns, name)
        missing = [key for key in keys if not (found or {}).get(key)]
        if found is None or missing:
            problem = "it is missing" if found is None else "it lacks " + ", ".join(missing)
            literals = " ".join(f"--from-literal={key}=..." for key in keys)
            raise InstallError(
                f"stores: external needs the Secret {name} in {ns} with {', '.join(keys)} ({problem}): "
                f"kubectl -n {ns} create secret generic {name} {literals}"
            )
        say(f"secret {name}: given")


def _wait_for_database(url: str, timeout_s: float, say: Callable[[str], None]) -> None:
    from sqlalchemy import text

    from warren_control import db

    deadline = time.monotonic() + timeout_s
    engine = db.make_engine(url)
    try:
        while True:
            try:
                with engine.connect() as connection:
                    connection.execute(text("SELECT 1"))
                return
            except Exception as exc:  # any failure to connect is retried until the deadline
                if time.monotonic() > deadline:
                    raise InstallError(
                        f"the database did not answer within {timeout_s:.0f} s: {exc}"
                    ) from None
                say(f"waiting for the database: {type(exc).__name__}")
                time.sleep(3)
    finally:
        engine.dispose()


def first_key(kube: Kube, plan: Plan, url: str, scratch: Path, say: Callable[[str], None]) -> None:
    """The schema, then the first organization's key into Secret warren-first-key. The key
    is written to `scratch` (the pod's emptyDir, which outlives a container restart) before
    its record commits, so a run that stopped after the commit still delivers it."""
    from warren_control import admin

    key_file = scratch / "first-key"
    if read_secret(kube, plan.namespace, FIRST_KEY) is None and key_file.is_file():
        token = key_file.read_text().strip()
    else:
        issued = admin.bootstrap(url, key_file, org_name=plan.org, subject=plan.user)
        say("records schema is up to date")
        if issued is None:
            say(f"organization {plan.org!r} exists: its keys are left as they are")
            return
        token = issued
    ensure_secret(kube, plan.namespace, FIRST_KEY, lambda: {"key": token, "org": plan.org, "user": plan.user})
    key_file.unlink(missing_ok=True)
    say(
        f"secret {FIRST_KEY}: the first API key of {plan.org!r} "
        f"(kubectl -n {plan.namespace} get secret {FIRST_KEY})"
    )


def run(kube: Kube, plan: Plan, scratch: Path, say: Callable[[str], None]) -> None:
    make_secrets(kube, plan, say)
    url = (read_secret(kube, plan.namespace, "warren-database") or {}).get("url", "")
    _wait_for_database(url, plan.database_wait_s, say)
    first_key(kube, plan, url, scratch, say)


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = commands.add_parser("install", help="make the platform's Secrets and first key on the cluster")
    parser.add_argument("--namespace", default="warren-system")
    parser.add_argument("--stores", choices=["embedded", "external"], default="embedded")
    parser.add_argument("--database-host", default="warren-postgres.warren-system.svc")
    parser.add_argument(
        "--object-store-credentials",
        choices=["secret", "ambient"],
        default="secret",
        help="ambient: S3 requests are signed with the pods' cloud identity (external stores only)",
    )
    parser.add_argument("--org", default="default")
    parser.add_argument("--user", default="admin")
    parser.add_argument("--database-wait", type=float, default=600.0, help="seconds")
    parser.add_argument("--scratch", default="/tmp", help="survives a restart of the container (emptyDir)")  # noqa: S108
    parser.add_argument("--kubeconfig", help="kubeconfig file; the pod's service account when absent")
    parser.set_defaults(handler=cmd_install)


def cmd_install(args: argparse.Namespace) -> int:
    if args.object_store_credentials == "ambient" and args.stores != "external":
        print("error: --object-store-credentials=ambient needs --stores=external", file=sys.stderr)
        return 2
    plan = Plan(
        args.namespace,
        args.stores,
        args.database_host,
        args.org,
        args.user,
        args.database_wait,
        args.object_store_credentials,
    )

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        run(Kube.connect(args.kubeconfig), plan, Path(args.scratch), say)
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ApiException as exc:
        print(f"error: the API server refused: {error_message(exc)}", file=sys.stderr)
        return 1
    return 0
