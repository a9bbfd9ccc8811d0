"""Calls to the agent inside a sandbox's pod (agent/), for Warren's own exec and files.

The agent speaks envd's protocol: Connect RPC with the JSON codec over HTTP/1.1 and plain
HTTP /files. A command is process.Process/Start, a server stream of enveloped JSON messages
(a flag byte and a big-endian length before each), whose last envelope is flagged
end-of-stream and carries the call's error, if any. Every call carries the sandbox's access
token, derived from the control plane's key (keys.agent_token) and never stored.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import struct
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from warren_control.podspec import AGENT_PORT

TOKEN_HEADER = "X-Access-Token"  # noqa: S105 (a header name)
STDOUT = "stdout"
STDERR = "stderr"
_ENVELOPE = struct.Struct(">BI")
_END_STREAM = 0x02
_STDIN_CHUNK = 256 * 1024
# Long enough for a loaded agent to answer, short enough that a pod that went away is told
# apart from a slow command (the stream itself has no read bound: commands may be quiet).
CONNECT_TIMEOUT_S = 5.0
# A sandbox reported running may have an agent not yet listening: a sandbox container added
# to a claimed pool pod counts as running once its process (the agent) starts. A refused
# connection sent nothing, so it is tried again for this long.
AGENT_STARTING_S = 2.0


class AgentError(Exception):
    """The agent could not be reached, or answered something that is not its protocol."""


class AgentRefused(AgentError):  # noqa: N818 (reads as what happened)
    """The agent understood and refused: `status` is its HTTP status (404 for a missing
    file), `message` its reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Agent:
    """One sandbox's agent: its pod's address and the sandbox's access token."""

    address: str
    token: str
    port: int = AGENT_PORT

    def url(self, path: str) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}{path}"

    @property
    def headers(self) -> dict[str, str]:
        return {TOKEN_HEADER: self.token}


@dataclass(frozen=True)
class Exit:
    """How a command ended: its exit code, or why it has none (a signal, a failed start)."""

    code: int | None
    error: str | None = None


CLAIM_HEADER = "X-Claim-Token"


def claim(
    address: str, claim_token: str, access_sha256: str, env: dict[str, str], port: int = AGENT_PORT
) -> None:
    """Give an unclaimed agent (a pool pod's) its Sandbox: the access token's SHA-256 every
    later call is checked against, and the environment of the processes it starts. The
    agent takes one claim in its life; AgentRefused if it refuses this one."""
    agent = Agent(address, token="", port=port)
    try:
        answer = httpx.post(
            agent.url("/claim"),
            json={"accessTokenSha256": access_sha256, "envVars": env},
            headers={CLAIM_HEADER: claim_token},
            timeout=CONNECT_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        raise AgentError(f"the agent at {address} could not be reached: {exc}") from exc
    if answer.status_code != httpx.codes.NO_CONTENT:
        try:
            message = str(answer.json().get("message") or answer.text)
        except ValueError:
            message = answer.text
        raise AgentRefused(answer.status_code, message)


def wait_healthy(address: str, timeout_s: float, port: int = AGENT_PORT) -> bool:
    """Whether the agent at `address` answered /health within `timeout_s`. While its
    container starts the port refuses connections: that is asked with a bare connect every
    25 ms (an HTTP client's failed request costs a hundred times the CPU, and a fork's
    eight children are asked at once on the cores they start on), /health once it accepts."""
    url = Agent(address, token="", port=port).url("/health")
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=httpx.Timeout(2.0)) as http:
        while time.monotonic() < deadline:
            try:
                socket.create_connection((address, port), timeout=1.0).close()
                if http.get(url).status_code == httpx.codes.NO_CONTENT:
                    return True
            except (OSError, httpx.HTTPError):
                pass
            time.sleep(0.025)
    return False


def client() -> httpx.AsyncClient:
    """A client for agent calls (one per API process: it pools connections to pods)."""
    timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
    return httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_keepalive_connections=64))


