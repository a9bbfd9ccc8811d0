"""Kubernetes: what WarrenPlatform applies keeps sandboxes under gVisor and workloads off the host.

These hold for every stack, `local` included, and need no cloud provider: they read the
Kubernetes objects' inputs as pulumi-kubernetes registers them (camelCase, as in the manifest).
The sandbox pods themselves are created later by the controller, so the admission floor
(manifests/admission-sandbox-pods.yaml.j2) checks those; these rules check what the stack deploys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import PolicyConfigSchema, ResourceValidationArgs

from warren_policy.props import get, is_internet, is_true, items
from warren_policy.rules import resource_rule

RUNTIME_CLASS = "kubernetes:node.k8s.io/v1:RuntimeClass"
NAMESPACE = "kubernetes:core/v1:Namespace"
SERVICE = "kubernetes:core/v1:Service"
# The cloud providers' older way to name the ranges a load balancer admits.
SOURCE_RANGES_ANNOTATION = "service.beta.kubernetes.io/load-balancer-source-ranges"
SANDBOX_LABEL = "warren.dev/sandbox"
PSA = "pod-security.kubernetes.io/"
# warren's config allows either level to be enforced (isolation.pod_security_level).
ENFORCED_LEVELS = ("baseline", "restricted")
# The containerd handler that nodes map to runsc (isolation.runtime_handler's default; the AWS
# nodes' user data registers the same name).
DEFAULT_GVISOR_HANDLERS = ("runsc",)
HANDLER_CONFIG_SCHEMA: dict[str, dict[str, Any]] = {
    "gvisorHandlers": {
        "type": "array",
        "items": {"type": "string"},
        "default": list(DEFAULT_GVISOR_HANDLERS),
        "description": "RuntimeClass handlers that run pods under gVisor.",
    }
}

# Where each workload kind keeps its pod spec.
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "kubernetes:core/v1:Pod": ("spec",),
    "kubernetes:core/v1:PodTemplate": ("template", "spec"),
    "kubernetes:core/v1:ReplicationController": ("spec", "template", "spec"),
    "kubernetes:apps/v1:Deployment": ("spec", "template", "spec"),
    "kubernetes:apps/v1:ReplicaSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:DaemonSet": ("spec", "template", "spec"),
    "kubernetes:batch/v1:Job": ("spec", "template", "spec"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
WORKLOADS = tuple(POD_SPEC_PATHS)
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")

# Warren's own workloads that must reach their node, each granted only what it needs, and
# only in warren-system: warren-blockd serves workspaces (FUSE, loop devices, ext4 mounts
# into the kubelet's pod directories) and ends the gVisor sandboxes a memory capture left
# frozen (their processes, by host PID); the embedded stores keep their data on their node.
SYSTEM_NAMESPACE = "warren-system"
HOST_ACCESS: dict[tuple[str, str], frozenset[str]] = {
    ("kubernetes:apps/v1:DaemonSet", "warren-blockd"): frozenset({"privileged", "hostPath", "hostPID"}),
    ("kubernetes:apps/v1:StatefulSet", "warren-objects"): frozenset({"hostPath"}),
    ("kubernetes:apps/v1:StatefulSet", "warren-postgres"): frozenset({"hostPath"}),
}


def _granted(props: Mapping[str, Any], args: ResourceValidationArgs, access: str) -> bool:
    meta = props.get("metadata") or {}
    if meta.get("namespace") != SYSTEM_NAMESPACE:
        return False
    return access in HOST_ACCESS.get((args.resource_type, str(meta.get("name"))), frozenset())


def _runtime_class_gvisor(props: Mapping[str, Any], args: ResourceValidationArgs) -> list[str]:
    configured = args.get_config().get("gvisorHandlers")
    handlers = list(configured) if configured is not None else list(DEFAULT_GVISOR_HANDLERS)
    handler = props.get("handler")
    if handler in handlers:
        return []
    return [f"handler {handler!r} does not run pods under gVisor (allowed: {', '.join(handlers)})"]


def _sandbox_namespace(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    labels = get(props, "metadata", "labels") or {}
    if labels.get(SANDBOX_LABEL) != "true":
        return []
    messages = []
    enforce = labels.get(f"{PSA}enforce")
    if enforce not in ENFORCED_LEVELS:
        messages.append(f"label {PSA}enforce must be {' or '.join(ENFORCED_LEVELS)}, not {enforce!r}")
    # Warnings and audit entries show what would break under restricted before anyone enforces it.
    for mode in ("warn", "audit"):
        if labels.get(f"{PSA}{mode}") != "restricted":
            messages.append(f"label {PSA}{mode} must be restricted")
    return messages


def pod_spec(resource_type: str, props: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod spec a workload of `resource_type` runs (empty where it has none)."""
    spec = get(props, *POD_SPEC_PATHS[resource_type])
    return spec if isinstance(spec, Mapping) else {}


def containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for key in CONTAINER_LISTS for c in items(spec.get(key)) if isinstance(c, Mapping)]


def _no_privileged(props: Mapping[str, Any], args: ResourceValidationArgs) -> list[str]:
    if _granted(props, args, "privileged"):
        return []
    return [
        f"container {c.get('name')!r} must not be privileged (securityContext.privileged)"
        for c in containers(pod_spec(args.resource_type, props))
        if is_true(get(c, "securityContext", "privileged"))
    ]


def _no_host_namespaces(props: Mapping[str, Any], args: ResourceValidationArgs) -> list[str]:
    spec = pod_spec(args.resource_type, props)
    return [
        f"{field} must not be true (the pod would share the node's namespace)"
        for field in ("hostNetwork", "hostPID", "hostIPC")
        if is_true(spec.get(field)) and not _granted(props, args, field)
    ]


def _no_host_path(props: Mapping[str, Any], args: ResourceValidationArgs) -> list[str]:
    if _granted(props, args, "hostPath"):
        return []
    return [
        f"volume {v.get('name')!r} must not mount a host path"
        for v in items(pod_spec(args.resource_type, props).get("volumes"))
        if isinstance(v, Mapping) and v.get("hostPath") is not None
    ]


def _load_balancer_restricted(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    if get(props, "spec", "type") != "LoadBalancer":
        return []
    ranges = [str(r) for r in items(get(props, "spec", "loadBalancerSourceRanges"))]
    annotation = (get(props, "metadata", "annotations") or {}).get(SOURCE_RANGES_ANNOTATION)
    if annotation:
        ranges += [r.strip() for r in str(annotation).split(",") if r.strip()]
    if not ranges:
        return ["a LoadBalancer Service must name the ranges it admits (spec.loadBalancerSourceRanges)"]
    return [f"load balancer source range {r} admits the whole internet" for r in ranges if is_internet(r)]


POLICIES = [
    resource_rule(
        "k8s-runtime-class-gvisor",
        "Every RuntimeClass the stack creates runs pods under gVisor (handler runsc).",
        (RUNTIME_CLASS,),
        _runtime_class_gvisor,
        config_schema=PolicyConfigSchema(properties=HANDLER_CONFIG_SCHEMA),
    ),
    resource_rule(
        "k8s-sandbox-namespace-pod-security",
        "Sandbox namespaces enforce Pod Security baseline or restricted, and warn and audit restricted.",
        (NAMESPACE,),
        _sandbox_namespace,
    ),
    resource_rule(
        "k8s-no-privileged-containers",
        "No workload runs a privileged container (but warren-blockd's DaemonSet in warren-system).",
        WORKLOADS,
        _no_privileged,
    ),
    resource_rule(
        "k8s-no-host-namespaces",
        "No workload shares the node's network, PID or IPC namespace (but warren-blockd's PID one).",
        WORKLOADS,
        _no_host_namespaces,
    ),
    resource_rule(
        "k8s-load-balancer-restricted",
        "A LoadBalancer Service admits only named ranges, never the whole internet.",
        (SERVICE,),
        _load_balancer_restricted,
    ),
    resource_rule(
        "k8s-no-host-path",
        "No workload mounts a host path (but warren-blockd and the embedded stores in warren-system).",
        WORKLOADS,
        _no_host_path,
    ),
]
