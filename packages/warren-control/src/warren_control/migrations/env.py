"""Alembic environment: run by `warren_control.db.upgrade`, or by the alembic command with
`-x url=...` (or `sqlalchemy.url`) to migrate or to print the SQL offline."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection
from warren_control.db import make_engine
from warren_control.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database URL: pass -x url=... or set sqlalchemy.url")
    return url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite can't ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    shared = config.attributes.get("connection")
    if shared is not None:
        # upgrade() passes its connection and commits it itself.
        _configure(shared)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.begin() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
