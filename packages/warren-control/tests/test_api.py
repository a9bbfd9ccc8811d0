"""The API end to end through the real edge: API keys from the records, stamps, quotas,
isolation between organizations, pagination, idempotency and refusals, on SQLite and on a
real PostgreSQL. The cluster side is the stand-in of api_fixtures (the same HTTP protocol
as the Kubernetes API server, the CRD's own schema); test_api_cluster.py repeats the
cluster-facing parts against a real cluster."""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from api_stack import NAMESPACE, STAMP_KEY, OrgHandle, Stack, StandIn, serve_stack, settings_for
from sqlalchemy import select
from warren_control import ids, store
from warren_control.api.app import make_api
from warren_control.api.cluster import ORG_LABEL
from warren_control.identity import HEADER, Identity, sign
from warren_control.models import IdempotencyRecord, Sandbox, SandboxPhase
from warren_control.podspec import FORK_SIBLINGS_ANNOTATION, pod_name, pool_pod_name
from warren_control.scrub import scrub
from warren_control.sdk import CannotStart, WaitTimeout, WarrenError

pytest_plugins = ["api_fixtures"]

IMAGE = "registry.example/tools/busybox:1.36"
ID = re.compile(r"sbx_[a-z2-7]{26}")

# Every route of the API, with a body that is valid for it. test_routes_are_all_listed keeps
# this list complete, so the auth and isolation tests below cover every route there is.
ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/sandboxes", {"json": {"image": IMAGE}}),
    ("GET", "/v1/sandboxes", {}),
    ("GET", "/v1/sandboxes/{id}", {}),
    ("DELETE", "/v1/sandboxes/{id}", {}),
    ("POST", "/v1/sandboxes/{id}/fork", {"json": {"count": 1}}),
    ("POST", "/v1/sandboxes/{id}/stop", {}),
    ("POST", "/v1/sandboxes/{id}/start", {}),
    ("POST", "/v1/sandboxes/{id}/keepalive", {}),
    ("POST", "/v1/sandboxes/{id}/exec", {"json": {"command": ["true"]}}),
    ("GET", "/v1/sandboxes/{id}/files", {"params": {"path": "/etc/hostname"}}),
    ("PUT", "/v1/sandboxes/{id}/files", {"params": {"path": "/tmp/x"}, "content": b"data"}),
    ("GET", "/v1/sandboxes/{id}/workspace", {}),
    (
        "POST",
        "/v1/secrets",
        {"json": {"name": "s", "value": "v", "destinations": ["https://models.example/"]}},
    ),
    ("GET", "/v1/secrets", {}),
    ("GET", "/v1/secrets/{name}", {}),
    ("PATCH", "/v1/secrets/{name}", {"json": {"value": "w"}}),
    ("DELETE", "/v1/secrets/{name}", {}),
    ("GET", "/v1/secrets/{name}/uses", {}),
]
WITH_ID = [route for route in ROUTES if "{id}" in route[1]]


@pytest.fixture(autouse=True)
def _standin_state(standin: StandIn) -> Iterator[None]:
    yield
    standin.refuse_creates.clear()
    standin.hold_deletes = False


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def call(
    base: str, method: str, path: str, headers: dict[str, str], sandbox_id: str = "", **options: Any
) -> httpx.Response:
    return httpx.request(method, base + path.replace("{id}", sandbox_id), headers=headers, **options)


def record(stack: Stack, sandbox_id: str) -> Sandbox:
    with stack.sessions() as session:
        found = session.get(Sandbox, sandbox_id)
        assert found is not None
        return found


# --- the happy path ----------------------------------------------------------------------------


def test_create_get_list_delete(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE, command=["sleep", "infinity"], cpu_millis=250, memory_mib=256)
    assert ID.fullmatch(box.id)
    assert box.phase == "Pending"
    assert box.spec["image"] == IMAGE
    assert box.workspace_id is not None

    obj = stack.standin.get(stack.object_name(box.id))
    assert obj is not None
    assert obj["spec"]["image"] == IMAGE
    assert obj["spec"]["command"] == ["sleep", "infinity"]
    assert obj["spec"]["resources"] == {"cpu": "250m", "memory": "256Mi"}
    assert obj["spec"]["workspace"]["id"] == box.workspace_id
    # The organization is in the labels as a digest of its id: neither the id nor the name.
    labels = obj["metadata"]["labels"]
    assert labels[ORG_LABEL] == hashlib.sha256(org.id.encode()).hexdigest()[:32]
    assert org.id not in str(obj)

    assert org.client.get(box.id).id == box.id
    assert [b.id for b in org.client.list()] == [box.id]

    gone = org.client.delete(box.id)
    assert gone.phase == "Deleted"
    assert stack.standin.get(stack.object_name(box.id)) is None
    with pytest.raises(WarrenError) as missing:
        org.client.get(box.id)
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    assert list(org.client.list()) == []


