"""API keys, in two formats that resolve alike:

- Warren's own, ``wk_<key id>_<secret>``: the key id is 12 base32 characters, the secret 43
  urlsafe characters (256 random bits).
- E2B's shape, ``e2b_<hex>``, for programs written against the E2B SDK (whose
  ``E2B_API_KEY`` holds it): 64 hex digits, the key id (16) then the secret (48, 192 random
  bits). The two key ids differ in length, so they never collide in the records.

The key id finds the record; the secret proves possession. Only SHA-256 of the secret is
stored: the secret is random and long, so a slow password hash would add latency to every
request and no strength.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Literal, Protocol

PREFIX = "wk_"
KEY_ID_CHARS = 12
SECRET_BYTES = 32
SECRET_CHARS = 43  # base64url of 32 bytes, unpadded
_BASE32 = "abcdefghijklmnopqrstuvwxyz234567"
E2B_PREFIX = "e2b_"
E2B_KEY_ID_HEX = 16
E2B_SECRET_BYTES = 24
# The secret's alphabet includes "_", so the token is split by position, not by separator.
_TOKEN = re.compile(
    rf"{PREFIX}(?P<key_id>[a-z2-7]{{{KEY_ID_CHARS}}})_(?P<secret>[A-Za-z0-9_-]{{{SECRET_CHARS}}})"
)
_E2B_TOKEN = re.compile(
    rf"{E2B_PREFIX}(?P<key_id>[0-9a-f]{{{E2B_KEY_ID_HEX}}})(?P<secret>[0-9a-f]{{{E2B_SECRET_BYTES * 2}}})"
)
KeyFormat = Literal["warren", "e2b"]


class KeyFormatError(ValueError):
    """The string is not an API key of this format."""


@dataclass(frozen=True, slots=True)
class NewKey:
    """A freshly minted key: `token` goes to the user once; the rest is what is stored."""

    token: str
    key_id: str
    secret_sha256: str


@dataclass(frozen=True, slots=True)
class ParsedKey:
    key_id: str
    secret: str


@dataclass(frozen=True, slots=True)
class StoredKey:
    """What the records hold for one key id."""

    org: str
    user: str
    scopes: frozenset[str]
    revoked: bool
    secret_sha256: str


class KeyResolver(Protocol):
    """Finds the stored record of a key id (the database in production)."""

    def lookup(self, key_id: str) -> StoredKey | None: ...


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def new_key(key_format: KeyFormat = "warren") -> NewKey:
    if key_format == "e2b":
        key_id = secrets.token_hex(E2B_KEY_ID_HEX // 2)
        secret = secrets.token_hex(E2B_SECRET_BYTES)
        token = f"{E2B_PREFIX}{key_id}{secret}"
    else:
        key_id = "".join(secrets.choice(_BASE32) for _ in range(KEY_ID_CHARS))
        secret = secrets.token_urlsafe(SECRET_BYTES)
        token = f"{PREFIX}{key_id}_{secret}"
    return NewKey(token=token, key_id=key_id, secret_sha256=hash_secret(secret))


def looks_like_key(token: str) -> bool:
    """Whether a bearer token is meant as an API key (as opposed to a JWT)."""
    return token.startswith((PREFIX, E2B_PREFIX))


def parse(token: str) -> ParsedKey:
    if token.startswith(E2B_PREFIX):
        match = _E2B_TOKEN.fullmatch(token)
        if match is None:
            raise KeyFormatError(
                f"not an API key: expected e2b_ and {E2B_KEY_ID_HEX + 2 * E2B_SECRET_BYTES} hex digits"
            )
    else:
        match = _TOKEN.fullmatch(token)
        if match is None:
            raise KeyFormatError("not an API key: expected wk_<key id>_<secret>")
    return ParsedKey(key_id=match["key_id"], secret=match["secret"])


def agent_token(stamp_key: bytes, sandbox_id: str) -> str:
    """The token a sandbox's agent requires (E2B's `envdAccessToken`): derived from the
    control plane's key, so it is stored nowhere, the same on every replica and for the
    sandbox's whole life; without the key nobody can make it. The cluster only ever holds
    its SHA-256 (agent_token_sha256)."""
    key = hmac.new(stamp_key, b"warren agent access token", hashlib.sha256).digest()
    return hmac.new(key, sandbox_id.encode("ascii"), hashlib.sha256).hexdigest()


def agent_token_sha256(stamp_key: bytes, sandbox_id: str) -> str:
    return hashlib.sha256(agent_token(stamp_key, sandbox_id).encode("ascii")).hexdigest()


def check(token: str, stored_sha256: str) -> bool:
    """Whether `token`'s secret matches the stored hash, compared in constant time."""
    try:
        secret = parse(token).secret
    except KeyFormatError:
        return False
    # Bytes, not str: compare_digest refuses non-ASCII str, and a stored value is not ours to trust.
    return hmac.compare_digest(hash_secret(secret).encode("ascii"), stored_sha256.encode("utf-8"))
