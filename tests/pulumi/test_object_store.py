"""ObjectStore: never public, owner-enforced, versioned, encrypted, expiring, TLS only."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Recorder, run_program
from warren_components import ObjectStore, ObjectStoreArgs

BUCKET = "aws:s3/bucket:Bucket"


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return run_program(lambda: ObjectStore("ws", ObjectStoreArgs()))


def _bucket_id(recorder: Recorder) -> str:
    return recorder.one(BUCKET).resource_id


def test_public_access_block_sets_all_four(recorder: Recorder) -> None:
    block = recorder.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert block["bucket"] == _bucket_id(recorder)
    for setting in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"):
        assert block[setting] is True, setting


def test_ownership_is_enforced(recorder: Recorder) -> None:
    controls = recorder.one("aws:s3/bucketOwnershipControls:BucketOwnershipControls").inputs
    assert controls["rule"]["objectOwnership"] == "BucketOwnerEnforced"


def test_versioning_is_enabled(recorder: Recorder) -> None:
    versioning = recorder.one("aws:s3/bucketVersioning:BucketVersioning").inputs
    assert versioning["bucket"] == _bucket_id(recorder)
    assert versioning["versioningConfiguration"]["status"] == "Enabled"


def test_default_encryption_uses_a_rotating_kms_key_of_its_own(recorder: Recorder) -> None:
    config = recorder.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ).inputs
    rule = config["rules"][0]
    key = recorder.one("aws:kms/key:Key")
    assert rule["applyServerSideEncryptionByDefault"] == {
        "sseAlgorithm": "aws:kms",
        "kmsMasterKeyId": key.arn,
    }
    assert rule["bucketKeyEnabled"] is True
    assert key.inputs["enableKeyRotation"] is True


def test_lifecycle_expires_old_versions_and_aborts_stale_uploads(recorder: Recorder) -> None:
    rules = {
        r["id"]: r
        for r in recorder.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs[
            "rules"
        ]
    }
    assert rules["expire-noncurrent-versions"]["status"] == "Enabled"
    assert rules["expire-noncurrent-versions"]["noncurrentVersionExpiration"]["noncurrentDays"] == 30
    assert rules["abort-incomplete-multipart-uploads"]["status"] == "Enabled"
    assert (
        rules["abort-incomplete-multipart-uploads"]["abortIncompleteMultipartUpload"]["daysAfterInitiation"]
        == 7
    )


def test_policy_denies_everything_without_tls(recorder: Recorder) -> None:
    policy: dict[str, Any] = json.loads(recorder.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    deny = next(s for s in policy["Statement"] if s["Sid"] == "DenyInsecureTransport")
    assert deny["Effect"] == "Deny"
    assert deny["Principal"] == "*"
    assert deny["Action"] == "s3:*"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    bucket_arn = recorder.one(BUCKET).arn
    assert deny["Resource"] == [bucket_arn, f"{bucket_arn}/*"]
    assert all(s["Effect"] == "Deny" for s in policy["Statement"]), "the policy grants nothing"


def test_bucket_is_not_force_destroyed_by_default(recorder: Recorder) -> None:
    assert recorder.one(BUCKET).inputs["forceDestroy"] is False


def test_sse_s3_creates_no_key(run: Callable[..., Recorder]) -> None:
    recorder = run(lambda: ObjectStore("ws", ObjectStoreArgs(encryption="AES256", bucket_name="warren-ws")))
    assert not recorder.of_type("aws:kms/key:Key")
    config = recorder.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ).inputs
    assert config["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    assert recorder.one(BUCKET).inputs["bucket"] == "warren-ws"


def test_a_given_key_is_used_and_none_created(run: Callable[..., Recorder]) -> None:
    recorder = run(lambda: ObjectStore("ws", ObjectStoreArgs(kms_key_arn="arn:aws:kms:::key/given")))
    assert not recorder.of_type("aws:kms/key:Key")
    config = recorder.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ).inputs
    assert (
        config["rules"][0]["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"]
        == "arn:aws:kms:::key/given"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"encryption": "AES256", "kms_key_arn": "arn:k"}, "AES256"),
        ({"noncurrent_version_days": 0}, "at least 1"),
    ],
)
def test_inconsistent_args_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ObjectStoreArgs(**overrides)
