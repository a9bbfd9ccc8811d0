"""Schemathesis against the OpenAPI document: generated requests, valid and not, to every
operation of the served API (uvicorn, records on SQLite and PostgreSQL, a fresh valid stamp
on each request), and not one may get a server error or an answer the document does not
describe. Half the requests that name a sandbox name one that exists, so the operations
get past "not found"."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from api_stack import OrgHandle, Stack
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi import checks as openapi_checks
from warren_control.api.app import document
from warren_control.api.service import MAX_WAIT_S

pytest_plugins = ["api_fixtures"]

schema = schemathesis.openapi.from_dict(document())

# The HTTP server itself (h11, below the app) answers a request it cannot parse, such as
# a generated `Content-Length: S>`, with a plain-text 400 before the API sees anything.
_UNPARSEABLE = "Invalid HTTP request received."


def content_type_of_the_apps_answers(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    if response.status_code == 400 and response.text == _UNPARSEABLE:
        return None
    return openapi_checks.content_type_conformance(ctx, response, case)


CHECKS = [
    schemathesis.checks.not_a_server_error,
    openapi_checks.status_code_conformance,
    content_type_of_the_apps_answers,
    openapi_checks.response_schema_conformance,
]


def _short_long_polls(case: schemathesis.Case) -> None:
    """A valid `wait_s` holds a GET's answer that long, since these sandboxes never start: a
    second takes the waiting path all the same. Invalid values are sent as generated."""
    wait = (case.query or {}).get("wait_s")
    try:
        seconds = float(wait)
    except (TypeError, ValueError):
        return
    if 1 < seconds <= MAX_WAIT_S:
        case.query["wait_s"] = 1


class Pool:
    """An organization with a few sandboxes that requests can name; made again as needed."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        # Quotas generous enough that fork and create mostly get past them.
        self.org: OrgHandle = stack.org(
            quota_sandboxes=10_000, quota_cpu_millis=10**8, quota_memory_mib=10**8
        )
        self.ids: list[str] = []

    def one(self, seed: str) -> str:
        live = {s.id for s in self.org.client.list()}
        self.ids = [i for i in self.ids if i in live]
        while len(self.ids) < 3:
            self.ids.append(
                self.org.client.create("registry.example/busybox:1", cpu_millis=10, memory_mib=64).id
            )
        return self.ids[int(hashlib.sha256(seed.encode()).hexdigest(), 16) % len(self.ids)]


@pytest.fixture(scope="module")
def pool(stack: Stack) -> Iterator[Pool]:
    yield Pool(stack)


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_no_server_errors(case: schemathesis.Case, stack: Stack, pool: Pool) -> None:
    _short_long_polls(case)
    params: dict[str, Any] = case.path_parameters or {}
    if "sandbox_id" in params and int(hashlib.sha256(repr(case.body).encode()).hexdigest(), 16) % 2:
        params["sandbox_id"] = pool.one(repr(case.query))
    case.call_and_validate(base_url=stack.api, headers=pool.org.stamp(), checks=CHECKS)
