"""Cost accounting: who paid node-second went to whom. Pure: no I/O, no clock.

One rule, used by ``epu cost`` (live, from the event stream) and by ``epu simulate``'s report:

* an instance is **paid** from its launch (its first event, ``requested`` or later) until it is
  ``terminated`` or ``failed`` (or the end of the period), at its catalogue price per hour;
* at every moment, the paid time of an instance is shared **equally among the jobs running on
  its node** then, each share going to the job's (account, user, partition);
* time with no job on the node (booting, idle, draining, shutting down) goes to the account
  ``(idle)`` — it is the price of elasticity, reported apart rather than spread over the jobs.

So the sum over accounts (``(idle)`` included) is the total cost, by construction. Live, the jobs
on a node are known from the sensor's snapshots: the jobs a snapshot lists on a node count from
that snapshot until the next one (the resolution is the sensor's poll period); owners come from
``SensorSnapshot.owners`` (a backend that does not report them leaves account and user "").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from epu.common.messages import TERMINAL_INSTANCE_STATES, InstanceEvent, Message, SensorSnapshot

IDLE = "(idle)"
DIMENSIONS = ("domain", "site", "type", "account", "user", "partition")


@dataclass
class Life:
    """One instance's paid life."""

    instance_id: str
    domain: str
    site: str
    instance_type: str
    start: float
    end: float | None = None
    """None: still live."""
    node_name: str = ""
    seq: int = -1


@dataclass(frozen=True)
class Occupancy:
    """A job on an instance's node from ``start`` to ``end``."""

    instance_id: str
    start: float
    end: float
    job_id: str


@dataclass
class Usage:
    node_seconds: float = 0.0
    cost: float = 0.0

    def add(self, seconds: float, price: float) -> None:
        self.node_seconds += seconds
        self.cost += seconds / 3600.0 * price


Key = tuple[str, str, str, str, str, str]
"""(domain, site, type, account, user, partition)."""


def attribute(lives: Iterable[Life], occupancy: Iterable[Occupancy], owners: dict[str, tuple[str, str, str]],
              prices: dict[tuple[str, str], float], since: float, until: float) -> dict[Key, Usage]:
    """Node-seconds and cost per key over [since, until) (the module's rule)."""
    by_inst: dict[str, list[Occupancy]] = {}
    for o in occupancy:
        by_inst.setdefault(o.instance_id, []).append(o)
    out: dict[Key, Usage] = {}
    for life in lives:
        a, b = max(life.start, since), min(life.end if life.end is not None else until, until)
        if b <= a:
            continue
        price = prices.get((life.site, life.instance_type), prices.get((life.site, ""), 0.0))
        base = (life.domain, life.site, life.instance_type)
        spans = [(max(o.start, a), min(o.end, b), o.job_id) for o in by_inst.get(life.instance_id, ())]
        spans = [s for s in spans if s[1] > s[0]]
        cuts = sorted({a, b, *(s[0] for s in spans), *(s[1] for s in spans)})
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            jobs = sorted({j for s, e, j in spans if s <= lo and e >= hi})
            if not jobs:
                out.setdefault((*base, IDLE, IDLE, IDLE), Usage()).add(hi - lo, price)
                continue
            share = (hi - lo) / len(jobs)
            for j in jobs:
                acct, user, part = owners.get(j, ("", "", ""))
                out.setdefault((*base, acct, user, part), Usage()).add(share, price)
    return out


def group(usage: dict[Key, Usage], by: list[str]) -> list[tuple[tuple[str, ...], Usage]]:
    """``usage`` summed over the dimensions not in ``by`` (names of ``DIMENSIONS``), sorted by cost."""
    idx = [DIMENSIONS.index(d) for d in by]
    out: dict[tuple[str, ...], Usage] = {}
    for key, u in usage.items():
        k = tuple(key[i] for i in idx)
        g = out.setdefault(k, Usage())
        g.node_seconds += u.node_seconds
        g.cost += u.cost
    return sorted(out.items(), key=lambda kv: (-kv[1].cost, kv[0]))


