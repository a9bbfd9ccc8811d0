"""The host side of the guest agent's protocol: request lines out, JSON lines back."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from warren_forkd.errors import AgentError


@dataclass(frozen=True)
class Result:
    rc: int
    output: bytes


class Agent:
    """One connection to an agent's virtio-serial port, served by QEMU on a unix socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, path: Path, timeout: float) -> Agent:
        # QEMU creates the socket a moment after it starts: retry until it is there.
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 24)
                return cls(reader, writer)
            except (FileNotFoundError, ConnectionRefusedError):
                if asyncio.get_running_loop().time() > deadline:
                    raise AgentError(f"no agent socket at {path}") from None
                await asyncio.sleep(0.01)

    async def call(self, verb: str, *args: str, timeout: float = 60.0) -> Result:
        request_id = next(self._ids)
        self._writer.write(" ".join([str(request_id), verb, *args]).encode() + b"\n")
        await self._writer.drain()
        async with asyncio.timeout(timeout):
            while True:
                line = await self._reader.readline()
                if not line:
                    raise AgentError(f"agent closed the channel during {verb}")
                try:
                    msg = json.loads(line)
                except ValueError:
                    raise AgentError(f"agent sent a line out of protocol: {line[:200]!r}") from None
                # Events (e.g. "ready" at boot) and stale answers are not ours.
                if msg.get("id") == request_id:
                    return Result(int(msg["rc"]), base64.b64decode(msg["out"]))

    async def ping(self, timeout: float = 60.0) -> None:
        await self.call("ping", timeout=timeout)

    async def run(self, command: str, timeout: float = 60.0) -> Result:
        return await self.call("run", base64.b64encode(command.encode()).decode(), timeout=timeout)

    async def fork(self, seed: bytes, hostname: str, machine_id: str, generation_id: str) -> None:
        """Give a restored guest its own entropy and identity (hostname, machine id, VM generation
        id at /run/warren/vm-generation-id); before this, it is its parent's twin."""
        result = await self.call("fork", base64.b64encode(seed).decode(), hostname, machine_id, generation_id)
        if result.rc != 0:
            raise AgentError(f"reseed failed in the guest: {result.output.decode(errors='replace')}")

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
