"""The message contract: every message EPU services exchange, typed and versioned.

Why one module: rule 2 of the design ("one contract, one place"). Services never build
raw dicts; they build these models, and ``common.codec`` turns them into msgpack
envelopes. Outside clients follow docs/messages.md, which documents exactly these fields.

Versioning: the envelope carries ``schema_version`` "MAJOR.MINOR". A consumer accepts any
minor version of a major it knows (unknown fields are ignored, new fields must be optional)
and dead-letters a major it does not know. Bodies are validated strictly: a string where an
integer is expected is rejected, not coerced, because a wire protocol that guesses hides
bugs in the sender.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

SCHEMA_MAJOR = 1
SCHEMA_MINOR = 0
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.{SCHEMA_MINOR}"

#: Domain and context names appear in routing keys and queue names, so no dots or spaces.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
#: RFC 1123 host name (labels of letters, digits and hyphens; not starting or ending with '-').
HOSTNAME_PATTERN = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
Hostname = Annotated[str, StringConstraints(max_length=253, pattern=HOSTNAME_PATTERN)]
Id = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
#: Ids that appear as a word of a routing key (no dots).
KeyId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
NonNegInt = Annotated[int, Field(ge=0)]

NodeState = Literal["free", "busy", "offline", "down", "unknown"]
"""Normalized batch node state. ``offline`` covers draining: a node offlined while it still
runs jobs is draining; ``jobs``/``cores_used`` tell how far the drain has come."""

JobState = Literal["queued", "held", "blocked"]
"""State of a job that is not running. Only ``queued`` is demand; ``held`` (user/admin
hold) and ``blocked`` (dependency, or can never run) are reported but not counted."""

InstanceState = Literal[
    "requested", "pending", "started", "joined", "draining", "terminating", "terminated", "failed"
]
#: The order instance states move in (rule 4: state only moves forward). ``failed`` is terminal.
INSTANCE_STATE_ORDER: dict[str, int] = {
    "requested": 0,
    "pending": 1,
    "started": 2,
    "joined": 3,
    "draining": 4,
    "terminating": 5,
    "terminated": 6,
    "failed": 6,
}
TERMINAL_INSTANCE_STATES = frozenset({"terminated", "failed"})

NodeAction = Literal["add", "offline", "online", "remove"]
ErrorKind = Literal["transient", "capacity", "permanent"]


def new_id() -> str:
    """A fresh message/command id: 32 hex chars, unique without coordination."""
    return uuid.uuid4().hex


def is_valid_hostname(name: str) -> bool:
    return len(name) <= 253 and bool(re.match(HOSTNAME_PATTERN, name))


class Model(BaseModel):
    """Base for nested records: strict, immutable, unknown fields ignored (minor-version tolerance)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class Message(Model):
    """Base of every message body.

    ``TYPE`` is the wire name (envelope ``type``); ``MAJOR`` the schema major version this
    class implements. ``routing_key()`` says where on its exchange the message goes;
    ``common.topology`` decides which exchange.
    """

    TYPE: ClassVar[str]
    MAJOR: ClassVar[int] = SCHEMA_MAJOR

    def routing_key(self) -> str:
        raise NotImplementedError


REGISTRY: dict[str, type[Message]] = {}


def register(cls: type[Message]) -> type[Message]:
    if cls.TYPE in REGISTRY:
        raise ValueError(f"message type {cls.TYPE!r} registered twice")
    REGISTRY[cls.TYPE] = cls
    return cls


# --------------------------------------------------------------------------- sensor


