"""warren-blockd benchmark: every figure next to a baseline measured in the same run.

    python bench/blockd.py --work DIR [--out bench/results/blockd.json]

Run it through `make bench-blockd` (as root: it mounts FUSE, loop devices and ext4). It
starts its own SeaweedFS and daemons under DIR and measures:

  fork_ms_1g, fork_ms_8g   fork of a workspace imported from a filled 1 GiB / 8 GiB ext4 image
  copy_ms_8g               a full copy of that 8 GiB image file (the baseline a fork replaces)
  shared_ratio_*           two builds of one real project, each in its own fresh ext4 image
  replication_mib_s        incompressible bytes captured and sealed on node disk (chunks encoded at
                           seal time), drained to storage by the replicator (chunks in parallel,
                           records in strict order)
  raw_put_mib_s            the same bytes as parallel PUTs of the same size to the same SeaweedFS
  write_to_replicated_mib_s  the same bytes written into a mounted workspace until `replicated`
  restore_ms_1x, _10x      restore on an empty node after N and 10 N flushed rounds of writes
  read_4k_us_*             4 KiB O_DIRECT reads, cold (chunk faulted in) and warm
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.blobs.s3 import S3Driver
from warren_blockd.dedup import report
from warren_blockd.replicator import MAX_PAYLOAD_BLOCKS, Replicator
from warren_blockd.testing import BlockdProcess, Weed, make_bucket
from warren_blockd.workspace import Workspace

MIB = 1 << 20
GIB = 1 << 30
ROOT = Path(__file__).resolve().parent.parent


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def timed(op: Callable[[], object]) -> float:
    start = time.perf_counter()
    op()
    return ms(start)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@contextmanager
def loop_mounted(image: Path, target: Path) -> Iterator[Path]:
    target.mkdir(parents=True, exist_ok=True)
    device = subprocess.run(
        ["losetup", "--find", "--show", str(image)], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        subprocess.run(["mount", device, str(target)], check=True)
        try:
            yield target
        finally:
            subprocess.run(["umount", str(target)], check=True)
    finally:
        subprocess.run(["losetup", "-d", device], check=True)


def filled_image(path: Path, size: int) -> Path:
    """An ext4 image of `size` bytes, about 90% full of 64 MiB files written by the kernel.
    Every 4 KiB block is distinct (a counter ahead of shared filler), so every chunk is too."""
    with path.open("wb") as handle:
        handle.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", str(path)], check=True)
    filler = random.Random(7).randbytes(4096 - 16)
    counter = 0
    with loop_mounted(path, path.with_suffix(".mnt")) as mnt:
        for i in range(int(size * 0.9) // (64 * MIB)):
            blocks = []
            for _ in range(64 * MIB // 4096):
                blocks.append(counter.to_bytes(16, "big") + filler)
                counter += 1
            (mnt / f"file-{i:04d}.bin").write_bytes(b"".join(blocks))
        subprocess.run(["sync", "-f", str(mnt)], check=True)
    return path


def fork_figures(node: BlockdProcess, work: Path, samples: int) -> dict[str, float]:
    """Forks of the two workspaces alternate (1 GiB, 8 GiB, 1 GiB, ...) so both see the same
    background load; then the 8 GiB image is copied in full, the baseline."""
    figures: dict[str, float] = {}
    images = {}
    for gib in (1, 8):
        images[gib] = filled_image(work / f"filled-{gib}g.img", gib * GIB)
        started = time.perf_counter()
        node.client.create(f"filled-{gib}g", image=str(images[gib]))
        figures[f"import_s_{gib}g"] = round(ms(started) / 1000, 1)
        node.client.action(f"filled-{gib}g", "fork", children=[f"filled-{gib}g-warmup"])
    forks: dict[int, list[float]] = {1: [], 8: []}
    for i in range(samples):
        for gib in (1, 8):
            name = f"filled-{gib}g"
            forks[gib].append(timed(lambda: node.client.action(name, "fork", children=[f"{name}-k{i}"])))  # noqa: B023
    for gib, times in forks.items():
        figures[f"fork_ms_{gib}g"] = round(statistics.median(times), 2)
    copy = images[8].with_suffix(".copy")
    started = time.perf_counter()
    shutil.copyfile(images[8], copy)
    with copy.open("rb+") as handle:
        os.fsync(handle.fileno())
    figures["copy_ms_8g"] = round(ms(started), 1)
    copy.unlink()
    for image in images.values():
        image.unlink()
    return figures


def dedup_figures(work: Path) -> dict[str, Any]:
    out = work / "project"
    out.mkdir()
    subprocess.run(
        [str(ROOT / "bench" / "blockd_project_images.sh"), str(out)], check=True, stdout=subprocess.DEVNULL
    )
    figures = report(out / "build-a.img", out / "build-b.img")
    shutil.rmtree(out)
    return {k: figures[k] for k in ("chunk_size", "shared_ratio_file_aligned", "shared_ratio_fixed")}


def drain_once(store: PolicyStore, work: Path, name: str, payload: bytes) -> float:
    """Seconds for a replicator to drain `payload`, captured on node disk, to storage."""
    workspace = Workspace(store, name)
    workspace.create(len(payload) // 4096)
    replicator = Replicator(
        workspace, work / f"spool-{name}", backlog_bound=2 * len(payload), next_seq=1, start=False
    )
    batch = 32 * MIB
    for offset in range(0, len(payload), batch):  # captured and sealed on node disk: `local` receipts
        replicator.write(offset // 4096, payload[offset : offset + batch])
        last = replicator.flush()
    started = time.perf_counter()
    replicator.start()
    assert replicator.wait_replicated(last.seq, 600).level == "replicated"
    seconds = ms(started) / 1000
    replicator.close()
    return seconds


def raw_put_once(s3: Any, bucket: str, name: str, payload: bytes) -> float:
    """Seconds for plain parallel PUTs of `payload` in pieces the size of the replicator's chunks."""
    piece = MAX_PAYLOAD_BLOCKS * 4096
    started = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda off: s3.put_object(
                    Bucket=bucket, Key=f"{name}/{off:016d}", Body=payload[off : off + piece]
                ),
                range(0, len(payload), piece),
            )
        )
    return ms(started) / 1000


