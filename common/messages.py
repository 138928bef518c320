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
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from epu.common.retire import JUDGED_UNSTARTED, REQUESTED_PROOFS, Proof, RetireReason, legacy_proof
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

SCHEMA_MAJOR = 1
SCHEMA_MINOR = 2
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.{SCHEMA_MINOR}"

#: Domain and context names appear in routing keys and queue names, so no dots or spaces.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
#: RFC 1123 host name (labels of letters, digits and hyphens; not starting or ending with '-').
HOSTNAME_PATTERN = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
Hostname = Annotated[str, StringConstraints(max_length=253, pattern=HOSTNAME_PATTERN)]
Id = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
#: An instance type name of a site's catalogue (provider size ids are often dotted); "" = the site's
#: single (legacy) type.
TypeName = Annotated[str, StringConstraints(max_length=63, pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,62})?$")]
#: Ids that appear as a word of a routing key (no dots).
KeyId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
NonNegInt = Annotated[int, Field(ge=0)]

NodeState = Literal["free", "busy", "offline", "down", "unknown"]
"""Normalized batch node state. ``offline`` covers draining: a node offlined while it still
runs jobs is draining; ``jobs``/``cores_used`` tell how far the drain has come."""

JobState = Literal["queued", "held", "blocked"]
"""State of a job that is not running. Only ``queued`` is demand; ``held`` (user/admin
hold) and ``blocked`` (dependency, or can never run) are reported but not counted."""

class InstanceState(StrEnum):
    """An instance's state, the one definition: the provisioner's state machine
    (``services/provisioner/states.py``) moves records through them, the engine's view adds
    ``joined`` and ``draining`` (it sees them in snapshots). A member is its string (``==``,
    hash, format): on the wire it is that string, and code that holds plain strings (a store's
    rows) compares with members as they are."""

    REQUESTED = "requested"
    PENDING = "pending"
    STARTED = "started"
    JOINED = "joined"
    DRAINING = "draining"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"


#: The order instance states move in (rule 4: state only moves forward). ``failed`` is terminal.
INSTANCE_STATE_ORDER: dict[str, int] = {
    InstanceState.REQUESTED: 0,
    InstanceState.PENDING: 1,
    InstanceState.STARTED: 2,
    InstanceState.JOINED: 3,
    InstanceState.DRAINING: 4,
    InstanceState.TERMINATING: 5,
    InstanceState.TERMINATED: 6,
    InstanceState.FAILED: 6,
}
TERMINAL_INSTANCE_STATES = frozenset({InstanceState.TERMINATED, InstanceState.FAILED})
#: An instance state in a message: read from its wire string (bodies are otherwise strict: a
#: strict enum field would take only a member, never the string a peer sends).
InstanceStateField = Annotated[InstanceState, Field(strict=False)]

NodeAction = Literal["add", "offline", "online", "remove", "give_back", "release"]
ErrorKind = Literal["transient", "capacity", "permanent", "preempted"]
"""``preempted``: the cloud took a spot/preemptible node back (an instance event's ``terminated``)."""
PREEMPTED_REASON = "preempted by the cloud"
INTERRUPTION_REASON = "interruption notice from the cloud"
"""How an instance event's reason starts when it carries an interruption notice."""
"""How an instance event's reason starts when the cloud preempted the node (the engine keeps the
reason with the instance, so a restarted engine still knows)."""


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

    def to_wire(self) -> dict[str, Any]:
        """The envelope body. Most messages are their fields as a map; a type with long lists
        (``SensorSnapshot``) writes them column-wise to stay small."""
        return self.model_dump(mode="python")

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Message:
        """Validate an envelope body (the inverse of ``to_wire``); raises ``ValidationError``
        or ``ValueError`` for a body that is not a valid message of this type."""
        return cls.model_validate(body)


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
    instance_id: str | None = None
    """The EPU instance (launch id) behind this node, as carried into the batch system when the
    node was added (a Slurm node feature or comment, an HTCondor startd attribute, a Torque note
    or property). The engine matches nodes to instances by this identity; the name is only a
    fallback. ``None`` for nodes EPU did not start, or where the backend cannot say."""
    memory_mb: NonNegInt = 0
    """Memory the batch system may give jobs on the node (0 = unknown)."""
    memory_used_mb: NonNegInt = 0
    """Memory allocated to running jobs."""
    gpus: NonNegInt = 0
    """GPUs on the node (gres/TRES ``gpu``, Torque ``gpus``, HTCondor ``Gpus``)."""
    gpus_used: NonNegInt = 0
    """GPUs allocated to running jobs."""
    features: list[str] = Field(default_factory=list)
    """Features (Slurm), properties (Torque) or advertised attributes a job may require."""
    partitions: list[str] = Field(default_factory=list)
    """Partitions (Slurm) or queues the node serves; empty = all / not known."""
    job_ends: list[float] = Field(default_factory=list)
    """Expected end of each job in ``jobs`` (same order; epoch seconds: its start plus its time
    limit, as Slurm's ``end_time`` of a running job), 0 when unknown. Empty when the backend
    cannot say. Lets a policy estimate when a busy node frees up (``start-time``)."""


