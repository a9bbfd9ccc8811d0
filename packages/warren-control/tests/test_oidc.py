"""OIDC bearer tokens against a local issuer with its own RSA and EC keys, over real HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from localservers import AUDIENCE, Issuer, hs256_with_public_key, run_issuer, unsigned_token
from warren_control.identity import Identity
from warren_control.oidc import OidcError, OidcVerifier


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    with run_issuer() as running:
        yield running


@pytest.fixture
def verifier(issuer: Issuer) -> OidcVerifier:
    return OidcVerifier.discover(issuer.url, AUDIENCE)


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_valid_token_maps_to_identity(issuer: Issuer, verifier: OidcVerifier, alg: str) -> None:
    assert verifier.verify(issuer.token(alg)) == Identity(
        "org-a", "alice", frozenset({"sandbox:read", "sandbox:write"})
    )


def test_org_claim_is_configurable_and_scope_optional(issuer: Issuer) -> None:
    verifier = OidcVerifier(issuer.url, AUDIENCE, issuer.jwks_url, org_claim="https://warren/org")
    token = issuer.token(claims={"https://warren/org": "org-z", "org": "org-a", "scope": None})
    assert verifier.verify(token) == Identity("org-z", "alice", frozenset())


def test_audience_may_be_a_list_containing_ours(issuer: Issuer, verifier: OidcVerifier) -> None:
    assert verifier.verify(issuer.token(aud=["other", AUDIENCE])).org == "org-a"


def test_key_set_is_cached(issuer: Issuer) -> None:
    verifier = OidcVerifier(issuer.url, AUDIENCE, issuer.jwks_url)
    before = len(issuer.jwks_requests)
    for _ in range(5):
        verifier.verify(issuer.token("RS256"))
        verifier.verify(issuer.token("ES256"))
    assert len(issuer.jwks_requests) - before == 1


def refused(verifier: OidcVerifier, token: str) -> OidcError:
    with pytest.raises(OidcError) as caught:
        verifier.verify(token)
    assert not caught.value.temporary
    return caught.value


def test_token_signed_by_another_key_with_a_known_kid_is_refused(
    verifier: OidcVerifier, issuer: Issuer
) -> None:
    impostor = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode(issuer.claims(), impostor, algorithm="RS256", headers={"kid": "rsa-1"})
    assert refused(verifier, token).reason == "bad token signature"
    impostor_ec = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode(issuer.claims(), impostor_ec, algorithm="ES256", headers={"kid": "ec-1"})
    assert refused(verifier, token).reason == "bad token signature"


def test_unknown_key_id_is_refused(verifier: OidcVerifier, issuer: Issuer) -> None:
    assert "unknown key id" in refused(verifier, issuer.token(kid="rsa-9")).reason


def test_alg_none_is_refused(verifier: OidcVerifier, issuer: Issuer) -> None:
    assert "'none' is not allowed" in refused(verifier, unsigned_token(issuer)).reason


def test_hs256_with_the_public_key_as_secret_is_refused(verifier: OidcVerifier, issuer: Issuer) -> None:
    assert "'HS256' is not allowed" in refused(verifier, hs256_with_public_key(issuer)).reason


def test_token_cannot_switch_the_algorithm_of_a_key(verifier: OidcVerifier, issuer: Issuer) -> None:
    # ES256 signed with the EC key but naming the RSA key's id.
    token = jwt.encode(issuer.claims(), issuer.ec_key, algorithm="ES256", headers={"kid": "rsa-1"})
    assert "does not match key" in refused(verifier, token).reason


def test_expired_token_is_refused(verifier: OidcVerifier, issuer: Issuer) -> None:
    now = int(time.time())
    token = issuer.token(iat=now - 3600, nbf=now - 3600, exp=now - 600)
    assert refused(verifier, token).reason == "token expired"


def test_wrong_audience_is_refused(verifier: OidcVerifier, issuer: Issuer) -> None:
    assert "wrong audience" in refused(verifier, issuer.token(aud="another-api")).reason


def test_wrong_issuer_is_refused(verifier: OidcVerifier, issuer: Issuer) -> None:
    assert "wrong issuer" in refused(verifier, issuer.token(iss="https://elsewhere.invalid")).reason


def test_not_yet_valid_is_refused(verifier: OidcVerifier, issuer: Issuer) -> None:
    later = int(time.time()) + 3600
    assert "not yet valid" in refused(verifier, issuer.token(nbf=later)).reason
    assert "not yet valid" in refused(verifier, issuer.token(iat=later, nbf=None)).reason


@pytest.mark.parametrize("claim", ["exp", "iat", "sub", "aud", "iss"])
def test_required_claims_must_be_present(verifier: OidcVerifier, issuer: Issuer, claim: str) -> None:
    assert f"no '{claim}' claim" in refused(verifier, issuer.token(claims={claim: None})).reason


def test_token_without_an_org_is_refused(verifier: OidcVerifier, issuer: Issuer) -> None:
    assert "organization" in refused(verifier, issuer.token(org=None)).reason
    assert "organization" in refused(verifier, issuer.token(org=["org-a", "org-b"])).reason


def test_scope_must_be_a_string(verifier: OidcVerifier, issuer: Issuer) -> None:
    assert "scope" in refused(verifier, issuer.token(scope=["admin"])).reason


@pytest.mark.parametrize("token", ["", "garbage", "a.b.c", "x" * 20000])
def test_malformed_tokens_are_refused(verifier: OidcVerifier, token: str) -> None:
    assert refused(verifier, token).reason


def test_unreachable_issuer_is_a_temporary_failure(issuer: Issuer) -> None:
    # Port 9 (discard): nothing listens there on loopback.
    verifier = OidcVerifier(issuer.url, AUDIENCE, "http://127.0.0.1:9/jwks", timeout_s=2)
    with pytest.raises(OidcError) as caught:
        verifier.verify(issuer.token())
    assert caught.value.temporary


def test_discovery_must_name_the_same_issuer(issuer: Issuer) -> None:
    with pytest.raises(OidcError, match="names issuer"):
        OidcVerifier.discover(issuer.url + "/", AUDIENCE)


def test_plain_http_keys_only_on_loopback() -> None:
    with pytest.raises(ValueError, match="https"):
        OidcVerifier("https://id.example", AUDIENCE, "http://id.example/jwks")
    with pytest.raises(ValueError, match="https"):
        OidcVerifier("https://id.example", AUDIENCE, "file:///etc/jwks.json")
