"""The same behaviour from every driver: local files always, S3 against real SeaweedFS."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from warren_blockd.blobs import BlobDriver
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.errors import NotFoundError, PreconditionFailedError, TransientError


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def driver(request: pytest.FixtureRequest, local_root: Path) -> BlobDriver:
    if request.param == "local":
        return LocalDriver(local_root)
    from warren_blockd.blobs.s3 import S3Driver

    endpoint = request.getfixturevalue("seaweedfs")
    bucket = request.getfixturevalue("bucket")
    return S3Driver(bucket, endpoint=endpoint, access_key="any", secret_key="any", timeout=30)


def test_put_get_list_delete(driver: BlobDriver) -> None:
    driver.put("a/one", b"1")
    driver.put("a/two", b"2")
    driver.put("b/three", b"3")
    assert driver.get("a/one") == b"1"
    assert driver.list("a/") == ["a/one", "a/two"]
    assert driver.list("a/", start_after="a/one") == ["a/two"]
    assert driver.exists("b/three")
    driver.delete("b/three")
    assert not driver.exists("b/three")
    with pytest.raises(NotFoundError):
        driver.get("b/three")


def test_create_only_refuses_an_existing_key(driver: BlobDriver) -> None:
    driver.put("log/00000001", b"first", create_only=True)
    with pytest.raises(PreconditionFailedError):
        driver.put("log/00000001", b"second", create_only=True)
    assert driver.get("log/00000001") == b"first"


def test_racing_create_only_writers_one_wins(driver: BlobDriver) -> None:
    """Eight writers race for one sequence number: at most one is told it won, and what is
    stored is exactly one writer's record (a writer whose request timed out may be that
    one: its answer was lost, not its write)."""
    outcomes: dict[int, str] = {}
    lock = threading.Lock()

    def writer(n: int) -> Callable[[], None]:
        def run() -> None:
            try:
                driver.put("log/00000042", f"writer {n}".encode(), create_only=True)
                result = "won"
            except PreconditionFailedError:
                result = "lost"
            except TransientError:
                result = "unknown"
            with lock:
                outcomes[n] = result

        return run

    threads = [threading.Thread(target=writer(n)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [n for n, o in outcomes.items() if o == "won"]
    assert len(winners) <= 1, outcomes
    stored = int(driver.get("log/00000042").decode().split()[1])
    if winners:
        assert stored == winners[0]
    else:
        assert outcomes[stored] == "unknown", outcomes
    assert sum(o == "lost" for o in outcomes.values()) >= 8 - 1 - sum(
        o == "unknown" for o in outcomes.values()
    )


def test_overwrite_without_condition(driver: BlobDriver) -> None:
    driver.put("manifest/latest", b"v1")
    driver.put("manifest/latest", b"v2")
    assert driver.get("manifest/latest") == b"v2"


def test_stat_and_list_info_tell_size_and_stored_time(driver: BlobDriver) -> None:
    start = datetime.now(UTC) - timedelta(seconds=2)  # S3 times are whole seconds
    driver.put("c/one", b"12345")
    driver.put("c/two", b"1")
    infos = driver.list_info("c/")
    assert [(info.key, info.size) for info in infos] == [("c/one", 5), ("c/two", 1)]
    stamped = driver.stat("c/one")
    assert stamped is not None and start <= stamped <= datetime.now(UTC) + timedelta(seconds=2)
    assert abs(infos[0].modified - stamped) < timedelta(seconds=1)
    assert driver.stat("c/none") is None
    time.sleep(1.1)
    driver.put("c/one", b"12345")  # stored again: its time moves on (the chunk gc relies on it)
    renewed = driver.stat("c/one")
    assert renewed is not None and renewed > stamped
