"""The test helpers: a port that can be bound, and a wait that returns or names what it awaited."""

from __future__ import annotations

import itertools
import socket

import pytest
from warren_common.testing import free_port, wait_for


def test_a_free_port_can_be_bound_on_loopback() -> None:
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        assert server.getsockname()[1] == port


def test_wait_for_returns_the_first_true_value() -> None:
    counter = itertools.count()
    assert wait_for(lambda: next(counter) >= 3 and "done", 5, "the third call", interval=0) == "done"


def test_wait_for_names_what_it_waited_for_when_it_gives_up() -> None:
    with pytest.raises(AssertionError, match="waiting for the impossible"):
        wait_for(lambda: False, 0.05, "the impossible", interval=0.01)
