"""services.object_store_credentials: with `ambient` (external stores on a cloud whose pods
have an identity of their own, as the AWS stacks' EKS Pod Identity gives warren-blockd and
the control plane), no workload reads an object-store key from a Secret and the install Job
does not ask for one; with `secret` (the default) the objects are as they were."""

from __future__ import annotations

import base64
from http import HTTPStatus
from typing import Any

import pytest
from warren_control import install
from warren_control.kube import ApiException

from warren.config import ConfigError, parse_config
from warren.render import render

Obj = dict[str, Any]
EXTERNAL = {"stores": "external", "object_store_endpoint": "https://s3.eu-west-1.amazonaws.com"}


def system_workloads(services: dict[str, Any]) -> list[Obj]:
    config = parse_config({"services": {"enabled": True, **services}})
    return [o for o in render(config) if o["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}]


def env_names(obj: Obj) -> set[str]:
    spec = obj["spec"]["template"]["spec"]
    return {e["name"] for c in spec["containers"] for e in c.get("env", [])}


def secret_refs(obj: Obj) -> set[str]:
    spec = obj["spec"]["template"]["spec"]
    names = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in spec["containers"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    return names | {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}


def named(objects: list[Obj], name: str) -> Obj:
    (found,) = [o for o in objects if o["metadata"]["name"].startswith(name)]
    return found


def test_ambient_credentials_read_no_key_from_any_secret() -> None:
    objects = system_workloads({**EXTERNAL, "object_store_credentials": "ambient"})
    for obj in objects:
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & env_names(obj), obj["metadata"]["name"]
        assert "warren-object-store" not in secret_refs(obj), obj["metadata"]["name"]
    # The database URL is still the operator's Secret.
    assert "warren-database" in secret_refs(named(objects, "warren-control"))
    (job,) = named(objects, "warren-install")["spec"]["template"]["spec"]["containers"]
    assert "--object-store-credentials=ambient" in job["args"]
    assert "--stores=external" in job["args"]


def test_secret_credentials_are_the_default_and_unchanged() -> None:
    objects = system_workloads(EXTERNAL)
    for name in ("warren-control", "warren-blockd"):
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= env_names(named(objects, name))
        assert "warren-object-store" in secret_refs(named(objects, name))
    (job,) = named(objects, "warren-install")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in job["args"] if a.startswith("--object-store-credentials")]


def test_ambient_with_embedded_stores_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"services: object_store_credentials: ambient is for stores"):
        parse_config({"services": {"object_store_credentials": "ambient"}})
    with pytest.raises(ConfigError, match=r"services\.object_store_credentials"):
        parse_config({"services": {**EXTERNAL, "object_store_credentials": "instance-profile"}})


class FakeKube:
    """The Secrets API of one namespace: GET and POST, as install.py uses it."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets

    def request(self, method: str, path: str, body: Obj | None = None) -> Obj:
        name = path.rsplit("/", 1)[-1]
        if method == "GET":
            if name not in self.secrets:
                raise ApiException(status=HTTPStatus.NOT_FOUND)
            return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in self.secrets[name].items()}}
        assert method == "POST" and body is not None
        self.secrets[body["metadata"]["name"]] = dict(body["stringData"])
        return body


def plan(credentials: str) -> install.Plan:
    return install.Plan("warren-system", "external", "", object_store_credentials=credentials)


def test_the_install_job_needs_only_the_database_secret_with_ambient_credentials() -> None:
    kube = FakeKube({"warren-database": {"url": "postgresql+psycopg://db.example/warren"}})
    said: list[str] = []
    install.make_secrets(kube, plan("ambient"), said.append)  # type: ignore[arg-type]
    assert "warren-stamp-key" in kube.secrets and "warren-object-store" not in kube.secrets
    assert any("cloud identity" in line for line in said)
    # With keys, the missing Secret stops the install and names the command that makes it.
    with pytest.raises(install.InstallError, match="create secret generic warren-object-store"):
        install.make_secrets(kube, plan("secret"), said.append)  # type: ignore[arg-type]


def test_the_database_secret_is_still_required_with_ambient_credentials() -> None:
    with pytest.raises(install.InstallError, match="warren-database"):
        install.make_secrets(FakeKube({}), plan("ambient"), lambda _line: None)  # type: ignore[arg-type]
