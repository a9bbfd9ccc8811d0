"""What a route takes besides its body: the API's service, the stamped identity, an
idempotency key, a file path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request

from warren_control.api.service import ApiService
from warren_control.identity import Identity


async def service(request: Request) -> ApiService:
    """The API's service, which make_api keeps on the app (async: no worker thread for it)."""
    api: ApiService = request.app.state.api
    return api


async def stamped_identity(request: Request) -> Identity:
    """The verified identity of the request: the stamp, checked with this app's key."""
    verify: Callable[[Request], Any] = request.app.state.identity
    who: Identity = await verify(request)
    return who


Api = Annotated[ApiService, Depends(service)]
Who = Annotated[Identity, Depends(stamped_identity)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="Repeat a request safely: the same key and request get the first answer again.",
    ),
]
FilePath = Annotated[str, Query(min_length=1, max_length=4096, description="An absolute path.")]