class QueuedJob(Model):
    """A job that is not running yet. ``count`` > 1 stands for that many identical pending
    array elements (demand counts each element)."""

    job_id: str
    """The batch system's job id (array elements as the system writes them)."""
    cores: Annotated[int, Field(ge=1)] = 1
    """Cores per node requested."""
    nodes: Annotated[int, Field(ge=1)] = 1
    """Nodes requested; a job asking N nodes x M cores needs N nodes with M free cores each."""
    memory_mb: NonNegInt = 0
    """Memory per node requested, 0 when unknown."""
    queue: str = ""
    """Queue (Torque), partition (Slurm) or pool."""
    submit_time: float = 0.0
    """When the job was submitted (epoch seconds)."""
    wait_seconds: float = 0.0
    """How long it has waited so far, at the snapshot's time."""
    state: JobState = "queued"
    """queued (demand), held or blocked (reported, not demand)."""
    count: Annotated[int, Field(ge=1)] = 1
    """Identical pending array elements this entry stands for."""


class NodeInfo(Model):
    name: str
    """Node name in the batch system (the instance's node_name for EPU workers)."""
    state: NodeState
    """Normalized state; docs/sensor-states.md maps every native state."""
    cores: NonNegInt = 0
    """Cores the batch system may use on the node."""
    cores_used: NonNegInt = 0
    """Cores allocated to running jobs."""
    jobs: list[str] = Field(default_factory=list)
    """Ids of the jobs running on the node."""
    state_since: float | None = None
    """When the node entered its current state, if the batch system says."""
    native_state: str = ""
    """The batch system's own state text, for operators."""


@register
class SensorSnapshot(Message):
    """What a sensor saw on its batch head node. ``available=False`` means the batch system
    could not be read: the lists are then empty and must NOT be taken as an empty cluster."""

    TYPE: ClassVar[str] = "sensor.snapshot"
    domain: Name
    """The domain (batch cluster) this sensor serves."""
    backend: str
    """torque, slurm, htcondor or simulated."""
    available: bool = True
    """False when the batch system could not be read: ignore the lists."""
    error: str | None = None
    """Why the batch system could not be read."""
    taken_at: float
    """When the batch system was read (epoch seconds)."""
    jobs: list[QueuedJob] = Field(default_factory=list)
    """Jobs not running: queued, held and blocked."""
    nodes: list[NodeInfo] = Field(default_factory=list)
    """Every node of the batch system."""
    running_jobs: NonNegInt = 0
    """How many jobs are running."""

    def routing_key(self) -> str:
        return f"sensor.snapshot.{self.domain}"

    def queued_demand(self) -> list[QueuedJob]:
        return [j for j in self.jobs if j.state == "queued"]


@register
class NodeCommand(Message):
    """Decision engine → one sensor: change a node in the batch system. Idempotent by ``command_id``."""

    TYPE: ClassVar[str] = "node.command"
    command_id: Id
    """Unique id; a repeated id is answered from the stored result, not re-run."""
    domain: Name
    """Whose sensor must act."""
    action: NodeAction
    """add to the batch system, offline (drain), online (resume) or remove."""
    node: Hostname
    """Host name (RFC 1123); anything else is refused before a command line."""
    instance_id: Id | None = None
    """The provisioner's instance behind the node, if any."""
    address: str | None = None
    """Where the batch system reaches the node (IP or host), when it differs from ``node``."""
    cores: Annotated[int, Field(ge=1)] | None = None
    """Cores the node offers (for add)."""
    reason: str = ""
    """Why, recorded in the batch system where it keeps one (e.g. drain reason)."""
    force: bool = False
    """Remove even if jobs run on the node (operators only)."""

    def routing_key(self) -> str:
        return f"sensor.{self.domain}"


@register
class NodeCommandResult(Message):
    TYPE: ClassVar[str] = "node.result"
    command_id: Id
    """The command this answers (also the envelope's correlation_id)."""
    domain: Name
    action: NodeAction
    node: str
    ok: bool
    """Whether the batch system did it."""
    error: str | None = None
    """Why not, in a sentence."""
    output: str = ""
    """The batch system's own text (stdout/stderr) so an operator sees the native error."""
    duplicate: bool = False
    """True when this result was re-sent for a command already executed."""

    def routing_key(self) -> str:
        return f"node.result.{self.domain}"


# --------------------------------------------------------------------------- provisioner