class JobShape(Model):
    """Pending jobs that ask for the same thing, grouped: the unit of demand.

    A snapshot's size grows with the number of distinct shapes, not of jobs (100,000 pending
    jobs are typically a few hundred shapes). Jobs with the same request but a different
    pending-reason class are different shapes, so ``demand`` is exact per shape."""

    count: Annotated[int, Field(ge=1)]
    """How many pending jobs (array elements counted one by one) have this shape."""
    nodes: Annotated[int, Field(ge=1)] = 1
    """Nodes each job needs."""
    cores: Annotated[int, Field(ge=1)] = 1
    """Cores per node."""
    memory_mb: NonNegInt = 0
    """Memory per node, MB (0 = not requested / unknown)."""
    gpus: NonNegInt = 0
    """GPUs per node."""
    features: list[str] = Field(default_factory=list)
    """Node features/constraints every node of the job must have (sorted)."""
    partition: str = ""
    """Partition (Slurm), queue (Torque) or pool; empty = the default."""
    time_limit_s: NonNegInt = 0
    """Requested wall-time limit, seconds (0 = none / unknown)."""
    demand: bool = True
    """True when a new node could start these jobs (waiting for resources or priority); false
    when something else holds them (held, dependency, QOS/association limits, begin time,
    partition down...). Only demand shapes count towards launches."""
    reason: str = ""
    """The batch system's own pending reason (e.g. Slurm ``Resources``, ``QOSMaxJobsPerUserLimit``)."""
    max_wait_s: float = 0.0
    """The longest any of these jobs has waited, at the snapshot's time."""
    reason_class: str = ""
    """What the reason means (docs/pending-reasons.md): ``resources``/``priority`` (demand), ``held``,
    ``dependency``, ``limit``, ``begin_time``, ``reservation``, ``partition``, ``invalid``,
    ``starting``, ``failure``, ``unknown``, ``unmapped``; ``blocked`` from per-job senders."""
    sample_job_ids: list[str] = Field(default_factory=list)
    """A few of the jobs' ids (at most 3), for an operator to look one up; not all of them."""

    def key(self) -> tuple:
        """What makes two shapes the same request (everything but count and wait)."""
        return (self.nodes, self.cores, self.memory_mb, self.gpus, tuple(self.features), self.partition,
                self.time_limit_s, self.demand, self.reason)


_STATE_CLASS = {"queued": "resources", "held": "held", "blocked": "blocked"}


def group_jobs(jobs: list[QueuedJob]) -> list[JobShape]:
    """Group per-job records into shapes (for backends that read job by job). A ``queued`` job
    is demand; ``held`` and ``blocked`` are not. Deterministic order: by key."""
    groups: dict[tuple, list] = {}
    for j in jobs:
        demand = j.state == "queued"
        key = (j.nodes, j.cores, j.memory_mb, 0, (), j.queue, 0, demand, "" if demand else j.state)
        g = groups.get(key)
        if g is None:
            groups[key] = [j.count, j.wait_seconds, _STATE_CLASS[j.state], [j.job_id]]
        else:
            g[0] += j.count
            if j.wait_seconds > g[1]:
                g[1] = j.wait_seconds
            if len(g[3]) < 3:
                g[3].append(j.job_id)
    return [JobShape(count=c, nodes=k[0], cores=k[1], memory_mb=k[2], gpus=k[3], features=list(k[4]),
                     partition=k[5], time_limit_s=k[6], demand=k[7], reason=k[8], max_wait_s=w,
                     reason_class=cls, sample_job_ids=ids)
            for k, (c, w, cls, ids) in sorted(groups.items(), key=lambda kv: repr(kv[0]))]


