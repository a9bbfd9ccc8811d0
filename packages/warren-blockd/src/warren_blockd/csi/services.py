"""The gRPC services: CSI Identity and Node on the plugin's endpoint, and kubelet's plugin
registration on its own socket. Each call's failure is a status code with a message that
names the problem and the fix; an unexpected exception is INTERNAL and logged whole."""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import grpc
from google.protobuf import wrappers_pb2
from typing_extensions import override  # typing.override from Python 3.12 on

from warren_blockd import __version__
from warren_blockd.csi import DRIVER_NAME, attributes
from warren_blockd.csi.errors import CsiError, invalid
from warren_blockd.csi.proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from warren_blockd.csi.publisher import Publisher
from warren_blockd.csi.records import VOLUME_ID

log = logging.getLogger("warren_blockd.csi")
T = TypeVar("T")
Code = grpc.StatusCode
AccessMode = csi_pb2.VolumeCapability.AccessMode
# A workspace has one writer: the single-node modes. SINGLE_NODE_MULTI_WRITER is not
# advertised, so kubelet asks for SINGLE_NODE_WRITER (ReadWriteOnce).
WRITER_MODES = (AccessMode.SINGLE_NODE_WRITER, AccessMode.SINGLE_NODE_SINGLE_WRITER)
READER_MODES = (AccessMode.SINGLE_NODE_READER_ONLY,)


def answer(context: grpc.ServicerContext, method: str, call: Callable[[], T]) -> T:
    try:
        return call()
    except CsiError as exc:
        fields = {"method": method, "code": exc.code.name, "error": exc.message}
        log.warning("refused", extra={"fields": fields})
        context.abort(exc.code, exc.message)
    except Exception as exc:
        log.exception("failed", extra={"fields": {"method": method}})
        context.abort(Code.INTERNAL, f"{method}: {type(exc).__name__}: {exc}")


def unimplemented(context: grpc.ServicerContext, method: str) -> NoReturn:
    context.abort(Code.UNIMPLEMENTED, f"{DRIVER_NAME} does not implement {method}")


class IdentityService(csi_pb2_grpc.IdentityServicer):
    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher

    @override
    def GetPluginInfo(
        self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=__version__)

    @override
    def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        # Node service only: no controller (nothing to provision or attach), no topology.
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=[])

    @override
    def Probe(self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext) -> csi_pb2.ProbeResponse:
        # Ready only while the daemon answers and its FUSE mount is up: nothing can be
        # published without it.
        ready = answer(context, "Probe", self.publisher.healthy)
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=ready))


def _target(path: str) -> Path:
    if not path:
        raise invalid("target_path is missing")
    if not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/"):
        raise invalid(f"target_path {path!r} must be an absolute path without '.', '..' or '//'")
    return Path(path)


def _volume_id(volume_id: str) -> str:
    if not VOLUME_ID.match(volume_id):
        raise invalid(f"volume_id {volume_id!r} is not valid: use 1-128 letters, digits, '.', '_' and '-'")
    return volume_id


def _readonly(request: csi_pb2.NodePublishVolumeRequest) -> bool:
    """Whether to bind read-only; refuses what a workspace cannot be."""
    if not request.HasField("volume_capability"):
        raise invalid("volume_capability is missing")
    capability = request.volume_capability
    if not capability.HasField("mount"):
        raise CsiError(
            Code.FAILED_PRECONDITION,
            f"{DRIVER_NAME} publishes filesystems, not raw block devices: use volumeMode Filesystem",
        )
    if capability.mount.fs_type not in ("", "ext4"):
        raise CsiError(
            Code.FAILED_PRECONDITION,
            f"a workspace is ext4, not {capability.mount.fs_type}: drop fsType from the volume",
        )
    if capability.mount.mount_flags:
        raise CsiError(
            Code.FAILED_PRECONDITION,
            f"mount flags {', '.join(capability.mount.mount_flags)} are not accepted: the plugin mounts "
            "nosuid,nodev itself; remove mountOptions",
        )
    mode = capability.access_mode.mode
    if mode not in WRITER_MODES + READER_MODES:
        raise CsiError(
            Code.FAILED_PRECONDITION,
            f"access mode {AccessMode.Mode.Name(mode)} is not supported: a workspace has one writer on "
            "one node (SINGLE_NODE_WRITER, or SINGLE_NODE_READER_ONLY)",
        )
    return request.readonly or mode in READER_MODES


