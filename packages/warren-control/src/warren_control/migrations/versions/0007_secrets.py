"""Secrets of an organization (sealed, bound to destinations) and the audit of their uses.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("org_id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("destinations", JSON, nullable=False),
        sa.Column("injection", JSON, nullable=False),
        sa.Column("env", sa.String(128), nullable=True),
        sa.Column("sealed", sa.LargeBinary(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("budget_requests", sa.Integer(), nullable=True),
        sa.Column("budget_bytes", sa.Integer(), nullable=True),
        sa.Column("budget_period_s", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_secrets_org_id_organizations"),
        sa.PrimaryKeyConstraint("id", name="pk_secrets"),
    )
    op.create_index("ix_secrets_org_id_name", "secrets", ["org_id", "name"])
    op.create_table(
        "secret_uses",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("org_id", sa.String(32), nullable=False),
        sa.Column("secret_id", sa.String(32), nullable=True),
        sa.Column("sandbox_id", sa.String(32), nullable=True),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("destination", sa.String(2048), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(64), nullable=False),
        sa.Column("bytes_sent", sa.Integer(), nullable=False),
        sa.Column("bytes_received", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_secret_uses_org_id_organizations"),
        sa.PrimaryKeyConstraint("id", name="pk_secret_uses"),
    )
    op.create_index("ix_secret_uses_secret_id_at", "secret_uses", ["secret_id", "at"])
    op.create_index("ix_secret_uses_org_id_at", "secret_uses", ["org_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_secret_uses_org_id_at", table_name="secret_uses")
    op.drop_index("ix_secret_uses_secret_id_at", table_name="secret_uses")
    op.drop_table("secret_uses")
    op.drop_index("ix_secrets_org_id_name", table_name="secrets")
    op.drop_table("secrets")