def test_a_delete_the_status_mirror_recorded_first_still_answers_deleted(stack: Stack) -> None:
    """A sandbox with no pod is gone as soon as it is deleted; the status mirror may mark its
    record Deleted before the delete answers, which then still says Deleted (not 404)."""
    org = stack.org()
    box = org.client.create(IMAGE)

    def mirrored(object_name: str) -> None:
        with stack.sessions.begin() as session:
            record = store.get_sandbox_by_object_name(session, object_name)
            assert record is not None
            store.set_phase(session, record, SandboxPhase.DELETED)

    stack.standin.on_removed = mirrored
    assert org.client.delete(box.id).phase == "Deleted"
    with pytest.raises(WarrenError) as missing:
        org.client.delete(box.id)
    assert (missing.value.status, missing.value.code) == (404, "not_found")


def test_delete_waits_for_the_cluster_and_holds_quota_until_then(stack: Stack) -> None:
    org = stack.org(quota_sandboxes=1)
    box = org.client.create(IMAGE)
    stack.standin.hold_deletes = True
    assert org.client.delete(box.id).phase == "Terminating"
    assert org.client.get(box.id).phase == "Terminating"
    # The pod may still hold its resources: the quota still counts it.
    with pytest.raises(WarrenError) as refused:
        org.client.create(IMAGE)
    assert refused.value.code == "quota_exceeded"
    stack.standin.finish_deletes()
    assert org.client.wait_until(box.id, "Deleted", timeout=10, interval=0.1).phase == "Deleted"
    assert org.client.create(IMAGE).phase == "Pending"


