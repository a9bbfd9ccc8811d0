"""The edge end to end: uvicorn-served edge and backend, a local OIDC issuer, requests over HTTP."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlencode

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from e2b.sandbox.signature import get_signature
from localservers import (
    AUDIENCE,
    Issuer,
    echo_backend,
    hs256_with_public_key,
    run_issuer,
    serve_asgi,
    unsigned_token,
)
from warren_control.edge import SignatureError, file_signature, make_edge, signed_file_query
from warren_control.identity import Identity, sign
from warren_control.keys import KeyFormat, NewKey, StoredKey, new_key, parse
from warren_control.oidc import OidcVerifier

STAMP_KEY = b"s" * 32


class MemoryResolver:
    def __init__(self) -> None:
        self.records: dict[str, StoredKey] = {}
        self.lookups: list[str] = []

    def add(
        self,
        org: str,
        user: str,
        scopes: set[str],
        *,
        revoked: bool = False,
        key_format: KeyFormat = "warren",
    ) -> NewKey:
        key = new_key(key_format)
        self.records[key.key_id] = StoredKey(org, user, frozenset(scopes), revoked, key.secret_sha256)
        return key

    def lookup(self, key_id: str) -> StoredKey | None:
        self.lookups.append(key_id)
        return self.records.get(key_id)


@dataclass
class Stack:
    edge: str
    backend: str
    issuer: Issuer
    resolver: MemoryResolver
    key_a: NewKey
    key_b: NewKey
    revoked: NewKey
    e2b_key: NewKey


# Every test runs against an edge that forwards over HTTP (`--role edge`) and one that calls
# the API in its own process (`--role all`): the two must not differ in anything a client or
# the API can see.
@pytest.fixture(scope="module", params=["http", "in-process"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    resolver = MemoryResolver()
    key_a = resolver.add("org-a", "alice", {"sandbox:read", "sandbox:write"})
    key_b = resolver.add("org-b", "bob", {"sandbox:read"})
    revoked = resolver.add("org-a", "carol", {"sandbox:read"}, revoked=True)
    e2b_key = resolver.add("org-b", "erin", {"sandbox:read"}, key_format="e2b")

    def scope_rule(method: str, path: str) -> str | None:
        return "admin" if path.startswith("/admin/") else None

    api = echo_backend(STAMP_KEY)
    with run_issuer() as issuer, serve_asgi(api) as backend:
        oidc = OidcVerifier.discover(issuer.url, AUDIENCE)
        in_process = api if request.param == "in-process" else None
        edge_app = make_edge(
            backend, STAMP_KEY, resolver, oidc, required_scope=scope_rule, backend_app=in_process
        )
        with serve_asgi(edge_app) as edge:
            yield Stack(edge, backend, issuer, resolver, key_a, key_b, revoked, e2b_key)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_api_key_yields_its_identity(stack: Stack) -> None:
    response = httpx.get(f"{stack.edge}/v1/whoami", headers=bearer(stack.key_a.token))
    assert response.status_code == 200
    seen = response.json()
    assert (seen["org"], seen["user"], seen["scopes"]) == (
        "org-a",
        "alice",
        ["sandbox:read", "sandbox:write"],
    )
    # The backend sees the stamp and nothing of the client's credentials.
    assert seen["warren_headers"] == ["x-warren-identity"]
    assert seen["authorization"] is None


def test_e2b_sdk_header_and_key_format_yield_the_identity(stack: Stack) -> None:
    assert stack.e2b_key.token.startswith("e2b_")
    for headers in ({"X-API-KEY": stack.e2b_key.token}, bearer(stack.e2b_key.token)):
        seen = httpx.get(f"{stack.edge}/v1/whoami", headers=headers).json()
        assert (seen["org"], seen["user"]) == ("org-b", "erin")
        # The backend trusts the stamp alone: the key itself never reaches it.
        assert (seen["x_api_key"], seen["authorization"]) == (None, None)
    # Either format goes in either header.
    seen = httpx.get(f"{stack.edge}/v1/whoami", headers={"X-API-KEY": stack.key_a.token}).json()
    assert seen["org"] == "org-a"
    # Org A's key id with the E2B key's secret is no key: the id and secret go together.
    secret = parse(stack.e2b_key.token).secret
    forged = f"e2b_{new_key('e2b').key_id}{secret}"
    response = httpx.get(f"{stack.edge}/v1/whoami", headers={"X-API-KEY": forged})
    assert (response.status_code, response.json()["message"]) == (401, "invalid API key")


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"X-API-KEY": "e2b_0123"}, "malformed API key"),
        ({"X-API-KEY": "eyJhbGciOiJSUzI1NiJ9.e30.sig"}, "X-API-KEY holds no API key"),
        ({"X-API-KEY": "", "Authorization": "Bearer wk_x"}, "more than one credential"),
    ],
)
def test_bad_x_api_key_is_named(stack: Stack, headers: dict[str, str], message: str) -> None:
    response = httpx.get(f"{stack.edge}/v1/whoami", headers=headers)
    assert response.status_code == 401
    assert message in response.json()["message"]


def test_each_key_yields_its_own_org_and_never_another(stack: Stack) -> None:
    a = httpx.get(f"{stack.edge}/v1/whoami", headers=bearer(stack.key_a.token)).json()
    b = httpx.get(f"{stack.edge}/v1/whoami", headers=bearer(stack.key_b.token)).json()
    assert (a["org"], b["org"]) == ("org-a", "org-b")
    # Org A's key id with org B's secret (and the reverse) is no key at all.
    for key_id, secret in (
        (stack.key_a.key_id, parse(stack.key_b.token).secret),
        (stack.key_b.key_id, parse(stack.key_a.token).secret),
    ):
        response = httpx.get(f"{stack.edge}/v1/whoami", headers=bearer(f"wk_{key_id}_{secret}"))
        assert response.status_code == 401


def test_client_stamp_is_dropped_and_replaced(stack: Stack) -> None:
    # Even a stamp correctly signed with the real key (say, one leaked from the network) naming
    # org B does not survive the edge: the backend sees the identity of the key presented.
    stolen = sign(Identity("org-b", "bob", frozenset({"admin"})), STAMP_KEY)
    response = httpx.post(
        f"{stack.edge}/v1/sandboxes",
        headers={
            **bearer(stack.key_a.token),
            "X-Warren-Identity": stolen,
            "X-Warren-Org": "org-b",
            "x-warren-user": "bob",
            "X-Forwarded-For": "10.9.9.9",
            "Cookie": "session=abc",
            "X-Request-Id": "req-1",
        },
        json={"org": "org-b", "user": "bob", "identity": {"org": "org-b"}},
    )
    assert response.status_code == 200
    seen = response.json()
    assert (seen["org"], seen["user"]) == ("org-a", "alice")
    assert "admin" not in seen["scopes"]
    assert seen["warren_headers"] == ["x-warren-identity"]
    assert seen["x_forwarded_for"] is None
    assert seen["cookie"] is None
    assert seen["x_request_id"] == "req-1"


def test_client_stamp_without_credentials_is_refused_at_the_edge(stack: Stack) -> None:
    stolen = sign(Identity("org-b", "bob", frozenset()), STAMP_KEY)
    response = httpx.get(f"{stack.edge}/v1/whoami", headers={"X-Warren-Identity": stolen})
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
    assert "missing credentials" in response.json()["message"]
    assert response.headers["www-authenticate"] == "Bearer"


def test_forged_stamp_straight_to_the_backend_is_refused(stack: Stack) -> None:
    forged = sign(Identity("org-b", "mallory", frozenset({"admin"})), b"f" * 32)
    response = httpx.get(f"{stack.backend}/v1/whoami", headers={"X-Warren-Identity": forged})
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"


def test_expired_stamp_straight_to_the_backend_is_refused(stack: Stack) -> None:
    stale = sign(Identity("org-a", "alice", frozenset()), STAMP_KEY, now=time.time() - 600)
    response = httpx.get(f"{stack.backend}/v1/whoami", headers={"X-Warren-Identity": stale})
    assert response.status_code == 401
    assert response.json()["message"] == "stamp expired"


def test_unknown_key_and_wrong_secret_get_the_same_answer(stack: Stack) -> None:
    unknown = new_key().token
    wrong_secret = f"wk_{stack.key_a.key_id}_{parse(new_key().token).secret}"
    answers = [httpx.get(f"{stack.edge}/v1/whoami", headers=bearer(t)) for t in (unknown, wrong_secret)]
    assert [a.status_code for a in answers] == [401, 401]
    assert (
        answers[0].json()
        == answers[1].json()
        == {"error": "unauthenticated", "message": "invalid API key", "code": 401}
    )


def test_revoked_key_is_refused(stack: Stack) -> None:
    response = httpx.get(f"{stack.edge}/v1/whoami", headers=bearer(stack.revoked.token))
    assert response.status_code == 401
    assert response.json()["message"] == "API key revoked"
    # A wrong secret for the revoked key's id does not learn that it exists or was revoked.
    guess = f"wk_{stack.revoked.key_id}_{parse(new_key().token).secret}"
    response = httpx.get(f"{stack.edge}/v1/whoami", headers=bearer(guess))
    assert response.json()["message"] == "invalid API key"


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing credentials"),
        ({"Authorization": "Basic YWxpY2U6cGFzcw=="}, "unsupported authorization scheme"),
        ({"Authorization": "Bearer"}, "empty bearer token"),
        ({"Authorization": "Bearer wk_tooshort"}, "malformed API key"),
    ],
)
def test_bad_credentials_are_named(stack: Stack, headers: dict[str, str], message: str) -> None:
    response = httpx.get(f"{stack.edge}/v1/whoami", headers=headers)
    assert response.status_code == 401
    assert message in response.json()["message"]


def test_oidc_tokens_yield_their_identity(stack: Stack) -> None:
    for alg in ("RS256", "ES256"):
        token = stack.issuer.token(alg, sub="dave", org="org-b", scope="sandbox:read")
        seen = httpx.get(f"{stack.edge}/v1/whoami", headers=bearer(token)).json()
        assert (seen["org"], seen["user"], seen["scopes"]) == ("org-b", "dave", ["sandbox:read"])


def test_bad_oidc_tokens_are_refused_with_the_reason(stack: Stack) -> None:
    issuer = stack.issuer
    now = int(time.time())
    cases = {
        "bad token signature": jwt.encode(
            issuer.claims(),
            rsa.generate_private_key(public_exponent=65537, key_size=2048),
            algorithm="RS256",
            headers={"kid": "rsa-1"},
        ),
        "'none' is not allowed": unsigned_token(issuer),
        "'HS256' is not allowed": hs256_with_public_key(issuer),
        "token expired": issuer.token(iat=now - 3600, nbf=now - 3600, exp=now - 60),
        "wrong audience": issuer.token(aud="another-api"),
        "wrong issuer": issuer.token(iss="https://elsewhere.invalid"),
    }
    for reason, token in cases.items():
        response = httpx.get(f"{stack.edge}/v1/whoami", headers=bearer(token))
        assert response.status_code == 401, reason
        assert reason in response.json()["message"]


def test_edge_without_oidc_refuses_tokens(stack: Stack) -> None:
    edge_app = make_edge(stack.backend, STAMP_KEY, stack.resolver, None)
    with serve_asgi(edge_app) as edge:
        response = httpx.get(f"{edge}/v1/whoami", headers=bearer(stack.issuer.token()))
        assert response.status_code == 401
        assert "accepts no OIDC tokens" in response.json()["message"]
        assert httpx.get(f"{edge}/v1/whoami", headers=bearer(stack.key_a.token)).status_code == 200


def test_scope_hook_refuses_with_403(stack: Stack) -> None:
    response = httpx.get(f"{stack.edge}/admin/orgs", headers=bearer(stack.key_a.token))
    assert response.status_code == 403
    assert response.json() == {
        "error": "forbidden",
        "message": "this request needs the 'admin' scope",
        "code": 403,
    }


def test_method_path_query_and_body_are_forwarded(stack: Stack) -> None:
    body = bytes(range(256)) * 1000
    response = httpx.put(
        f"{stack.edge}/v1/sandboxes/sbx_1/files/a%20b%2Fc?path=%2Fwork%2Fx&n=1&n=2",
        headers={**bearer(stack.key_a.token), "Content-Type": "application/octet-stream"},
        content=body,
    )
    seen = response.json()
    assert seen["method"] == "PUT"
    assert seen["path"] == "/v1/sandboxes/sbx_1/files/a%20b%2Fc"
    assert seen["query"] == "path=%2Fwork%2Fx&n=1&n=2"
    assert seen["body_len"] == len(body)
    assert seen["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_chunked_request_body_is_forwarded(stack: Stack) -> None:
    parts = [b"x" * 1000, b"y" * 70000, b"z"]

    def chunks() -> Iterator[bytes]:
        yield from parts

    response = httpx.post(f"{stack.edge}/v1/upload", headers=bearer(stack.key_a.token), content=chunks())
    assert response.json()["body_len"] == sum(map(len, parts))


def test_backend_status_and_headers_come_back(stack: Stack) -> None:
    response = httpx.get(f"{stack.edge}/status/404", headers=bearer(stack.key_a.token))
    assert response.status_code == 404
    assert response.headers["x-backend"] == "yes"
    assert response.json() == {"error": "not_found", "message": "no such thing"}


def test_streamed_output_arrives_while_it_is_produced(stack: Stack) -> None:
    arrivals: list[tuple[float, bytes]] = []
    with httpx.stream(
        "GET", f"{stack.edge}/stream/lines?n=5&pause=0.3", headers=bearer(stack.key_a.token)
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-exit-code"] == "0"
        for line in response.iter_lines():
            arrivals.append((time.monotonic(), line.encode()))
    assert [line.split()[:3] for _, line in arrivals] == [
        [b"org-a", b"line", str(i).encode()] for i in range(5)
    ]
    # The first line reached the client before the backend produced the last one: relayed, not buffered.
    first_received = arrivals[0][0]
    last_produced = float(arrivals[-1][1].split()[3])
    assert first_received < last_produced


def test_client_going_away_ends_the_backend_stream(stack: Stack) -> None:
    # A client that stops reading an exec stream must not leave it running behind the edge.
    tag = new_key().key_id
    with httpx.stream(
        "GET", f"{stack.edge}/stream/lines?n=1000&pause=0.05&tag={tag}", headers=bearer(stack.key_a.token)
    ) as response:
        next(response.iter_lines())
    deadline = time.monotonic() + 10
    outcome = None
    while outcome is None and time.monotonic() < deadline:
        time.sleep(0.1)
        outcome = httpx.get(f"{stack.edge}/stream/ended/{tag}", headers=bearer(stack.key_a.token)).json()[
            "outcome"
        ]
    assert outcome == "cancelled"


def test_backend_down_is_a_502(stack: Stack) -> None:
    edge_app = make_edge("http://127.0.0.1:9", STAMP_KEY, stack.resolver, None)
    with serve_asgi(edge_app) as edge:
        response = httpx.get(f"{edge}/v1/whoami", headers=bearer(stack.key_a.token))
    assert response.status_code == 502
    assert response.json()["error"] == "bad_gateway"


def test_resolver_failure_is_a_503_not_a_pass(stack: Stack) -> None:
    class Broken:
        def lookup(self, key_id: str) -> StoredKey | None:
            raise RuntimeError("database down")

    edge_app = make_edge(stack.backend, STAMP_KEY, Broken(), None)
    with serve_asgi(edge_app) as edge:
        response = httpx.get(f"{edge}/v1/whoami", headers=bearer(stack.key_a.token))
    assert response.status_code == 503
    assert response.json()["error"] == "unavailable"


def test_short_stamp_key_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        make_edge("http://127.0.0.1:9", b"short", MemoryResolver(), None)


# --- signed file URLs (the sandbox side is in test_e2b_edge.py) ---------------------------------


@pytest.mark.parametrize(("user", "expiring"), [(None, None), ("root", None), (None, 60), ("user", 3600)])
def test_file_signatures_are_the_sdk_s(user: str | None, expiring: int | None) -> None:
    made = get_signature("/home/user/a b.txt", "read", user, "t0ken", expiring)
    assert made["signature"] == file_signature(
        "/home/user/a b.txt", "read", user or "", "t0ken", made["expiration"]
    )


def signed(
    path: str, operation: str = "read", user: str = "", expiration: int | None = None, **more: str
) -> bytes:
    params = {"path": path, **({"username": user} if user else {})}
    params["signature"] = file_signature(path, operation, user, "t0ken", expiration)
    if expiration is not None:
        params["signature_expiration"] = str(expiration)
    return urlencode({**params, **more}).encode("ascii")


def test_a_signed_query_reaches_the_agent_as_checked() -> None:
    now = time.time()
    query = signed("/tmp/a&b=c.txt", user="root", expiration=int(now) + 60)
    assert signed_file_query("GET", query, "t0ken", now) == b"path=/tmp/a%26b%3Dc.txt&username=root"
    assert signed_file_query("POST", signed("/x", "write"), "t0ken", now) == b"path=/x"


@pytest.mark.parametrize(
    ("method", "query", "words"),
    [
        ("GET", signed("/x", "write"), "invalid signature for read of '/x'"),
        ("PUT", signed("/x"), "GET (download) or POST (upload)"),
        ("GET", signed("/x") + b"&path=/y", "'path' appears twice"),
        ("GET", signed("/x", extra="1"), "'extra' is not part of a signed file URL"),
        ("GET", signed("/x", expiration=1), "expired at 1970-01-01T00:00:01+00:00"),
        ("GET", signed("/x") + b"&signature_expiration=soon", "must be a Unix time"),
        ("GET", b"path=/x&signature=%ff", "not valid percent-encoded UTF-8"),
        ("GET", b"path=/x", "invalid signature"),
    ],
)
def test_bent_signed_queries_are_refused(method: str, query: bytes, words: str) -> None:
    with pytest.raises(SignatureError, match=re.escape(words)):
        signed_file_query(method, query, "t0ken", time.time())
    # Nor does another sandbox's token make a good one of a good query.
    with pytest.raises(SignatureError, match="invalid signature"):
        signed_file_query("GET", signed("/x"), "another", time.time())
