"""Take the node down and leave the host as it was: no container, mount, network
namespace, bridge or nftables table of ours remains. What the node shares with its host's
network (bridge, CNI network, kube-proxy rules, the egress floor's table) is removed only
while this node holds the claim on it (claim.py): a node that never started, or was
refused, leaves another node's network and floor alone."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from warren.cluster.local import ClusterContext, mounts_under
from warren.node import claim
from warren.node.layout import CNI_STATE_DIR, FLOOR_TABLE, NETWORK_NAME, NodeLayout

SHIMS = ("containerd-shim-runc-v2", "containerd-shim-runsc-v1")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def run(
    ctx: ClusterContext, layout: NodeLayout, wanted: claim.Claim, progress: Callable[[str], None]
) -> list[str]:
    sup = ctx.supervisor
    stopped = []
    # Decided before anything stops: a node started before claims existed owns its network
    # if nobody else has claimed it.
    state = Path(wanted.state_dir)
    current = claim.holder()
    owner = claim.holds(state) or (
        current is None and any(sup.running(name) for name in ("containerd", "kubelet"))
    )
    # The kubelet first, so it does not start again what is being removed.
    for name in ("kubelet", "kube-proxy"):
        if sup.stop(name):
            stopped.append(name)
            progress(f"{name}: stopped")
    if sup.running("containerd") is not None:
        crictl = str(ctx.layout.bin_dir / "crictl")
        # Stopping and removing every pod sandbox runs CNI DEL: addresses and network
        # namespaces are released the way they were taken.
        result = _run(
            crictl, "--runtime-endpoint", layout.endpoint, "--timeout", "60s", "rmp", "--all", "--force"
        )
        if result.returncode == 0:
            progress("removed every pod from containerd")
        else:
            progress(f"crictl rmp failed ({result.stderr.strip()[:200]}); cleaning up by hand")
    if sup.stop("containerd"):
        stopped.append("containerd")
        progress("containerd: stopped")
    _kill_orphan_shims(layout)
    _unmount(layout.root)
    _detach_loops(layout.root)
    if owner:
        _remove_network(ctx, layout, progress)
        claim.release(state)
    elif current is not None:
        progress(f"left the host's network alone: the node of {current.state_dir} holds it")
    return stopped


def _kill_orphan_shims(layout: NodeLayout) -> None:
    """Shims (and the sandboxes under them) that outlived containerd: ours name our
    containerd socket on their command line and share our mount namespace."""
    marker = str(layout.containerd_socket).encode()
    # A joined node's socket has the same path in its own mount namespace: shims of another
    # mount namespace belong to another node.
    ours = Path("/proc/self/ns/mnt").readlink()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if (proc / "ns" / "mnt").readlink() != ours:
                continue
        except OSError:
            continue
        argv0 = Path(cmdline.split(b"\0", 1)[0].decode(errors="replace")).name
        if argv0 in SHIMS and marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(proc.name), signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def _unmount(root: Path) -> None:
    # A path can carry stacked mounts (a bind over itself, propagation copies): repeat
    # until nothing is left, deepest first each round.
    for _ in range(10):
        points = mounts_under(root)
        if not points:
            return
        for point in points:
            if _run("umount", point).returncode != 0:
                _run("umount", "-l", point)


def _detach_loops(root: Path) -> None:
    """Loop devices on files under the node's root (warren-blockd's workspaces, whose pod
    was killed with the node): unmounted above, they would otherwise hold the files."""
    listed = _run("losetup", "-l", "-n", "-O", "NAME,BACK-FILE").stdout
    prefix = str(root.resolve())
    for line in listed.splitlines():
        name, _, backing = line.strip().partition(" ")
        backing = backing.strip().removesuffix(" (deleted)")
        if backing == prefix or backing.startswith(prefix + "/"):
            _run("losetup", "-d", name)


def _remove_network(ctx: ClusterContext, layout: NodeLayout, progress: Callable[[str], None]) -> None:
    bridge = ctx.config.node.bridge
    if _run("ip", "link", "show", bridge).returncode == 0:
        _run("ip", "link", "delete", bridge)
        progress(f"removed bridge {bridge}")
    # Network namespaces the CNI made for our pods that nothing uses any more.
    for entry in json.loads(_run("ip", "-j", "netns", "list").stdout or "[]"):
        name = entry.get("name", "")
        if name.startswith("cni-") and not _run("ip", "netns", "pids", name).stdout.strip():
            _run("ip", "netns", "delete", name)
    proxy = ctx.layout.bin_dir / "kube-proxy"
    if proxy.exists():
        _run(str(proxy), "--cleanup", f"--config={layout.kube_proxy_config}")
    for family, table in (("ip", "kube-proxy"), ("ip6", "kube-proxy"), ("inet", FLOOR_TABLE)):
        if _run("nft", "list", "table", family, table).returncode == 0:
            _run("nft", "delete", "table", family, table)
            progress(f"removed nftables table {family} {table}")
    _remove_iptables_rules()
    ipam = CNI_STATE_DIR / NETWORK_NAME
    if ipam.is_dir():
        for lease in ipam.iterdir():
            lease.unlink()
        ipam.rmdir()


# Chains the kubelet creates in the iptables tables (kube-proxy cleans its own).
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")


def _remove_iptables_rules() -> None:
    """Rules the CNI bridge plugin left for our network (pods whose DEL never ran) and the
    kubelet's chains: found by our network's name in their comments and by chain name."""
    ours = f'name: \\"{NETWORK_NAME}\\"'
    for tool in ("iptables", "ip6tables"):
        for table in ("nat", "filter", "mangle"):
            listing = _run(tool, "-t", table, "-S")
            if listing.returncode != 0:
                continue
            lines = listing.stdout.splitlines()
            chains = {line.split()[1] for line in lines if line.startswith("-N ")}
            cni_chains = {line.split()[1] for line in lines if line.startswith("-A CNI-") and ours in line}
            doomed = cni_chains | (chains & set(KUBELET_CHAINS))
            for line in lines:
                if not line.startswith("-A "):
                    continue
                args = shlex.split(line)
                target = args[args.index("-j") + 1] if "-j" in args else ""
                if args[1] in doomed or target in doomed or ours in line:
                    _run(tool, "-t", table, "-D", *args[1:])
            for chain in doomed:
                _run(tool, "-t", table, "-X", chain)
