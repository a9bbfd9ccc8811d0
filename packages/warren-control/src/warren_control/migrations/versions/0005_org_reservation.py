"""An organization's reservation: what its sandboxes' pods reserve on their nodes, as a
share of their size (empty: the deployment's default).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("organizations") as table:
        table.add_column(sa.Column("cpu_request_percent", sa.Integer(), nullable=True))
        table.add_column(sa.Column("memory_request_percent", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("organizations") as table:
        table.drop_column("memory_request_percent")
        table.drop_column("cpu_request_percent")
