"""The repository the API calls: organizations, users, API keys, sandbox records, idempotency.

Functions take a Session and leave committing to the caller, so one request is one transaction;
`run_idempotent` is the exception, because it has to roll back and retry on its own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, and_, bindparam, delete, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from warren_control import ids, keys
from warren_control.models import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_LIFETIME_S,
    ApiKey,
    IdempotencyRecord,
    Organization,
    Sandbox,
    SandboxPhase,
    Snapshot,
    User,
    utcnow,
)

MAX_PAGE = 1000


class StoreError(Exception):
    """A request the records refuse; the message is meant for the client."""


class OrgNotFoundError(StoreError):
    pass


class QuotaExceeded(StoreError):  # noqa: N818 (the name the API contract uses)
    def __init__(self, quota: str, limit: int, in_use: int, requested: int) -> None:
        self.quota, self.limit, self.in_use, self.requested = quota, limit, in_use, requested
        super().__init__(f"quota {quota} exceeded: {in_use} in use + {requested} requested > {limit} allowed")


class PersistenceNotAllowedError(StoreError):
    def __init__(self) -> None:
        super().__init__("this organization may not create persistent sandboxes")


class InvalidSpecError(StoreError, ValueError):
    pass


class InvalidCursorError(StoreError, ValueError):
    def __init__(self) -> None:
        super().__init__("invalid page cursor")


class IdempotencyConflict(StoreError):  # noqa: N818 (the name the API contract uses)
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"idempotency key {key!r} was already used with a different request")


class IdempotencyKeyTakenError(StoreError):
    """Another transaction stored an answer for this key first: roll back, then recall it."""


# --- organizations and users -------------------------------------------------------------------


def create_org(
    session: Session,
    name: str,
    *,
    quota_sandboxes: int = 20,
    quota_cpu_millis: int = 16_000,
    quota_memory_mib: int = 32_768,
    idle_timeout_s: int = DEFAULT_IDLE_TIMEOUT_S,
    max_lifetime_s: int = DEFAULT_MAX_LIFETIME_S,
    may_persist: bool = False,
) -> Organization:
    org = Organization(
        id=ids.new_org_id(),
        name=name,
        quota_sandboxes=quota_sandboxes,
        quota_cpu_millis=quota_cpu_millis,
        quota_memory_mib=quota_memory_mib,
        idle_timeout_s=idle_timeout_s,
        max_lifetime_s=max_lifetime_s,
        may_persist=may_persist,
        created_at=utcnow(),
    )
    session.add(org)
    session.flush()
    return org


def get_org(session: Session, org_id: str) -> Organization | None:
    return session.get(Organization, org_id)


def get_org_by_name(session: Session, name: str) -> Organization | None:
    return session.scalars(select(Organization).where(Organization.name == name)).one_or_none()


def create_user(session: Session, org_id: str, subject: str) -> User:
    user = User(id=ids.new_user_id(), org_id=org_id, subject=subject, created_at=utcnow())
    session.add(user)
    session.flush()
    return user


def get_user(session: Session, org_id: str, user_id: str) -> User | None:
    return session.scalars(select(User).where(User.org_id == org_id, User.id == user_id)).one_or_none()


def ensure_user(session: Session, org_id: str, subject: str) -> User:
    """The user with this subject in this organization, created on first sight (an OIDC login).

    INSERT ... ON CONFLICT DO NOTHING, so two first requests at once don't fail one another.
    """
    values = {"id": ids.new_user_id(), "org_id": org_id, "subject": subject, "created_at": utcnow()}
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    session.execute(insert(User).values(values).on_conflict_do_nothing(index_elements=["org_id", "subject"]))
    return session.scalars(select(User).where(User.org_id == org_id, User.subject == subject)).one()


# --- API keys ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedKey:
    token: str  # shown to the user once; only its secret's hash is kept
    key_id: str


@dataclass(frozen=True)
class KeyRecord:
    """What the edge needs to authenticate a key: compare the hash, then stamp org/user/scopes."""

    key_id: str
    org_id: str
    user_id: str
    user_subject: str
    scopes: tuple[str, ...]
    secret_sha256: str
    revoked: bool


hash_secret = keys.hash_secret


def add_api_key(
    session: Session, org_id: str, user_id: str, scopes: Sequence[str], *, key_id: str, secret_sha256: str
) -> ApiKey:
    """Store a key made elsewhere (only its id and the hash of its secret)."""
    key = ApiKey(
        key_id=key_id,
        org_id=org_id,
        user_id=user_id,
        secret_sha256=secret_sha256,
        scopes=list(scopes),
        created_at=utcnow(),
    )
    session.add(key)
    session.flush()
    return key


def issue_api_key(
    session: Session, org_id: str, user_id: str, scopes: Sequence[str], key_format: keys.KeyFormat = "warren"
) -> IssuedKey:
    """A new key in one of the edge's formats (see keys.py); only the hash of its secret is stored."""
    made = keys.new_key(key_format)
    add_api_key(session, org_id, user_id, scopes, key_id=made.key_id, secret_sha256=made.secret_sha256)
    return IssuedKey(token=made.token, key_id=made.key_id)


