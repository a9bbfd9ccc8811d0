"""An organization's cap on sandboxes from warm pools at once (empty: no cap of its own).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("organizations") as table:
        table.add_column(sa.Column("pool_sandboxes_max", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("organizations") as table:
        table.drop_column("pool_sandboxes_max")
