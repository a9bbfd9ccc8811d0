"""Pulumi's mocks for these tests: each test runs a small program and inspects what it registered.

No CLI, no cloud and no cluster: `pulumi.runtime.set_mocks` stands in for the engine, and the
recorder keeps every resource registration (type, name, inputs as the engine would get them).
Outputs a component reads back (ARNs, the cluster's endpoint) get plausible fake values.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pulumi.runtime import rpc

import pulumi

REPO = Path(__file__).resolve().parents[2]
for directory in (REPO / "policy", REPO / "infra"):
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))

SSM_GET_PARAMETER = "aws:ssm/getParameter:getParameter"
SHA_RUNSC = "a" * 64
SHA_SHIM = "b" * 64


def is_secret(value: Any) -> bool:
    """Whether a recorded input was sent as a secret (the engine's wrapper, kept by the mocks)."""
    return isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig


def revealed(value: Any) -> Any:
    """A recorded input with every secret wrapper taken off."""
    if is_secret(value):
        return revealed(value["value"])
    if isinstance(value, dict):
        return {k: revealed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [revealed(v) for v in value]
    return value


def _short(typ: str) -> str:
    return typ.rsplit(":", 1)[-1].lower()


def fake_id(typ: str, name: str) -> str:
    """Ids (and ARNs) name the type too: a subnet and its route table share a logical name."""
    return f"{_short(typ)}-{name}-id"


def fake_arn(typ: str, name: str) -> str:
    return f"arn:aws:mock:::{_short(typ)}/{name}"


@dataclass
class Registered:
    typ: str
    name: str
    inputs: dict[str, Any]
    provider: str | None
    resource_id: str

    @property
    def arn(self) -> str:
        return fake_arn(self.typ, self.name)


def _fake_outputs(typ: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    outputs: dict[str, Any] = {"arn": fake_arn(typ, name), **inputs}
    outputs.setdefault("name", name)
    if typ == "aws:eks/cluster:Cluster":
        outputs["endpoint"] = "https://mock.eks.example"
        outputs["certificateAuthority"] = {"data": "bW9jayBjYQ=="}
        outputs["vpcConfig"] = {**inputs.get("vpcConfig", {}), "clusterSecurityGroupId": "sg-cluster"}
    elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
        outputs["latestVersion"] = 1
    elif typ == "aws:s3/bucket:Bucket":
        outputs["bucket"] = inputs.get("bucket") or f"{name}-generated"
    elif typ == "aws:rds/instance:Instance":
        outputs["address"] = f"{name}.mock.rds.example"
        outputs["port"] = 5432
        outputs["masterUserSecrets"] = [{"secretArn": f"arn:aws:secretsmanager:::{name}"}]
    return outputs


class Recorder(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[Registered] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        resource_id = fake_id(args.typ, args.name)
        self.resources.append(Registered(args.typ, args.name, dict(args.inputs), args.provider, resource_id))
        return resource_id, _fake_outputs(args.typ, args.name, dict(args.inputs))

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        if args.token == SSM_GET_PARAMETER:
            return {"name": args.args.get("name"), "value": "ami-0mock", "type": "String"}, []
        return {}, []

    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.typ == typ]

    def one(self, typ: str) -> Registered:
        found = self.of_type(typ)
        assert len(found) == 1, f"expected one {typ}, found {[r.name for r in found]}"
        return found[0]

    def by_id(self, resource_id: Any) -> Registered:
        found = [r for r in self.resources if r.resource_id == resource_id]
        assert len(found) == 1, f"no single resource with id {resource_id!r}"
        return found[0]


def pytest_configure(config: pytest.Config) -> None:
    # pulumi_aws warns about its own deprecated resource classes whenever it loads their modules
    # (resolving resource references loads them all); none of them is used here.
    config.addinivalue_line("filterwarnings", r"ignore:.* has been deprecated in favor of:DeprecationWarning")


Program = Callable[[], Any]


def run_program(program: Program, stack: str = "test") -> Recorder:
    """Run `program` under mocks (as stack `stack` of project warren) and wait for every
    registration; whatever Output the program returns is awaited too."""
    recorder = Recorder()
    pulumi.runtime.set_mocks(recorder, project="warren", stack=stack, preview=False)
    pulumi.runtime.test(program)()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
    return recorder


@pytest.fixture
def run() -> Callable[..., Recorder]:
    return run_program


@pytest.fixture
def stack_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For tests that run the program with a stack's settings (stacks.py): no real cluster's
    kubeconfig, no configuration from the environment, and none left behind."""
    monkeypatch.setenv("WARREN_HOME", str(tmp_path / "warren-home"))
    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    yield
    pulumi.runtime.set_all_config({})