# The edge's and the API's reads on every request, built once: building a statement costs
# more than running one (a tenth of a GET's time through the edge).
_KEY_BY_ID = (
    select(ApiKey, User.subject)
    .join(User, and_(User.org_id == ApiKey.org_id, User.id == ApiKey.user_id))
    .where(ApiKey.key_id == bindparam("key_id"))
)
_SANDBOX_OF_ORG = select(Sandbox).where(
    Sandbox.org_id == bindparam("org_id"), Sandbox.id == bindparam("sandbox_id")
)
_LIVE_SANDBOX_OF_ORG = _SANDBOX_OF_ORG.where(Sandbox.deleted_at.is_(None))


def lookup_key(session: Session, key_id: str) -> KeyRecord | None:
    row = session.execute(_KEY_BY_ID, {"key_id": key_id}).one_or_none()
    if row is None:
        return None
    key, subject = row
    return KeyRecord(
        key_id=key.key_id,
        org_id=key.org_id,
        user_id=key.user_id,
        user_subject=subject,
        scopes=tuple(key.scopes),
        secret_sha256=key.secret_sha256,
        revoked=key.revoked_at is not None,
    )


def revoke_key(session: Session, org_id: str, key_id: str, *, now: datetime | None = None) -> bool:
    """Revoke one of this organization's keys; False if it has no such key. Revoking twice keeps
    the first time."""
    query = select(ApiKey).where(ApiKey.org_id == org_id, ApiKey.key_id == key_id)
    key = session.scalars(query).one_or_none()
    if key is None:
        return False
    if key.revoked_at is None:
        key.revoked_at = now or utcnow()
        session.flush()
    return True


def mark_key_used(
    session: Session, key_id: str, *, now: datetime | None = None, every: timedelta = timedelta(minutes=1)
) -> None:
    """Record use, at most once per `every`, so busy keys don't cost a write per request."""
    now = now or utcnow()
    session.execute(
        update(ApiKey)
        .where(
            ApiKey.key_id == key_id,
            or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < now - every),
        )
        .values(last_used_at=now)
        .execution_options(synchronize_session=False)
    )


# --- sandboxes ---------------------------------------------------------------------------------


