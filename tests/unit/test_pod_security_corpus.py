"""How the conformance suite reads Kubernetes' Pod Security corpus and prepares its pods."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from warren.conformance import podsecurity


def _write(root: Path, version: str, expect: str, name: str, pod: dict[str, object]) -> None:
    path = root / "baseline" / version / expect / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(pod))


def _pod(name: str, **spec: object) -> dict[str, object]:
    containers = [{"name": "container1", "image": "pause"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": containers, **spec},
    }


def test_module_version_follows_the_cluster() -> None:
    assert podsecurity.module_version("v1.34.4") == "v0.34.4"
    assert podsecurity.module_version("v1.35.0-rc.1+k3s1") == "v0.35.0"
    assert podsecurity.minor_version("v1.34.4") == 34
    with pytest.raises(podsecurity.CorpusUnavailableError, match="cannot tell"):
        podsecurity.module_version("unknown")


def test_the_newest_fixtures_not_newer_than_the_cluster(tmp_path: Path) -> None:
    for version in ("v1.0", "v1.9", "v1.34", "v1.35"):
        (tmp_path / "baseline" / version).mkdir(parents=True)
    assert podsecurity.level_dir(tmp_path, 34).name == "v1.34"
    assert podsecurity.level_dir(tmp_path, 20).name == "v1.9"  # 1.9 < 1.20: numeric, not lexical
    with pytest.raises(podsecurity.CorpusUnavailableError, match="no fixtures"):
        podsecurity.level_dir(tmp_path / "none", 34)


def test_fixtures_load_with_their_check_and_expectation(tmp_path: Path) -> None:
    _write(tmp_path, "v1.34", "fail", "hostports2", _pod("hostports2"))
    _write(tmp_path, "v1.34", "pass", "capabilities_baseline0", _pod("capabilities_baseline0"))
    fixtures = podsecurity.load(tmp_path / "baseline" / "v1.34")
    assert [(f.expect, f.check) for f in fixtures] == [
        ("pass", "capabilities_baseline"),
        ("fail", "hostports"),
    ]
    with pytest.raises(podsecurity.CorpusUnavailableError, match="no failing"):
        podsecurity.load(tmp_path / "baseline" / "v1.0")


def test_a_fixture_is_made_to_meet_warrens_own_rules_only() -> None:
    pod = _pod(
        "privileged0",
        initContainers=[{"name": "init", "image": "pause", "securityContext": {"privileged": True}}],
    )
    fixture = podsecurity.Fixture("privileged0", "fail", pod)
    out = podsecurity.floor_compliant(fixture, "privileged0-abc", "gvisor")
    spec = out["spec"]
    assert out["metadata"]["name"] == "privileged0-abc"
    assert spec["runtimeClassName"] == "gvisor" and spec["automountServiceAccountToken"] is False
    assert spec["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False}
    # The API refuses privileged with allowPrivilegeEscalation false: left as the fixture has it.
    assert spec["initContainers"][0]["securityContext"] == {"privileged": True}
    assert fixture.pod["spec"]["containers"][0] == {"name": "container1", "image": "pause"}  # not mutated


def test_every_check_maps_to_rules_the_policy_has() -> None:
    from warren.config import WarrenConfig
    from warren.render import render

    policy = next(o for o in render(WarrenConfig()) if o["metadata"]["name"] == "warren-sandbox-pods")
    rules = {v["message"].split("]")[0].removeprefix("[warren:") for v in policy["spec"]["validations"]}
    for check, mapped in podsecurity.CHECK_RULES.items():
        assert set(mapped) <= rules, f"{check} maps to rules the policy lacks: {set(mapped) - rules}"
