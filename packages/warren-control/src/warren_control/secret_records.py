"""Secrets and their uses in the product records (models.Secret, models.SecretUse): made,
rotated and revoked through the API, read and audited by the egress gateway. A value goes
in sealed (vault.SecretBox) and comes out only through `open_value`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from warren_control import ids
from warren_control.models import Secret, SecretUse, utcnow
from warren_control.store import lock_org
from warren_control.vault import Destination, Injection, SecretBox, SecretError, check_name, check_value

MAX_DESTINATIONS = 16


class SecretExistsError(ValueError):
    pass


@dataclass(frozen=True)
class Budget:
    requests: int | None = None
    bytes: int | None = None
    period_s: int = 3600


def destinations_of(urls: Sequence[str]) -> list[Destination]:
    if not urls:
        raise SecretError("a secret needs at least one destination (https://HOST[:PORT][/PREFIX])")
    if len(urls) > MAX_DESTINATIONS:
        raise SecretError(f"at most {MAX_DESTINATIONS} destinations")
    return [Destination.parse(url) for url in urls]


def live(session: Session, org_id: str, name: str) -> Secret | None:
    """The organization's secret of that name that is not revoked."""
    return session.scalars(
        select(Secret).where(Secret.org_id == org_id, Secret.name == name, Secret.revoked_at.is_(None))
    ).one_or_none()


def named(session: Session, org_id: str, name: str) -> Secret | None:
    """The organization's secret of that name: the live one, else the newest revoked one."""
    return session.scalars(
        select(Secret)
        .where(Secret.org_id == org_id, Secret.name == name)
        .order_by(Secret.revoked_at.is_not(None), Secret.created_at.desc())
        .limit(1)
    ).one_or_none()


def create(
    session: Session,
    box: SecretBox,
    org_id: str,
    *,
    name: str,
    value: str,
    destinations: Sequence[str],
    injection: Injection,
    env: str | None = None,
    budget: Budget | None = None,
) -> Secret:
    check_name(name)
    parsed = destinations_of(destinations)
    encoded = check_value(value)
    lock_org(session, org_id)  # one live secret per name: creates in an organization take turns
    if live(session, org_id, name) is not None:
        raise SecretExistsError(f"a secret named {name!r} exists; rotate it (PATCH) or revoke it first")
    budget = budget or Budget()
    secret = Secret(
        id=ids.new_secret_id(),
        org_id=org_id,
        name=name,
        destinations=[d.url() for d in parsed],
        injection=injection.record(),
        env=env,
        version=1,
        budget_requests=budget.requests,
        budget_bytes=budget.bytes,
        budget_period_s=budget.period_s,
    )
    secret.sealed = box.seal(org_id, secret.id, 1, encoded)
    session.add(secret)
    session.flush()
    return secret


def update(
    session: Session,
    box: SecretBox,
    secret: Secret,
    *,
    value: str | None = None,
    destinations: Sequence[str] | None = None,
    injection: Injection | None = None,
    budget: Budget | None = None,
) -> Secret:
    """Rotate the value (a new version: what was sealed before no longer opens) and change
    where and how it goes; the next request through the gateway sees it."""
    if destinations is not None:
        secret.destinations = [d.url() for d in destinations_of(destinations)]
    if injection is not None:
        secret.injection = injection.record()
    if budget is not None:
        secret.budget_requests, secret.budget_bytes = budget.requests, budget.bytes
        secret.budget_period_s = budget.period_s
    if value is not None:
        encoded = check_value(value)
        secret.version += 1
        secret.sealed = box.seal(secret.org_id, secret.id, secret.version, encoded)
        secret.rotated_at = utcnow()
    session.flush()
    return secret


def revoke(session: Session, secret: Secret) -> Secret:
    """No request carries it from now on; the sealed value is dropped, the row stays for
    the uses that name it."""
    secret.revoked_at = utcnow()
    secret.sealed = None
    session.flush()
    return secret


def open_value(box: SecretBox, secret: Secret) -> str:
    if secret.sealed is None:
        raise ValueError(f"secret {secret.id} is revoked")
    return box.open(secret.org_id, secret.id, secret.version, secret.sealed).decode("utf-8")


def over_budget(session: Session, secret: Secret, now: datetime | None = None) -> str | None:
    """Why another request would pass the secret's budget, or None."""
    if secret.budget_requests is None and secret.budget_bytes is None:
        return None
    since = (now or utcnow()) - timedelta(seconds=secret.budget_period_s)
    count, moved = session.execute(
        select(
            func.count(), func.coalesce(func.sum(SecretUse.bytes_sent + SecretUse.bytes_received), 0)
        ).where(SecretUse.secret_id == secret.id, SecretUse.at >= since, SecretUse.outcome == "sent")
    ).one()
    if secret.budget_requests is not None and count >= secret.budget_requests:
        return (
            f"{count} requests in the last {secret.budget_period_s} s, its budget is {secret.budget_requests}"
        )
    if secret.budget_bytes is not None and moved >= secret.budget_bytes:
        return f"{moved} bytes in the last {secret.budget_period_s} s, its budget is {secret.budget_bytes}"
    return None


def uses(session: Session, org_id: str, secret_id: str | None = None, limit: int = 100) -> list[SecretUse]:
    """The organization's newest uses, of one secret if named, newest first."""
    query = select(SecretUse).where(SecretUse.org_id == org_id)
    if secret_id is not None:
        query = query.where(SecretUse.secret_id == secret_id)
    return list(session.scalars(query.order_by(SecretUse.at.desc(), SecretUse.id.desc()).limit(limit)))