def lock_org(session: Session, org_id: str) -> Organization:
    """Hold the organization's row until the transaction ends, so creates in one organization
    check their quotas one at a time.

    PostgreSQL: SELECT ... FOR UPDATE. SQLite has no row locks: the sqlite3 driver opens a
    transaction at the first write, so a no-op UPDATE takes the database's one writer lock (waiting
    up to the busy timeout) and the reads after it see every committed row.
    """
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(Organization)
            .where(Organization.id == org_id)
            .values(id=Organization.id)
            .execution_options(synchronize_session=False)
        )
    org = session.scalars(
        select(Organization)
        .where(Organization.id == org_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()
    if org is None:
        raise OrgNotFoundError(f"no organization {org_id}")
    return org


def _positive_int(spec: Mapping[str, Any], field: str) -> int:
    value = spec.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidSpecError(f"spec.{field} must be a positive integer")
    return value


def usage(session: Session, org_id: str) -> tuple[int, int, int]:
    """(sandboxes, cpu millis, memory MiB) held by the organization's sandboxes not yet deleted.

    A Terminating sandbox still counts: its pod may still hold the resources.
    """
    count, cpu, memory = session.execute(
        select(
            func.count(),
            func.coalesce(func.sum(Sandbox.spec["cpu_millis"].as_integer()), 0),
            func.coalesce(func.sum(Sandbox.spec["memory_mib"].as_integer()), 0),
        ).where(Sandbox.org_id == org_id, Sandbox.deleted_at.is_(None))
    ).one()
    return int(count), int(cpu), int(memory)


def live_specs(session: Session, org_id: str) -> list[dict[str, Any]]:
    """The specs of the organization's sandboxes not yet deleted."""
    specs = session.scalars(
        select(Sandbox.spec).where(Sandbox.org_id == org_id, Sandbox.deleted_at.is_(None))
    )
    return list(specs)


def create_sandbox(
    session: Session,
    org_id: str,
    user_id: str,
    spec: Mapping[str, Any],
    *,
    workspace_id: str | None = None,
    now: datetime | None = None,
) -> Sandbox:
    """Record a new sandbox (phase Pending) if the organization's quotas and policy allow it.

    Raises QuotaExceeded naming the first quota it would break, PersistenceNotAllowedError or
    InvalidSpecError.
    """
    cpu = _positive_int(spec, "cpu_millis")
    memory = _positive_int(spec, "memory_mib")
    org = lock_org(session, org_id)
    if spec.get("persistent") and not org.may_persist:
        raise PersistenceNotAllowedError
    count, cpu_used, memory_used = usage(session, org_id)
    for quota, limit, in_use, requested in (
        ("sandboxes", org.quota_sandboxes, count, 1),
        ("cpu_millis", org.quota_cpu_millis, cpu_used, cpu),
        ("memory_mib", org.quota_memory_mib, memory_used, memory),
    ):
        if in_use + requested > limit:
            raise QuotaExceeded(quota, limit, in_use, requested)
    now = now or utcnow()
    spec = dict(spec)
    spec.pop("reservation", None)  # a fork's copy of its parent's spec: the organization's now
    reservation = {
        key: value
        for key, value in (
            ("cpu_percent", org.cpu_request_percent),
            ("memory_percent", org.memory_request_percent),
        )
        if value is not None
    }
    if reservation:  # the organization's, fixed at creation like its size
        spec["reservation"] = reservation
    # A request may shorten the organization's timers, never lengthen them.
    lifetime = min(int(spec.get("max_lifetime_s") or org.max_lifetime_s), org.max_lifetime_s)
    idle = min(int(spec.get("idle_timeout_s") or org.idle_timeout_s), org.idle_timeout_s)
    sandbox = Sandbox(
        id=ids.new_sandbox_id(),
        org_id=org_id,
        created_by=user_id,
        spec=spec,
        object_name=ids.new_object_name(),
        phase=SandboxPhase.PENDING,
        conditions=[],
        workspace_id=workspace_id,
        created_at=now,
        last_activity_at=now,
        idle_deadline_at=now + timedelta(seconds=idle),
        # Persistent sandboxes outlive the idle timer (the reaper stops them instead of
        # deleting them), never the hard lifetime.
        expires_at=now + timedelta(seconds=lifetime),
    )
    session.add(sandbox)
    session.flush()
    return sandbox


def get_sandbox(
    session: Session, org_id: str, sandbox_id: str, *, include_deleted: bool = False
) -> Sandbox | None:
    """One of this organization's sandboxes; another organization's id is simply not found."""
    query = _SANDBOX_OF_ORG if include_deleted else _LIVE_SANDBOX_OF_ORG
    return session.scalars(query, {"org_id": org_id, "sandbox_id": sandbox_id}).one_or_none()


def get_sandbox_by_object_name(session: Session, object_name: str) -> Sandbox | None:
    """For the controller and the status mirror, which know the Kubernetes object, not the client."""
    return session.scalars(select(Sandbox).where(Sandbox.object_name == object_name)).one_or_none()


@dataclass(frozen=True)
class Page:
    items: list[Sandbox]
    next_cursor: str | None  # None: this was the last page


def cursor_after(item: Sandbox | Snapshot) -> str:
    # Only what the page's last item already shows the client: its creation time and id.
    raw = json.dumps([item.created_at.isoformat(), item.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, sandbox_id = json.loads(raw)
        moment = datetime.fromisoformat(stamp)
    except (binascii.Error, ValueError, TypeError) as error:
        raise InvalidCursorError from error
    # Ids are printable ASCII; anything else (a NUL, a lone surrogate) PostgreSQL could not
    # even compare, so it is refused here rather than failing in the database.
    valid_id = isinstance(sandbox_id, str) and sandbox_id.isascii() and sandbox_id.isprintable()
    if not valid_id or moment.tzinfo is None:
        raise InvalidCursorError
    return moment, sandbox_id


def list_sandboxes(
    session: Session,
    org_id: str,
    *,
    limit: int = 50,
    cursor: str | None = None,
    include_deleted: bool = False,
    descending: bool = False,
) -> Page:
    """The organization's sandboxes oldest first (newest first if `descending`), `limit` at a time.

    Keyset pagination on (created_at, id): a page starts strictly after the previous page's last
    item, so records created or deleted meanwhile shift nothing (no duplicates, no gaps).
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}")
    query = select(Sandbox).where(Sandbox.org_id == org_id)
    if not include_deleted:
        query = query.where(Sandbox.deleted_at.is_(None))
    if cursor is not None:
        after, after_id = _decode_cursor(cursor)
        if descending:
            query = query.where(
                or_(Sandbox.created_at < after, and_(Sandbox.created_at == after, Sandbox.id < after_id))
            )
        else:
            query = query.where(
                or_(Sandbox.created_at > after, and_(Sandbox.created_at == after, Sandbox.id > after_id))
            )
    order = (Sandbox.created_at.desc(), Sandbox.id.desc()) if descending else (Sandbox.created_at, Sandbox.id)
    rows = list(session.scalars(query.order_by(*order).limit(limit + 1)))
    more = len(rows) > limit
    items = rows[:limit]
    return Page(items=items, next_cursor=cursor_after(items[-1]) if more else None)


def create_snapshot(
    session: Session, source: Sandbox, workspace_id: str, name: str | None, spec: dict[str, Any]
) -> Snapshot:
    snapshot = Snapshot(
        id=ids.new_snapshot_id(),
        org_id=source.org_id,
        sandbox_id=source.id,
        name=name,
        workspace_id=workspace_id,
        spec=spec,
    )
    session.add(snapshot)
    session.flush()
    return snapshot


def find_snapshot(session: Session, org_id: str, id_or_name: str) -> Snapshot | None:
    """The organization's snapshot with this id, or the newest one with this name."""
    query = select(Snapshot).where(
        Snapshot.org_id == org_id, or_(Snapshot.id == id_or_name, Snapshot.name == id_or_name)
    )
    return session.scalars(query.order_by(Snapshot.created_at.desc(), Snapshot.id.desc()).limit(1)).first()


def list_snapshots(
    session: Session,
    org_id: str,
    *,
    sandbox_id: str | None = None,
    name: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> tuple[list[Snapshot], str | None]:
    """The organization's snapshots newest first, `limit` at a time, and the cursor that
    continues after them (None after the last)."""
    query = select(Snapshot).where(Snapshot.org_id == org_id)
    if sandbox_id is not None:
        query = query.where(Snapshot.sandbox_id == sandbox_id)
    if name is not None:
        query = query.where(or_(Snapshot.name == name, Snapshot.id == name))
    if cursor is not None:
        after, after_id = _decode_cursor(cursor)
        query = query.where(
            or_(Snapshot.created_at < after, and_(Snapshot.created_at == after, Snapshot.id < after_id))
        )
    rows = list(
        session.scalars(query.order_by(Snapshot.created_at.desc(), Snapshot.id.desc()).limit(limit + 1))
    )
    items = rows[:limit]
    return items, cursor_after(items[-1]) if len(rows) > limit else None


def set_phase(
    session: Session,
    sandbox: Sandbox,
    phase: SandboxPhase,
    *,
    conditions: list[dict[str, Any]] | None = None,
    now: datetime | None = None,
) -> None:
    """Record what was observed; the first Running sets started_at, Deleted sets deleted_at."""
    now = now or utcnow()
    sandbox.phase = phase
    if conditions is not None:
        sandbox.conditions = conditions
    if phase is SandboxPhase.RUNNING and sandbox.started_at is None:
        sandbox.started_at = now
    if phase is SandboxPhase.DELETED and sandbox.deleted_at is None:
        sandbox.deleted_at = now
    session.flush()


def begin_delete(
    session: Session, sandbox: Sandbox, *, conditions: list[dict[str, Any]] | None = None
) -> None:
    """Terminating for good. Marked in the spec too: a stopped sandbox's pod also reads
    Terminating while it goes, and that one comes back."""
    if not sandbox.spec.get("deleting"):
        sandbox.spec = {**sandbox.spec, "deleting": True}
    set_phase(session, sandbox, SandboxPhase.TERMINATING, conditions=conditions)


def mark_deleted(
    session: Session, org_id: str, sandbox_id: str, *, now: datetime | None = None
) -> Sandbox | None:
    """Mark the sandbox Deleted (it stops counting against quotas); None if there is none."""
    sandbox = get_sandbox(session, org_id, sandbox_id)
    if sandbox is not None:
        set_phase(session, sandbox, SandboxPhase.DELETED, now=now)
    return sandbox


def keep_alive(
    session: Session, org_id: str, sandbox_id: str, *, now: datetime | None = None
) -> Sandbox | None:
    """Restart the idle timer (the hard lifetime stays)."""
    sandbox = get_sandbox(session, org_id, sandbox_id)
    if sandbox is not None:
        sandbox.touch(now)
        session.flush()
    return sandbox


# --- idempotency -------------------------------------------------------------------------------


def request_hash(method: str, path: str, body: Any) -> str:
    """SHA-256 of a request in canonical form: the same request always hashes the same."""
    canonical = json.dumps([method.upper(), path, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Recalled:
    status_code: int
    response: Any


def recall(session: Session, org_id: str, key: str, request_sha256: str) -> Recalled | None:
    """The answer stored for this key, None if there is none; IdempotencyConflict if the key came
    with a different request."""
    record = session.get(IdempotencyRecord, (org_id, key), populate_existing=True)
    if record is None:
        return None
    if record.request_sha256 != request_sha256:
        raise IdempotencyConflict(key)
    return Recalled(record.status_code, record.response)


def remember(
    session: Session, org_id: str, key: str, request_sha256: str, *, status_code: int, response: Any
) -> None:
    """Store the answer for this key. If another transaction got there first (PostgreSQL waits for
    it to finish), raises IdempotencyKeyTakenError: this transaction's work must be rolled back."""
    values = {
        "org_id": org_id,
        "key": key,
        "request_sha256": request_sha256,
        "status_code": status_code,
        "response": response,
        "created_at": utcnow(),
    }
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    # RETURNING says whether this statement inserted (an INSERT's rowcount isn't reliable).
    stored = session.execute(
        insert(IdempotencyRecord)
        .values(values)
        .on_conflict_do_nothing(index_elements=["org_id", "key"])
        .returning(IdempotencyRecord.key)
    ).first()
    if stored is None:
        raise IdempotencyKeyTakenError(key)


def run_idempotent(
    sessions: sessionmaker[Session],
    org_id: str,
    key: str,
    request_sha256: str,
    action: Callable[[Session], tuple[int, Any]],
) -> tuple[Recalled, bool]:
    """Run `action` at most once per (organization, key): returns (answer, replayed).

    `action` does its database work in the session it is given and returns (status, response);
    that work and the stored answer commit together. If `action` raises, nothing is stored (a
    retry may succeed once, say, quota is freed). The organization's row is locked first, so a
    concurrent request with the same key waits and then replays the answer instead of acting.
    """
    try:
        with sessions() as session, session.begin():
            lock_org(session, org_id)
            earlier = recall(session, org_id, key, request_sha256)
            if earlier is not None:
                return earlier, True
            status_code, response = action(session)
            # Raising here leaves the block, which rolls back the action's work.
            remember(session, org_id, key, request_sha256, status_code=status_code, response=response)
            return Recalled(status_code, response), False
    except IdempotencyKeyTakenError:
        pass
    # Only reachable if the lock didn't serialize us (an action that commits on its own, say).
    with sessions() as session:
        earlier = recall(session, org_id, key, request_sha256)
        if earlier is None:
            raise RuntimeError(f"idempotency record for {key!r} vanished")  # pruned mid-request
        return earlier, True


def forget_idempotency_before(session: Session, cutoff: datetime) -> int:
    """Drop answers older than `cutoff`; returns how many."""
    result = session.execute(
        delete(IdempotencyRecord)
        .where(IdempotencyRecord.created_at < cutoff)
        .execution_options(synchronize_session=False)
    )
    return cast("CursorResult[Any]", result).rowcount


class DatabaseKeyResolver:
    """The edge's KeyResolver over the records: org and user ids go into the stamp."""

    def __init__(self, sessions: Callable[[], Session]) -> None:
        self.sessions = sessions

    def lookup(self, key_id: str) -> keys.StoredKey | None:
        with self.sessions() as session:
            record = lookup_key(session, key_id)
        if record is None:
            return None
        return keys.StoredKey(
            org=record.org_id,
            user=record.user_id,
            scopes=frozenset(record.scopes),
            revoked=record.revoked,
            secret_sha256=record.secret_sha256,
        )
