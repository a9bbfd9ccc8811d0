"""The egress gateway: sandboxes reach their organization's model and tool APIs through it,
and the credentials are added here, outside the guest, never inside it.

A sandbox sends plain HTTP to `{gateway}/{secret}/{host[:port]}/{path}`. The gateway knows
the sandbox by the address its connection comes from (the pod's address as the cluster
reports it, and the sandbox's record as the status mirror keeps it), never by anything the
request says; it checks that the sandbox is bound to the secret, that host, port and path
are one of the secret's destinations, and the secret's budget; then it dials TLS to that
destination itself (certificates verified, SNI the destination's own host) and adds the
value as the secret says. Every request, sent or refused, is audited (models.SecretUse).
Responses come back with the value replaced by its placeholder, should a destination echo
it.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from warren_control import secret_records
from warren_control.informer import Informer
from warren_control.kube import Kube, Obj
from warren_control.models import Sandbox, SandboxPhase, Secret, SecretUse
from warren_control.podspec import MANAGED_BY, MANAGED_BY_LABEL, SANDBOX_NAME_LABEL
from warren_control.vault import Destination, Injection, SealError, SecretBox, clean_request_path, placeholder

log = logging.getLogger(__name__)

UPSTREAM_TIMEOUT_S = 300.0
# Hop-by-hop headers, and those that would say where the request goes or came from: the
# gateway decides those itself.
DROPPED_REQUEST_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
    }
)
# The body is decoded and may be redacted, so its length and encoding are the gateway's.
DROPPED_RESPONSE_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",
        "trailer",
    }
)


@dataclass(frozen=True)
class Caller:
    """The sandbox a request came from, as the records know it."""

    sandbox_id: str
    org_id: str
    secret_ids: frozenset[str]


class PodAddresses:
    """Which Sandbox's pod holds an address, from a watch of the sandbox namespace's pods
    (only those the controller made, running and not being deleted; on `node` only, if
    given: the gateway there serves that node's pods alone)."""

    def __init__(self, kube: Kube, namespace: str, node: str | None = None) -> None:
        self._lock = threading.Lock()
        self._by_address: dict[str, str] = {}
        self._pods: dict[str, Obj] = {}
        query = {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"}
        if node:
            query["fieldSelector"] = f"spec.nodeName={node}"
        self.informer = Informer(
            kube,
            kube.pods_path(namespace),
            query=query,
            on_replace=self._replace,
            on_event=self._event,
        )

    def run(self, stop: threading.Event) -> None:
        threading.Thread(target=self.informer.run, args=(stop,), name="gateway-pods", daemon=True).start()

    def __call__(self, address: str) -> str | None:
        with self._lock:
            return self._by_address.get(address)

    def _replace(self, pods: list[Obj]) -> None:
        with self._lock:
            self._pods = {p["metadata"]["name"]: p for p in pods}
            self._index()

    def _event(self, kind: str, pod: Obj) -> None:
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(pod["metadata"]["name"], None)
            else:
                self._pods[pod["metadata"]["name"]] = pod
            self._index()

    def _index(self) -> None:
        by_address: dict[str, str] = {}
        for pod in self._pods.values():
            status, meta = pod.get("status") or {}, pod["metadata"]
            name = (meta.get("labels") or {}).get(SANDBOX_NAME_LABEL)
            address = status.get("podIP")
            if not name or not address or meta.get("deletionTimestamp") or status.get("phase") != "Running":
                continue
            if address in by_address:  # two pods claim it (a reuse the watch has half seen): neither
                by_address[address] = ""
                continue
            by_address[address] = str(name)
        self._by_address = {a: n for a, n in by_address.items() if n}


class Refused(Exception):  # noqa: N818 (an answer the gateway gives, not a fault)
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message

    def response(self) -> Response:
        return JSONResponse({"error": self.error, "message": self.message}, status_code=self.status)


@dataclass
class Use:
    """One request's audit record, filled in as it goes."""

    org_id: str
    source: str
    destination: str
    sandbox_id: str | None = None
    secret_id: str | None = None
    secret_name: str | None = None  # what the request named, for a refusal's record
    status: int = 0
    outcome: str = "sent"
    bytes_sent: int = 0
    bytes_received: int = 0
    started: float = field(default_factory=time.monotonic)


class Redactor:
    """Replaces `secret` with `mask` in a stream of chunks, also where it spans two."""

    def __init__(self, secret: bytes, mask: bytes) -> None:
        self.secret, self.mask, self._held = secret, mask, b""

    def feed(self, chunk: bytes) -> bytes:
        data = (self._held + chunk).replace(self.secret, self.mask)
        keep = len(self.secret) - 1
        # Hold back a tail that could be the start of the secret.
        self._held = data[-keep:] if keep else b""
        return data[: len(data) - len(self._held)]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held


class Gateway:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        box: SecretBox,
        callers: Callable[[str], str | None],
        *,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.sessions, self.box, self.callers = sessions, box, callers
        self.http = httpx.AsyncClient(
            verify=verify, follow_redirects=False, timeout=httpx.Timeout(UPSTREAM_TIMEOUT_S, connect=10.0)
        )

    async def handle(self, request: Request) -> Response:
        source = request.client.host if request.client else ""
        raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
        path = raw.decode("ascii", "replace")
        try:
            caller = await run_in_threadpool(self._caller, source)
        except Refused as refusal:
            log.info("refused a request from %s: %s", source, refusal.message)
            return refusal.response()
        named = path.split("/")[1] if path.count("/") else None
        use = Use(
            caller.org_id, source, f"{request.method} {path[:1024]}", caller.sandbox_id, secret_name=named
        )
        try:
            if request.method == "CONNECT":
                raise Refused(
                    405,
                    "no_tunnel",
                    "the gateway does not tunnel TLS: send plain HTTP to "
                    "$WARREN_GATEWAY_URL/SECRET/HOST/PATH and it dials the destination itself",
                )
            secret_name, authority, rest = _split(path)
            use.destination = f"{request.method} https://{authority}{rest}"
            secret, value, destination = await run_in_threadpool(
                self._authorize, caller, secret_name, authority, rest, use
            )
        except Refused as refusal:
            use.status, use.outcome = refusal.status, refusal.error
            await run_in_threadpool(self._audit, use)
            return refusal.response()
        return await self._forward(request, secret, value, destination=destination, path=rest, use=use)

    def _caller(self, source: str) -> Caller:
        name = self.callers(source)
        if not name:
            raise Refused(403, "unknown_sandbox", f"no running sandbox has the address {source}")
        with self.sessions() as session:
            record = session.scalars(select(Sandbox).where(Sandbox.object_name == name)).one_or_none()
            if record is None or record.phase is not SandboxPhase.RUNNING or record.being_deleted:
                raise Refused(403, "unknown_sandbox", f"no running sandbox has the address {source}")
            bound = (record.spec.get("secrets") or {}).get("ids") or []
            return Caller(record.id, record.org_id, frozenset(bound))

    def _authorize(
        self, caller: Caller, name: str, authority: str, path: str, use: Use
    ) -> tuple[Secret, str, Destination]:
        with self.sessions.begin() as session:
            secret = secret_records.named(session, caller.org_id, name)
            if secret is None:
                raise Refused(404, "no_secret", f"no secret {name!r} in this sandbox's organization")
            use.secret_id = secret.id
            if secret.revoked_at is not None:
                raise Refused(403, "revoked", f"secret {name!r} was revoked")
            if secret.id not in caller.secret_ids:
                raise Refused(403, "not_bound", f"this sandbox is not bound to secret {name!r}")
            destination = next(
                (
                    d
                    for d in map(Destination.parse, secret.destinations)
                    if d.authority() == authority and d.allows(path)
                ),
                None,
            )
            if destination is None:
                raise Refused(
                    403,
                    "not_a_destination",
                    f"secret {name!r} may go only to {', '.join(secret.destinations)}",
                )
            if (over := secret_records.over_budget(session, secret)) is not None:
                raise Refused(429, "over_budget", f"secret {name!r} is over its budget: {over}")
            try:
                value = secret_records.open_value(self.box, secret)
            except SealError as exc:
                log.error("%s", exc)
                raise Refused(500, "sealed", f"secret {name!r} cannot be opened by this gateway") from exc
            session.expunge(secret)
        return secret, value, destination

    async def _forward(
        self, request: Request, secret: Secret, value: str, *, destination: Destination, path: str, use: Use
    ) -> Response:
        injection = Injection.from_record(secret.injection)
        query = [(k, v) for k, v in request.query_params.multi_items() if k != injection.query]
        headers = [
            (k, v)
            for k, v in request.headers.items()
            if k.lower() not in DROPPED_REQUEST_HEADERS and k.lower() != (injection.header or "").lower()
        ]
        if injection.query is not None:
            query.append((injection.query, value))
        else:
            headers.append((str(injection.header), injection.header_value(value)))

        async def body() -> AsyncIterator[bytes]:
            async for chunk in request.stream():
                use.bytes_sent += len(chunk)
                yield chunk

        upstream = self.http.build_request(
            request.method,
            httpx.URL(f"https://{destination.authority()}{path}", params=query),
            headers=headers,
            content=body() if request.method not in {"GET", "HEAD"} else None,
        )
        try:
            answer = await self.http.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            use.status, use.outcome = 502, "upstream_failed"
            await run_in_threadpool(self._audit, use)
            message = str(exc).replace(value, placeholder(secret.name)) or type(exc).__name__
            return Refused(502, "upstream_failed", f"{destination.authority()}: {message}").response()
        use.status = answer.status_code
        redactor = Redactor(value.encode(), placeholder(secret.name).encode())

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.aiter_bytes():
                    use.bytes_received += len(chunk)
                    if out := redactor.feed(chunk):
                        yield out
                if tail := redactor.flush():
                    yield tail
            except httpx.HTTPError:
                use.outcome = "upstream_broke_off"
            finally:
                await answer.aclose()
                await run_in_threadpool(self._audit, use)

        kept = {
            k: v.replace(value, placeholder(secret.name))
            for k, v in answer.headers.items()
            if k.lower() not in DROPPED_RESPONSE_HEADERS
        }
        return StreamingResponse(relay(), status_code=answer.status_code, headers=kept)

    def _audit(self, use: Use) -> None:
        if use.secret_id is None and use.secret_name:
            with self.sessions() as session:
                named = secret_records.named(session, use.org_id, use.secret_name[:63])
                use.secret_id = named.id if named is not None else None
        record = SecretUse(
            org_id=use.org_id,
            secret_id=use.secret_id,
            sandbox_id=use.sandbox_id,
            source=use.source[:64],
            destination=use.destination[:2048],
            status=use.status,
            outcome=use.outcome,
            bytes_sent=use.bytes_sent,
            bytes_received=use.bytes_received,
            duration_ms=round((time.monotonic() - use.started) * 1000),
        )
        with self.sessions.begin() as session:
            session.add(record)
        log.info(
            "secret use",
            extra={
                "fields": {
                    "sandbox": use.sandbox_id,
                    "secret": use.secret_id,
                    "destination": use.destination,
                    "status": use.status,
                    "outcome": use.outcome,
                }
            },
        )


def _split(path: str) -> tuple[str, str, str]:
    """(secret name, HOST[:PORT], /path) from /SECRET/HOST[:PORT]/path; refused unless plain."""
    parts = path.split("/", 3)
    if len(parts) < 3 or not parts[1] or not parts[2]:  # noqa: PLR2004 ("", secret, authority)
        raise Refused(
            400, "bad_path", "ask for $WARREN_GATEWAY_URL/SECRET/HOST[:PORT]/PATH (the secret's destination)"
        )
    rest = "/" + (parts[3] if len(parts) > 3 else "")  # noqa: PLR2004
    if not clean_request_path(rest) or not clean_request_path("/" + parts[1]) or "@" in parts[2]:
        raise Refused(
            400, "bad_path", "the path must be plain: no '.', '..', '//', '@' or escaped '/' or '.'"
        )
    return parts[1], parts[2].lower(), rest


def make_gateway(gateway: Gateway) -> Starlette:
    # CONNECT too, to be told why not.
    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT"]

    async def healthz(_: Request) -> Response:
        return JSONResponse({"ok": True})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await gateway.http.aclose()

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/{path:path}", gateway.handle, methods=methods),
        ],
        lifespan=lifespan,
    )


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The system's trusted CAs, and the operator's own (a private model host's) if given."""
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context
