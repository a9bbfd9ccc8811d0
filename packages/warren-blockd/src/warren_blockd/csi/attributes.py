"""What a pod may ask for: the volumeAttributes of its inline volume, checked before the
daemon is asked for anything.

  workspace   required: the workspace id
  size        a new empty workspace's size: bytes, or Ki, Mi, Gi, Ti (e.g. 10Gi)
  forkOf      if the workspace does not exist yet, make it a fork of this workspace
  template    the same, from a template workspace (forkOf and template exclude each other)
  siblings    with forkOf: how many children the same fork makes (1 to 100). The node waits
              briefly for the others, so that one freeze of the source serves them all.
  bindAtClaim "true": publish nothing yet. The pod starts with an empty directory there, and
              its workspace is named later through the plugin's bind API (a warm pool's pod,
              claimed by a fork's child); only containers started after the bind see it.
              Excludes the other keys.

Kubelet adds its own keys under `csi.storage.k8s.io/` (the pod's identity, and
`ephemeral: "true"` for an inline volume); any other key is refused, so a misspelt
attribute is an error rather than silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from warren_blockd.csi.errors import CsiError, invalid
from warren_blockd.daemon import MAX_SIBLINGS
from warren_blockd.ids import WORKSPACE_ID_RULE, valid_workspace_id

KUBELET_PREFIX = "csi.storage.k8s.io/"
EPHEMERAL = KUBELET_PREFIX + "ephemeral"
KNOWN = ("workspace", "size", "forkOf", "template", "siblings", "bindAtClaim")
BIND_AT_CLAIM = "bindAtClaim"
BINARY_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
MIN_SIZE = 16 << 20  # the daemon's own floor for an ext4 workspace
# The daemon keeps one bit per 4 KiB block in memory; this bounds that at 512 MiB and
# turns a typo such as 10000Ti into an error rather than a daemon out of memory.
MAX_SIZE = 16 << 40
SIZE = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti)?$")


@dataclass(frozen=True)
class VolumeRequest:
    workspace: str
    size_bytes: int | None
    fork_of: str | None
    template: str | None
    pod_namespace: str
    pod_name: str
    pod_uid: str
    siblings: int | None = None

    @property
    def source(self) -> str | None:
        return self.fork_of or self.template


@dataclass(frozen=True)
class AwaitingClaim:
    """A volume whose workspace is named at the pod's claim (bindAtClaim)."""

    pod_namespace: str
    pod_name: str
    pod_uid: str


def parse_size(text: str) -> int:
    match = SIZE.match(text.strip())
    if not match:
        raise invalid(
            f"volume attribute size={text!r} is not a size: write bytes or a number with Ki, Mi, Gi "
            "or Ti (binary units, e.g. 10Gi)"
        )
    value = int(match.group(1)) * BINARY_UNITS[match.group(2) or ""]
    if value % 4096 or not MIN_SIZE <= value <= MAX_SIZE:
        raise invalid(
            f"volume attribute size={text!r} must be a multiple of 4096 bytes between 16Mi and 16Ti"
        )
    return value


def workspace_id(key: str, value: str) -> str:
    if not valid_workspace_id(value):
        raise invalid(f"volume attribute {key}={value!r} is not a workspace id: use {WORKSPACE_ID_RULE}")
    return value


def parse(context: Mapping[str, str]) -> VolumeRequest | AwaitingClaim:
    """The pod's request from a NodePublishVolume volume_context, or INVALID_ARGUMENT."""
    if context.get(EPHEMERAL) != "true":
        raise invalid(
            f"{EPHEMERAL} is not 'true': blockd.warren.dev serves inline ephemeral volumes only; "
            "name it in the pod's volumes[].csi, and give the CSIDriver object "
            "volumeLifecycleModes: [Ephemeral] and podInfoOnMount: true"
        )
    unknown = sorted(k for k in context if k not in KNOWN and not k.startswith(KUBELET_PREFIX))
    if unknown:
        raise invalid(f"unknown volume attribute(s) {', '.join(unknown)}: use {', '.join(KNOWN)}")
    pod = (
        context.get(KUBELET_PREFIX + "pod.namespace", ""),
        context.get(KUBELET_PREFIX + "pod.name", ""),
        context.get(KUBELET_PREFIX + "pod.uid", ""),
    )
    if BIND_AT_CLAIM in context:
        return _awaiting(context, *pod)
    if not context.get("workspace"):
        raise invalid("volume attribute workspace is missing: name the workspace this volume serves")
    workspace = workspace_id("workspace", context["workspace"])
    fork_of = workspace_id("forkOf", context["forkOf"]) if context.get("forkOf") else None
    template = workspace_id("template", context["template"]) if context.get("template") else None
    if fork_of and template:
        raise invalid("volume attributes forkOf and template exclude each other: give one")
    if workspace in (fork_of, template):
        raise invalid(f"workspace {workspace} cannot be made from itself: change forkOf or template")
    size = parse_size(context["size"]) if context.get("size") else None
    siblings = sibling_count(context["siblings"]) if context.get("siblings") else None
    if siblings is not None and not fork_of:
        raise invalid("volume attribute siblings counts a fork's children: give forkOf too, or drop it")
    return VolumeRequest(
        workspace=workspace,
        size_bytes=size,
        fork_of=fork_of,
        template=template,
        pod_namespace=pod[0],
        pod_name=pod[1],
        pod_uid=pod[2],
        siblings=siblings,
    )


def sibling_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_SIBLINGS:
        raise invalid(
            f"volume attribute siblings={text!r} is not a count of a fork's children: "
            f"write 1 to {MAX_SIBLINGS}"
        )
    return int(text)


def _awaiting(context: Mapping[str, str], namespace: str, name: str, uid: str) -> AwaitingClaim:
    if context[BIND_AT_CLAIM] != "true":
        raise invalid(
            f'volume attribute {BIND_AT_CLAIM}={context[BIND_AT_CLAIM]!r}: write "true" or leave it out'
        )
    others = sorted(k for k in context if k in KNOWN and k != BIND_AT_CLAIM)
    if others:
        raise invalid(
            f"volume attribute {BIND_AT_CLAIM} names the workspace at the claim, so {', '.join(others)} "
            "cannot be given too: drop them, or drop bindAtClaim"
        )
    if not uid:
        raise invalid(
            f"{BIND_AT_CLAIM} needs the pod's uid ({KUBELET_PREFIX}pod.uid), which kubelet sends only "
            "when the CSIDriver object has podInfoOnMount: true"
        )
    return AwaitingClaim(namespace, name, uid)


def missing_size(workspace: str) -> CsiError:
    return invalid(
        f"workspace {workspace} does not exist yet and the volume gives no size: add size (e.g. 10Gi) "
        "to create it empty, or forkOf/template to start from another workspace"
    )
