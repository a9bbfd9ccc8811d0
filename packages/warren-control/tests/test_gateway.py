"""Secrets and the egress gateway, end to end on loopback: secrets written through the real
edge and API, the gateway served by uvicorn, and real HTTPS destinations (certificates from a
throw-away CA the gateway is told to trust). The sandbox's side is an HTTP client on
127.0.0.1, the address the gateway is told belongs to the sandbox's pod (no pods run here;
test_gateway_cluster in the cluster tier sends the same requests from gVisor pods).

Every attack a sandbox could try is tried: another destination named in the path, a spoofed
Host, an absolute URL in the request line, CONNECT, paths that climb out of the prefix, a
secret of another organization, one it is not bound to, a revoked one, one over budget. The
key must reach the bound destination, and nothing else ever: not the other destination,
not any answer of the gateway."""

from __future__ import annotations

import io
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_stack import Stack, StandIn, serve_stack
from localservers import serve_asgi
from sqlalchemy import select
from warren_common import pki as pki_files
from warren_control import cli
from warren_control.gateway import Gateway, Redactor, make_gateway, tls_context
from warren_control.models import Sandbox, SandboxPhase, SecretUse
from warren_control.sdk import WarrenError
from warren_control.vault import GATEWAY_ENV, SecretBox, placeholder

pytest_plugins = ["api_fixtures"]

KEY_MATERIAL = b"gateway-tests-secrets-key-0123456789abcdef"
IMAGE = "registry.example/tools/busybox:1.36"
VALUE = "sk-test-0123456789abcdefghijklmnop"


@dataclass
class Destination:
    """An HTTPS server that answers every request with what it received, and keeps it."""

    url: str
    port: int
    seen: list[dict[str, Any]] = field(default_factory=list)


