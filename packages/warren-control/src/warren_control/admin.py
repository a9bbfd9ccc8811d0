"""The operator's work on the records themselves: organizations and API keys.

No edge and no API key are involved: whoever can open the database is the operator. This is how
the first organization and key come to exist, and how a key is taken away at once. The command
line over these functions is admin_cli.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import inspect, select
from sqlalchemy.orm import Session
from warren_common.files import write_private

from warren_control import db, keys, store
from warren_control.models import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_LIFETIME_S,
    ApiKey,
    Organization,
    User,
)


class AdminError(Exception):
    """A request the records refuse; the message is meant for the operator."""


@dataclass(frozen=True)
class Quotas:
    sandboxes: int = 20
    cpu_millis: int = 16_000
    memory_mib: int = 32_768
    idle_timeout_s: int = DEFAULT_IDLE_TIMEOUT_S
    max_lifetime_s: int = DEFAULT_MAX_LIFETIME_S


@dataclass(frozen=True)
class KeyRow:
    """One API key as the operator sees it: never its secret, which is not kept."""

    key_id: str
    org_id: str
    org_name: str
    user: str
    scopes: tuple[str, ...]
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


def create_org(
    session: Session, name: str, quotas: Quotas | None = None, *, may_persist: bool = False
) -> Organization:
    quotas = quotas or Quotas()
    for field, value in vars(quotas).items():
        # A quota of 0 is a suspended organization; a timer of 0 would reap at once.
        if value < (1 if field.endswith("_s") else 0):
            raise AdminError(f"{field} may not be {value}")
    if store.get_org_by_name(session, name) is not None:
        raise AdminError(f"an organization named {name!r} exists already")
    return store.create_org(
        session,
        name,
        quota_sandboxes=quotas.sandboxes,
        quota_cpu_millis=quotas.cpu_millis,
        quota_memory_mib=quotas.memory_mib,
        idle_timeout_s=quotas.idle_timeout_s,
        max_lifetime_s=quotas.max_lifetime_s,
        may_persist=may_persist,
    )


def set_reservation(
    session: Session, org_ref: str, *, cpu_percent: int | None, memory_percent: int | None
) -> Organization:
    """What the organization's new sandboxes reserve on their nodes, as a percentage of their
    size (None: the deployment's default). Running sandboxes keep what they were made with."""
    for name, value in (("cpu", cpu_percent), ("memory", memory_percent)):
        if value is not None and not 1 <= value <= 100:  # noqa: PLR2004
            raise AdminError(f"the {name} reservation is {value}%: give a percentage from 1 to 100")
    org = find_org(session, org_ref)
    org.cpu_request_percent = cpu_percent
    org.memory_request_percent = memory_percent
    session.flush()
    return org


def set_pool_cap(session: Session, org_ref: str, most: int | None) -> Organization:
    """How many of the organization's sandboxes may come from warm pools at once (None: no
    cap of its own). Sandboxes already made keep their pods."""
    if most is not None and most < 0:
        raise AdminError(f"the pool cap is {most}: give 0 or more (0: every create starts cold), or none")
    org = find_org(session, org_ref)
    org.pool_sandboxes_max = most
    session.flush()
    return org


def find_org(session: Session, ref: str) -> Organization:
    """An organization by its id or its name."""
    org = store.get_org(session, ref) or store.get_org_by_name(session, ref)
    if org is None:
        raise AdminError(f"no organization with the id or name {ref!r}")
    return org


def issue_key(
    session: Session,
    org_ref: str,
    subject: str,
    scopes: Sequence[str] = (),
    key_format: keys.KeyFormat = "warren",
) -> store.IssuedKey:
    """A new key for `subject` (made a user of the organization if it is not one yet)."""
    org = find_org(session, org_ref)
    user = store.ensure_user(session, org.id, subject)
    return store.issue_api_key(session, org.id, user.id, list(scopes), key_format)


def _key_id(key: str) -> str:
    """A key id, or the id inside a whole key (so an operator can paste a leaked key)."""
    if keys.looks_like_key(key):
        try:
            return keys.parse(key).key_id
        except keys.KeyFormatError as exc:
            raise AdminError(str(exc)) from None
    return key


def revoke_key(session: Session, key: str) -> KeyRow:
    """Revoke a key (its id or the whole key); revoking twice keeps the first time."""
    key_id = _key_id(key)
    row = session.get(ApiKey, key_id)
    if row is None:
        raise AdminError(f"no API key with the id {key_id!r}")
    store.revoke_key(session, row.org_id, key_id)
    return list_keys(session, key_id=key_id)[0]


def list_keys(session: Session, org_ref: str | None = None, *, key_id: str | None = None) -> list[KeyRow]:
    query = (
        select(ApiKey, Organization.name, User.subject)
        .join(Organization, Organization.id == ApiKey.org_id)
        .join(User, User.id == ApiKey.user_id)
        .order_by(Organization.name, ApiKey.created_at, ApiKey.key_id)
    )
    if org_ref is not None:
        query = query.where(ApiKey.org_id == find_org(session, org_ref).id)
    if key_id is not None:
        query = query.where(ApiKey.key_id == key_id)
    return [
        KeyRow(
            key_id=key.key_id,
            org_id=key.org_id,
            org_name=org_name,
            user=subject,
            scopes=tuple(key.scopes),
            created_at=key.created_at,
            last_used_at=key.last_used_at,
            revoked_at=key.revoked_at,
        )
        for key, org_name, subject in session.execute(query).all()
    ]


def bootstrap_plan(url: str, org_name: str = "default") -> tuple[bool, bool]:
    """What `bootstrap` would do, changing nothing: (migrate the records, make the first
    organization). A database with no schema yet has no organization either."""
    migrate = db.pending(url)
    engine = db.make_engine(url)
    try:
        if not inspect(engine).has_table("organizations"):
            return migrate, True
        with db.session_factory(engine)() as session:
            return migrate, store.get_org_by_name(session, org_name) is None
    finally:
        engine.dispose()


def bootstrap(url: str, key_file: Path, *, org_name: str = "default", subject: str = "admin") -> str | None:
    """Migrate the records, then on the first run only make an organization, its first user
    and one API key, saved to `key_file` (0600). Returns that key, or None when the
    organization existed already (the key file is then left as it is)."""
    db.upgrade(url)
    engine = db.make_engine(url)
    try:
        with db.session_factory(engine).begin() as session:
            if store.get_org_by_name(session, org_name) is not None:
                return None
            create_org(session, org_name)
            issued = issue_key(session, org_name, subject)
            # Saved before the commit: a file whose record then rolled back is rewritten by
            # the next run, while a committed key that never reached the file would be lost.
            write_private(key_file, issued.token + "\n")
        return issued.token
    finally:
        engine.dispose()