@register
class SensorSnapshot(Message):
    """What a sensor saw on its batch head node. ``available=False`` means the batch system
    could not be read: the lists are then empty and must NOT be taken as an empty cluster.

    On the wire ``nodes`` and ``shapes`` are written column-wise, so the message grows with the
    number of nodes and distinct shapes, never with jobs: a map ``{"n": <records>, <field>:
    [one value per record], ...}`` where a field whose every record has its default is left
    out, and a low-cardinality field (node ``state``, ``native_state``, ``features``,
    ``partitions``; shape ``features``, ``partition``, ``reason``, ``reason_class``) may be
    written as ``{"t": [distinct values], "i": [index per record]}`` (see the example; code:
    common/columns.py). Receivers also accept the plain form (a list of maps). Since schema 1.2
    a non-empty ``owners`` is sent grouped by owner instead, under the key ``owner_groups``:
    ``[[owner, [job id, ...]], ...]``, one entry per distinct [account, user, partition] (a job
    id at most once), so it grows with running jobs by their ids only; the ``owners`` key is then
    left out. Receivers accept either form; a 1.1 receiver ignores ``owner_groups`` (an unknown
    key) and reads the snapshot as one without owners. A snapshot
    over the sensor's ``max_snapshot_bytes`` is sent without per-node job ids, or, if still too
    big, as ``available=false`` with the reason."""

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
    """When the batch system was read (epoch seconds, by the head node's clock: shown, and
    translated into the engine's clock, never used to order snapshots or judge their age)."""
    incarnation: str = Field("", max_length=64)
    """This run of the sensor (random at its start). With ``sequence`` it orders snapshots
    without any clock: a new incarnation supersedes every earlier one (a restart is not "older").
    Empty from senders older than schema 1.1, which are ordered by ``taken_at`` as before."""
    sequence: NonNegInt = 0
    """Counts the snapshots of one incarnation from 1: a higher one is newer."""
    jobs: list[QueuedJob] = Field(default_factory=list)
    """Per-job records, for senders that have no shapes; the EPU sensors send ``shapes`` and
    leave this empty."""
    nodes: list[NodeInfo] = Field(default_factory=list)
    """Every node of the batch system (column-wise on the wire)."""
    running_jobs: NonNegInt = 0
    """How many jobs are running."""
    shapes: list[JobShape] = Field(default_factory=list)
    """Pending jobs grouped into shapes (demand and not; column-wise on the wire). When a
    sender gives only ``jobs``, ``demand_shapes`` derives the shapes from them."""
    owners: dict[str, list[str]] = Field(default_factory=dict)
    """Running job id → [account, user, partition] ("" where the batch system does not say), for
    cost accounting (``epu cost``). Empty from a backend that does not report owners: their
    node time is then attributed to account "" . Sent as ``owner_groups`` (schema 1.2, see above)."""

    def routing_key(self) -> str:
        return f"sensor.snapshot.{self.domain}"

    # ---------------------------------------------------------------- wire form
    # ``nodes`` and ``shapes`` travel column-wise (common/columns.py): the size of a snapshot
    # grows with its nodes and distinct shapes, never with its jobs, and 10,000 nodes decode
    # and validate in one call. A verbose sender (lists of maps, as before) is still accepted;
    # a consumer that knows only the verbose form rejects a columnar snapshot loudly (a map
    # where it expects a list), it never mistakes it for an empty cluster.
    _NODE_INTERN: ClassVar[frozenset[str]] = frozenset({"state", "native_state", "features", "partitions"})
    _SHAPE_INTERN: ClassVar[frozenset[str]] = frozenset({"features", "partition", "reason", "reason_class"})

    def to_wire(self) -> dict[str, Any]:
        from epu.common.columns import encode_columns, encode_owners, gc_paused

        body = {name: getattr(self, name) for name in type(self).model_fields if name not in ("nodes", "shapes", "jobs")}
        with gc_paused():
            if self.owners:  # grouped under a key of its own: a 1.1 receiver reads the rest
                del body["owners"]
                body["owner_groups"] = encode_owners(self.owners)
            body["jobs"] = [j.model_dump(mode="python") for j in self.jobs]
            body["nodes"] = encode_columns(self.nodes, NodeInfo, self._NODE_INTERN)
            body["shapes"] = encode_columns(self.shapes, JobShape, self._SHAPE_INTERN)
        return body

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> SensorSnapshot:
        from epu.common.columns import decode_columns, decode_owners

        update: dict[str, Any] = {}
        if "owner_groups" in body:  # ``owners`` grouped (schema 1.2)
            if body.get("owners"):
                raise ValueError("owners: given both as a map and as owner_groups")
            update["owners"] = decode_owners(body["owner_groups"])
            body = {k: v for k, v in body.items() if k not in ("owners", "owner_groups")}
        nodes, shapes = body.get("nodes"), body.get("shapes")
        if not isinstance(nodes, dict) and not isinstance(shapes, dict):
            snap = cls.model_validate(body)  # verbose form
            return snap.model_copy(update=update) if update else snap
        rest = {k: v for k, v in body.items() if k not in ("nodes", "shapes")}
        snap = cls.model_validate(rest)
        if nodes is not None:
            update["nodes"] = decode_columns(nodes, NodeInfo, "nodes") if isinstance(nodes, dict) \
                else cls.model_validate({**rest, "nodes": nodes}).nodes
        if shapes is not None:
            update["shapes"] = decode_columns(shapes, JobShape, "shapes") if isinstance(shapes, dict) \
                else cls.model_validate({**rest, "shapes": shapes}).shapes
        return snap.model_copy(update=update)

    def queued_demand(self) -> list[QueuedJob]:
        """Demand as per-job-style records (compatibility; prefer ``demand_shapes``): the
        ``queued`` jobs a per-job sender gave, else one record per demand shape with its count."""
        if self.jobs:
            return [j for j in self.jobs if j.state == "queued"]
        return [QueuedJob(job_id=s.sample_job_ids[0] if s.sample_job_ids else f"shape-{i}", cores=s.cores,
                          nodes=s.nodes, memory_mb=s.memory_mb, queue=s.partition, wait_seconds=s.max_wait_s,
                          count=s.count) for i, s in enumerate(self.demand_shapes())]

    def all_shapes(self) -> list[JobShape]:
        """Every pending shape: ``shapes`` if the sensor sent them, else grouped from ``jobs``."""
        return self.shapes if self.shapes or not self.jobs else group_jobs(self.jobs)

    def demand_shapes(self) -> list[JobShape]:
        """The shapes a new node could start (``demand``)."""
        return [s for s in self.all_shapes() if s.demand]

    def queued_count(self) -> int:
        """Pending jobs that are demand (what ``epu status`` and records call "queued")."""
        return sum(s.count for s in self.demand_shapes())


