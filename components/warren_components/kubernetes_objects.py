"""One pulumi-kubernetes resource for one rendered Kubernetes object, the object left as it is.

Each kind warren renders maps to the SDK's class for that kind, so a preview shows real types
(`kubernetes:core/v1:Namespace`, not a generic custom resource) and the provider's await logic
for the kind applies (a CRD is waited for until Established, as `warren apply` does).
The object's top-level fields become the class's arguments unchanged: no label, annotation or
default is added here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import pulumi_kubernetes as k8s

import pulumi

Manifest = Mapping[str, Any]
ResourceFactory = Callable[..., pulumi.CustomResource]

# Every kind the warren package renders. A kind missing here is an error (UnsupportedKindError), not a
# silent fallback to a generic resource; tests/pulumi checks every rendered kind is listed.
KINDS: dict[tuple[str, str], ResourceFactory] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): k8s.apiextensions.v1.CustomResourceDefinition,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("node.k8s.io/v1", "RuntimeClass"): k8s.node.v1.RuntimeClass,
    ("storage.k8s.io/v1", "CSIDriver"): k8s.storage.v1.CSIDriver,
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
    ): k8s.admissionregistration.v1.ValidatingAdmissionPolicy,
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
    ): k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    # Warren's own services (services.enabled).
    ("v1", "Service"): k8s.core.v1.Service,
    ("batch/v1", "Job"): k8s.batch.v1.Job,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("apps/v1", "StatefulSet"): k8s.apps.v1.StatefulSet,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
}


def _sandbox_pool(name: str, **fields: Any) -> pulumi.CustomResource:
    """Warren's own kind: created after its CRD, which the objects before it include."""
    return k8s.apiextensions.CustomResource(
        name, api_version="warren.dev/v1alpha1", kind="SandboxPool", **fields
    )


KINDS[("warren.dev/v1alpha1", "SandboxPool")] = _sandbox_pool

# Set by the SDK class itself (apiVersion, kind) or passed on its own (metadata).
_HEADER = frozenset({"apiVersion", "kind", "metadata"})
_CAMEL_BOUNDARY = re.compile(r"(?<!^)(?=[A-Z])")


class UnsupportedKindError(ValueError):
    """A rendered object whose kind has no entry in KINDS."""


def _argument_name(field: str) -> str:
    """The SDK's keyword for a top-level field: roleRef -> role_ref."""
    return _CAMEL_BOUNDARY.sub("_", field).lower()


def label(obj: Manifest) -> str:
    """`Kind/name` or `Kind/namespace/name`, for messages and outputs."""
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{obj['kind']}/{namespace}/{meta['name']}" if namespace else f"{obj['kind']}/{meta['name']}"


def resource_name(prefix: str, obj: Manifest) -> str:
    """A logical name unique within a stack for the object (its kind, namespace and name)."""
    meta = obj["metadata"]
    parts = [prefix, obj["kind"].lower(), meta.get("namespace"), meta["name"]]
    return "-".join(part for part in parts if part)


def create(
    name: str, obj: Manifest, opts: pulumi.ResourceOptions, values: pulumi.Output[Manifest] | None = None
) -> pulumi.CustomResource:
    """Register `obj` as the SDK resource for its kind, its fields passed through unchanged.
    `values`: the same object as it renders once the stack deploys (WarrenPlatform's
    deploy-time values); its fields are sent instead of `obj`'s, which names the resource."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    factory = KINDS.get(key)
    if factory is None:
        raise UnsupportedKindError(
            f"{key[0]} {key[1]} ({obj.get('metadata', {}).get('name')}) has no pulumi-kubernetes class: "
            "add it to KINDS in warren_components/kubernetes_objects.py"
        )
    if "status" in obj:
        raise ValueError(
            f"{label(obj)} carries a status: rendered objects must not (it belongs to the server)"
        )
    if values is None:
        fields = {_argument_name(field): value for field, value in obj.items() if field not in _HEADER}
        return factory(name, opts=opts, metadata=obj["metadata"], **fields)
    late = {_argument_name(field): _field(values, field) for field in obj if field not in _HEADER}
    return factory(name, opts=opts, metadata=_field(values, "metadata"), **late)


def _field(values: pulumi.Output[Manifest], field: str) -> pulumi.Output[Any]:
    def pick(obj: Manifest) -> Any:
        return obj[field]

    return values.apply(pick)
