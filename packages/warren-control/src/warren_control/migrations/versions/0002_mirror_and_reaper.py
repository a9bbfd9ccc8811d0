"""What the status mirror and the reaper need: a node-free location hint and the idle deadline.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as table:
        table.add_column(sa.Column("location", _JSON, nullable=True))
        # Null while no idle timer runs (a persistent sandbox the reaper stopped).
        table.add_column(sa.Column("idle_deadline_at", _TIME, nullable=True))
        table.create_index("ix_sandboxes_idle_deadline_at", ["idle_deadline_at"])
        table.create_index("ix_sandboxes_expires_at", ["expires_at"])
    # Existing sandboxes get the deadline their spec implies.
    sandboxes = sa.table(
        "sandboxes",
        sa.column("id", sa.String),
        sa.column("spec", _JSON),
        sa.column("last_activity_at", _TIME),
        sa.column("idle_deadline_at", _TIME),
        sa.column("deleted_at", _TIME),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(sandboxes.c.id, sandboxes.c.spec, sandboxes.c.last_activity_at).where(
            sandboxes.c.deleted_at.is_(None)
        )
    ).all()
    for row in rows:
        idle = int((row.spec or {}).get("idle_timeout_s") or 24 * 3600)
        connection.execute(
            sa.update(sandboxes)
            .where(sandboxes.c.id == row.id)
            .values(idle_deadline_at=row.last_activity_at + timedelta(seconds=idle))
        )


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as table:
        table.drop_index("ix_sandboxes_expires_at")
        table.drop_index("ix_sandboxes_idle_deadline_at")
        table.drop_column("idle_deadline_at")
        table.drop_column("location")