@register
class NodeCommand(Message):
    """Decision engine → one sensor: change a node in the batch system. Idempotent by ``command_id``."""

    TYPE: ClassVar[str] = "node.command"
    command_id: Id
    """Unique id; a repeated id is answered from the stored result, not re-run."""
    domain: Name
    """Whose sensor must act."""
    action: NodeAction
    """add to the batch system, offline (drain), online (resume) or remove; give_back (native
    mode only): a node Slurm resumed that EPU cannot serve, powered down at once with ``reason``
    so Slurm requeues its job (Slurm: ``State=POWER_DOWN_FORCE``; refused for a node that is not
    powering up); release (native mode only): a slot a ``remove`` held out of scheduling while its
    instance ended, handed back to Slurm's power saving now that the instance is gone (Slurm:
    ``State=UNDRAIN`` of EPU's drain, the instance's identity cleared from the Comment)."""
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
    requeue: bool = False
    """For remove: the node's machine is gone (the cloud preempted it), so first put every job
    still running there back in the queue (Slurm: ``scontrol requeue`` per job), then remove the
    node even though the batch system may still count those jobs on it."""

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


# --------------------------------------------------------------------------- Slurm power saving

SlurmPowerAction = Literal["resume", "suspend", "resume_fail"]

MAX_POWER_NODES = 100_000
"""Most nodes one ``slurm.power`` may name (``common.hostlist.MAX_NAMES``)."""


class SlurmResumeJob(Model):
    """One job of slurmctld's ``SLURM_RESUME_FILE`` (Slurm ≥ 22.05, read as ParallelCluster ≥ 3.8
    does): the nodes it was allocated and those of them this call resumes, with what it asked for.
    Why carried: a job whose nodes cannot all be served is given back whole (all or nothing), not
    left holding half its nodes until ResumeTimeout."""

    job_id: Annotated[int, Field(ge=0)]
    nodes_alloc: list[Hostname] = Field(default_factory=list, max_length=MAX_POWER_NODES)
    """Every node the job was allocated (expanded from Slurm's hostlist)."""
    nodes_resume: list[Hostname] = Field(default_factory=list, max_length=MAX_POWER_NODES)
    """The job's nodes this call resumes (the rest are already up or powering up)."""
    features: Annotated[str, StringConstraints(max_length=1024)] = ""
    """The job's ``--constraint`` as Slurm wrote it."""
    extra: Annotated[str, StringConstraints(max_length=1024)] = ""
    """The job's ``--extra`` string."""
    partition: Annotated[str, StringConstraints(max_length=256)] = ""
    reservation: Annotated[str, StringConstraints(max_length=256)] = ""
    oversubscribe: Annotated[str, StringConstraints(max_length=32)] = ""