@register
class LaunchRequest(Message):
    """Decision engine → provisioners: start one instance. ``launch_id`` is also the instance id,
    the cloud client token and a tag, so a repeated request never makes a second VM."""

    TYPE: ClassVar[str] = "instance.launch"
    launch_id: Id
    """Also the instance id, the cloud client token and a tag on the instance."""
    domain: Name
    site: Name
    """Which configured cloud site to launch on."""
    node_name: Hostname
    """Host name the instance gets and the batch system will know it by."""
    cores: Annotated[int, Field(ge=1)] = 1
    """Cores wanted (the site's size should offer them)."""
    attributes: dict[str, str] = Field(default_factory=dict)
    """Extra values for the userdata template (e.g. context URI)."""

    def routing_key(self) -> str:
        return "provisioner"


@register
class TerminateRequest(Message):
    TYPE: ClassVar[str] = "instance.terminate"
    request_id: Id
    """Unique id of this request."""
    instance_id: Id
    """The instance (launch id) to terminate; unknown ids are recorded as terminal."""
    domain: Name
    reason: str = ""
    """Why, kept in the instance's history."""
    force: bool = False
    """Terminate even if the engine thinks the node runs a job."""

    def routing_key(self) -> str:
        return "provisioner"


@register
class InstanceEvent(Message):
    """Provisioner → everyone: an instance moved to ``state``. ``seq`` grows per instance so a
    consumer drops stale or duplicate events (rule 4)."""

    TYPE: ClassVar[str] = "instance.state"
    instance_id: Id
    """The instance (its launch id)."""
    domain: Name
    site: Name
    """The cloud site it runs on."""
    state: InstanceState
    """The state it moved to."""
    previous: InstanceState | None = None
    """The state it left."""
    seq: NonNegInt = 0
    """Per-instance sequence number: ignore an event whose seq is not above the last applied."""
    node_name: str = ""
    """The host name from the launch request."""
    ip: str | None = None
    """Address once the cloud reports one."""
    cloud_id: str | None = None
    """The cloud's own id for the instance."""
    cores: NonNegInt = 0
    reason: str = ""
    """Why it moved (failure text from the cloud, vanished, terminated by request...)."""
    error_kind: ErrorKind | None = None
    """For failed launches: transient, capacity (fail over to another site) or permanent."""
    at: float
    """When the transition happened (epoch seconds)."""

    def routing_key(self) -> str:
        return f"instance.state.{self.domain}.{self.state}"


# --------------------------------------------------------------------------- decision engine


class ViewSummary(Model):
    queued_jobs: NonNegInt = 0
    queued_cores: NonNegInt = 0
    nodes_by_state: dict[str, int] = Field(default_factory=dict)
    instances_by_state: dict[str, int] = Field(default_factory=dict)
    instances_by_site: dict[str, int] = Field(default_factory=dict)
    sensor_available: bool = True


class ActionRecord(Model):
    kind: str
    """launch, terminate, add, offline, online, remove."""
    target: str = ""
    """Node or instance acted on."""
    site: str = ""
    """Cloud site, for launches and terminations."""
    reason: str = ""
    """Why, in words an operator can check against the numbers."""
    action_id: str = ""
    """Id of the command sent (launch_id, command_id, request_id)."""


@register
class DecisionRecord(Message):
    """One policy iteration that acted (or was asked to explain itself): what it saw, what it did, why."""

    TYPE: ClassVar[str] = "decision.record"
    domain: Name
    iteration: NonNegInt
    """The engine's iteration counter for the domain."""
    policy: str
    """Policy that decided."""
    policy_version: NonNegInt = 0
    """Version of the domain's configuration in force."""
    saw: ViewSummary
    """Summary of the view the policy decided on."""
    actions: list[ActionRecord] = Field(default_factory=list)
    """What it did, each with why."""
    at: float
    notes: list[str] = Field(default_factory=list)
    """The policy's arithmetic and the guard rails that applied (why it did what it did)."""

    def routing_key(self) -> str:
        return f"decision.record.{self.domain}"


