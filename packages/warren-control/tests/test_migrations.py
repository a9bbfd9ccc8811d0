"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError
from warren_control import store
from warren_control.db import MIGRATIONS, alembic_config, make_engine, session_factory, upgrade
from warren_control.models import Base


def test_migrations_ship_inside_the_package() -> None:
    assert (MIGRATIONS / "env.py").is_file()
    assert (MIGRATIONS / "script.py.mako").is_file()
    scripts = ScriptDirectory.from_config(alembic_config())
    assert scripts.get_heads() == ["0001"]


def test_upgrade_creates_exactly_the_models_schema(records_url: str) -> None:
    upgrade(records_url)
    upgrade(records_url)  # a second run finds nothing to do
    engine = make_engine(records_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "compare_server_default": True}
            )
            assert compare_metadata(context, Base.metadata) == []
            assert context.get_current_revision() == "0001"
            assert set(inspect(connection).get_table_names()) == {*Base.metadata.tables, "alembic_version"}
    finally:
        engine.dispose()


def test_downgrade_removes_everything(records_url: str) -> None:
    upgrade(records_url)
    engine = make_engine(records_url)
    try:
        with engine.begin() as connection:
            config = alembic_config(records_url)
            config.attributes["connection"] = connection
            command.downgrade(config, "base")
        with engine.connect() as connection:
            assert set(inspect(connection).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()


def test_database_enforces_constraints(records_url: str) -> None:
    """Foreign keys (on SQLite too), the (org, user) pairing and the phase check."""
    upgrade(records_url)
    engine = make_engine(records_url)
    sessions = session_factory(engine)
    try:
        with sessions.begin() as session:
            org_a = store.create_org(session, "a")
            org_b = store.create_org(session, "b")
            user_b = store.create_user(session, org_b.id, "bob")
            user_a = store.create_user(session, org_a.id, "alice")
        now = datetime.now(UTC)
        row = {
            "id": "sbx_x",
            "org": org_a.id,
            "user": user_b.id,  # a user of the other organization
            "spec": "{}",
            "name": "sandbox-x",
            "phase": "Pending",
            "now": now,
        }
        insert = text(
            "INSERT INTO sandboxes (id, org_id, created_by, spec, object_name, phase, conditions, "
            "created_at, last_activity_at, expires_at) "
            "VALUES (:id, :org, :user, :spec, :name, :phase, '[]', :now, :now, :now)"
        )
        for bad in ({"user": user_b.id}, {"user": user_a.id, "phase": "Bogus"}, {"org": "org_none"}):
            with pytest.raises(IntegrityError), engine.begin() as connection:
                connection.execute(insert, {**row, **bad})
        with engine.begin() as connection:
            connection.execute(insert, {**row, "user": user_a.id})
    finally:
        engine.dispose()