@register
class SlurmPower(Message):
    """slurmctld's power saving → decision engine: the nodes Slurm's ResumeProgram,
    SuspendProgram or ResumeFailProgram was called for (``epu slurm resume|suspend|resume-fail``),
    one message per call. Sent with the domain's sensor identity (``epu-sensor-<domain>``) on
    that domain's key, so only the head node of that cluster can ask for its nodes; the engine
    dedupes by ``batch_id`` (a call Slurm repeats, or a re-sent publish, is one batch). A resume
    is demand for exactly those nodes, a suspend the wish to end them (still only with the node's
    removal proved), a resume_fail Slurm giving up on them (docs/policies.md, "Native mode")."""

    TYPE: ClassVar[str] = "slurm.power"
    batch_id: Id
    """One id per call: the engine acts on a batch once."""
    domain: Name
    action: SlurmPowerAction
    nodes: list[Hostname] = Field(min_length=1, max_length=MAX_POWER_NODES)
    """The node names of the call's hostlist, expanded, in Slurm's order."""
    jobs: list[SlurmResumeJob] = Field(default_factory=list, max_length=MAX_POWER_NODES)
    """For resume: the jobs of ``SLURM_RESUME_FILE`` (empty when slurmctld wrote none)."""
    called_at: float = 0.0
    """When the program was called, by the head node's clock (shown, never used to order)."""

    def routing_key(self) -> str:
        return f"slurm.power.{self.domain}"


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
    instance_type: TypeName = ""
    """Which type of the site's catalogue to launch (its size and image); "" = the site's single
    type (``size``/``image`` of a site without a ``types`` table), as before catalogues existed."""

    def routing_key(self) -> str:
        return "provisioner.launch"


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
    unless_started: bool = False
    """Only while the instance has not started: the sender (the engine, for an instance its view
    holds ``requested`` or ``pending``) takes it for one the batch system cannot know. The
    provisioner destroys it only if its record and a fresh look at the cloud both show it not
    running; otherwise it refuses — publishes the instance ``started`` — and the sender takes it
    out the safe way (removed from the batch system first). A VM that boots may already run a
    self-registering daemon (an HTCondor startd) with a job."""

    retire: Annotated[RetireReason | None, Field(strict=False)] = None
    """Why the instance leaves (``common.retire``); None from a sender of schema 1.x."""
    proof: Annotated[Proof | None, Field(strict=False)] = None
    """What makes its end safe (``common.retire``): the provisioner's destroy acts on it. None
    from a sender of schema 1.x: derived from ``force`` and ``unless_started``
    (``effective_proof``)."""

    @model_validator(mode="after")
    def _flags_agree(self) -> TerminateRequest:
        """A proof and the two flags of schema 1.x say the same (a provisioner of 1.x reads only
        the flags): ``force`` exactly with ``forced``, ``unless_started`` exactly with a proof
        judged on a fresh listing (``unstarted``, ``bookkeeping``)."""
        if self.proof is not None and (self.force != (self.proof == Proof.FORCED)
                                       or self.unless_started != (self.proof in JUDGED_UNSTARTED)):
            raise ValueError(f"proof {self.proof.value!r} contradicts force={self.force} "
                             f"unless_started={self.unless_started}")
        if self.proof is not None and self.proof not in REQUESTED_PROOFS:
            raise ValueError(f"proof {self.proof.value!r} is the provisioner's own, never requested")
        return self

    @property
    def effective_proof(self) -> Proof:
        """``proof``, or for a sender that names none, the one its two flags mean."""
        return self.proof if self.proof is not None else legacy_proof(self.force, self.unless_started)

    def routing_key(self) -> str:
        return "provisioner.terminate"


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
    state: InstanceStateField
    """The state it moved to."""
    previous: InstanceStateField | None = None
    """The state it left. ``failed`` with a live ``state``: the provisioner reopened a launch it had
    closed failed because the cloud lists its node alive (its create took effect, the answer was
    lost): take the instance back as live — it may have joined the batch system by itself."""
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
    instance_type: TypeName = ""
    """The catalogue type it was launched as ("" = the site's single type)."""
    error_kind: ErrorKind | None = None
    """For failed launches: transient, capacity (fail over to another site) or permanent; for a
    ``terminated`` node the cloud took back: preempted."""
    at: float
    """When the transition happened (epoch seconds)."""
    presumed_gone: bool = False
    """The cloud has stopped listing the node (several consecutive listings over a minimum time), so
    it is presumed gone — a presumption, not a state: ``state`` is unchanged, the provisioner
    destroys and closes nothing on it, and an event with ``presumed_gone`` false and a higher
    ``seq`` follows if the node is listed again (re-adopted). Don't count it as capacity; to end it,
    drain it and send a terminate."""
    interruption_at: float | None = None
    """The cloud announced it will reclaim this live instance at about this time (a spot
    interruption notice: EC2's two-minute warning). Sent with the instance's current state and
    ``seq`` (a notice is not a transition): the engine drains the node at once — for Slurm its
    jobs are requeued — instead of waiting for the preemption."""
    reopened_seq: NonNegInt | None = None
    """The ``seq`` at which the provisioner reopened this instance after ``failed`` (its node was
    found alive), on every event and report entry from the reopening on. A consumer that holds the
    instance ``failed`` with a ``seq`` below it holds the end the reopening undid: take the
    instance back as live (as ``previous: failed`` says) — whichever of the reopen event and a
    later event or report arrives first. Null: never reopened (or a sender older than this field)."""

    def routing_key(self) -> str:
        return f"instance.state.{self.domain}.{self.state}"


