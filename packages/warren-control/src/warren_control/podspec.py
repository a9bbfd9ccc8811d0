"""The one pod a Sandbox becomes: built here, as a pure function of the Sandbox object, so
the controller, the tests and a dry run against the admission floor all see the same pod.

The pod meets every rule of the floor (docs/isolation-floor.md) by construction; the
floor stays the enforcement, this module only avoids being refused by it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes.utils.quantity import parse_quantity

Obj = dict[str, Any]

GROUP = "warren.dev"
VERSION = "v1alpha1"
PLURAL = "sandboxes"
KIND = "Sandbox"
POOL_PLURAL = "sandboxpools"
POOL_KIND = "SandboxPool"

# The floors key on the namespace label; the pod carries the same label so a selector
# over pods (NetworkPolicy, kubectl) can say "sandbox pods" without knowing namespaces.
SANDBOX_LABEL = "warren.dev/sandbox"
SANDBOX_UID_LABEL = "warren.dev/sandbox-uid"
SANDBOX_NAME_LABEL = "warren.dev/sandbox-name"
# On a pod that only proves a Sandbox's memory image restores: the Sandbox's uid.
VERIFIES_LABEL = "warren.dev/verifies"
# The workspace a pod mounts: forks find their parent's pod (and node) by it.
WORKSPACE_LABEL = "warren.dev/workspace"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "warren-control"
SPEC_HASH_ANNOTATION = "warren.dev/spec-hash"
# A pool's pods carry its name until one is claimed; a claimed pod says which pool it came
# from. A pool pod is claimed once, by one Sandbox, and goes with it: never back to a pool.
POOL_LABEL = "warren.dev/pool"
CLAIMED_FROM_ANNOTATION = "warren.dev/claimed-from"
# Why the API named no pool for a Sandbox its template's pool would have served (its
# organization's cap): the controller says so in PoolClaimed instead of "no pool".
POOL_SKIPPED_ANNOTATION = "warren.dev/pool-skipped"
POOL_POD_PREFIX = "pool-"
# On each child of a fork into more than one: how many children the fork makes. The node's
# warren-blockd then serves their forks with one freeze of the source (volume attribute and
# bind field `siblings`).
FORK_SIBLINGS_ANNOTATION = "warren.dev/fork-siblings"
MAX_FORK_SIBLINGS = 100  # the API's largest fork (api/shapes.py MAX_FORK)
# On the pods of a pool whose workspaces are bound at the claim (spec.workspace.bindAtClaim):
# such a pod runs only HOLD_CONTAINER until its claim binds the workspace and adds the
# sandbox's own container (CONTAINER) as an ephemeral container, which alone mounts it.
BIND_AT_CLAIM_ANNOTATION = "warren.dev/bind-at-claim"
HOLD_CONTAINER = "warren-hold"
# On a bindAtClaim pool pod whose own sandbox container already runs (PodOptions.bind_in_place):
# the claim binds the workspace at /workspace of that container's root file system and
# claims its agent; nothing is started. The volume it mounts (HOLD_MOUNT, HostToContainer)
# is only what makes kubelet publish it and containerd make the root file system rslave.
BIND_IN_PLACE_ANNOTATION = "warren.dev/bind-in-place"
HOLD_MOUNT = "/.warren-claim"
# runsc's root overlay keeps a container's writes to its root file system in the sandbox:
# a workspace mounted beneath it on the host would be seen, but written only in the overlay.
GVISOR_OVERLAY_ANNOTATION = "dev.gvisor.flag.overlay2"
DEFAULT_POOL_REFILL_PER_SECOND = 10
# The controller's finalizer: it keeps a Sandbox until its pod has stopped. The API creates
# Sandboxes with it already in place, which saves the controller a write per create.
FINALIZER = "warren.dev/controller"

# On a pod made to resume a sandbox from its memory image: runsc restores every container of
# the pod from this directory on the node instead of starting it (gVisor patch 0003; the
# runtime passes dev.gvisor.* pod annotations on).
RESTORE_ANNOTATION = "dev.gvisor.internal.restore.image-path"
# On the pods of a resume pool (spec.resume): each is made ahead with its restore path naming
# a directory no image is in yet (SLOT_PREFIX and its own name, under the nodes' memory image
# directory), and its root container waits in `runsc start` up to RESTORE_WAIT_S for one to
# appear there (gVisor patch 0003). A resume claims it, binds the sandbox's workspace to its
# awaiting volume, then has warren-blockd put the staged image at that path: the pod restores
# without being made, scheduled or given a sandbox and network at the resume.
RESUME_SLOT_ANNOTATION = "warren.dev/resume-slot"
RESTORE_WAIT_ANNOTATION = "dev.gvisor.internal.restore.wait-seconds"
SLOT_PREFIX = "slot-"
# Well under kubelet's 4-minute limit on making a pod's sandbox. A wait that ends starts the
# slot's containers afresh (no longer a slot), so the controller renews an unclaimed slot
# before then (RESUME_SLOT_RENEW_S), releasing the old one (warren-blockd's /v1/release).
RESTORE_WAIT_S = 100
RESUME_SLOT_RENEW_S = 80.0

CONTAINER = "sandbox"
# The agent (agent/ in the repository) reaches every sandbox the same way, whatever its image:
# an init container of the agent's own image copies the static binary into a small volume,
# the sandbox's container mounts it read-only, and a postStart hook starts it there, in the
# sandbox's own filesystem and processes, as the image's user. No hostPath, nothing asked of
# the image (not even a libc), and the image's own command runs as it would without it.
AGENT_CONTAINER = "warren-agent"
AGENT_VOLUME = "warren-agent"
AGENT_DIR = "/.warren"
AGENT_IN_IMAGE = "/warren/agent"
AGENT_PORT = 49983
WORKSPACE_VOLUME = "workspace"
WORKSPACE_MOUNT = "/workspace"
POD_NAME_PREFIX = "sbx-"
SANDBOX_HOSTNAME = "sandbox"
LABEL_VALUE_MAX = 63

# Workspace volume sources that hold no host state: the blockd CSI driver (inline, and
# the floor limits inline CSI to allowed drivers) or a claim. hostPath is refused by the
# floor; emptyDir is not refused but would silently lose the workspace on every restart.
WORKSPACE_SOURCES = frozenset({"csi", "persistentVolumeClaim", "ephemeral"})

PullPolicy = Literal["Always", "IfNotPresent", "Never"]

BLOCKD_DRIVER = "blockd.warren.dev"
DEFAULT_WORKSPACE_SIZE = "10Gi"


class SandboxSpecError(ValueError):
    """The Sandbox cannot become a pod; the message names the field and what to do."""


@dataclass(frozen=True)
class PodOptions:
    """What the deployment decides rather than the Sandbox: the runtime class the floor
    requires, where images come from, and the resources a spec that names none gets."""

    runtime_class: str = "gvisor"
    image_pull_policy: PullPolicy = "IfNotPresent"
    # The agent's image (warren.dev/agent:<version>); None: sandboxes get no agent, and
    # exec and files go through Kubernetes exec alone.
    agent_image: str | None = None
    # Images built with the agent's layer (the base template's): their sandboxes start the
    # agent from the image itself, with no init container to copy it in, which spares a pod's
    # start one wait for the kubelet to see that container end (up to its relist, a second).
    agent_in_images: frozenset[str] = frozenset()
    default_cpu: str = "1"
    default_memory: str = "1Gi"
    # What a sandbox reserves on its node, as a share of its size (its limits). 100 for both:
    # requests equal limits, the Guaranteed class. Less: an idle sandbox reserves about what
    # it uses, so a node holds many, and a busy one can still use all of its size while the
    # node has it (under memory pressure, sandboxes above their requests are evicted first).
    cpu_request_percent: int = 100
    memory_request_percent: int = 100
    # Whether the nodes' warren-blockd can bind a workspace beneath a running container's
    # root file system (`services.containerd_state_host_path`): bindAtClaim pool pods then
    # run the sandbox's own container from the start, and a claim starts no container.
    bind_in_place: bool = False
    # Where each node's warren-blockd keeps memory images, as the host has it
    # (`services.blockd_state_host_path`/images): a resume pool's pods wait for theirs there.
    # None: no resume pool can be kept.
    memory_images_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_request_percent", "memory_request_percent"):
            value = getattr(self, name)
            if not 1 <= value <= 100:  # noqa: PLR2004
                raise ValueError(f"{name} is {value}: give a share from 1 to 100")

    # Long enough for a process to flush the workspace on SIGTERM, short enough that stop
    # and delete stay quick.
    termination_grace_seconds: int = 5


def pod_name(sandbox_uid: str) -> str:
    """The pod's name, a function of the Sandbox's uid only: a restarted controller (or the
    API, for exec) finds the pod without a lookup, a create that raced a crash meets
    AlreadyExists instead of making a second pod, and a Sandbox recreated under the same
    name never adopts its predecessor's pod."""
    if not sandbox_uid:
        raise SandboxSpecError("the Sandbox has no metadata.uid: build pods from objects the API returned")
    return POD_NAME_PREFIX + sandbox_uid.lower()


