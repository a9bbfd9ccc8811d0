"""WarrenPlatform creates exactly the objects warren renders, unchanged, through its own provider."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi_kubernetes as k8s
import pytest
from conftest import REPO, Recorder, is_secret, revealed
from warren_components import WarrenPlatform, WarrenPlatformArgs
from warren_components.kubernetes_objects import KINDS, UnsupportedKindError
from warren_components.platform import render_at_deploy

import pulumi
from warren.config import ConfigError, load_config, parse_config
from warren.render import render

SAMPLE_CONFIG = REPO / "tests" / "cluster" / "warren-test.yaml"
PROVIDER_TYPE = "pulumi:providers:kubernetes"


def _objects(recorder: Recorder) -> list[dict[str, Any]]:
    """The Kubernetes objects as registered: every kubernetes resource's inputs."""
    return [
        r.inputs for r in recorder.resources if r.typ.startswith("kubernetes:") and r.typ != PROVIDER_TYPE
    ]


def _identity(obj: dict[str, Any]) -> tuple[str, str, str, str | None]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))


def test_creates_exactly_the_rendered_objects_for_a_sample_config(run: Callable[..., Recorder]) -> None:
    expected = render(load_config(SAMPLE_CONFIG))
    recorder = run(
        lambda: WarrenPlatform("warren", WarrenPlatformArgs(kubeconfig="kc", config_path=SAMPLE_CONFIG))
    )

    created = _objects(recorder)
    assert [_identity(o) for o in created] == [_identity(o) for o in expected]
    # The sample adds a second sandbox namespace: it and its egress floor are there.
    assert ("v1", "Namespace", "warren-sandboxes-b", None) in {_identity(o) for o in created}
    assert ("networking.k8s.io/v1", "NetworkPolicy", "warren-egress-floor", "warren-sandboxes-b") in {
        _identity(o) for o in created
    }


def test_objects_are_byte_for_byte_what_warren_renders(run: Callable[..., Recorder]) -> None:
    expected = render(load_config(SAMPLE_CONFIG))
    recorder = run(
        lambda: WarrenPlatform("warren", WarrenPlatformArgs(kubeconfig="kc", config_path=SAMPLE_CONFIG))
    )
    created = _objects(recorder)
    assert len(created) == len(expected)
    for made, rendered in zip(created, expected, strict=True):
        # Whole-object equality: no label, annotation, field or default added or dropped.
        assert made == rendered, _identity(rendered)


def test_each_object_has_its_kinds_resource_type(run: Callable[..., Recorder]) -> None:
    recorder = run(lambda: WarrenPlatform("warren", WarrenPlatformArgs(kubeconfig="kc")))
    kinds = {
        (r.inputs["apiVersion"], r.inputs["kind"]): r.typ
        for r in recorder.resources
        if r.typ != PROVIDER_TYPE and r.typ.startswith("kubernetes:")
    }
    assert kinds[("v1", "Namespace")] == "kubernetes:core/v1:Namespace"
    assert kinds[("node.k8s.io/v1", "RuntimeClass")] == "kubernetes:node.k8s.io/v1:RuntimeClass"
    assert (
        kinds[("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")]
        == "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
    )


def test_every_object_goes_through_one_explicit_server_side_apply_provider(
    run: Callable[..., Recorder],
) -> None:
    recorder = run(
        lambda: WarrenPlatform("warren", WarrenPlatformArgs(kubeconfig="apiVersion: v1\n", context="ctx"))
    )
    provider = recorder.one(PROVIDER_TYPE)
    assert provider.inputs["kubeconfig"] == "apiVersion: v1\n"
    assert provider.inputs["context"] == "ctx"
    # Client-side apply would add a managed-by label and a last-applied annotation.
    assert provider.inputs["enableServerSideApply"] == "true"
    for resource in recorder.resources:
        if resource.typ.startswith("kubernetes:") and resource.typ != PROVIDER_TYPE:
            assert resource.provider is not None
            assert f"::{provider.name}::" in resource.provider, resource.name


def test_registration_follows_the_render_order(run: Callable[..., Recorder]) -> None:
    expected = render(load_config(None))
    recorder = run(lambda: WarrenPlatform("warren", WarrenPlatformArgs(kubeconfig="kc")))
    assert [_identity(o) for o in _objects(recorder)] == [_identity(o) for o in expected]
    kinds = [o["kind"] for o in _objects(recorder)]
    assert kinds.index("CustomResourceDefinition") < kinds.index("ValidatingAdmissionPolicy")


def test_rendered_objects_can_be_passed_instead_of_a_config(run: Callable[..., Recorder]) -> None:
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "only-this", "labels": {"a": "b"}}},
    ]
    recorder = run(lambda: WarrenPlatform("p", WarrenPlatformArgs(kubeconfig="kc", objects=objects)))
    assert _objects(recorder) == objects


def test_config_and_objects_together_are_refused() -> None:
    args = WarrenPlatformArgs(kubeconfig="kc", config_path=Path("x.yaml"), objects=[])
    with pytest.raises(ValueError, match=r"give one of config_path, config and objects"):
        WarrenPlatform("p", args)


def test_a_kind_without_a_class_is_refused_by_name(run: Callable[..., Recorder]) -> None:
    objects = [{"apiVersion": "example.dev/v1", "kind": "Gadget", "metadata": {"name": "g"}}]
    with pytest.raises(UnsupportedKindError, match=r"example.dev/v1 Gadget \(g\)"):
        run(lambda: WarrenPlatform("p", WarrenPlatformArgs(kubeconfig="kc", objects=objects)))


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"isolation": {"extra_namespaces": ["team-a", "team-b"], "pod_security_level": "restricted"}},
        {"isolation": {"runtime_class": "sandboxed", "runtime_handler": "gvisor-kvm"}},
        {"services": {"enabled": True}},
    ],
)
def test_every_kind_warren_renders_has_a_class(config: dict[str, Any]) -> None:
    for obj in render(parse_config(config)):
        assert (obj["apiVersion"], obj["kind"]) in KINDS, (obj["apiVersion"], obj["kind"])


