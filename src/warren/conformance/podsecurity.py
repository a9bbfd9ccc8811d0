"""Kubernetes' own Pod Security corpus: the baseline pass and fail pods that the Go module
k8s.io/pod-security-admission ships under test/testdata, for the cluster's version.

Nothing of it is copied into Warren: the suite reads the module at test time, from a
directory given with --pod-security-fixtures or from the Go module cache (`go mod
download` fills it; the pinned cluster build already has it there).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from warren.paths import cache_dir

MODULE = "k8s.io/pod-security-admission"

# Each Pod Security baseline check, by the name its fixtures carry, and the Warren rules
# (warren-sandbox-pods) that refuse what it refuses. A check this table lacks fails the
# corpus test: a new Kubernetes brought a check the policy does not know yet.
CHECK_RULES: dict[str, tuple[str, ...]] = {
    "apparmorprofile": ("apparmor",),
    "capabilities_baseline": ("capabilities",),
    "hostnamespaces": ("host-network", "host-pid", "host-ipc"),
    "hostpathvolumes": ("host-path",),
    "hostports": ("host-port",),
    "hostprobesandhostlifecycle": ("probe-host",),
    "privileged": ("privileged",),
    "procmount": ("proc-mount",),
    "seccompprofile_baseline": ("seccomp",),
    "selinuxoptions": ("selinux",),
    "sysctls": ("sysctls",),
    "windowshostprocess": ("windows-host-process",),
}


class CorpusUnavailableError(RuntimeError):
    """The corpus cannot be found; the message names what is missing."""


@dataclass(frozen=True)
class Fixture:
    name: str  # e.g. hostprobesandhostlifecycle0
    expect: str  # "pass" or "fail"
    pod: dict[str, Any]

    @property
    def check(self) -> str:
        return re.sub(r"\d+$", "", self.name)

    @property
    def adds_capabilities(self) -> bool:
        containers = self.pod["spec"].get("containers", []) + self.pod["spec"].get("initContainers", [])
        return any((c.get("securityContext") or {}).get("capabilities", {}).get("add") for c in containers)


def _version(server_git_version: str) -> tuple[int, int]:
    match = re.match(r"^v1\.(\d+)\.(\d+)", server_git_version)
    if not match:
        raise CorpusUnavailableError(f"cannot tell the Kubernetes version from {server_git_version!r}")
    return int(match.group(1)), int(match.group(2))


def module_version(server_git_version: str) -> str:
    """The staging module's version for a Kubernetes version: v1.34.4 -> v0.34.4."""
    minor, patch = _version(server_git_version)
    return f"v0.{minor}.{patch}"


def minor_version(server_git_version: str) -> int:
    return _version(server_git_version)[0]


def download(version: str) -> Path:
    """The module's testdata directory, from the Go module cache (downloading it if absent)."""
    go = shutil.which("go")
    if go is None:
        raise CorpusUnavailableError(
            f"the Pod Security corpus comes from the Go module {MODULE}@{version}: install Go, "
            "or pass --pod-security-fixtures with that module's test/testdata directory"
        )
    env = dict(os.environ)
    env.setdefault("GOMODCACHE", str(cache_dir() / "go" / "mod"))
    env["GOFLAGS"] = "-mod=mod"
    result = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{version}"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        check=False,
    )
    try:
        info = json.loads(result.stdout)
    except ValueError:
        info = {}
    if result.returncode != 0 or "Dir" not in info:
        detail = info.get("Error") or result.stderr.strip()[-300:]
        raise CorpusUnavailableError(f"go mod download {MODULE}@{version} failed: {detail}")
    return Path(info["Dir"]) / "test" / "testdata"


def level_dir(testdata: Path, minor: int, level: str = "baseline") -> Path:
    """The fixtures for the cluster's minor version, or the newest older one the module has."""
    root = testdata / level
    versions = sorted(
        (int(m.group(1)), d)
        for d in root.glob("v1.*")
        if (m := re.fullmatch(r"v1\.(\d+)", d.name)) and int(m.group(1)) <= minor
    )
    if not versions:
        raise CorpusUnavailableError(f"{root} has no fixtures for Kubernetes 1.{minor} or older")
    return versions[-1][1]


def load(directory: Path) -> list[Fixture]:
    fixtures = []
    for expect in ("pass", "fail"):
        for path in sorted((directory / expect).glob("*.yaml")):
            fixtures.append(Fixture(path.stem, expect, yaml.safe_load(path.read_text())))
    if not any(f.expect == "fail" for f in fixtures):
        raise CorpusUnavailableError(f"{directory} holds no failing fixtures")
    return fixtures


def floor_compliant(fixture: Fixture, name: str, runtime_class: str) -> dict[str, Any]:
    """The fixture's pod made to meet Warren's own rules (gVisor, no token, no privilege
    escalation), so that its Pod Security violation is the only reason to refuse it."""
    pod: dict[str, Any] = copy.deepcopy(fixture.pod)
    pod["metadata"]["name"] = name
    spec = pod["spec"]
    spec["runtimeClassName"] = runtime_class
    spec["automountServiceAccountToken"] = False
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        context = container.setdefault("securityContext", {})
        # The API refuses privileged together with allowPrivilegeEscalation: false.
        if not context.get("privileged"):
            context["allowPrivilegeEscalation"] = False
    return pod
