from pathlib import Path

import yaml

from warren.config import parse_config
from warren.node.files import render, write_keeping_block
from warren.node.layout import NodeLayout

BEGIN, END = "# BEGIN block", "# END block"


def test_block_survives_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    write_keeping_block(path, "a = 1\n", BEGIN, END)
    path.write_text(path.read_text() + f"{BEGIN}\nmanaged = true\n{END}\n")  # another tool's block
    before = path.stat().st_mtime_ns
    write_keeping_block(path, "a = 1\n", BEGIN, END)
    assert path.stat().st_mtime_ns == before  # unchanged base: file untouched
    write_keeping_block(path, "a = 2\n", BEGIN, END)
    text = path.read_text()
    assert text.startswith("a = 2\n") and "managed = true" in text


def test_node_defaults_and_pod_range() -> None:
    config = parse_config({"cluster": {"pod_cidr": "10.50.0.0/16", "service_cidr": "10.60.0.0/24"}})
    assert config.cluster.node.enabled
    assert config.cluster.node_pod_cidr == "10.50.0.0/24"
    assert config.cluster.dns_ip == "10.60.0.10"
    assert config.cluster.node.oci_runtime == "runc"


def test_the_kubelet_admits_the_configured_pods() -> None:
    config = parse_config({"cluster": {"node": {"max_pods": 240}}}).cluster
    text = render(
        "kubelet-config.yaml.j2",
        node=config.node,
        cluster=config,
        layout=NodeLayout(Path("/n")),
        node_ip="10.0.0.2",
        ca="ca.crt",
        serving_cert="s.crt",
        serving_key="s.key",
    )
    assert yaml.safe_load(text)["maxPods"] == 240
