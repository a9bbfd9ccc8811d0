"""The identity stamp: signing, every way verification refuses, and a real backend that trusts only it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from localservers import echo_backend, serve_asgi
from warren_control.identity import (
    MAX_SKEW_S,
    Identity,
    StampError,
    sign,
    verify,
)

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
ALICE = Identity("org-a", "alice", frozenset({"sandbox:read", "sandbox:write"}))


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def payload_of(stamp: str) -> dict[str, object]:
    part = stamp.split(".", maxsplit=1)[0]
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return decoded


def test_round_trip_keeps_org_user_and_scopes() -> None:
    assert verify(sign(ALICE, KEY), KEY) == ALICE


def test_stamp_carries_times_and_a_fresh_nonce() -> None:
    first, second = sign(ALICE, KEY, ttl_s=30, now=1000), sign(ALICE, KEY, ttl_s=30, now=1000)
    claims = payload_of(first)
    assert claims["iat"] == 1000
    assert claims["exp"] == 1030
    assert claims["scopes"] == ["sandbox:read", "sandbox:write"]
    assert claims["nonce"] != payload_of(second)["nonce"]


def test_wrong_key_is_refused() -> None:
    with pytest.raises(StampError, match="bad stamp signature"):
        verify(sign(ALICE, OTHER_KEY), KEY)


def test_payload_changed_under_a_valid_signature_is_refused() -> None:
    stamp = sign(ALICE, KEY)
    claims = payload_of(stamp)
    claims["org"] = "org-b"
    forged = b64(json.dumps(claims).encode()) + "." + stamp.split(".")[1]
    with pytest.raises(StampError, match="bad stamp signature"):
        verify(forged, KEY)


def test_signature_changed_is_refused() -> None:
    payload, signature = sign(ALICE, KEY).split(".")
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    with pytest.raises(StampError, match="bad stamp signature"):
        verify(f"{payload}.{flipped}", KEY)


def test_expired_stamp_is_refused() -> None:
    stamp = sign(ALICE, KEY, ttl_s=60, now=time.time() - 61)
    with pytest.raises(StampError, match="expired"):
        verify(stamp, KEY)


def test_expiry_is_exact() -> None:
    stamp = sign(ALICE, KEY, ttl_s=60, now=1000)
    assert verify(stamp, KEY, now=1059.9) == ALICE
    with pytest.raises(StampError, match="expired"):
        verify(stamp, KEY, now=1060)


def test_issued_in_the_future_beyond_the_skew_is_refused() -> None:
    assert verify(sign(ALICE, KEY, now=1000 + MAX_SKEW_S), KEY, now=1000) == ALICE
    with pytest.raises(StampError, match="future"):
        verify(sign(ALICE, KEY, now=1001 + MAX_SKEW_S), KEY, now=1000)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "nodot",
        ".",
        "abc.",
        ".abc",
        "a.b.c",
        "é.é",
        "x" * 9000,
    ],
)
def test_malformed_input_is_refused(value: str) -> None:
    with pytest.raises(StampError):
        verify(value, KEY)


def _signed(claims: object) -> str:
    """A correctly MACed stamp with arbitrary content: what a buggy signer could produce."""
    payload = b64(json.dumps(claims).encode())
    return payload + "." + b64(hmac.new(KEY, payload.encode(), hashlib.sha256).digest())


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ([1, 2], "not an object"),
        ({"org": "a", "user": "u", "scopes": [], "iat": 1000, "nonce": "n"}, "'exp'"),
        ({"org": "a", "user": "u", "scopes": [], "iat": True, "exp": 1060, "nonce": "n"}, "'iat'"),
        ({"org": "a", "user": "u", "scopes": [], "iat": 1000, "exp": 999, "nonce": "n"}, "lifetime"),
        ({"org": "a", "user": "u", "scopes": [], "iat": 1000, "exp": 100000, "nonce": "n"}, "lifetime"),
        ({"org": "a", "user": "u", "scopes": [], "iat": 1000, "exp": 1060}, "nonce"),
        ({"org": 7, "user": "u", "scopes": [], "iat": 1000, "exp": 1060, "nonce": "n"}, "strings"),
        ({"org": "", "user": "u", "scopes": [], "iat": 1000, "exp": 1060, "nonce": "n"}, "org"),
        ({"org": "a", "user": "u", "scopes": "admin", "iat": 1000, "exp": 1060, "nonce": "n"}, "scopes"),
        ({"org": "a", "user": "u", "scopes": ["a b"], "iat": 1000, "exp": 1060, "nonce": "n"}, "scope"),
    ],
)
def test_well_signed_but_malformed_claims_are_refused(claims: object, reason: str) -> None:
    with pytest.raises(StampError, match=reason):
        verify(_signed(claims), KEY, now=1010)


def test_short_keys_and_long_lifetimes_are_refused_at_signing() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        sign(ALICE, b"short")
    with pytest.raises(ValueError, match="ttl"):
        sign(ALICE, KEY, ttl_s=3600)
    with pytest.raises(ValueError, match="32 bytes"):
        verify(sign(ALICE, KEY), b"")


def test_identity_needs_org_and_user() -> None:
    with pytest.raises(ValueError, match="org"):
        Identity("", "alice")
    with pytest.raises(ValueError, match="user"):
        Identity("org-a", "")


# A real backend (uvicorn on loopback) that depends on require_identity, reached directly:
# what an attacker who got past the edge onto the internal network could send.


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    with serve_asgi(echo_backend(KEY)) as url:
        yield url


def test_backend_accepts_a_valid_stamp(backend: str) -> None:
    response = httpx.get(f"{backend}/whoami", headers={"X-Warren-Identity": sign(ALICE, KEY)})
    assert response.status_code == 200
    assert response.json()["org"] == "org-a"
    assert response.json()["user"] == "alice"
    assert response.json()["scopes"] == ["sandbox:read", "sandbox:write"]


def test_backend_refuses_no_stamp(backend: str) -> None:
    response = httpx.get(f"{backend}/whoami")
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
    assert "stamp" in response.json()["message"]


def test_backend_refuses_a_stamp_forged_with_another_key(backend: str) -> None:
    forged = sign(Identity("org-b", "mallory", frozenset({"admin"})), OTHER_KEY)
    response = httpx.get(f"{backend}/whoami", headers={"X-Warren-Identity": forged})
    assert response.status_code == 401
    assert response.json() == {"error": "unauthenticated", "message": "bad stamp signature"}


def test_backend_refuses_an_edited_stamp(backend: str) -> None:
    stamp = sign(ALICE, KEY)
    claims = payload_of(stamp)
    claims["org"] = "org-b"
    forged = b64(json.dumps(claims).encode()) + "." + stamp.split(".")[1]
    response = httpx.get(f"{backend}/whoami", headers={"X-Warren-Identity": forged})
    assert response.status_code == 401


def test_backend_refuses_an_expired_stamp(backend: str) -> None:
    stale = sign(ALICE, KEY, ttl_s=60, now=time.time() - 120)
    response = httpx.get(f"{backend}/whoami", headers={"X-Warren-Identity": stale})
    assert response.status_code == 401
    assert response.json()["message"] == "stamp expired"


def test_backend_refuses_two_stamps(backend: str) -> None:
    headers = [("X-Warren-Identity", sign(ALICE, KEY)), ("X-Warren-Identity", sign(ALICE, KEY))]
    response = httpx.get(f"{backend}/whoami", headers=headers)
    assert response.status_code == 401


def test_backend_ignores_identity_claimed_in_body_and_other_headers(backend: str) -> None:
    # Without a stamp, no amount of claiming helps.
    claim = {"org": "org-b", "user": "mallory", "scopes": ["admin"]}
    bare = httpx.post(
        f"{backend}/sandboxes",
        json=claim,
        headers={"X-Warren-Org": "org-b", "X-Warren-User": "mallory", "X-Org": "org-b"},
    )
    assert bare.status_code == 401
    # With a stamp, the stamp wins over the body and the other headers.
    stamped = httpx.post(
        f"{backend}/sandboxes",
        json=claim,
        headers={"X-Warren-Identity": sign(ALICE, KEY), "X-Warren-Org": "org-b", "X-Org": "org-b"},
    )
    assert stamped.status_code == 200
    assert (stamped.json()["org"], stamped.json()["user"]) == ("org-a", "alice")