def replication_figures(
    node: BlockdProcess, endpoint: str, bucket: str, work: Path, size: int
) -> dict[str, float]:
    """The replicator draining writes captured on node disk (its own S3 stack, strict order,
    chunk before record) against plain parallel PUTs of the same bytes in the same sizes,
    alternated five times each (fresh random bytes every time: nothing dedups). Also, for
    the record, the same bytes written through a mounted workspace until `replicated`."""
    store = PolicyStore(S3Driver(bucket, endpoint=endpoint, access_key="any", secret_key="any"))
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",
        config=Config(max_pool_connections=64),
    )
    drains, raws = [], []
    for i in range(5):
        raws.append(raw_put_once(s3, bucket, f"raw-{i}", os.urandom(size)))
        drains.append(drain_once(store, work, f"drain-{i}", os.urandom(size)))
    payload = os.urandom(size)
    node.client.create("repl", 4 * GIB)
    target = work / "repl"
    node.client.action("repl", "mount", target=str(target))
    started = time.perf_counter()
    with (target / "payload.bin").open("wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    assert node.client.action("repl", "flush", wait_replicated=600)["level"] == "replicated"
    end_to_end_s = ms(started) / 1000
    node.client.action("repl", "unmount", wait_replicated=600)
    return {
        "replication_mib_s": round(size / MIB / statistics.median(drains), 1),
        "raw_put_mib_s": round(size / MIB / statistics.median(raws), 1),
        "raw_put_object_bytes": MAX_PAYLOAD_BLOCKS * 4096,
        "write_to_replicated_mib_s": round(size / MIB / end_to_end_s, 1),
    }


def history(node: BlockdProcess, name: str, work: Path, rounds: int) -> None:
    """`rounds` flushed rounds of a workload rewriting its files in place."""
    node.client.create(name, 256 * MIB)
    target = work / name
    node.client.action(name, "mount", target=str(target))
    files = [target / f"state-{i}.bin" for i in range(8)]
    for path in files:
        path.write_bytes(bytes(256 * 1024))
    for r in range(rounds):
        for path in files:
            with path.open("r+b") as handle:
                handle.write(os.urandom(64 * 1024))
        node.client.action(name, "flush", wait_replicated=120)
        if r % 50 == 0:
            print(f"  {name}: round {r}/{rounds}", flush=True)
    node.client.action(name, "unmount", wait_replicated=120)


def restore_figures(  # noqa: PLR0917
    node: BlockdProcess, store: str, endpoint: str, work: Path, rounds: int, samples: int
) -> dict[str, float]:
    history(node, "hist-1x", work, rounds)
    history(node, "hist-10x", work, rounds * 10)
    figures = {}
    for label in ("1x", "10x"):
        times = []
        for i in range(samples):  # each on an empty node: nothing cached, all from storage
            state = work / f"restorer-{label}-{i}"
            restorer = BlockdProcess(state, store, endpoint)
            try:
                started = time.perf_counter()
                restorer.client.action(f"hist-{label}", "restore", target=str(state / "mnt"))
                times.append(ms(started))
                restorer.client.action(f"hist-{label}", "unmount")
            finally:
                restorer.stop()
                shutil.rmtree(state, ignore_errors=True)
        figures[f"restore_ms_{label}"] = round(statistics.median(times), 1)
    return figures


def read_figures(node: BlockdProcess, store: str, endpoint: str, work: Path, reads: int) -> dict[str, float]:
    size = 512 * MIB
    node.client.create("reads", GIB)
    node.client.action("reads", "mount", target=str(work / "reads"))
    (work / "reads" / "data.bin").write_bytes(os.urandom(size))
    node.client.action("reads", "unmount", wait_replicated=600)
    state = work / "reader"
    reader = BlockdProcess(state, store, endpoint)  # an empty node: the first touch faults in
    try:
        reader.client.action("reads", "restore", target=str(state / "mnt"))
        chunk = 256 * 1024
        rng = random.Random(11)
        regions = rng.sample(range(size // chunk), reads)
        offsets = [r * chunk + rng.randrange(chunk // 4096) * 4096 for r in regions]
        buffer = mmap.mmap(-1, 4096)  # page aligned, as O_DIRECT wants
        fd = os.open(state / "mnt" / "data.bin", os.O_RDONLY | os.O_DIRECT)
        try:

            def sample() -> list[float]:
                out = []
                for offset in offsets:
                    started = time.perf_counter()
                    assert os.preadv(fd, [buffer], offset) == 4096
                    out.append((time.perf_counter() - started) * 1e6)
                return out

            cold = sample()
            warm = sample()
        finally:
            os.close(fd)
        reader.client.action("reads", "unmount")
    finally:
        reader.stop()
    return {
        "read_4k_us_p50_cold": round(percentile(cold, 0.5), 1),
        "read_4k_us_p99_cold": round(percentile(cold, 0.99), 1),
        "read_4k_us_p50_warm": round(percentile(warm, 0.5), 1),
        "read_4k_us_p99_warm": round(percentile(warm, 0.99), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (about 20 GiB free)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "blockd.json")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--replication-mib", type=int, default=512)
    parser.add_argument("--history-rounds", type=int, default=20)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="warren-bench-blockd.", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    weed = Weed(work / "weed")
    (work / "weed").mkdir()
    weed.start()
    results: dict[str, Any] = {}
    node: BlockdProcess | None = None
    try:
        bucket = make_bucket(weed.endpoint)
        store = f"s3://{bucket}"
        node = BlockdProcess(work / "node", store, weed.endpoint, "--consolidate-records", "16")
        steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("fork", lambda: fork_figures(node, work, args.samples)),  # type: ignore[arg-type]
            ("dedup", lambda: dedup_figures(work)),
            (
                "replication",
                lambda: replication_figures(node, weed.endpoint, bucket, work, args.replication_mib * MIB),
            ),  # type: ignore[arg-type]
            ("restore", lambda: restore_figures(node, store, weed.endpoint, work, args.history_rounds, 5)),  # type: ignore[arg-type]
            ("reads", lambda: read_figures(node, store, weed.endpoint, work, 200)),  # type: ignore[arg-type]
        ]
        for name, step in steps:
            print(f"bench-blockd: {name}", flush=True)
            results.update(step())
            print(f"  {json.dumps(results)}", flush=True)
    finally:
        if node:
            node.stop()
        weed.stop()
        subprocess.run(["umount", "-R", "-l", str(work)], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    results["ratios"] = {
        "fork_8g_over_1g": round(results["fork_ms_8g"] / results["fork_ms_1g"], 3),
        "copy_8g_over_fork_8g": round(results["copy_ms_8g"] / results["fork_ms_8g"], 1),
        "file_aligned_over_fixed": round(
            results["shared_ratio_file_aligned"] / results["shared_ratio_fixed"], 2
        ),
        "replication_over_raw_put": round(results["replication_mib_s"] / results["raw_put_mib_s"], 3),
        "restore_10x_over_1x": round(results["restore_ms_10x"] / results["restore_ms_1x"], 3),
    }
    r = results["ratios"]
    results["acceptance"] = {
        "fork_8g <= 1.5 x fork_1g": r["fork_8g_over_1g"] <= 1.5,
        "fork_8g <= copy_8g / 100": r["copy_8g_over_fork_8g"] >= 100,
        "shared_file_aligned >= 0.8": results["shared_ratio_file_aligned"] >= 0.8,
        "shared_file_aligned >= 2 x fixed": r["file_aligned_over_fixed"] >= 2,
        "replication >= 0.8 x raw put": r["replication_over_raw_put"] >= 0.8,
        "restore_10x <= 1.3 x restore_1x": r["restore_10x_over_1x"] <= 1.3,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
