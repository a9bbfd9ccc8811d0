"""What the API refuses with: `ApiError` (status, code, message) and the cluster's failures."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": self.error, "message": self.message}, status_code=self.status, headers=self.headers
        )


def not_found(sandbox_id: str) -> ApiError:
    # The same answer for an id that never existed and for another organization's.
    return ApiError(404, "not_found", f"no sandbox {sandbox_id[:64]!r}")


def unsupported(capability: str, why: str) -> ApiError:
    return ApiError(400, "unsupported_capability", f"{capability}: {why}")


class ClusterError(Exception):
    """The cluster refused or could not be reached; `status` is the API server's, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
