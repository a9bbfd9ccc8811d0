"""The service units the roles write, rendered as Ansible renders templates (Jinja with
trim_blocks) from each role's defaults plus the local inventory's kind of values, then read
by the same parser `warren service up` uses: valid units, and the command lines the
platform needs (every SeaweedFS port set, loopback, the kubelet's plugin paths, secrets
only through environment files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from warren.services.unit import Unit, parse

ROLES = Path(__file__).resolve().parents[2] / "roles"


def defaults(role: str) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
    role_vars = ROLES / role / "vars" / "main.yml"
    if role_vars.is_file():
        found.update(yaml.safe_load(role_vars.read_text()))
    return found


def render(role: str, template: str, **values: Any) -> Unit:
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, autoescape=False)  # noqa: S701  # unit files, not HTML
    context = {**defaults(role), **values}
    # Role variables that name other variables (blockd_plugin_dir) are templates themselves.
    for key, value in list(context.items()):
        if isinstance(value, str) and "{{" in value:
            context[key] = env.from_string(value).render(**context)
    text = env.from_string((ROLES / role / "templates" / template).read_text()).render(**context)
    return parse(text, template.removesuffix(".service.j2"))


def test_the_object_store_sets_every_port_and_its_identities(tmp_path: Path) -> None:
    unit = render("object_store", "warren-objects.service.j2", object_store_base_port=20000)
    argv = set(unit.argv)
    assert unit.argv[:2] == ("/opt/warren/object-store/bin/weed", "mini")
    # Every port is set: SeaweedFS's defaults (8080 among them) would meet the edge's.
    assert {
        f"-{n}.port={20000 + i}" for i, n in enumerate(defaults("object_store")["object_store_port_names"])
    } <= argv
    assert {"-ip=127.0.0.1", "-master.telemetry=false", "-s3.config=/etc/warren/object-store/s3.json"} <= argv


def test_blockd_and_its_plugin_find_the_store_and_the_kubelet() -> None:
    daemon = render(
        "blockd",
        "warren-blockd.service.j2",
        blockd_s3_endpoint="http://127.0.0.1:19003",
        blockd_node_name="node-a",
    )
    assert "--store=s3://warren-workspaces" in daemon.argv
    assert "--s3-endpoint=http://127.0.0.1:19003" in daemon.argv
    assert daemon.env_files == (Path("/etc/warren/object-store/credentials.env"),)
    assert daemon.stop_timeout_s == 180  # time to flush before it is killed
    plugin = render("blockd", "warren-blockd-csi.service.j2", blockd_node_name="node-a")
    assert "--registration-dir=/var/lib/kubelet/plugins_registry" in plugin.argv
    assert "--endpoint=unix:///var/lib/kubelet/plugins/blockd.warren.dev/csi.sock" in plugin.argv
    assert "--node-id=node-a" in plugin.argv


@pytest.mark.parametrize("workspaces", [True, False])
def test_the_control_plane_reads_secrets_from_files_only(workspaces: bool) -> None:
    unit = render("control_plane", "warren-control.service.j2", control_plane_workspaces=workspaces)
    argv = unit.argv
    assert argv[:2] == ("/opt/warren/control/bin/warren-control", "serve")
    assert {"--role=all", "--host=127.0.0.1", "--port=8080", "--api-port=8081", "--migrate"} <= set(argv)
    assert "--stamp-key-file=/var/lib/warren/control-plane/stamp.key" in argv
    assert not any("database-url" in a or "postgresql" in a for a in argv)  # the URL holds a password
    assert Path("/var/lib/warren/control-plane/control.env") in unit.env_files
    assert ("--workspaces" in argv) is workspaces
    assert (Path("/etc/warren/object-store/credentials.env") in unit.env_files) is workspaces


@pytest.mark.parametrize("debs", ["", "/opt/warren/bundle/debs"])
def test_forkd_serves_its_socket_with_the_chosen_accelerator(debs: str) -> None:
    unit = render("forkd", "warren-forkd.service.j2", forkd_accel_resolved="kvm", forkd_kernel_debs_dir=debs)
    assert unit.argv == (
        "/opt/warren/forkd/bin/warren-forkd",
        "serve",
        "--socket",
        "/run/warren/forkd/api.sock",
        "--state-dir",
        "/var/lib/warren/forkd",
    )
    expected = {"WARREN_FORKD_ACCEL": "kvm", "WARREN_FORKD_CACHE": "/var/cache/warren/forkd"}
    if debs:
        expected["WARREN_FORKD_KERNEL_DEBS"] = debs
    assert unit.env == expected
    assert not unit.env_files
