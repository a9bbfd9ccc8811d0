"""Warren's own services as rendered workloads (manifests/warren-system.yaml.j2): what the
configuration decides, what never appears in rendered output, and that the Secrets the
workloads read are exactly the ones the install Job makes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from warren_control import install

from warren.config import ConfigError, parse_config
from warren.render import render, render_text

Obj = dict[str, Any]
SYSTEM = "warren-system"


def workloads(services: dict[str, Any] | None = None) -> list[Obj]:
    config = parse_config({"services": {"enabled": True, **(services or {})}})
    return [o for o in render(config) if o["metadata"].get("namespace") == SYSTEM and o["kind"] != "Role"]


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod_specs(objects: list[Obj]) -> Iterator[tuple[str, Obj]]:
    for obj in objects:
        if obj["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}:
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def system_kinds(config: dict[str, Any]) -> set[str]:
    return {o["kind"] for o in render(parse_config(config)) if o["metadata"].get("namespace") == SYSTEM}


def test_on_by_default_and_off_leaves_nothing_running_in_warren_system() -> None:
    assert {"Deployment", "DaemonSet", "StatefulSet", "Job"} <= system_kinds({})
    assert system_kinds({"services": {"enabled": False}}) <= {"ServiceAccount", "Role", "RoleBinding"}


def test_images_pinned_by_digest_run_exactly_that_manifest() -> None:
    digest = "sha256:" + "ab" * 32
    objects = workloads({"image_digests": {"warren-blockd": digest}})
    images = {c["image"] for _, spec in pod_specs(objects) for c in containers(spec)}
    assert f"warren.dev/warren-blockd:0.1.0@{digest}" in images
    assert "warren.dev/warren-control:0.1.0" in images  # not pinned: the tag alone


@pytest.mark.parametrize(
    ("digests", "named_key"),
    [
        ({"warren-blockd": "sha256:abc"}, "is not a digest"),
        ({"warren-blockd": "md5:" + "ab" * 32}, "is not a digest"),
        ({"busybox": "sha256:" + "ab" * 32}, "is not one of Warren's images"),
    ],
)
def test_a_bad_image_digest_is_refused_by_name(digests: dict[str, str], named_key: str) -> None:
    with pytest.raises(ConfigError, match=r"services\.image_digests") as refused:
        parse_config({"services": {"image_digests": digests}})
    assert named_key in str(refused.value)


def test_every_pod_template_selects_its_own_labels() -> None:
    for obj in workloads():
        if obj["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}:
            wanted = obj["spec"]["selector"]["matchLabels"]
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert wanted.items() <= labels.items(), obj["metadata"]["name"]
        if obj["kind"] == "Service":  # exactly one workload's pods: the one it is named for
            targets = [
                o["metadata"]["name"]
                for o in workloads()
                if o["kind"] in {"Deployment", "StatefulSet", "DaemonSet"}
                and obj["spec"]["selector"].items() <= o["spec"]["template"]["metadata"]["labels"].items()
            ]
            assert targets == [obj["metadata"]["name"]]


def test_images_and_replicas_come_from_the_configuration() -> None:
    objects = workloads(
        {
            "image_registry": "registry.example.com:5000/warren",
            "image_tag": "1.2.3",
            "control_replicas": 3,
            "image_pull_policy": "Always",
        }
    )
    assert named(objects, "Deployment", "warren-control")["spec"]["replicas"] == 3
    for name, spec in pod_specs(objects):
        for container in containers(spec):
            assert container["image"].startswith("registry.example.com:5000/warren/"), name
            assert container["image"].endswith(":1.2.3"), name
            assert container["imagePullPolicy"] == "Always", name
    assert named(objects, "Job", "warren-install-1-2-3")


def test_no_secret_value_is_rendered() -> None:
    """Secrets are made on the cluster: no Secret object, no literal credential, every
    credential read from a Secret the install Job makes (embedded) or checks for (external)."""
    for stores, made in (
        (
            "embedded",
            {
                "warren-stamp-key",
                "warren-secrets-key",
                "warren-blockd-bind",
                "warren-postgres",
                "warren-database",
                "warren-object-store",
            },
        ),
        ("external", {"warren-stamp-key", "warren-secrets-key", "warren-blockd-bind", *install.EXTERNAL}),
    ):
        extra = {"object_store_endpoint": "https://s3.example.com"} if stores == "external" else {}
        objects = workloads({"stores": stores, **extra})
        assert not [o for o in objects if o["kind"] == "Secret"]
        read = set()
        for _, spec in pod_specs(objects):
            for container in containers(spec):
                for env in container.get("env", []):
                    assert "value" not in env or env["name"] in {
                        "POD_NAME",
                        "PYTHONUNBUFFERED",
                        "PGDATA",
                        "POSTGRES_PASSWORD_FILE",
                    }, env
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        read.add(ref["name"])
            read |= {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
        assert read == made, stores
    for text in render_text(parse_config({"services": {"enabled": True}})).values():
        assert "AWS_SECRET_ACCESS_KEY:" not in text and "password:" not in text


def test_only_blockd_is_privileged_and_the_rest_is_restricted() -> None:
    for name, spec in pod_specs(workloads()):
        for container in spec["containers"]:
            context = container.get("securityContext", {})
            if name == "warren-blockd":
                assert context == {"privileged": True}
                continue
            assert context["runAsNonRoot"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
    blockd = named(workloads(), "DaemonSet", "warren-blockd")["spec"]["template"]["spec"]
    assert blockd["automountServiceAccountToken"] is False
    for container in blockd["containers"]:
        (kubelet,) = [m for m in container["volumeMounts"] if m["name"] == "kubelet"]
        # The workspace mounts made in the pod must reach the kubelet's pod directories.
        assert kubelet["mountPropagation"] == "Bidirectional"


def test_blockd_runs_where_sandboxes_run() -> None:
    spec = named(
        workloads({"sandbox_node_selector": {"warren.dev/sandboxes": "yes"}}), "DaemonSet", "warren-blockd"
    )
    assert spec["spec"]["template"]["spec"]["nodeSelector"] == {"warren.dev/sandboxes": "yes"}
    assert "nodeSelector" not in named(workloads(), "DaemonSet", "warren-blockd")["spec"]["template"]["spec"]


def test_blockd_rolls_by_handoff_beside_the_old_pod() -> None:
    daemonset = named(workloads(), "DaemonSet", "warren-blockd")
    # The new pod starts beside the old one and takes its workspaces over; none goes first.
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    spec = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (blockd,) = [c for c in spec["containers"] if c["name"] == "blockd"]
    mounts = {m["name"]: m["mountPath"] for m in blockd["volumeMounts"]}
    args = blockd["args"]
    # The handoff socket is in the directory every pod of the DaemonSet shares on the node.
    (handoff,) = [a.split("=", 1)[1] for a in args if a.startswith("--handoff-socket=")]
    assert volumes["run"]["hostPath"]["path"] == "/run/warren/blockd"
    assert handoff.startswith(mounts["run"] + "/")
    assert "--after-handoff=wait" in args  # an exit would restart the container and take over back
    # Ready only when this pod's own daemon answers: the ready file is in the pod's own
    # directory, and the probe compares it with what answers on the shared socket.
    (ready,) = [a.split("=", 1)[1] for a in args if a.startswith("--ready-file=")]
    (own,) = [name for name, path in mounts.items() if ready.startswith(path + "/")]
    assert "emptyDir" in volumes[own] and "hostPath" not in volumes[own]
    probe = blockd["readinessProbe"]["exec"]["command"]
    assert "probe" in probe and f"--ready-file={ready}" in probe
    # Liveness asks whoever answers: a handed-over daemon stays alive until its pod goes.
    assert "stats" in blockd["livenessProbe"]["exec"]["command"]


def test_the_control_plane_leads_by_lease_and_reaches_the_stores() -> None:
    deployment = named(workloads(), "Deployment", "warren-control")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert "--leader-election" in args and f"--lease-namespace={SYSTEM}" in args
    assert "--workspace-store-endpoint=http://warren-objects.warren-system.svc:8333" in args
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    budget = named(workloads(), "PodDisruptionBudget", "warren-control")
    assert budget["spec"] == {"minAvailable": 1, "selector": deployment["spec"]["selector"]}
    single = named(workloads({"control_replicas": 1}), "PodDisruptionBudget", "warren-control")
    assert single["spec"]["maxUnavailable"] == 1
    external = workloads({"stores": "external", "object_store_endpoint": "https://s3.example.com"})
    assert not [o for o in external if o["kind"] == "StatefulSet"]
    (container,) = named(external, "Deployment", "warren-control")["spec"]["template"]["spec"]["containers"]
    assert "--workspace-store-endpoint=https://s3.example.com" in container["args"]


def test_the_edge_serves_the_sandbox_domain_with_the_operator_s_certificate() -> None:
    (plain,) = named(workloads(), "Deployment", "warren-control")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in plain["args"] if a.startswith(("--sandbox-domain", "--tls-"))]
    deployment = named(
        workloads({"sandbox_domain": "Sandboxes.Example.com.", "edge_tls_secret": "warren-edge-tls"}),
        "Deployment",
        "warren-control",
    )
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert "--sandbox-domain=sandboxes.example.com" in container["args"]
    assert {"--tls-cert=/etc/warren/tls/tls.crt", "--tls-key=/etc/warren/tls/tls.key"} <= set(
        container["args"]
    )
    assert {"name": "edge-tls", "mountPath": "/etc/warren/tls", "readOnly": True} in container["volumeMounts"]
    volume = next(v for v in spec["volumes"] if v["name"] == "edge-tls")
    assert volume["secret"]["secretName"] == "warren-edge-tls"


def test_the_lease_role_is_in_warren_system_only() -> None:
    (role,) = [
        o for o in render(parse_config({})) if o["kind"] == "Role" and "lease" in o["metadata"]["name"]
    ]
    assert role["metadata"]["namespace"] == SYSTEM
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]


@pytest.mark.parametrize(
    ("services", "named_key"),
    [
        ({"image_registry": "Registry With Spaces"}, "services.image_registry"),
        ({"image_tag": "-bad"}, "services.image_tag"),
        ({"control_replicas": 0}, "services.control_replicas"),
        (
            {"object_store_endpoint": "https://s3.example.com"},
            "object_store_endpoint is for stores: external",
        ),
        ({"stores_host_path": "relative/dir"}, "services.stores_host_path"),
        ({"sandbox_node_selector": {"bad key!": "x"}}, "services.sandbox_node_selector"),
        ({"sandbox_domain": "localhost"}, "services.sandbox_domain"),
        ({"sandbox_domain": "bad_name.example.com"}, "services.sandbox_domain"),
        ({"edge_tls_secret": "Not/A/Name"}, "services.edge_tls_secret"),
        ({"gateway_cluster_ip": "10.96.0"}, "services.gateway_cluster_ip"),
        ({"gateway_trusted_ca": "not a certificate"}, "services.gateway_trusted_ca"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(services: dict[str, Any], named_key: str) -> None:
    with pytest.raises(ConfigError, match=named_key.replace(".", r"\.")):
        parse_config({"services": services})


def test_a_sandbox_namespace_cannot_be_the_privileged_one() -> None:
    with pytest.raises(ConfigError, match="warren-system"):
        parse_config({"isolation": {"extra_namespaces": ["warren-system"]}})


def test_the_controller_reserves_the_configured_share_of_each_sandbox() -> None:
    control = named(workloads({"sandbox_cpu_request_percent": 5}), "Deployment", "warren-control")
    args = control["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--cpu-request-percent=5" in args and "--memory-request-percent=10" in args
    with pytest.raises(ConfigError, match=r"services\.sandbox_memory_request_percent"):
        parse_config({"services": {"sandbox_memory_request_percent": 0}})


def test_a_rebuilt_control_image_gets_an_install_job_of_its_own() -> None:
    """A Job's pod template cannot change: a new warren-control digest under the same tag
    must name a new Job, or applying it is refused."""

    def job(services: dict[str, Any]) -> str:
        (found,) = [o["metadata"]["name"] for o in workloads(services) if o["kind"] == "Job"]
        return found

    first, second = ("sha256:" + digit * 64 for digit in "ab")
    assert job({}) == "warren-install-0-1-0"
    pinned = job({"image_digests": {"warren-control": first}})
    assert pinned == "warren-install-0-1-0-aaaaaaaaaa"
    assert job({"image_digests": {"warren-control": second}}) != pinned
    long_tag = job({"image_tag": "v" + "9" * 127, "image_digests": {"warren-control": first}})
    assert len(long_tag) <= 63 and not long_tag.endswith("-"), long_tag


def test_a_pool_per_configured_template_and_the_control_plane_names_it() -> None:
    config = parse_config({"services": {"pools": {"base": {"size": 5, "refill_per_second": 3}}}})
    (pool,) = [o for o in render(config) if o["kind"] == "SandboxPool"]
    assert pool["metadata"] == {**pool["metadata"], "name": "base", "namespace": "warren-sandboxes"}
    control = named(workloads({"pools": {"base": {}}}), "Deployment", "warren-control")
    args = control["spec"]["template"]["spec"]["containers"][0]["args"]
    # The pool's pods are what a create of the template asks for: its image, its size and
    # a new workspace of the API's default size.
    base = next(a for a in args if a.startswith("--template=base=")).split("=", 2)[2]
    assert pool["spec"] == {
        "image": base,
        "resources": {"cpu": "1", "memory": "1Gi"},
        "workspace": {"size": "10Gi"},
        "size": 5,
        "refillPerSecond": 3.0,
    }
    assert "--pool=base" in args
    assert f"--agent-in-image={base}" in args  # the base image carries the agent's layer
    none = parse_config({"services": {"pools": {}}})
    assert not [o for o in render(none) if o["kind"] == "SandboxPool"]
    assert (
        "--pool=base"
        not in named(workloads({"pools": {}}), "Deployment", "warren-control")["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
    )
    with pytest.raises(ConfigError, match=r"no template 'big' to keep a pool of: name one of base"):
        parse_config({"services": {"pools": {"big": {}}}})
    with pytest.raises(ConfigError, match=r"services\.pools\.base\.size"):
        parse_config({"services": {"pools": {"base": {"size": -1}}}})


def test_resume_slots_for_a_template_are_a_resume_pool_of_its_shape() -> None:
    """`resumes: N` renders <template>-resumes: the template's image and size, no workspace
    of its own (the paused sandbox's is bound at the claim), and the control plane told
    where the nodes keep memory images, which each slot's restore path names."""
    config = parse_config({"services": {"pools": {"base": {"size": 1, "resumes": 2}}}})
    pools = {o["metadata"]["name"]: o for o in render(config) if o["kind"] == "SandboxPool"}
    assert set(pools) == {"base", "base-resumes"}
    resume = pools["base-resumes"]["spec"]
    assert resume["resume"] is True and resume["size"] == 2 and "workspace" not in resume
    assert {k: resume[k] for k in ("image", "resources")} == {
        k: pools["base"]["spec"][k] for k in ("image", "resources")
    }
    control = named(workloads({"pools": {"base": {"resumes": 2}}}), "Deployment", "warren-control")
    args = control["spec"]["template"]["spec"]["containers"][0]["args"]
    state = config.services.blockd_state_host_path
    assert f"--memory-images-dir={state}/images" in args
    blockd = named(workloads({}), "DaemonSet", "warren-blockd")
    assert f"--host-state-dir={state}" in blockd["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [
        o
        for o in render(parse_config({"services": {"pools": {"base": {}}}}))
        if o.get("spec", {}).get("resume")
    ]
    with pytest.raises(ConfigError, match=r"services\.pools\.base\.resumes"):
        parse_config({"services": {"pools": {"base": {"resumes": -1}}}})


def test_the_egress_gateway_runs_on_every_sandbox_node_and_keeps_traffic_there() -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    selector = {"warren.dev/sandboxes": "true"}
    objects = workloads(
        {"gateway_cluster_ip": "10.96.0.11", "gateway_trusted_ca": ca, "sandbox_node_selector": selector}
    )
    service = named(objects, "Service", "warren-gateway")
    assert service["spec"]["clusterIP"] == "10.96.0.11"
    # On the sandbox's own node: the gateway sees the pod's own address, never a node's.
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["ports"] == [{"name": "gateway", "port": 8090, "targetPort": "gateway"}]
    assert named(objects, "ConfigMap", "warren-gateway-ca")["data"] == {"ca.crt": ca}
    gateway = named(objects, "DaemonSet", "warren-gateway")["spec"]["template"]["spec"]
    assert gateway["nodeSelector"] == selector and gateway["serviceAccountName"] == "warren-gateway"
    (container,) = gateway["containers"]
    assert {
        "--role=gateway",
        "--port=8090",
        "--secrets-key-file=/etc/warren/secrets/key",
        "--gateway-ca-file=/etc/warren/gateway-ca/ca.crt",
    } <= set(container["args"])
    assert {
        "name": "WARREN_GATEWAY_NODE",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    } in container["env"]
    (control,) = named(objects, "Deployment", "warren-control")["spec"]["template"]["spec"]["containers"]
    assert {
        "--secrets-key-file=/etc/warren/secrets/key",
        "--gateway-url=http://warren-gateway.warren-system.svc:8090",
    } <= set(control["args"])
    # Off: no gateway, nothing of it in the control pods, secrets refused by the API.
    off = workloads({"gateway": False})
    gone = {"DaemonSet", "Service", "ConfigMap"}
    assert not [o for o in off if o["kind"] in gone and o["metadata"]["name"].startswith("warren-gateway")]
    (control,) = named(off, "Deployment", "warren-control")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in control["args"] if "gateway" in a or "secrets" in a]
