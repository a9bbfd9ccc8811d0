"""Snapshots: a sandbox's workspace at one moment, kept to start new sandboxes from.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "snapshots",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("org_id", sa.String(32), nullable=False),
        sa.Column("sandbox_id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("workspace_id", sa.String(128), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["org_id"], ["organizations.id"], name="fk_snapshots_org_id_organizations"),
        sa.PrimaryKeyConstraint("id", name="pk_snapshots"),
        sa.UniqueConstraint("workspace_id", name="uq_snapshots_workspace_id"),
    )
    op.create_index("ix_snapshots_org_id_created_at_id", "snapshots", ["org_id", "created_at", "id"])
    op.create_index("ix_snapshots_org_id_name", "snapshots", ["org_id", "name"])


def downgrade() -> None:
    op.drop_index("ix_snapshots_org_id_name", table_name="snapshots")
    op.drop_index("ix_snapshots_org_id_created_at_id", table_name="snapshots")
    op.drop_table("snapshots")