def _https(cert: Path, key: Path) -> Iterator[Destination]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    found: list[dict[str, Any]] = []

    class Echo(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            seen = {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
            found.append(seen)
            payload = json.dumps(seen).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815 (http.server's names)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        yield Destination(f"https://localhost:{port}", port, found)
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Pki:
    ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    made = pki_files.Pki(tmp_path_factory.mktemp("gateway-pki"))
    made.ensure_ca("ca", "Warren gateway test CA")
    host = pki_files.Leaf("host", "ca", "localhost", (), (pki_files.SERVER,), ("localhost",), ("127.0.0.1",))
    made.ensure_leaf(host)
    return Pki(made.path("ca", "crt"), made.path("host", "crt"), made.path("host", "key"))


@pytest.fixture(scope="module")
def model_api(pki: Pki) -> Iterator[Destination]:
    """The destination secrets are bound to."""
    yield from _https(pki.cert, pki.key)


@pytest.fixture(scope="module")
def elsewhere(pki: Pki) -> Iterator[Destination]:
    """Another HTTPS server, as trusted: where an attacker would like the key to go."""
    yield from _https(pki.cert, pki.key)


@pytest.fixture(scope="module")
def secrets_stack(stack_url: str, standin: StandIn) -> Iterator[Stack]:
    with serve_stack(
        stack_url, standin, secrets_key=KEY_MATERIAL, gateway_url="http://gateway.test:8090"
    ) as s:
        yield s


@dataclass
class Callers:
    """Which sandbox's pod has an address: what the cluster's pod watch tells the gateway."""

    by_address: dict[str, str] = field(default_factory=dict)

    def __call__(self, address: str) -> str | None:
        return self.by_address.get(address)


@pytest.fixture(scope="module")
def callers() -> Callers:
    return Callers()


@pytest.fixture(scope="module")
def gateway(secrets_stack: Stack, callers: Callers, pki: Pki) -> Iterator[str]:
    box = SecretBox(KEY_MATERIAL)
    app = make_gateway(Gateway(secrets_stack.sessions, box, callers, verify=tls_context(str(pki.ca))))
    with serve_asgi(app) as url:
        yield url


def running(stack: Stack, callers: Callers, sandbox_id: str) -> None:
    """The sandbox runs, and its pod is the one at 127.0.0.1 (what the tests connect from)."""
    with stack.sessions.begin() as session:
        record = session.get(Sandbox, sandbox_id)
        assert record is not None
        record.phase = SandboxPhase.RUNNING
        callers.by_address["127.0.0.1"] = record.object_name


def never_leaked(*answers: httpx.Response) -> None:
    for answer in answers:
        assert VALUE not in answer.text
        assert all(VALUE not in v for v in answer.headers.values())


def test_secrets_are_write_only_and_validated(secrets_stack: Stack, model_api: Destination) -> None:
    org = secrets_stack.org()
    made = org.client.create_secret("model", VALUE, [model_api.url + "/v1"], env="MODEL_API_KEY")
    assert made["header"] == "Authorization" and made["template"] == "Bearer {secret}"
    assert made["placeholder"] == placeholder("model")
    for shown in (made, org.client.get_secret("model"), *org.client.list_secrets()):
        assert VALUE not in json.dumps(shown)
    with secrets_stack.sessions() as session:  # sealed at rest
        from warren_control.models import Secret

        stored = session.scalars(select(Secret).where(Secret.org_id == org.id)).one()
        assert stored.sealed is not None and VALUE.encode() not in stored.sealed
    refusals = {
        "http://localhost/v1": "only https",
        "https://user:pw@localhost/": "credentials in the URL",
        "https://localhost/?key=1": "query or fragment",
        "https://localhost:99999/": "port",
        "https://local_host/": "not a DNS name",
        "https://localhost/v1/../admin": "plain segments",
    }
    for url, words in refusals.items():
        with pytest.raises(WarrenError) as refused:
            org.client.create_secret("bad", VALUE, [url])
        assert refused.value.code == "invalid_request" and words in refused.value.message
    with pytest.raises(WarrenError) as refused:
        org.client.create_secret("model", VALUE, [model_api.url])
    assert refused.value.code == "conflict"
    with pytest.raises(WarrenError) as refused:
        org.client.create_secret("bad", VALUE, [model_api.url], header="Host")
    assert "set by the gateway" in refused.value.message
    with pytest.raises(WarrenError) as refused:
        org.client.create_secret("bad", VALUE, [model_api.url], template="Bearer")
    assert "{secret} exactly once" in refused.value.message
    with pytest.raises(WarrenError) as refused:
        org.client.create_secret("bad", VALUE + "\n", [model_api.url])
    assert "control characters" in refused.value.message


def test_a_sandbox_holds_placeholders_and_forks_drop_its_bindings(secrets_stack: Stack) -> None:
    org = secrets_stack.org()
    org.client.create_secret("model", VALUE, ["https://models.example/v1"], env="MODEL_API_KEY")
    with pytest.raises(WarrenError) as refused:
        org.client.create(IMAGE, secrets=["nope"])
    assert "no secret 'nope'" in refused.value.message
    box = org.client.create(IMAGE, secrets=["model"])
    env = secrets_stack.standin.get(secrets_stack.object_name(box.id))["spec"]["env"]  # type: ignore[index]
    assert env == {"MODEL_API_KEY": placeholder("model"), GATEWAY_ENV: "http://gateway.test:8090"}
    assert VALUE not in json.dumps(secrets_stack.standin.get(secrets_stack.object_name(box.id)))
    with secrets_stack.sessions.begin() as session:
        record = session.get(Sandbox, box.id)
        assert record is not None
        record.workspace_id = record.workspace_id or "ws_" + "a" * 26
    kept = org.client.fork(box.id, 1, secrets=True)[0].sandbox
    dropped = org.client.fork(box.id, 1)[0].sandbox
    assert kept is not None and dropped is not None
    with secrets_stack.sessions() as session:
        kept_spec, dropped_spec = session.get(Sandbox, kept.id).spec, session.get(Sandbox, dropped.id).spec  # type: ignore[union-attr]
    assert kept_spec["secrets"]["ids"] and kept_spec["env"]["MODEL_API_KEY"] == placeholder("model")
    assert "secrets" not in dropped_spec and "MODEL_API_KEY" not in (dropped_spec.get("env") or {})


def test_the_gateway_injects_only_for_the_bound_destination(
    secrets_stack: Stack, gateway: str, callers: Callers, model_api: Destination, elsewhere: Destination
) -> None:
    org = secrets_stack.org()
    org.client.create_secret("model", VALUE, [model_api.url + "/v1"])
    box = org.client.create(IMAGE, secrets=["model"])
    running(secrets_stack, callers, box.id)
    base = f"{gateway}/model/localhost:{model_api.port}"
    before = len(model_api.seen)
    with httpx.Client(timeout=30) as sandbox:
        sent = sandbox.post(
            f"{base}/v1/chat?stream=0",
            json={"q": 1},
            headers={
                "Authorization": "Bearer " + placeholder("model"),
                "Host": f"localhost:{elsewhere.port}",
            },
        )
        assert sent.status_code == 200, sent.text
        got = model_api.seen[-1]
        assert got["headers"]["Authorization"] == f"Bearer {VALUE}"  # the real key, where it is bound
        assert got["headers"]["Host"] == f"localhost:{model_api.port}"  # the spoofed Host went nowhere
        assert got["path"] == "/v1/chat?stream=0" and json.loads(got["body"]) == {"q": 1}
        # The destination echoed the key: the sandbox gets the placeholder instead.
        assert placeholder("model") in sent.text
        attempts = [
            sandbox.get(f"{gateway}/model/localhost:{elsewhere.port}/v1/x"),  # another destination
            sandbox.get(f"{gateway}/model/127.0.0.1:{model_api.port}/v1/x"),  # same host, other name
            sandbox.get(f"{base}/admin"),  # outside the prefix
            sandbox.get(f"{base}/v1evil"),  # a prefix is whole segments
            sandbox.get(f"{gateway}/model/localhost:{model_api.port}@localhost:{elsewhere.port}/v1/x"),
            sandbox.get(f"{base}/v1/%2e%2e/admin"),
            sandbox.get(f"{base}/v1//x"),
            sandbox.request("CONNECT", f"{gateway}/model/localhost:{model_api.port}"),
        ]
        assert [a.status_code for a in attempts] == [403, 403, 403, 403, 400, 400, 400, 405]
        assert [a.json()["error"] for a in attempts][:3] == ["not_a_destination"] * 3
    # An absolute URL in the request line: its host is not where anything goes.
    raw = _raw(
        gateway, f"GET https://localhost:{elsewhere.port}/model/localhost:{model_api.port}/v1/abs HTTP/1.1"
    )
    assert b" 200 " in raw.split(b"\r\n", 1)[0] and VALUE.encode() not in raw
    assert model_api.seen[-1]["path"] == "/v1/abs"
    assert not elsewhere.seen  # nothing ever reached it
    assert len(model_api.seen) == before + 2
    never_leaked(sent, *attempts)
    uses = org.client.secret_uses("model")  # newest first: the absolute-URL request's
    assert [u["outcome"] for u in uses] == [
        "sent",
        "no_tunnel",
        "bad_path",
        "bad_path",
        "bad_path",
        "not_a_destination",
        "not_a_destination",
        "not_a_destination",
        "not_a_destination",
        "sent",
    ]
    assert uses[0]["destination"] == f"GET https://localhost:{model_api.port}/v1/abs"
    sent_use = next(u for u in uses if u["destination"].endswith("/v1/chat"))
    assert (
        sent_use["status"] == 200
        and sent_use["bytes_sent"] == len(b'{"q":1}')
        and sent_use["bytes_received"] > 0
    )
    assert sent_use["sandbox_id"] == box.id
    assert {u["outcome"] for u in uses} >= {"not_a_destination", "sent"}


def test_identity_binding_revocation_rotation_and_budget(
    secrets_stack: Stack, gateway: str, callers: Callers, model_api: Destination
) -> None:
    owner, other = secrets_stack.org(), secrets_stack.org()
    owner.client.create_secret("model", VALUE, [model_api.url], budget={"requests": 2, "period_s": 3600})
    owner.client.create_secret("tool", "tool-key-0123456789", [model_api.url], query="api_key")
    url = f"{gateway}/model/localhost:{model_api.port}/v1/x"
    with httpx.Client(timeout=30) as sandbox:
        callers.by_address.clear()
        unknown = sandbox.get(url)
        assert (unknown.status_code, unknown.json()["error"]) == (403, "unknown_sandbox")
        intruder = other.client.create(IMAGE)  # another organization's sandbox asks for the secret
        running(secrets_stack, callers, intruder.id)
        assert sandbox.get(url).json()["error"] == "no_secret"
        unbound = owner.client.create(IMAGE)  # same organization, not bound to it
        running(secrets_stack, callers, unbound.id)
        assert sandbox.get(url).json()["error"] == "not_bound"
        bound = owner.client.create(IMAGE, secrets=["model", "tool"])
        running(secrets_stack, callers, bound.id)
        first = sandbox.get(url)
        assert (
            first.status_code == 200 and model_api.seen[-1]["headers"]["Authorization"] == f"Bearer {VALUE}"
        )
        query = sandbox.get(f"{gateway}/tool/localhost:{model_api.port}/v1/q?api_key=mine&x=1")
        assert (
            query.status_code == 200 and model_api.seen[-1]["path"] == "/v1/q?x=1&api_key=tool-key-0123456789"
        )
        assert "tool-key-0123456789" not in query.text
        owner.client.update_secret("model", value="sk-rotated-0123456789")
        assert sandbox.get(url).status_code == 200  # the budget's second request, with the new value
        assert model_api.seen[-1]["headers"]["Authorization"] == "Bearer sk-rotated-0123456789"
        over = sandbox.get(url)
        assert (over.status_code, over.json()["error"]) == (429, "over_budget")
        owner.client.update_secret("model", budget={"requests": 100, "period_s": 3600})
        assert sandbox.get(url).status_code == 200
        owner.client.revoke_secret("model")
        revoked = sandbox.get(url)
        assert (revoked.status_code, revoked.json()["error"]) == (403, "revoked")
        assert [u["outcome"] for u in owner.client.secret_uses("model")][:2] == ["revoked", "sent"]
        stopped_after = len(model_api.seen)
        with secrets_stack.sessions.begin() as session:  # a stopped sandbox's address is no one's
            record = session.get(Sandbox, bound.id)
            assert record is not None
            record.phase = SandboxPhase.STOPPED
        assert (
            sandbox.get(f"{gateway}/tool/localhost:{model_api.port}/v1/q").json()["error"]
            == "unknown_sandbox"
        )
        assert len(model_api.seen) == stopped_after
        never_leaked(first, query, over, revoked)
    with secrets_stack.sessions() as session:
        outcomes = [
            u.outcome
            for u in session.scalars(
                select(SecretUse).where(SecretUse.org_id == owner.id).order_by(SecretUse.id)
            )
        ]
    assert outcomes == ["not_bound", "sent", "sent", "sent", "over_budget", "sent", "revoked"]
    with secrets_stack.sessions() as session:  # the other organization's attempt is its own record
        theirs = session.scalars(select(SecretUse).where(SecretUse.org_id == other.id)).all()
    assert [u.outcome for u in theirs] == ["no_secret"] and theirs[0].secret_id is None


def test_the_cli_reads_the_value_from_stdin_and_never_prints_it(
    secrets_stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    org = secrets_stack.org()
    monkeypatch.setenv("WARREN_URL", secrets_stack.edge)
    monkeypatch.setenv("WARREN_API_KEY", org.token)
    monkeypatch.setattr("sys.stdin", io.StringIO(VALUE + "\n"))
    made = ["secret", "create", "model", "--destination", "https://models.example/v1", "--env", "MODEL_KEY"]
    assert cli.main([*made, "--budget-requests", "5"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["budget"] == {"requests": 5, "bytes": None, "period_s": 3600} and shown["env"] == "MODEL_KEY"
    monkeypatch.setattr("sys.stdin", io.StringIO("sk-rotated-0123456789\n"))
    assert cli.main(["secret", "update", "model", "--rotate"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 2
    assert cli.main(["secret", "revoke", "model"]) == 0
    assert cli.main(["secret", "get", "model"]) == 1
    assert "no secret 'model'" in capsys.readouterr().err
    assert cli.main(["secret", "uses", "model"]) == 0  # a revoked secret's audit: empty, not gone
    everything = capsys.readouterr()
    assert VALUE not in everything.out + everything.err


def test_without_a_gateway_secrets_are_refused(stack: Stack) -> None:
    org = stack.org()
    with pytest.raises(WarrenError) as refused:
        org.client.create_secret("model", VALUE, ["https://models.example/"])
    assert refused.value.code == "unsupported_capability"
    with pytest.raises(WarrenError) as refused:
        org.client.create(IMAGE, secrets=["model"])
    assert refused.value.code == "unsupported_capability"


def test_the_redactor_catches_a_value_split_across_chunks() -> None:
    redactor = Redactor(b"SECRET", b"[x]")
    out = (
        b"".join(redactor.feed(c) for c in (b"aaSE", b"C", b"RETbbSECR", b"ETSECRET", b"cc"))
        + redactor.flush()
    )
    assert out == b"aa[x]bb[x][x]cc"


def _raw(base: str, request_line: str) -> bytes:
    """Send one request as written (an absolute URL in the request line, as a proxy client
    would), and the whole answer."""
    address = httpx.URL(base)
    with socket.create_connection((address.host, address.port or 80), timeout=30) as conn:
        conn.sendall(f"{request_line}\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)
