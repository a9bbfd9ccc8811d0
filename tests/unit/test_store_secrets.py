"""The external stores' Secrets from the host stores' credentials: what is made from the
input, every input the pods could not use refused before the cluster is asked, and no value
ever in a message. (Made on a real API server by the multi-host test, tests/hosts.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from warren.cli import main
from warren.config import WarrenConfig, parse_config
from warren.store_secrets import DATABASE, OBJECT_STORE, StoreSecretsError, parse_env, wanted

PASSWORD = "s3cr3t-Pa55word-that-must-never-show"  # noqa: S105  # a test value
SECRET_KEY = "never-show-this-secret-key"  # noqa: S105  # a test value
URL = f"postgresql+psycopg://warren:{PASSWORD}@10.0.10.5:5432/warren"
ENV = f"AWS_ACCESS_KEY_ID=WARRENABC\nAWS_SECRET_ACCESS_KEY={SECRET_KEY}\n"


def _external(**services: object) -> WarrenConfig:
    return parse_config(
        {"services": {"stores": "external", "object_store_endpoint": "http://10.0.20.5:19003", **services}}
    )


def test_the_secrets_hold_the_url_and_the_two_keys() -> None:
    made = wanted({"database_url": URL + "\n", "object_store_credentials": ENV}, _external())
    assert made == {
        DATABASE: {"url": URL},
        OBJECT_STORE: {"AWS_ACCESS_KEY_ID": "WARRENABC", "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    }


def test_with_ambient_credentials_only_the_database_is_made() -> None:
    made = wanted({"database_url": URL}, _external(object_store_credentials="ambient"))
    assert made == {DATABASE: {"url": URL}}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "localhost", "[::1]"])
def test_a_loopback_database_is_refused_naming_the_setting_not_the_password(host: str) -> None:
    url = f"postgresql+psycopg://warren:{PASSWORD}@{host}:5432/warren"
    with pytest.raises(StoreSecretsError, match="loopback") as refused:
        wanted({"database_url": url, "object_store_credentials": ENV}, _external())
    assert "postgres_url_host" in str(refused.value)
    assert PASSWORD not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"postgresql://warren:{PASSWORD}@10.0.10.5:5432/warren", r"not postgresql\+psycopg"),
        (f"postgresql+psycopg://warren:{PASSWORD}@10.0.10.5:5432/", "lacks a host, a password"),
        ("postgresql+psycopg://warren@10.0.10.5:5432/warren", "lacks a host, a password"),
        (f"postgresql+psycopg://warren:{PASSWORD}@10.0.10.5:port/warren", "is not a URL"),
    ],
)
def test_a_url_the_control_plane_cannot_use_is_refused(url: str, says: str) -> None:
    with pytest.raises(StoreSecretsError, match=says) as refused:
        wanted({"database_url": url, "object_store_credentials": ENV}, _external())
    assert PASSWORD not in str(refused.value)


def test_credentials_without_both_keys_are_refused_naming_the_fix() -> None:
    with pytest.raises(StoreSecretsError, match="lack AWS_SECRET_ACCESS_KEY") as refused:
        wanted({"database_url": URL, "object_store_credentials": "AWS_ACCESS_KEY_ID=X\n"}, _external())
    assert "credentials file" in str(refused.value)
    with pytest.raises(StoreSecretsError, match="object_store_credentials is missing"):
        wanted({"database_url": URL}, _external())


def test_only_for_external_stores_and_known_keys() -> None:
    with pytest.raises(StoreSecretsError, match="stores: external"):
        wanted({"database_url": URL, "object_store_credentials": ENV}, parse_config({}))
    with pytest.raises(StoreSecretsError, match="unknown input key"):
        wanted({"database_url": URL, "object_store_credentials": ENV, "extra": 1}, _external())
    with pytest.raises(StoreSecretsError, match="JSON object"):
        wanted([URL], _external())


def test_environment_files_are_read_as_shells_write_them() -> None:
    text = "# made by the object_store role\n\nexport A='one'\nB=\"two=2\"\nC=three\nnot a pair\n"
    assert parse_env(text) == {"A": "one", "B": "two=2", "C": "three"}


def test_the_command_refuses_bad_input_before_asking_any_cluster_and_shows_no_value(tmp_path: Path) -> None:
    config = tmp_path / "warren.yaml"
    config.write_text("services:\n  stores: external\n  object_store_endpoint: http://10.0.20.5:19003\n")
    argv = ["platform", "store-secrets", "--config", str(config), "--kubeconfig", str(tmp_path / "none")]
    loopback = json.dumps(
        {"database_url": URL.replace("10.0.10.5", "127.0.0.1"), "object_store_credentials": ENV}
    )
    result = CliRunner().invoke(main, argv, input=loopback)
    assert result.exit_code == 1
    assert "loopback" in result.output
    assert PASSWORD not in result.output and SECRET_KEY not in result.output
    garbled = CliRunner().invoke(main, argv, input=f'{{"database_url": "{PASSWORD}"')
    assert garbled.exit_code == 1
    assert "not JSON" in garbled.output and PASSWORD not in garbled.output
    # Valid input reaches the cluster step, which names the missing kubeconfig.
    valid = CliRunner().invoke(
        main, argv, input=json.dumps({"database_url": URL, "object_store_credentials": ENV})
    )
    assert valid.exit_code == 1
    assert "kubeconfig" in valid.output and PASSWORD not in valid.output
