"""The one interface every batch system sits behind.

Why a small protocol rather than a base class: the service only needs two calls — read the
cluster, change one node — and each backend (Torque, Slurm, HTCondor, simulated) is free to
implement them however its batch system wants. Parsers live in their own pure modules; a
backend is the imperative shell that runs commands and hands their text to a parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from epu.common.messages import JobShape, NodeInfo, QueuedJob, group_jobs, is_valid_hostname

ACTIONS = ("add", "offline", "online", "remove", "give_back", "release")


class BackendUnavailable(RuntimeError):
    """The batch system could not be read or reached (daemon down, command timed out, ...).

    Transient by nature: the service publishes ``available=False`` and retries with backoff.
    """


class InvalidNodeName(ValueError):
    """A node name that is not an RFC 1123 host name: it never reaches a command line."""


@dataclass(frozen=True)
class Observation:
    """What one read of the batch system saw: the parts of a ``SensorSnapshot``.

    ``shapes`` is the pending work, grouped as it was read (demand and not). ``jobs`` is, for
    backends that group at the source, only a bounded sample of per-job records for operators
    (``epu sensor snapshot``); a backend that reads job by job may give all of them and no
    shapes, and the counts below then come from grouping ``jobs``.
    ``held_jobs``/``blocked_jobs``/``finished_jobs`` count what is *not* demand, so operators see
    it was seen and excluded.
    """

    jobs: list[QueuedJob] = field(default_factory=list)
    nodes: list[NodeInfo] = field(default_factory=list)
    running_jobs: int = 0
    shapes: list[JobShape] = field(default_factory=list)
    """Pending jobs grouped at the source; when empty the sensor core groups ``jobs``."""
    finished_jobs: int = 0
    warnings: list[str] = field(default_factory=list)
    owners: dict[str, list[str]] = field(default_factory=dict)
    """Running job id → [account, user, partition] (``SensorSnapshot.owners``; empty: unknown)."""

    def all_shapes(self) -> list[JobShape]:
        return self.shapes if self.shapes or not self.jobs else group_jobs(self.jobs)

    @property
    def queued_jobs(self) -> int:
        return sum(s.count for s in self.all_shapes() if s.demand)

    @property
    def queued_cores(self) -> int:
        return sum(s.count * s.cores * s.nodes for s in self.all_shapes() if s.demand)

    @property
    def held_jobs(self) -> int:
        return sum(s.count for s in self.all_shapes() if not s.demand and s.reason_class == "held")

    @property
    def blocked_jobs(self) -> int:
        """Pending jobs that are not demand for any other reason (dependency, limits, begin time...)."""
        return sum(s.count for s in self.all_shapes() if not s.demand and s.reason_class != "held")


@dataclass(frozen=True)
class CommandOutcome:
    """Result of one node command.

    ``changed`` says the cluster is different now (so a fresh snapshot is published at once);
    ``transient`` says the failure may go away by itself (batch system unreachable, timeout) —
    such results are not remembered by the dedupe log, so a re-sent command runs again.
    ``output`` carries the batch system's own text, ``error`` our one-line explanation.
    """

    ok: bool
    changed: bool = False
    output: str = ""
    error: str | None = None
    transient: bool = False


@runtime_checkable
class BatchBackend(Protocol):
    name: str

    def snapshot(self) -> Observation:
        """Read queue and nodes. Raises ``BackendUnavailable`` when the batch system cannot be read."""
        ...

    def execute(self, action: str, node: str, *, cores: int | None = None, address: str | None = None,
                reason: str = "", force: bool = False, instance_id: str | None = None) -> CommandOutcome:
        """Run ``add``/``offline``/``online``/``remove`` for ``node``; idempotent per action.
        ``instance_id`` (for ``add``) is carried into the batch system so the read reports it
        back as ``NodeInfo.instance_id``."""
        ...


@runtime_checkable
class JobRequeuer(Protocol):
    """A backend that can put the jobs running on a node back in the queue: used before removing
    a node whose machine the cloud preempted (``NodeCommand.requeue``). A backend without it has
    the node removed with ``force``, and the batch system reschedules what died (HTCondor does)."""

    def requeue_jobs(self, node: str, reason: str = "") -> CommandOutcome:
        """Requeue every job running on ``node``; ok when none is left running there."""
        ...


_ACCEPTED: set[str] = set()
"""Node names ``check_node_name`` accepted (the check is a pure function of the name): a
cluster's commands name the same few hundred nodes over and over, each command checked twice
(the simulators' wrapper, then the backend). Bounded: emptied when it reaches ``_ACCEPTED_MAX``."""
_ACCEPTED_MAX = 4096


def check_node_name(node: str) -> str:
    """Refuse anything but an RFC 1123 host name before it can reach a command line.

    This also refuses a leading ``-`` (option injection) and any whitespace, quote, ``;``, ``$``
    or path separator, so even a command that passes the name inside a string (``qmgr -c``)
    cannot be subverted.
    """
    if type(node) is str and node in _ACCEPTED:  # exactly str: a subclass may compare equal and be another
        return node
    if not isinstance(node, str) or not node or not is_valid_hostname(node):
        raise InvalidNodeName(f"refusing node name {node!r}: not a valid RFC 1123 host name "
                              "(letters, digits, '-', dots between labels; at most 253 characters)")
    if type(node) is str:
        if len(_ACCEPTED) >= _ACCEPTED_MAX:
            _ACCEPTED.clear()
        _ACCEPTED.add(node)
    return node


def check_action(action: str) -> str:
    if action not in ACTIONS:
        raise ValueError(f"unknown node action {action!r}; expected one of {', '.join(ACTIONS)}")
    return action
