"""The /v1/secrets routes: an organization's credentials that only the egress gateway puts
into requests (vault.py, gateway.py). Write-only: no answer carries a value."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from warren_control import secret_records
from warren_control.api.errors import ApiError
from warren_control.api.params import Api, Who, stamped_identity
from warren_control.api.shapes import (
    CreateSecretRequest,
    SecretListOut,
    SecretOut,
    SecretUseListOut,
    UpdateSecretRequest,
    error_responses,
)
from warren_control.models import Secret
from warren_control.secret_records import Budget
from warren_control.vault import Injection, SecretError, placeholder

router = APIRouter(prefix="/v1", dependencies=[Depends(stamped_identity)], tags=["secrets"])


def public(secret: Secret) -> dict[str, Any]:
    budget = None
    if secret.budget_requests is not None or secret.budget_bytes is not None:
        budget = {
            "requests": secret.budget_requests,
            "bytes": secret.budget_bytes,
            "period_s": secret.budget_period_s,
        }
    return SecretOut(
        id=secret.id,
        name=secret.name,
        destinations=list(secret.destinations),
        header=secret.injection.get("header"),
        template=secret.injection.get("template"),
        query=secret.injection.get("query"),
        env=secret.env,
        placeholder=placeholder(secret.name),
        budget=budget,
        version=secret.version,
        created_at=secret.created_at,
        rotated_at=secret.rotated_at,
        revoked_at=secret.revoked_at,
    ).model_dump(mode="json")


def _found(session: Session, org: str, name: str) -> Secret:
    secret = secret_records.live(session, org, name)
    if secret is None:
        raise ApiError(404, "not_found", f"no secret {name[:64]!r}")
    return secret


def _injection(header: str | None, template: str | None, query: str | None) -> Injection:
    """How the value goes in; by default a bearer token in Authorization."""
    if header is None and query is None:
        return Injection.of("Authorization", template or "Bearer {secret}", None)
    return Injection.of(header, template, query)


def _budget(body: CreateSecretRequest | UpdateSecretRequest) -> Budget | None:
    if body.budget is None:
        return None
    return Budget(body.budget.requests, body.budget.bytes, body.budget.period_s)


@router.post(
    "/secrets",
    status_code=201,
    response_model=SecretOut,
    responses=error_responses(400, 401, 409),
    summary="Store a secret for the egress gateway to inject (its value is never returned)",
)
def create_secret(body: CreateSecretRequest, who: Who, api: Api) -> Response:
    box = api.need_secrets()
    try:
        injection = _injection(body.header, body.template, body.query)
        with api.sessions.begin() as session:
            secret = secret_records.create(
                session,
                box,
                who.org,
                name=body.name,
                value=body.value,
                destinations=body.destinations,
                injection=injection,
                env=body.env,
                budget=_budget(body),
            )
            answer = public(secret)
    except SecretError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from exc
    except secret_records.SecretExistsError as exc:
        raise ApiError(409, "conflict", str(exc)) from exc
    return JSONResponse(answer, status_code=201, headers={"Location": f"/v1/secrets/{body.name}"})


@router.get(
    "/secrets",
    response_model=SecretListOut,
    responses=error_responses(401),
    summary="The organization's live secrets",
)
def list_secrets(who: Who, api: Api) -> Response:
    with api.sessions.begin() as session:
        live = (
            select(Secret).where(Secret.org_id == who.org, Secret.revoked_at.is_(None)).order_by(Secret.name)
        )
        items = [public(s) for s in session.scalars(live)]
    return JSONResponse({"items": items})


@router.get(
    "/secrets/{name}",
    response_model=SecretOut,
    responses=error_responses(401, 404),
    summary="One secret, without its value",
)
def get_secret(name: str, who: Who, api: Api) -> Response:
    with api.sessions.begin() as session:
        return JSONResponse(public(_found(session, who.org, name)))


@router.patch(
    "/secrets/{name}",
    response_model=SecretOut,
    responses=error_responses(400, 401, 404),
    summary="Rotate a secret's value, or change where and how it goes (from the next request on)",
)
def update_secret(name: str, body: UpdateSecretRequest, who: Who, api: Api) -> Response:
    box = api.need_secrets()
    try:
        with api.sessions.begin() as session:
            secret = _found(session, who.org, name)
            injection = None
            if body.header is not None or body.query is not None or body.template is not None:
                # Only a template: the header it had keeps it.
                header = body.header if body.header or body.query else secret.injection.get("header")
                injection = Injection.of(header, body.template, body.query)
            secret = secret_records.update(
                session,
                box,
                secret,
                value=body.value,
                destinations=body.destinations,
                injection=injection,
                budget=_budget(body),
            )
            return JSONResponse(public(secret))
    except SecretError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from exc


@router.delete(
    "/secrets/{name}",
    response_model=SecretOut,
    responses=error_responses(401, 404),
    summary="Revoke a secret: the next request that would carry it is refused",
)
def revoke_secret(name: str, who: Who, api: Api) -> Response:
    with api.sessions.begin() as session:
        return JSONResponse(public(secret_records.revoke(session, _found(session, who.org, name))))


@router.get(
    "/secrets/{name}/uses",
    response_model=SecretUseListOut,
    responses=error_responses(401, 404),
    summary="The audit of a secret (a revoked one's too): every request a sandbox sent with it, or tried to",
)
def secret_uses(name: str, who: Who, api: Api, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
    with api.sessions.begin() as session:
        secret = secret_records.named(session, who.org, name)  # a revoked one's audit stays readable
        if secret is None:
            raise ApiError(404, "not_found", f"no secret {name[:64]!r}")
        items = [
            {
                "secret_id": u.secret_id,
                "sandbox_id": u.sandbox_id,
                "destination": u.destination,
                "status": u.status,
                "outcome": u.outcome,
                "bytes_sent": u.bytes_sent,
                "bytes_received": u.bytes_received,
                "at": u.at.isoformat(),
                "duration_ms": u.duration_ms,
            }
            for u in secret_records.uses(session, who.org, secret.id, limit)
        ]
    return JSONResponse({"items": items})
