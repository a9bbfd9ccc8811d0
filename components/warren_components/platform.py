"""WarrenPlatform: the platform's Kubernetes objects on any cluster, through pulumi-kubernetes.

The objects come from the warren package's renderer, the function `warren apply` and the
Ansible path apply, so every install path creates the same objects. Each object becomes one
resource (kubernetes_objects.py) created in warren's apply order, through an explicit provider
in server-side apply mode. In that mode the provider adds no `app.kubernetes.io/managed-by`
label and no last-applied annotation; its only mark is its field manager
(`pulumi-kubernetes-<random>`) in each object's managedFields.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi_kubernetes as k8s

import pulumi
from warren_components import kubernetes_objects
from warren_components.kubernetes_objects import Manifest


@dataclass(frozen=True)
class WarrenPlatformArgs:
    """Where the cluster is and what to put on it.

    kubeconfig: the contents of a kubeconfig, or a path to one (the provider accepts both).
    config_path: a warren configuration file (the one `warren render --config` takes);
        None with no `objects` renders warren's defaults.
    objects: objects already rendered, instead of a configuration.
    """

    kubeconfig: pulumi.Input[str]
    config_path: Path | None = None
    objects: Sequence[Manifest] | None = None
    context: str | None = None  # the kubeconfig context; None: its current context


def rendered_objects(args: WarrenPlatformArgs) -> list[Manifest]:
    """The objects to create, in warren's apply order."""
    if args.objects is not None and args.config_path is not None:
        raise ValueError("WarrenPlatformArgs: give config_path or objects, not both")
    if args.objects is not None:
        return [copy.deepcopy(dict(obj)) for obj in args.objects]
    # Imported here so that a program passing `objects` does not need the warren package.
    from warren.config import load_config
    from warren.render import render

    return list(render(load_config(args.config_path)))


class WarrenPlatform(pulumi.ComponentResource):
    """Every object `warren render` produces, created one after another in its order."""

    provider: k8s.Provider
    objects: pulumi.Output[list[str]]

    def __init__(
        self, name: str, args: WarrenPlatformArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("warren:platform:WarrenPlatform", name, None, opts)
        manifests = rendered_objects(args)

        self.provider = k8s.Provider(
            f"{name}-cluster",
            kubeconfig=args.kubeconfig,
            context=args.context,
            # Explicit, so neither stack config nor PULUMI_K8S_* variables can switch the provider
            # to client-side apply (which adds a managed-by label and a last-applied annotation).
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )

        # One after another in the rendered order, as `warren apply` does: namespaces and the
        # CRD before what lives in them or names them, a policy before its binding. Deletion
        # runs in reverse.
        previous: pulumi.Resource | None = None
        for obj in manifests:
            previous = kubernetes_objects.create(
                kubernetes_objects.resource_name(name, obj),
                obj,
                pulumi.ResourceOptions(
                    parent=self,
                    provider=self.provider,
                    depends_on=[previous] if previous is not None else [],
                ),
            )

        self.objects = pulumi.Output.from_input([kubernetes_objects.label(obj) for obj in manifests])
        self.register_outputs({"objects": self.objects})
