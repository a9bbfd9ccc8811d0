"""Blobs in any S3-compatible store through boto3 (SeaweedFS self-hosted, S3 in AWS)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, ReadTimeoutError

from warren_blockd.blobs import BlobInfo
from warren_blockd.errors import BlobError, FatalError, NotFoundError, PreconditionFailedError, TransientError

FATAL_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "NoSuchBucket",
    "InvalidBucketName",
}


class S3Driver:
    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None = None,
        region: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        prefix: str = "",
        timeout: float = 10.0,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix
        # Retries belong to the policy layer (one place decides what is retried), not botocore.
        config = Config(
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"total_max_attempts": 1},
            max_pool_connections=64,  # chunk uploads and fault-ins run in parallel
            # Chunks are verified by their SHA-256 before any byte is served; a second,
            # transport checksum per PUT would only cost CPU.
            request_checksum_calculation="when_required",
            s3={"addressing_style": "path"},
        )
        self.client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=region,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            config=config,
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def _translate(self, key: str, exc: Exception) -> BlobError:
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in ("NoSuchKey", "404", "NotFoundError") or status == 404:  # noqa: PLR2004
                return NotFoundError(key, "no such object")
            if code == "PreconditionFailedError" or status == 412:  # noqa: PLR2004
                return PreconditionFailedError(key, "already exists (conditional write lost)")
            if code in FATAL_CODES or status in (401, 403):
                return FatalError(key, f"{code or status}: check the bucket and credentials")
            return TransientError(key, f"{code or status}")  # 409 conflicts, throttling, 5xx
        if isinstance(exc, (ConnectionError, ReadTimeoutError, BotoCoreError)):
            return TransientError(key, f"{type(exc).__name__}: {exc}")
        return FatalError(key, f"{type(exc).__name__}: {exc}")

    def get(self, key: str) -> bytes:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(key, exc) from None

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        extra = {"IfNoneMatch": "*"} if create_only else {}
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **extra)
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(key, exc) from None

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    def stat(self, key: str) -> datetime | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            error = self._translate(key, exc)
            if isinstance(error, NotFoundError):
                return None
            raise error from None
        modified: datetime = head["LastModified"]
        return modified

    def _list(self, prefix: str, start_after: str = "") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        paginator = self.client.get_paginator("list_objects_v2")
        extra = {"StartAfter": self._key(start_after)} if start_after else {}
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix), **extra):
                items += page.get("Contents", [])
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(prefix, exc) from None
        return sorted(items, key=lambda item: str(item["Key"]))

    def list_info(self, prefix: str) -> list[BlobInfo]:
        return [
            BlobInfo(item["Key"][len(self.prefix) :], item["Size"], item["LastModified"])
            for item in self._list(prefix)
        ]

    def list(self, prefix: str, start_after: str = "") -> list[str]:
        return [item["Key"][len(self.prefix) :] for item in self._list(prefix, start_after)]

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(key, exc) from None
