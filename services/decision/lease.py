"""Fencing: one brain per domain (design rule 9), with a lease and an epoch in the shared store.

Why, beside single-active-consumer: SAC decides who *receives* a domain's snapshots, not who
still *acts* on them. After a connection blip the broker hands the queue to the standby while
the old engine — reconnected as a standby — still holds a fresh cached snapshot; both acted
for up to ``active_window_seconds``. The store's read-then-write checks do not protect across
processes.

The lease: one row per domain (``holder``, ``epoch``, ``expires_at``). An engine that wants to
act on a domain (it has a fresh snapshot) takes the lease if it is free or expired — bumping
the epoch — or renews its own; otherwise it stands by. Every commit of a plan re-checks and
extends the lease *in the same transaction* as the plan's rows (``fence``): if another engine
took the lease meanwhile (a new epoch), the commit fails, nothing of the plan is stored, and
so nothing is sent. A process that loses its broker connection releases its leases and drops
its cached snapshots, so the engine the broker chose takes over at once instead of after the
lease runs out.

States per domain, as ``/healthz`` reports them:

* ``active`` — this engine holds the lease and a fresh snapshot: it acts;
* ``standby`` — no fresh snapshot here, or the lease is held by another engine;
* ``fenced`` — this engine held the lease and lost it (another engine took a newer epoch); it
  does not act until it takes the lease again.

Times are the engines' clocks (``Clock``): engines sharing a store must keep their clocks in
step (NTP), within a small fraction of ``lease_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from epu.common.db import create_schema
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, bindparam, insert, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

metadata = MetaData()
leases = Table(
    "decision_leases", metadata,
    Column("domain", String(64), primary_key=True),
    Column("holder", String(200), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("expires_at", Float, nullable=False),
)


_RENEW = (update(leases).where(leases.c.domain == bindparam("d"), leases.c.holder == bindparam("h"),
                               leases.c.epoch == bindparam("e")).values(expires_at=bindparam("x")))
_SELECT = select(leases).where(leases.c.domain == bindparam("d"))
_FENCE = _RENEW.where(leases.c.expires_at >= bindparam("now"))


class Fenced(Exception):
    """This engine no longer holds the domain's lease: the plan was not committed."""


class StaleWrite(Exception):
    """Another engine process wrote the shared store after this one last read it: the write —
    which may rest on what it read — was rolled back. Read again (``Store.sync``) and redo it.

    Why, beside the lease: the lease fences plan commits per domain, but node results and
    instance events arrive on the input queue, and the control queue and a snapshot queue may be
    consumed by different engines (a consumer cancelled on one queue); both processes then write
    the same instance rows, and the later whole-row write silently undid the earlier one. Every
    write that changes an instance is therefore a compare-and-set on the store's generation
    counter, which every write transaction moves: it commits only if no other process wrote since
    this one's last read."""

    transient = True
    """For the service runtime (``common.failures``): read again and retry in place."""


@dataclass
class Held:
    epoch: int
    expires_at: float


