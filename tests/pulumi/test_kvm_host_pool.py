"""KvmHostPool: metal, private, IMDSv2 with one hop, encrypted, no ingress from the internet."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Recorder
from warren_components import ForkdHost, IngressFrom, KvmHostPool, KvmHostPoolArgs
from warren_components.forkd_user_data import UNIT_PATH

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ROLE_TEMPLATE = Path(__file__).resolve().parents[2] / "roles/forkd/templates/warren-forkd.service.j2"


def args(**overrides: Any) -> KvmHostPoolArgs:
    values: dict[str, Any] = {"vpc_id": "vpc-1", "subnet_ids": ["subnet-a", "subnet-b"], "ami_id": "ami-1"}
    return KvmHostPoolArgs(**{**values, **overrides})


@pytest.fixture
def pool(run: Callable[..., Recorder]) -> Recorder:
    return run(lambda: KvmHostPool("kvm", args(ingress=[IngressFrom("sg-nodes", 7070, "forkd")])))


def test_hosts_get_no_public_address(pool: Recorder) -> None:
    interfaces = pool.one(LAUNCH_TEMPLATE).inputs["networkInterfaces"]
    assert [i["associatePublicIpAddress"] for i in interfaces] == ["false"]


def test_metadata_needs_imdsv2_with_one_hop(pool: Recorder) -> None:
    options = pool.one(LAUNCH_TEMPLATE).inputs["metadataOptions"]
    assert options["httpTokens"] == "required"
    assert options["httpPutResponseHopLimit"] == 1


def test_volumes_are_encrypted(pool: Recorder) -> None:
    mappings = pool.one(LAUNCH_TEMPLATE).inputs["blockDeviceMappings"]
    assert mappings and all(m["ebs"]["encrypted"] == "true" for m in mappings)


def test_metal_hosts_in_the_given_private_subnets(pool: Recorder) -> None:
    template = pool.one(LAUNCH_TEMPLATE)
    assert template.inputs["instanceType"] == "c7i.metal-24xl"
    group = pool.one("aws:autoscaling/group:Group").inputs
    assert group["vpcZoneIdentifiers"] == ["subnet-a", "subnet-b"]
    assert group["launchTemplate"]["id"] == template.resource_id


def test_no_ingress_from_the_internet_only_from_named_groups(pool: Recorder) -> None:
    group = pool.one("aws:ec2/securityGroup:SecurityGroup")
    assert not group.inputs.get("ingress")
    assert pool.one(LAUNCH_TEMPLATE).inputs["networkInterfaces"][0]["securityGroups"] == [group.resource_id]
    rules = [r.inputs for r in pool.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")]
    assert rules == [
        {
            "securityGroupId": group.resource_id,
            "referencedSecurityGroupId": "sg-nodes",
            "ipProtocol": "tcp",
            "fromPort": 7070,
            "toPort": 7070,
            "description": "forkd",
        }
    ]


def test_no_ingress_at_all_by_default(run: Callable[..., Recorder]) -> None:
    recorder = run(lambda: KvmHostPool("kvm", args()))
    assert not recorder.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"instance_type": "c7i.24xlarge"}, "bare-metal"),
        ({"min_size": 2, "desired_size": 1}, "min <= desired"),
    ],
)
def test_bad_args_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        args(**overrides)


def user_data(recorder: Recorder) -> str:
    return base64.b64decode(recorder.one(LAUNCH_TEMPLATE).inputs["userData"]).decode()


def written_unit(script: str) -> str:
    start = script.index(f"cat > {UNIT_PATH} <<UNIT\n") + len(f"cat > {UNIT_PATH} <<UNIT\n")
    return script[start : script.index("\nUNIT\n", start)]


def role_unit(values: dict[str, str]) -> str:
    """The Ansible role's template with these values (its one `{% if %}` taken as true)."""
    lines = [line for line in ROLE_TEMPLATE.read_text().splitlines() if not line.startswith("{%")]
    return re.sub(r"\{\{ (\w+) \}\}", lambda m: values[m.group(1)], "\n".join(lines))


def settings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_hosts_install_and_start_forkd_from_the_bundle(pool: Recorder) -> None:
    script = user_data(pool)
    assert script.startswith("#!/bin/bash\n")
    assert 'file:$bundle/debs ./" > /etc/apt/warren-bundle.list' in script
    assert "qemu-system-x86 qemu-utils busybox-static e2fsprogs gcc" in script
    assert (
        '--no-index --find-links "$bundle/wheels" -r "$bundle/wheels/requirements-warren-forkd.txt"' in script
    )
    assert "systemctl enable --now warren-forkd.service" in script
    assert "/run/warren/forkd/api.sock" in script and "/healthz" in script
    # A metal pool asks for KVM and stops the script when /dev/kvm does not open.
    assert "accel=kvm" in script and "accel=tcg" not in script
    assert "/dev/kvm does not open read-write" in script


def test_the_unit_is_the_ansible_roles(pool: Recorder) -> None:
    unit = written_unit(user_data(pool))
    assert "Environment=WARREN_FORKD_ACCEL=${accel}" in unit
    assert "Environment=WARREN_FORKD_KERNEL_DEBS=/opt/warren/bundle/debs" in unit
    expected = role_unit(
        {
            "forkd_env": "/opt/warren/forkd",
            "forkd_socket": "/run/warren/forkd/api.sock",
            "forkd_state_dir": "/var/lib/warren/forkd",
            "forkd_accel_resolved": "${accel}",
            "forkd_cache_dir": "/var/cache/warren/forkd",
            "forkd_kernel_debs_dir": "/opt/warren/bundle/debs",
        }
    )
    assert settings(unit) == settings(expected)


def test_auto_falls_back_to_tcg(run: Callable[..., Recorder]) -> None:
    script = user_data(run(lambda: KvmHostPool("kvm", args(forkd=ForkdHost(accel="auto")))))
    assert "then accel=kvm; else accel=tcg;" in script


def test_own_user_data_runs_after_forkd_or_alone(run: Callable[..., Recorder]) -> None:
    mine = "#!/bin/sh\necho mine\n"
    both = user_data(run(lambda: KvmHostPool("kvm", args(user_data=mine))))
    assert both.startswith("MIME-Version: 1.0\n")
    assert both.index("warren-forkd.service") < both.index("echo mine")
    assert both.count("Content-Type: text/x-shellscript") == 2
    alone = user_data(run(lambda: KvmHostPool("kvm", args(forkd=None, user_data=mine))))
    assert alone == mine
    assert "userData" not in run(lambda: KvmHostPool("kvm", args(forkd=None))).one(LAUNCH_TEMPLATE).inputs


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"accel": "hvf"}, "auto, kvm or tcg"),
        ({"socket": "relative.sock"}, "absolute path"),
        ({"env": "/opt/$x"}, "absolute path"),
    ],
)
def test_bad_forkd_settings_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ForkdHost(**overrides)
