"""The generated stubs, with a clear error when they were not generated."""

from __future__ import annotations

try:
    from warren_blockd.csi._proto import (
        csi_pb2,
        csi_pb2_grpc,
        pluginregistration_pb2,
        pluginregistration_pb2_grpc,
    )
except ImportError as exc:  # git ignores them: a checkout has none until they are generated
    raise ImportError(
        "warren-blockd's CSI stubs are not generated: run tools/blockd-protos.sh with this "
        "environment's python (make packages/warren-blockd/.venv/.installed does)"
    ) from exc

__all__ = ["csi_pb2", "csi_pb2_grpc", "pluginregistration_pb2", "pluginregistration_pb2_grpc"]
