"""The product records: organizations, users, API keys, sandboxes, secrets and their uses, and
idempotency records.

PostgreSQL in production, SQLite for the single-node default: every type here means the same on both.
The schema is created by the Alembic migrations in `migrations/`, never by `create_all`; a test
checks that the two agree.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Dialect,
    Enum,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    UniqueConstraint,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

DEFAULT_IDLE_TIMEOUT_S = 24 * 3600
DEFAULT_MAX_LIFETIME_S = 7 * 24 * 3600


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A point in time, always handed back zone-aware in UTC.

    SQLite has no zoned type, so it stores the UTC wall time as text (which then sorts by time);
    a naive datetime is refused rather than guessed at.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: product records hold zone-aware UTC times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# JSONB on PostgreSQL (compact, comparable), JSON text elsewhere.
JSONType = JSON().with_variant(postgresql.JSONB(), "postgresql")


class SandboxPhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    STOPPED = "Stopped"
    FAILED = "Failed"
    TERMINATING = "Terminating"
    DELETED = "Deleted"


# Explicit constraint names, so later migrations (and SQLite batch mode) can address them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 (SQLAlchemy reads it as a class attribute)
        datetime: UTCDateTime(),
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
        list[str]: JSONType,
        list[dict[str, Any]]: JSONType,
        # A string with a check constraint rather than a native enum: adding a phase later is
        # then a plain migration on both databases.
        SandboxPhase: Enum(
            SandboxPhase,
            native_enum=False,
            length=16,
            create_constraint=True,
            name="phase",
            values_callable=lambda phases: [p.value for p in phases],
            validate_strings=True,
        ),
    }


class Organization(Base):
    __tablename__ = "organizations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    quota_sandboxes: Mapped[int] = mapped_column(Integer)
    quota_cpu_millis: Mapped[int] = mapped_column(Integer)
    quota_memory_mib: Mapped[int] = mapped_column(Integer)
    idle_timeout_s: Mapped[int] = mapped_column(Integer, default=DEFAULT_IDLE_TIMEOUT_S)
    max_lifetime_s: Mapped[int] = mapped_column(Integer, default=DEFAULT_MAX_LIFETIME_S)
    may_persist: Mapped[bool] = mapped_column(Boolean, default=False)
    # What its sandboxes' pods reserve on their nodes, as a percentage of their size; None:
    # the deployment's default (the controller's --cpu/memory-request-percent).
    cpu_request_percent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    memory_request_percent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # How many of its sandboxes may come from warm pools at once (None: as many as the pools
    # have), so one organization cannot take every ready pod; past it, creates start cold.
    pool_sandboxes_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class User(Base):
    __tablename__ = "users"
    __table_args__ = (
        ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        UniqueConstraint("org_id", "subject"),
        # The target of the (org_id, user) foreign keys of keys and sandboxes: a row can only
        # name a user of its own organization.
        UniqueConstraint("org_id", "id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(String(255))  # the OIDC `sub`, or a local name
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"
    __table_args__ = (
        ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        ForeignKeyConstraint(["org_id", "user_id"], ["users.org_id", "users.id"]),
        Index(None, "org_id", "user_id"),
    )

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    user_id: Mapped[str] = mapped_column(String(32))
    # Only the SHA-256 of the secret: the secret is 256 random bits, so a fast hash suffices.
    secret_sha256: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[list[str]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column()
    last_used_at: Mapped[datetime | None] = mapped_column()


class Sandbox(Base):
    __tablename__ = "sandboxes"
    __table_args__ = (
        ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        ForeignKeyConstraint(["org_id", "created_by"], ["users.org_id", "users.id"]),
        # Listing one organization's sandboxes in (created_at, id) order, a page at a time.
        Index(None, "org_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # opaque public id
    org_id: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(32))
    # image, command, cpu_millis, memory_mib, persistent, workspace {size, template | fork_of}
    spec: Mapped[dict[str, Any]] = mapped_column()
    # Internal: the Kubernetes object's name. Never part of what the API returns.
    object_name: Mapped[str] = mapped_column(String(63), unique=True)
    phase: Mapped[SandboxPhase] = mapped_column(default=SandboxPhase.PENDING)
    conditions: Mapped[list[dict[str, Any]]] = mapped_column(default=list)
    workspace_id: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    last_activity_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When the reaper acts on an idle sandbox: last activity plus its idle timeout; None
    # while no idle timer runs (a persistent sandbox the reaper has stopped).
    idle_deadline_at: Mapped[datetime | None] = mapped_column(index=True)
    expires_at: Mapped[datetime] = mapped_column(index=True)  # hard lifetime, fixed at creation
    # Where it runs, in words that name no node: {"zone": ..., "region": ...} as the
    # node's topology labels say, when they say anything.
    location: Mapped[dict[str, Any] | None] = mapped_column()
    deleted_at: Mapped[datetime | None] = mapped_column(index=True)
    # When the reaper released the workspace from object storage (the retention after the
    # delete had passed); until then a new sandbox may still start from it (template).
    workspace_released_at: Mapped[datetime | None] = mapped_column()

    @property
    def being_deleted(self) -> bool:
        """Deleted, or on its way: a stopping pod's Terminating is not a deletion."""
        return self.phase is SandboxPhase.DELETED or bool(self.spec.get("deleting"))

    def touch(self, now: datetime | None = None) -> None:
        """Activity: restart the idle timer (the hard lifetime stays)."""
        self.last_activity_at = now or utcnow()
        idle = int(self.spec.get("idle_timeout_s") or DEFAULT_IDLE_TIMEOUT_S)
        self.idle_deadline_at = self.last_activity_at + timedelta(seconds=idle)


