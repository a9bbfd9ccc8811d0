"""Engines, sessions and schema upgrades for the product records.

A URL picks the database: `postgresql+psycopg://user@host/db` in production, `sqlite:///path` for
the single-node default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

MIGRATIONS = Path(__file__).parent / "migrations"

# Held while migrating, so replicas that start together upgrade one after another.
_MIGRATION_LOCK = 0x5741_5252  # "WARR"

# How long a SQLite writer waits for another one before giving up (seconds).
SQLITE_BUSY_TIMEOUT_S = 30


def make_engine(url: str, **kwargs: Any) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # pre_ping: a server restart shouldn't surface as one failed request per pooled connection.
        return create_engine(parsed, pool_pre_ping=True, **kwargs)
    connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}
    in_memory = parsed.database in (None, "", ":memory:")
    if in_memory:
        # Every connection to ":memory:" is a database of its own: share one across the pool.
        kwargs.setdefault("poolclass", StaticPool)
    engine = create_engine(parsed, connect_args=connect_args, **kwargs)

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # SQLite checks foreign keys only when asked, per connection.
        cursor.execute("PRAGMA foreign_keys=ON")
        if not in_memory:
            # Readers don't block the writer and the writer doesn't block readers.
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit off: a record returned from a finished transaction stays readable.
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str | None = None) -> Config:
    """An Alembic configuration that needs no alembic.ini: the scripts ship inside the package."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        # ConfigParser interpolates '%', which an escaped password may contain.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision` (the newest by default)."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            config = alembic_config(url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def pending(url: str) -> bool:
    """Whether `upgrade` would change the database at `url` (its schema is not the newest)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            current = set(MigrationContext.configure(connection).get_current_heads())
    finally:
        engine.dispose()
    return current != set(ScriptDirectory.from_config(alembic_config(url)).get_heads())
