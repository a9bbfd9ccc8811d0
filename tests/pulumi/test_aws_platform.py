"""The aws program ends with a working API: Warren's services as workloads on the EKS cluster,
on the stack's own database and bucket, behind a load balancer open only to the stack's
ranges, with no secret value in any plain output or rendered object, and every resource
passing the policy pack."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import is_secret, revealed
from pulumi_policy import ResourceValidationPolicy, StackValidationPolicy
from stack_runs import AWS, CERTIFICATE, DEV_HOSTNAME, REGISTRY, deploy, stack_file
from test_policy import as_policy_resources, stack_violations, violations
from warren_components.database import connection_url
from warren_components.platform import with_values
from warren_policy import POLICIES

import pulumi
from warren.render import render

pytestmark = pytest.mark.usefixtures("stack_config")

PASSWORD = "generated-password-that-must-stay-secret"  # noqa: S105  # the test's stand-in
PROVIDER = "pulumi:providers:kubernetes"
SYSTEM = "warren-system"
REGION = "eu-west-1"


@pytest.fixture(autouse=True)
def _known_password(monkeypatch: pytest.MonkeyPatch) -> None:
    from warren_components import database

    monkeypatch.setattr(database, "new_password", lambda: PASSWORD)


class Run:
    """One run of the program: what it registered, its stack outputs (value, secret?) and
    the warren configuration it rendered."""

    def __init__(self, stack: str, overrides: dict[str, Any] | None = None) -> None:
        self.exports: dict[str, tuple[Any, bool]] = {}
        self.settings: Any = None
        self.recorder = deploy(stack, {**AWS[stack], **(overrides or {})}, run=self._program)

    def _program(self) -> pulumi.Output[Any]:
        import environments
        import stack_settings

        exported: dict[str, Any] = {}
        real_export = pulumi.export
        setattr(pulumi, "export", exported.__setitem__)  # noqa: B010  # the program calls pulumi.export
        try:
            self.settings = stack_settings.load()
            environments.deploy(self.settings)
        finally:
            pulumi.export = real_export
        names = sorted(exported)
        values = [pulumi.Output.from_input(exported[n]) for n in names]
        return pulumi.Output.all(*[v.is_secret() for v in values], *values).apply(self._record(names))

    def _record(self, names: list[str]) -> Any:
        def record(results: list[Any]) -> None:
            secret, values = results[: len(names)], results[len(names) :]
            self.exports = {n: (v, s) for n, v, s in zip(names, values, secret, strict=True)}

        return record

    def kubernetes(self) -> list[dict[str, Any]]:
        return [
            revealed(r.inputs)
            for r in self.recorder.resources
            if r.typ.startswith("kubernetes:") and r.typ != PROVIDER
        ]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [
            o for o in self.kubernetes() if o["kind"] == kind and o["metadata"]["name"].startswith(name)
        ]
        return found

    def bucket(self) -> str:
        bucket = self.recorder.one("aws:s3/bucket:Bucket")
        return bucket.inputs.get("bucket") or f"{bucket.name}-generated"  # as the mocks name it


@pytest.fixture(scope="module")
def dev() -> Iterator[Run]:
    with pytest.MonkeyPatch.context() as patch:
        from warren_components import database

        patch.setattr(database, "new_password", lambda: PASSWORD)
        patch.setenv("WARREN_HOME", "/nonexistent/warren-home")
        run = Run("aws-dev")
    pulumi.runtime.set_all_config({})
    yield run


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_the_workloads_go_onto_the_eks_cluster(dev: Run) -> None:
    kube = dev.recorder.one(PROVIDER)
    assert "get-token" in kube.inputs["kubeconfig"] and "warren-aws-dev" in kube.inputs["kubeconfig"]
    for resource in dev.recorder.resources:
        if resource.typ.startswith("kubernetes:") and resource.typ != PROVIDER:
            assert resource.provider and f"::{kube.name}::" in resource.provider, resource.name
    kinds = {(o["kind"], o["metadata"]["name"]) for o in dev.kubernetes()}
    assert {
        ("Deployment", "warren-control"),
        ("DaemonSet", "warren-blockd"),
        ("Service", "warren-edge"),
    } <= kinds
    assert dev.named("Job", "warren-install")
    # The stores are the stack's own: nothing embedded.
    assert not [kind for kind, _ in kinds if kind == "StatefulSet"]
    for name in ("warren-control", "warren-blockd", "warren-install"):
        obj = dev.named(
            "Job" if name == "warren-install" else "Deployment" if name == "warren-control" else "DaemonSet",
            name,
        )
        for container in containers(obj):
            assert container["image"].startswith(f"{REGISTRY}/"), (name, container["image"])


def test_the_objects_are_what_warren_renders_with_the_stacks_stores(dev: Run) -> None:
    expected = render(with_values(dev.settings.warren, {"services.bucket": dev.bucket()}))
    made = [o for o in dev.kubernetes() if o["kind"] != "Secret" and o["metadata"]["name"] != "warren-edge"]
    assert made == expected
    services = dev.settings.warren.services
    assert (services.stores, services.object_store_credentials) == ("external", "ambient")


def test_the_bucket_is_the_stacks_and_reached_by_the_pods_identity(dev: Run) -> None:
    bucket = dev.bucket()
    endpoint = f"https://s3.{REGION}.amazonaws.com"
    (control,) = containers(dev.named("Deployment", "warren-control"))
    assert f"--workspace-store=s3://{bucket}" in control["args"]
    assert f"--workspace-store-endpoint={endpoint}" in control["args"]
    blockd = next(c for c in containers(dev.named("DaemonSet", "warren-blockd")) if c["name"] == "blockd")
    assert f"--store=s3://{bucket}" in blockd["args"] and f"--s3-endpoint={endpoint}" in blockd["args"]
    for obj in (dev.named("Deployment", "warren-control"), dev.named("DaemonSet", "warren-blockd")):
        for container in containers(obj):
            names = {e["name"] for e in container.get("env", [])}
            assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, container["name"]
    (install,) = containers(dev.named("Job", "warren-install"))
    assert "--object-store-credentials=ambient" in install["args"]
    # EKS Pod Identity gives exactly those two service accounts the bucket's role.
    (role,) = [r for r in dev.recorder.of_type("aws:iam/role:Role") if "workspaces-access" in r.name]
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "pods.eks.amazonaws.com"
    }
    associations = dev.recorder.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert {(a.inputs["namespace"], a.inputs["serviceAccount"]) for a in associations} == {
        (SYSTEM, "warren-blockd"),
        (SYSTEM, "warren-controller"),
    }
    assert {(a.inputs["clusterName"], a.inputs["roleArn"]) for a in associations} == {
        ("warren-aws-dev", role.arn)
    }
    (policy,) = [
        r
        for r in dev.recorder.of_type("aws:iam/rolePolicy:RolePolicy")
        if r.inputs["role"] == role.resource_id
    ]
    store = dev.recorder.one("aws:s3/bucket:Bucket")
    (key,) = [k for k in dev.recorder.of_type("aws:kms/key:Key") if "workspaces" in k.name]
    resources = {str(s["Resource"]) for s in json.loads(policy.inputs["policy"])["Statement"]}
    assert resources == {store.arn, f"{store.arn}/*", key.arn}


def test_the_database_is_the_stacks_and_its_url_stays_secret(dev: Run) -> None:
    instance = dev.recorder.one("aws:rds/instance:Instance")
    secrets = [r for r in dev.recorder.resources if r.typ == "kubernetes:core/v1:Secret"]
    assert [s.inputs["metadata"]["name"] for s in secrets] == ["warren-database"]
    data = secrets[0].inputs["stringData"]
    assert is_secret(data) or is_secret(data["url"])
    address = f"{instance.name}.mock.rds.example"  # the mocks' RDS address
    assert revealed(data)["url"] == connection_url("warren", PASSWORD, address, 5432, "warren")
    # Made after warren-system exists and before the first workload that reads it.
    order = [
        (r.typ.rsplit(":", 1)[-1], r.inputs.get("metadata", {}).get("name")) for r in dev.recorder.resources
    ]
    at = order.index(("Secret", "warren-database"))
    assert (
        order.index(("Namespace", SYSTEM))
        < at
        < min(i for i, (kind, _) in enumerate(order) if kind in {"Job", "Deployment", "DaemonSet"})
    )


def _plain_strings(value: Any) -> Iterator[str]:
    """Every string in a recorded input that is not inside a secret."""
    if is_secret(value):
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _plain_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _plain_strings(item)


def test_no_secret_value_is_in_a_plain_output_or_input(dev: Run) -> None:
    assert dev.exports, "the program exported nothing"
    for name, (value, secret) in dev.exports.items():
        assert PASSWORD not in json.dumps(value), f"output {name} holds the database password"
        assert not secret, f"output {name} is secret: outputs are for what may be shown"
    for resource in dev.recorder.resources:
        for text in _plain_strings(resource.inputs):
            assert PASSWORD not in text, f"{resource.typ} {resource.name} holds the password in plain"


def test_the_api_url_is_an_output_and_the_load_balancer_admits_only_the_stacks_ranges(dev: Run) -> None:
    assert dev.exports["apiUrl"][0] == f"https://{DEV_HOSTNAME}"
    assert "apiLoadBalancer" in dev.exports
    edge = dev.named("Service", "warren-edge")
    rendered = dev.named("Service", "warren-control")
    assert edge["spec"]["type"] == "LoadBalancer"
    assert edge["spec"]["loadBalancerSourceRanges"] == stack_file("aws-dev")["warren:apiAllowedCidrs"]
    assert edge["spec"]["selector"] == rendered["spec"]["selector"]
    assert edge["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "edge", "protocol": "TCP"}]
    annotations = edge["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-cert"] == CERTIFICATE
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-type"] == "nlb"
    assert "service.beta.kubernetes.io/aws-load-balancer-internal" not in annotations  # internet-facing
    assert edge["metadata"]["namespace"] == SYSTEM


def test_production_keeps_the_api_inside_the_vpc() -> None:
    prod = Run("aws-prod")
    edge = prod.named("Service", "warren-edge")
    assert edge["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-internal"] == "true"
    assert edge["spec"]["loadBalancerSourceRanges"] == ["10.50.0.0/16"]
    assert edge["spec"]["ports"][0]["port"] == 8080
    assert prod.exports["apiUrl"][0].startswith("http://")


@pytest.mark.parametrize("stack", ["aws-dev", "aws-prod"])
def test_the_policy_pack_passes_everything_the_program_makes(stack: str) -> None:
    run = Run(stack)
    checked: set[str] = set()
    for resource in run.recorder.resources:
        for policy in POLICIES:
            if isinstance(policy, ResourceValidationPolicy):
                found = violations(policy.name, resource.typ, revealed(resource.inputs), stack=stack)
                assert not found, (policy.name, resource.name, found)
        checked.add(resource.typ)
    assert {
        "kubernetes:apps/v1:Deployment",
        "kubernetes:apps/v1:DaemonSet",
        "kubernetes:batch/v1:Job",
        "kubernetes:core/v1:Service",
    } <= checked
    resources = as_policy_resources(run.recorder, stack)
    for policy in POLICIES:
        if isinstance(policy, StackValidationPolicy):
            assert stack_violations(policy.name, resources) == [], policy.name


def test_a_bucket_named_in_the_stack_is_rendered_at_once() -> None:
    run = Run("aws-dev", {"warren:bucketName": "warren-dev-workspaces"})
    (control,) = containers(run.named("Deployment", "warren-control"))
    assert "--workspace-store=s3://warren-dev-workspaces" in control["args"]
    assert run.settings.warren.services.bucket == "warren-dev-workspaces"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"warren:imageRegistry": ""}, r"warren:imageRegistry is not set"),
        ({"warren:imageRegistry": "https://registry.example.com"}, r"warren:imageRegistry is 'https://"),
        ({"warren:imageTag": "-latest"}, r"warren:imageTag is '-latest'"),
        ({"warren:apiAllowedCidrs": []}, r"warren:apiAllowedCidrs is empty"),
        ({"warren:apiAllowedCidrs": ["0.0.0.0/0"]}, r"0\.0\.0\.0/0 opens the API to the whole internet"),
        (
            {"warren:apiAllowedCidrs": ["10.0.0.1/8"]},
            r"warren:apiAllowedCidrs: '10\.0\.0\.1/8' is not a network",
        ),
        (
            {"warren:apiCertificateArn": ""},
            r"warren:apiCertificateArn is not set: TLS at the edge needs both",
        ),
        (
            {"warren:apiCertificateArn": "", "warren:apiHostname": ""},
            r"warren:apiCertificateArn is not set: an internet-facing API carries API keys",
        ),
        ({"warren:apiCertificateArn": "arn:aws:iam::1:role/x"}, r"warren:apiCertificateArn is 'arn:aws:iam"),
        ({"warren:bucketName": "Not_A_Bucket"}, r"warren:bucketName is 'Not_A_Bucket'"),
    ],
)
def test_settings_are_refused_naming_the_key(overrides: dict[str, Any], message: str) -> None:
    import stack_settings

    with pytest.raises(stack_settings.SettingsError, match=message):
        Run("aws-dev", overrides)


def test_a_configuration_file_cannot_contradict_the_stack(tmp_path: Path) -> None:
    import stack_settings

    config = tmp_path / "warren.yaml"
    config.write_text("services:\n  stores: embedded\n")
    with pytest.raises(stack_settings.SettingsError, match=r"sets services\.stores: 'embedded'.*remove it"):
        Run("aws-dev", {"warren:configFile": str(config)})
    config.write_text("services:\n  bucket: my-own-bucket\n")
    with pytest.raises(stack_settings.SettingsError, match=r"services\.bucket.*warren:bucketName"):
        Run("aws-dev", {"warren:configFile": str(config)})
    # What agrees with the stack, and everything the stack leaves alone, is the file's.
    config.write_text(
        "services:\n  enabled: true\n  control_replicas: 3\nisolation:\n  extra_namespaces: [team-a]\n"
    )
    run = Run("aws-dev", {"warren:configFile": str(config)})
    assert run.named("Deployment", "warren-control")["spec"]["replicas"] == 3
    assert run.named("Namespace", "team-a")
