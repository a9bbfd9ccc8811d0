"""Real local servers for the edge tests: an OIDC issuer and uvicorn-served ASGI apps, on loopback."""

import asyncio
import base64
import hashlib
import hmac
import json
import socket
import socketserver
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Annotated, Any

import jwt
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from starlette.types import ASGIApp
from warren_common.testing import free_port as free_port  # noqa: PLC0414 (kwok_cluster.py imports it from here)
from warren_control.identity import Identity, add_identity_error_handler, require_identity

AUDIENCE = "warren-api"


@contextmanager
def serve_asgi(app: ASGIApp) -> Iterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1 in a thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@dataclass
class Issuer:
    """A local OIDC issuer: discovery document and JWKS over real HTTP, and the private keys."""

    url: str
    rsa_key: rsa.RSAPrivateKey
    ec_key: ec.EllipticCurvePrivateKey
    jwks_requests: list[float] = field(default_factory=list)

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/jwks"

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.url,
            "aud": AUDIENCE,
            "sub": "alice",
            "org": "org-a",
            "scope": "sandbox:read sandbox:write",
            "iat": now,
            "nbf": now,
            "exp": now + 300,
        }
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(
        self,
        alg: str = "RS256",
        kid: str | None = None,
        claims: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> str:
        """A token signed by this issuer; `claims`/`overrides` replace defaults (None removes one)."""
        key = self.rsa_key if alg == "RS256" else self.ec_key
        kid = kid or ("rsa-1" if alg == "RS256" else "ec-1")
        return jwt.encode(
            self.claims(**(claims or {}), **overrides), key, algorithm=alg, headers={"kid": kid}
        )

    def rsa_public_pem(self) -> bytes:
        return self.rsa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


def hs256_with_public_key(issuer: Issuer, **overrides: Any) -> str:
    """The key-confusion attack: HS256 with the issuer's public key PEM as the HMAC secret.

    Built by hand: pyjwt itself refuses to use a PEM public key as an HMAC secret.
    """
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}).encode())
    payload = b64url(json.dumps(issuer.claims(**overrides)).encode())
    signing_input = f"{header}.{payload}".encode("ascii")
    signature = hmac.new(issuer.rsa_public_pem(), signing_input, hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(signature)}"


def unsigned_token(issuer: Issuer, **overrides: Any) -> str:
    header = b64url(json.dumps({"alg": "none", "typ": "JWT", "kid": "rsa-1"}).encode())
    payload = b64url(json.dumps(issuer.claims(**overrides)).encode())
    return f"{header}.{payload}."


class _TCPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    # TCPServer rather than HTTPServer: HTTPServer.server_bind resolves the host name (reverse DNS).
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def run_issuer() -> Iterator[Issuer]:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_jwk = {
        **RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True),
        "kid": "rsa-1",
        "use": "sig",
        "alg": "RS256",
    }
    ec_jwk = {
        **ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True),
        "kid": "ec-1",
        "use": "sig",
        "alg": "ES256",
    }
    requests: list[float] = []
    documents: dict[str, Any] = {"/jwks": {"keys": [rsa_jwk, ec_jwk]}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = documents.get(self.path)
            if self.path == "/jwks":
                requests.append(time.monotonic())
            if body is None:
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

    server = _TCPServer(("127.0.0.1", 0), Handler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    documents["/.well-known/openid-configuration"] = {
        "issuer": url,
        "jwks_uri": f"{url}/jwks",
        "id_token_signing_alg_values_supported": ["RS256", "ES256"],
    }
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Issuer(url=url, rsa_key=rsa_key, ec_key=ec_key, jwks_requests=requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def echo_backend(stamp_key: bytes) -> FastAPI:
    """A backend in the API's style: every route depends on a verified stamp and echoes what it saw."""
    app = FastAPI()
    add_identity_error_handler(app)
    who = Annotated[Identity, Depends(require_identity(stamp_key))]

    def seen(identity: Identity, request: Request) -> dict[str, Any]:
        return {
            "org": identity.org,
            "user": identity.user,
            "scopes": sorted(identity.scopes),
            "method": request.method,
            "path": request.scope["raw_path"].decode("ascii"),
            "query": request.scope["query_string"].decode("ascii"),
            "warren_headers": sorted(k for k in request.headers if k.startswith("x-warren-")),
            "authorization": request.headers.get("authorization"),
            "x_api_key": request.headers.get("x-api-key"),
            "cookie": request.headers.get("cookie"),
            "x_forwarded_for": request.headers.get("x-forwarded-for"),
            "x_request_id": request.headers.get("x-request-id"),
        }

    # Streams that ended, by tag, and how: lets a test see the edge let go of a stream.
    ended: dict[str, str] = {}

    @app.get("/stream/lines")
    async def stream(identity: who, n: int = 5, pause: float = 0.2, tag: str = "") -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            outcome = "cancelled"
            try:
                for i in range(n):
                    yield f"{identity.org} line {i} {time.monotonic()}\n".encode()
                    await asyncio.sleep(pause)
                outcome = "completed"
            finally:
                ended[tag] = outcome

        return StreamingResponse(lines(), media_type="text/plain", headers={"X-Exit-Code": "0"})

    @app.get("/stream/ended/{tag}")
    async def stream_ended(tag: str, identity: who) -> dict[str, str | None]:
        return {"outcome": ended.get(tag)}

    @app.get("/status/{code}")
    async def status(code: int, identity: who) -> JSONResponse:
        return JSONResponse(
            {"error": "not_found", "message": "no such thing"},
            status_code=code,
            headers={"X-Backend": "yes"},
        )

    # Last, so the specific routes above match first.
    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def echo(path: str, identity: who, request: Request) -> dict[str, Any]:
        body = await request.body()
        return {
            **seen(identity, request),
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "body_len": len(body),
        }

    return app
