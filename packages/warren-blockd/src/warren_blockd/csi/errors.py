"""Errors the plugin answers with: a gRPC status code and a message that names the problem
and the fix (kubelet shows it in the pod's events)."""

from __future__ import annotations

import grpc

from warren_blockd.client import ApiError

# The daemon's error codes (docs/workspace-layer.md) as CSI status codes.
API_STATUS = {
    "invalid_id": grpc.StatusCode.INVALID_ARGUMENT,
    "invalid_size": grpc.StatusCode.INVALID_ARGUMENT,
    "bad_request": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "not_attached": grpc.StatusCode.NOT_FOUND,
    "exists": grpc.StatusCode.ALREADY_EXISTS,
    "busy": grpc.StatusCode.UNAVAILABLE,  # still replicating earlier writes: kubelet retries
    "split_brain": grpc.StatusCode.FAILED_PRECONDITION,
    "held": grpc.StatusCode.UNAVAILABLE,  # another node's hold lapses once it is gone: kubelet retries
    "not_replicated": grpc.StatusCode.UNAVAILABLE,
    "storage": grpc.StatusCode.UNAVAILABLE,
}


class CsiError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.INVALID_ARGUMENT, message)


def from_api(exc: ApiError, doing: str) -> CsiError:
    """A daemon refusal, as the status kubelet should act on; the daemon's error names the fix."""
    return CsiError(API_STATUS.get(exc.code, grpc.StatusCode.INTERNAL), f"{doing}: {exc}")


def unreachable(socket_path: str, exc: OSError, doing: str) -> CsiError:
    return CsiError(
        grpc.StatusCode.UNAVAILABLE,
        f"{doing}: cannot reach warren-blockd at {socket_path} ({exc}); "
        "is `warren-blockd serve` running on this node with that --socket?",
    )
