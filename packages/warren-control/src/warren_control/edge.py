"""The edge: the one place that authenticates clients.

A client presents ``Authorization: Bearer wk_...`` (an API key), ``Authorization: Bearer
<JWT>`` (OIDC) or, as the E2B SDK does, ``X-API-KEY: e2b_...`` (an API key in either
format). The edge resolves who that is, strips every ``X-Warren-*`` header the client
sent (so a client cannot speak for the edge), and forwards the request to the API with a
freshly signed identity stamp. The response, streamed bodies included, is relayed as it
arrives so exec output reaches the client live.

Sandbox traffic is routed here too, as E2B's SDK sends it: a request naming a sandbox (the
``E2b-Sandbox-Id`` and ``E2b-Sandbox-Port`` headers, or the host ``{port}-{id}.{domain}``
under the configured sandbox domain) goes to that port of the sandbox's pod, streamed both
ways, if it carries the sandbox's own token (``X-Access-Token``, which only the sandbox's
creator was given). The API says where the sandbox runs; the edge keeps that for a few
seconds. A sandbox that is gone or not running is a 502 saying it "was not found", a port
nothing listens on a 502 saying the "port is not open": the SDK tells the two apart by those
words.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from urllib.parse import quote

import anyio
import httpx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from . import identity as stamps
from . import keys
from .identity import Identity
from .keys import KeyResolver
from .oidc import OidcError, OidcVerifier
from .podspec import AGENT_PORT

log = logging.getLogger(__name__)

# (method, path) -> the scope a request needs, or None. Path-prefix rules can plug in here.
ScopeRule = Callable[[str, str], str | None]

# Headers that describe one hop, not the request (RFC 9110 7.6.1), plus credentials the API
# must never see (it trusts the stamp alone) and forwarding claims a client could forge.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_REQUEST_DROP = _HOP_BY_HOP | {
    b"host",
    b"authorization",
    b"x-api-key",
    b"cookie",
    b"expect",
    b"forwarded",
    b"x-real-ip",
}
_REQUEST_DROP_PREFIXES = (b"x-warren-", b"x-forwarded-")
_STAMP_HEADER = stamps.HEADER.lower().encode("ascii")
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# Sandbox traffic: what names the sandbox and port, and what proves the right to reach it.
_SANDBOX_ID = "e2b-sandbox-id"
_SANDBOX_PORT = "e2b-sandbox-port"
_ACCESS_TOKEN = "x-access-token"  # noqa: S105 (a header's name)
_SANDBOX_DROP = _HOP_BY_HOP | {b"host", b"forwarded", b"x-real-ip", b"x-api-key", b"cookie"}
_E2B_ID = re.compile(r"[a-z2-7]{26}")
_WARREN_ID = re.compile(r"sbx_[a-z2-7]{26}")
# How long the edge keeps where a sandbox runs: a moved pod costs at most this, one
# failed connection forgets it at once.
_ADDRESS_TTL_S = 10.0
# Compared against when a key id is unknown, so that case costs the same as a wrong secret.
_NO_SUCH_KEY = keys.hash_secret("no-such-key")


class _EdgeError(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message

    def response(self) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == HTTPStatus.UNAUTHORIZED else None
        # `code` as well: E2B's SDK reads errors as {code, message}, and it meets the edge first.
        body = {"error": self.error, "message": self.message, "code": self.status}
        return JSONResponse(body, status_code=self.status, headers=headers)


def _unauthenticated(message: str) -> _EdgeError:
    return _EdgeError(401, "unauthenticated", message)


def _client(
    transport: httpx.AsyncBaseTransport | None, *, connect_s: float, keepalive: int
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=transport,
        # No read timeout: an exec stream or a command's output may be quiet for a long time
        # and still be alive.
        timeout=httpx.Timeout(connect=connect_s, read=None, write=60.0, pool=10.0),
        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=keepalive),
        follow_redirects=False,
        # Proxy settings in the environment must not divert the call.
        trust_env=False,
    )


def _sandbox_error(status: int, message: str) -> Response:
    return JSONResponse({"code": status, "message": message}, status_code=status)


class _Relay(StreamingResponse):
    """The backend's response, relayed chunk by chunk with its status and headers."""

    def __init__(self, upstream: httpx.Response) -> None:
        # Raw bytes, not decoded: the client gets exactly what the backend sent, with the
        # backend's content-encoding and content-length still true of it.
        super().__init__(upstream.aiter_raw(), status_code=upstream.status_code)
        connection_named = {
            token.strip().lower().encode("latin-1")
            for token in upstream.headers.get("connection", "").split(",")
        }
        self.raw_headers = [
            (name.lower(), value)
            for name, value in upstream.headers.raw
            if name.lower() not in _HOP_BY_HOP and name.lower() not in connection_named
        ]
        self.upstream = upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Also on client disconnect (a cancelled stream): return the backend connection.
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()