def test_reads_show_what_the_cluster_observed_in_the_clients_words(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    name = stack.object_name(box.id)
    obj = stack.standin.get(name)
    assert obj is not None
    uid = obj["metadata"]["uid"]
    pod = pod_name(uid)
    stack.standin.set_status(
        name,
        {
            "phase": "Running",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "PodReady",
                    "message": f"pod {pod} is running on node worker-7 in {NAMESPACE} for {name} ({uid})",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    )
    seen = org.client.get(box.id)
    assert seen.phase == "Running"
    assert seen.started_at is not None
    text = str(seen.raw)
    for secret in (pod, name, uid, NAMESPACE):
        assert secret not in text
    assert "the pod is running" in seen.conditions[0].message
    listed = next(iter(org.client.list()))
    assert listed.phase == "Running"
    assert pod not in str(listed.raw)


def test_scrub_removes_every_cluster_name() -> None:
    uid = str(uuid.uuid4())
    pod, name = pod_name(uid), ids.new_object_name()
    message = (
        f"Back-off restarting failed container sandbox in pod {pod}_{NAMESPACE}({uid}); "
        f'Sandbox.warren.dev "{name}" is invalid; container "sandbox" in {"a" * 64}'
    )
    cleaned = scrub(message, name, pod, uid, NAMESPACE)
    for secret in (pod, name, uid, NAMESPACE, "a" * 64, 'container "sandbox"'):
        assert secret not in cleaned
    # Names it was not told about are still caught by their shape.
    assert pod not in scrub(f"pod {pod} is pending")
    assert name not in scrub(f"object {name}")
    # A pool's pod, claimed by a sandbox whose status has not named it yet.
    pooled = pool_pod_name("base-forks", "edb89855ae")
    assert scrub(f"pod {pooled} is running") == "the pod is running"


def test_stop_and_start_set_the_resource(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    name = stack.object_name(box.id)
    assert org.client.stop(box.id).spec["stopped"] is True
    obj = stack.standin.get(name)
    assert obj is not None
    assert obj["spec"]["stopped"] is True
    # While the pod goes, the controller says Terminating; that is not a deletion.
    stack.standin.set_status(name, {"phase": "Terminating"})
    assert org.client.get(box.id).phase == "Terminating"
    stack.standin.set_status(name, {"phase": "Stopped"})
    assert org.client.get(box.id).phase == "Stopped"
    assert org.client.start(box.id).spec["stopped"] is False
    obj = stack.standin.get(name)
    assert obj is not None
    assert obj["spec"]["stopped"] is False
    stack.standin.set_status(name, {"phase": "Running"})
    assert org.client.get(box.id).phase == "Running"
    # Start while the pod is still going is fine too; stop or start once deletion began is not.
    org.client.stop(box.id)
    stack.standin.set_status(name, {"phase": "Terminating"})
    assert org.client.get(box.id).phase == "Terminating"
    org.client.start(box.id)
    stack.standin.hold_deletes = True
    assert org.client.delete(box.id).phase == "Terminating"
    for attempt in (lambda: org.client.stop(box.id), lambda: org.client.start(box.id)):
        with pytest.raises(WarrenError) as refused:
            attempt()
        assert (refused.value.status, refused.value.code) == (409, "conflict")
    stack.standin.finish_deletes()
    assert org.client.wait_until(box.id, "Deleted", timeout=10, interval=0.1).phase == "Deleted"


def test_keepalive_restarts_the_idle_timer(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    time.sleep(0.05)
    kept = org.client.keepalive(box.id)
    assert kept.last_activity_at is not None
    assert box.last_activity_at is not None
    assert kept.last_activity_at > box.last_activity_at
    assert kept.expires_at == box.expires_at


def test_fork_makes_children_from_the_parents_workspace(stack: Stack) -> None:
    org = stack.org()
    parent = org.client.create(IMAGE, cpu_millis=100, memory_mib=128, workspace_size_gib=3)
    results = org.client.fork(parent.id, 2)
    assert [r.ok for r in results] == [True, True]
    children = [r.sandbox for r in results if r.sandbox is not None]
    assert len({c.id for c in children} | {parent.id}) == 3
    for child in children:
        assert child.spec["forked_from"] == parent.id
        assert child.workspace_id not in (None, parent.workspace_id)
        obj = stack.standin.get(stack.object_name(child.id))
        assert obj is not None
        assert obj["spec"]["workspace"] == {
            "id": child.workspace_id,
            "size": "3Gi",
            "forkOf": parent.workspace_id,
        }
        # For the node: its fork makes two, which one freeze of the parent serves.
        assert obj["metadata"]["annotations"] == {FORK_SIBLINGS_ANNOTATION: "2"}
        assert "fork_siblings" not in child.spec


def test_exec_and_files_need_a_running_pod(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    for attempt in (
        lambda: org.client.run(box.id, ["echo", "hi"]),
        lambda: org.client.read_file(box.id, "/etc/hostname"),
        lambda: org.client.write_file(box.id, "/tmp/x", b"x"),
    ):
        with pytest.raises(WarrenError) as refused:
            attempt()
        assert (refused.value.status, refused.value.code) == (409, "not_running")
    response = call(
        stack.edge, "GET", "/v1/sandboxes/{id}/files", bearer(org.token), box.id, params={"path": "relative"}
    )
    assert response.status_code == 400


# --- authentication ----------------------------------------------------------------------------


def test_routes_are_all_listed(stack: Stack) -> None:
    app = make_api(settings_for(stack.url, stack.standin))  # the settings the served one has
    served = {
        (method.upper(), path.replace("{sandbox_id}", "{id}"))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }
    assert served == {(method, path) for method, path, _ in ROUTES}


@pytest.mark.parametrize(("method", "path", "options"), ROUTES)
def test_every_route_needs_credentials_at_the_edge(
    stack: Stack, method: str, path: str, options: dict[str, Any]
) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    forged = sign(org.identity(), STAMP_KEY)  # even a valid stamp is not a credential at the edge
    for headers in (
        {},
        bearer("wk_aaaaaaaaaaaa_" + "A" * 43),
        bearer(org.token[:-1] + ("A" if org.token[-1] != "A" else "B")),
        {HEADER: forged},
        {"Authorization": f"Basic {org.token}"},
    ):
        response = call(stack.edge, method, path, headers, box.id, **options)
        assert response.status_code == 401, (headers, response.text)
        assert response.json()["error"] == "unauthenticated"
    assert org.client.get(box.id).phase == "Pending"


def tampered(stamp: str) -> str:
    """The stamp with the first character of its signature changed (always a change: a fixed
    replacement would sometimes equal what was there, and the stamp would stay valid)."""
    payload, _, signature = stamp.partition(".")
    return f"{payload}.{'B' if signature[0] == 'A' else 'A'}{signature[1:]}"


@pytest.mark.parametrize(("method", "path", "options"), ROUTES)
def test_every_route_needs_a_valid_stamp_at_the_api(
    stack: Stack, method: str, path: str, options: dict[str, Any]
) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    who = org.identity()
    now = time.time()
    for headers in (
        {},
        bearer(org.token),  # the API trusts stamps only, not keys
        {HEADER: sign(who, b"k" * 32)},  # signed with another key
        {HEADER: sign(who, STAMP_KEY, 10, now=now - 60)},  # expired
        {HEADER: tampered(sign(who, STAMP_KEY))},
        {"X-Warren-Org": org.id, "X-Warren-User": org.user_id},
    ):
        response = call(stack.api, method, path, headers, box.id, **options)
        assert response.status_code == 401, (headers, response.text)
        assert response.json()["error"] == "unauthenticated"
    # The same request with a good stamp is accepted: the 401s were about the stamp alone.
    response = call(stack.api, method, path, org.stamp(), box.id, **options)
    assert response.status_code != 401


def test_identity_in_the_body_is_refused_not_believed(stack: Stack) -> None:
    a, b = stack.org(), stack.org()
    response = httpx.post(
        f"{stack.edge}/v1/sandboxes", headers=bearer(a.token), json={"image": IMAGE, "org": b.id}
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert list(b.client.list()) == []


def test_a_stamp_for_an_unknown_organization_reaches_nothing(stack: Stack) -> None:
    ghost = {HEADER: sign(Identity(ids.new_org_id(), ids.new_user_id()), STAMP_KEY)}
    response = httpx.post(f"{stack.api}/v1/sandboxes", headers=ghost, json={"image": IMAGE})
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert httpx.get(f"{stack.api}/v1/sandboxes", headers=ghost).json() == {"items": [], "next_cursor": None}


# --- isolation ---------------------------------------------------------------------------------


def test_one_organization_can_neither_see_nor_touch_anothers_sandboxes(stack: Stack) -> None:
    a, b = stack.org(), stack.org()
    mine = a.client.create(IMAGE)
    theirs = b.client.create(IMAGE)
    their_name = stack.object_name(theirs.id)
    before = record(stack, theirs.id)
    obj_before = stack.standin.get(their_name)
    guesses = [
        theirs.id,
        theirs.id.upper(),
        f" {theirs.id}",
        f"{theirs.id}%00",
        f"{mine.id}%2F..%2F{theirs.id}",
        their_name,
        theirs.workspace_id or "",
        ids.new_sandbox_id(),
        "sbx_" + "a" * 26,
        "%2A",
    ]
    for method, path, options in WITH_ID:
        for guess in guesses:
            response = call(stack.edge, method, path, bearer(a.token), guess, **options)
            assert response.status_code == 404, (method, path, guess, response.text)
            assert response.json()["error"] == "not_found"
    # A's view of the world has only A's sandbox; B's is exactly as it was.
    assert [s.id for s in a.client.list()] == [mine.id]
    after = record(stack, theirs.id)
    assert (after.phase, after.spec, after.last_activity_at, after.deleted_at) == (
        before.phase,
        before.spec,
        before.last_activity_at,
        before.deleted_at,
    )
    assert stack.standin.get(their_name) == obj_before
    assert [s.id for s in b.client.list()] == [theirs.id]
    # Nor can A start from B's workspace.
    with pytest.raises(WarrenError) as refused:
        a.client.create(IMAGE, workspace_template=theirs.workspace_id)
    assert refused.value.code == "not_found"
    # A's answers about B's sandbox and about one that never existed are the same.
    unknown = ids.new_sandbox_id()
    one = call(stack.edge, "GET", "/v1/sandboxes/{id}", bearer(a.token), theirs.id).json()
    other = call(stack.edge, "GET", "/v1/sandboxes/{id}", bearer(a.token), unknown).json()
    assert one["error"] == other["error"]
    assert one["message"].replace(theirs.id, "X") == other["message"].replace(unknown, "X")


def test_idempotency_keys_belong_to_one_organization(stack: Stack) -> None:
    a, b = stack.org(), stack.org()
    key = f"shared-{uuid.uuid4()}"
    mine = a.client.create(IMAGE, idempotency_key=key)
    theirs = b.client.create("other/image:1", idempotency_key=key)
    assert mine.id != theirs.id
    assert theirs.spec["image"] == "other/image:1"


def test_a_cursor_from_another_organization_shows_only_your_own(stack: Stack) -> None:
    a, b = stack.org(), stack.org()
    for _ in range(3):
        b.client.create(IMAGE)
    mine = a.client.create(IMAGE)
    cursor = b.client.list_page(limit=1).next_cursor
    assert cursor is not None
    page = httpx.get(f"{stack.edge}/v1/sandboxes", headers=bearer(a.token), params={"cursor": cursor}).json()
    assert [item["id"] for item in page["items"]] in ([], [mine.id])


# --- what the deployment cannot do -------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "capability"),
    [
        ({"gpu": 1}, "gpu"),
        ({"memory_capture": True}, "memory_capture"),
        ({"runtime": "runc"}, "runtime"),
        ({"runtime": "kata"}, "runtime"),
    ],
)
def test_unsupported_capabilities_are_refused_by_name(
    stack: Stack, body: dict[str, Any], capability: str
) -> None:
    org = stack.org()
    before = stack.standin.creates()
    response = httpx.post(
        f"{stack.edge}/v1/sandboxes", headers=bearer(org.token), json={"image": IMAGE, **body}
    )
    assert response.status_code == 400
    answer = response.json()
    assert answer["error"] == "unsupported_capability"
    assert capability in answer["message"]
    assert stack.standin.creates() == before
    assert list(org.client.list()) == []


def test_a_sandboxs_memory_image_shows_as_a_condition(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    name = stack.object_name(box.id)
    image = {"image": "ab" * 32, "bytes": 3 << 20, "workspaceSeq": 5, "capturedAt": "2026-12-05T04:00:00Z"}
    ready = {"type": "Ready", "status": "False", "reason": "Stopped", "message": "stopped"}
    stack.standin.set_status(name, {"phase": "Stopped", "conditions": [ready], "memoryImage": image})
    (memory,) = [c for c in org.client.get(box.id).conditions if c.type == "MemoryImage"]
    assert (memory.status, memory.reason) == ("Unknown", "Sealing")
    sealed = {**image, "sealedSeq": 8, "verification": {"workspace": "ws-v", "startedAt": "x"}}
    stack.standin.set_status(name, {"phase": "Stopped", "conditions": [ready], "memoryImage": sealed})
    (memory,) = [c for c in org.client.get(box.id).conditions if c.type == "MemoryImage"]
    assert (memory.status, memory.reason) == ("Unknown", "Verifying")  # not a restore point yet
    proved = {**sealed, "verifiedAt": "y", "verification": {"workspace": "ws-v", "ms": 900, "done": True}}
    stack.standin.set_status(name, {"phase": "Stopped", "conditions": [ready], "memoryImage": proved})
    (memory,) = [c for c in org.client.get(box.id).conditions if c.type == "MemoryImage"]
    assert (memory.status, memory.reason) == ("True", "Captured")
    assert "3.0 MiB" in memory.message and "write record 8" in memory.message and "900 ms" in memory.message
    failed = {**sealed, "unrestorable": "RunContainerError: restore failed"}
    stack.standin.set_status(name, {"phase": "Stopped", "conditions": [ready], "memoryImage": failed})
    (memory,) = [c for c in org.client.get(box.id).conditions if c.type == "MemoryImage"]
    assert (memory.status, memory.reason) == ("False", "Unrestorable") and "restore failed" in memory.message
    running = {**ready, "status": "True", "reason": "PodReady"}
    stack.standin.set_status(name, {"phase": "Running", "conditions": [running], "restoredFrom": "ab" * 32})
    (memory,) = [c for c in org.client.get(box.id).conditions if c.type == "MemoryImage"]
    assert (memory.status, memory.reason) == ("False", "Restored")


def test_memory_capture_is_refused_for_an_image_that_does_not_start_the_agent(
    stack_url: str, standin: StandIn
) -> None:
    other = "registry.example/tools/python:3.12"
    with serve_stack(stack_url, standin, memory_capture=True, capturable_images=frozenset({IMAGE})) as served:
        org = served.org()
        box = org.client.create(other)
        with pytest.raises(WarrenError, match="does not start the agent itself") as refused:
            org.client.stop(box.id, memory=True)
        assert refused.value.code == "unsupported_capability"
        assert not standin.get(served.object_name(box.id))["spec"].get("stopped")
        with pytest.raises(WarrenError, match="on_idle pause"):
            org.client.create(other, on_idle="pause")
        assert org.client.create(IMAGE, on_idle="pause").spec["on_idle"] == "pause"


def test_memory_capture_on_stop_is_refused_where_it_is_off(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    response = httpx.post(
        f"{stack.edge}/v1/sandboxes/{box.id}/stop", headers=bearer(org.token), json={"memory_capture": True}
    )
    assert response.status_code == 400
    assert response.json()["error"] == "unsupported_capability"
    assert "memory_capture" in response.json()["message"]
    assert not stack.standin.get(stack.object_name(box.id))["spec"].get("stopped")


def test_a_stop_with_memory_asks_the_controller_to_capture_and_a_start_says_cold_or_not(
    stack_url: str, standin: StandIn
) -> None:
    with serve_stack(stack_url, standin, memory_capture=True) as capturing:
        org = capturing.org()
        box = org.client.create(IMAGE)
        name = capturing.object_name(box.id)
        assert org.client.stop(box.id, memory=True).id == box.id
        spec = standin.get(name)["spec"]
        assert spec["stopped"] is True and spec["memoryCapture"] is True
        org.client.start(box.id)
        spec = standin.get(name)["spec"]
        assert spec["stopped"] is False and spec["coldStart"] is False
        org.client.stop(box.id)
        assert standin.get(name)["spec"]["memoryCapture"] is False
        org.client.start(box.id, cold=True)
        assert standin.get(name)["spec"]["coldStart"] is True


def test_without_a_workspace_layer_nothing_pretends_to_keep_files(stack_url: str, standin: StandIn) -> None:
    with serve_stack(stack_url, standin, workspaces=False) as bare:
        org = bare.org()
        box = org.client.create(IMAGE)
        assert box.workspace_id is None
        obj = standin.get(bare.object_name(box.id))
        assert obj is not None
        assert "workspace" not in obj["spec"]
        for attempt in (
            lambda: org.client.create(IMAGE, workspace_size_gib=5),
            lambda: org.client.fork(box.id, 1),
            lambda: org.client.stop(box.id),
        ):
            with pytest.raises(WarrenError) as refused:
                attempt()
            assert refused.value.code == "unsupported_capability"
            assert "workspaces" in refused.value.message


def test_a_gpu_is_refused_even_where_the_cluster_has_some(stack_url: str, standin: StandIn) -> None:
    # The controller cannot attach one yet: accepting the request would be a silent lie.
    with serve_stack(stack_url, standin, gpu_available=True) as gpus:
        org = gpus.org()
        with pytest.raises(WarrenError) as refused:
            org.client.create(IMAGE, gpu=1)
        assert refused.value.code == "unsupported_capability"
        assert "gpu" in refused.value.message


# --- policy and quotas -------------------------------------------------------------------------


def test_quota_on_count_refuses_and_writes_nothing(stack: Stack) -> None:
    org = stack.org(quota_sandboxes=2)
    org.client.create(IMAGE)
    org.client.create(IMAGE)
    before = stack.standin.creates()
    with pytest.raises(WarrenError) as refused:
        org.client.create(IMAGE)
    assert (refused.value.status, refused.value.code) == (403, "quota_exceeded")
    assert "sandboxes" in refused.value.message
    assert stack.standin.creates() == before
    assert len(list(org.client.list())) == 2


def test_quota_on_cpu_and_memory(stack: Stack) -> None:
    org = stack.org(quota_cpu_millis=1000, quota_memory_mib=1024)
    with pytest.raises(WarrenError) as cpu:
        org.client.create(IMAGE, cpu_millis=1500, memory_mib=128)
    assert cpu.value.code == "quota_exceeded"
    assert "cpu" in cpu.value.message
    org.client.create(IMAGE, cpu_millis=500, memory_mib=1000)
    with pytest.raises(WarrenError) as memory:
        org.client.create(IMAGE, cpu_millis=100, memory_mib=100)
    assert memory.value.code == "quota_exceeded"
    assert "memory" in memory.value.message


def test_fork_children_succeed_or_fail_each_on_its_own(stack: Stack) -> None:
    org = stack.org(quota_sandboxes=3)
    parent = org.client.create(IMAGE)
    before = stack.standin.creates()
    results = org.client.fork(parent.id, 4)
    assert [r.ok for r in results] == [True, True, False, False]
    assert {r.error for r in results if not r.ok} == {"quota_exceeded"}
    assert stack.standin.creates() == before + 2
    assert len(list(org.client.list())) == 3


def test_a_child_the_cluster_refuses_fails_alone(stack: Stack) -> None:
    org = stack.org()
    parent = org.client.create(IMAGE)
    stack.standin.refuse_creates.extend([None, (500, "etcdserver: request timed out"), None])
    results = org.client.fork(parent.id, 3, idempotency_key="fork-1")
    # The children's resources are created side by side: any one of them met the refusal.
    assert sorted(r.ok for r in results) == [False, True, True]
    assert [r.error for r in results if not r.ok] == ["unavailable"]
    assert len(list(org.client.list())) == 3
    # A replay gives the final answer, including the failed child.
    again = org.client.fork(parent.id, 3, idempotency_key="fork-1")
    assert [(r.ok, r.sandbox.id if r.sandbox else None) for r in again] == [
        (r.ok, r.sandbox.id if r.sandbox else None) for r in results
    ]


def test_persistent_only_where_the_organization_may(stack: Stack) -> None:
    plain, allowed = stack.org(), stack.org(may_persist=True)
    with pytest.raises(WarrenError) as refused:
        plain.client.create(IMAGE, persistent=True)
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    box = allowed.client.create(IMAGE, persistent=True)
    obj = stack.standin.get(stack.object_name(box.id))
    assert obj is not None
    assert obj["spec"]["persistent"] is True


def test_lifetimes_within_the_organizations_limits(stack: Stack) -> None:
    org = stack.org(idle_timeout_s=3600, max_lifetime_s=7200)
    for option in ({"idle_timeout_s": 3601}, {"max_lifetime_s": 7201}):
        with pytest.raises(WarrenError) as refused:
            org.client.create(IMAGE, **option)  # type: ignore[arg-type]
        assert refused.value.code == "forbidden"
    box = org.client.create(IMAGE, idle_timeout_s=600, max_lifetime_s=1800)
    assert box.created_at is not None
    assert box.expires_at is not None
    assert box.expires_at - box.created_at == timedelta(seconds=1800)
    obj = stack.standin.get(stack.object_name(box.id))
    assert obj is not None
    assert (obj["spec"]["idleTimeoutSeconds"], obj["spec"]["maxLifetimeSeconds"]) == (600, 1800)
    defaults = org.client.create(IMAGE)
    assert (defaults.spec["idle_timeout_s"], defaults.spec["max_lifetime_s"]) == (3600, 7200)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"image": ""},
        {"image": "has space"},
        {"image": IMAGE, "command": []},
        {"image": IMAGE, "cpu_millis": "1000"},
        {"image": IMAGE, "cpu_millis": 0},
        {"image": IMAGE, "persistent": "yes"},
        {"image": IMAGE, "idle_timeout_s": 5},
        {"image": IMAGE, "workspace": {"template": "not-a-workspace"}},
        {"image": IMAGE, "command": ["a\u0000b"]},
        {"image": IMAGE, "unknown": 1},
    ],
)
def test_invalid_requests_are_400_with_the_error_shape(stack: Stack, body: dict[str, Any]) -> None:
    org = stack.org()
    response = httpx.post(f"{stack.edge}/v1/sandboxes", headers=bearer(org.token), json=body)
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error", "message"}
    assert response.json()["error"] == "invalid_request"


# --- the cluster refusing ----------------------------------------------------------------------


def test_a_refused_resource_leaves_no_half_created_sandbox(stack: Stack) -> None:
    org = stack.org(quota_sandboxes=1)
    stack.standin.refuse_creates.append((500, "etcdserver: leader changed"))
    with pytest.raises(WarrenError) as refused:
        org.client.create(IMAGE, idempotency_key="k1")
    assert (refused.value.status, refused.value.code) == (503, "unavailable")
    assert list(org.client.list()) == []
    with stack.sessions() as session:
        rows = session.scalars(select(Sandbox).where(Sandbox.org_id == org.id)).all()
        assert [(r.phase, r.deleted_at is not None) for r in rows] == [(SandboxPhase.DELETED, True)]
        assert session.get(IdempotencyRecord, (org.id, "k1")) is None
    # Nothing was consumed and nothing remembered: the same key acts again and succeeds.
    box = org.client.create(IMAGE, idempotency_key="k1")
    assert box.phase == "Pending"


def test_a_resource_the_cluster_finds_invalid_is_a_400_without_names(stack: Stack) -> None:
    org = stack.org()
    stack.standin.refuse_creates.append((422, "spec.image: Invalid value"))
    response = httpx.post(f"{stack.edge}/v1/sandboxes", headers=bearer(org.token), json={"image": IMAGE})
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert "sandbox-" not in response.json()["message"]
    assert list(org.client.list()) == []


# --- pagination --------------------------------------------------------------------------------


def test_pages_cover_everything_once_in_creation_order(stack: Stack) -> None:
    org = stack.org()
    made = [org.client.create(IMAGE).id for _ in range(7)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = org.client.list_page(limit=3, cursor=cursor)
        pages += 1
        seen += [s.id for s in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert (pages, seen) == (3, made)
    assert [s.id for s in org.client.list(page_size=2)] == made
    # Deleting one between pages shifts nothing.
    first = org.client.list_page(limit=3)
    org.client.delete(made[1])
    rest = org.client.list_page(limit=10, cursor=first.next_cursor)
    assert [s.id for s in rest.items] == made[3:]


@pytest.mark.parametrize("cursor", ["x", "!!!", "eyJhIjoxfQ", "W251bGwsbnVsbF0", "WyJ4IiwgIlx1MDAwMCJd"])
def test_invalid_cursors_are_400(stack: Stack, cursor: str) -> None:
    org = stack.org()
    response = httpx.get(f"{stack.edge}/v1/sandboxes", headers=bearer(org.token), params={"cursor": cursor})
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


# --- idempotency -------------------------------------------------------------------------------


def test_create_replays_with_the_same_key(stack: Stack) -> None:
    org = stack.org()
    key = f"create-{uuid.uuid4()}"
    headers = {**bearer(org.token), "Idempotency-Key": key}
    before = stack.standin.creates()
    first = httpx.post(f"{stack.edge}/v1/sandboxes", headers=headers, json={"image": IMAGE})
    again = httpx.post(f"{stack.edge}/v1/sandboxes", headers=headers, json={"image": IMAGE})
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json()["id"] == again.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert stack.standin.creates() == before + 1
    conflict = httpx.post(
        f"{stack.edge}/v1/sandboxes", headers=headers, json={"image": IMAGE, "cpu_millis": 500}
    )
    assert conflict.status_code == 422
    assert conflict.json()["error"] == "idempotency_conflict"
    assert len(list(org.client.list())) == 1


def test_concurrent_creates_with_one_key_make_one_sandbox(stack: Stack) -> None:
    org = stack.org()
    key = f"race-{uuid.uuid4()}"
    answers: list[str] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        response = httpx.post(
            f"{stack.edge}/v1/sandboxes",
            headers={**bearer(org.token), "Idempotency-Key": key},
            json={"image": IMAGE},
            timeout=60,
        )
        answers.append(f"{response.status_code} {response.json().get('id')}")

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 8
    assert len(set(answers)) == 1, answers
    assert answers[0].startswith("201 sbx_")
    assert len(list(org.client.list())) == 1


def test_fork_replays_with_the_same_key(stack: Stack) -> None:
    org = stack.org()
    parent = org.client.create(IMAGE)
    first = org.client.fork(parent.id, 2, idempotency_key="fork-key")
    again = org.client.fork(parent.id, 2, idempotency_key="fork-key")
    assert [r.sandbox.id for r in first if r.sandbox] == [r.sandbox.id for r in again if r.sandbox]
    assert len(list(org.client.list())) == 3
    with pytest.raises(WarrenError) as conflict:
        org.client.fork(parent.id, 3, idempotency_key="fork-key")
    assert conflict.value.code == "idempotency_conflict"


# --- opaque ids --------------------------------------------------------------------------------


def test_ids_and_answers_reveal_no_cluster_names(stack: Stack) -> None:
    org = stack.org()
    answers = []
    created = httpx.post(f"{stack.edge}/v1/sandboxes", headers=bearer(org.token), json={"image": IMAGE})
    answers.append(created.text)
    box_id = created.json()["id"]
    parent = org.client.get(box_id)
    answers.append(str(parent.raw))
    answers.append(httpx.get(f"{stack.edge}/v1/sandboxes", headers=bearer(org.token)).text)
    forked = httpx.post(
        f"{stack.edge}/v1/sandboxes/{box_id}/fork", headers=bearer(org.token), json={"count": 2}
    )
    answers.append(forked.text)
    answers.append(httpx.post(f"{stack.edge}/v1/sandboxes/{box_id}/stop", headers=bearer(org.token)).text)
    answers.append(httpx.delete(f"{stack.edge}/v1/sandboxes/{box_id}", headers=bearer(org.token)).text)
    ids_seen = [box_id] + [r["sandbox"]["id"] for r in forked.json()["results"]]
    for sandbox_id in ids_seen:
        name = stack.object_name(sandbox_id)
        obj = stack.standin.get(name)
        secrets_ = [name, name.removeprefix("sandbox-"), NAMESPACE]
        if obj is not None:
            secrets_ += [obj["metadata"]["uid"], pod_name(obj["metadata"]["uid"])]
        for text in answers:
            for secret in secrets_:
                assert secret not in text
        # The id shares nothing with the object's name.
        assert sandbox_id.removeprefix("sbx_") != name.removeprefix("sandbox-")
        assert ID.fullmatch(sandbox_id)


# --- the SDK's waiting -------------------------------------------------------------------------


def test_a_long_poll_answers_once_the_sandbox_runs(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    name = stack.object_name(box.id)
    # Nothing changes: the answer leaves after the wait, with the sandbox as it is.
    assert org.client.get(box.id, wait_s=0.3).phase == "Pending"
    requests = len(stack.standin.requests)
    written = threading.Timer(
        0.5, stack.standin.set_status, (name, {"phase": "Running", "observedGeneration": 1})
    )
    written.start()
    started = time.monotonic()
    # One GET, answered once the controller wrote Running (through one watch), not at the
    # end of its minute.
    assert org.client.get(box.id, wait_s=60).phase == "Running"
    assert time.monotonic() - started < 30
    written.join()
    asked = [path for _, path in stack.standin.requests[requests:]]
    assert (
        sum(1 for path in asked if path.endswith(name)) <= 2
    )  # the read before the watch (and read-through's)
    # A sandbox that is not starting answers at once, whatever the wait.
    stack.standin.set_status(name, {"phase": "Failed", "observedGeneration": 1})
    assert org.client.get(box.id, wait_s=60).phase == "Failed"


def test_wait_until_reports_progress_and_returns_on_the_phase(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    name = stack.object_name(box.id)

    def come_up() -> None:
        time.sleep(0.3)
        stack.standin.set_status(
            name,
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "ContainerCreating",
                        "message": "pulling",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            },
        )
        time.sleep(0.3)
        stack.standin.set_status(name, {"phase": "Running"})

    seen: list[str] = []
    helper = threading.Thread(target=come_up)
    helper.start()
    running = org.client.wait_until(
        box.id, "Running", timeout=10, progress=lambda s: seen.append(f"{s.phase} {s.reason}"), interval=0.05
    )
    helper.join()
    assert running.phase == "Running"
    assert seen[0].startswith("Pending")
    assert any("ContainerCreating" in s for s in seen)
    assert seen[-1].startswith("Running")

    stack.standin.set_status(name, {"phase": "Failed"})
    with pytest.raises(WarrenError) as failed:
        org.client.wait_until(box.id, "Running", timeout=5, interval=0.05)
    assert failed.value.code == "failed"
    with pytest.raises(WarrenError) as late:
        org.client.wait_until(box.id, "Stopped", timeout=0.2, interval=0.05)
    assert late.value.code in {"timeout", "failed"}


def pending_because(reason: str, message: str) -> dict[str, Any]:
    """A Sandbox status as the controller writes it for a pod that does not start."""
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    return {"phase": "Pending", "conditions": [ready]}


def test_wait_until_ends_at_once_when_the_image_is_never_pulled(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    missing = 'Container image "warren.invalid/none:0" is not present with pull policy of Never'
    stack.standin.set_status(stack.object_name(box.id), pending_because("ErrImageNeverPull", missing))
    with pytest.raises(CannotStart) as refused:
        org.client.wait_until(box.id, "Running", timeout=60, interval=0.05)
    assert refused.value.code == "cannot_start"
    assert "ErrImageNeverPull" in refused.value.message and missing in refused.value.message


def test_wait_until_ends_once_no_node_had_room_for_a_while(stack: Stack) -> None:
    org = stack.org()
    box = org.client.create(IMAGE)
    full = "0/1 nodes are available: 1 Insufficient cpu."
    stack.standin.set_status(stack.object_name(box.id), pending_because("Unschedulable", full))
    with pytest.raises(CannotStart) as refused:
        org.client.wait_until(box.id, "Running", timeout=60, interval=0.05, unschedulable_for=0.3)
    assert full in refused.value.message and "ask for less CPU or memory" in refused.value.message
    # Asked to wait for room: only the timeout ends it.
    with pytest.raises(WaitTimeout):
        org.client.wait_until(box.id, "Running", timeout=0.5, interval=0.05, unschedulable_for=None)


def test_sdk_errors_carry_the_apis_code_and_message(stack: Stack) -> None:
    org: OrgHandle = stack.org()
    with pytest.raises(WarrenError) as missing:
        org.client.get("sbx_" + secrets.token_hex(4))
    assert missing.value.status == 404
    assert missing.value.code == "not_found"
    assert missing.value.message
