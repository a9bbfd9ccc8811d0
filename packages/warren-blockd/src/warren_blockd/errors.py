"""One error taxonomy for every blob driver, so policy (retry or stop) is decided once."""

from __future__ import annotations


class BlobError(Exception):
    """Any failure of the object store or the local blob files."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class NotFoundError(BlobError):
    """The key does not exist."""


class PreconditionFailedError(BlobError):
    """A create-only write lost: the key already exists. Never retried: for a log record
    this means another writer won the sequence number (split brain)."""


class CorruptError(BlobError):
    """The bytes fetched do not match their checksum; nothing of them is served or kept."""


class TransientError(BlobError):
    """A failure that may pass (timeouts, throttling, 5xx): retried with backoff."""


class FatalError(BlobError):
    """A failure that will not pass by retrying (credentials, missing bucket)."""
