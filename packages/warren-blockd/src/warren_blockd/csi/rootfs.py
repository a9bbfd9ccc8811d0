"""Where a workspace goes when a bind names a running container: `/workspace` of that
container's root file system, as containerd keeps it for the runtime's shim.

Under gVisor a container's volumes are fixed when it starts, but its root file system is
served by its gofer as the host has it: a mount made beneath it later (the root file system
`rslave`, which containerd sets when a volume of the container is HostToContainer, and the
runtime's state directory a shared mount) shows inside the running container. So a pool
pod whose sandbox started long ago can still take a forked workspace at its claim, with no
container started for it.

The container is checked against the pod the bind names (the runtime's annotations in its
bundle), and the mount point must be a directory of that root file system, never a symlink
the image could point out of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from pathlib import Path

import grpc

from warren_blockd.csi import mounts
from warren_blockd.csi.errors import CsiError, invalid

CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")  # containerd's ids of Kubernetes' containers
NAMESPACE = "k8s.io"  # the containerd namespace Kubernetes' containers live in
TASKS = "io.containerd.runtime.v2.task"
MOUNT_POINT = "workspace"
Code = grpc.StatusCode


def target(runtime_state: Path | None, container_id: str, pod_uid: str) -> Path:
    """`<rootfs>/workspace` of the running container `container_id` of pod `pod_uid`,
    made if the image has no /workspace."""
    if runtime_state is None:
        raise CsiError(
            Code.FAILED_PRECONDITION,
            "this plugin does not know the container runtime's state directory: start it with "
            "--runtime-state (containerd's state) to bind into a container",
        )
    if not CONTAINER_ID.match(container_id):
        raise invalid(
            f"container_id {container_id!r} is not a container's id: give the 64 hex digits after containerd://"
        )
    bundle = runtime_state / TASKS / NAMESPACE / container_id
    try:
        notes = json.loads((bundle / "config.json").read_text()).get("annotations") or {}
    except FileNotFoundError:
        raise CsiError(
            Code.NOT_FOUND,
            f"container {container_id} is not running on this node: bind once the pod's container runs",
        ) from None
    ours = notes.get("io.kubernetes.cri.sandbox-uid") == pod_uid
    if not ours or notes.get("io.kubernetes.cri.container-type") != "container":
        raise CsiError(
            Code.FAILED_PRECONDITION,
            f"container {container_id} is not a container of pod {pod_uid}: name one of its containers",
        )
    rootfs = bundle / "rootfs"
    if mounts.mount_at(rootfs) is None:
        raise CsiError(
            Code.NOT_FOUND,
            f"container {container_id} has no root file system mounted: bind while it runs",
        )
    point = rootfs / MOUNT_POINT
    with contextlib.suppress(FileExistsError):
        point.mkdir(mode=0o755)
    # lstat: the image's /workspace may be a symlink, which a mount would follow out of the
    # container's root file system.
    if not stat.S_ISDIR(os.lstat(point).st_mode):
        raise CsiError(
            Code.FAILED_PRECONDITION,
            f"/{MOUNT_POINT} in container {container_id}'s image is not a directory (a symlink or a "
            "file): the workspace needs an empty directory or nothing there",
        )
    return point
