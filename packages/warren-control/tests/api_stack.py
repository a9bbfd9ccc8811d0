"""Helpers for the API tests (the fixtures are in api_fixtures.py): the API end to end
without a cluster. Records on a real database, the API and the real edge served by uvicorn
on loopback, organizations with real API keys, and in place of the Kubernetes API server a
small stand-in speaking its HTTP protocol for Sandbox resources.

The stand-in validates every Sandbox it is given against the CRD's own schema (the
manifest in the repository), answers like the API server (201, 404, 409, 422 Status
objects, merge patches), and can be told to refuse the next creates, so the API's handling
of a cluster that says no is tested through the same client code that talks to the real
one. It runs no pods: a test may put a pod object in (`pods`) for the API to read, and otherwise
exec and files answer "not running" here and are tested on the real cluster
(test_api_cluster.py).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema_rs
import yaml
from kubernetes import client as k8s
from localservers import serve_asgi
from sqlalchemy.orm import Session, sessionmaker
from warren_control import store
from warren_control.api.app import make_api
from warren_control.api.service import ApiSettings
from warren_control.db import make_engine, session_factory
from warren_control.edge import make_edge
from warren_control.identity import HEADER, Identity, sign
from warren_control.kube import Kube
from warren_control.sdk import Client

STAMP_KEY = b"api-tests-stamp-key-0123456789abcdef"
NAMESPACE = "warren-sandboxes"
CRD = Path(__file__).resolve().parents[3] / "manifests" / "warren.dev_sandboxes.yaml"
_SANDBOXES = re.compile(r"^/apis/warren\.dev/v1alpha1/namespaces/([^/]+)/sandboxes(?:/([^/]+))?$")
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class StandIn:
    """The Sandbox part of a Kubernetes API server, in memory, over real HTTP."""

    url: str = ""
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # The next creates' fates: (status, message) refuses one, None lets one through.
    refuse_creates: list[tuple[int, str] | None] = field(default_factory=list)
    # Like a finalizer: DELETE marks the object (deletionTimestamp) and `finish_deletes` removes it.
    hold_deletes: bool = False
    # Called with the name of each object a DELETE removed, before the answer (the status
    # mirror recording it meanwhile).
    on_removed: Callable[[str], None] | None = None
    requests: list[tuple[str, str]] = field(default_factory=list)
    # Pods, by (namespace, name): only what a test puts here (the stand-in runs no controller).
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Every change gets the next resourceVersion and wakes the watches, as the API server's do.
    version: int = 0
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)
        crd = yaml.safe_load(CRD.read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        self.validator = jsonschema_rs.validator_for(schema)

    def kube(self) -> Kube:
        configuration = k8s.Configuration()
        configuration.host = self.url
        return Kube(k8s.ApiClient(configuration))

    def get(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        with self.lock:
            return self.objects.get((namespace, name))

    def set_status(self, name: str, status: dict[str, Any], namespace: str = NAMESPACE) -> None:
        """What the controller would write: the Sandbox's status subresource."""
        with self.lock:
            self.objects[(namespace, name)]["status"] = status
            self._changed(self.objects[(namespace, name)])

    def finish_deletes(self) -> None:
        with self.lock:
            for key in [k for k, o in self.objects.items() if o["metadata"].get("deletionTimestamp")]:
                self._changed(self.objects.pop(key))

    def _changed(self, obj: dict[str, Any]) -> None:
        """Called with the lock held, for an object just written (or just removed)."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.changed.notify_all()

    def watch(self, namespace: str, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        """A watch of one Sandbox (fieldSelector metadata.name=...): its next change after
        the resourceVersion asked from, or nothing once timeoutSeconds passed. The server
        may end a watch at any time; this one ends after one event."""
        name = query["fieldSelector"][0].removeprefix("metadata.name=")
        since = int(query["resourceVersion"][0] or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds", ["30"])[0])
        with self.lock:
            while (left := deadline - time.monotonic()) > 0:
                found = self.objects.get((namespace, name))
                version = int((found or {}).get("metadata", {}).get("resourceVersion") or 0)
                if found is None and self.version > since:
                    return [{"type": "DELETED", "object": {"metadata": {"name": name}}}]
                if found is not None and version > since:
                    return [{"type": "MODIFIED", "object": json.loads(json.dumps(found))}]
                self.changed.wait(left)
        return []

    def creates(self) -> int:
        return sum(1 for method, path in self.requests if method == "POST")

    def handle(  # noqa: PLR0911 (one answer per case, as the API server has)
        self, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any]:
        with self.lock:
            self.requests.append((method, path))
            pods = _PODS.match(path)
            if pods:
                pod = self.pods.get((pods[1], pods[2])) if method == "GET" else None
                if pod is None:
                    return 404, _status(404, "NotFound", f'pods "{pods[2]}" not found')
                return 200, pod
            match = _SANDBOXES.match(path)
            if not match:
                return 404, _status(404, "NotFound", "the server could not find the requested resource")
            namespace, name = match[1], match[2]
            if name is None and method == "POST":
                return self._create(namespace, body)
            if name is None and method == "GET":
                return 200, {"kind": "SandboxList", "items": self._list(namespace, query)}
            key = (namespace, name or "")
            found = self.objects.get(key)
            if found is None:
                return 404, _status(404, "NotFound", f'sandboxes.warren.dev "{name}" not found')
            if method == "GET":
                return 200, found
            if method == "PATCH":
                patched = _merge(found, body)
                errors = [e.message for e in self.validator.iter_errors(patched)]
                if errors:
                    return 422, _status(
                        422, "Invalid", f'Sandbox.warren.dev "{name}" is invalid: {errors[0]}'
                    )
                if patched.get("spec") != found.get("spec"):
                    patched["metadata"]["generation"] += 1
                self.objects[key] = patched
                self._changed(patched)
                return 200, patched
            if method == "DELETE":
                return self._delete(key, found)
            return 405, _status(405, "MethodNotAllowed", method)

    def _delete(self, key: tuple[str, str], found: dict[str, Any]) -> tuple[int, Any]:
        """Called with the lock held."""
        if self.hold_deletes:
            found["metadata"]["deletionTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._changed(found)
            return 200, found
        self._changed(self.objects.pop(key))
        if self.on_removed is not None:
            self.on_removed(key[1])
        return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def _create(self, namespace: str, body: Any) -> tuple[int, Any]:
        name = (body.get("metadata") or {}).get("name", "")
        fate = self.refuse_creates.pop(0) if self.refuse_creates else None
        if fate is not None:
            code, message = fate
            return code, _status(code, "Refused", f'Sandbox.warren.dev "{name}": {message}')
        errors = [e.message for e in self.validator.iter_errors(body)]
        if errors:
            return 422, _status(422, "Invalid", f'Sandbox.warren.dev "{name}" is invalid: {errors[0]}')
        if (namespace, name) in self.objects:
            return 409, _status(409, "AlreadyExists", f'sandboxes.warren.dev "{name}" already exists')
        obj = json.loads(json.dumps(body))
        obj["metadata"].update(
            namespace=namespace,
            uid=str(uuid.uuid4()),
            generation=1,
            creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self.objects[(namespace, name)] = obj
        self._changed(obj)
        return 201, obj

    def _list(self, namespace: str, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        wanted: dict[str, str] = {}
        for selector in query.get("labelSelector", []):
            for term in selector.split(","):
                label, _, value = term.partition("=")
                wanted[label] = value
        return [
            obj
            for (ns, _), obj in self.objects.items()
            if ns == namespace
            and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]


@dataclass
class _Server:
    standin: StandIn
    server: ThreadingHTTPServer
    thread: threading.Thread


def standin_handler(standin: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            query = parse_qs(parts.query)
            watched = _SANDBOXES.match(parts.path)
            if self.command == "GET" and "watch" in query and watched:
                # Events as lines, then the end of the stream (HTTP/1.0: the connection closes).
                events = standin.watch(watched[1], query)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"".join(json.dumps(e).encode() + b"\n" for e in events))
                return
            code, answer = standin.handle(self.command, parts.path, query, body)
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


# --- the stack ---------------------------------------------------------------------------------


@dataclass
class OrgHandle:
    id: str
    user_id: str
    token: str
    client: Client

    def identity(self) -> Identity:
        return Identity(self.id, self.user_id)

    def stamp(self) -> dict[str, str]:
        return {HEADER: sign(self.identity(), STAMP_KEY)}


@dataclass
class Stack:
    url: str  # the records database
    api: str  # the API itself (only the edge should reach it)
    edge: str
    sessions: sessionmaker[Session]
    standin: StandIn
    clients: list[Client] = field(default_factory=list)

    def org(self, name: str | None = None, **settings: Any) -> OrgHandle:
        """A new organization with one user and an API key, and an SDK client through the edge."""
        name = name or f"org-{uuid.uuid4().hex[:8]}"
        with self.sessions.begin() as session:
            org = store.create_org(session, name, **settings)
            user = store.create_user(session, org.id, f"{name}-admin")
            issued = store.issue_api_key(session, org.id, user.id, ["sandbox:read", "sandbox:write"])
        sdk = Client(self.edge, issued.token)
        self.clients.append(sdk)
        return OrgHandle(org.id, user.id, issued.token, sdk)

    def object_name(self, sandbox_id: str) -> str:
        with self.sessions() as session:
            record = session.get(store.Sandbox, sandbox_id)
            assert record is not None
            return record.object_name


def settings_for(url: str, standin: StandIn, **changes: Any) -> ApiSettings:
    options: dict[str, Any] = {
        "database_url": url,
        "stamp_key": STAMP_KEY,
        "kube": standin.kube(),
        "namespace": NAMESPACE,
        "workspaces": True,
    }
    options.update(changes)
    return ApiSettings(**options)


@contextmanager
def serve_stack(url: str, standin: StandIn, **changes: Any) -> Iterator[Stack]:
    """The API (with `changes` to its settings) and the edge in front of it, on `url`."""
    engine = make_engine(url)
    sessions = session_factory(engine)
    with serve_asgi(make_api(settings_for(url, standin, **changes))) as api:
        domain = changes.get("sandbox_domain")
        edge = make_edge(api, STAMP_KEY, store.DatabaseKeyResolver(sessions), None, sandbox_domain=domain)
        with serve_asgi(edge) as edge_url:
            stack = Stack(url=url, api=api, edge=edge_url, sessions=sessions, standin=standin)
            try:
                yield stack
            finally:
                for sdk in stack.clients:
                    sdk.close()
    engine.dispose()
