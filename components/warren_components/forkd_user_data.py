"""User data that makes a KVM host (a Debian AMI) run warren-forkd, as the Ansible `forkd` role does.

The host installs from Warren's air-gapped bundle, already extracted at `bundle_dir` (baked
into the AMI, or put there by an earlier user-data part): QEMU and its tools from the bundle's
apt repository as the only source, warren-forkd from its hashed requirements file with no
index, the guest kernel unpacked from the bundle's copy of Debian's package. It writes the
same systemd unit the role's template renders (tests/pulumi holds the two together), starts
it and waits until the API answers on its socket.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

UNIT_PATH = "/etc/systemd/system/warren-forkd.service"
APT_LIST = "/etc/apt/warren-bundle.list"
PACKAGES = ("qemu-system-x86", "qemu-utils", "busybox-static", "e2fsprogs", "gcc", "python3-venv")
_PATH = re.compile(r"^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$")
# Opens /dev/kvm read-write, as QEMU must (the role's check).
_KVM_OPENS = "python3 -c \"import os; os.close(os.open('/dev/kvm', os.O_RDWR | os.O_CLOEXEC))\""


@dataclass(frozen=True)
class ForkdHost:
    """Where warren-forkd comes from on the pool's hosts and how it runs."""

    bundle_dir: str = "/opt/warren/bundle"
    # kvm fails the boot's script without a usable /dev/kvm (a metal pool should have one);
    # auto falls back to tcg (emulated, slow).
    accel: Literal["auto", "kvm", "tcg"] = "kvm"
    env: str = "/opt/warren/forkd"
    socket: str = "/run/warren/forkd/api.sock"
    state_dir: str = "/var/lib/warren/forkd"
    cache_dir: str = "/var/cache/warren/forkd"

    def __post_init__(self) -> None:
        if self.accel not in ("auto", "kvm", "tcg"):
            raise ValueError(f"accel {self.accel!r} is not auto, kvm or tcg")
        for name in ("bundle_dir", "env", "socket", "state_dir", "cache_dir"):
            value = getattr(self, name)
            if not _PATH.match(value) or "/../" in f"{value}/":
                raise ValueError(
                    f"{name} {value!r} is not an absolute path of letters, digits, '.', '_', '-'"
                )

    @property
    def kernel_debs_dir(self) -> str:
        return f"{self.bundle_dir}/debs"


def unit(host: ForkdHost, accel: str) -> str:
    """The role's templates/warren-forkd.service.j2, rendered with these values."""
    return "\n".join(
        [
            "# Written by KvmHostPool's user data (as the Ansible role forkd writes it).",
            "[Unit]",
            "Description=Warren microVM daemon (warren-forkd)",
            "After=network-online.target",
            "",
            "[Service]",
            f"ExecStart={host.env}/bin/warren-forkd serve"
            f" --socket {host.socket} --state-dir {host.state_dir}",
            f"Environment=WARREN_FORKD_ACCEL={accel}",
            f"Environment=WARREN_FORKD_CACHE={host.cache_dir}",
            f"Environment=WARREN_FORKD_KERNEL_DEBS={host.kernel_debs_dir}",
            "# On stop the daemon kills its guests (they are its children) before it exits.",
            "TimeoutStopSec=60",
            "KillMode=mixed",
            "Restart=on-failure",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def health_command(host: ForkdHost) -> str:
    """GET /healthz on the API socket; exits 0 on a 200 answer (the role's check)."""
    script = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1]); "
        's.sendall(b"GET /healthz HTTP/1.0\\r\\n\\r\\n"); sys.exit(b" 200 " not in s.recv(64))'
    )
    return f"{host.env}/bin/python -c {shlex.quote(script)} {host.socket}"


def install_script(host: ForkdHost) -> str:
    """A shell script for cloud-init: install from the bundle, write the unit, start, wait."""
    apt = f"apt-get -q -o Dir::Etc::SourceList={APT_LIST} -o Dir::Etc::SourceParts=/dev/null"
    if host.accel == "auto":
        choose = (
            f"if {_KVM_OPENS}; then accel=kvm; else accel=tcg; "
            'echo "warren-forkd: no usable /dev/kvm, guests run under TCG (emulated)" >&2; fi'
        )
    elif host.accel == "kvm":
        choose = (
            f"{_KVM_OPENS} || {{ echo 'warren-forkd: accel kvm but /dev/kvm does not open read-write: "
            "use a .metal instance type with the kvm module loaded' >&2; exit 1; }\naccel=kvm"
        )
    else:
        choose = "accel=tcg"
    socket_dir = host.socket.rsplit("/", 1)[0]
    return "\n".join(
        [
            "#!/bin/bash",
            "# warren-forkd from the extracted bundle (KvmHostPool; the Ansible forkd role's steps).",
            "set -euo pipefail",
            "command -v apt-get >/dev/null || { echo 'warren-forkd: this script needs a Debian 12 AMI "
            "(the release the bundle was built for); pass forkd=None for other images' >&2; exit 1; }",
            f"bundle={host.bundle_dir}",
            'test -f "$bundle/manifest.json" || '
            '{ echo "warren-forkd: no extracted bundle at $bundle" >&2; exit 1; }',
            "# QEMU and its tools, with the bundle's repository as apt's only source.",
            f'echo "deb [trusted=yes] file:$bundle/debs ./" > {APT_LIST}',
            f"{apt} update",
            f"DEBIAN_FRONTEND=noninteractive {apt} install -y --no-install-recommends {' '.join(PACKAGES)}",
            "# warren-forkd and every dependency, pinned and hashed, with no index.",
            f"python3 -m venv {host.env}",
            f'{host.env}/bin/pip install --quiet --no-index --find-links "$bundle/wheels" '
            '-r "$bundle/wheels/requirements-warren-forkd.txt"',
            f"install -d -m 0700 -o root -g root {host.state_dir} {host.cache_dir} {socket_dir}",
            choose,
            f"cat > {UNIT_PATH} <<UNIT",
            unit(host, "${accel}").rstrip("\n"),
            "UNIT",
            "systemctl daemon-reload",
            "systemctl enable --now warren-forkd.service",
            f"for _ in $(seq 60); do {health_command(host)} && exit 0; sleep 2; done",
            "echo 'warren-forkd: the API did not answer in 120 s (journalctl -u warren-forkd)' >&2",
            "exit 1",
            "",
        ]
    )


BOUNDARY = "==warren-kvm-host-user-data=="


def combine(*scripts: str) -> str:
    """Several shell scripts as one MIME multipart user data (cloud-init runs each, in order)."""
    if len(scripts) == 1:
        return scripts[0]
    lines = ["MIME-Version: 1.0", f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"', ""]
    for script in scripts:
        lines += [
            f"--{BOUNDARY}",
            'Content-Type: text/x-shellscript; charset="utf-8"',
            "",
            script.rstrip("\n"),
        ]
    lines += [f"--{BOUNDARY}--", ""]
    return "\n".join(lines)
