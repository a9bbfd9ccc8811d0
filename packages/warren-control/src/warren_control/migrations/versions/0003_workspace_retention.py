"""What the workspace retention needs: when a deleted sandbox's workspace was released.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as table:
        table.add_column(sa.Column("workspace_released_at", sa.DateTime(timezone=True), nullable=True))
        # The reaper finds deleted sandboxes whose retention has passed by this.
        table.create_index("ix_sandboxes_deleted_at", ["deleted_at"])


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as table:
        table.drop_index("ix_sandboxes_deleted_at")
        table.drop_column("workspace_released_at")