class _Edge:
    def __init__(
        self,
        *,
        backend_url: str,
        stamp_key: bytes,
        key_resolver: KeyResolver,
        oidc: OidcVerifier | None,
        required_scope: ScopeRule | None,
        stamp_ttl_s: int,
        transport: httpx.AsyncBaseTransport | None,
        sandbox_domain: str | None,
        sandbox_transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        # Fail at start-up, not on the first request, if the key or the URL is unusable.
        stamps.sign(Identity("edge", "self-check"), stamp_key, stamp_ttl_s)
        self.backend = httpx.URL(backend_url)
        if self.backend.scheme not in ("http", "https") or not self.backend.host:
            raise ValueError(f"backend URL must be http(s)://host[:port][/prefix]: {backend_url!r}")
        self.prefix = self.backend.raw_path.split(b"?", 1)[0].rstrip(b"/")
        self.stamp_key = stamp_key
        self.resolver = key_resolver
        self.oidc = oidc
        self.required_scope = required_scope
        self.stamp_ttl_s = stamp_ttl_s
        self.transport = transport
        self.client: httpx.AsyncClient | None = None
        self.sandbox_transport = sandbox_transport
        self.sandbox_client: httpx.AsyncClient | None = None
        # {port}-{id}.{domain}, with the port of the URL the client used, if any.
        self.sandbox_host = (
            re.compile(rf"(\d{{1,5}})-([a-z2-7]{{26}})\.{re.escape(sandbox_domain.lower())}(?::\d+)?")
            if sandbox_domain
            else None
        )
        self.addresses: dict[str, tuple[str, float]] = {}

    def open_client(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = _client(self.transport, connect_s=10.0, keepalive=100)
        return self.client

    def open_sandbox_client(self) -> httpx.AsyncClient:
        if self.sandbox_client is None:
            # Pods answer a connection at once: a short wait finds a moved pod sooner.
            self.sandbox_client = _client(self.sandbox_transport, connect_s=2.0, keepalive=200)
        return self.sandbox_client

    async def close(self) -> None:
        for client in (self.client, self.sandbox_client):
            if client is not None:
                await client.aclose()
        self.client = self.sandbox_client = None

    async def authenticate(self, request: Request) -> Identity:
        values = request.headers.getlist("authorization")
        api_keys = request.headers.getlist("x-api-key")
        if api_keys:
            if values or len(api_keys) > 1:
                raise _unauthenticated("more than one credential: send Authorization or X-API-KEY, once")
            token = api_keys[0].strip()
            if not keys.looks_like_key(token):
                raise _unauthenticated("X-API-KEY holds no API key: send an e2b_... or wk_... key")
            return await self._from_api_key(token)
        if not values:
            raise _unauthenticated("missing credentials: send Authorization: Bearer <API key or token>")
        if len(values) > 1:
            raise _unauthenticated("more than one Authorization header")
        scheme, _, token = values[0].partition(" ")
        if scheme.lower() != "bearer":
            raise _unauthenticated("unsupported authorization scheme: use Bearer")
        token = token.strip()
        if not token:
            raise _unauthenticated("empty bearer token")
        if keys.looks_like_key(token):
            return await self._from_api_key(token)
        if self.oidc is None:
            raise _unauthenticated("not an API key, and this edge accepts no OIDC tokens")
        try:
            return await run_in_threadpool(self.oidc.verify, token)
        except OidcError as exc:
            if exc.temporary:
                log.warning("OIDC issuer unavailable: %s", exc.reason)
                raise _EdgeError(503, "unavailable", "cannot verify tokens right now; retry later") from exc
            raise _unauthenticated(exc.reason) from exc

    async def _from_api_key(self, token: str) -> Identity:
        try:
            key_id = keys.parse(token).key_id
        except keys.KeyFormatError as exc:
            raise _unauthenticated("malformed API key") from exc
        try:
            stored = await run_in_threadpool(self.resolver.lookup, key_id)
        except Exception as exc:
            log.exception("API key lookup failed")
            raise _EdgeError(503, "unavailable", "cannot check credentials right now; retry later") from exc
        matches = keys.check(token, stored.secret_sha256 if stored is not None else _NO_SUCH_KEY)
        # One message for an unknown id and a wrong secret: never say which part was right.
        if stored is None or not matches:
            raise _unauthenticated("invalid API key")
        # Only a holder of the whole key learns that it was revoked.
        if stored.revoked:
            raise _unauthenticated("API key revoked")
        return Identity(org=stored.org, user=stored.user, scopes=frozenset(stored.scopes))

    def _forward_headers(self, request: Request, stamp: str) -> list[tuple[bytes, bytes]]:
        connection_named = {
            token.strip().lower().encode("latin-1")
            for value in request.headers.getlist("connection")
            for token in value.split(",")
        }
        # ASGI servers lower-case header names already; lower-casing again costs nothing.
        headers = [
            (name.lower(), value)
            for name, value in request.headers.raw
            if name.lower() not in _REQUEST_DROP
            and name.lower() not in connection_named
            and not name.lower().startswith(_REQUEST_DROP_PREFIXES)
        ]
        headers.append((_STAMP_HEADER, stamp.encode("ascii")))
        return headers

    def sandbox_target(self, request: Request) -> tuple[str, int] | None:
        """(the sandbox's Warren id, the port) a request names, or None for API traffic."""
        named = request.headers.get(_SANDBOX_ID)
        if named is not None:
            port_text = request.headers.get(_SANDBOX_PORT, str(AGENT_PORT))
        elif self.sandbox_host is not None and (
            match := self.sandbox_host.fullmatch(request.headers.get("host", "").lower())
        ):
            port_text, named = match.group(1), match.group(2)
        else:
            return None
        named = named.strip()
        sandbox_id = "sbx_" + named if _E2B_ID.fullmatch(named) else named
        port = int(port_text) if port_text.isdigit() and 0 < int(port_text) < 65536 else 0  # noqa: PLR2004
        return sandbox_id, port

    async def locate(self, sandbox_id: str) -> str | Response:
        """Where the sandbox's pod is, from the API (kept for a few seconds), or the 502
        that tells the client it is not there."""
        known = self.addresses.get(sandbox_id)
        if known is not None and known[1] > time.monotonic():
            return known[0]
        stamp = stamps.sign(stamps.EDGE, self.stamp_key, self.stamp_ttl_s)
        url = self.backend.copy_with(raw_path=self.prefix + f"/internal/agents/{sandbox_id}".encode("ascii"))
        try:
            answer = await self.open_client().get(url, headers={stamps.HEADER: stamp})
        except httpx.HTTPError as exc:
            log.warning("backend unreachable: %s", exc)
            return _sandbox_error(502, "the API is unavailable; retry later")
        if answer.status_code in {404, 409}:
            said = answer.json().get("message", "")
            return _sandbox_error(502, f"The sandbox {sandbox_id.removeprefix('sbx_')} was not found: {said}")
        if answer.status_code != 200:  # noqa: PLR2004
            log.warning("the API answered %s to where is %s", answer.status_code, sandbox_id)
            return _sandbox_error(502, "the API cannot say where the sandbox is; retry later")
        address = str(answer.json()["address"])
        self.addresses[sandbox_id] = (address, time.monotonic() + _ADDRESS_TTL_S)
        return address

    def refuse_sandbox_request(self, request: Request, sandbox_id: str, port: int) -> Response | None:
        if not _WARREN_ID.fullmatch(sandbox_id):
            return _sandbox_error(502, f"The sandbox {sandbox_id[:64]!r} was not found")
        if port == 0:
            return _sandbox_error(400, "E2b-Sandbox-Port (or the host's port part) must be a port number")
        token = request.headers.get(_ACCESS_TOKEN, "")
        expected = keys.agent_token(self.stamp_key, sandbox_id)
        if not hmac.compare_digest(token.encode("utf-8", "replace"), expected.encode("ascii")):
            # One answer for a wrong token and a sandbox that does not exist: never say which.
            return _sandbox_error(
                401, "missing or invalid X-Access-Token: send the sandbox's envdAccessToken"
            )
        return None

    async def to_sandbox(self, request: Request, sandbox_id: str, port: int) -> Response:
        refused = self.refuse_sandbox_request(request, sandbox_id, port)
        if refused is not None:
            return refused
        short = sandbox_id.removeprefix("sbx_")
        located = await self.locate(sandbox_id)
        if isinstance(located, Response):
            return located
        raw_path: bytes = request.scope.get("raw_path") or quote(request.url.path).encode("ascii")
        query: bytes = request.scope.get("query_string", b"")
        headers = [
            (name.lower(), value)
            for name, value in request.headers.raw
            if name.lower() not in _SANDBOX_DROP and not name.lower().startswith(_REQUEST_DROP_PREFIXES)
        ]
        has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
        body = request.stream() if has_body else None
        client = self.open_sandbox_client()
        for attempt in range(2):
            url = httpx.URL(f"http://{located}:{port}").copy_with(
                raw_path=raw_path + (b"?" + query if query else b"")
            )
            outgoing = client.build_request(request.method, url, headers=headers, content=body)
            try:
                return _Relay(await client.send(outgoing, stream=True))
            except (httpx.ConnectError, httpx.ConnectTimeout):
                # No connection, so nothing of the body was sent. The pod may have moved since
                # its address was kept (a resume makes a new one): ask again, and try once
                # more if it did. Otherwise the sandbox runs without that port open.
                self.addresses.pop(sandbox_id, None)
                again = await self.locate(sandbox_id)
                if isinstance(again, Response):
                    return again
                if again == located or attempt:
                    break
                located = again
            except httpx.HTTPError as exc:
                self.addresses.pop(sandbox_id, None)
                log.warning("sandbox %s unreachable: %s", sandbox_id, exc)
                return _sandbox_error(502, f"the sandbox {short} could not be reached; retry later")
        return _sandbox_error(502, f"The sandbox {short} is running but port {port} is not open")

    async def handle(self, request: Request) -> Response:
        target = self.sandbox_target(request)
        if target is not None:
            return await self.to_sandbox(request, *target)
        if request.url.path.startswith("/internal/"):
            # The edge's own questions to the API; no client asks them.
            return _EdgeError(404, "not_found", "no such route").response()
        try:
            who = await self.authenticate(request)
            if who.org == stamps.EDGE.org:
                raise _EdgeError(403, "forbidden", "this identity's organization is reserved")
            if self.required_scope is not None:
                needed = self.required_scope(request.method, request.url.path)
                if needed is not None and needed not in who.scopes:
                    raise _EdgeError(403, "forbidden", f"this request needs the {needed!r} scope")
        except _EdgeError as refused:
            return refused.response()
        stamp = stamps.sign(who, self.stamp_key, self.stamp_ttl_s)
        raw_path: bytes = request.scope.get("raw_path") or quote(request.url.path).encode("ascii")
        query: bytes = request.scope.get("query_string", b"")
        url = self.backend.copy_with(raw_path=self.prefix + raw_path + (b"?" + query if query else b""))
        has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
        client = self.open_client()
        outgoing = client.build_request(
            request.method,
            url,
            headers=self._forward_headers(request, stamp),
            content=request.stream() if has_body else None,
        )
        try:
            upstream = await client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            log.warning("backend unreachable: %s", exc)
            return _EdgeError(502, "bad_gateway", "the API is unavailable; retry later").response()
        return _Relay(upstream)


def make_edge(
    backend_url: str,
    stamp_key: bytes,
    key_resolver: KeyResolver,
    oidc: OidcVerifier | None,
    *,
    required_scope: ScopeRule | None = None,
    stamp_ttl_s: int = 60,
    transport: httpx.AsyncBaseTransport | None = None,
    sandbox_domain: str | None = None,
    sandbox_transport: httpx.AsyncBaseTransport | None = None,
) -> Starlette:
    """The edge as an ASGI app forwarding every path to `backend_url` (which may carry a prefix).

    `required_scope(method, path)` may name a scope the identity must hold (403 otherwise).
    `transport` replaces the network transport to the backend (e.g. a Unix socket), and
    `sandbox_transport` the one to sandboxes. `sandbox_domain` turns on routing by host name
    ({port}-{id}.{domain}); the E2b-Sandbox-Id header routes without it.
    """
    edge = _Edge(
        backend_url=backend_url,
        stamp_key=stamp_key,
        key_resolver=key_resolver,
        oidc=oidc,
        required_scope=required_scope,
        stamp_ttl_s=stamp_ttl_s,
        transport=transport,
        sandbox_domain=sandbox_domain,
        sandbox_transport=sandbox_transport,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        edge.open_client()
        try:
            yield
        finally:
            await edge.close()

    return Starlette(routes=[Route("/{path:path}", edge.handle, methods=_METHODS)], lifespan=lifespan)
