"""The API as an ASGI app: error handlers, the routers, the OpenAPI document."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from warren_control.api import e2b, sandbox_io, sandboxes, secrets
from warren_control.api.errors import ApiError, ClusterError
from warren_control.api.params import Api, Who
from warren_control.api.service import ApiService, ApiSettings
from warren_control.api.shapes import ExecEventOut, error_content
from warren_control.identity import EDGE, add_identity_error_handler, require_identity

log = logging.getLogger(__name__)


API_VERSION = "0.1.0"
DESCRIPTION = """Sandboxes on Warren: gVisor pods with a workspace, behind one authenticating edge.

Send `Authorization: Bearer <API key or OIDC token>` to the edge. Sandbox ids are opaque and
organization-scoped: another organization's id is not found. Errors are
`{"error": code, "message": text}`; a request this deployment cannot carry out exactly is
refused with `unsupported_capability` naming the capability."""


def make_api(settings: ApiSettings) -> FastAPI:
    """The API as an ASGI app. The database must be migrated already (db.upgrade)."""
    app = FastAPI(
        title="Warren API",
        version=API_VERSION,
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
    )
    add_identity_error_handler(app)
    # The routes find the service here (params.Api), and the stamp's check (params.Who).
    app.state.api = ApiService(settings)
    app.state.identity = require_identity(settings.stamp_key)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(ClusterError, cluster_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)

    app.include_router(sandboxes.router)
    app.include_router(sandbox_io.router)
    app.include_router(secrets.router)
    app.include_router(internal)
    # The E2B SDK's routes, at the root where it looks for them (E2B_API_URL is the edge).
    app.include_router(e2b.router)
    app.add_api_route("/healthz", healthz, methods=["GET"], include_in_schema=False)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


async def api_error(request: Request, exc: Exception) -> Response:
    return exc.response() if isinstance(exc, ApiError) else _internal()


async def cluster_error(request: Request, exc: Exception) -> Response:
    log.warning("cluster call failed: %s", exc)
    return ApiError(503, "unavailable", "the cluster is unavailable; retry later").response()


async def invalid(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, RequestValidationError):
        return _internal()
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        parts.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg")))
    return ApiError(400, "invalid_request", "; ".join(parts) or "invalid request").response()


async def http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, StarletteHTTPException):
        return _internal()
    codes = {404: "not_found", 405: "method_not_allowed"}
    return ApiError(exc.status_code, codes.get(exc.status_code, "error"), str(exc.detail)).response()


# What only the edge asks, kept out of the document.
internal = APIRouter(include_in_schema=False)


@internal.get("/internal/agents/{sandbox_id}")
def agent_address(
    sandbox_id: str, who: Who, api: Api, org: Annotated[str | None, Query(max_length=64)] = None
) -> Response:
    if who != EDGE:
        raise ApiError(403, "forbidden", "only the edge asks where a sandbox's agent is")
    address, owner = api.agent_address(sandbox_id, org)
    return JSONResponse({"address": address, "org": owner})


def healthz() -> dict[str, bool]:
    return {"ok": True}


def _internal() -> Response:
    return ApiError(500, "internal", "internal error").response()


def _document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, told the truth: malformed requests are 400 {error, message} (not
    FastAPI's 422 shape) and every /v1 operation needs a bearer credential at the edge."""
    document = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    for item in document.get("paths", {}).values():
        for operation in item.values():
            responses = operation.get("responses", {})
            auto = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if auto.get("$ref", "").endswith("/HTTPValidationError"):
                del responses["422"]
            responses.setdefault("400", {"description": "Invalid request", **error_content()})
            operation["security"] = [{"bearer": []}]
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["ExecEventOut"] = ExecEventOut.model_json_schema(ref_template="#/components/schemas/{model}")
    document["components"]["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key (wk_...) or an OIDC token, checked by the edge.",
        }
    }
    return document


def document(settings: ApiSettings | None = None) -> dict[str, Any]:
    """The OpenAPI document (it does not depend on the settings)."""
    app = make_api(settings or ApiSettings(database_url="sqlite://", stamp_key=b"\0" * 32, engine_options={}))
    return app.openapi()
