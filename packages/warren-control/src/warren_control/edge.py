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
creator was given). Two more ways in, each narrow:

- a signed file URL (the SDK's ``download_url`` and ``upload_url``): GET or POST ``/files`` on
  the agent's port with a ``signature`` made from the sandbox's token, which the edge checks
  and replaces with the token itself, so a browser needs no header;
- on any other port (a server the sandbox runs), an API key of the organization that owns
  the sandbox; another organization's key finds no sandbox, exactly as a gone one.

The sandbox never sees an API key or the credential the edge checked. The API says where the
sandbox runs; the edge keeps that for a few seconds. A sandbox that is gone or not running
is a 502 saying it "was not found", a port nothing listens on a 502 saying the "port is not
open": the SDK tells the two apart by those words.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from urllib.parse import parse_qsl, quote, urlencode

import anyio
import httpx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

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
# What a signed file URL may carry (the SDK's _file_url), and the operation each method signs.
_SIGNED_PARAMS = frozenset({"path", "username", "signature", "signature_expiration"})
_SIGNED_OPERATIONS = {"GET": "read", "POST": "write"}
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
    transport: httpx.AsyncBaseTransport | None, *, connect_s: float, keepalive: int, idle_s: float = 5.0
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=transport,
        # No read timeout: an exec stream or a command's output may be quiet for a long time
        # and still be alive.
        timeout=httpx.Timeout(connect=connect_s, read=None, write=60.0, pool=10.0),
        limits=httpx.Limits(
            max_connections=1000, max_keepalive_connections=keepalive, keepalive_expiry=idle_s
        ),
        follow_redirects=False,
        # Proxy settings in the environment must not divert the call.
        trust_env=False,
    )


def _sandbox_error(status: int, message: str) -> Response:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def file_signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    """E2B's v1 signature of a file URL: SHA-256 over the path, the operation ("read" or
    "write"), the user ("" for the sandbox's default), the sandbox's token and the expiry
    (Unix seconds) when there is one; unpadded base64 after "v1_"."""
    fields = [path, operation, user, token] + ([str(expiration)] if expiration is not None else [])
    digest = hashlib.sha256(":".join(fields).encode("utf-8")).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")


class SignatureError(Exception):
    """A signed file URL that does not hold; the message says what is wrong."""


