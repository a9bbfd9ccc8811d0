"""The edge's E2B deliverables against the real edge, the real API and the real agent (which
plays the sandbox's pod at a loopback address, as in test_e2b_api.py):

- signed file URLs: the SDK's own ``download_url`` and ``upload_url``, used by a client that
  sends no header at all (a browser), and every way of bending one refused;
- a sandbox's own ports: reached with its token or its organization's API key, never with
  another organization's (which finds no sandbox, like a gone one), and no key ever reaches
  the sandbox;
- TLS: ``warren-control serve --role edge --tls-cert --tls-key`` with a wildcard certificate
  made here for the sandbox domain, checked by a client trusting only the CA made here.

Host names under the sandbox domain resolve nowhere: the `Loopback` transport connects to
the edge on 127.0.0.1 and keeps the URL's host as the Host header and the TLS server name,
which is what wildcard DNS would do.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from api_stack import STAMP_KEY, Stack, StandIn
from e2b import Sandbox
from test_e2b_api import (  # noqa: F401 (fixtures, used by name)
    agent_binary,
    e2b_stack,
    new_org,
    run_pod,
)
from warren_common import pki as pki_files
from warren_common.testing import free_port
from warren_control import cli
from warren_control.podspec import AGENT_PORT

pytest_plugins = ["api_fixtures"]

DOMAIN = "sandboxes.example"  # what e2b_stack serves
APP_PORT = 8080


# --- a client that sends sandbox host names to the edge on loopback -----------------------------


class Loopback(httpx.HTTPTransport):
    """Every request goes to `edge` (scheme, address, port), whatever host its URL names;
    that host stays the Host header and the name TLS checks the certificate against."""

    def __init__(self, edge: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.edge = httpx.URL(edge)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        named = request.url.host
        request.url = request.url.copy_with(scheme=self.edge.scheme, host=self.edge.host, port=self.edge.port)
        request.extensions = {**request.extensions, "sni_hostname": named}
        return super().handle_request(request)


def browser(edge: str, verify: ssl.SSLContext | bool = True) -> httpx.Client:
    """A client with no credentials and no headers of its own, like a browser's."""
    return httpx.Client(transport=Loopback(edge, verify=verify), timeout=30)


# --- certificates ---------------------------------------------------------------------------------


@dataclass
class Pki:
    ca: Path  # the CA the edge's certificate comes from
    cert: Path  # *.DOMAIN, signed by ca
    key: Path
    stranger_ca: Path  # a CA that signed nothing here

    def trusting(self, ca: Path) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(ca))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    made = pki_files.Pki(tmp_path_factory.mktemp("pki"))
    made.ensure_ca("ca", "Warren test CA")
    made.ensure_ca("stranger-ca", "Some other CA")
    wildcard = f"*.{DOMAIN}"
    made.ensure_leaf(
        pki_files.Leaf("edge", "ca", wildcard, usages=(pki_files.SERVER,), dns_names=(wildcard,))
    )
    return Pki(
        made.path("ca", "crt"),
        made.path("edge", "crt"),
        made.path("edge", "key"),
        made.path("stranger-ca", "crt"),
    )


# --- the edge with TLS, as the operator runs it ---------------------------------------------------


