"""The pod a Sandbox becomes: its shape, rule by rule of the admission floor, and the
parts the controller relies on to find it again (name, labels, owner reference)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from warren_control.podspec import (
    FORK_SIBLINGS_ANNOTATION,
    SPEC_HASH_ANNOTATION,
    PodOptions,
    SandboxSpecError,
    blockd_volume,
    controller_uid,
    has_agent,
    pod_for,
    pod_name,
    spec_hash,
)

UID = "3f2a9c1e-7b1d-4c55-9a0e-1d2b3c4d5e6f"


def sandbox(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "s1", "namespace": "warren-sandboxes", "uid": UID, "generation": 1},
        "spec": {"image": "busybox:stable", **spec},
    }


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return spec["containers"] + spec.get("initContainers", []) + spec.get("ephemeralContainers", [])


def floor_violations(pod: dict[str, Any]) -> list[str]:
    """The rules of manifests/admission-sandbox-pods.yaml.j2, read the same way (the
    cluster test proves the real policy admits these pods)."""
    spec = pod["spec"]
    broken = []
    if spec.get("runtimeClassName") != "gvisor":
        broken.append("runtime-class")
    broken += [key for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    volumes = spec.get("volumes", [])
    if any("hostPath" in v for v in volumes):
        broken.append("host-path")
    if any(v.get("csi", {}).get("driver", "blockd.warren.dev") != "blockd.warren.dev" for v in volumes):
        broken.append("csi-driver")
    if spec.get("automountServiceAccountToken") is not False:
        broken.append("service-account-token")
    for c in containers(pod):
        sc = c.get("securityContext", {})
        if any(p.get("hostPort") for p in c.get("ports", [])):
            broken.append("host-port")
        if sc.get("privileged"):
            broken.append("privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            broken.append("privilege-escalation")
        if sc.get("capabilities", {}).get("add"):
            broken.append("capabilities")
    return broken


def test_pod_meets_every_rule_of_the_floor() -> None:
    assert floor_violations(pod_for(sandbox())) == []


TOKEN_SHA256 = "ab" * 32
AGENT = PodOptions(agent_image="warren.dev/agent:test")


def test_the_agent_reaches_any_image_through_an_init_container_and_a_post_start_hook() -> None:
    blockd = {"csi": {"driver": "blockd.warren.dev", "volumeAttributes": {"workspace": "ws_a"}}}
    pod = pod_for(sandbox(agentTokenSha256=TOKEN_SHA256), options=AGENT, workspace_volume=blockd)
    assert floor_violations(pod) == []
    spec = pod["spec"]
    (install,) = spec["initContainers"]
    assert install["image"] == "warren.dev/agent:test"
    assert install["command"] == ["/warren/agent", "-install", "/.warren"]
    assert install["securityContext"] == spec["containers"][0]["securityContext"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["warren-agent"] == {
        "name": "warren-agent",
        "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"},
    }
    assert set(volumes) == {"warren-agent", "workspace"}  # no hostPath, the workspace kept
    (container,) = spec["containers"]
    assert {"name": "warren-agent", "mountPath": "/.warren", "readOnly": True} in container["volumeMounts"]
    # The image's own command still runs; the agent starts beside it, with only the token's hash.
    assert "command" not in container
    start = container["lifecycle"]["postStart"]["exec"]["command"]
    assert start == ["/.warren/agent", "-detach", "-port", "49983", "-access-token-sha256", TOKEN_SHA256]


def test_an_image_built_with_the_agent_starts_it_from_itself_with_no_init_container() -> None:
    options = dataclasses.replace(AGENT, agent_in_images=frozenset({"busybox:stable"}))
    pod = pod_for(sandbox(agentTokenSha256=TOKEN_SHA256), options=options)
    assert floor_violations(pod) == []
    assert "initContainers" not in pod["spec"] and "volumes" not in pod["spec"]
    (container,) = pod["spec"]["containers"]
    start = container["lifecycle"]["postStart"]["exec"]["command"]
    assert start == ["/warren/agent", "-detach", "-port", "49983", "-access-token-sha256", TOKEN_SHA256]
    assert has_agent(pod)
    # Another image still gets it copied in; both are pods with an agent, one without is not.
    other = pod_for(sandbox(image="alpine", agentTokenSha256=TOKEN_SHA256), options=options)
    assert [c["name"] for c in other["spec"]["initContainers"]] == ["warren-agent"] and has_agent(other)
    assert not has_agent(pod_for(sandbox(agentTokenSha256=TOKEN_SHA256)))


def test_an_image_pinned_by_digest_is_known_by_its_tag_too() -> None:
    pinned = "warren.dev/base:0.1.0@sha256:" + "a" * 64
    options = dataclasses.replace(AGENT, agent_in_images=frozenset({pinned}))
    for image in (pinned, "warren.dev/base:0.1.0"):
        pod = pod_for(sandbox(image=image, agentTokenSha256=TOKEN_SHA256), options=options)
        assert "initContainers" not in pod["spec"], image
    for image in ("warren.dev/base:0.2.0", "warren.dev/base"):
        pod = pod_for(sandbox(image=image, agentTokenSha256=TOKEN_SHA256), options=options)
        assert "initContainers" in pod["spec"], image


def test_no_agent_without_its_image_or_a_token_hash() -> None:
    for pod in (pod_for(sandbox(agentTokenSha256=TOKEN_SHA256)), pod_for(sandbox(), options=AGENT)):
        assert "initContainers" not in pod["spec"]
        assert "lifecycle" not in pod["spec"]["containers"][0]


def test_exactly_one_container_runs_under_gvisor_without_token_or_host_namespaces() -> None:
    pod = pod_for(sandbox(command=["sleep", "infinity"]))
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"]) == (False, False, False)
    assert spec["restartPolicy"] == "Always"
    assert 0 < spec["terminationGracePeriodSeconds"] <= 10
    assert "volumes" not in spec and "initContainers" not in spec
    (container,) = spec["containers"]
    assert container["image"] == "busybox:stable"
    assert container["command"] == ["sleep", "infinity"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "ports" not in container


def test_image_command_default_is_kept_when_spec_has_none() -> None:
    assert "command" not in pod_for(sandbox())["spec"]["containers"][0]


def test_resources_default_and_requests_equal_limits() -> None:
    resources = pod_for(sandbox())["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def test_resources_from_spec_integers_and_quantities() -> None:
    resources = pod_for(sandbox(resources={"cpu": 2, "memory": "512Mi"}))["spec"]["containers"][0][
        "resources"
    ]
    assert resources["requests"] == resources["limits"] == {"cpu": "2", "memory": "512Mi"}
    only_cpu = pod_for(sandbox(resources={"cpu": "250m"}))["spec"]["containers"][0]["resources"]
    assert only_cpu["limits"] == {"cpu": "250m", "memory": "1Gi"}


@pytest.mark.parametrize(
    ("size", "percents", "requests"),
    [
        ({"cpu": "1", "memory": "1Gi"}, (1, 10), {"cpu": "10m", "memory": "103Mi"}),
        ({"cpu": "100m", "memory": "128Mi"}, (1, 10), {"cpu": "1m", "memory": "13Mi"}),
        ({"cpu": "1500m", "memory": "2G"}, (50, 50), {"cpu": "750m", "memory": "954Mi"}),
        ({"cpu": 2, "memory": "512Mi"}, (100, 100), {"cpu": "2", "memory": "512Mi"}),
    ],
)
def test_a_sandbox_reserves_the_deployments_share_of_its_size(
    size: dict[str, object], percents: tuple[int, int], requests: dict[str, str]
) -> None:
    options = PodOptions(cpu_request_percent=percents[0], memory_request_percent=percents[1])
    resources = pod_for(sandbox(resources=size), options=options)["spec"]["containers"][0]["resources"]
    assert resources["requests"] == requests
    assert resources["limits"] == {"cpu": str(size["cpu"]), "memory": str(size["memory"])}


def test_a_share_of_what_is_not_a_quantity_is_refused_by_name() -> None:
    options = PodOptions(cpu_request_percent=10)
    with pytest.raises(SandboxSpecError, match=r"spec.resources.cpu is 'lots', not a quantity"):
        pod_for(sandbox(resources={"cpu": "lots"}), options=options)
    with pytest.raises(ValueError, match="memory_request_percent is 0"):
        PodOptions(memory_request_percent=0)


def test_an_organizations_reservation_overrides_the_deployments_share() -> None:
    options = PodOptions(cpu_request_percent=1, memory_request_percent=10)
    size = {"cpu": "1", "memory": "1Gi"}
    mine = sandbox(resources=size, reservation={"cpuPercent": 50})
    resources = pod_for(mine, options=options)["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "500m", "memory": "103Mi"}  # memory: the default
    assert spec_hash(mine) != spec_hash(sandbox(resources=size))  # a new share is a new pod
    assert spec_hash(sandbox(resources=size, reservation={})) == spec_hash(sandbox(resources=size))
    for bad in (0, 101, "50", True):
        with pytest.raises(SandboxSpecError, match=r"spec\.reservation\.memoryPercent is .*from 1 to 100"):
            pod_for(sandbox(reservation={"memoryPercent": bad}), options=options)


def test_options_set_runtime_class_pull_policy_and_defaults() -> None:
    options = PodOptions(
        runtime_class="gvisor-kvm", image_pull_policy="Never", default_cpu="500m", default_memory="256Mi"
    )
    pod = pod_for(sandbox(), options=options)
    assert pod["spec"]["runtimeClassName"] == "gvisor-kvm"
    container = pod["spec"]["containers"][0]
    assert container["imagePullPolicy"] == "Never"
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}


def test_name_is_a_function_of_the_uid_only() -> None:
    first = pod_for(sandbox())
    again = pod_for(sandbox(image="other", command=["sh"]))
    assert first["metadata"]["name"] == again["metadata"]["name"] == pod_name(UID) == f"sbx-{UID}"
    other = sandbox()
    other["metadata"]["uid"] = UID.replace("3f", "40")
    assert pod_for(other)["metadata"]["name"] != first["metadata"]["name"]


def test_pod_lives_beside_its_sandbox_and_is_owned_by_it() -> None:
    pod = pod_for(sandbox())
    meta = pod["metadata"]
    assert meta["namespace"] == "warren-sandboxes"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "warren.dev/v1alpha1",
            "kind": "Sandbox",
            "name": "s1",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert controller_uid(pod) == UID


def test_labels_floors_and_controller_key_on() -> None:
    labels = pod_for(sandbox())["metadata"]["labels"]
    assert labels == {
        "warren.dev/sandbox": "true",
        "warren.dev/sandbox-uid": UID,
        "warren.dev/sandbox-name": "s1",
        "app.kubernetes.io/managed-by": "warren-control",
    }


def test_long_sandbox_name_is_left_out_of_labels() -> None:
    long = sandbox()
    long["metadata"]["name"] = "s" * 64
    labels = pod_for(long)["metadata"]["labels"]
    assert "warren.dev/sandbox-name" not in labels
    assert labels["warren.dev/sandbox-uid"] == UID


def test_controller_uid_ignores_other_owners() -> None:
    pod = pod_for(sandbox())
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "u", "controller": True}
    ]
    assert controller_uid(pod) is None
    pod["metadata"]["ownerReferences"] = []
    assert controller_uid(pod) is None


def test_workspace_volume_is_mounted_at_workspace() -> None:
    volume = {"csi": {"driver": "blockd.warren.dev", "volumeAttributes": {"workspace": "ws-1"}}}
    pod = pod_for(sandbox(), workspace_volume=volume)
    assert pod["spec"]["volumes"] == [{"name": "workspace", **volume}]
    container = pod["spec"]["containers"][0]
    assert container["volumeMounts"] == [{"name": "workspace", "mountPath": "/workspace"}]
    assert container["workingDir"] == "/workspace"
    assert floor_violations(pod) == []


@pytest.mark.parametrize(
    "volume",
    [
        {"hostPath": {"path": "/srv/workspaces/ws-1"}},
        {"emptyDir": {}},
        {"csi": {"driver": "blockd.warren.dev"}, "emptyDir": {}},
        {},
    ],
    ids=["hostPath", "emptyDir", "two-sources", "no-source"],
)
def test_workspace_volume_that_holds_host_state_or_loses_data_is_refused(volume: dict[str, Any]) -> None:
    with pytest.raises(SandboxSpecError, match="workspace volume"):
        pod_for(sandbox(), workspace_volume=volume)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"spec": {}}, "spec.image"),
        ({"spec": {"image": ""}}, "spec.image"),
        ({"spec": {"image": "x", "command": "sleep 1"}}, "spec.command"),
        ({"spec": {"image": "x", "env": {"A": 1}}}, "spec.env"),
        ({"spec": {"image": "x", "resources": {"cpu": True}}}, "spec.resources.cpu"),
        ({"spec": {"image": "x", "resources": {"memory": " "}}}, "spec.resources.memory"),
        ({"metadata": {"name": "s1", "namespace": "n"}}, "metadata.uid"),
        ({"metadata": {"uid": UID}}, "metadata.name"),
    ],
)
def test_a_sandbox_that_cannot_become_a_pod_is_refused_with_the_field(
    change: dict[str, Any], match: str
) -> None:
    broken = copy.deepcopy(sandbox())
    broken.update(change)
    with pytest.raises(SandboxSpecError, match=match):
        pod_for(broken)


def test_spec_hash_follows_what_reaches_the_pod_only() -> None:
    base = spec_hash(sandbox())
    assert pod_for(sandbox())["metadata"]["annotations"] == {SPEC_HASH_ANNOTATION: base}
    assert spec_hash(sandbox(stopped=True, persistent=True, idleTimeoutSeconds=600)) == base
    assert spec_hash(sandbox(image="other")) != base
    assert spec_hash(sandbox(command=["sh"])) != base
    assert spec_hash(sandbox(resources={"cpu": 2})) != base
    # Env and the agent's token are part of the pod once set; a Sandbox without them keeps
    # the hash it always had.
    assert spec_hash(sandbox(env={"A": "1"})) != base
    assert spec_hash(sandbox(agentTokenSha256=TOKEN_SHA256)) != base
    assert spec_hash(sandbox(env={})) == base


def test_env_reaches_the_container_in_a_stable_order() -> None:
    pod = pod_for(sandbox(env={"B": "2", "A": "one=1"}))
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "A", "value": "one=1"},
        {"name": "B", "value": "2"},
    ]
    assert "env" not in pod_for(sandbox())["spec"]["containers"][0]


def test_pod_for_does_not_modify_the_sandbox() -> None:
    original = sandbox(command=["sleep", "1"], resources={"cpu": 1})
    before = copy.deepcopy(original)
    pod = pod_for(original)
    pod["spec"]["containers"][0]["command"].append("x")
    assert original == before


def test_the_hostname_names_nothing_of_the_cluster() -> None:
    obj = sandbox()
    pod = pod_for(obj)
    assert pod["spec"]["hostname"] == "sandbox"
    assert obj["metadata"]["uid"] not in pod["spec"]["hostname"]


def test_blockd_workspace_volume_and_fork_placement() -> None:
    plain = sandbox()
    assert blockd_volume(plain) is None
    forked = sandbox(workspace={"id": "ws_child", "size": "1Gi", "forkOf": "ws_parent"})
    volume = blockd_volume(forked)
    assert volume == {
        "csi": {
            "driver": "blockd.warren.dev",
            "volumeAttributes": {"workspace": "ws_child", "size": "1Gi", "forkOf": "ws_parent"},
        }
    }
    pod = pod_for(forked, workspace_volume=volume, node="node-a")
    assert pod["metadata"]["labels"]["warren.dev/workspace"] == "ws_child"
    assert pod["spec"]["volumes"] == [{"name": "workspace", **volume}]
    assert containers(pod)[0]["volumeMounts"] == [{"name": "workspace", "mountPath": "/workspace"}]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-a"]
    assert floor_violations(pod) == []
    # One of a fork into eight says so, for the node to fork the eight with one freeze.
    forked["metadata"]["annotations"] = {FORK_SIBLINGS_ANNOTATION: "8"}
    assert blockd_volume(forked)["csi"]["volumeAttributes"]["siblings"] == "8"
    for unusable in ("1", "x", "101"):
        forked["metadata"]["annotations"] = {FORK_SIBLINGS_ANNOTATION: unusable}
        assert "siblings" not in blockd_volume(forked)["csi"]["volumeAttributes"]


def test_sandboxes_spread_over_the_nodes_as_a_preference_only() -> None:
    pod = pod_for(sandbox())
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    # Scoring only: a sandbox that cannot be spread still starts.
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    # Counted against every sandbox pod, the pools' included (they carry the same label).
    assert spread["labelSelector"] == {"matchLabels": {"warren.dev/sandbox": "true"}}
    assert pod["metadata"]["labels"]["warren.dev/sandbox"] == "true"
