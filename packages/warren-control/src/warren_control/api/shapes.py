"""The API's request and response shapes (pydantic), and how its error answers are documented."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from warren_control.scrub import scrub

if TYPE_CHECKING:
    from warren_control.models import Sandbox

RUNTIME = "gvisor"
MAX_FORK = 100
MAX_EXEC_TIMEOUT_S = 3600
WORKSPACE_ID = r"^ws_[a-z2-7]{26}$"
SCHEMAS = "#/components/schemas/"
SECRET_NAME = r"^[a-z][a-z0-9-]{0,62}$"  # noqa: S105 (a pattern for names, not a password)


def _utf8(value: str) -> str:
    # A lone surrogate survives JSON decoding but no database or exec call can carry it.
    value.encode("utf-8")
    if "\x00" in value:
        raise ValueError("must not contain NUL")
    return value


Text = Annotated[str, AfterValidator(_utf8)]
Arg = Annotated[Text, Field(max_length=8192)]


class Strict(BaseModel):
    # Unknown fields are refused: a misspelt option must not be silently dropped.
    model_config = ConfigDict(extra="forbid", strict=True)


class WorkspaceRequest(Strict):
    size_gib: int = Field(default=10, ge=1, le=4096, description="Size of the workspace in GiB.")
    template: str | None = Field(
        default=None,
        pattern=WORKSPACE_ID,
        description="A workspace of this organization (a sandbox's workspace_id) to start from.",
    )


OnIdle = Literal["delete", "stop", "pause"]


class CreateSandboxRequest(Strict):
    image: str = Field(
        min_length=1, max_length=512, pattern=r"^[\x21-\x7e]+$", description="OCI image reference."
    )
    command: list[Arg] | None = Field(default=None, min_length=1, max_length=256)
    cpu_millis: int = Field(default=1000, ge=10, le=256_000, description="CPU in thousandths of a core.")
    memory_mib: int = Field(default=1024, ge=64, le=1_048_576, description="Memory in MiB.")
    persistent: bool = Field(default=False, description="Exempt from the idle timeout (if the org may).")
    idle_timeout_s: int | None = Field(
        default=None, ge=60, description="Stop after this long without activity (the org's limit at most)."
    )
    max_lifetime_s: int | None = Field(
        default=None, ge=60, description="Delete this long after creation (the org's limit at most)."
    )
    workspace: WorkspaceRequest | None = None
    runtime: Text = Field(default=RUNTIME, max_length=64, description="Only gvisor.")
    gpu: int = Field(default=0, ge=0, le=64, description="GPUs; refused where the deployment has none.")
    memory_capture: bool = Field(
        default=False,
        description="Refused: memory is captured by a stop that asks for it, or on idle (on_idle: pause).",
    )
    on_idle: OnIdle | None = Field(
        default=None,
        description=(
            "What the reaper does past the idle timeout: delete (the default), stop (the default "
            "for a persistent sandbox: the workspace stays) or pause (stop with the processes' "
            "memory captured, where the deployment can; the next exec, file call or start "
            "resumes it)."
        ),
    )
    secrets: list[Annotated[str, Field(pattern=SECRET_NAME)]] | None = Field(
        default=None,
        max_length=32,
        description=(
            "Secrets of the organization (POST /v1/secrets) the sandbox may use through the egress "
            "gateway: its environment holds placeholders and WARREN_GATEWAY_URL, never a value."
        ),
    )


class ForkRequest(Strict):
    count: int = Field(default=1, ge=1, le=MAX_FORK)
    secrets: bool = Field(
        default=False, description="Keep the parent's secret bindings (without it the children have none)."
    )


class StopRequest(Strict):
    memory_capture: bool = Field(
        default=False,
        description="Capture the processes' memory first: the next start resumes them where they were.",
    )


class StartRequest(Strict):
    cold: bool = Field(
        default=False,
        description="Start anew even where memory was captured (a resume is never given up silently).",
    )


class ExecRequest(Strict):
    command: list[Arg] = Field(min_length=1, max_length=256)
    timeout_s: int = Field(default=60, ge=1, le=MAX_EXEC_TIMEOUT_S)
    stdin_base64: str | None = Field(
        default=None,
        description="Bytes for the command's standard input (base64), closed after them; "
        "without it the command's stdin is empty.",
    )


Phase = Literal["Pending", "Running", "Stopped", "Failed", "Terminating", "Deleted"]


class ErrorOut(BaseModel):
    error: str
    message: str


class WorkspaceOut(BaseModel):
    size_gib: int
    template: str | None = None
    fork_of: str | None = None


class SpecOut(BaseModel):
    # What the sandbox was created with. The E2B surface keeps its own settings here too
    # (env, metadata, ...): those pass through as they were written.
    model_config = ConfigDict(extra="allow")

    image: str
    command: list[str] | None = None
    cpu_millis: int
    memory_mib: int
    persistent: bool
    idle_timeout_s: int
    max_lifetime_s: int
    runtime: str
    stopped: bool = False
    on_idle: str | None = None
    workspace: WorkspaceOut | None = None
    forked_from: str | None = None


class ConditionOut(BaseModel):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class LocationOut(BaseModel):
    """Where the sandbox runs, as coarse as the cluster's topology labels: never a node."""

    zone: str | None = None
    region: str | None = None


