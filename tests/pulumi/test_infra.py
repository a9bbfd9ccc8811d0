"""The program (infra/) with each stack's settings (stacks/): what it composes, and that every
stack key is declared in Pulumi.yaml with the type its value has."""

from __future__ import annotations

from pathlib import Path

import pytest
from stack_runs import AWS, DECLARED, STACKS, deploy, stack_file

pytestmark = pytest.mark.usefixtures("stack_config")

COMPONENTS = (
    "warren:aws_sandbox_cluster:AwsSandboxCluster",
    "warren:object_store:ObjectStore",
    "warren:database:Database",
    "warren:kvm_host_pool:KvmHostPool",
    "warren:object_store_access:ObjectStoreAccess",
    "warren:platform:WarrenPlatform",
    "warren:edge:WarrenEdge",
)


TYPES = {"string": str, "boolean": bool, "integer": int, "array": list}


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_key_is_declared_with_a_matching_type(stack: str) -> None:
    for key, value in stack_file(stack).items():
        namespace, name = key.split(":", 1)
        if namespace != "warren":
            assert key == "pulumi:disable-default-providers", key
            continue
        assert name in DECLARED, f"{stack}: {key} is not declared in infra/Pulumi.yaml"
        assert isinstance(value, TYPES[DECLARED[name]["type"]]), (stack, key, value)


def test_required_keys_have_no_default() -> None:
    assert "default" not in DECLARED["target"]
    assert all("default" in spec for key, spec in DECLARED.items() if key != "target")


def test_local_deploys_only_the_platform(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    recorder = deploy("local", {"warren:kubeconfig": str(kubeconfig), "warren:localNode": False})
    assert recorder.one("warren:platform:WarrenPlatform")
    assert not [r for r in recorder.resources if r.typ.startswith(("aws:", "pulumi:providers:aws"))]
    provider = recorder.one("pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == str(kubeconfig)
    # Another cluster gets the configuration as it is: Warren's services as workloads included.
    kinds = {
        (r.inputs["kind"], r.inputs["metadata"]["name"]) for r in recorder.resources if "kind" in r.inputs
    }
    assert {("Deployment", "warren-control"), ("DaemonSet", "warren-blockd")} <= kinds


def _local_node(home: Path) -> Path:
    """A local cluster's state as `make deploy` leaves it: its kubeconfig and its node's socket."""
    state = home / "cluster"
    (state / "node" / "containerd").mkdir(parents=True)
    (state / "node" / "containerd" / "containerd.sock").touch()
    (state / "admin.kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    return state


def test_local_on_the_local_node_renders_what_warren_apply_local_node_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warren.config import SERVICE_IMAGES
    from warren.node import images

    state = _local_node(tmp_path / "warren-home")
    held = {f"warren.dev/{name}:0.1.0": "sha256:" + f"{i:02x}" * 32 for i, name in enumerate(SERVICE_IMAGES)}
    monkeypatch.setenv("WARREN_BIN_DIR", str(tmp_path / "bin"))
    monkeypatch.setattr(
        images, "imported", lambda bin_dir, _node: held if bin_dir == tmp_path / "bin" else {}
    )
    recorder = deploy("local")
    (blockd,) = [
        r.inputs
        for r in recorder.resources
        if r.inputs.get("kind") == "DaemonSet" and r.inputs["metadata"]["name"] == "warren-blockd"
    ]
    spec = blockd["spec"]["template"]["spec"]
    assert {
        "name": "kubelet",
        "hostPath": {"path": str(state / "node" / "kubelet"), "type": "Directory"},
    } in spec["volumes"]
    for container in spec["containers"]:
        assert container["imagePullPolicy"] == "Never"
        assert (
            container["image"] == f"warren.dev/warren-blockd:0.1.0@{held['warren.dev/warren-blockd:0.1.0']}"
        )


def test_local_node_without_its_images_names_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stack_settings

    from warren.node import images

    _local_node(tmp_path / "warren-home")
    monkeypatch.setenv("WARREN_BIN_DIR", str(tmp_path / "bin"))
    monkeypatch.setattr(images, "imported", lambda _bin, _node: {})
    with pytest.raises(stack_settings.SettingsError, match=r"warren:localNode: .*warren image build"):
        deploy("local")


def test_local_node_that_does_not_run_names_the_key(tmp_path: Path) -> None:
    import stack_settings

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(
        stack_settings.SettingsError, match=r"warren:localNode is true, but no local node runs"
    ):
        deploy("local", {"warren:kubeconfig": str(kubeconfig)})


def test_local_without_a_cluster_names_the_key(tmp_path: Path) -> None:
    import stack_settings

    with pytest.raises(stack_settings.SettingsError, match=r"warren:kubeconfig is empty.*warren-home"):
        deploy("local")


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_aws_stacks_refuse_to_run_without_pinned_gvisor(stack: str) -> None:
    import stack_settings

    with pytest.raises(stack_settings.SettingsError, match="warren:gvisorBaseUrl is not set"):
        deploy(stack)


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_aws_stacks_compose_every_component(stack: str) -> None:
    recorder = deploy(stack, AWS[stack])
    for component in COMPONENTS:
        assert len(recorder.of_type(component)) == 1, component
    aws_provider = recorder.one("pulumi:providers:aws")
    assert aws_provider.inputs["region"] == stack_file(stack)["warren:awsRegion"]
    # Everything AWS goes through that provider (default providers are disabled in the stacks).
    for resource in recorder.resources:
        if resource.typ.startswith("aws:"):
            assert resource.provider and f"::{aws_provider.name}::" in resource.provider, resource.name
    # The platform is applied to the new cluster, through the kubeconfig the cluster produced.
    kube = recorder.one("pulumi:providers:kubernetes")
    assert "get-token" in kube.inputs["kubeconfig"]
    assert f"warren-{stack}" in kube.inputs["kubeconfig"]
    # The KVM hosts take the current Amazon Linux when no AMI is pinned.
    images = [r.inputs.get("imageId") for r in recorder.of_type("aws:ec2/launchTemplate:LaunchTemplate")]
    assert "ami-0mock" in images


def test_prod_is_private_and_protected_dev_is_not() -> None:
    prod = deploy("aws-prod", AWS["aws-prod"])
    dev = deploy("aws-dev", AWS["aws-dev"])
    for recorder, protected in ((prod, True), (dev, False)):
        assert recorder.one("aws:rds/instance:Instance").inputs["deletionProtection"] is protected
    assert prod.one("aws:eks/cluster:Cluster").inputs["vpcConfig"]["endpointPublicAccess"] is False
    assert len(prod.of_type("aws:ec2/natGateway:NatGateway")) == 3
    assert prod.one("aws:rds/instance:Instance").inputs["multiAz"] is True
