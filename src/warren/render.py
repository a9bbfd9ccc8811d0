"""Render every Kubernetes object of the platform from the one typed configuration.

Templates live in manifests/ (shipped inside the wheel as warren/manifests). Ansible and
Pulumi apply what this module renders, so both install paths produce the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from warren.config import WarrenConfig
from warren.images.services import POSTGRES_GID, POSTGRES_UID

# Apply order: what others depend on first (namespaces and the CRD before anything
# namespaced or anything that names them; a policy before its binding).
# The workspace layer's CSI driver (warren-blockd's node plugin registers this name).
WORKSPACE_DRIVER = "blockd.warren.dev"
TEMPLATES = (
    "namespaces.yaml.j2",
    "warren.dev_sandboxes.yaml",
    "warren.dev_sandboxpools.yaml",
    "rbac.yaml.j2",
    "runtimeclass.yaml.j2",
    "csidriver-blockd.yaml.j2",
    "admission-sandbox-pods.yaml.j2",
    "admission-floor-guard.yaml.j2",
    "networkpolicy-egress-floor.yaml.j2",
    # Warren's own services last: their pods are admitted with the floor already in place.
    "warren-system.yaml.j2",
)

Manifest = dict[str, Any]


@dataclass(frozen=True)
class PodSecurityBaseline:
    """What the Pod Security baseline profile allows, as k8s.io/pod-security-admission
    defines it for the pinned Kubernetes (v1.34): the sandbox-pod policy enforces the same
    checks itself, so a sandbox namespace does not depend on its Pod Security labels."""

    safe_sysctls: tuple[str, ...] = (
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    )
    selinux_types: tuple[str, ...] = (
        "",
        "container_t",
        "container_init_t",
        "container_kvm_t",
        "container_engine_t",
    )
    seccomp_types: tuple[str, ...] = ("RuntimeDefault", "Localhost")
    apparmor_types: tuple[str, ...] = ("RuntimeDefault", "Localhost")


BASELINE = PodSecurityBaseline()


def templates_dir() -> Path:
    """The templates: inside an installed wheel, or manifests/ at the repository top."""
    packaged = Path(__file__).parent / "manifests"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "manifests"


def _cel_list(items: tuple[str, ...] | list[str]) -> str:
    """A CEL list literal of strings, safe inside a double-quoted YAML scalar."""
    for item in items:
        if "'" in item or '"' in item or "\\" in item:
            raise ValueError(f"{item!r} cannot appear in an admission expression (quotes)")
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,  # a typo in a template fails, it does not render ""
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701  # YAML, not HTML
    )
    env.filters["cel_list"] = _cel_list
    return env


def render_text(config: WarrenConfig) -> dict[str, str]:
    """Each template rendered to YAML text, keyed by its output file name."""
    env = _environment()
    context = {
        "cluster": config.cluster,
        "isolation": config.isolation,
        "egress": config.egress,
        "workspace_driver": WORKSPACE_DRIVER,
        "baseline": BASELINE,
        "services": config.services,
        # The embedded PostgreSQL image's postgres user (a unit test reads the image).
        "postgres_uid": POSTGRES_UID,
        "postgres_gid": POSTGRES_GID,
    }
    return {name.removesuffix(".j2"): env.get_template(name).render(**context) for name in TEMPLATES}


def render(config: WarrenConfig) -> list[Manifest]:
    """Every object, in apply order."""
    objects: list[Manifest] = []
    for name, text in render_text(config).items():
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc:
                raise ValueError(f"template {name} rendered a document that is not an object")
            objects.append(doc)
    return objects


def write(config: WarrenConfig, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_text(config).items():
        if not text.strip():  # a part the configuration leaves out (services.enabled: false)
            continue
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    return written
