from pathlib import Path

import pytest

from warren.config import ConfigError, WarrenConfig, load_config, parse_config


def test_defaults_are_valid() -> None:
    config = WarrenConfig()
    assert config.isolation.runtime_class == "gvisor"
    assert config.isolation.runtime_handler == "runsc"
    assert config.isolation.sandbox_namespaces == ("warren-sandboxes",)
    assert config.cluster.service_ip == "10.96.0.1"


def test_bad_choice_names_key_and_allowed_values() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"isolation": {"pod_security_level": "strict"}})
    text = str(err.value)
    assert "isolation.pod_security_level" in text
    assert "'baseline'" in text and "'restricted'" in text
    assert "'strict'" in text


def test_unknown_key_is_refused_not_ignored() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"isolation": {"runtime_clas": "gvisor"}})
    assert "isolation.runtime_clas: unknown key" in str(err.value)


@pytest.mark.parametrize("cidr", ["10.0.0.1/8", "not-a-net", "10.0.0.0/33"])
def test_bad_cidr(cidr: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"cluster": {"service_cidr": cidr}})
    assert "cluster.service_cidr" in str(err.value)
    assert "CIDR" in str(err.value)


def test_bad_port_and_namespace_reported_together() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"cluster": {"api_port": 70000}, "isolation": {"extra_namespaces": ["Bad_NS"]}})
    text = str(err.value)
    assert "cluster.api_port" in text
    assert "isolation.extra_namespaces" in text and "DNS label" in text


def test_platform_groups_cannot_be_empty() -> None:
    with pytest.raises(ConfigError, match=r"isolation\.platform_groups"):
        parse_config({"isolation": {"platform_groups": []}})


def test_load_config_file(tmp_path: Path) -> None:
    path = tmp_path / "warren.yaml"
    path.write_text("isolation:\n  extra_namespaces: [team-a]\n")
    config = load_config(path)
    assert config.isolation.sandbox_namespaces == ("warren-sandboxes", "team-a")


def test_load_config_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "warren.yaml"
    path.write_text("isolation: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(path)
    path.write_text("cluster:\n  api_port: zero\n")
    with pytest.raises(ConfigError, match=str(path)):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_egress_blocked_split_by_family() -> None:
    config = parse_config({"egress": {"extra_blocked_cidrs": ["203.0.113.7/32"]}})
    v4 = config.egress.blocked(4)
    assert "10.0.0.0/8" in v4 and "203.0.113.7/32" in v4
    assert all(":" not in c for c in v4)
    assert "fc00::/7" in config.egress.blocked(6)


def test_bad_workspace_settings_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="bucket"):
        parse_config({"cluster": {"workspaces": {"bucket": "No_Such"}}})
    with pytest.raises(ConfigError, match="base_port"):
        parse_config({"cluster": {"workspaces": {"base_port": 80}}})


def test_max_pods_must_fit_the_nodes_pod_range() -> None:
    assert parse_config({"cluster": {"node": {"max_pods": 253}}}).cluster.node.max_pods == 253
    with pytest.raises(ConfigError, match=r"max_pods 254 does not fit .* 10\.244\.0\.0/24 \(253 addresses\)"):
        parse_config({"cluster": {"node": {"max_pods": 254}}})
    with pytest.raises(ConfigError, match=r"widen cluster\.pod_cidr"):
        parse_config({"cluster": {"pod_cidr": "10.244.0.0/25", "node": {"max_pods": 200}}})


def test_evented_pleg_turns_on_the_kubelets_feature_gate_and_only_it() -> None:
    import yaml

    from warren.node import provider

    def kubelet(**node: object) -> dict[str, object]:
        cfg = parse_config({"cluster": {"node": node}}).cluster
        text = provider.render(
            "kubelet-config.yaml.j2",
            node=cfg.node,
            cluster=cfg,
            layout=type("Layout", (), {"endpoint": "unix:///run/containerd.sock"})(),
            node_ip="192.0.2.1",
            ca="ca.crt",
            serving_cert="kubelet.crt",
            serving_key="kubelet.key",
        )
        found: dict[str, object] = yaml.safe_load(text)
        return found

    assert "featureGates" not in kubelet()
    evented = kubelet(evented_pleg=True)
    assert evented["featureGates"] == {"EventedPLEG": True}
    assert {k: v for k, v in evented.items() if k != "featureGates"} == kubelet()


def test_joined_nodes_get_their_own_link_and_pod_range() -> None:
    cluster = parse_config({"cluster": {"joined_nodes": [{"name": "b"}, {"name": "c"}]}}).cluster
    # The first node's range is the pod range's first /24; each joined node takes the next.
    assert cluster.node_pod_cidr == "10.244.0.0/24"
    assert cluster.joined_node_site(0) == ("10.78.0.1", "10.78.0.2", "10.244.1.0/24")
    assert cluster.joined_node_site(1) == ("10.78.0.5", "10.78.0.6", "10.244.2.0/24")


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"joined_nodes": [{"name": "b"}, {"name": "b"}]}, "must differ from each other and node.name"),
        ({"node": {"name": "b"}, "joined_nodes": [{"name": "b"}]}, "must differ from each other"),
        ({"joined_nodes": [{"name": "far-too-long-a"}]}, "12 characters at most"),
        ({"joined_nodes": [{"name": "B"}]}, "not a node name"),
        (
            {"link_cidr": "10.78.0.0/30", "joined_nodes": [{"name": "b"}, {"name": "c"}]},
            "do not fit link_cidr",
        ),
        ({"link_cidr": "fd00::/64"}, "not an IPv4 network"),
    ],
)
def test_joined_nodes_that_cannot_be_placed_are_refused(cluster: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"cluster": cluster})


def test_a_joined_nodes_kubelet_keeps_its_pods_under_its_own_cgroup() -> None:
    import yaml

    from warren.node import provider

    cfg = parse_config({}).cluster
    common = {
        "node": cfg.node,
        "cluster": cfg,
        "layout": type("Layout", (), {"endpoint": "unix:///run/containerd.sock"})(),
        "node_ip": "10.78.0.2",
        "ca": "ca.crt",
        "serving_cert": "kubelet.crt",
        "serving_key": "kubelet.key",
    }
    assert "cgroupRoot" not in yaml.safe_load(provider.render("kubelet-config.yaml.j2", **common))
    joined = yaml.safe_load(provider.render("kubelet-config.yaml.j2", cgroup_root="/warren-b", **common))
    assert joined["cgroupRoot"] == "/warren-b"
