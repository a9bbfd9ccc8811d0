"""The identity stamp: how the edge tells a backend who is asking.

The edge authenticates the client, then sends the backend an `X-Warren-Identity` header:
``base64url(JSON {org, user, scopes, iat, exp, nonce}) + "." + base64url(HMAC-SHA256)``, keyed
by a secret only the edge and the backends hold. A backend trusts this header and nothing
else: not a body field, not another header, not a stamp it cannot verify.

Stamps live for seconds (they are minted per request), so a captured stamp is useful only
briefly; the nonce makes every stamp distinct, which leaves room for a replay cache later.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

HEADER = "X-Warren-Identity"

# HMAC-SHA256 keys shorter than the hash give away strength for nothing.
MIN_KEY_BYTES = 32
# How far ahead of our clock a stamp's issue time may be: clocks on two nodes drift a little.
MAX_SKEW_S = 10
# A stamp covers one request; a long-lived one would be a bearer credential in disguise.
MAX_TTL_S = 300
# Real stamps are a few hundred bytes; refusing big input early keeps decoding cheap.
MAX_STAMP_CHARS = 8192
_MAX_NAME_CHARS = 256


class StampError(Exception):
    """A stamp was refused; `reason` says why (safe to show the caller)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is asking: an organization, a user in it, and what they may do."""

    org: str
    user: str
    scopes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name, value in (("org", self.org), ("user", self.user)):
            if not isinstance(value, str) or not value or len(value) > _MAX_NAME_CHARS:
                raise ValueError(f"identity {name} must be a non-empty string of at most {_MAX_NAME_CHARS}")
        if not isinstance(self.scopes, frozenset):
            raise TypeError("identity scopes must be a frozenset")
        for scope in self.scopes:
            # Scopes travel space-separated in OIDC, so one with whitespace could not round-trip.
            if not isinstance(scope, str) or not scope or any(c.isspace() for c in scope):
                raise ValueError(f"invalid scope {scope!r}")


# The edge itself, asking the API where a sandbox's agent is (to route sandbox traffic). No
# organization's id looks like this one (ids are org_...), and the edge refuses clients any
# path under /internal/, so no client's stamp can ever carry it.
EDGE = Identity(org="-edge-", user="edge", scopes=frozenset({"edge"}))


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    if not text or not text.isascii():
        raise StampError("malformed stamp: bad base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise StampError("malformed stamp: bad base64url") from exc


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the stamp key must be at least {MIN_KEY_BYTES} bytes")


def _mac(payload_b64: str, key: bytes) -> str:
    return _b64encode(hmac.new(key, payload_b64.encode("ascii"), hashlib.sha256).digest())


def sign(identity: Identity, key: bytes, ttl_s: int = 60, *, now: float | None = None) -> str:
    """Mint a stamp for `identity`, valid for `ttl_s` seconds from `now` (default: the clock)."""
    _check_key(key)
    if not 0 < ttl_s <= MAX_TTL_S:
        raise ValueError(f"stamp ttl must be within 1..{MAX_TTL_S} seconds")
    issued = int(time.time() if now is None else now)
    claims = {
        "org": identity.org,
        "user": identity.user,
        "scopes": sorted(identity.scopes),
        "iat": issued,
        "exp": issued + ttl_s,
        "nonce": secrets.token_urlsafe(16),
    }
    payload = _b64encode(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    return f"{payload}.{_mac(payload, key)}"


def _int_claim(claims: dict[str, Any], name: str) -> int:
    value = claims.get(name)
    # bool is an int in Python; a stamp with "exp": true is malformed, not "expires at 1".
    if not isinstance(value, int) or isinstance(value, bool):
        raise StampError(f"malformed stamp: '{name}' must be an integer")
    return value


def verify(value: str, key: bytes, now: float | None = None) -> Identity:
    """Check a stamp and return the identity it carries, or raise `StampError`."""
    _check_key(key)
    if not isinstance(value, str) or not value:
        raise StampError("missing stamp")
    if len(value) > MAX_STAMP_CHARS:
        raise StampError("malformed stamp: too long")
    payload, sep, signature = value.partition(".")
    if not sep or not payload or not signature or "." in signature or not value.isascii():
        raise StampError("malformed stamp: expected <payload>.<signature>")
    # The signature is checked before the payload is parsed, so nothing an attacker wrote is
    # interpreted; comparing the encoded forms also rules out alternative base64 spellings.
    if not hmac.compare_digest(_mac(payload, key), signature):
        raise StampError("bad stamp signature")
    try:
        claims = json.loads(_b64decode(payload))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StampError("malformed stamp: payload is not JSON") from exc
    if not isinstance(claims, dict):
        raise StampError("malformed stamp: payload is not an object")
    issued = _int_claim(claims, "iat")
    expires = _int_claim(claims, "exp")
    if expires <= issued or expires - issued > MAX_TTL_S:
        raise StampError("malformed stamp: bad lifetime")
    clock = time.time() if now is None else now
    if issued > clock + MAX_SKEW_S:
        raise StampError("stamp issued in the future")
    if clock >= expires:
        raise StampError("stamp expired")
    return _identity(claims)


def _identity(claims: dict[str, Any]) -> Identity:
    org, user, scopes, nonce = (claims.get(k) for k in ("org", "user", "scopes", "nonce"))
    if not isinstance(nonce, str) or not nonce:
        raise StampError("malformed stamp: 'nonce' missing")
    if not isinstance(org, str) or not isinstance(user, str):
        raise StampError("malformed stamp: 'org' and 'user' must be strings")
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise StampError("malformed stamp: 'scopes' must be a list of strings")
    try:
        return Identity(org=org, user=user, scopes=frozenset(scopes))
    except (TypeError, ValueError) as exc:
        raise StampError(f"malformed stamp: {exc}") from exc


class Unauthenticated(HTTPException):
    """Raised by `require_identity`; rendered as 401 {"error": "unauthenticated", "message"}."""

    def __init__(self, message: str) -> None:
        super().__init__(status_code=401, detail=message)
        self.message = message


async def unauthenticated_handler(request: Request, exc: Exception) -> Response:
    message = exc.message if isinstance(exc, Unauthenticated) else "unauthenticated"
    return JSONResponse({"error": "unauthenticated", "message": message}, status_code=401)


def add_identity_error_handler(app: FastAPI) -> None:
    """Render `Unauthenticated` in the API's error shape instead of FastAPI's {"detail": ...}."""
    app.add_exception_handler(Unauthenticated, unauthenticated_handler)


def require_identity(key: bytes) -> Callable[[Request], Awaitable[Identity]]:
    """A FastAPI dependency that yields the verified identity of the request.

    It reads only the stamp header: identity claimed in a body, a query or any other header
    is never consulted, so a client that bypasses the edge has nothing to forge but a MAC.
    Install `add_identity_error_handler(app)` for the {"error", "message"} body.
    """
    _check_key(key)

    async def identity_from_stamp(request: Request) -> Identity:
        # Two stamp headers is ambiguity an attacker could exploit between proxies: refuse.
        values = request.headers.getlist(HEADER)
        if not values:
            raise Unauthenticated(f"missing {HEADER} stamp: requests must come through the edge")
        if len(values) > 1:
            raise Unauthenticated(f"more than one {HEADER} header")
        try:
            return verify(values[0], key)
        except StampError as exc:
            raise Unauthenticated(exc.reason) from exc

    return identity_from_stamp
