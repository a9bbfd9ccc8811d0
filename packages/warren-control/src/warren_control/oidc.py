"""OIDC bearer tokens: a JWT checked against the issuer's published keys (JWKS).

Only RS256 and ES256 are accepted, and the key found by the token's ``kid`` fixes the
algorithm: a token cannot choose "none", nor HS256 with the public key as the HMAC secret.
Issuer, audience, expiry, not-before and issued-at are all required and checked.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt
from jwt import PyJWK, PyJWKClient

from .identity import Identity

ALGORITHMS = ("RS256", "ES256")
_REQUIRED_CLAIMS = ["iss", "aud", "sub", "exp", "iat"]
# Real tokens are a few KiB; anything far larger is refused before any parsing.
MAX_TOKEN_CHARS = 16384


class OidcError(Exception):
    """A token was refused. `temporary` means the issuer could not be reached, not a bad token."""

    def __init__(self, reason: str, *, temporary: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.temporary = temporary


def _check_url(url: str, what: str) -> None:
    # Keys fetched over plain HTTP could be swapped by anyone on the path; loopback is the
    # one place that is not a risk (a local issuer in tests or on a single node).
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname:
        host = parts.hostname
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if loopback:
            return
    raise ValueError(f"{what} must be an https URL (plain http only on loopback): {url!r}")


class OidcVerifier:
    """Verifies bearer JWTs from one issuer for one audience and maps them to an `Identity`.

    The key set is cached (`jwks_cache_s`); a token with an unknown key id triggers at most
    one refetch per cooldown, so random key ids cannot make us hammer the issuer.
    """

    def __init__(
        self,
        issuer: str,
        audience: str,
        jwks_url: str,
        *,
        org_claim: str = "org",
        leeway_s: float = 30,
        jwks_cache_s: float = 300,
        refetch_cooldown_s: float = 30,
        timeout_s: float = 10,
    ) -> None:
        if not issuer or not audience or not org_claim:
            raise ValueError("issuer, audience and org claim are required")
        _check_url(jwks_url, "the JWKS URL")
        self.issuer = issuer
        self.audience = audience
        self.org_claim = org_claim
        self.leeway_s = leeway_s
        self._jwks = PyJWKClient(
            jwks_url,
            cache_jwk_set=True,
            lifespan=jwks_cache_s,
            cooldown_duration=refetch_cooldown_s,
            timeout=timeout_s,
        )

    @classmethod
    def discover(cls, issuer: str, audience: str, *, timeout_s: float = 10, **options: Any) -> OidcVerifier:
        """Build a verifier from the issuer's /.well-known/openid-configuration."""
        _check_url(issuer, "the issuer")
        url = issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            response = httpx.get(url, timeout=timeout_s, follow_redirects=False)
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise OidcError(f"cannot read the issuer's discovery document: {exc}", temporary=True) from exc
        if not isinstance(document, dict):
            raise OidcError("the issuer's discovery document is not an object")
        # OIDC Discovery 4.3: the document must name exactly the issuer we asked, or another
        # party's document (and keys) could be passed off as this issuer's.
        if document.get("issuer") != issuer:
            raise OidcError(f"discovery document names issuer {document.get('issuer')!r}, not {issuer!r}")
        jwks_url = document.get("jwks_uri")
        if not isinstance(jwks_url, str):
            raise OidcError("discovery document has no jwks_uri")
        return cls(issuer, audience, jwks_url, timeout_s=timeout_s, **options)

    def _signing_key(self, kid: str) -> PyJWK:
        try:
            return self._jwks.get_signing_key(kid)
        except jwt.PyJWKClientConnectionError as exc:
            raise OidcError("cannot fetch the issuer's signing keys", temporary=True) from exc
        except jwt.PyJWKClientError as exc:
            if "Unable to find a signing key" in str(exc):
                raise OidcError(f"unknown key id {kid!r}") from exc
            raise OidcError(f"the issuer's key set is unusable: {exc}", temporary=True) from exc
        except (jwt.PyJWKSetError, jwt.PyJWKError) as exc:
            raise OidcError(f"the issuer's key set is unusable: {exc}", temporary=True) from exc

    def verify(self, token: str) -> Identity:
        """Verify `token` and return its identity, or raise `OidcError` naming the problem.

        Blocking (the key set may be fetched over the network): call it from a thread in
        async code.
        """
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise OidcError("malformed token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError as exc:
            raise OidcError("malformed token") from exc
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise OidcError(f"token algorithm {alg!r} is not allowed (only {', '.join(ALGORITHMS)})")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise OidcError("token has no key id (kid)")
        key = self._signing_key(kid)
        # The key's own algorithm decides; pyjwt also refuses a token whose alg differs from it.
        if key.algorithm_name not in ALGORITHMS or key.algorithm_name != alg:
            raise OidcError(f"token algorithm {alg!r} does not match key {kid!r}")
        return self._identity(self._decode(token, key))

    def _decode(self, token: str, key: PyJWK) -> dict[str, Any]:
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[key.algorithm_name],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway_s,
                options={
                    "require": _REQUIRED_CLAIMS,
                    "verify_signature": True,
                    "verify_exp": True,
                    "verify_nbf": True,
                    "verify_iat": True,
                    "verify_aud": True,
                    "verify_iss": True,
                },
            )
        except jwt.ExpiredSignatureError as exc:
            raise OidcError("token expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise OidcError("token not yet valid (nbf or iat in the future)") from exc
        except jwt.InvalidAudienceError as exc:
            raise OidcError(f"wrong audience (expected {self.audience!r})") from exc
        except jwt.InvalidIssuerError as exc:
            raise OidcError(f"wrong issuer (expected {self.issuer!r})") from exc
        except jwt.MissingRequiredClaimError as exc:
            raise OidcError(f"token has no {exc.claim!r} claim") from exc
        except jwt.InvalidSignatureError as exc:
            raise OidcError("bad token signature") from exc
        except jwt.InvalidAlgorithmError as exc:
            raise OidcError("token algorithm not allowed") from exc
        except jwt.InvalidTokenError as exc:
            raise OidcError(f"invalid token: {exc}") from exc
        return claims

    def _identity(self, claims: dict[str, Any]) -> Identity:
        org = claims.get(self.org_claim)
        if not isinstance(org, str) or not org:
            raise OidcError(f"token has no {self.org_claim!r} claim naming the organization")
        scope = claims.get("scope", "")
        if not isinstance(scope, str):
            raise OidcError("token 'scope' claim must be a space-separated string")
        try:
            return Identity(org=org, user=claims["sub"], scopes=frozenset(scope.split()))
        except (TypeError, ValueError) as exc:
            raise OidcError(f"token claims do not make an identity: {exc}") from exc