class OfferedType(Model):
    """One instance type a site offers, as the provisioner discovered it: the driver's size
    (libcloud ``list_sizes()``) with the config's ``[sites.NAME.types]`` overrides applied."""

    name: TypeName
    size: str
    """The provider's size id."""
    cores: Annotated[int, Field(ge=1)]
    memory_mb: NonNegInt = 0
    """0 = unknown."""
    gpus: NonNegInt = 0
    features: list[str] = Field(default_factory=list)
    price_per_hour: Annotated[float, Field(ge=0)] = 0.0
    priced: bool = True
    """False: nobody said what it costs (a driver size with no price, and no override);
    ``price_per_hour`` is then 0 and means nothing — a spend cap never admits the type, and cost
    reports do not bill it as 0. (Senders before this field: always true.)"""
    spot: bool = False
    quota: NonNegInt = 0
    image: str = ""


@register
class InstanceReport(Message):
    """Provisioner → decision engine, periodically: the current state of every instance of a
    domain the provisioner knows — live ones, and those that ended within ``horizon_seconds``.

    Anti-entropy: an engine that lost an ``instance.state`` event (or was away) catches up,
    each entry applied exactly like the event it summarizes (forward only, by ``seq``). An
    instance missing from a report proves nothing (absence is a hint, never proof)."""

    TYPE: ClassVar[str] = "instance.report"
    domain: Name
    as_of: float
    """When the provisioner read its store (epoch seconds)."""
    horizon_seconds: float = 0.0
    """Ended instances are included if they ended this recently."""
    instances: list[InstanceEvent] = Field(default_factory=list)
    """One entry per instance: its current state, ``seq``, address and reason, as an event."""
    offered: dict[str, list[OfferedType]] = Field(default_factory=dict)
    """Site → the instance types it offers as last discovered (sites of the domain that
    ``discover`` sizes, once their listing succeeded): the engine's catalogue of that site."""

    def routing_key(self) -> str:
        return f"instance.report.{self.domain}"


ProvisionerAlertKind = Literal["orphan-seen", "orphan-sweep-refused", "destroy-deferred", "foreign-node",
                               "node-reappeared", "orphan-adopted", "failed-launch-alive"]


