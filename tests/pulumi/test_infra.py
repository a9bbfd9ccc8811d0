"""The program (infra/) with each stack's settings (stacks/): what it composes, and that every
stack key is declared in Pulumi.yaml with the type its value has."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, SHA_RUNSC, SHA_SHIM, Recorder, run_program

import pulumi

PROJECT: dict[str, Any] = yaml.safe_load((REPO / "infra" / "Pulumi.yaml").read_text())
DECLARED: dict[str, dict[str, Any]] = PROJECT["config"]
STACKS = ("local", "aws-dev", "aws-prod")
GVISOR = {
    "warren:gvisorBaseUrl": "https://mirror.example/gvisor/x86_64",
    "warren:gvisorRunscSha256": SHA_RUNSC,
    "warren:gvisorShimSha256": SHA_SHIM,
}
COMPONENTS = (
    "warren:aws_sandbox_cluster:AwsSandboxCluster",
    "warren:object_store:ObjectStore",
    "warren:database:Database",
    "warren:kvm_host_pool:KvmHostPool",
    "warren:platform:WarrenPlatform",
)


def stack_file(stack: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    return dict(data["config"])


def _engine_value(value: Any) -> str:
    """How the engine hands a config value to the program: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def effective_config(stack: str, overrides: dict[str, Any] | None = None) -> dict[str, str]:
    """Pulumi.yaml's defaults under the stack file's values, as the engine merges them."""
    merged = {f"warren:{key}": spec["default"] for key, spec in DECLARED.items() if "default" in spec}
    merged.update(stack_file(stack))
    merged.update(overrides or {})
    return {key: _engine_value(value) for key, value in merged.items()}


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("WARREN_HOME", str(tmp_path / "warren-home"))  # no real cluster's kubeconfig
    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    yield
    pulumi.runtime.set_all_config({})


def deploy(stack: str, overrides: dict[str, Any] | None = None) -> Recorder:
    import environments
    import stack_settings

    pulumi.runtime.set_all_config(effective_config(stack, overrides))
    return run_program(lambda: environments.deploy(stack_settings.load()), stack=stack)


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
    recorder = deploy("local", {"warren:kubeconfig": str(kubeconfig)})
    assert recorder.one("warren:platform:WarrenPlatform")
    assert not [r for r in recorder.resources if r.typ.startswith(("aws:", "pulumi:providers:aws"))]
    provider = recorder.one("pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == str(kubeconfig)


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
    recorder = deploy(stack, GVISOR)
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
    prod = deploy("aws-prod", GVISOR)
    dev = deploy("aws-dev", GVISOR)
    for recorder, protected in ((prod, True), (dev, False)):
        assert recorder.one("aws:rds/instance:Instance").inputs["deletionProtection"] is protected
    assert prod.one("aws:eks/cluster:Cluster").inputs["vpcConfig"]["endpointPublicAccess"] is False
    assert len(prod.of_type("aws:ec2/natGateway:NatGateway")) == 3
    assert prod.one("aws:rds/instance:Instance").inputs["multiAz"] is True
