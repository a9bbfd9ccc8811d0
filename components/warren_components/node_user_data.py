"""User data that makes an EKS node (Amazon Linux 2023) a gVisor node.

Two MIME parts, which EKS merges with its own when it launches a managed node group:
- a shell script, run by cloud-init before nodeadm starts containerd, that fetches runsc and
  containerd-shim-runsc-v1, refuses them unless their SHA-256 matches the pinned sums, installs
  them and writes the shim's options (the same files the Ansible `gvisor` role writes);
- a nodeadm NodeConfig whose containerd section adds the runtime entry for the RuntimeClass
  handler, the same entry the role appends to containerd's configuration.
The boundary is fixed so the same inputs always give the same bytes (no spurious diffs).
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass
from typing import Literal

import yaml

BOUNDARY = "==warren-node-user-data=="
INSTALL_DIR = "/usr/local/bin"
CONFIG_DIR = "/etc/warren/gvisor"
ROOT_DIR = "/run/warren/runsc"
LOG_DIR = "/var/log/warren/runsc"

# containerd's CRI plugin section by configuration version: 3 is containerd 2.x, 2 is 1.x.
CRI_PLUGIN = {3: 'plugins."io.containerd.cri.v1.runtime"', 2: 'plugins."io.containerd.grpc.v1.cri"'}

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Characters that need no quoting inside a URL we put in a shell script (and still quote).
_URL = re.compile(r"^https://[A-Za-z0-9._~:/%+-]+$")
_HANDLER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class GvisorBinaries:
    """Where nodes fetch gVisor from, and the sums they must match.

    base_url: an https:// directory holding `runsc` and `containerd-shim-runsc-v1` built for
        the nodes' architecture (x86_64): the project's own build (tools/gvisor, with its
        patches) published where nodes can reach it, or a gVisor release directory.
    runsc_sha256, shim_sha256: lowercase hex SHA-256 of each (SHA256SUMS beside the build).
    """

    base_url: str
    runsc_sha256: str
    shim_sha256: str

    def __post_init__(self) -> None:
        if not _URL.match(self.base_url):
            raise ValueError(
                f"gVisor base URL {self.base_url!r} must be an https:// URL (no spaces or quotes)"
            )
        for key, value in (("runsc_sha256", self.runsc_sha256), ("shim_sha256", self.shim_sha256)):
            if not _SHA256.match(value):
                raise ValueError(f"{key} {value!r} is not a SHA-256 in lowercase hex (64 characters)")


def containerd_runtime_toml(handler: str, config_version: Literal[2, 3]) -> str:
    """containerd's runtime entry for `handler`: version 3 is containerd 2.x, version 2 is 1.x."""
    if not _HANDLER.match(handler):
        raise ValueError(f"runtime handler {handler!r} is not a DNS label")
    cri = CRI_PLUGIN[config_version]
    return (
        f"[{cri}.containerd.runtimes.{handler}]\n"
        '  runtime_type = "io.containerd.runsc.v1"\n'
        '  pod_annotations = ["dev.gvisor.*"]\n'
        f"[{cri}.containerd.runtimes.{handler}.options]\n"
        '  TypeUrl = "io.containerd.runsc.v1.options"\n'
        f'  ConfigPath = "{CONFIG_DIR}/runsc.toml"\n'
    )


def runsc_toml(platform: str) -> str:
    """The shim's options; `systrap` because EC2 instances other than metal offer no KVM."""
    return (
        f'binary_name = "{INSTALL_DIR}/runsc"\n'
        f'root = "{ROOT_DIR}"\n'
        f'log_path = "{LOG_DIR}/%ID%/shim.log"\n'
        'log_level = "info"\n'
        "\n"
        "[runsc_config]\n"
        f'  platform = "{platform}"\n'
    )


def install_script(binaries: GvisorBinaries, platform: str) -> str:
    url = shlex.quote(binaries.base_url.rstrip("/"))
    return f"""#!/bin/bash
# Warren: install gVisor before nodeadm starts containerd. Any failure stops here, and the node
# never joins with a runtime it cannot run.
set -euo pipefail
base={url}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in runsc containerd-shim-runsc-v1; do
  curl --fail --silent --show-error --location --proto '=https' --tlsv1.2 --retry 5 \\
    --output "$work/$name" "$base/$name"
done
# Refuse anything but the pinned builds.
cat > "$work/SHA256SUMS" <<'SUMS'
{binaries.runsc_sha256}  runsc
{binaries.shim_sha256}  containerd-shim-runsc-v1
SUMS
(cd "$work" && sha256sum --check --strict SHA256SUMS)
install -o root -g root -m 0755 "$work/runsc" "$work/containerd-shim-runsc-v1" {INSTALL_DIR}/
install -d -o root -g root -m 0755 {CONFIG_DIR} {LOG_DIR}
cat > {CONFIG_DIR}/runsc.toml <<'TOML'
{runsc_toml(platform)}TOML
{INSTALL_DIR}/runsc --version
"""


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the TOML reads as TOML in the user data."""


def _block_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _block_str)


def node_config(handler: str, config_version: Literal[2, 3]) -> str:
    """A nodeadm NodeConfig carrying only the containerd runtime entry; EKS adds the rest."""
    document = {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {"containerd": {"config": containerd_runtime_toml(handler, config_version)}},
    }
    return yaml.dump(document, Dumper=_BlockDumper, sort_keys=False)


def node_user_data(
    binaries: GvisorBinaries,
    handler: str = "runsc",
    containerd_config_version: Literal[2, 3] = 3,
    platform: Literal["systrap", "kvm", "ptrace"] = "systrap",
) -> str:
    """The MIME multipart user data, as text."""
    parts = [
        ('text/x-shellscript; charset="us-ascii"', install_script(binaries, platform)),
        ("application/node.eks.aws", node_config(handler, containerd_config_version)),
    ]
    lines = ["MIME-Version: 1.0", f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"', ""]
    for content_type, body in parts:
        lines += [f"--{BOUNDARY}", f"Content-Type: {content_type}", "", body.rstrip("\n")]
    lines += [f"--{BOUNDARY}--", ""]
    return "\n".join(lines)


def encode(user_data: str) -> str:
    """Launch templates take user data base64-encoded."""
    return base64.b64encode(user_data.encode()).decode()
