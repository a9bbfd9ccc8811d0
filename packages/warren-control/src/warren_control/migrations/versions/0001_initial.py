"""The product records: organizations, users, API keys, sandboxes, idempotency records.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Written out rather than imported from the models: a migration describes the schema as it was
# at this revision, whatever the models become later.
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TIME = sa.DateTime(timezone=True)
_ID = sa.String(32)
_PHASES = ("Pending", "Running", "Stopped", "Failed", "Terminating", "Deleted")


def upgrade() -> None:
    """Every table of the first schema, in dependency order. Long, and one function: a
    migration is read top to bottom as the schema at its revision."""
    op.create_table(
        "organizations",
        sa.Column("id", _ID, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("quota_sandboxes", sa.Integer(), nullable=False),
        sa.Column("quota_cpu_millis", sa.Integer(), nullable=False),
        sa.Column("quota_memory_mib", sa.Integer(), nullable=False),
        sa.Column("idle_timeout_s", sa.Integer(), nullable=False),
        sa.Column("max_lifetime_s", sa.Integer(), nullable=False),
        sa.Column("may_persist", sa.Boolean(), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_organizations"),
        sa.UniqueConstraint("name", name="uq_organizations_name"),
    )
    op.create_table(
        "users",
        sa.Column("id", _ID, nullable=False),
        sa.Column("org_id", _ID, nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_users_org_id_organizations"),
        sa.UniqueConstraint("org_id", "subject", name="uq_users_org_id_subject"),
        sa.UniqueConstraint("org_id", "id", name="uq_users_org_id_id"),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_id", _ID, nullable=False),
        sa.Column("org_id", _ID, nullable=False),
        sa.Column("user_id", _ID, nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("scopes", _JSON, nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("revoked_at", _TIME, nullable=True),
        sa.Column("last_used_at", _TIME, nullable=True),
        sa.PrimaryKeyConstraint("key_id", name="pk_api_keys"),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_api_keys_org_id_organizations"),
        sa.ForeignKeyConstraint(
            ["org_id", "user_id"], ["users.org_id", "users.id"], name="fk_api_keys_org_id_user_id_users"
        ),
    )
    op.create_index("ix_api_keys_org_id_user_id", "api_keys", ["org_id", "user_id"])
    op.create_table(
        "sandboxes",
        sa.Column("id", _ID, nullable=False),
        sa.Column("org_id", _ID, nullable=False),
        sa.Column("created_by", _ID, nullable=False),
        sa.Column("spec", _JSON, nullable=False),
        sa.Column("object_name", sa.String(63), nullable=False),
        sa.Column(
            "phase",
            sa.Enum(*_PHASES, name="phase", native_enum=False, create_constraint=True, length=16),
            nullable=False,
        ),
        sa.Column("conditions", _JSON, nullable=False),
        sa.Column("workspace_id", sa.String(128), nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("started_at", _TIME, nullable=True),
        sa.Column("last_activity_at", _TIME, nullable=False),
        sa.Column("expires_at", _TIME, nullable=False),
        sa.Column("deleted_at", _TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sandboxes"),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_sandboxes_org_id_organizations"),
        sa.ForeignKeyConstraint(
            ["org_id", "created_by"],
            ["users.org_id", "users.id"],
            name="fk_sandboxes_org_id_created_by_users",
        ),
        sa.UniqueConstraint("object_name", name="uq_sandboxes_object_name"),
    )
    op.create_index("ix_sandboxes_org_id_created_at_id", "sandboxes", ["org_id", "created_at", "id"])
    op.create_table(
        "idempotency_records",
        sa.Column("org_id", _ID, nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("request_sha256", sa.String(64), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("response", _JSON, nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("org_id", "key", name="pk_idempotency_records"),
        sa.ForeignKeyConstraint(
            ["org_id"], ["organizations.id"], name="fk_idempotency_records_org_id_organizations"
        ),
    )
    op.create_index("ix_idempotency_records_created_at", "idempotency_records", ["created_at"])


def downgrade() -> None:
    op.drop_table("idempotency_records")
    op.drop_table("sandboxes")
    op.drop_table("api_keys")
    op.drop_table("users")
    op.drop_table("organizations")
