"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError
from warren_control import store
from warren_control.db import MIGRATIONS, alembic_config, make_engine, session_factory, upgrade
from warren_control.models import Base, Sandbox


def test_migrations_ship_inside_the_package() -> None:
    assert (MIGRATIONS / "env.py").is_file()
    assert (MIGRATIONS / "script.py.mako").is_file()
    scripts = ScriptDirectory.from_config(alembic_config())
    assert scripts.get_heads() == ["0007"]


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
            assert context.get_current_revision() == "0007"
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


def test_0002_gives_existing_sandboxes_their_idle_deadline(records_url: str) -> None:
    engine = make_engine(records_url)
    try:
        with engine.begin() as connection:
            config = alembic_config(records_url)
            config.attributes["connection"] = connection
            command.upgrade(config, "0001")
            now = datetime(2026, 1, 1, tzinfo=UTC)
            connection.execute(
                text(
                    "INSERT INTO organizations (id, name, quota_sandboxes, quota_cpu_millis,"
                    " quota_memory_mib, idle_timeout_s, max_lifetime_s, may_persist, created_at)"
                    " VALUES ('o1', 'o1', 1, 1, 1, 60, 600, false, :now)"
                ),
                {"now": now},
            )
            connection.execute(
                text("INSERT INTO users (id, org_id, subject, created_at) VALUES ('u1', 'o1', 's', :now)"),
                {"now": now},
            )
            connection.execute(
                text(
                    "INSERT INTO sandboxes (id, org_id, created_by, spec, object_name, phase, conditions,"
                    " created_at, last_activity_at, expires_at)"
                    " VALUES ('s1', 'o1', 'u1', :spec, 'obj1', 'Running', '[]', :now, :now, :later)"
                ),
                {"spec": '{"idle_timeout_s": 90}', "now": now, "later": now + timedelta(seconds=600)},
            )
            command.upgrade(config, "head")
        with session_factory(engine)() as session:
            found = session.get(Sandbox, "s1")
            assert found is not None
            assert found.idle_deadline_at == datetime(2026, 1, 1, 0, 1, 30, tzinfo=UTC)
            assert found.location is None
    finally:
        engine.dispose()