@register
class PolicyChange(Message):
    """Operator → decision engine. Fields left ``None`` are unchanged."""

    TYPE: ClassVar[str] = "policy.change"
    change_id: Id
    """Unique id; the outcome event carries it."""
    domain: Name
    """The domain to change."""
    policy: str | None = None
    """New policy name (queue-demand, threshold, spare, load, fixed)."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Policy parameters to set (validated against the policy's schema)."""
    min_nodes: NonNegInt | None = None
    """New lower bound on workers."""
    max_nodes: NonNegInt | None = None
    """New upper bound on workers."""
    sites: list[str] | None = None
    """Sites the domain may use, in order of preference."""
    paused: bool | None = None
    """True pauses the domain (no actions), false resumes it."""
    operator: str = ""
    """Who asked, for the record."""
    placement: str | None = None
    """Site selection strategy (rank, cheapest, spread); ``None`` leaves it unchanged."""

    def routing_key(self) -> str:
        return "decision.control"


@register
class PolicyOutcome(Message):
    TYPE: ClassVar[str] = "policy.outcome"
    change_id: str
    """The change this answers."""
    domain: str
    applied: bool
    """True when validated and stored; it takes effect at the next iteration."""
    version: NonNegInt | None = None
    """The domain configuration's new version when applied."""
    reason: str = ""
    """Why it was rejected."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The domain's configuration after the change."""

    def routing_key(self) -> str:
        # domain may be invalid in a rejected change; keep the key routable
        safe = self.domain if re.match(NAME_PATTERN, self.domain) else "_invalid"
        return f"policy.outcome.{safe}"


# --------------------------------------------------------------------------- context broker


@register
class ContextMembership(Message):
    TYPE: ClassVar[str] = "context.member"
    context_id: KeyId
    """The context (see docs/ctxbroker.md)."""
    entry_id: Annotated[int, Field(ge=1)]
    """Position in the context's ordered list of joins and leaves."""
    kind: Literal["join", "leave"]
    """join or leave."""
    hostname: str
    """Short host name of the node."""
    fqdn: str = ""
    ip: str = ""
    reason: str = ""
    """Why a node left (e.g. its instance terminated)."""
    at: float

    def routing_key(self) -> str:
        return f"context.member.{self.context_id}"


# --------------------------------------------------------------------------- envelope


class Envelope(BaseModel):
    """The outer frame of every message on the wire (msgpack map)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    schema_version: Annotated[str, StringConstraints(pattern=r"^\d+\.\d+$")]
    type: str
    id: str
    timestamp: float
    source: str
    correlation_id: str | None = None
    body: dict[str, Any]

    @property
    def major(self) -> int:
        return int(self.schema_version.split(".", 1)[0])

    @classmethod
    def wrap(cls, message: Message, source: str, correlation_id: str | None = None,
             timestamp: float | None = None, message_id: str | None = None) -> Envelope:
        return cls(
            schema_version=f"{message.MAJOR}.{SCHEMA_MINOR}",
            type=message.TYPE,
            id=message_id or new_id(),
            timestamp=time.time() if timestamp is None else timestamp,
            source=source,
            correlation_id=correlation_id,
            body=message.model_dump(mode="python"),
        )


class DecodeError(ValueError):
    """A message that cannot be used: the reason ends up in the dead-letter header."""


def open_envelope(envelope: Envelope) -> Message:
    """Validate the body against its registered type; raise DecodeError with a readable reason."""
    cls = REGISTRY.get(envelope.type)
    if cls is None:
        raise DecodeError(f"unknown message type {envelope.type!r}")
    if envelope.major != cls.MAJOR:
        raise DecodeError(
            f"unsupported schema major version {envelope.schema_version} for {envelope.type} "
            f"(this service speaks {cls.MAJOR}.x)"
        )
    from pydantic import ValidationError

    try:
        return cls.model_validate(envelope.body)
    except ValidationError as exc:
        raise DecodeError(f"invalid {envelope.type}: {_summarize(exc)}") from None


def _summarize(exc: Any) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(body)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