# -- what a stack gives besides a configuration -------------------------------------------------

SERVICES = parse_config(
    {"services": {"enabled": True, "stores": "external", "object_store_endpoint": "https://s3.example.com"}}
)


def _workload(recorder: Recorder, kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in _objects(recorder) if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_a_configuration_object_renders_as_its_file_does(run: Callable[..., Recorder]) -> None:
    from_file = run(
        lambda: WarrenPlatform("warren", WarrenPlatformArgs(kubeconfig="kc", config_path=SAMPLE_CONFIG))
    )
    config = load_config(SAMPLE_CONFIG)
    from_object = run(lambda: WarrenPlatform("warren", WarrenPlatformArgs(kubeconfig="kc", config=config)))
    assert _objects(from_object) == _objects(from_file)


def test_deploy_time_values_are_rendered_into_the_same_objects(run: Callable[..., Recorder]) -> None:
    bucket = "warren-aws-dev-workspaces-0a1b2c3"

    def program() -> None:
        WarrenPlatform(
            "warren",
            WarrenPlatformArgs(
                kubeconfig="kc",
                config=SERVICES,
                deploy_time={"services.bucket": pulumi.Output.from_input(bucket)},
            ),
        )

    recorder = run(program)
    expected = render(
        SERVICES.model_copy(update={"services": SERVICES.services.model_copy(update={"bucket": bucket})})
    )
    assert _objects(recorder) == expected
    (control,) = _workload(recorder, "Deployment", "warren-control")["spec"]["template"]["spec"]["containers"]
    assert f"--workspace-store=s3://{bucket}" in control["args"]
    blockd = _workload(recorder, "DaemonSet", "warren-blockd")["spec"]["template"]["spec"]["containers"][0]
    assert f"--store=s3://{bucket}" in blockd["args"]


def test_a_deploy_time_key_must_exist() -> None:
    args = WarrenPlatformArgs(kubeconfig="kc", config=SERVICES, deploy_time={"services.buckets": "b"})
    with pytest.raises(ValueError, match=r"deploy_time: services\.buckets is not a key"):
        WarrenPlatform("warren", args)


def test_a_deploy_time_value_that_changes_which_objects_render_is_refused() -> None:
    expected = render(SERVICES)
    # Another bucket renders the same objects; turning the services off would not.
    assert render_at_deploy(SERVICES, {"services.bucket": "another-bucket"}, expected)
    with pytest.raises(ValueError, match=r"services\.enabled changed which objects warren renders"):
        render_at_deploy(SERVICES, {"services.enabled": False}, expected)
    with pytest.raises(ConfigError, match=r"services\.bucket"):
        render_at_deploy(SERVICES, {"services.bucket": "Not A Bucket"}, expected)


def test_secrets_are_made_in_warren_system_before_any_workload(run: Callable[..., Recorder]) -> None:
    url = "postgresql+psycopg://warren:pw@db.example:5432/warren?sslmode=require"
    recorder = run(
        lambda: WarrenPlatform(
            "warren",
            WarrenPlatformArgs(kubeconfig="kc", config=SERVICES, secrets={"warren-database": {"url": url}}),
        )
    )
    kinds = [
        (r.typ, r.inputs.get("metadata", {}).get("name"))
        for r in recorder.resources
        if r.typ.startswith("kubernetes:")
    ]
    secret_at = kinds.index(("kubernetes:core/v1:Secret", "warren-database"))
    assert kinds.index(("kubernetes:core/v1:Namespace", "warren-system")) < secret_at
    first_workload = min(
        i for i, (typ, _) in enumerate(kinds) if typ.split(":")[-1] in {"Job", "Deployment", "DaemonSet"}
    )
    assert secret_at < first_workload
    secret = recorder.one("kubernetes:core/v1:Secret").inputs
    assert secret["metadata"] == {
        "name": "warren-database",
        "namespace": "warren-system",
        "labels": {"app.kubernetes.io/part-of": "warren"},
    }
    data = secret["stringData"]
    assert is_secret(data) or all(is_secret(value) for value in data.values()), data
    assert revealed(data) == {"url": url}
    # The rendered objects are exactly warren's: the Secret is the only addition.
    assert [o for o in _objects(recorder) if o["kind"] != "Secret"] == render(SERVICES)


def test_secrets_need_warren_system() -> None:
    objects = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "only-this"}}]
    args = WarrenPlatformArgs(kubeconfig="kc", objects=objects, secrets={"s": {"k": "v"}})
    with pytest.raises(ValueError, match="secrets go to warren-system"):
        WarrenPlatform("p", args)


def test_every_object_waits_for_what_the_stack_names(
    run: Callable[..., Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    waited: list[Any] = []
    real = k8s.Provider

    def provider(name: str, opts: pulumi.ResourceOptions | None = None, **kwargs: Any) -> Any:
        waited.extend(opts.depends_on if opts and isinstance(opts.depends_on, list) else [])
        return real(name, opts=opts, **kwargs)

    monkeypatch.setattr(k8s, "Provider", provider)

    def program() -> None:
        nodes = pulumi.ComponentResource("test:index:Nodes", "nodes")
        WarrenPlatform("warren", WarrenPlatformArgs(kubeconfig="kc", depends_on=[nodes]))
        assert waited == [nodes]

    run(program)
    assert waited
