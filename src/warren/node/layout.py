"""Where the node keeps its files (under the cluster state directory)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
CNI_STATE_DIR = Path("/var/lib/cni/networks")  # host-local IPAM's allocations
NETWORK_NAME = "warren"
FLOOR_TABLE = "warren_floor"  # the egress floor's nftables table (family inet)


@dataclass(frozen=True)
class NodeLayout:
    root: Path  # <state>/node

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def bin_dir(self) -> Path:
        """runsc and its shim, installed here by the gvisor role (on containerd's PATH)."""
        return self.root / "bin"

    @property
    def gvisor_config_dir(self) -> Path:
        return self.root / "gvisor"

    @property
    def cni_bin_dir(self) -> Path:
        """Links to the host's CNI plugins plus the egress floor's own plugin."""
        return self.root / "cni" / "bin"

    @property
    def floor_dir(self) -> Path:
        return self.root / "egress-floor"

    @property
    def runsc_logs(self) -> Path:
        return self.root / "logs" / "runsc"

    @property
    def runsc_root(self) -> Path:
        return self.root / "runsc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy-config.yaml"

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.containerd_socket}"