@register
class ProvisionerAlert(Message):
    """Provisioner → operators: something on a destroy path that a person should know — a node it
    will destroy later, one it refuses to touch, or destroys it withheld because of the cap."""

    TYPE: ClassVar[str] = "provisioner.alert"
    site: Name
    """The cloud site the nodes are at."""
    kind: ProvisionerAlertKind
    """``orphan-seen``: a node of this deployment and store whose launch id the store does not know,
    first seen now, destroyed after the orphan grace unless its launch becomes known.
    ``orphan-sweep-refused``: more orphans were due than one reconciliation may destroy; none was
    (what a wrong or restored store looks like). ``destroy-deferred``: nodes of closed launches
    beyond the cap wait for the next reconciliation. ``foreign-node``: a node with this
    deployment's tag but another store's id and an unknown launch: never touched.
    ``node-reappeared``: the node of a record closed on absence (by an older release) is listed
    again: left running. ``orphan-adopted``: a node of this deployment and store, with a domain,
    whose launch the store does not know (restored or rolled back): recorded and announced, never
    destroyed; the engine keeps or retires it. ``failed-launch-alive``: the node of a launch closed
    ``failed`` (a create that took effect though its answer was lost) is listed alive: the record
    is reopened (its event says ``previous: failed``), never destroyed; the engine keeps or
    retires it."""
    message: str
    """What happened and what an operator can do, in words."""
    deployment: str = ""
    """This provisioner's deployment identity."""
    cloud_ids: list[str] = Field(default_factory=list)
    """The nodes concerned (at most 20; ``count`` says how many)."""
    count: NonNegInt = 0
    at: float

    def routing_key(self) -> str:
        return f"provisioner.alert.{self.site}.{self.kind}"


# --------------------------------------------------------------------------- decision engine


class UnsatisfiableShape(Model):
    """Pending jobs of one shape that no instance type of the domain can ever serve."""

    count: NonNegInt
    """How many jobs."""
    shape: str
    """The request per node, e.g. ``2x64c 512000MB bigmem @bigmem``."""
    constraint: str
    """What rules every type out: partition, feature, gpus, memory, cores or combination."""
    reason: str
    """The numbers, in words."""


class ViewSummary(Model):
    queued_jobs: NonNegInt = 0
    queued_cores: NonNegInt = 0
    nodes_by_state: dict[str, int] = Field(default_factory=dict)
    instances_by_state: dict[str, int] = Field(default_factory=dict)
    instances_by_site: dict[str, int] = Field(default_factory=dict)
    sensor_available: bool = True
    instances_by_type: dict[str, int] = Field(default_factory=dict)
    """Live instances per catalogue type ("" = a site's single type)."""
    unsatisfiable: list[UnsatisfiableShape] = Field(default_factory=list)
    """Pending jobs no type can serve (never launched for, never holding a node)."""


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
    instance_type: str = ""
    """For launches: the catalogue type chosen ("" = the site's single type)."""
    gang: str = ""
    """For launches: ``ID:SIZE`` when the instance is one of a group launched together for
    multi-node jobs (released and re-placed together if it cannot complete)."""


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
    shadow: bool = False
    """Observe mode (shadow): ``actions`` are what the iteration would have done; none was stored
    or sent."""

    def routing_key(self) -> str:
        return f"decision.record.{self.domain}"


class PolicyChangeEntry(Model):
    """One operator change of a domain's policy, as the engine answered it (``epu policy history``)."""

    change_id: str
    at: float
    """When the engine decided on it."""
    operator: str = ""
    """Who asked (the operator's login, as the change said)."""
    applied: bool
    version: int | None = None
    """The config version it made (None: refused, or it changed nothing)."""
    reason: str = ""
    """Why it was refused ("" when applied)."""
    request: dict[str, Any] = Field(default_factory=dict)
    """The change as asked (the ``PolicyChange`` fields that were set)."""


class InstanceStatus(Model):
    """One live instance as the decision engine sees it (an entry of ``EngineStatus``)."""

    instance_id: Id
    site: Name
    state: InstanceStateField
    """The engine's state: the provisioner's cloud states, plus joined and draining."""
    seq: NonNegInt = 0
    """The ``seq`` of the last instance event applied (a newer event supersedes this entry)."""
    node_name: str = ""
    ip: str | None = None
    in_batch: bool = False
    """Its node has joined the batch system and has not been removed from it."""
    node_state: str = ""
    """Its batch node's state in the newest snapshot (free, busy, offline, down...); "" if not listed."""
    retire: str = ""
    """Why it is on its way out ("": it is not): scale-down, stalled, lost, operator."""
    since: float
    """When it entered ``state``."""
    launched_at: float | None = None
    """When its launch was asked for (the engine's record; None from engines before this field):
    what ``epu instances list`` counts AGE from, as it does for the provisioner's records."""