class NodeService(csi_pb2_grpc.NodeServicer):
    def __init__(self, publisher: Publisher, node_id: str) -> None:
        self.publisher = publisher
        self.node_id = node_id

    @override
    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        def publish() -> csi_pb2.NodePublishVolumeResponse:
            volume_id = _volume_id(request.volume_id)
            target = _target(request.target_path)
            readonly = _readonly(request)
            wanted = attributes.parse(dict(request.volume_context))
            if isinstance(wanted, attributes.AwaitingClaim):
                how = self.publisher.publish_awaiting(volume_id, target, readonly, wanted)
                workspace = None
            else:
                how = self.publisher.publish(volume_id, target, readonly, wanted)
                workspace = wanted.workspace
            log.info(
                "published",
                extra={
                    "fields": {
                        "volume": volume_id,
                        "workspace": workspace,
                        "how": how,
                        "target": str(target),
                        "readonly": readonly,
                        "pod": f"{wanted.pod_namespace}/{wanted.pod_name}",
                        "pod_uid": wanted.pod_uid,
                    }
                },
            )
            return csi_pb2.NodePublishVolumeResponse()

        return answer(context, "NodePublishVolume", publish)

    @override
    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        def unpublish() -> csi_pb2.NodeUnpublishVolumeResponse:
            self.publisher.unpublish(_volume_id(request.volume_id), _target(request.target_path))
            return csi_pb2.NodeUnpublishVolumeResponse()

        return answer(context, "NodeUnpublishVolume", unpublish)

    @override
    def NodeGetInfo(
        self, request: csi_pb2.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(node_id=self.node_id)

    @override
    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        # No STAGE_UNSTAGE_VOLUME: an inline ephemeral volume is published straight away.
        return csi_pb2.NodeGetCapabilitiesResponse(capabilities=[])

    @override
    def NodeStageVolume(
        self, request: csi_pb2.NodeStageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeStageVolumeResponse:
        unimplemented(context, "NodeStageVolume")

    @override
    def NodeUnstageVolume(
        self, request: csi_pb2.NodeUnstageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnstageVolumeResponse:
        unimplemented(context, "NodeUnstageVolume")

    @override
    def NodeGetVolumeStats(
        self, request: csi_pb2.NodeGetVolumeStatsRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetVolumeStatsResponse:
        unimplemented(context, "NodeGetVolumeStats")

    @override
    def NodeExpandVolume(
        self, request: csi_pb2.NodeExpandVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeExpandVolumeResponse:
        unimplemented(context, "NodeExpandVolume")


class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    """What kubelet's plugin watcher asks on the registration socket: who we are and where
    the CSI endpoint is; then it reports whether registration worked."""

    SUPPORTED_VERSIONS = ("1.0.0",)  # CSI spec major version 1, as kubelet expects

    def __init__(self, endpoint: Path, on_result: Callable[[bool, str], None]) -> None:
        self.endpoint = endpoint
        self.on_result = on_result

    @override
    def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.PluginInfo:
        log.info("kubelet asked for plugin info", extra={"fields": {"endpoint": str(self.endpoint)}})
        return pluginregistration_pb2.PluginInfo(
            type="CSIPlugin",
            name=DRIVER_NAME,
            endpoint=str(self.endpoint),
            supported_versions=list(self.SUPPORTED_VERSIONS),
        )

    @override
    def NotifyRegistrationStatus(
        self, request: pluginregistration_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        self.on_result(request.plugin_registered, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()
