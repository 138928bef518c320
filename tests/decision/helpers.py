"""Builders for decision-engine tests: snapshots, views, instances, an engine with a fake bus."""

from __future__ import annotations

from typing import Any

from epu.common.clock import ManualClock
from epu.common.config import parse_config
from epu.common.messages import InstanceEvent, Message, NodeInfo, QueuedJob, SensorSnapshot
from epu.services.decision.engine import Engine
from epu.services.decision.store import Store
from epu.services.decision.view import DomainView, Instance, JobDigest

T0 = 1_700_000_000.0


def jobs(n: int, cores: int = 1, nodes: int = 1, prefix: str = "j") -> list[QueuedJob]:
    return [QueuedJob(job_id=f"{prefix}{i}", cores=cores, nodes=nodes) for i in range(n)]


def node(name: str, state: str = "free", cores: int = 1, used: int = 0, jobs_: list[str] | None = None) -> NodeInfo:
    return NodeInfo(name=name, state=state, cores=cores, cores_used=used, jobs=jobs_ or [])


def inst(iid: str, state: str = "joined", *, site: str = "s1", cores: int = 1, launched_at: float = T0,
         idle_since: float | None = None, **kw: Any) -> Instance:
    return Instance(iid, "d", site, f"n-{iid}", cores, state, launched_at, launched_at,
                    idle_since=idle_since, **kw)


def view(*, queued: list[QueuedJob] = (), nodes: list[NodeInfo] = (), instances: list[Instance] = (),
         now: float = T0, min_nodes: int = 0, max_nodes: int = 100, cores: int = 1,
         memory: dict | None = None, available: bool = True) -> DomainView:
    return DomainView("d", now, available, JobDigest.of(list(queued)), {n.name: n for n in nodes},
                      list(instances), min_nodes, max_nodes, cores, dict(memory or {}))


def kinds(decision: Any) -> list[tuple[str, str]]:
    return [(a.kind, getattr(a, "instance_id", "")) for a in decision.actions]


def counts(decision: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in decision.actions:
        out[a.kind] = out.get(a.kind, 0) + 1
    return out


def config(domains: dict | None = None, sites: dict | None = None, **decision: Any):
    return parse_config({
        "decision": {"store_url": "sqlite://", **decision},
        "domains": domains if domains is not None else {"d": {"max_nodes": 10, "sites": ["s1", "s2"]}},
        "sites": sites if sites is not None else {"s1": {"driver": "epu-sim", "quota": 5, "price_per_hour": 0.2},
                                                   "s2": {"driver": "epu-sim", "quota": 5, "price_per_hour": 0.1}},
    }, environ={})


class Bus:
    """Collects what the engine publishes."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def __call__(self, msg: Message) -> None:
        self.sent.append(msg)

    def of(self, type_: str) -> list[Any]:
        return [m for m in self.sent if type_ == m.TYPE]

    def clear(self) -> None:
        self.sent.clear()


def make_engine(store_url: Any = "sqlite://", cfg=None, clock: ManualClock | None = None) -> tuple[Engine, Bus, ManualClock]:
    """An engine on a store: an SQL URL, or a ``MemoryDecisionDatabase`` (the simulators' store)."""
    clock = clock or ManualClock(T0)
    bus = Bus()
    return Engine(cfg or config(), open_store(store_url), bus, clock), bus, clock


def open_store(store_url: Any) -> Any:
    """A decision store on ``store_url`` (SQL URL) or on a ``MemoryDecisionDatabase``."""
    from epu.common.db import make_engine as mk
    from sqlalchemy.pool import StaticPool

    from epu.sim.decision_memstore import MemoryDecisionDatabase, MemoryStore

    if isinstance(store_url, MemoryDecisionDatabase):
        return MemoryStore(store_url)
    kw = {"poolclass": StaticPool} if store_url == "sqlite://" else {}
    return Store(mk(store_url, **kw)).create()


def snapshot(domain: str = "d", *, queued: list[QueuedJob] = (), nodes: list[NodeInfo] = (), at: float = T0,
             available: bool = True) -> SensorSnapshot:
    return SensorSnapshot(domain=domain, backend="test", taken_at=at, available=available,
                          jobs=list(queued) if available else [], nodes=list(nodes) if available else [],
                          error=None if available else "cannot reach the batch system")


def event(launch: Any, state: str, seq: int, at: float, *, ip: str | None = "10.0.0.1",
          error_kind: str | None = None, reason: str = "") -> InstanceEvent:
    return InstanceEvent(instance_id=launch.launch_id, domain=launch.domain, site=launch.site, state=state,
                         seq=seq, node_name=launch.node_name, ip=ip, cores=launch.cores, at=at,
                         error_kind=error_kind, reason=reason)