def _quantity(value: object, field: str, default: str) -> str:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise SandboxSpecError(
            f"spec.resources.{field} must be an integer or a quantity string, not {value!r}"
        )
    text = str(value).strip()
    if not text:
        raise SandboxSpecError(f"spec.resources.{field} is empty: give a quantity such as 1 or 512Mi")
    return text


def _percent(reservation: Mapping[str, Any], key: str, default: int) -> int:
    value = reservation.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:  # noqa: PLR2004
        raise SandboxSpecError(f"spec.reservation.{key} is {value!r}: give a whole percent from 1 to 100")
    return value


def _share(quantity: str, field: str, percent: int) -> str:
    """`percent` of a quantity, rounded up to a whole millicore or MiB (at least one);
    the quantity itself at 100."""
    if percent == 100:  # noqa: PLR2004
        return quantity
    try:
        amount = parse_quantity(quantity)  # type: ignore[no-untyped-call]  # the client ships no annotations here
    except ValueError:
        raise SandboxSpecError(
            f"spec.resources.{field} is {quantity!r}, not a quantity: give one such as 500m or 512Mi"
        ) from None
    if field == "cpu":
        return f"{max(1, math.ceil(amount * 1000 * percent / 100))}m"
    return f"{max(1, math.ceil(amount * percent / 100 / 2**20))}Mi"


