"""WarrenPlatform creates exactly the objects warren renders, unchanged, through its own provider."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, Recorder
from warren_components import WarrenPlatform, WarrenPlatformArgs
from warren_components.kubernetes_objects import KINDS, UnsupportedKindError

from warren.config import load_config, parse_config
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
    with pytest.raises(ValueError, match="not both"):
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
    ],
)
def test_every_kind_warren_renders_has_a_class(config: dict[str, Any]) -> None:
    for obj in render(parse_config(config)):
        assert (obj["apiVersion"], obj["kind"]) in KINDS, (obj["apiVersion"], obj["kind"])
