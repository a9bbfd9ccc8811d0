"""WarrenPlatform: the platform's Kubernetes objects on any cluster, through pulumi-kubernetes.

The objects come from the warren package's renderer, the function `warren apply` and the
Ansible path apply, so every install path creates the same objects. Each object becomes one
resource (kubernetes_objects.py) created in warren's apply order, through an explicit provider
in server-side apply mode. In that mode the provider adds no `app.kubernetes.io/managed-by`
label and no last-applied annotation; its only mark is its field manager
(`pulumi-kubernetes-<random>`) in each object's managedFields.

A stack that makes the platform's stores itself (the AWS program) gives what only exists
while it deploys: configuration values known once a resource exists (a generated bucket
name, `deploy_time`), which are validated and rendered then, into the same objects; and the
Secrets the workloads read (`secrets`, e.g. warren-database from the stack's own database),
made in warren-system right after its namespace, so no workload starts before them and no
secret value is in any rendered object or plain output.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pulumi_kubernetes as k8s

import pulumi
from warren_components import kubernetes_objects
from warren_components.kubernetes_objects import Manifest

if TYPE_CHECKING:
    from warren.config import WarrenConfig

SYSTEM_NAMESPACE = "warren-system"  # where the Secrets go (warren.config.SYSTEM_NAMESPACE)
SYSTEM_NAMESPACE_OBJECT = ("v1", "Namespace", SYSTEM_NAMESPACE, None)


@dataclass(frozen=True)
class WarrenPlatformArgs:
    """Where the cluster is and what to put on it.

    kubeconfig: the contents of a kubeconfig, or a path to one (the provider accepts both).
    config_path: a warren configuration file (the one `warren render --config` takes);
        None with no `config` or `objects` renders warren's defaults.
    config: a configuration already read and validated, instead of a file.
    objects: objects already rendered, instead of a configuration.
    deploy_time: configuration keys ("services.bucket") whose values exist only once the
        stack deploys (outputs of other resources); rendered with them then. They must not
        change which objects render, only what the objects say.
    secrets: Secrets to make in warren-system before any workload, name -> key -> value.
    depends_on: what every object waits for (a cluster's nodes and add-ons, the identity
        its pods get).
    """

    kubeconfig: pulumi.Input[str]
    config_path: Path | None = None
    objects: Sequence[Manifest] | None = None
    context: str | None = None  # the kubeconfig context; None: its current context
    config: WarrenConfig | None = None
    deploy_time: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, pulumi.Input[str]]] = field(default_factory=dict)
    depends_on: Sequence[pulumi.Resource] = ()


def _config(args: WarrenPlatformArgs) -> WarrenConfig:
    from warren.config import load_config

    return args.config if args.config is not None else load_config(args.config_path)


def with_values(config: WarrenConfig, values: Mapping[str, Any]) -> WarrenConfig:
    """`config` with dotted keys set ("services.bucket"), validated again as a whole."""
    from warren.config import parse_config

    data = config.model_dump()
    for dotted, value in values.items():
        *sections, key = dotted.split(".")
        target = data
        for section in sections:
            if not isinstance(target.get(section), dict):
                raise ValueError(f"deploy_time: {dotted} names no section of the warren configuration")
            target = target[section]
        if key not in target:
            raise ValueError(f"deploy_time: {dotted} is not a key of the warren configuration")
        target[key] = value
    return parse_config(data)


def _identity(obj: Manifest) -> tuple[str, str, str, str | None]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))


def rendered_objects(args: WarrenPlatformArgs) -> list[Manifest]:
    """The objects to create, in warren's apply order (with deploy-time keys at the values the
    configuration has: which objects they are, not yet all they say)."""
    given = [name for name in ("config_path", "config", "objects") if getattr(args, name) is not None]
    if len(given) > 1:
        raise ValueError(f"WarrenPlatformArgs: give one of config_path, config and objects, not {given}")
    if args.objects is not None:
        if args.deploy_time:
            raise ValueError("WarrenPlatformArgs: deploy_time values need a configuration to render")
        return [copy.deepcopy(dict(obj)) for obj in args.objects]
    # Imported here so that a program passing `objects` does not need the warren package.
    from warren.render import render

    config = _config(args)
    for dotted in args.deploy_time:  # each key named exists, before anything is created
        _current(config, dotted)
    return list(render(config))


def _current(config: WarrenConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not hasattr(value, part):
            raise ValueError(f"deploy_time: {dotted} is not a key of the warren configuration")
        value = getattr(value, part)
    return value


def _nth(objects: pulumi.Output[list[Manifest]], index: int) -> pulumi.Output[Manifest]:
    def pick(values: list[Manifest]) -> Manifest:
        return values[index]

    return objects.apply(pick)


def render_at_deploy(
    config: WarrenConfig, values: Mapping[str, Any], expected: Sequence[Manifest]
) -> list[Manifest]:
    """The objects rendered with the deploy-time values: the same objects as `expected` (their
    kinds, names and order), or a ValueError naming the keys."""
    from warren.render import render

    objects: list[Manifest] = list(render(with_values(config, values)))
    if [_identity(o) for o in objects] != [_identity(o) for o in expected]:
        raise ValueError(
            f"deploy_time values for {', '.join(values)} changed which objects warren renders: "
            "only what the objects say may depend on them"
        )
    return objects


def _render_at_deploy(args: WarrenPlatformArgs, expected: list[Manifest]) -> pulumi.Output[list[Manifest]]:
    """The objects rendered with the deploy-time values, once they are known."""
    config = _config(args)
    keys = list(args.deploy_time)

    def rendered(values: list[Any]) -> list[Manifest]:
        return render_at_deploy(config, dict(zip(keys, values, strict=True)), expected)

    return pulumi.Output.all(*[args.deploy_time[k] for k in keys]).apply(rendered)


class WarrenPlatform(pulumi.ComponentResource):
    """Every object `warren render` produces, created one after another in its order."""

    provider: k8s.Provider
    objects: pulumi.Output[list[str]]
    manifests: list[Manifest]  # as rendered (before deploy-time values)

    def __init__(
        self, name: str, args: WarrenPlatformArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("warren:platform:WarrenPlatform", name, None, opts)
        manifests = rendered_objects(args)
        self.manifests = manifests
        at_deploy = _render_at_deploy(args, manifests) if args.deploy_time else None
        if args.secrets and SYSTEM_NAMESPACE_OBJECT not in {_identity(o) for o in manifests}:
            raise ValueError(f"WarrenPlatformArgs: secrets go to {SYSTEM_NAMESPACE}, which is not rendered")

        self.provider = k8s.Provider(
            f"{name}-cluster",
            kubeconfig=args.kubeconfig,
            context=args.context,
            # Explicit, so neither stack config nor PULUMI_K8S_* variables can switch the provider
            # to client-side apply (which adds a managed-by label and a last-applied annotation).
            enable_server_side_apply=True,
            # Every object goes through this provider, so every object waits for these.
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)),
        )

        # One after another in the rendered order, as `warren apply` does: namespaces and the
        # CRD before what lives in them or names them, a policy before its binding. Deletion
        # runs in reverse.
        previous: pulumi.Resource | None = None
        for index, obj in enumerate(manifests):
            previous = kubernetes_objects.create(
                kubernetes_objects.resource_name(name, obj),
                obj,
                self._after(previous),
                values=_nth(at_deploy, index) if at_deploy is not None else None,
            )
            if _identity(obj) == SYSTEM_NAMESPACE_OBJECT:
                for secret, data in args.secrets.items():
                    previous = self._secret(name, secret, data, previous)

        self.objects = pulumi.Output.from_input([kubernetes_objects.label(obj) for obj in manifests])
        self.register_outputs({"objects": self.objects})

    def _after(self, previous: pulumi.Resource | None) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(
            parent=self, provider=self.provider, depends_on=[previous] if previous is not None else []
        )

    def _secret(
        self, name: str, secret: str, data: Mapping[str, pulumi.Input[str]], previous: pulumi.Resource
    ) -> pulumi.Resource:
        """A Secret the workloads read; its values stay secret in state and in every output."""
        return k8s.core.v1.Secret(
            f"{name}-secret-{SYSTEM_NAMESPACE}-{secret}",
            metadata={
                "name": secret,
                "namespace": SYSTEM_NAMESPACE,
                "labels": {"app.kubernetes.io/part-of": "warren"},
            },
            type="Opaque",
            string_data={key: pulumi.Output.secret(value) for key, value in data.items()},
            opts=self._after(previous),
        )
