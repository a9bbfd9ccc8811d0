"""The repository layer on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker
from warren_control import store
from warren_control.api.shapes import SandboxOut
from warren_control.db import make_engine, session_factory, upgrade
from warren_control.models import ApiKey, Organization, Sandbox, SandboxPhase, User

SPEC: dict[str, Any] = {
    "image": "python:3.12",
    "command": ["sleep", "infinity"],
    "cpu_millis": 1000,
    "memory_mib": 1024,
    "persistent": False,
    "idle_timeout_s": 600,
    "max_lifetime_s": 3600,
    "runtime": "gvisor",
    "workspace": {"size_gib": 10, "template": None},
}

Sessions = sessionmaker[Session]


@pytest.fixture
def sessions(records_url: str) -> Iterator[Sessions]:
    upgrade(records_url)
    # Enough connections that every thread of the concurrency tests holds its own.
    engine = make_engine(records_url, pool_size=32, max_overflow=0)
    yield session_factory(engine)
    engine.dispose()


def org_with_user(sessions: Sessions, name: str = "acme", /, **settings: Any) -> tuple[Organization, User]:
    with sessions.begin() as session:
        org = store.create_org(session, name, **settings)
        user = store.create_user(session, org.id, f"{name}-admin")
    return org, user


def spec(**changes: Any) -> dict[str, Any]:
    return {**SPEC, **changes}


def count_live(sessions: Sessions, org_id: str) -> int:
    with sessions() as session:
        return (
            session.scalar(select(func.count()).where(Sandbox.org_id == org_id, Sandbox.deleted_at.is_(None)))
            or 0
        )


# --- organizations, users, keys ----------------------------------------------------------------


def test_ensure_user_creates_once(sessions: Sessions) -> None:
    org, _ = org_with_user(sessions)
    with sessions.begin() as session:
        first = store.ensure_user(session, org.id, "oidc|123")
        again = store.ensure_user(session, org.id, "oidc|123")
    assert first.id == again.id
    assert first.id.startswith("usr_")


def test_api_key_issue_lookup_revoke(sessions: Sessions) -> None:
    org, user = org_with_user(sessions)
    other, _ = org_with_user(sessions, "other")
    with sessions.begin() as session:
        issued = store.issue_api_key(session, org.id, user.id, ["sandboxes:write", "sandboxes:read"])
    from warren_control import keys

    parsed = keys.parse(issued.token)  # the edge's format
    key_id, secret = parsed.key_id, parsed.secret
    assert key_id == issued.key_id

    with sessions() as session:
        found = store.lookup_key(session, key_id)
        assert store.lookup_key(session, "0" * 16) is None
        # The secret itself is nowhere in the database, only its hash.
        dump = json.dumps([list(row) for row in session.execute(text("SELECT * FROM api_keys"))], default=str)
    assert found is not None
    assert (found.org_id, found.user_id, found.user_subject) == (org.id, user.id, user.subject)
    assert found.scopes == ("sandboxes:write", "sandboxes:read")
    assert found.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert not found.revoked
    assert secret not in dump

    with sessions.begin() as session:
        assert not store.revoke_key(session, other.id, key_id)  # not the other organization's key
    with sessions() as session:
        still = store.lookup_key(session, key_id)
    assert still is not None
    assert not still.revoked

    with sessions.begin() as session:
        assert store.revoke_key(session, org.id, key_id)
        assert store.revoke_key(session, org.id, key_id)  # twice is fine
        assert not store.revoke_key(session, org.id, "0" * 16)
    with sessions() as session:
        revoked = store.lookup_key(session, key_id)
    assert revoked is not None
    assert revoked.revoked


def test_key_use_is_recorded_at_most_once_a_minute(sessions: Sessions) -> None:
    org, user = org_with_user(sessions)
    with sessions.begin() as session:
        key_id = store.issue_api_key(session, org.id, user.id, []).key_id
    start = datetime(2030, 1, 1, tzinfo=UTC)
    for offset, expected in ((0, 0), (30, 0), (61, 61)):
        with sessions.begin() as session:
            store.mark_key_used(session, key_id, now=start + timedelta(seconds=offset))
        with sessions() as session:
            key = session.get(ApiKey, key_id)
            assert key is not None
            assert key.last_used_at == start + timedelta(seconds=expected)


# --- sandboxes: quotas and policy --------------------------------------------------------------


@pytest.mark.parametrize(
    ("quotas", "request_spec", "quota", "numbers"),
    [
        ({"quota_sandboxes": 2}, spec(), "sandboxes", "2 in use + 1 requested > 2 allowed"),
        ({"quota_cpu_millis": 2500}, spec(), "cpu_millis", "2000 in use + 1000 requested > 2500 allowed"),
        ({"quota_memory_mib": 3000}, spec(), "memory_mib", "2048 in use + 1024 requested > 3000 allowed"),
    ],
)
def test_quota_refusal_names_the_quota(
    sessions: Sessions, quotas: dict[str, int], request_spec: dict[str, Any], quota: str, numbers: str
) -> None:
    org, user = org_with_user(sessions, **quotas)
    for _ in range(2):
        with sessions.begin() as session:
            store.create_sandbox(session, org.id, user.id, request_spec)
    with pytest.raises(store.QuotaExceeded) as refused, sessions.begin() as session:
        store.create_sandbox(session, org.id, user.id, request_spec)
    assert refused.value.quota == quota
    assert str(refused.value) == f"quota {quota} exceeded: {numbers}"
    assert count_live(sessions, org.id) == 2


def test_deleted_sandboxes_free_their_quota(sessions: Sessions) -> None:
    org, user = org_with_user(sessions, quota_sandboxes=1)
    with sessions.begin() as session:
        first = store.create_sandbox(session, org.id, user.id, spec())
    with pytest.raises(store.QuotaExceeded), sessions.begin() as session:
        store.create_sandbox(session, org.id, user.id, spec())
    with sessions.begin() as session:
        store.set_phase(session, first, SandboxPhase.TERMINATING)
    with pytest.raises(store.QuotaExceeded), sessions.begin() as session:
        store.create_sandbox(session, org.id, user.id, spec())  # terminating still holds resources
    with sessions.begin() as session:
        assert store.mark_deleted(session, org.id, first.id) is not None
    with sessions.begin() as session:
        store.create_sandbox(session, org.id, user.id, spec())


def test_persistent_only_where_the_organization_may(sessions: Sessions) -> None:
    org, user = org_with_user(sessions)
    allowed, allowed_user = org_with_user(sessions, "persists", may_persist=True)
    with pytest.raises(store.PersistenceNotAllowedError), sessions.begin() as session:
        store.create_sandbox(session, org.id, user.id, spec(persistent=True))
    with sessions.begin() as session:
        store.create_sandbox(session, allowed.id, allowed_user.id, spec(persistent=True))


@pytest.mark.parametrize("bad", [{"cpu_millis": 0}, {"memory_mib": "1Gi"}, {"cpu_millis": True}])
def test_spec_needs_positive_integer_resources(sessions: Sessions, bad: dict[str, Any]) -> None:
    org, user = org_with_user(sessions)
    with pytest.raises(store.InvalidSpecError), sessions.begin() as session:
        store.create_sandbox(session, org.id, user.id, spec(**bad))


def test_sandbox_record(sessions: Sessions) -> None:
    org, user = org_with_user(sessions, max_lifetime_s=3600)
    with sessions.begin() as session:
        created = store.create_sandbox(session, org.id, user.id, spec(), workspace_id="ws-1")
    assert re.fullmatch(r"sbx_[a-z2-7]{26}", created.id)
    with sessions() as session:
        sandbox = store.get_sandbox(session, org.id, created.id)
        assert sandbox is not None
        assert sandbox.phase is SandboxPhase.PENDING
        assert sandbox.created_at.tzinfo is UTC
        assert sandbox.expires_at == sandbox.created_at + timedelta(hours=1)
        assert sandbox.spec == spec()
        assert store.get_sandbox_by_object_name(session, sandbox.object_name) is not None
        public = SandboxOut.of(sandbox).doc()
    assert "object_name" not in public
    assert sandbox.object_name not in json.dumps(public)
    assert sandbox.object_name.removeprefix("sandbox-") not in sandbox.id

    later = sandbox.created_at + timedelta(minutes=5)
    with sessions.begin() as session:
        sandbox = session.merge(sandbox)
        store.set_phase(
            session,
            sandbox,
            SandboxPhase.RUNNING,
            conditions=[{"type": "Ready", "status": "True"}],
            now=later,
        )
        store.set_phase(session, sandbox, SandboxPhase.RUNNING, now=later + timedelta(minutes=1))
        assert store.keep_alive(session, org.id, sandbox.id, now=later) is not None
    with sessions() as session:
        running = store.get_sandbox(session, org.id, created.id)
    assert running is not None
    assert running.phase is SandboxPhase.RUNNING
    assert running.started_at == later  # the first time it ran
    assert running.last_activity_at == later
    assert running.conditions == [{"type": "Ready", "status": "True"}]


def test_naive_datetimes_are_refused(sessions: Sessions) -> None:
    org, user = org_with_user(sessions)
    with pytest.raises(Exception, match="naive datetime"), sessions.begin() as session:
        store.create_sandbox(session, org.id, user.id, spec(), now=datetime(2030, 1, 1))


# --- isolation between organizations -----------------------------------------------------------


def test_other_organizations_sandboxes_are_invisible(sessions: Sessions) -> None:
    org_a, user_a = org_with_user(sessions, "a")
    org_b, _ = org_with_user(sessions, "b")
    with sessions.begin() as session:
        mine = store.create_sandbox(session, org_a.id, user_a.id, spec())
    with sessions.begin() as session:
        assert store.get_sandbox(session, org_b.id, mine.id) is None
        assert store.get_sandbox(session, org_b.id, mine.id, include_deleted=True) is None
        assert store.list_sandboxes(session, org_b.id).items == []
        assert store.mark_deleted(session, org_b.id, mine.id) is None
        assert store.keep_alive(session, org_b.id, mine.id) is None
    with sessions() as session:
        assert store.get_sandbox(session, org_a.id, mine.id) is not None
        assert [s.id for s in store.list_sandboxes(session, org_a.id).items] == [mine.id]


# --- pagination --------------------------------------------------------------------------------


def test_pagination_over_250_records(sessions: Sessions) -> None:
    org, user = org_with_user(sessions, quota_sandboxes=1000, quota_cpu_millis=10**6, quota_memory_mib=10**6)
    other, other_user = org_with_user(sessions, "other")
    start = datetime(2030, 1, 1, tzinfo=UTC)
    with sessions.begin() as session:
        # Ten at each instant: the id must break the ties.
        created = [
            store.create_sandbox(session, org.id, user.id, spec(), now=start + timedelta(seconds=i // 10))
            for i in range(250)
        ]
        store.create_sandbox(session, other.id, other_user.id, spec(), now=start)
    expected = sorted((s.created_at, s.id) for s in created)

    seen: list[tuple[datetime, str]] = []
    cursor: str | None = None
    pages = 0
    deleted: set[str] = set()
    while True:
        with sessions.begin() as session:
            page = store.list_sandboxes(session, org.id, limit=7, cursor=cursor)
            if pages == 3:
                # Deleting records already listed must not shift the pages after.
                for sandbox_id in [s for _, s in seen[:5]]:
                    store.mark_deleted(session, org.id, sandbox_id)
                    deleted.add(sandbox_id)
        seen.extend((s.created_at, s.id) for s in page.items)
        pages += 1
        if page.next_cursor is None:
            break
        decoded = json.loads(base64.urlsafe_b64decode(page.next_cursor + "=" * (-len(page.next_cursor) % 4)))
        assert decoded == [page.items[-1].created_at.isoformat(), page.items[-1].id]
        cursor = page.next_cursor
    assert seen == expected  # every record once, in order, nothing from the other organization
    assert pages == 36

    with sessions() as session:
        remaining = store.list_sandboxes(session, org.id, limit=1000)
        everything = store.list_sandboxes(session, org.id, limit=1000, include_deleted=True)
    assert remaining.next_cursor is None
    assert len(remaining.items) == 250 - len(deleted)
    assert len(everything.items) == 250


@pytest.mark.parametrize("cursor", ["%%%", "bm90IGpzb24", base64.urlsafe_b64encode(b'["2030", 1]').decode()])
def test_bad_cursor_is_refused(sessions: Sessions, cursor: str) -> None:
    org, _ = org_with_user(sessions)
    with pytest.raises(store.InvalidCursorError), sessions() as session:
        store.list_sandboxes(session, org.id, cursor=cursor)


# --- idempotency -------------------------------------------------------------------------------


def creator(org: Organization, user: User, calls: list[str]) -> Callable[[Session], tuple[int, Any]]:
    def action(session: Session) -> tuple[int, Any]:
        sandbox = store.create_sandbox(session, org.id, user.id, spec())
        calls.append(sandbox.id)
        return 201, SandboxOut.of(sandbox).doc()

    return action


def test_idempotent_replay_and_conflict(sessions: Sessions) -> None:
    org, user = org_with_user(sessions)
    other, other_user = org_with_user(sessions, "other")
    calls: list[str] = []
    body = spec()
    digest = store.request_hash("post", "/v1/sandboxes", body)
    assert digest == store.request_hash("POST", "/v1/sandboxes", dict(reversed(body.items())))

    first, replayed = store.run_idempotent(sessions, org.id, "key-1", digest, creator(org, user, calls))
    assert not replayed
    assert first.status_code == 201
    again, replayed = store.run_idempotent(sessions, org.id, "key-1", digest, creator(org, user, calls))
    assert replayed
    assert again == first
    assert len(calls) == 1
    assert count_live(sessions, org.id) == 1

    different = store.request_hash("POST", "/v1/sandboxes", spec(cpu_millis=2000))
    with pytest.raises(store.IdempotencyConflict, match="key-1"):
        store.run_idempotent(sessions, org.id, "key-1", different, creator(org, user, calls))
    # Keys belong to one organization: the same key elsewhere is a new request.
    _, replayed = store.run_idempotent(
        sessions, other.id, "key-1", different, creator(other, other_user, calls)
    )
    assert not replayed
    assert len(calls) == 2


def test_failed_action_is_not_remembered(sessions: Sessions) -> None:
    org, user = org_with_user(sessions, quota_sandboxes=0)
    digest = store.request_hash("POST", "/v1/sandboxes", spec())
    with pytest.raises(store.QuotaExceeded):
        store.run_idempotent(sessions, org.id, "key", digest, creator(org, user, []))
    with sessions() as session:
        assert store.recall(session, org.id, "key", digest) is None


def test_remember_recall_and_forget(sessions: Sessions) -> None:
    org, _ = org_with_user(sessions)
    with sessions.begin() as session:
        store.remember(session, org.id, "k", "a" * 64, status_code=202, response={"ok": [1, 2]})
    with sessions.begin() as session:
        assert store.recall(session, org.id, "k", "a" * 64) == store.Recalled(202, {"ok": [1, 2]})
        with pytest.raises(store.IdempotencyConflict):
            store.recall(session, org.id, "k", "b" * 64)
        with pytest.raises(store.IdempotencyKeyTakenError):
            store.remember(session, org.id, "k", "a" * 64, status_code=202, response=None)
    with sessions.begin() as session:
        assert store.forget_idempotency_before(session, datetime.now(UTC) - timedelta(hours=1)) == 0
        assert store.forget_idempotency_before(session, datetime.now(UTC) + timedelta(seconds=1)) == 1
        assert store.recall(session, org.id, "k", "a" * 64) is None


# --- concurrency -------------------------------------------------------------------------------


def run_together(count: int, work: Callable[[], Any]) -> tuple[list[Any], list[BaseException]]:
    """Run `work` in `count` threads released at once; returns results and errors."""
    barrier = threading.Barrier(count)
    results: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def thread() -> None:
        barrier.wait()
        try:
            result = work()
        except BaseException as error:  # collected and checked by the test
            with lock:
                errors.append(error)
        else:
            with lock:
                results.append(result)

    threads = [threading.Thread(target=thread) for _ in range(count)]
    for started in threads:
        started.start()
    for started in threads:
        started.join(timeout=120)
    return results, errors


@pytest.mark.parametrize(
    ("quotas", "allowed"),
    [({"quota_sandboxes": 5}, 5), ({"quota_cpu_millis": 4500}, 4), ({"quota_memory_mib": 3 * 1024}, 3)],
)
def test_concurrent_creates_never_exceed_quota(
    sessions: Sessions, quotas: dict[str, int], allowed: int
) -> None:
    org, user = org_with_user(sessions, **quotas)

    def create() -> str:
        with sessions.begin() as session:
            return store.create_sandbox(session, org.id, user.id, spec()).id

    results, errors = run_together(20, create)
    assert len(results) == allowed
    assert len(errors) == 20 - allowed
    assert all(isinstance(error, store.QuotaExceeded) for error in errors), errors
    assert count_live(sessions, org.id) == allowed


def test_concurrent_creates_with_one_idempotency_key_create_once(sessions: Sessions) -> None:
    org, user = org_with_user(sessions)
    calls: list[str] = []
    digest = store.request_hash("POST", "/v1/sandboxes", spec())

    def create() -> tuple[store.Recalled, bool]:
        return store.run_idempotent(sessions, org.id, "same-key", digest, creator(org, user, calls))

    results, errors = run_together(12, create)
    assert errors == []
    assert count_live(sessions, org.id) == 1
    assert sorted(replayed for _, replayed in results) == [False] + [True] * 11
    assert len({json.dumps(answer.response, sort_keys=True) for answer, _ in results}) == 1
    assert len(calls) == 1  # the organization lock made the others wait, not act and roll back


def test_racing_remember_without_the_lock(sessions: Sessions) -> None:
    """The unique key alone stops a second answer, even for a caller that skipped the org lock."""
    org, _ = org_with_user(sessions)

    def remember() -> None:
        with sessions.begin() as session:
            store.remember(session, org.id, "raced", "c" * 64, status_code=201, response={})

    results, errors = run_together(8, remember)
    assert len(results) == 1
    assert len(errors) == 7
    assert all(isinstance(error, store.IdempotencyKeyTakenError) for error in errors), errors


def test_the_edge_resolves_a_key_the_store_issued(sessions: Sessions) -> None:
    from warren_control import keys

    org, user = org_with_user(sessions, "resolver-org")
    with sessions.begin() as session:
        issued = store.issue_api_key(session, org.id, user.id, ["sandboxes:read"])
    resolver = store.DatabaseKeyResolver(sessions)
    stored = resolver.lookup(keys.parse(issued.token).key_id)
    assert stored is not None and stored.org == org.id and stored.user == user.id
    assert keys.check(issued.token, stored.secret_sha256) and not stored.revoked
    assert resolver.lookup("nosuchkey000") is None