class SandboxOut(BaseModel):
    id: str
    phase: Phase
    spec: SpecOut
    conditions: list[ConditionOut]
    workspace_id: str | None
    created_at: datetime
    started_at: datetime | None
    last_activity_at: datetime
    idle_deadline_at: datetime | None = Field(
        description="When the reaper acts if nothing happens: deletes it, or stops a persistent one"
    )
    expires_at: datetime = Field(description="The hard lifetime: the reaper deletes it then")
    deleted_at: datetime | None
    location: LocationOut | None

    @classmethod
    def of(cls, record: Sandbox, *hide: str) -> SandboxOut:
        """The record as a client may see it, checked against this shape: never its internal
        object name; conditions' words scrubbed of `hide` (names of the cluster's, not the
        client's)."""
        names = (record.object_name, *hide)
        return cls(
            id=record.id,
            phase=record.phase.value,
            spec=SpecOut.model_validate(record.spec),
            conditions=[
                ConditionOut(
                    type=str(c.get("type", "")),
                    status=str(c.get("status", "")),
                    reason=scrub(str(c.get("reason") or ""), *names),
                    message=scrub(str(c.get("message") or ""), *names),
                    last_transition_time=c.get("last_transition_time"),
                )
                for c in record.conditions or []
            ],
            workspace_id=record.workspace_id,
            created_at=record.created_at,
            started_at=record.started_at,
            last_activity_at=record.last_activity_at,
            idle_deadline_at=record.idle_deadline_at,
            expires_at=record.expires_at,
            deleted_at=record.deleted_at,
            location=None if record.location is None else LocationOut.model_validate(record.location),
        )

    def doc(self) -> dict[str, Any]:
        """As JSON, the way the API answers."""
        return self.model_dump(mode="json")


class PageOut(BaseModel):
    items: list[SandboxOut]
    next_cursor: str | None


class ForkResultOut(BaseModel):
    ok: bool
    sandbox: SandboxOut | None = None
    error: str | None = None
    message: str | None = None


class ForkOut(BaseModel):
    results: list[ForkResultOut]


class WorkspaceProofOut(BaseModel):
    """What object storage proves about a sandbox's workspace, read from storage now."""

    workspace_id: str
    replicated_sequence: int | None = Field(
        description=(
            "The newest batch of workspace writes confirmed in object storage (a `replicated` "
            "receipt names such a number; 0: none since the workspace was made or forked; null: "
            "the workspace is not in storage yet). Every write at or below it survives the loss "
            "of the node the sandbox runs on."
        )
    )
    checked_at: datetime


class FileWrittenOut(BaseModel):
    path: str
    size: int


class ExecEventOut(BaseModel):
    """One line of an exec stream: output (`stream` with `text`, or `base64` for bytes that
    are not UTF-8), then one last line with `exit_code` (null with `error` if the command
    could not run, timed out or the connection was lost)."""

    stream: Literal["stdout", "stderr"] | None = None
    text: str | None = None
    base64: str | None = None
    exit_code: int | None = None
    error: str | None = None
    message: str | None = None


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    described = {
        400: "Invalid request, or a capability this deployment cannot provide",
        401: "Missing or invalid identity",
        403: "Forbidden by policy or quota",
        404: "No such sandbox in this organization",
        409: "The sandbox is not in a state that allows this",
        413: "Too large",
        422: "Idempotency key reused with a different request",
        503: "The cluster is unavailable",
    }
    return {code: {"model": ErrorOut, "description": described[code]} for code in codes}


def error_content() -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}


class BudgetIn(Strict):
    requests: int | None = Field(default=None, ge=1, description="Requests at most in each period.")
    bytes: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Bytes both ways at most in each period."
    )
    period_s: int = Field(default=3600, ge=60, le=31 * 24 * 3600, description="The period, in seconds.")


class CreateSecretRequest(Strict):
    name: str = Field(pattern=SECRET_NAME, description="Unique among the organization's live secrets.")
    value: Text = Field(min_length=1, max_length=8192, description="The credential. Never returned.")
    destinations: list[Text] = Field(
        min_length=1,
        max_length=16,
        description="Where it may go: https://HOST[:PORT][/PATH-PREFIX], exactly.",
    )
    header: str | None = Field(default=None, max_length=128, description="The header it goes in (or query).")
    template: Text | None = Field(
        default=None,
        max_length=1024,
        description="The header's value, with {secret} where it goes (e.g. 'Bearer {secret}').",
    )
    query: str | None = Field(
        default=None, max_length=128, description="The query parameter it goes in instead."
    )
    env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
        description="An environment variable a sandbox bound to it holds a placeholder in "
        "(for tools that insist on one).",
    )
    budget: BudgetIn | None = None


class UpdateSecretRequest(Strict):
    value: Text | None = Field(
        default=None, min_length=1, max_length=8192, description="A new value (a rotation)."
    )
    destinations: list[Text] | None = Field(default=None, min_length=1, max_length=16)
    header: str | None = Field(default=None, max_length=128)
    template: Text | None = Field(default=None, max_length=1024)
    query: str | None = Field(default=None, max_length=128)
    budget: BudgetIn | None = None


class SecretOut(BaseModel):
    id: str
    name: str
    destinations: list[str]
    header: str | None = None
    template: str | None = None
    query: str | None = None
    env: str | None = None
    placeholder: str
    budget: BudgetIn | None = None
    version: int
    created_at: datetime
    rotated_at: datetime | None = None
    revoked_at: datetime | None = None


class SecretListOut(BaseModel):
    items: list[SecretOut]


class SecretUseOut(BaseModel):
    secret_id: str | None
    sandbox_id: str | None
    destination: str
    status: int
    outcome: str
    bytes_sent: int
    bytes_received: int
    at: datetime
    duration_ms: int


class SecretUseListOut(BaseModel):
    items: list[SecretUseOut]