class Snapshot(Base):
    """A sandbox's workspace as it stood at one moment, kept under a workspace of its own
    (warren-blockd copy: no data copied) to start new sandboxes from; it outlives its sandbox
    until it is deleted. What the E2B surface calls a snapshot."""

    __tablename__ = "snapshots"
    __table_args__ = (
        ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        Index(None, "org_id", "created_at", "id"),
        Index(None, "org_id", "name"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    sandbox_id: Mapped[str] = mapped_column(String(32))  # the source, kept after it is deleted
    name: Mapped[str | None] = mapped_column(String(200))
    workspace_id: Mapped[str] = mapped_column(String(128), unique=True)
    # What a sandbox made from it starts with: the source's image, size, template and env.
    spec: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class IdempotencyRecord(Base):
    """The answer given to one idempotency key, replayed when the same request comes again."""

    __tablename__ = "idempotency_records"
    __table_args__ = (
        ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        Index(None, "created_at"),  # pruning old records
    )

    # The primary key is the (org_id, key) uniqueness: two racing requests can't both insert.
    org_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_sha256: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int] = mapped_column(Integer)
    response: Mapped[Any] = mapped_column(JSONType, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Secret(Base):
    """A credential of an organization that only the egress gateway puts into requests, to
    the destinations it is bound to (vault.py). The value is sealed; a revoked secret keeps
    its row (its uses name it) but not its value."""

    __tablename__ = "secrets"
    __table_args__ = (
        ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        Index(None, "org_id", "name"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(63))
    destinations: Mapped[list[str]] = mapped_column()  # https URLs (vault.Destination.url)
    injection: Mapped[dict[str, Any]] = mapped_column()  # {header, template} or {query}
    # The environment variable a sandbox bound to it holds the placeholder in, if any.
    env: Mapped[str | None] = mapped_column(String(128))
    sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    version: Mapped[int] = mapped_column(Integer, default=1)
    # At most this many requests, and this many bytes both ways, in any budget_period_s.
    budget_requests: Mapped[int | None] = mapped_column(Integer)
    budget_bytes: Mapped[int | None] = mapped_column(Integer)
    budget_period_s: Mapped[int] = mapped_column(Integer, default=3600)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    rotated_at: Mapped[datetime | None] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column()


class SecretUse(Base):
    """One request a sandbox sent through the gateway with a secret, or tried to: the audit
    record (refusals too), and what budgets count."""

    __tablename__ = "secret_uses"
    __table_args__ = (
        ForeignKeyConstraint(["org_id"], ["organizations.id"]),
        Index(None, "secret_id", "at"),
        Index(None, "org_id", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    org_id: Mapped[str] = mapped_column(String(32))
    secret_id: Mapped[str | None] = mapped_column(String(32))
    sandbox_id: Mapped[str | None] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(64))  # the pod address the request came from
    destination: Mapped[str] = mapped_column(String(2048))  # method and URL, no query
    status: Mapped[int] = mapped_column(Integer)  # the destination's, or the gateway's refusal
    outcome: Mapped[str] = mapped_column(String(64))  # "sent" or why not
    bytes_sent: Mapped[int] = mapped_column(Integer, default=0)
    bytes_received: Mapped[int] = mapped_column(Integer, default=0)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    duration_ms: Mapped[int] = mapped_column(Integer, default=0)