def _envelope(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode()
    return _ENVELOPE.pack(0, len(payload)) + payload


def _refusal(status: int, body: bytes) -> AgentError:
    try:
        said = json.loads(body)
        message = str(said.get("message") or said)
    except (ValueError, AttributeError):
        message = body.decode("utf-8", "replace")[:500]
    if status == httpx.codes.UNAUTHORIZED:
        # Not the caller's doing: this agent does not take the control plane's token.
        return AgentError(f"the agent refused the sandbox's token: {message}")
    return AgentRefused(status, message or f"HTTP {status}")


async def _unary(http: httpx.AsyncClient, agent: Agent, method: str, message: dict[str, Any]) -> None:
    try:
        answer = await http.post(
            agent.url(f"/process.Process/{method}"),
            json=message,
            headers={**agent.headers, "Connect-Protocol-Version": "1"},
            timeout=30.0,
        )
    except httpx.HTTPError as exc:
        raise AgentError(f"{method}: {exc}") from exc
    if answer.status_code != httpx.codes.OK:
        raise _refusal(answer.status_code, answer.content)


async def _feed(http: httpx.AsyncClient, agent: Agent, pid: int, stdin: bytes) -> None:
    """Write `stdin` to the process, then close it, beside the reading of its output (a
    process that writes before it reads would otherwise wait on us while we wait on it)."""
    selector = {"pid": pid}
    for at in range(0, len(stdin), _STDIN_CHUNK):
        chunk = base64.b64encode(stdin[at : at + _STDIN_CHUNK]).decode()
        await _unary(http, agent, "SendInput", {"process": selector, "input": {"stdin": chunk}})
    await _unary(http, agent, "CloseStdin", {"process": selector})


async def _messages(response: httpx.Response) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """The stream's envelopes as (flags, message)."""
    buffer = bytearray()
    async for data in response.aiter_bytes():
        buffer.extend(data)
        while len(buffer) >= _ENVELOPE.size:
            flags, length = _ENVELOPE.unpack_from(buffer)
            if len(buffer) < _ENVELOPE.size + length:
                break
            payload = bytes(buffer[_ENVELOPE.size : _ENVELOPE.size + length])
            del buffer[: _ENVELOPE.size + length]
            try:
                message = json.loads(payload) if payload else {}
            except ValueError as exc:
                raise AgentError(f"the agent sent a message that is not JSON: {exc}") from exc
            yield flags, message
    if buffer:
        raise AgentError("the agent's stream ended inside a message")


class Command:
    """A command the agent has started: `outputs()` streams what it writes and how it ends;
    `close()` lets go of the stream (the command keeps running if it has not ended)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        agent: Agent,
        response: httpx.Response,
        messages: AsyncIterator[tuple[int, dict[str, Any]]],
        pid: int,
    ) -> None:
        self._http, self._agent, self._response, self._messages = http, agent, response, messages
        self.pid = pid

    async def outputs(self, stdin: bytes | None = None) -> AsyncIterator[tuple[str, bytes] | Exit]:
        """Output as (STDOUT or STDERR, bytes) as it comes, then one Exit; `stdin` (when
        the command was started with stdin) is written and closed meanwhile."""
        feeding = None
        if stdin is not None:
            feeding = asyncio.create_task(_feed(self._http, self._agent, self.pid, stdin))
        try:
            async for flags, message in self._messages:
                if flags & _END_STREAM:
                    error = message.get("error")
                    yield Exit(
                        None,
                        str(error.get("message") or error.get("code"))
                        if error
                        else "the agent's stream ended before the command did",
                    )
                    return
                event = message.get("event") or {}
                if "data" in event:
                    for stream in (STDOUT, STDERR):
                        if event["data"].get(stream):
                            yield stream, base64.b64decode(event["data"][stream])
                elif "end" in event:
                    end = event["end"]
                    if end.get("exited"):
                        yield Exit(int(end.get("exitCode", 0)))
                    else:
                        reason = end.get("error") or end.get("status") or "the command did not exit"
                        yield Exit(None, str(reason))
                    return
            yield Exit(None, "the agent's stream ended before the command did")
        except (httpx.HTTPError, AgentError) as exc:
            yield Exit(None, f"the agent's stream broke: {exc}")
        finally:
            if feeding is not None:
                feeding.cancel()
                with contextlib.suppress(asyncio.CancelledError, AgentError):
                    await feeding

    async def close(self) -> None:
        await self._response.aclose()


async def start(
    http: httpx.AsyncClient, agent: Agent, command: Sequence[str], *, stdin: bool = False
) -> Command:
    """Start `command` in the sandbox (as the image's user, in its working directory);
    AgentRefused when the agent says it cannot (no such executable), AgentError when it
    cannot be reached."""
    message: dict[str, Any] = {"process": {"cmd": command[0], "args": list(command[1:])}}
    if stdin:
        message["stdin"] = True
    headers = {
        **agent.headers,
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
    }
    request = http.build_request(
        "POST", agent.url("/process.Process/Start"), content=_envelope(message), headers=headers
    )
    try:
        response = await _send_once_listening(http, request)
    except httpx.HTTPError as exc:
        raise AgentError(f"cannot reach the agent: {exc}") from exc
    try:
        if response.status_code != httpx.codes.OK:
            raise _refusal(response.status_code, await response.aread())
        messages = _messages(response)
        async for flags, said in messages:
            if flags & _END_STREAM:
                error = said.get("error") or {}
                raise AgentRefused(400, str(error.get("message") or "the agent refused the command"))
            event = said.get("event") or {}
            if "start" in event:
                return Command(http, agent, response, messages, int(event["start"].get("pid", 0)))
        raise AgentError("the agent ended the call before the command started")
    except httpx.HTTPError as exc:
        await response.aclose()
        raise AgentError(f"the agent's stream broke: {exc}") from exc
    except BaseException:
        await response.aclose()
        raise


async def _send_once_listening(http: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    deadline = asyncio.get_running_loop().time() + AGENT_STARTING_S
    while True:
        try:
            return await http.send(request, stream=True)
        except httpx.ConnectError:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(0.05)


async def read_file(http: httpx.AsyncClient, agent: Agent, path: str, max_bytes: int) -> bytes:
    """The file's bytes; AgentRefused(404) when there is none, AgentRefused(413) past max_bytes."""
    try:
        async with http.stream(
            "GET", agent.url("/files"), params={"path": path}, headers=agent.headers
        ) as got:
            if got.status_code != httpx.codes.OK:
                raise _refusal(got.status_code, await got.aread())
            data = bytearray()
            async for chunk in got.aiter_bytes():
                data.extend(chunk)
                if len(data) > max_bytes:
                    raise AgentRefused(413, f"files larger than {max_bytes} bytes")
            return bytes(data)
    except httpx.HTTPError as exc:
        raise AgentError(f"cannot read from the agent: {exc}") from exc


async def write_file(http: httpx.AsyncClient, agent: Agent, path: str, data: bytes) -> None:
    """Write the file (replacing it, making its directories) as the sandbox's user."""
    try:
        answer = await http.post(
            agent.url("/files"),
            params={"path": path},
            content=data,
            headers={**agent.headers, "Content-Type": "application/octet-stream"},
        )
    except httpx.HTTPError as exc:
        raise AgentError(f"cannot write through the agent: {exc}") from exc
    if answer.status_code != httpx.codes.OK:
        raise _refusal(answer.status_code, answer.content)


async def metrics(
    http: httpx.AsyncClient, agent: Agent, start: int | None = None, end: int | None = None
) -> list[dict[str, Any]]:
    """The agent's resource samples (oldest first), within [start, end] in unix seconds."""
    params = {k: str(v) for k, v in (("start", start), ("end", end)) if v is not None}
    try:
        answer = await http.get(agent.url("/metrics"), params=params, headers=agent.headers, timeout=10.0)
    except httpx.HTTPError as exc:
        raise AgentError(f"cannot read the agent's metrics: {exc}") from exc
    if answer.status_code != httpx.codes.OK:
        raise _refusal(answer.status_code, answer.content)
    try:
        samples = answer.json()
    except ValueError as exc:
        raise AgentError(f"the agent's metrics are not JSON: {exc}") from exc
    if not isinstance(samples, list):
        raise AgentError("the agent's metrics are not a list")
    return [s for s in samples if isinstance(s, dict)]
