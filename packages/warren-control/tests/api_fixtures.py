"""Fixtures for the API tests (load with `pytest_plugins = ["api_fixtures"]`); the stack they
build is described in api_stack.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
from api_stack import Stack, StandIn, serve_stack, standin_handler
from warren_control.db import upgrade


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    found = StandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), standin_handler(found))
    server.daemon_threads = True
    found.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield found
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def stack_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated records database of each kind, shared by one module's tests (each test
    makes organizations of its own)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('records') / 'records.db'}"
    else:
        url = str(request.getfixturevalue("postgres_server").create_database())
    upgrade(url)
    return url


@pytest.fixture(scope="module")
def stack(stack_url: str, standin: StandIn) -> Iterator[Stack]:
    with serve_stack(stack_url, standin) as served:
        yield served