@register
class EngineStatus(Message):
    """Decision engine → operators: the whole current state of one domain, published by the
    engine acting for it when the state changes (and at least every ``heartbeat`` seconds).
    Kept in a latest-value queue (``epu.status.DOMAIN``), so ``epu status`` shows everything at
    once instead of only what changes while it listens."""

    TYPE: ClassVar[str] = "decision.status"
    domain: Name
    at: float
    """When the engine built it."""
    policy: str
    policy_version: NonNegInt = 0
    paused: bool = False
    min_nodes: NonNegInt = 0
    max_nodes: NonNegInt = 0
    breaker: str = ""
    """Why the circuit breaker is open ("": closed)."""
    budget_held: str = ""
    """Why the spend cap held launches at the last iteration ("": it held none)."""
    spend_per_hour: float = 0.0
    """What the domain's instances cost per hour now (catalogue prices; requested to terminating)."""
    mode: str = "act"
    """``act``, or ``observe`` (shadow mode: decisions recorded, nothing done)."""
    snapshot_at: float | None = None
    """When the newest snapshot the engine holds was taken (None: none): its ``taken_at``, by the
    sensor's clock (see ``sensor_skew_seconds``)."""
    sensor_skew_seconds: float | None = None
    """How far the sensor's clock runs ahead of the engine's (negative: behind), measured from the
    snapshots' ``taken_at`` and their arrival (None: not measured yet)."""
    sensor_available: bool = True
    queued_jobs: NonNegInt = 0
    """Queued jobs a new node could start (the demand the policy sees)."""
    queued_cores: NonNegInt = 0
    nodes_by_state: dict[str, int] = Field(default_factory=dict)
    """Batch nodes by normalized state, newest snapshot."""
    instances: list[InstanceStatus] = Field(default_factory=list)
    """Every live instance of the domain (terminated and failed ones are not listed)."""
    last_decision: DecisionRecord | None = None
    """The last iteration that acted, if this engine made one since it started."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The domain's configuration in force (version ``policy_version``), as ``epu policy show`` prints it."""
    changes: list[PolicyChangeEntry] = Field(default_factory=list)
    """The domain's newest operator changes (up to 50), oldest first: ``epu policy history``."""

    def routing_key(self) -> str:
        return f"decision.status.{self.domain}"

    def to_wire(self) -> dict[str, Any]:
        """What ``model_dump`` makes, key for key (so the same bytes), but each instance's map is
        the instance's own field map, not a copy: its fields are plain values (str, int, float,
        bool, None), and with 10,000 instances the copies are megabytes more at the moment of
        publishing (issue 15 item 4). The body is packed, never changed."""
        body = self.model_dump(mode="python", exclude={"instances"})
        instances = [i.__dict__ for i in self.instances]
        return {name: instances if name == "instances" else body[name] for name in type(self).model_fields}


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
    retire: list[str] | None = None
    """Instances (launch ids) to take out the safe way — an operator's unforced terminate: each
    is drained, removed from the batch system once no job runs there, then terminated."""
    release_breaker: bool | None = None
    """True: act on the current snapshots although the circuit breaker found them implausible
    (until a healthy snapshot closes it anyway)."""
    budget_per_hour: Annotated[float, Field(ge=0)] | None = None
    """New spend cap of the domain ($/h, above 0: a 0 is refused, as in the file); ``None`` leaves
    it unchanged. (Engines before ``clear_budget`` took 0 to remove the cap.)"""
    clear_budget: bool | None = None
    """True removes the domain's spend cap (``epu policy set D budget_per_hour=none``)."""
    forced_terminate: list[str] | None = None
    """Instances (launch ids) an operator terminated at once through the provisioners
    (``epu instances terminate --force``), sent for the record: the engine keeps it in the
    domain's history (``epu policy history``) and does nothing else with it."""
    mode: str | None = None
    """``act`` or ``observe`` (shadow mode); ``None`` leaves it unchanged."""

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

    schema_version: Annotated[str, StringConstraints(pattern=r"^\d{1,6}\.\d{1,6}$")]
    """MAJOR.MINOR (e.g. "1.0"), each at most 6 digits: a longer number is invalid, not a giant int."""
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
            body=message.to_wire(),
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
        return cls.from_wire(envelope.body)
    except ValidationError as exc:
        raise DecodeError(f"invalid {envelope.type}: {_summarize(exc)}") from None
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"invalid {envelope.type}: {exc}") from None


def _summarize(exc: Any) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(body)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