@pytest.fixture(scope="module")
def tls_edge(
    e2b_stack: Stack,  # noqa: F811
    pki: Pki,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """`warren-control serve --role edge` with the wildcard certificate, in front of the same
    API and records as e2b_stack; its https:// URL on loopback."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "warren_control.cli",
        "serve",
        "--role=edge",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--api-url={e2b_stack.api}",
        f"--database-url={e2b_stack.url}",
        f"--sandbox-domain={DOMAIN}",
        f"--tls-cert={pki.cert}",
        f"--tls-key={pki.key}",
    ]
    env = {**os.environ, "WARREN_STAMP_KEY": STAMP_KEY.decode()}
    log = tmp_path_factory.mktemp("tls-edge") / "edge.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        with browser(url, verify=pki.trusting(pki.ca)) as client:
            while True:
                try:
                    client.get(f"https://api.{DOMAIN}/healthz")  # any answer: it serves
                    break
                except httpx.TransportError:
                    failed = process.poll() is not None or time.monotonic() > deadline
                    assert not failed, log.read_text()
                    time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def pod_sandbox(
    e2b_stack: Stack,  # noqa: F811 (the fixture imported above)
    standin: StandIn,
    agent_binary: Path,  # noqa: F811
    tmp_path: Path,
) -> Iterator[Sandbox]:
    """A running sandbox as an SDK configured with E2B_API_KEY and E2B_API_URL alone sees it:
    its traffic goes to https://{port}-{id}.DOMAIN."""
    org = new_org(e2b_stack)
    sandbox = Sandbox.create("base", api_key=org.key, api_url=e2b_stack.edge)
    pod = run_pod(e2b_stack, standin, agent_binary, tmp_path, sandbox.sandbox_id)
    try:
        yield sandbox
    finally:
        pod.process.terminate()
        pod.process.wait(timeout=10)
        sandbox.kill()


def with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query.update(changes)
    return urlunsplit(parts._replace(query=urlencode(query)))


# --- signed file URLs -----------------------------------------------------------------------------


def test_signed_urls_download_and_upload_with_no_header(
    tls_edge: str, pki: Pki, pod_sandbox: Sandbox, tmp_path: Path
) -> None:
    report = tmp_path / "report.txt"
    report.write_text("made in the sandbox")
    host = f"{AGENT_PORT}-{pod_sandbox.sandbox_id}.{DOMAIN}"
    with browser(tls_edge, verify=pki.trusting(pki.ca)) as client:
        # The SDK's URLs, as they are: https, the sandbox's own host name, no header needed.
        for expiring in (None, 60):
            url = pod_sandbox.download_url(str(report), use_signature_expiration=expiring)
            assert url.startswith(f"https://{host}/files?path=")
            got = client.get(url)
            assert (got.status_code, got.text) == (200, "made in the sandbox")

        target = tmp_path / "uploads" / "new.txt"
        url = pod_sandbox.upload_url(str(target), use_signature_expiration=60)
        sent = client.post(url, files={"file": ("new.txt", b"from a browser")})
        assert sent.status_code == 200, sent.text
        assert target.read_bytes() == b"from a browser"


def test_bent_signed_urls_are_refused_by_name(
    tls_edge: str, pki: Pki, pod_sandbox: Sandbox, tmp_path: Path
) -> None:
    secret, report = tmp_path / "secret.txt", tmp_path / "report.txt"
    secret.write_text("not shared")
    report.write_text("shared")
    url = pod_sandbox.download_url(str(report), use_signature_expiration=60)
    signature = dict(parse_qsl(urlsplit(url).query))["signature"]
    other_id = "a" * 26
    refused = {
        "another path": (with_query(url, path=str(secret)), "invalid signature"),
        "a wrong signature": (with_query(url, signature=signature[:-2] + "AA"), "invalid signature"),
        "a later expiry": (with_query(url, signature_expiration=str(int(time.time()) + 86400)), "invalid"),
        "another user": (with_query(url, username="root"), "invalid signature"),
        "a path given twice": (url + "&path=" + str(secret), "appears twice"),
        "a parameter more": (url + "&extra=1", "'extra' is not part of a signed file URL"),
        "expired": (pod_sandbox.download_url(str(report), use_signature_expiration=-5), "expired at"),
        "another sandbox": (url.replace(pod_sandbox.sandbox_id, other_id), "invalid signature"),
        "no signature": (f"https://{urlsplit(url).netloc}/files?path={report}", "missing X-Access-Token"),
        "not /files": (url.replace("/files?", "/health2?"), "missing X-Access-Token"),
    }
    with browser(tls_edge, verify=pki.trusting(pki.ca)) as client:
        for what, (bent, words) in refused.items():
            answer = client.get(bent)
            assert answer.status_code == 401, what
            assert words in answer.json()["message"], (what, answer.json())
            assert "not shared" not in answer.text
        # A download URL does not upload, nor the reverse.
        answer = client.post(url, files={"file": ("report.txt", b"overwritten")})
        assert answer.status_code == 401
        assert "invalid signature for write" in answer.json()["message"]
        upload = pod_sandbox.upload_url(str(report))
        assert client.get(upload).status_code == 401
        assert report.read_text() == "shared"
        # And the unbent URL still works.
        assert client.get(url).text == "shared"


# --- a sandbox's own ports ------------------------------------------------------------------------


@dataclass
class AppInSandbox:
    """A running sandbox serving on APP_PORT every request's headers, echoed."""

    org: Any
    sandbox: Sandbox
    seen: list[dict[str, str]]
    stop: Any  # what a kill does to the pod: nothing listens there any more


@pytest.fixture
def app_in_sandbox(
    e2b_stack: Stack,  # noqa: F811 (the fixture imported above)
    standin: StandIn,
    agent_binary: Path,  # noqa: F811
    tmp_path: Path,
) -> Iterator[AppInSandbox]:
    org = new_org(e2b_stack)
    sandbox = Sandbox.create("base", **org.opts)
    pod = run_pod(e2b_stack, standin, agent_binary, tmp_path, sandbox.sandbox_id)
    seen: list[dict[str, str]] = []

    class Echo(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers = {name.lower(): value for name, value in self.headers.items()}
            seen.append(headers)
            body = json.dumps(headers).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((pod.address, APP_PORT), Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        pod.process.terminate()
        pod.process.wait(timeout=10)

    try:
        yield AppInSandbox(org, sandbox, seen, stop)
    finally:
        stop()


def test_a_sandbox_port_is_its_organization_s(
    e2b_stack: Stack,  # noqa: F811
    app_in_sandbox: AppInSandbox,
) -> None:
    org, sandbox = app_in_sandbox.org, app_in_sandbox.sandbox
    stranger = new_org(e2b_stack)
    url = f"http://{sandbox.get_host(APP_PORT)}/hello"
    token = sandbox._envd_access_token or ""
    by_headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": str(APP_PORT)}
    with browser(e2b_stack.edge) as client:
        allowed = {
            "the organization's key": {"X-API-KEY": org.key},
            "the key as a bearer": {"Authorization": f"Bearer {org.key}"},
            "the sandbox's token": {"X-Access-Token": token},
        }
        for what, headers in allowed.items():
            answer = client.get(url, headers=headers)
            assert answer.status_code == 200, (what, answer.text)
            seen = answer.json()
            # The sandbox sees neither the key nor the token that let the request in.
            assert not {"x-api-key", "authorization", "x-access-token"} & set(seen), what
            assert org.key not in json.dumps(seen) and token not in json.dumps(seen), what
        answer = client.get(f"{e2b_stack.edge}/hello", headers={**by_headers, "X-API-KEY": org.key})
        assert answer.status_code == 200
        # The app's own credentials pass; a key never does, whatever came with it.
        answer = client.get(url, headers={"X-Access-Token": token, "Authorization": "Basic YXBwOnB3"})
        assert answer.json()["authorization"] == "Basic YXBwOnB3"
        answer = client.get(url, headers={"X-Access-Token": token, "Authorization": f"Bearer {org.key}"})
        assert "authorization" not in answer.json()

        # Another organization's key finds nothing there (just after the owner's requests:
        # what the edge keeps of where the sandbox runs is the owner's only).
        strangers = client.get(url, headers={"X-API-KEY": stranger.key})
        assert strangers.status_code == 502
        refused = {
            "no credentials": {},
            "a key that is no key": {"X-API-KEY": "e2b_" + "0" * 64},
            "a wrong token": {"X-Access-Token": token[:-1] + ("1" if token[-1] == "0" else "0")},
        }
        for what, headers in refused.items():
            assert client.get(url, headers=headers).status_code == 401, what
        # The agent's port stays the token's alone.
        agent = f"http://{sandbox.get_host(AGENT_PORT)}/filesystem.Filesystem/ListDir"
        assert client.post(agent, json={"path": "/"}, headers={"X-API-KEY": org.key}).status_code == 401
        served = len(app_in_sandbox.seen)

        # A stranger's answer is word for word the owner's once the sandbox is gone.
        sandbox.kill()
        app_in_sandbox.stop()
        gone = client.get(url, headers={"X-API-KEY": org.key})
    assert (gone.status_code, gone.json()) == (strangers.status_code, strangers.json())
    assert "was not found" in gone.json()["message"]
    assert served == len(allowed) + 3


# --- TLS ------------------------------------------------------------------------------------------


def test_tls_with_the_wildcard_certificate(
    e2b_stack: Stack,  # noqa: F811
    tls_edge: str,
    pki: Pki,
    pod_sandbox: Sandbox,
) -> None:
    # The E2B answers still name the sandbox domain, so the SDK builds https://{port}-{id}.DOMAIN.
    assert pod_sandbox.sandbox_domain == DOMAIN
    url = f"https://{pod_sandbox.get_host(AGENT_PORT)}/filesystem.Filesystem/ListDir"
    token = {"X-Access-Token": pod_sandbox._envd_access_token or ""}
    with browser(tls_edge, verify=pki.trusting(pki.ca)) as client:
        listed = client.post(url, json={"path": "/"}, headers=token)
        assert listed.status_code == 200, listed.text
        assert "entries" in listed.json()
        # API traffic is served on the same TLS listener.
        org = new_org(e2b_stack)
        answer = client.get(f"https://api.{DOMAIN}/v2/sandboxes", headers={"X-API-KEY": org.key})
        assert (answer.status_code, answer.json()) == (200, [])
    # A client that does not trust the certificate's CA does not connect.
    stranger = browser(tls_edge, verify=pki.trusting(pki.stranger_ca))
    with stranger as client, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        client.post(url, json={"path": "/"}, headers=token)
    # Nor does one asking for a name the certificate does not cover.
    trusting = browser(tls_edge, verify=pki.trusting(pki.ca))
    with trusting as client, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        client.get("https://warren.elsewhere.example/v2/sandboxes")


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--tls-cert", "edge.pem"], "--tls-cert needs --tls-key"),
        (["--tls-key", "edge.key"], "--tls-key needs --tls-cert"),
        (["--tls-cert", "edge.pem", "--tls-key", "other.key"], "cannot use --tls-cert"),
        (["--tls-cert", "missing.pem", "--tls-key", "edge.key"], "cannot use --tls-cert"),
        (["--role", "api", "--tls-cert", "edge.pem", "--tls-key", "edge.key"], "--role edge or --role all"),
    ],
)
def test_tls_flags_are_checked_before_anything_starts(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], words: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, source in {"edge.pem": pki.cert, "edge.key": pki.key}.items():
        (tmp_path / name).write_bytes(source.read_bytes())
    pki_files.Pki(tmp_path).ensure_keypair("other")  # other.key: fits no certificate here
    role = [] if "--role" in flags else ["--role", "edge"]
    # No database, no stamp key: the TLS flags are refused before either is looked for.
    monkeypatch.delenv("WARREN_DATABASE_URL", raising=False)
    with pytest.raises(SystemExit) as refused:
        cli.main(["serve", *role, *flags])
    assert words in str(refused.value.code)
