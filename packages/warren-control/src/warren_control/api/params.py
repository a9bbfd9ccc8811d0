"""What a route takes besides its body: the stamped identity, an idempotency key, a file path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request

from warren_control.identity import Identity


async def stamped_identity(request: Request) -> Identity:
    """The verified identity of the request: the stamp, checked with this app's key."""
    verify: Callable[[Request], Any] = request.app.state.identity
    who: Identity = await verify(request)
    return who


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