def signed_file_query(method: str, query: bytes, token: str, now: float) -> bytes:
    """Check a signed file URL's query against the sandbox's token; return the query the
    agent is to get: the path and user exactly as signed, nothing else (so the agent cannot
    read a parameter differently from the edge, e.g. a repeated one)."""
    operation = _SIGNED_OPERATIONS.get(method)
    if operation is None:
        raise SignatureError(f"a signed URL is for GET (download) or POST (upload) /files, not {method}")
    try:
        pairs = parse_qsl(query.decode("ascii"), keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise SignatureError("the signed URL's query is not valid percent-encoded UTF-8") from exc
    params: dict[str, str] = {}
    for name, value in pairs:
        if name not in _SIGNED_PARAMS:
            raise SignatureError(f"{name!r} is not part of a signed file URL: use the URL as the SDK made it")
        if name in params:
            raise SignatureError(f"{name!r} appears twice in the signed URL: give it once")
        params[name] = value
    expiry_text = params.get("signature_expiration")
    if expiry_text is not None and not expiry_text.isdigit():
        raise SignatureError("signature_expiration must be a Unix time in seconds")
    expiration = int(expiry_text) if expiry_text is not None else None
    path, user = params.get("path", ""), params.get("username", "")
    expected = file_signature(path, operation, user, token, expiration)
    if not hmac.compare_digest(params.get("signature", "").encode("utf-8"), expected.encode("ascii")):
        raise SignatureError(
            f"invalid signature for {operation} of {path[:256]!r}: the URL was changed, or was not "
            "signed with this sandbox's token; ask the SDK for a new one"
        )
    if expiration is not None and expiration < now:
        when = datetime.fromtimestamp(expiration, UTC).isoformat()
        raise SignatureError(f"the signed URL expired at {when}: ask the SDK for a new one")
    kept = [(name, params[name]) for name in ("path", "username") if name in params]
    return urlencode(kept, quote_via=quote, safe="/").encode("ascii")


def _carries_api_key(authorization: str) -> bool:
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and keys.looks_like_key(token.strip())


@dataclass(frozen=True)
class _Admitted:
    """How a sandbox request got in, and so what is forwarded."""

    # The organization whose credential admitted it (the sandbox must be its own).
    org: str | None = None
    # A signed file URL's query, as checked; the token to send in the signature's place.
    query: bytes | None = None
    token: str | None = None
    # Authorization was the credential (or made no sense beside a signature): never forwarded.
    drop_authorization: bool = False


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


# What of the client's request scope the API gets in process: the request itself, none of
# what the edge's own app and routing put there.
_REQUEST_SCOPE = (
    "type",
    "asgi",
    "http_version",
    "method",
    "scheme",
    "server",
    "client",
    "root_path",
    "path",
    "raw_path",
    "query_string",
    "extensions",
)


class _InProcess(Response):
    """The API's answer when it runs in this process: the request goes to its ASGI app with
    the headers the edge forwards (the stamp, none of the client's credentials), and the
    client's own channels, so a streamed answer streams and nothing is serialized and parsed
    again on a second connection."""

    def __init__(self, app: ASGIApp, forwarded: list[tuple[bytes, bytes]]) -> None:
        super().__init__()
        self.app = app
        self.forwarded = forwarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        inner: Scope = {key: scope[key] for key in _REQUEST_SCOPE if key in scope}
        inner["headers"] = self.forwarded
        await self.app(inner, receive, send)


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
        backend_app: ASGIApp | None = None,
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
        self.backend_app = backend_app
        # The edge's own questions to an API in this process need no network either.
        self.transport = transport or (httpx.ASGITransport(backend_app) if backend_app else None)
        self.client: httpx.AsyncClient | None = None
        self.sandbox_transport = sandbox_transport
        self.sandbox_client: httpx.AsyncClient | None = None
        # {port}-{id}.{domain}, with the port of the URL the client used, if any.
        self.sandbox_host = (
            re.compile(rf"(\d{{1,5}})-([a-z2-7]{{26}})\.{re.escape(sandbox_domain.lower())}(?::\d+)?")
            if sandbox_domain
            else None
        )
        # sandbox id -> (the pod's address, the owning organization, until when it is kept)
        self.addresses: dict[str, tuple[str, str, float]] = {}

    def open_client(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = _client(self.transport, connect_s=10.0, keepalive=100)
        return self.client

    def open_sandbox_client(self) -> httpx.AsyncClient:
        if self.sandbox_client is None:
            # Pods answer a connection at once: a short wait finds a moved pod sooner. A kept
            # connection is reused for a second at most: a sandbox paused with its memory is
            # frozen and then killed, so its connections are never closed, and one reused after
            # the pod went would wait for an answer forever (no read timeout). No pause and
            # resume fits in a second; a new connection to the old address fails to connect,
            # which finds the new pod (below).
            self.sandbox_client = _client(self.sandbox_transport, connect_s=2.0, keepalive=200, idle_s=1.0)
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

    async def locate(self, sandbox_id: str, org: str | None = None) -> str | Response:
        """Where the sandbox's pod is, from the API (kept for a few seconds), or the 502
        that tells the client it is not there. With `org`, only that organization's sandbox
        is found: the API answers for another's as for one that never existed."""
        known = self.addresses.get(sandbox_id)
        if known is not None and known[2] > time.monotonic() and org in (None, known[1]):
            return known[0]
        stamp = stamps.sign(stamps.EDGE, self.stamp_key, self.stamp_ttl_s)
        url = self.backend.copy_with(
            raw_path=self.prefix
            + f"/internal/agents/{sandbox_id}".encode("ascii")
            + (b"?" + urlencode({"org": org}).encode("ascii") if org is not None else b"")
        )
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
        found = answer.json()
        address, owner = str(found["address"]), str(found.get("org", ""))
        if org is not None and owner != org:
            # Not expected of the API, which checked; never route on its word alone.
            log.warning("the API located %s for an organization that does not own it", sandbox_id)
            return _sandbox_error(502, "the API cannot say where the sandbox is; retry later")
        self.addresses[sandbox_id] = (address, owner, time.monotonic() + _ADDRESS_TTL_S)
        return address

    async def admit(self, request: Request, sandbox_id: str, port: int) -> _Admitted | Response:
        """How a request may reach the sandbox, or the answer refusing it. Every refusal
        here is the same whether or not the sandbox exists."""
        if not _WARREN_ID.fullmatch(sandbox_id):
            return _sandbox_error(502, f"The sandbox {sandbox_id[:64]!r} was not found")
        if port == 0:
            return _sandbox_error(400, "E2b-Sandbox-Port (or the host's port part) must be a port number")
        expected = keys.agent_token(self.stamp_key, sandbox_id)
        token = request.headers.get(_ACCESS_TOKEN)
        if token is not None:
            if not hmac.compare_digest(token.encode("utf-8", "replace"), expected.encode("ascii")):
                return _sandbox_error(401, "invalid X-Access-Token: send the sandbox's envdAccessToken")
            return _Admitted()
        if port == AGENT_PORT:
            return self.admit_signed(request, expected)
        return await self.admit_organization(request, port)

    @staticmethod
    def admit_signed(request: Request, token: str) -> _Admitted | Response:
        """The agent is the whole sandbox: without its token, only a file URL signed with it."""
        query: bytes = request.scope.get("query_string", b"")
        if request.url.path != "/files" or b"signature=" not in query:
            return _sandbox_error(
                401,
                "missing X-Access-Token: send the sandbox's envdAccessToken (or, for /files, "
                "use a URL signed with it)",
            )
        try:
            checked = signed_file_query(request.method, query, token, time.time())
        except SignatureError as exc:
            return _sandbox_error(401, str(exc))
        return _Admitted(query=checked, token=token, drop_authorization=True)

    async def admit_organization(self, request: Request, port: int) -> _Admitted | Response:
        """A server the sandbox runs: its organization's API keys (or OIDC tokens) will do."""
        if "x-api-key" not in request.headers and "authorization" not in request.headers:
            return _sandbox_error(
                401,
                f"missing credentials for port {port}: send the sandbox's X-Access-Token, or an "
                "API key of its organization (X-API-KEY or Authorization: Bearer)",
            )
        try:
            who = await self.authenticate(request)
            if who.org == stamps.EDGE.org:
                raise _EdgeError(403, "forbidden", "this identity's organization is reserved")
        except _EdgeError as refused:
            return refused.response()
        return _Admitted(org=who.org, drop_authorization="authorization" in request.headers)

    @staticmethod
    def sandbox_headers(request: Request, port: int, admitted: _Admitted) -> list[tuple[bytes, bytes]]:
        """The client's headers as the sandbox gets them: never an API key, never the
        credential the edge checked, the agent's token only for the agent."""
        drop = set(_SANDBOX_DROP)
        if port != AGENT_PORT:
            drop.add(_ACCESS_TOKEN.encode("ascii"))
        authorization = request.headers.get("authorization", "")
        if admitted.drop_authorization or _carries_api_key(authorization):
            drop.add(b"authorization")
        headers = [
            (name.lower(), value)
            for name, value in request.headers.raw
            if name.lower() not in drop and not name.lower().startswith(_REQUEST_DROP_PREFIXES)
        ]
        if admitted.token is not None:
            headers.append((_ACCESS_TOKEN.encode("ascii"), admitted.token.encode("ascii")))
        return headers

    async def to_sandbox(self, request: Request, sandbox_id: str, port: int) -> Response:
        admitted = await self.admit(request, sandbox_id, port)
        if isinstance(admitted, Response):
            return admitted
        short = sandbox_id.removeprefix("sbx_")
        located = await self.locate(sandbox_id, admitted.org)
        if isinstance(located, Response):
            return located
        raw_path: bytes = request.scope.get("raw_path") or quote(request.url.path).encode("ascii")
        query: bytes = request.scope.get("query_string", b"") if admitted.query is None else admitted.query
        headers = self.sandbox_headers(request, port, admitted)
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
                again = await self.locate(sandbox_id, admitted.org)
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
        if self.backend_app is not None:
            return _InProcess(self.backend_app, self._forward_headers(request, stamp))
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
    backend_app: ASGIApp | None = None,
) -> Starlette:
    """The edge as an ASGI app forwarding every path to `backend_url` (which may carry a prefix).

    `required_scope(method, path)` may name a scope the identity must hold (403 otherwise).
    `transport` replaces the network transport to the backend (e.g. a Unix socket), and
    `sandbox_transport` the one to sandboxes. `sandbox_domain` turns on routing by host name
    ({port}-{id}.{domain}); the E2b-Sandbox-Id header routes without it. `backend_app` is
    the API's own ASGI app when it runs in this process (`serve --role all`): requests go to
    it directly, and `backend_url` only names it.
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
        backend_app=backend_app,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        edge.open_client()
        try:
            yield
        finally:
            await edge.close()

    return Starlette(routes=[Route("/{path:path}", edge.handle, methods=_METHODS)], lifespan=lifespan)