def spec_hash(sandbox: Mapping[str, Any]) -> str:
    """A digest of the spec fields the pod is built from. A change means the running pod is
    stale and must be replaced; fields that do not reach the pod (stopped, persistent,
    timeouts) and the controller's own defaults are left out, so neither toggling stop
    nor upgrading the controller restarts a sandbox."""
    spec = sandbox.get("spec") or {}
    relevant = {key: spec.get(key) for key in ("image", "command", "resources", "workspace")}
    # Only when set, so sandboxes made before these fields existed keep their hash.
    for key in ("env", "agentTokenSha256", "reservation"):
        if spec.get(key):
            relevant[key] = spec[key]
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def owner_reference(sandbox: Mapping[str, Any]) -> Obj:
    meta = sandbox["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        # The garbage collector removes the pod if the Sandbox ever goes without the
        # finalizer having run, and foreground deletion waits for the pod.
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels_for(sandbox: Mapping[str, Any]) -> dict[str, str]:
    meta = sandbox["metadata"]
    labels = {
        SANDBOX_LABEL: "true",
        SANDBOX_UID_LABEL: meta["uid"],
        MANAGED_BY_LABEL: MANAGED_BY,
    }
    workspace = (sandbox.get("spec") or {}).get("workspace") or {}
    if workspace.get("id") and len(str(workspace["id"])) <= LABEL_VALUE_MAX:
        labels[WORKSPACE_LABEL] = str(workspace["id"])
    # Object names may be longer than a label value; the uid label is the reliable key.
    if len(meta["name"]) <= LABEL_VALUE_MAX:
        labels[SANDBOX_NAME_LABEL] = meta["name"]
    return labels


def _mount_workspace(pod_spec: Obj, container: Obj, volume: Mapping[str, Any]) -> None:
    kinds = set(volume) - {"name"}
    if len(kinds) != 1 or not kinds <= WORKSPACE_SOURCES:
        allowed = ", ".join(sorted(WORKSPACE_SOURCES))
        raise SandboxSpecError(
            f"workspace volume must have exactly one source among {allowed}; got {sorted(kinds)}"
        )
    pod_spec["volumes"] = [{**volume, "name": WORKSPACE_VOLUME}]
    container["volumeMounts"] = [{"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_MOUNT}]
    container["workingDir"] = WORKSPACE_MOUNT


def sandbox_workspace_id(sandbox: Mapping[str, Any]) -> str | None:
    """The workspace id the Sandbox's spec holds, or None (no workspace, or not bound yet)."""
    found = ((sandbox.get("spec") or {}).get("workspace") or {}).get("id")
    return str(found) if found else None


def unbound(sandbox: Mapping[str, Any]) -> bool:
    """Whether the Sandbox asks for a workspace whose id is not chosen yet: a new, empty one,
    bound by the controller to the workspace of the pool pod it claims, or to a new id when
    it starts cold (then `spec.workspace.id` holds it for good, as a PersistentVolumeClaim
    holds its volume)."""
    workspace = (sandbox.get("spec") or {}).get("workspace")
    return isinstance(workspace, Mapping) and not workspace.get("id") and not workspace.get("forkOf")


def with_workspace_id(sandbox: Mapping[str, Any], workspace_id: str) -> Obj:
    """The Sandbox as it is once its workspace is bound to `workspace_id`."""
    spec = dict(sandbox.get("spec") or {})
    spec["workspace"] = {**(spec.get("workspace") or {}), "id": workspace_id}
    return {**sandbox, "spec": spec}


def pod_workspace_id(pod: Mapping[str, Any]) -> str | None:
    """The blockd workspace the pod mounts, or None."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        csi = volume.get("csi") or {}
        if volume.get("name") == WORKSPACE_VOLUME and csi.get("driver") == BLOCKD_DRIVER:
            found = (csi.get("volumeAttributes") or {}).get("workspace")
            return str(found) if found else None
    return None


def pod_for(
    sandbox: Mapping[str, Any],
    *,
    options: PodOptions = PodOptions(),  # frozen, so one shared default is safe
    workspace_volume: Mapping[str, Any] | None = None,
    node: str | None = None,
) -> Obj:
    """The pod manifest for a Sandbox object as the API server returns it.

    `workspace_volume` is a pod volume source for the sandbox's workspace (the blockd CSI
    driver); it is mounted at /workspace. Without one the pod has no workspace volume at
    all rather than a stand-in that would lose data. `node` pins the pod to one node: a
    fork's child runs where its parent's workspace is mounted, so the fork sees every
    write the parent made and the child starts on warm chunks.
    """
    meta = sandbox.get("metadata") or {}
    spec = sandbox.get("spec") or {}
    if not meta.get("name") or not meta.get("namespace"):
        raise SandboxSpecError("the Sandbox needs metadata.name and metadata.namespace")
    container = _container(spec, options)
    pod_spec = _pod_spec(container, options, node)
    if workspace_volume is not None:
        _mount_workspace(pod_spec, container, workspace_volume)
    token_sha256 = spec.get("agentTokenSha256")
    if options.agent_image and token_sha256:
        _add_agent(pod_spec, container, options, ["-access-token-sha256", str(token_sha256)])

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(str(meta.get("uid") or "")),
            "namespace": meta["namespace"],
            "labels": labels_for(sandbox),
            "annotations": {SPEC_HASH_ANNOTATION: spec_hash(sandbox)},
            "ownerReferences": [owner_reference(sandbox)],
        },
        "spec": pod_spec,
    }


def sandbox_pod_name(sandbox: Mapping[str, Any]) -> str:
    """The name of the Sandbox's pod: the pool pod it claimed (its status says which), or
    the one named for its uid."""
    claimed = (sandbox.get("status") or {}).get("podName")
    return str(claimed) if claimed else pod_name(str((sandbox.get("metadata") or {}).get("uid") or ""))


# What of a SandboxPool's spec its pods are built from.
POOL_POD_FIELDS = ("image", "command", "resources", "reservation")


def pool_hash(pool: Mapping[str, Any]) -> str:
    """A digest of what a pool's pods are built from: a change replaces its unclaimed pods."""
    spec = pool.get("spec") or {}
    relevant = {key: spec.get(key) for key in ("image", "command", "resources")}
    for key in ("reservation", "workspace", "resume"):  # only when set, so older pools keep their pods
        if spec.get(key):
            relevant[key] = spec[key]
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def pool_size(pool: Mapping[str, Any]) -> int:
    return max(0, int((pool.get("spec") or {}).get("size") or 0))


def pool_refill_per_second(pool: Mapping[str, Any]) -> float:
    rate = (pool.get("spec") or {}).get("refillPerSecond") or DEFAULT_POOL_REFILL_PER_SECOND
    return max(0.1, float(rate))


def pool_pod_for(
    pool: Mapping[str, Any],
    *,
    name: str,
    claim_sha256: str,
    options: PodOptions = PodOptions(),
    workspace: tuple[str, Mapping[str, Any]] | None = None,
) -> Obj:
    """A pod a SandboxPool keeps ready: built as a Sandbox's pod is from the pool's image,
    command and size, so a Sandbox asking for the same gets exactly the pod it would have
    been given; owned by the pool until a Sandbox claims it (claim_patch). Its agent (with
    an agent image) starts unclaimed: the one POST /claim whose token has `claim_sha256`
    as its SHA-256 gives it the claiming Sandbox's access token and environment.
    `workspace` is (id, volume source) of the new, empty workspace it mounts, which the
    claiming Sandbox is bound to."""
    meta = pool.get("metadata") or {}
    if not meta.get("name") or not meta.get("namespace") or not meta.get("uid"):
        raise SandboxSpecError("the SandboxPool needs metadata.name, .namespace and .uid")
    spec = pool.get("spec") or {}
    container = _container({key: spec.get(key) for key in POOL_POD_FIELDS}, options)
    labels = {SANDBOX_LABEL: "true", MANAGED_BY_LABEL: MANAGED_BY, POOL_LABEL: meta["name"]}
    annotations = {SPEC_HASH_ANNOTATION: pool_hash(pool)}
    if resumes(pool):
        pod_spec = _slot_pod_spec(container, options, claim_sha256)
        annotations[RESUME_SLOT_ANNOTATION] = "true"
        annotations[RESTORE_ANNOTATION] = slot_path(options, name)
        annotations[RESTORE_WAIT_ANNOTATION] = str(RESTORE_WAIT_S)
    elif binds_at_claim(pool) and options.bind_in_place:
        pod_spec = _in_place_pod_spec(container, options, claim_sha256)
        annotations[BIND_IN_PLACE_ANNOTATION] = "true"
        annotations[GVISOR_OVERLAY_ANNOTATION] = "none"
    elif binds_at_claim(pool):
        pod_spec = _holding_pod_spec(container, options)
        annotations[BIND_AT_CLAIM_ANNOTATION] = "true"
    else:
        pod_spec = _pod_spec(container, options, None)
        if workspace is not None:
            _mount_workspace(pod_spec, container, workspace[1])
            labels[WORKSPACE_LABEL] = workspace[0]
        if options.agent_image:
            _add_agent(pod_spec, container, options, ["-claim-token-sha256", claim_sha256])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": POOL_KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": pod_spec,
    }


def resumes(pool: Mapping[str, Any]) -> bool:
    """Whether the pool keeps resume slots: pods a paused sandbox of its image, command and
    size is restored into (RESUME_SLOT_ANNOTATION), rather than pods a create claims."""
    return bool((pool.get("spec") or {}).get("resume"))


def slot_path(options: PodOptions, pod: str) -> str:
    """Where on its node the resume slot `pod` waits for its image."""
    if not options.memory_images_dir:
        raise SandboxSpecError(
            "a resume pool needs the nodes' memory image directory (--memory-images-dir, "
            "warren-blockd's state directory on the host followed by /images)"
        )
    return f"{options.memory_images_dir.rstrip('/')}/{SLOT_PREFIX}{pod}"


def _slot_pod_spec(container: Obj, options: PodOptions, claim_sha256: str) -> Obj:
    """A resume slot's pod: the sandbox's pod as pod_for makes it for a Sandbox of the
    pool's image, command and size (what a restore checks against the captured one, the
    environment aside), its workspace volume published empty for the bind at the claim,
    and its agent started unclaimed by the postStart hook once the restore is done."""
    if not options.agent_image or not starts_agent(container["image"], options.agent_in_images):
        raise SandboxSpecError(
            "a resume pool needs an image with the agent in it (the base template's), as memory capture does"
        )
    pod_spec = _pod_spec(container, options, None)
    bind_at_claim = {"csi": {"driver": BLOCKD_DRIVER, "volumeAttributes": {"bindAtClaim": "true"}}}
    _mount_workspace(pod_spec, container, bind_at_claim)
    _add_agent(pod_spec, container, options, ["-claim-token-sha256", claim_sha256])
    return pod_spec


def resume_misfit(sandbox: Mapping[str, Any], pool: Mapping[str, Any], options: PodOptions) -> str | None:
    """Why the paused Sandbox cannot resume in a slot of this pool, or None: a resume pool of
    its image, command and size (its environment is the restored processes' own, and its
    agent takes it at the claim). Its workspace is bound at the claim, whatever its size."""
    if not resumes(pool):
        return f"pool {(pool.get('metadata') or {}).get('name')} keeps no resume slots"
    return pool_misfit(sandbox, pool, options)


def binds_at_claim(pool: Mapping[str, Any]) -> bool:
    """Whether the pool's pods take their workspace at the claim (a fork's child, say)."""
    return bool(((pool.get("spec") or {}).get("workspace") or {}).get("bindAtClaim"))


def _holding_pod_spec(container: Obj, options: PodOptions) -> Obj:
    """A bindAtClaim pool pod: its gVisor sandbox started, its network set up, and nothing
    of any sandbox in it. It runs only the agent's binary holding the sandbox up (with the
    size and reservation the claiming Sandbox's container would have), and a workspace
    volume published empty. Under gVisor a container's gofer serves the mounts that existed
    when it started, so the workspace bound at the claim reaches only the sandbox's
    container started after it (ephemeral_container_for), never this one."""
    if not options.agent_image:
        raise SandboxSpecError(
            "a pool whose workspaces are bound at the claim needs the agent (--agent-image)"
        )
    hold: Obj = {
        "name": HOLD_CONTAINER,
        "image": options.agent_image,
        "imagePullPolicy": options.image_pull_policy,
        "command": [AGENT_IN_IMAGE, "-hold"],
        # Kubelet publishes only the volumes some container mounts. This one's view is the
        # empty directory it starts with, whatever is bound there later.
        "volumeMounts": [{"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_MOUNT, "readOnly": True}],
        "resources": container["resources"],
        "securityContext": container["securityContext"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec = _pod_spec(hold, options, None)
    pod_spec["volumes"] = [
        {
            "name": WORKSPACE_VOLUME,
            "csi": {"driver": BLOCKD_DRIVER, "volumeAttributes": {"bindAtClaim": "true"}},
        }
    ]
    if not starts_agent(container["image"], options.agent_in_images):
        _add_agent_volume(pod_spec, container, options)
    return pod_spec


def _in_place_pod_spec(container: Obj, options: PodOptions, claim_sha256: str) -> Obj:
    """A bindAtClaim pool pod that is the sandbox's pod from the start: the template's
    container holding it up (the agent's `-hold`, since the image's own command must not
    run before there is a workspace), its agent started unclaimed beside that, and the
    workspace volume published empty at HOLD_MOUNT. Nothing in it looks at /workspace
    before the claim: under gVisor a path looked up once (even found missing) can stay
    what the sandbox saw then, and the claim mounts the workspace there from the host."""
    if not options.agent_image:
        raise SandboxSpecError(
            "a pool whose workspaces are bound at the claim needs the agent (--agent-image)"
        )
    pod_spec = _pod_spec(container, options, None)
    _add_agent(pod_spec, container, options, ["-claim-token-sha256", claim_sha256])
    in_image = starts_agent(container["image"], options.agent_in_images)
    container["command"] = [AGENT_IN_IMAGE if in_image else f"{AGENT_DIR}/agent", "-hold"]
    container["workingDir"] = "/"
    container.setdefault("volumeMounts", []).append(
        {
            "name": WORKSPACE_VOLUME,
            "mountPath": HOLD_MOUNT,
            "readOnly": True,
            "mountPropagation": "HostToContainer",
        }
    )
    pod_spec.setdefault("volumes", []).append(
        {
            "name": WORKSPACE_VOLUME,
            "csi": {"driver": BLOCKD_DRIVER, "volumeAttributes": {"bindAtClaim": "true"}},
        }
    )
    return pod_spec


def binds_in_place(pod: Mapping[str, Any]) -> bool:
    """Whether a claim of this pool pod binds its workspace beneath its running container."""
    return bool((pod["metadata"].get("annotations") or {}).get(BIND_IN_PLACE_ANNOTATION))


def sandbox_container_id(pod: Mapping[str, Any]) -> str | None:
    """The runtime's id of the pod's running sandbox container (without containerd://)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER and "running" in (status.get("state") or {}):
            return str(status.get("containerID") or "").partition("://")[2] or None
    return None


def ephemeral_container_for(sandbox: Mapping[str, Any], options: PodOptions) -> Obj:
    """The Sandbox's own container, added to the bindAtClaim pool pod it claimed once its
    workspace is bound there: its image and environment, /workspace, and the agent as its
    process (an ephemeral container has no postStart hook), serving the Sandbox's token.
    Its size is the pod's, which the holding container reserved."""
    spec = sandbox.get("spec") or {}
    container = _container(spec, options)
    token_sha256 = spec.get("agentTokenSha256")
    if not token_sha256:
        raise SandboxSpecError("a sandbox started in a bindAtClaim pool pod needs its agent token")
    in_image = starts_agent(container["image"], options.agent_in_images)
    agent = AGENT_IN_IMAGE if in_image else f"{AGENT_DIR}/agent"
    mounts: list[Obj] = [{"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_MOUNT}]
    if agent != AGENT_IN_IMAGE:
        mounts.append({"name": AGENT_VOLUME, "mountPath": AGENT_DIR, "readOnly": True})
    ephemeral: Obj = {
        "name": CONTAINER,
        "image": container["image"],
        "imagePullPolicy": container["imagePullPolicy"],
        "command": [agent, "-port", str(AGENT_PORT), "-access-token-sha256", str(token_sha256)],
        "workingDir": WORKSPACE_MOUNT,
        "volumeMounts": mounts,
        "securityContext": container["securityContext"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if "env" in container:
        ephemeral["env"] = container["env"]
    return ephemeral


def pool_pod_name(pool: str, suffix: str) -> str:
    """A pool pod's name: the pool's (cut short) and a random suffix."""
    return f"{POOL_POD_PREFIX}{pool[:40]}-{suffix}"


def pool_misfit(
    sandbox: Mapping[str, Any], pool: Mapping[str, Any], options: PodOptions, *, workspaces: bool = False
) -> str | None:
    """Why the Sandbox cannot take a pod of this pool, or None if its own pod would be the
    same pod. With `workspaces` (the controller mounts them), a pool whose spec names a
    workspace size gives each pod a new, empty workspace of it: only a Sandbox asking for a
    new, empty workspace of that size (unbound) fits, and one with none fits only a pool
    without. Its agent takes the Sandbox's token and environment at the claim (for the
    processes it starts); without an agent, the environment is the container's, so it
    must match."""
    spec = sandbox.get("spec") or {}
    name = (pool.get("metadata") or {}).get("name")
    if workspaces and (misfit := _workspace_misfit(sandbox, pool)):
        return misfit
    if options.agent_image:
        spec = {key: value for key, value in spec.items() if key != "env"}
    pool_spec = pool.get("spec") or {}
    try:
        wanted = _container(spec, options)
        offered = _container({key: pool_spec.get(key) for key in POOL_POD_FIELDS}, options)
    except SandboxSpecError as exc:
        return str(exc)
    for key, label in (("image", "image"), ("command", "command"), ("env", "env")):
        if wanted.get(key) != offered.get(key):
            return f"this sandbox's {label} differs from pool {name}'s"
    wanted_amounts, offered_amounts = _amounts(wanted["resources"]), _amounts(offered["resources"])
    if wanted_amounts["limits"] != offered_amounts["limits"]:
        return f"this sandbox's size differs from pool {name}'s"
    if wanted_amounts["requests"] != offered_amounts["requests"]:
        return f"this sandbox's reservation (its organization's share of its size) differs from pool {name}'s"
    return None


def _workspace_misfit(sandbox: Mapping[str, Any], pool: Mapping[str, Any]) -> str | None:
    wanted = (sandbox.get("spec") or {}).get("workspace")
    offered = (pool.get("spec") or {}).get("workspace")
    name = (pool.get("metadata") or {}).get("name")
    if not wanted:
        return f"pool {name}'s pods have a workspace and this sandbox has none" if offered else None
    if not offered:
        return f"pool {name}'s pods have no workspace and this sandbox has one"
    if offered.get("bindAtClaim"):
        return _bind_at_claim_misfit(sandbox, pool)
    if wanted.get("forkOf") or wanted.get("id"):
        made = "is a fork" if wanted.get("forkOf") else "is already made"
        return f"this sandbox's workspace {made} and pool {name}'s pods have new, empty ones"
    if not _same_size(wanted, offered):
        return f"this sandbox's workspace size differs from pool {name}'s"
    return None


def _bind_at_claim_misfit(sandbox: Mapping[str, Any], pool: Mapping[str, Any]) -> str | None:
    """A pool whose pods take a named workspace at the claim (a fork's, say) of its size, and
    start the agent as the sandbox's process (its image's own command does not run)."""
    spec = sandbox.get("spec") or {}
    name = (pool.get("metadata") or {}).get("name")
    if spec.get("command"):
        return f"this sandbox runs its own command and pool {name}'s pods start only the agent"
    if not spec["workspace"].get("id"):
        return f"pool {name}'s pods bind a named workspace and this sandbox's is not named yet"
    if not _same_size(spec["workspace"], (pool.get("spec") or {})["workspace"]):
        return f"this sandbox's workspace size differs from pool {name}'s"
    return None


def _same_size(wanted: Mapping[str, Any], offered: Mapping[str, Any]) -> bool:
    sizes = [parse_quantity(str(w.get("size") or DEFAULT_WORKSPACE_SIZE)) for w in (wanted, offered)]  # type: ignore[no-untyped-call]
    return bool(sizes[0] == sizes[1])


def _amounts(resources: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, object]]:
    """Requests and limits as numbers: 1 and 1000m are one size."""
    return {
        kind: {k: parse_quantity(v) for k, v in amounts.items()}  # type: ignore[no-untyped-call]
        for kind, amounts in resources.items()
    }


def claim_patch(
    sandbox: Mapping[str, Any], pod: Mapping[str, Any], pool: str, *, guarded: bool = True
) -> Obj:
    """The merge patch that hands a ready pool pod to a Sandbox: the Sandbox's labels and
    owner, the pool's label gone. `guarded`: applied only to the version of the pod that was
    chosen (its resourceVersion in the patch), so two claims of one pod cannot both succeed;
    unguarded where an earlier write already took the pod that way."""
    labels: dict[str, str | None] = dict(labels_for(sandbox))
    labels[POOL_LABEL] = None  # a merge patch's null removes it
    return {
        "metadata": {
            **({"resourceVersion": pod["metadata"]["resourceVersion"]} if guarded else {}),
            "labels": labels,
            "annotations": {SPEC_HASH_ANNOTATION: spec_hash(sandbox), CLAIMED_FROM_ANNOTATION: pool},
            # A list is replaced whole by a merge patch: the pool's reference goes.
            "ownerReferences": [owner_reference(sandbox)],
        }
    }


def _container(spec: Mapping[str, Any], options: PodOptions) -> Obj:
    """The sandbox's own container: its image, command, size and environment, checked."""
    image = spec.get("image")
    if not isinstance(image, str) or not image:
        raise SandboxSpecError("spec.image is required: name the OCI image the sandbox runs")
    command = spec.get("command")
    if command is not None and (
        not isinstance(command, list) or not all(isinstance(arg, str) for arg in command)
    ):
        raise SandboxSpecError("spec.command must be a list of strings")

    resources = spec.get("resources") or {}
    cpu = _quantity(resources.get("cpu"), "cpu", options.default_cpu)
    memory = _quantity(resources.get("memory"), "memory", options.default_memory)
    # The size is the limit: a sandbox never takes more than that. What it reserves is a
    # share of it: its organization's (spec.reservation), else the deployment's (PodOptions).
    amounts = {"cpu": cpu, "memory": memory}
    reservation = spec.get("reservation") or {}
    requests = {
        "cpu": _share(cpu, "cpu", _percent(reservation, "cpuPercent", options.cpu_request_percent)),
        "memory": _share(
            memory, "memory", _percent(reservation, "memoryPercent", options.memory_request_percent)
        ),
    }

    container: Obj = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": options.image_pull_policy,
        "resources": {"requests": requests, "limits": dict(amounts)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            # Nothing is added (the floor refuses that); everything is dropped, which also
            # satisfies the restricted Pod Security level the namespaces warn about.
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if command:
        container["command"] = list(command)
    env = spec.get("env")
    if env is not None and (
        not isinstance(env, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise SandboxSpecError("spec.env must map variable names to string values")
    if env:
        container["env"] = [{"name": name, "value": env[name]} for name in sorted(env)]
    return container


def _pod_spec(container: Obj, options: PodOptions, node: str | None) -> Obj:
    """The pod around the container: its runtime class, and nothing of the host or the cluster
    handed in."""
    pod_spec: Obj = {
        "runtimeClassName": options.runtime_class,
        # Otherwise the pod's name is the hostname (/etc/hostname, $HOSTNAME), and a client
        # must never learn the cluster's names for its sandbox.
        "hostname": SANDBOX_HOSTNAME,
        "automountServiceAccountToken": False,
        # Service links would hand every sandbox the addresses of the namespace's services.
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": options.termination_grace_seconds,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        # Sandboxes spread over the nodes: a node lost takes fewer of them, and each node's
        # warren-blockd serves fewer workspaces. A preference: never a reason to stay Pending.
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {SANDBOX_LABEL: "true"}},
            }
        ],
    }
    if node is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        pod_spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return pod_spec


def starts_agent(image: str, agent_in_images: frozenset[str]) -> bool:
    """Whether `image` is one of the images built with the agent's layer, named as given or
    by its tag alone where they are pinned by digest (warren.dev/base:0.1.0 for
    warren.dev/base:0.1.0@sha256:...)."""
    return image in agent_in_images or any(pinned.split("@", 1)[0] == image for pinned in agent_in_images)


def _add_agent(pod_spec: Obj, container: Obj, options: PodOptions, auth: list[str]) -> None:
    """The agent, delivered into the sandbox's container (see AGENT_CONTAINER), with the
    arguments that say how it knows its caller (`auth`); started from the image where it is
    one of options.agent_in_images."""
    if starts_agent(container["image"], options.agent_in_images):
        start = [AGENT_IN_IMAGE, "-detach", "-port", str(AGENT_PORT), *auth]
        container["lifecycle"] = {"postStart": {"exec": {"command": start}}}
        return
    _add_agent_volume(pod_spec, container, options)
    container.setdefault("volumeMounts", []).append(
        {"name": AGENT_VOLUME, "mountPath": AGENT_DIR, "readOnly": True}
    )
    # -detach returns once the agent answers, so the container counts as started only with
    # its agent up (a failure restarts the container, and says why in its events).
    start = [f"{AGENT_DIR}/agent", "-detach", "-port", str(AGENT_PORT), *auth]
    container["lifecycle"] = {"postStart": {"exec": {"command": start}}}


def _add_agent_volume(pod_spec: Obj, container: Obj, options: PodOptions) -> None:
    """The agent's binary copied by an init container into a small volume of the pod."""
    pod_spec.setdefault("volumes", []).append(
        # In memory and small: it holds one static binary, and nothing of it outlives the pod.
        {"name": AGENT_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}
    )
    pod_spec["initContainers"] = [
        {
            "name": AGENT_CONTAINER,
            "image": options.agent_image,
            "imagePullPolicy": options.image_pull_policy,
            "command": [AGENT_IN_IMAGE, "-install", AGENT_DIR],
            "volumeMounts": [{"name": AGENT_VOLUME, "mountPath": AGENT_DIR}],
            "resources": {
                "requests": {"cpu": "10m", "memory": "32Mi"},
                "limits": {"cpu": "500m", "memory": "64Mi"},
            },
            "securityContext": container["securityContext"],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
    ]


def restored_from(pod: Obj, image_path: str) -> Obj:
    """`pod` (as pod_for makes it) restored from the memory image staged at `image_path` on
    its node: the image's processes come back as they were. Processes the runtime started
    with an exec (the agent, from its postStart hook) are not among them, so the hook runs
    again and starts a fresh agent. Only a pod whose containers all ran when it was captured
    can be restored: an init container would be started again."""
    notes = pod["metadata"].get("annotations") or {}
    if notes.get(BIND_AT_CLAIM_ANNOTATION) or notes.get(BIND_IN_PLACE_ANNOTATION):
        # A restore rebuilds the pod as pod_for makes it, with /workspace a volume; this
        # one's workspace was bound into it at the claim, which a restore cannot redo.
        raise SandboxSpecError(
            "memory capture is not supported for a sandbox started in a fork pool's pod (its "
            "workspace was bound into that pod at the claim): stop it without memory capture"
        )
    if (pod.get("spec") or {}).get("initContainers"):
        raise SandboxSpecError(
            "memory capture needs an image with the agent in it (the base template's): "
            "this sandbox's agent is copied in by an init container"
        )
    restored = copy.deepcopy(pod)
    restored["metadata"].setdefault("annotations", {})[RESTORE_ANNOTATION] = image_path
    return restored


def verify_pod_name(sandbox_uid: str) -> str:
    """The name of the pod that proves a Sandbox's memory image restores."""
    return pod_name(sandbox_uid) + "-verify"


def verifier_of(restored: Obj, sandbox_uid: str) -> Obj:
    """A restored pod (restored_from) made into one that only proves its image restores:
    named apart and without the Sandbox's uid label, so nothing serves it or counts it as
    the Sandbox's pod; still owned by the Sandbox, whose passes its events bring and whose
    deletion takes it. Killed at once when it has proved it: nothing of it is kept."""
    pod = copy.deepcopy(restored)
    pod["metadata"]["name"] = verify_pod_name(sandbox_uid)
    labels = pod["metadata"]["labels"]
    for key in (SANDBOX_UID_LABEL, SANDBOX_NAME_LABEL):
        labels.pop(key, None)
    labels[VERIFIES_LABEL] = sandbox_uid
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return pod


def has_agent(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's sandbox runs the agent: copied in by its init container, or started
    from the image (PodOptions.agent_in_images)."""
    spec = pod.get("spec") or {}
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    if notes.get(BIND_AT_CLAIM_ANNOTATION):
        return True  # its sandbox's container runs the agent (ephemeral_container_for)
    if any(c.get("name") == AGENT_CONTAINER for c in spec.get("initContainers") or []):
        return True
    for container in spec.get("containers") or []:
        if container.get("name") == CONTAINER:
            start = ((container.get("lifecycle") or {}).get("postStart") or {}).get("exec") or {}
            return bool((start.get("command") or [None])[0] == AGENT_IN_IMAGE)
    return False


def blockd_volume(sandbox: Mapping[str, Any]) -> Obj | None:
    """The sandbox's workspace as an inline volume of the blockd CSI driver: the node's
    blockd makes it (new, or a fork of `forkOf` by manifest) on first publish, and
    restores it from object storage on any node after that. None when the Sandbox names
    no workspace."""
    workspace = (sandbox.get("spec") or {}).get("workspace") or {}
    if not workspace.get("id"):
        return None
    attributes = {
        "workspace": str(workspace["id"]),
        "size": str(workspace.get("size") or DEFAULT_WORKSPACE_SIZE),
    }
    if workspace.get("forkOf"):
        attributes["forkOf"] = str(workspace["forkOf"])
        if siblings := fork_siblings(sandbox):
            attributes["siblings"] = str(siblings)
    return {"csi": {"driver": BLOCKD_DRIVER, "volumeAttributes": attributes}}


def fork_siblings(sandbox: Mapping[str, Any]) -> int | None:
    """How many children the fork that made this Sandbox makes, if the API said (more than
    one); None otherwise, or if the annotation is not a count."""
    text = ((sandbox.get("metadata") or {}).get("annotations") or {}).get(FORK_SIBLINGS_ANNOTATION)
    return (
        int(text) if isinstance(text, str) and text.isdigit() and 1 < int(text) <= MAX_FORK_SIBLINGS else None
    )


def pool_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the SandboxPool that owns this unclaimed pod, or None."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == POOL_KIND
            and ref.get("apiVersion", "").startswith(GROUP + "/")
        ):
            return str(ref.get("name")), str(ref.get("uid"))
    return None


def controller_uid(pod: Mapping[str, Any]) -> str | None:
    """The uid of the Sandbox that controls this pod, or None if no Sandbox does."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == KIND
            and ref.get("apiVersion", "").startswith(GROUP + "/")
        ):
            return str(ref.get("uid"))
    return None


def add_request_arguments(parser: Any) -> None:
    """--cpu-request-percent, --memory-request-percent, --agent-image and
    --node-lost-seconds, for every command that runs the controller."""
    parser.add_argument(
        "--agent-image",
        help="controller: the agent's image (warren.dev/agent:<version>), delivered into every "
        "sandbox; without it sandboxes have no agent",
    )
    parser.add_argument(
        "--agent-in-image",
        action="append",
        default=[],
        metavar="IMAGE",
        help="controller: an image built with the agent's layer (the base template's): its "
        "sandboxes start the agent from the image, with no init container (repeatable)",
    )
    parser.add_argument(
        "--node-lost-seconds",
        type=float,
        default=60.0,
        help="controller: a sandbox whose node has not been Ready for this long gets a new pod on another "
        "node",
    )
    for kind in ("cpu", "memory"):
        parser.add_argument(
            f"--{kind}-request-percent",
            type=int,
            choices=range(1, 101),
            metavar="1..100",
            default=100,
            help=f"controller: the share of a sandbox's {kind} its pod reserves (100: all of it)",
        )
