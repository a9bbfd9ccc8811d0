"""The node user data: gVisor installed against pinned sums, containerd told about the shim."""

from __future__ import annotations

import base64
import email
import email.policy
import tomllib
from typing import Any

import pytest
import yaml
from conftest import SHA_RUNSC, SHA_SHIM
from warren_components.node_user_data import GvisorBinaries, encode, node_user_data

BINARIES = GvisorBinaries("https://mirror.example/gvisor/x86_64", SHA_RUNSC, SHA_SHIM)


def parts(user_data: str) -> dict[str, str]:
    message = email.message_from_string(user_data, policy=email.policy.default)
    assert message.is_multipart()
    found: dict[str, str] = {}
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        assert isinstance(payload, bytes)
        found[part.get_content_type()] = payload.decode()
    return found


def containerd_config(user_data: str) -> str:
    node_config: dict[str, Any] = yaml.safe_load(parts(user_data)["application/node.eks.aws"])
    assert node_config["apiVersion"] == "node.eks.aws/v1alpha1"
    assert node_config["kind"] == "NodeConfig"
    return str(node_config["spec"]["containerd"]["config"])


def test_script_installs_both_binaries_only_if_their_sums_match() -> None:
    script = parts(node_user_data(BINARIES))["text/x-shellscript"]
    assert script.startswith("#!/bin/bash")
    assert "set -euo pipefail" in script
    assert f"{SHA_RUNSC}  runsc" in script
    assert f"{SHA_SHIM}  containerd-shim-runsc-v1" in script
    assert "sha256sum --check --strict" in script
    # The check comes before the install.
    assert script.index("sha256sum --check") < script.index("install -o root")
    assert "--proto '=https'" in script
    assert "base=https://mirror.example/gvisor/x86_64" in script
    assert 'platform = "systrap"' in script


def test_containerd_gets_the_runsc_runtime_for_the_handler_v3() -> None:
    toml = containerd_config(node_user_data(BINARIES, handler="runsc", containerd_config_version=3))
    runtime = tomllib.loads(toml)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"][
        "runsc"
    ]
    assert runtime["runtime_type"] == "io.containerd.runsc.v1"
    assert runtime["options"]["ConfigPath"] == "/etc/warren/gvisor/runsc.toml"


def test_shim_options_are_valid_toml() -> None:
    script = parts(node_user_data(BINARIES))["text/x-shellscript"]
    body = script.split("<<'TOML'\n", 1)[1].split("TOML\n", 1)[0]
    options = tomllib.loads(body)
    assert options["binary_name"] == "/usr/local/bin/runsc"
    assert options["runsc_config"]["platform"] == "systrap"


def test_containerd_1x_uses_the_old_plugin_path_and_another_handler() -> None:
    toml = containerd_config(node_user_data(BINARIES, handler="gvisor-kvm", containerd_config_version=2))
    runtimes = tomllib.loads(toml)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes["gvisor-kvm"]["runtime_type"] == "io.containerd.runsc.v1"


def test_same_inputs_same_bytes() -> None:
    assert node_user_data(BINARIES) == node_user_data(BINARIES)
    assert base64.b64decode(encode(node_user_data(BINARIES))).decode() == node_user_data(BINARIES)


@pytest.mark.parametrize(
    ("url", "runsc", "shim", "message"),
    [
        ("http://mirror.example/g", SHA_RUNSC, SHA_SHIM, "https"),
        ("https://mirror.example/g'; rm -rf /", SHA_RUNSC, SHA_SHIM, "https"),
        ("https://mirror.example/g", "abc", SHA_SHIM, "runsc_sha256"),
        ("https://mirror.example/g", SHA_RUNSC, SHA_SHIM.upper(), "shim_sha256"),
    ],
)
def test_bad_sources_are_refused(url: str, runsc: str, shim: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GvisorBinaries(url, runsc, shim)


def test_handler_must_be_a_dns_label() -> None:
    with pytest.raises(ValueError, match="DNS label"):
        node_user_data(BINARIES, handler='runsc"]\n[evil')