class Leases:
    """The leases of one engine process (``holder``) in the shared store."""

    def __init__(self, engine: Engine, holder: str, ttl: float) -> None:
        self.engine = engine
        self.holder = holder
        self.ttl = ttl
        self.held: dict[str, Held] = {}
        self.lost: set[str] = set()
        """Domains whose lease this engine held and another engine took (fenced)."""
        self._rows: set[str] = set()

    def create(self) -> Leases:
        create_schema(self.engine, metadata)
        return self

    def hold(self, domain: str, now: float) -> bool:
        """Take or renew the lease of ``domain``; True if this engine holds it now."""
        self._ensure_row(domain)
        mine = self.held.get(domain)
        with self.engine.begin() as conn:
            # the common case, every iteration of the active engine: renew our own lease in one
            # prebuilt statement (it runs every few seconds per domain; measured by bench_sim)
            if mine is not None and conn.execute(_RENEW, {"d": domain, "h": self.holder, "e": mine.epoch,
                                                          "x": now + self.ttl}).rowcount == 1:
                return self._won(domain, mine.epoch, now)
            row = conn.execute(_SELECT, {"d": domain}).one()
            if mine is not None:
                self.lost.add(domain)  # another engine took it from us (we were away too long)
                self.held.pop(domain, None)
            if row.expires_at > now:
                return self._standby(domain)
            # free or run out: take it with a new epoch, unless another engine does so first
            taken = conn.execute(update(leases).where(leases.c.domain == domain, leases.c.epoch == row.epoch)
                                 .values(holder=self.holder, epoch=row.epoch + 1, expires_at=now + self.ttl))
            if taken.rowcount != 1:
                return self._standby(domain)
            return self._won(domain, row.epoch + 1, now)

    def renew_many(self, domains: list[str], now: float) -> set[str]:
        """Renew, in one transaction, the leases of ``domains`` this engine holds; returns those
        renewed (one commit per iteration, not one per domain: 1,000 domains made 1,000 commits).
        The others — a lease to take, or one another engine took meanwhile — are ``hold``'s,
        one by one, as before (the caller's)."""
        mine = [(d, self.held[d]) for d in dict.fromkeys(domains) if d in self.held]
        if not mine:
            return set()
        with self.engine.begin() as conn:
            conn.execute(_RENEW, [{"d": d, "h": self.holder, "e": h.epoch, "x": now + self.ttl} for d, h in mine])
            ours: set[str] = set()
            for i in range(0, len(mine), 500):  # under every backend's bound-parameter limit
                chunk = {d: h.epoch for d, h in mine[i:i + 500]}
                rows = conn.execute(select(leases.c.domain, leases.c.holder, leases.c.epoch)
                                    .where(leases.c.domain.in_(list(chunk))))
                ours.update(r.domain for r in rows if r.holder == self.holder and r.epoch == chunk[r.domain])
        for d, h in mine:
            if d in ours:  # the renewal matched (same holder and epoch): ours until now + ttl
                self._won(d, h.epoch, now)
        return ours

    def _ensure_row(self, domain: str) -> None:
        if domain in self._rows:
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(leases).values(domain=domain, holder="", epoch=0, expires_at=0.0))
        except IntegrityError:
            pass  # it exists (another engine made it)
        self._rows.add(domain)

    def _won(self, domain: str, epoch: int, now: float) -> bool:
        self.held[domain] = Held(epoch, now + self.ttl)
        self.lost.discard(domain)
        return True

    def _standby(self, domain: str) -> bool:
        self.held.pop(domain, None)
        return False

    def fence(self, domain: str, now: float) -> Callable[[Connection], None]:
        """A check for a plan's transaction: extend the lease if it is still ours (same epoch,
        not expired), else raise ``Fenced`` so the transaction — the plan — is rolled back."""
        mine = self.held.get(domain)

        def check(conn: Connection) -> None:
            if mine is None:
                raise Fenced(f"no lease held on domain {domain!r}")
            ok = conn.execute(_FENCE, {"d": domain, "h": self.holder, "e": mine.epoch, "now": now,
                                       "x": now + self.ttl}).rowcount == 1
            if not ok:
                self.held.pop(domain, None)
                self.lost.add(domain)
                raise Fenced(f"lease of domain {domain!r} (epoch {mine.epoch}) taken by another engine")
            mine.expires_at = now + self.ttl

        return check

    def release(self, domain: str | None = None) -> None:
        """Give leases up now (shutdown, broker connection lost): another engine may take them
        at once. Best effort: a store that cannot be reached lets them run out instead."""
        domains = [domain] if domain else list(self.held)
        try:
            with self.engine.begin() as conn:
                for d in domains:
                    h = self.held.get(d)
                    if h is not None:
                        conn.execute(update(leases).where(leases.c.domain == d, leases.c.holder == self.holder,
                                                          leases.c.epoch == h.epoch).values(expires_at=0.0))
        except Exception:  # noqa: S110 - the lease simply expires on its own
            pass
        for d in domains:
            self.held.pop(d, None)

    def row(self, domain: str) -> tuple[str, int, float] | None:
        """(holder, epoch, expires_at) of the shared lease of ``domain`` (None: never taken)."""
        with self.engine.connect() as conn:
            r = conn.execute(_SELECT, {"d": domain}).first()
        return (r.holder, r.epoch, r.expires_at) if r is not None else None

    def state(self, domain: str, active: bool) -> str:
        if domain in self.lost:
            return "fenced"
        return "active" if active and domain in self.held else "standby"
