"""Manifests: which chunk holds each 4 KiB block of a workspace.

A manifest is a sorted list of extents (a run of blocks stored contiguously in one chunk,
starting at some block offset inside it). Blocks no extent covers read as zeros. A new
manifest is made by laying writes over an old one; nothing is ever changed in place, so a
published manifest can be shared by any number of forks.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from typing import Any

BLOCK_SIZE = 4096


@dataclass(frozen=True, order=True)
class Extent:
    first_block: int
    count: int
    chunk: str  # digest of the chunk holding these blocks
    chunk_offset: int = 0  # first block's index inside the chunk

    @property
    def end(self) -> int:
        return self.first_block + self.count


@dataclass(frozen=True)
class Manifest:
    size_blocks: int
    extents: tuple[Extent, ...] = ()
    log_seq: int = 0  # the last log record this manifest already contains
    _starts: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(e.first_block for e in self.extents))
        previous_end = 0
        for extent in self.extents:
            if extent.count <= 0 or extent.first_block < previous_end or extent.end > self.size_blocks:
                raise ValueError(f"extents overlap, are empty or pass the end of the device: {extent}")
            previous_end = extent.end

    def lookup(self, block: int) -> tuple[str, int] | None:
        """(chunk digest, block index inside the chunk) holding `block`, or None for a hole."""
        i = bisect.bisect_right(self._starts, block) - 1
        if i >= 0:
            extent = self.extents[i]
            if block < extent.end:
                return extent.chunk, extent.chunk_offset + block - extent.first_block
        return None

    def overlay(self, writes: list[Extent], log_seq: int | None = None) -> Manifest:
        """A new manifest with `writes` laid over this one, later writes winning."""
        extents = list(self.extents)
        for write in writes:
            kept: list[Extent] = []
            for e in extents:
                if e.end <= write.first_block or e.first_block >= write.end:
                    kept.append(e)
                    continue
                if e.first_block < write.first_block:  # the part before the write
                    kept.append(
                        Extent(e.first_block, write.first_block - e.first_block, e.chunk, e.chunk_offset)
                    )
                if e.end > write.end:  # the part after it
                    skip = write.end - e.first_block
                    kept.append(Extent(write.end, e.end - write.end, e.chunk, e.chunk_offset + skip))
            kept.append(write)
            extents = sorted(kept)
        return Manifest(self.size_blocks, tuple(extents), self.log_seq if log_seq is None else log_seq)

    def with_log_seq(self, log_seq: int) -> Manifest:
        return Manifest(self.size_blocks, self.extents, log_seq)

    def chunks(self) -> set[str]:
        return {e.chunk for e in self.extents}

    def to_bytes(self) -> bytes:
        doc = {
            "version": 1,
            "block_size": BLOCK_SIZE,
            "size_blocks": self.size_blocks,
            "log_seq": self.log_seq,
            "extents": [[e.first_block, e.count, e.chunk, e.chunk_offset] for e in self.extents],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        return cls.from_doc(json.loads(data))

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Manifest:
        if doc.get("version") != 1 or doc.get("block_size") != BLOCK_SIZE:
            raise ValueError("unsupported manifest version or block size")
        extents = tuple(Extent(a, b, c, d) for a, b, c, d in doc["extents"])
        return cls(doc["size_blocks"], extents, doc["log_seq"])
