"""Organization secrets: how they are sealed at rest, where they may be sent and how they
are put into a request. The egress gateway (gateway.py) is the only reader of a value; the
API only ever seals one.

A value is sealed with AES-256-GCM under a key derived (HKDF-SHA256) from key material the
control plane holds; the organization, the secret's id and its version are the associated
data, so a sealed value copied onto another row, or kept from before a rotation, does not
open.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

NONCE_BYTES = 12
MAX_HOST = 253  # a DNS name's length at most
MIN_KEY_MATERIAL = 32
NAME = r"^[a-z][a-z0-9-]{0,62}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# A header name as HTTP defines a token; a template puts the value where {secret} stands.
HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$"
SLOT = "{secret}"
# Headers the gateway sets itself or that would change where or how the request goes.
RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "proxy-authorization"}
)
PLACEHOLDER = "warren-secret-placeholder-{name}"
# The environment variable a sandbox bound to secrets finds the gateway's URL in.
GATEWAY_ENV = "WARREN_GATEWAY_URL"


class SecretError(ValueError):
    """A secret's settings are wrong; the message names the problem and the fix."""


class SealError(RuntimeError):
    """A sealed value does not open under this key (another key, or tampered with)."""


@dataclass(frozen=True)
class Destination:
    """Where a secret may go: https, one host, one port, and a path prefix."""

    host: str
    port: int
    path_prefix: str

    @classmethod
    def parse(cls, url: str) -> Destination:
        parts = urlsplit(url.strip())
        if parts.scheme != "https":
            raise SecretError(
                f"destination {url!r}: only https destinations are allowed (https://HOST[:PORT][/PREFIX])"
            )
        if parts.username or parts.password:
            raise SecretError(
                f"destination {url!r}: credentials in the URL are not allowed; the secret is the credential"
            )
        if parts.query or parts.fragment:
            raise SecretError(
                f"destination {url!r}: a query or fragment is not allowed; give https://HOST[:PORT][/PREFIX]"
            )
        host = (parts.hostname or "").rstrip(".")
        if not host:
            raise SecretError(f"destination {url!r}: no host; give https://HOST[:PORT][/PREFIX]")
        try:
            port = parts.port or 443
        except ValueError as exc:
            raise SecretError(f"destination {url!r}: the port is not a number from 1 to 65535") from exc
        if not _valid_host(host):
            raise SecretError(f"destination {url!r}: {host!r} is not a DNS name or IP address")
        prefix = parts.path or "/"
        if not _clean_path(prefix):
            raise SecretError(
                f"destination {url!r}: the path prefix must be plain segments (no '.', '..' or '//')"
            )
        return cls(host.lower(), port, prefix)

    def url(self) -> str:
        return f"https://{self.authority()}{self.path_prefix}"

    def authority(self) -> str:
        """HOST[:PORT] as a gateway URL names the destination."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 443 else f"{host}:{self.port}"  # noqa: PLR2004

    def allows(self, path: str) -> bool:
        """Whether `path` (a clean absolute path) lies under the prefix, segment by segment."""
        if self.path_prefix in {"/", path}:
            return True
        prefix = self.path_prefix if self.path_prefix.endswith("/") else self.path_prefix + "/"
        return path.startswith(prefix)


@dataclass(frozen=True)
class Injection:
    """How a secret goes into a request: a header from a template, or a query parameter."""

    header: str | None = None
    template: str = SLOT
    query: str | None = None

    @classmethod
    def of(cls, header: str | None, template: str | None, query: str | None) -> Injection:
        if (header is None) == (query is None):
            raise SecretError("give exactly one of header (with an optional template) and query")
        if query is not None:
            if template is not None:
                raise SecretError(
                    "a template applies to a header only; a query parameter carries the value as it is"
                )
            if not re.fullmatch(r"^[A-Za-z0-9._~-]{1,128}$", query):
                raise SecretError(f"query parameter {query!r}: use letters, digits and . _ ~ - only")
            return cls(query=query)
        if header is None or not re.fullmatch(HEADER_NAME, header):
            raise SecretError(f"header {header!r} is not an HTTP header name")
        if header.lower() in RESERVED_HEADERS:
            raise SecretError(
                f"header {header!r} is set by the gateway itself; choose another (Authorization, say)"
            )
        template = SLOT if template is None else template
        if template.count(SLOT) != 1:
            raise SecretError(f"the template must hold {SLOT} exactly once, e.g. 'Bearer {SLOT}'")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in template):  # noqa: PLR2004 (control characters)
            raise SecretError("the template must not hold control characters")
        return cls(header=header, template=template)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Injection:
        return cls(
            header=record.get("header"), template=record.get("template") or SLOT, query=record.get("query")
        )

    def record(self) -> dict[str, Any]:
        if self.query is not None:
            return {"query": self.query}
        return {"header": self.header, "template": self.template}

    def header_value(self, value: str) -> str:
        return self.template.replace(SLOT, value)


def check_value(value: str) -> bytes:
    """The value as bytes, refused where it could not travel in a header or a query."""
    if not value:
        raise SecretError("the value is empty")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):  # noqa: PLR2004
        raise SecretError(
            "the value holds control characters (a trailing newline from a file, say); strip them"
        )
    encoded = value.encode("utf-8")
    if len(encoded) > 8192:  # noqa: PLR2004
        raise SecretError("the value is longer than 8192 bytes")
    return encoded


def check_name(name: str) -> str:
    if not re.fullmatch(NAME, name):
        raise SecretError(
            f"secret name {name!r}: use lower-case letters, digits and '-', starting with a letter"
        )
    return name


def placeholder(name: str) -> str:
    """What a sandbox holds in place of the secret: a token-shaped value that opens nothing."""
    return PLACEHOLDER.format(name=name)


class SecretBox:
    """Seals and opens secret values with the control plane's key."""

    def __init__(self, material: bytes) -> None:
        if len(material) < MIN_KEY_MATERIAL:
            raise SecretError(f"the secrets key needs at least {MIN_KEY_MATERIAL} bytes")
        kdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"warren secrets at rest v1")
        self._aead = AESGCM(kdf.derive(material))

    @classmethod
    def from_file(cls, path: str | Path) -> SecretBox:
        return cls(Path(path).read_bytes().strip())

    def seal(self, org: str, secret_id: str, version: int, value: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, value, _bound(org, secret_id, version))

    def open(self, org: str, secret_id: str, version: int, sealed: bytes) -> bytes:
        try:
            return self._aead.decrypt(
                sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _bound(org, secret_id, version)
            )
        except (InvalidTag, ValueError) as exc:
            raise SealError(f"secret {secret_id} version {version} does not open under this key") from exc


def _bound(org: str, secret_id: str, version: int) -> bytes:
    return f"{org}\0{secret_id}\0{version}".encode()


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    label = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    return len(host) <= MAX_HOST and all(re.fullmatch(label, part) for part in host.split("."))


def _clean_path(path: str) -> bool:
    """An absolute path of plain segments: no '.', '..', empty segment, backslash or escape."""
    if not path.startswith("/") or "\\" in path or "%" in path:
        return False
    segments = path[1:].split("/")
    inner = segments[:-1] if segments and segments[-1] == "" else segments
    return all(s not in {"", ".", ".."} for s in inner) and all(0x20 < ord(c) < 0x7F for c in path)  # noqa: PLR2004


def clean_request_path(path: str) -> bool:
    """Whether a path a sandbox asked for is plain (the gateway refuses anything else):
    percent-escapes are allowed where they stand for ordinary characters, never '/', '.'
    or '\\' in disguise."""
    lowered = path.lower()
    if any(escape in lowered for escape in ("%2f", "%2e", "%5c", "%00")):
        return False
    return _clean_path(path.replace("%", "x"))
