"""Hosts for multi-host install tests, made of namespaces on this machine.

Each host is a network namespace with one address on a private LAN and a mount namespace
whose Warren paths (/etc/warren, /opt/warren, /var/lib/warren, ...) are empty tmpfs of its
own, running a real sshd. Ansible reaches the hosts over SSH like any other. The LAN is a
bridge in a namespace of its own, where the controller (ansible-playbook) runs: no namespace
has a route to anything but the LAN, so a download attempt anywhere fails.

What the hosts share with this machine: the rest of the filesystem (/usr, /etc/passwd, the
dpkg database). Packages already installed here are therefore installed on every host; the
roles' apt tasks still run, against the bundle's repository as the hosts' only source.

Every process a host started (sshd, and whatever the roles started through it) is killed by
network namespace when the lab closes.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SUBNET = "10.77.0"
# The paths the roles write on a host, each a private tmpfs there. Those that do not exist on
# this machine are made empty first (a mount point must exist).
PRIVATE_DIRS = (
    "/etc/warren",
    "/etc/kubernetes",
    "/etc/containerd",
    "/var/lib/containerd",  # a node's own containerd (the lab starts one on the node host)
    "/run/containerd",
    "/etc/systemd/system",
    "/etc/apt/sources.list.d",  # no apt source but the one the roles add: the bundle's
    "/etc/apt/apt.conf.d",
    "/opt/warren",
    "/var/lib/warren",
    "/var/lib/kubelet",
    "/var/lib/apt/lists",
    "/var/cache/warren",
    "/var/log/warren",
    "/run/warren",
    "/usr/local/bin",
    "/usr/lib/cni",
)
# Debian's default PATH in an SSH session; ansible-playbook on the controller gets it too.
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _run(*argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=check, timeout=120)


@dataclass
class Host:
    name: str
    address: str
    namespace: str
    root: Path  # its sshd's files, on the shared filesystem
    sshd: subprocess.Popen[bytes] | None = None

    def run(
        self, argv: Sequence[str | Path], check: bool = False, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside this host's namespaces (network, mount, hostname)."""
        assert self.sshd is not None
        return subprocess.run(
            ["nsenter", "-t", str(self.sshd.pid), "-n", "-m", "-u", "--", *map(str, argv)],
            env={"PATH": HOST_PATH, "LANG": "C.UTF-8", "HOME": "/root"},
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def shell(self, script: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.run(["sh", "-c", script], check=check)


@dataclass
class Lab:
    """`with Lab(root, ["store", "control", "node"], bind={...}) as lab:`"""

    root: Path
    names: Sequence[str]
    # path on this machine -> where every host sees it (read-only), e.g. the extracted bundle
    bind: dict[Path, str] = field(default_factory=dict)
    hosts: dict[str, Host] = field(default_factory=dict)
    lan: str = ""
    key: Path = field(init=False)

    def __post_init__(self) -> None:
        self.key = self.root / "id_ed25519"
        self.lan = f"wlab{os.getpid()}-lan"

    def __enter__(self) -> Lab:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- setup ---------------------------------------------------------------------------
    def start(self) -> None:
        if not Path(SSHD).exists():
            raise RuntimeError(f"{SSHD} is missing: install openssh-server (tools/check-host.sh does)")
        self.root.mkdir(parents=True, exist_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        for path in PRIVATE_DIRS:
            Path(path).mkdir(parents=True, exist_ok=True)
        _run("ip", "netns", "add", self.lan)
        _run("ip", "-n", self.lan, "link", "set", "lo", "up")
        _run("ip", "-n", self.lan, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.lan, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
        _run("ip", "-n", self.lan, "link", "set", "br0", "up")
        for index, name in enumerate(self.names, start=2):
            host = Host(name, f"{SUBNET}.{index}", f"wlab{os.getpid()}-{name}", self.root / name)
            self.hosts[name] = host
            self._network(host, index)
            self._start_sshd(host)
        for host in self.hosts.values():
            self._wait_for_ssh(host)

    def _network(self, host: Host, index: int) -> None:
        outside, inside = f"wl{os.getpid() % 100000}v{index}", "eth0"
        _run("ip", "netns", "add", host.namespace)
        _run("ip", "-n", host.namespace, "link", "set", "lo", "up")
        _run(
            "ip",
            "-n",
            self.lan,
            "link",
            "add",
            outside,
            "type",
            "veth",
            "peer",
            inside,
            "netns",
            host.namespace,
        )
        _run("ip", "-n", self.lan, "link", "set", outside, "master", "br0", "up")
        _run("ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inside)
        _run("ip", "-n", host.namespace, "link", "set", inside, "up")

    def _start_sshd(self, host: Host) -> None:
        host.root.mkdir()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host.root / "host_key")
        (host.root / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        (host.root / "sshd_config").write_text(
            "\n".join(
                [
                    f"ListenAddress {host.address}",
                    f"HostKey {host.root / 'host_key'}",
                    f"AuthorizedKeysFile {host.root / 'authorized_keys'}",
                    "PidFile none",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",  # the key files live in the test's temporary directory
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        mounts = [f"mount -t tmpfs -o mode=0755 warren-lab {shlex.quote(p)}" for p in PRIVATE_DIRS]
        for source, target in self.bind.items():
            mounts += [
                f"mkdir -p {shlex.quote(target)}",
                f"mount --bind -o ro {shlex.quote(str(source))} {shlex.quote(target)}",
            ]
        script = " && ".join(
            [*mounts, f"hostname {host.name}", f"exec {SSHD} -D -e -f {host.root / 'sshd_config'}"]
        )
        log = (host.root / "sshd.log").open("wb")
        host.sshd = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                host.namespace,
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _wait_for_ssh(self, host: Host) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert host.sshd is not None
            if host.sshd.poll() is not None:
                raise RuntimeError(f"sshd of {host.name} exited: {(host.root / 'sshd.log').read_text()}")
            if self.ssh(host, ["true"]).returncode == 0:
                return
            time.sleep(0.3)
        raise RuntimeError(f"sshd of {host.name} does not answer: {(host.root / 'sshd.log').read_text()}")

    # -- use -----------------------------------------------------------------------------
    def ssh_args(self) -> list[str]:
        return [
            "-i",
            str(self.key),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
        ]

    def ssh(self, host: Host, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """An SSH command from the controller's namespace, as Ansible makes them."""
        return self.controller(
            ["ssh", *self.ssh_args(), f"root@{host.address}", shlex.join(argv)], timeout=30
        )

    def controller(
        self,
        argv: Sequence[str | Path],
        env: dict[str, str] | None = None,
        timeout: float = 1800,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run on the controller: the LAN's namespace, which has no route but to the hosts."""
        return subprocess.run(
            ["ip", "netns", "exec", self.lan, *map(str, argv)],
            env={"PATH": HOST_PATH, "LANG": "C.UTF-8", "HOME": str(self.root), **(env or {})},
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            cwd=cwd,
        )

    # -- teardown ------------------------------------------------------------------------
    def close(self) -> None:
        for host in self.hosts.values():
            _kill_namespace(host.namespace)
            if host.sshd is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.sshd.wait(timeout=10)
            _run("ip", "netns", "del", host.namespace, check=False)
        if self.lan:
            _kill_namespace(self.lan)
            _run("ip", "netns", "del", self.lan, check=False)


def _kill_namespace(namespace: str) -> None:
    """SIGKILL every process in a network namespace, until none is left."""
    for _ in range(50):
        pids = [int(p) for p in _run("ip", "netns", "pids", namespace, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
