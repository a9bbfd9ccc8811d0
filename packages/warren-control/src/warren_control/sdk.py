"""A typed Python client for the Warren API.

    from warren_control.sdk import Client

    with Client("https://warren.example", api_key) as warren:
        box = warren.create("python:3.12", command=["sleep", "infinity"])
        warren.wait_until(box.id, "Running", timeout=300, progress=lambda b: print(b.phase))
        result = warren.run(box.id, ["echo", "hi"])
        print(result.exit_code, result.stdout)
        warren.delete(box.id)

Every refusal raises `WarrenError` carrying the API's error code and message.
"""

from __future__ import annotations

import base64
import builtins
import json
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self

import httpx
from pydantic import ValidationError

from warren_control.api import shapes
from warren_control.api.shapes import SandboxOut

Phase = shapes.Phase  # the SDK's callers name it from here
Stream = Literal["stdout", "stderr"]


class WarrenError(Exception):
    """The API refused a request: `code` is its error code (`not_found`, `quota_exceeded`,
    `unsupported_capability`, ...), `status` the HTTP status (0 if it never answered)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class WaitTimeout(WarrenError):  # noqa: N818 (a WarrenError like the others)
    def __init__(self, message: str) -> None:
        super().__init__(0, "timeout", message)


class CannotStart(WarrenError):  # noqa: N818 (a WarrenError like the others)
    """The sandbox's pod cannot start as asked: its image is missing where nothing is
    pulled, or no node has had room for it for a while. The message is the cluster's."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "cannot_start", message)


# Waiting reasons no amount of waiting fixes (the node never pulls; the name cannot parse).
HOPELESS_REASONS = frozenset({"ErrImageNeverPull", "InvalidImageName"})
LONG_POLL_S = 10.0  # how long one GET of wait_until may wait for news


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Sandbox:
    id: str
    phase: Phase
    spec: Mapping[str, Any]
    conditions: tuple[Condition, ...]
    workspace_id: str | None
    created_at: datetime | None
    started_at: datetime | None
    last_activity_at: datetime | None
    expires_at: datetime | None
    deleted_at: datetime | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sandbox:
        """A sandbox as the API answers it, read through the API's own shape (SandboxOut):
        an answer that does not fit it is refused here, by name, not half-read."""
        try:
            out = SandboxOut.model_validate(data)
        except ValidationError as exc:
            raise WarrenError(0, "bad_response", f"the API's sandbox does not fit its shape: {exc}") from exc
        return cls(
            id=out.id,
            phase=out.phase,
            spec=out.spec.model_dump(mode="json"),
            conditions=tuple(Condition(c.type, c.status, c.reason, c.message) for c in out.conditions),
            workspace_id=out.workspace_id,
            created_at=out.created_at,
            started_at=out.started_at,
            last_activity_at=out.last_activity_at,
            expires_at=out.expires_at,
            deleted_at=out.deleted_at,
            raw=data,
        )

    @classmethod
    def gone(cls, sandbox_id: str) -> Sandbox:
        """What waiting for a deletion ends with: the API no longer knows the sandbox."""
        return cls(
            sandbox_id,
            "Deleted",
            {},
            (),
            None,
            None,
            None,
            None,
            None,
            None,
            {"id": sandbox_id, "phase": "Deleted"},
        )

    @property
    def reason(self) -> str:
        """What the Ready condition says, for progress output."""
        ready = self.ready_condition
        if ready is None:
            return ""
        return f"{ready.reason}: {ready.message}" if ready.message else ready.reason

    @property
    def ready_condition(self) -> Condition | None:
        return next((c for c in self.conditions if c.type == "Ready"), None)


@dataclass(frozen=True)
class Page:
    items: list[Sandbox]
    next_cursor: str | None


@dataclass(frozen=True)
class ForkResult:
    """One child of a fork: a sandbox, or the reason this one was not made."""

    sandbox: Sandbox | None
    error: str | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.sandbox is not None


@dataclass(frozen=True)
class Output:
    stream: Stream
    data: bytes


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True)
class WorkspaceProof:
    """Every write at or below `replicated_sequence` is in object storage (None: nothing is)."""

    workspace_id: str
    replicated_sequence: int | None
    checked_at: datetime | None


