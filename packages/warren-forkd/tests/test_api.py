"""The daemon's API refusals, which need no guest: status codes and errors that name the fix."""

from __future__ import annotations

import json

import pytest
from warren_forkd.client import ApiError, Client, _UnixConnection


def refused(client: Client, method: str, path: str, body: dict[str, object] | None = None) -> ApiError:
    with pytest.raises(ApiError) as info:
        client.request(method, path, body)
    assert info.value.doc["message"]
    assert info.value.doc["fix"]
    return info.value


def test_unknown_ids_are_404(daemon: Client) -> None:
    error = refused(daemon, "POST", "/v1/snapshots/nope/branch", {"count": 2})
    assert (error.status, error.code) == (404, "not_found")
    assert "nope" in error.doc["message"]
    for path in ("/v1/vms/nope/exec", "/v1/vms/nope/stop", "/v1/vms/nope/snapshot"):
        assert refused(daemon, "POST", path, {"command": "true"}).status == 404
    assert refused(daemon, "GET", "/v1/vms/nope").status == 404
    assert refused(daemon, "POST", "/v1/vms", {"template": "nope"}).status == 404
    assert refused(daemon, "GET", "/v1/no-such-route").status == 404


def test_bad_requests_are_400(daemon: Client) -> None:
    conn = _UnixConnection(daemon.socket_path, 10)
    conn.request("POST", "/v1/vms", b"{not json", {"Content-Type": "application/json"})
    response = conn.getresponse()
    doc = json.loads(response.read())
    conn.close()
    assert (response.status, doc["error"]) == (400, "bad_request")

    assert refused(daemon, "POST", "/v1/vms", ["a list"]).status == 400
    assert refused(daemon, "POST", "/v1/templates", {"name": "Bad Name!"}).code == "invalid_id"
    partial = refused(daemon, "POST", "/v1/templates", {"name": "partial", "kernel": "/nonexistent"})
    assert (partial.status, partial.code) == (400, "bad_request")
    assert "initramfs" in partial.doc["message"]
    missing = {"name": "missing", "kernel": "/nonexistent/k", "initramfs": "/nonexistent/i", "disk": "/x"}
    assert refused(daemon, "POST", "/v1/templates", missing).code == "bad_path"


def test_empty_lists_and_health(daemon: Client) -> None:
    assert daemon.get("/healthz") == {"ok": True}
    info = daemon.get("/v1/info")
    assert info["accelerator"] in ("tcg", "kvm")
    assert "forkd_vms" in daemon.metrics()
