"""Open a workspace store by URL: the daemon and the control plane name storage the same way."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from warren_blockd.blobs import BlobDriver
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore


def open_store(url: str, endpoint: str | None = None) -> PolicyStore:
    """s3://bucket[/prefix] (credentials from the usual AWS environment variables) or file:///dir."""
    parsed = urlparse(url)
    driver: BlobDriver
    if parsed.scheme == "s3" and parsed.netloc:
        from warren_blockd.blobs.s3 import S3Driver

        prefix = parsed.path.strip("/")
        driver = S3Driver(parsed.netloc, endpoint=endpoint, prefix=f"{prefix}/" if prefix else "")
    elif parsed.scheme == "file" and parsed.path:
        driver = LocalDriver(Path(parsed.path))
    else:
        raise ValueError(f"store {url!r} is not a store: use s3://BUCKET[/PREFIX] or file:///DIRECTORY")
    return PolicyStore(driver)