def _new_idempotency_key() -> str:
    return uuid.uuid4().hex


class Client:
    """The API at `base_url` (the edge), authenticated with an API key or an OIDC token."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "warren-sdk"},
            timeout=httpx.Timeout(timeout),
            transport=transport,
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # ---- plumbing

    @staticmethod
    def _raise_for(response: httpx.Response) -> None:
        if response.is_success:
            return
        try:
            body = response.json()
            code, message = str(body["error"]), str(body["message"])
        except (ValueError, KeyError, TypeError):
            code, message = "http_error", response.text[:500] or response.reason_phrase
        raise WarrenError(response.status_code, code, message)

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        try:
            response = self._http.request(
                method, path, json=json_body, params=params, headers=headers, content=content
            )
        except httpx.HTTPError as exc:
            raise WarrenError(0, "unreachable", f"{method} {path}: {exc}") from exc
        self._raise_for(response)
        return response

    def _sandbox(self, method: str, path: str, **kwargs: Any) -> Sandbox:
        return Sandbox.from_json(self._request(method, path, **kwargs).json())

    # ---- sandboxes

    def create(
        self,
        image: str,
        *,
        command: builtins.list[str] | None = None,
        cpu_millis: int | None = None,
        memory_mib: int | None = None,
        persistent: bool = False,
        idle_timeout_s: int | None = None,
        max_lifetime_s: int | None = None,
        workspace_size_gib: int | None = None,
        workspace_template: str | None = None,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Sandbox:
        """Create a sandbox. An idempotency key is sent always (a fresh one unless given), so
        the SDK's own retry of a lost answer can never make a second sandbox."""
        body: dict[str, Any] = {"image": image, "persistent": persistent, **options}
        for name, value in (
            ("command", command),
            ("cpu_millis", cpu_millis),
            ("memory_mib", memory_mib),
            ("idle_timeout_s", idle_timeout_s),
            ("max_lifetime_s", max_lifetime_s),
        ):
            if value is not None:
                body[name] = value
        if workspace_size_gib is not None or workspace_template is not None:
            workspace: dict[str, Any] = {}
            if workspace_size_gib is not None:
                workspace["size_gib"] = workspace_size_gib
            if workspace_template is not None:
                workspace["template"] = workspace_template
            body["workspace"] = workspace
        key = idempotency_key or _new_idempotency_key()
        created: Sandbox = self._retrying(
            lambda: self._sandbox("POST", "/v1/sandboxes", json_body=body, headers={"Idempotency-Key": key})
        )
        return created

    @staticmethod
    def _retrying(call: Callable[[], Any], attempts: int = 3) -> Any:
        """Retry a call that carries an idempotency key when no answer came back."""
        for attempt in range(attempts):
            try:
                return call()
            except WarrenError as exc:
                if exc.code != "unreachable" or attempt == attempts - 1:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("not reached")

    def get(self, sandbox_id: str, *, wait_s: float = 0) -> Sandbox:
        """The sandbox as it is; with `wait_s`, a long poll: once a starting sandbox runs,
        cannot start or reports another state, at most `wait_s` seconds later."""
        params = {"wait_s": wait_s} if wait_s > 0 else None
        return self._sandbox("GET", f"/v1/sandboxes/{sandbox_id}", params=params)

    def list_page(self, *, limit: int = 50, cursor: str | None = None) -> Page:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        data = self._request("GET", "/v1/sandboxes", params=params).json()
        return Page([Sandbox.from_json(item) for item in data["items"]], data.get("next_cursor"))

    def list(self, *, page_size: int = 100) -> Iterator[Sandbox]:
        """Every sandbox of the organization, oldest first, fetched a page at a time."""
        cursor: str | None = None
        while True:
            page = self.list_page(limit=page_size, cursor=cursor)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def delete(self, sandbox_id: str) -> Sandbox:
        return self._sandbox("DELETE", f"/v1/sandboxes/{sandbox_id}")

    def fork(
        self, sandbox_id: str, count: int = 1, *, idempotency_key: str | None = None, secrets: bool = False
    ) -> builtins.list[ForkResult]:
        """Fork into `count` children; `secrets` keeps the parent's secret bindings."""
        key = idempotency_key or _new_idempotency_key()
        body: dict[str, Any] = {"count": count, **({"secrets": True} if secrets else {})}

        def call() -> builtins.list[ForkResult]:
            data = self._request(
                "POST",
                f"/v1/sandboxes/{sandbox_id}/fork",
                json_body=body,
                headers={"Idempotency-Key": key},
            ).json()
            return [
                ForkResult(Sandbox.from_json(r["sandbox"]))
                if r.get("ok")
                else ForkResult(None, r.get("error"), r.get("message"))
                for r in data["results"]
            ]

        results: builtins.list[ForkResult] = self._retrying(call)
        return results

    # ---- secrets: write-only, no answer carries a value

    def create_secret(
        self, name: str, value: str, destinations: builtins.list[str], **options: Any
    ) -> dict[str, Any]:
        """Store a secret the egress gateway injects (options: header, template, query, env,
        budget {requests, bytes, period_s})."""
        body = {"name": name, "value": value, "destinations": destinations, **options}
        found: dict[str, Any] = self._request("POST", "/v1/secrets", json_body=body).json()
        return found

    def list_secrets(self) -> builtins.list[dict[str, Any]]:
        items: builtins.list[dict[str, Any]] = self._request("GET", "/v1/secrets").json()["items"]
        return items

    def get_secret(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self._request("GET", f"/v1/secrets/{name}").json()
        return found

    def update_secret(self, name: str, **changes: Any) -> dict[str, Any]:
        """Rotate the value (value=...) or change destinations, header, template, query, budget."""
        found: dict[str, Any] = self._request("PATCH", f"/v1/secrets/{name}", json_body=changes).json()
        return found

    def revoke_secret(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self._request("DELETE", f"/v1/secrets/{name}").json()
        return found

    def secret_uses(self, name: str, *, limit: int = 100) -> builtins.list[dict[str, Any]]:
        items: builtins.list[dict[str, Any]] = self._request(
            "GET", f"/v1/secrets/{name}/uses", params={"limit": limit}
        ).json()["items"]
        return items

    def stop(self, sandbox_id: str, *, memory: bool = False) -> Sandbox:
        """Stop the sandbox; with `memory`, its processes' memory is captured first and the
        next start resumes them."""
        body = {"memory_capture": True} if memory else None
        return self._sandbox("POST", f"/v1/sandboxes/{sandbox_id}/stop", json_body=body)

    def start(self, sandbox_id: str, *, cold: bool = False) -> Sandbox:
        """Start the sandbox again: resumed from its memory if that was captured, unless
        `cold`."""
        body = {"cold": True} if cold else None
        return self._sandbox("POST", f"/v1/sandboxes/{sandbox_id}/start", json_body=body)

    def keepalive(self, sandbox_id: str) -> Sandbox:
        return self._sandbox("POST", f"/v1/sandboxes/{sandbox_id}/keepalive")

    # ---- commands and files

    def exec(
        self,
        sandbox_id: str,
        command: builtins.list[str],
        *,
        timeout: int = 60,
        stdin: bytes | None = None,
    ) -> Generator[Output, None, int]:
        """Run `command`, yielding its output as it arrives; the generator's return value
        (`code = yield from client.exec(...)`) is the exit code. `stdin`, when given, is the
        command's standard input (closed after it). Raises WarrenError if the command could
        not run or did not finish in `timeout` seconds."""
        body: dict[str, Any] = {"command": command, "timeout_s": timeout}
        if stdin is not None:
            body["stdin_base64"] = base64.b64encode(stdin).decode()
        # No read timeout: a command may be quiet for a long time and still be working.
        read_timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        try:
            with self._http.stream(
                "POST", f"/v1/sandboxes/{sandbox_id}/exec", json=body, timeout=read_timeout
            ) as response:
                if not response.is_success:
                    response.read()
                    self._raise_for(response)
                for line in response.iter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if "stream" in event:
                        text = event.get("text")
                        data = (
                            text.encode() if text is not None else base64.b64decode(event.get("base64", ""))
                        )
                        yield Output(event["stream"], data)
                    elif event.get("exit_code") is not None:
                        return int(event["exit_code"])
                    else:
                        raise WarrenError(200, str(event.get("error")), str(event.get("message")))
        except httpx.HTTPError as exc:
            raise WarrenError(0, "unreachable", f"exec: {exc}") from exc
        raise WarrenError(0, "unreachable", "the exec stream ended without an exit code")

    def run(
        self,
        sandbox_id: str,
        command: builtins.list[str],
        *,
        timeout: int = 60,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run `command` to completion and collect its output."""
        out, err = bytearray(), bytearray()
        stream = self.exec(sandbox_id, command, timeout=timeout, stdin=stdin)
        while True:
            try:
                chunk = next(stream)
            except StopIteration as done:
                return ExecResult(int(done.value), bytes(out), bytes(err))
            (out if chunk.stream == "stdout" else err).extend(chunk.data)

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        return self._request("GET", f"/v1/sandboxes/{sandbox_id}/files", params={"path": path}).content

    def write_file(self, sandbox_id: str, path: str, data: bytes) -> int:
        response = self._request(
            "PUT",
            f"/v1/sandboxes/{sandbox_id}/files",
            params={"path": path},
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        return int(response.json()["size"])

    def workspace_proof(self, sandbox_id: str) -> WorkspaceProof:
        """What object storage proves about the sandbox's workspace (read from storage now)."""
        data = self._request("GET", f"/v1/sandboxes/{sandbox_id}/workspace").json()
        return WorkspaceProof(data["workspace_id"], data["replicated_sequence"], _time(data["checked_at"]))

    # ---- waiting

    def wait_until(
        self,
        sandbox_id: str,
        phase: Phase,
        timeout: float = 300.0,
        progress: Callable[[Sandbox], None] | None = None,
        *,
        interval: float = 1.0,
        unschedulable_for: float | None = 60.0,
    ) -> Sandbox:
        """Wait until the sandbox is in `phase`, asking in long polls (the server answers
        as soon as a starting sandbox's state changes), at least `interval` apart when
        nothing changed; `progress` sees every state it passes through (once per change).
        Raises WarrenError `failed` if it fails instead, and WaitTimeout after `timeout`
        seconds. Waiting for "Running" ends with CannotStart, naming the cluster's reason,
        as soon as the pod's image cannot be had, or once no node had room for it for
        `unschedulable_for` seconds (None: wait for room until the timeout). Waiting for
        "Deleted" ends when the sandbox is gone."""
        deadline = time.monotonic() + timeout
        last: tuple[str, str] | None = None
        unschedulable_since: float | None = None
        while True:
            asked, before = time.monotonic(), last
            try:
                sandbox = self.get(sandbox_id, wait_s=min(LONG_POLL_S, max(0.0, deadline - asked)))
            except WarrenError as exc:
                if phase == "Deleted" and exc.code == "not_found":
                    return Sandbox.gone(sandbox_id)
                raise
            seen = (sandbox.phase, sandbox.reason)
            if progress is not None and seen != last:
                progress(sandbox)
            last = seen
            if sandbox.phase == phase:
                return sandbox
            if sandbox.phase == "Failed" and phase != "Failed":
                raise WarrenError(200, "failed", sandbox.reason or "the sandbox failed")
            ready = sandbox.ready_condition
            why = ready.reason if ready is not None and sandbox.phase == "Pending" else ""
            if phase == "Running" and why in HOPELESS_REASONS:
                raise CannotStart(f"{sandbox_id} cannot start: {sandbox.reason}")
            now = time.monotonic()
            unschedulable_since = (unschedulable_since or now) if why == "Unschedulable" else None
            if (
                phase == "Running"
                and unschedulable_since is not None
                and unschedulable_for is not None
                and now - unschedulable_since >= unschedulable_for
            ):
                raise CannotStart(
                    f"{sandbox_id} found no node with room for {now - unschedulable_since:.0f} s: "
                    f"{sandbox.reason} (ask for less CPU or memory, or free some)"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(f"{sandbox_id} is {sandbox.phase} after {timeout:.0f} s, not {phase}")
            if seen == before:
                time.sleep(max(0.0, min(interval - (time.monotonic() - asked), remaining)))
