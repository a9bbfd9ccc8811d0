"""A real server on a unix socket: routes with placeholders, each error case, text replies,
the wrapping hook, and the client's retry on given codes."""

from __future__ import annotations

import http.client
import json
import stat
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from warren_common.client import ApiError, Client, UnixConnection
from warren_common.server import Request, RequestError, Route, Server, TcpServer, Text


class BusyError(Exception):
    """A daemon's own exception, translated into a refusal."""


class App:
    def __init__(self) -> None:
        self.wrapped: list[str] = []
        self.refuse_next = 0  # answer this many requests `handed_over`

    def routes(self) -> list[Route]:
        return [
            Route("GET", "/healthz", lambda _r: {"ok": True}),
            Route("GET", "/metrics", lambda _r: Text(b"up 1\n")),
            Route("POST", "/v1/things/{id}/echo", lambda r: {"id": r.params["id"], "body": r.body}),
            Route("POST", "/v1/things/{id}/refuse", self.refuse),
            Route("POST", "/v1/busy", self.busy),
            Route("POST", "/v1/crash", self.crash),
            Route("POST", "/v1/flaky", self.flaky),
        ]

    def refuse(self, request: Request) -> Any:
        raise RequestError("exists", f"{request.params['id']} exists", "choose another id", 409, {"id": "x"})

    def busy(self, _request: Request) -> Any:
        raise BusyError("still busy")

    def crash(self, _request: Request) -> Any:
        raise ZeroDivisionError("oops")

    def flaky(self, _request: Request) -> Any:
        if self.refuse_next > 0:
            self.refuse_next -= 1
            raise RequestError("handed_over", "handed over; retry", "retry", 503)
        return {"done": True}

    def translate(self, exc: Exception) -> RequestError | None:
        if isinstance(exc, BusyError):
            return RequestError("busy", str(exc), "retry later", 409)
        return None

    def around(self, request: Request) -> AbstractContextManager[object]:
        if request.method != "POST":
            return nullcontext()

        @contextmanager
        def record() -> Iterator[None]:
            self.wrapped.append(request.path)
            yield

        return record()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[App, Client, Path]]:
    app = App()
    path = tmp_path / "sock" / "api.sock"
    server = Server(path, app.routes(), translate=app.translate, around=app.around)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield app, Client(str(path), timeout=10), path
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def refused(client: Client, method: str, path: str, body: dict[str, Any] | None = None) -> ApiError:
    with pytest.raises(ApiError) as info:
        client.request(method, path, body)
    assert set(info.value.doc) >= {"error", "message", "fix"}, info.value.doc
    return info.value


def test_routes_params_bodies_and_text(served: tuple[App, Client, Path]) -> None:
    app, client, path = served
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
    assert client.request("GET", "/healthz") == {"ok": True}
    assert client.request("GET", "/healthz?verbose=1") == {"ok": True}
    assert client.request("GET", "/metrics") == "up 1\n"
    assert client.request("POST", "/v1/things/a1/echo", {"n": 1}) == {"id": "a1", "body": {"n": 1}}
    assert client.request("POST", "/v1/things/a1/echo") == {"id": "a1", "body": {}}
    assert app.wrapped == ["/v1/things/a1/echo", "/v1/things/a1/echo"]  # GETs are not wrapped


def test_each_error_case(served: tuple[App, Client, Path], caplog: pytest.LogCaptureFixture) -> None:
    _, client, path = served
    for method, route in (("GET", "/nowhere"), ("POST", "/healthz"), ("GET", "/v1/things//echo")):
        missing = refused(client, method, route)
        assert (missing.status, missing.code) == (404, "not_found")
    raised = refused(client, "POST", "/v1/things/b2/refuse")
    assert (raised.status, raised.code, raised.fix) == (409, "exists", "choose another id")
    assert raised.doc["id"] == "x"
    assert "b2 exists" in str(raised) and "choose another id" in str(raised)
    translated = refused(client, "POST", "/v1/busy")
    assert (translated.status, translated.code, translated.message) == (409, "busy", "still busy")
    with caplog.at_level("ERROR"):
        crashed = refused(client, "POST", "/v1/crash")
    assert (crashed.status, crashed.code) == (500, "internal")
    assert "ZeroDivisionError: oops" in crashed.message
    assert any(r.exc_info and r.getMessage() == "request failed" for r in caplog.records)

    conn = UnixConnection(str(path), 10)
    for body in (b"{not json", b"[1, 2]"):
        conn.request("POST", "/v1/things/c3/echo", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        doc = json.loads(response.read())
        conn.close()
        assert (response.status, doc["error"]) == (400, "bad_request") and doc["fix"], doc
    conn.putrequest("POST", "/v1/things/c3/echo")
    conn.putheader("Content-Length", "many")
    conn.endheaders()
    response = conn.getresponse()
    assert (response.status, json.loads(response.read())["error"]) == (400, "bad_request")
    conn.close()
    conn.request("BREW", "/healthz")  # no such method: still the JSON contract
    response = conn.getresponse()
    assert json.loads(response.read())["error"] == "bad_request"
    conn.close()


def test_retry_on_given_codes_for_a_bounded_time(served: tuple[App, Client, Path]) -> None:
    app, client, path = served
    app.refuse_next = 1
    assert (refused(client, "POST", "/v1/flaky").code) == "handed_over"  # no retry by default
    patient = Client(str(path), 10, retry_codes={"handed_over"}, retry_for=10, retry_interval=0.01)
    app.refuse_next = 5
    assert patient.request("POST", "/v1/flaky") == {"done": True}
    assert app.refuse_next == 0
    impatient = Client(str(path), 10, retry_codes={"handed_over"}, retry_for=0.05, retry_interval=0.01)
    app.refuse_next = 10**6
    assert refused(impatient, "POST", "/v1/flaky").status == 503
    assert refused(patient, "POST", "/v1/busy").code == "busy"  # other codes are not retried


def test_a_socket_nobody_serves_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        Client(str(tmp_path / "none.sock"), 5, retry_codes={"handed_over"}, retry_for=5).request("GET", "/")


def test_many_clients_connecting_at_once_are_all_let_in(tmp_path: Path) -> None:
    """Connects queue while the server is busy: a unix socket past a full backlog refuses
    at once (EAGAIN), as eight CSI publishes at once met with socketserver's backlog of 5."""
    import socket

    server = Server(tmp_path / "busy.sock", [])
    try:
        clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(32)]
        for client in clients:
            client.settimeout(1)
            client.connect(str(tmp_path / "busy.sock"))  # nothing accepts yet: all queue
        for client in clients:
            client.close()
    finally:
        server.server_close()


def test_a_tcp_server_answers_only_callers_with_its_token() -> None:
    app = App()
    server = TcpServer(("127.0.0.1", 0), app.routes(), token=b"s3cret\n", translate=app.translate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def call(headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/v1/things/a/echo", body=b'{"x": 1}', headers=headers)
        answer = connection.getresponse()
        result = answer.status, json.loads(answer.read())
        connection.close()
        return result

    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            status, body = call(headers)
            assert (status, body["error"]) == (401, "unauthorized"), headers
        assert call({"Authorization": "Bearer s3cret"}) == (200, {"id": "a", "body": {"x": 1}})
        with pytest.raises(ValueError, match="token is empty"):
            TcpServer(("127.0.0.1", 0), app.routes(), token=b" \n")
    finally:
        server.shutdown()
        server.server_close()
