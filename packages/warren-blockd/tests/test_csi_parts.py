"""The CSI plugin's parts that need no daemon: volume attributes, the mount table, endpoints."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from warren_blockd.csi import attributes, mounts
from warren_blockd.csi.errors import CsiError
from warren_blockd.csi.server import endpoint_path

EPHEMERAL = {"csi.storage.k8s.io/ephemeral": "true"}


def test_attributes_of_the_control_planes_volumes_parse() -> None:
    request = attributes.parse(
        {
            **EPHEMERAL,
            "csi.storage.k8s.io/pod.name": "sb-1",
            "csi.storage.k8s.io/pod.namespace": "sandboxes",
            "workspace": "ws_abcdefghijklmnopqrstuvwxyz",
            "size": "10Gi",
            "forkOf": "ws_parent",
            "siblings": "8",
        }
    )
    assert isinstance(request, attributes.VolumeRequest)
    assert request.siblings == 8
    assert request.workspace == "ws_abcdefghijklmnopqrstuvwxyz"
    assert request.size_bytes == 10 << 30 and request.fork_of == "ws_parent" and request.template is None
    assert (request.pod_namespace, request.pod_name) == ("sandboxes", "sb-1")
    templated = attributes.parse({**EPHEMERAL, "workspace": "t", "template": "base"})
    assert isinstance(templated, attributes.VolumeRequest) and templated.source == "base"
    pooled = attributes.parse({**EPHEMERAL, "csi.storage.k8s.io/pod.uid": "u-1", "bindAtClaim": "true"})
    assert pooled == attributes.AwaitingClaim("", "", "u-1")


@pytest.mark.parametrize(
    ("size", "expected"),
    [("67108864", 64 << 20), ("16Mi", 16 << 20), ("10Gi", 10 << 30), ("1Ti", 1 << 40), ("65536Ki", 64 << 20)],
)
def test_sizes_are_bytes_or_binary_units(size: str, expected: int) -> None:
    assert attributes.parse_size(size) == expected


@pytest.mark.parametrize(
    ("context", "problem"),
    [
        ({"workspace": "w"}, "inline ephemeral volumes only"),
        ({**EPHEMERAL}, "workspace is missing"),
        ({**EPHEMERAL, "workspace": "-w"}, "is not a workspace id"),
        ({**EPHEMERAL, "workspace": "w/../x"}, "is not a workspace id"),
        ({**EPHEMERAL, "workspace": "w", "forkOf": "W"}, "forkOf='W' is not a workspace id"),
        ({**EPHEMERAL, "workspace": "w", "forkOf": "w"}, "cannot be made from itself"),
        ({**EPHEMERAL, "workspace": "w", "size": "10G"}, "binary units"),
        ({**EPHEMERAL, "workspace": "w", "size": "16777217"}, "multiple of 4096"),
        ({**EPHEMERAL, "workspace": "w", "size": "17Ti"}, "between 16Mi and 16Ti"),
        ({**EPHEMERAL, "workspace": "w", "Size": "1Gi", "x": "y"}, "unknown volume attribute(s) Size, x"),
        ({**EPHEMERAL, "workspace": "w", "forkOf": "v", "siblings": "0"}, "write 1 to 100"),
        ({**EPHEMERAL, "workspace": "w", "forkOf": "v", "siblings": "many"}, "siblings='many'"),
        ({**EPHEMERAL, "workspace": "w", "siblings": "2"}, "give forkOf too"),
        ({**EPHEMERAL, "bindAtClaim": "yes"}, 'write "true" or leave it out'),
        ({**EPHEMERAL, "bindAtClaim": "true", "workspace": "w"}, "so workspace cannot be given too"),
        ({**EPHEMERAL, "bindAtClaim": "true"}, "podInfoOnMount: true"),
    ],
)
def test_bad_attributes_are_invalid_argument_naming_the_problem(
    context: dict[str, str], problem: str
) -> None:
    with pytest.raises(CsiError) as refused:
        attributes.parse(context)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in refused.value.message


def test_mountinfo_is_parsed_with_optional_fields_and_escapes() -> None:
    text = (
        "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
        "40 36 7:3 / /var/lib/kubelet/pods/u/mount rw,nosuid,nodev shared:5 master:2 - ext4 /dev/loop3 rw\n"
    )
    first, second = mounts.parse(text)
    assert first.mount_point == "/mnt/with space" and first.root == "/mnt1" and first.fstype == "ext3"
    assert second.device == "7:3" and second.source == "/dev/loop3"
    assert {"nosuid", "nodev"} <= second.options and not second.readonly


def test_the_mount_on_top_is_found(tmp_path: Path) -> None:
    assert mounts.mount_at(Path("/")) is not None
    assert mounts.mount_at(tmp_path / "not-a-mount") is None


def test_endpoints_are_unix_sockets() -> None:
    assert endpoint_path("unix:///csi/csi.sock") == Path("/csi/csi.sock")
    assert endpoint_path("/csi/csi.sock") == Path("/csi/csi.sock")
    with pytest.raises(ValueError, match="not a unix socket"):
        endpoint_path("tcp://127.0.0.1:10000")