def total(usage: dict[Key, Usage]) -> Usage:
    t = Usage()
    for u in usage.values():
        t.node_seconds += u.node_seconds
        t.cost += u.cost
    return t


@dataclass
class Ledger:
    """The live fold: feed it the event stream (``observe``) or a ledger file's facts, then
    ``attribute`` a period. Instance events move a life forward only by ``seq``; each available
    snapshot closes the occupancy the previous one opened and opens its own."""

    lives: dict[str, Life] = field(default_factory=dict)
    occupancy: list[Occupancy] = field(default_factory=list)
    owners: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    _open: dict[str, tuple[float, dict[str, list[str]]]] = field(default_factory=dict)
    """Domain → (when its last snapshot was taken, instance id → the jobs it listed there)."""
    _by_name: dict[tuple[str, str], str] = field(default_factory=dict)
    """(domain, node name) → instance id, for nodes a backend reports without identity."""

    def observe(self, msg: Message) -> dict | None:
        """Fold one message; returns the fact to append to a ledger file (None: nothing to keep)."""
        if isinstance(msg, InstanceEvent):
            fact = {"k": "i", "id": msg.instance_id, "domain": msg.domain, "site": msg.site,
                    "type": msg.instance_type, "state": msg.state, "seq": msg.seq, "at": float(msg.at),
                    "node": msg.node_name or ""}
        elif isinstance(msg, SensorSnapshot) and msg.available:
            nodes: dict[str, list[str]] = {}
            for n in msg.nodes:
                iid = n.instance_id or self._by_name.get((msg.domain, n.name))
                if iid is not None and n.jobs:
                    nodes[iid] = list(n.jobs)
            running = {j for js in nodes.values() for j in js}
            fact = {"k": "s", "domain": msg.domain, "at": float(msg.taken_at), "nodes": nodes,
                    "owners": {j: list(o) for j, o in msg.owners.items() if j in running}}
        else:
            return None
        self.apply(fact)
        return fact

    def apply(self, fact: dict) -> None:
        """Fold one ledger fact (what ``observe`` returned)."""
        if fact["k"] == "i":
            self._instance(fact)
        elif fact["k"] == "s":
            self._snapshot(fact)

    def _instance(self, f: dict) -> None:
        life = self.lives.get(f["id"])
        if life is None:
            life = self.lives[f["id"]] = Life(f["id"], f["domain"], f["site"], f.get("type", ""), f["at"])
        if f["seq"] < life.seq:
            return
        life.seq = f["seq"]
        life.start = min(life.start, f["at"])
        if f.get("type"):
            life.instance_type = f["type"]
        if f.get("node"):
            life.node_name = f["node"]
            self._by_name[(life.domain, life.node_name)] = life.instance_id
        if f["state"] in TERMINAL_INSTANCE_STATES and life.end is None:
            life.end = f["at"]
            self._by_name.pop((life.domain, life.node_name), None)

    def _snapshot(self, f: dict) -> None:
        at, domain = f["at"], f["domain"]
        prev = self._open.get(domain)
        if prev is not None and at < prev[0]:
            return  # an older snapshot than the one already counted
        self._close(domain, at)
        self._open[domain] = (at, {k: list(v) for k, v in f["nodes"].items()})
        for j, o in f.get("owners", {}).items():
            self.owners[j] = (str(o[0]), str(o[1]), str(o[2])) if len(o) >= 3 else ("", "", "")

    def _close(self, domain: str, at: float) -> None:
        prev = self._open.pop(domain, None)
        if prev is None:
            return
        since, nodes = prev
        for iid, jobs in nodes.items():
            self.occupancy.extend(Occupancy(iid, since, at, j) for j in jobs)

    def attribute(self, prices: dict[tuple[str, str], float], since: float, until: float) -> dict[Key, Usage]:
        """The module's rule over [since, until); jobs of the newest snapshots count up to ``until``."""
        open_ = [Occupancy(iid, at, until, j) for at, nodes in self._open.values()
                 for iid, jobs in nodes.items() for j in jobs]
        return attribute(self.lives.values(), [*self.occupancy, *open_], self.owners, prices, since, until)
