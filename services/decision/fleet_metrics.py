"""The decision engine's fleet gauges: what an operator's Prometheus alerts on and a dashboard draws.

Why here: the engine holds the one consistent picture of a domain — its instance records, the
newest batch snapshot, its configuration in force, the sites' health and the offerings cooling
down — so it exports the fleet by domain, site, type and state, the batch nodes by state, paused
domains, and spend (instance records × the catalogue's price). Labels are bounded by the
configuration (domains, sites, types, states, reasons): never an instance or a node name.

Only the domains this engine is *active* for are exported: a standby shares the store, and two
engines exporting one domain would double every sum. A scrape reads the last sample
(``FleetCollector.collect``) while the engine thread builds the next (``FleetObserver.observe``):
a sample is replaced whole, so a scrape never sees half an update.

Spend: an instance is paid from its launch until it ends (``requested`` to ``terminated`` or
``failed``), at its catalogue type's ``price_per_hour`` (the site's for an untyped launch), in
the catalogue's currency. ``epu_spend_rate_per_hour`` is what the live instances cost now;
``epu_spend_total`` is this process's integral of that rate over the time it was active for the
domain — a counter that restarts at 0 with the process, as Prometheus counters do (use
``increase()``, which sums across restarts and engine failovers).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from epu.common.messages import DecisionRecord
from epu.services.decision.view import PENDING_STATES, Instance
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

DEFAULT_TYPE = "default"
"""The ``type`` label of an instance launched without a catalogue type on a site without a size."""

REPLACING = frozenset({"stalled", "lost", "interrupted"})
"""Retirement reasons the engine replaces the instance for (the rest are scale-down, gang, operator)."""


@dataclass
class FleetSample:
    """One observation, exported as a whole."""

    instances: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    """(domain, site, type, state) → live instances."""
    booting_oldest: dict[tuple[str, str], float] = field(default_factory=dict)
    """(domain, site) → seconds since the oldest instance not joined yet was launched."""
    nodes: dict[tuple[str, str], int] = field(default_factory=dict)
    """(domain, state) → batch nodes in the newest snapshot."""
    paused: dict[str, int] = field(default_factory=dict)
    spend_rate: dict[tuple[str, str], float] = field(default_factory=dict)
    budget: dict[str, float] = field(default_factory=dict)
    cooldown: dict[tuple[str, str], float] = field(default_factory=dict)
    """(site, type) → seconds an offering is still out after a capacity error."""
    site_failures: dict[str, int] = field(default_factory=dict)


class FleetObserver:
    """Builds a ``FleetSample`` from the engine and keeps the counters; runs on the engine thread.

    ``engine`` needs ``domains``, ``leadership(domain)``, ``latest_snapshot(domain)``, ``store``
    (``instances()``, ``current_config(domain)``, ``site_health()``), ``config.sites``, ``types``,
    ``site_infos`` and ``cooldown`` — what ``Engine`` has.
    """

    def __init__(self, engine: Any, now: Callable[[], float], min_interval: float = 2.0) -> None:
        self.engine = engine
        self.now = now
        self.min_interval = min_interval
        self.sample = FleetSample()
        self.spend_total: dict[tuple[str, str], float] = {}
        self.launches: Counter[tuple[str, str, str]] = Counter()
        """(domain, site, type) → launches the iterations sent."""
        self.retired: Counter[tuple[str, str]] = Counter()
        """(domain, reason) → instances seen being taken out, by why."""
        self._retiring: set[str] = set()
        self._last: float | None = None

    # ------------------------------------------------------------------ inputs
    def type_of(self, inst: Instance) -> str:
        if inst.instance_type:
            return inst.instance_type
        site = self.engine.config.sites.get(inst.site)
        return (site.size if site is not None else "") or DEFAULT_TYPE

    def price(self, inst: Instance) -> float:
        """The instance's price per hour: its catalogue type's, else its site's (0 when unknown)."""
        if inst.instance_type:
            t = next((t for t in self.engine.types.get(inst.site, []) if t.name == inst.instance_type), None)
            if t is not None:
                return float(t.price_per_hour)
        info = self.engine.site_infos.get(inst.site)
        return float(info.price_per_hour) if info is not None else 0.0

    def recorded(self, records: Iterable[DecisionRecord]) -> None:
        """Count the launches an iteration sent, by site and type."""
        for r in records:
            for a in r.actions:
                if a.kind == "launch":
                    site = self.engine.config.sites.get(a.site)
                    type_ = a.instance_type or (site.size if site is not None else "") or DEFAULT_TYPE
                    self.launches[(r.domain, a.site, type_)] += 1

    def observe(self, force: bool = False) -> FleetSample:
        """Sample the fleet now (at most every ``min_interval`` seconds unless ``force``: an
        engine woken by every snapshot iterates far more often than anyone scrapes); integrate
        the spend rate since the last sample."""
        e = self.engine
        now = self.now()
        if not force and self._last is not None and now - self._last < self.min_interval:
            return self.sample
        active = [d for d in e.domains if e.leadership(d) == "active"]
        s = FleetSample()
        retiring: set[str] = set()
        counts: Counter[tuple[str, str, str, str]] = Counter()
        for inst in e.store.instances():
            if inst.domain not in active:
                continue
            key = (inst.domain, inst.site)
            counts[(inst.domain, inst.site, self.type_of(inst), inst.state)] += 1
            s.spend_rate[key] = s.spend_rate.get(key, 0.0) + self.price(inst)
            if inst.state in PENDING_STATES:
                s.booting_oldest[key] = max(s.booting_oldest.get(key, 0.0), max(0.0, now - inst.launched_at))
            if inst.retire:
                retiring.add(inst.instance_id)
                if inst.instance_id not in self._retiring:
                    self.retired[(inst.domain, inst.retire)] += 1
        self._retiring = retiring
        s.instances = dict(counts)
        for d in active:
            snap = e.latest_snapshot(d)
            if snap is not None and snap.available:
                for n in snap.nodes:
                    s.nodes[(d, n.state)] = s.nodes.get((d, n.state), 0) + 1
            current = e.store.current_config(d)
            if current is None:
                continue
            cfg = current[1]
            s.paused[d] = 1 if cfg.paused else 0
            budget = getattr(cfg, "budget_per_hour", None)  # the spend cap, where the config has one
            if budget is not None:
                s.budget[d] = float(budget)
            for site in cfg.sites or list(e.config.sites):  # a site with nothing running costs 0, not absent
                s.spend_rate.setdefault((d, site), 0.0)
        s.cooldown = {k: max(0.0, until - now) for k, until in e.cooldown.items()}
        s.site_failures = {name: h.failures for name, h in e.store.site_health().items()}
        if self._last is not None:
            hours = max(0.0, now - self._last) / 3600.0
            for key, rate in self.sample.spend_rate.items():  # what ran since the last sample
                if key[0] in active:
                    self.spend_total[key] = self.spend_total.get(key, 0.0) + rate * hours
        for key in s.spend_rate:
            self.spend_total.setdefault(key, 0.0)
        self._last = now
        self.sample = s
        return s


class FleetCollector(Collector):
    """Exports the observer's last sample and counters at each scrape."""

    def __init__(self, observer: FleetObserver) -> None:
        self.observer = observer

    def collect(self) -> Iterator[Any]:
        o = self.observer
        s = o.sample
        yield _gauge("epu_instances", "Live cloud instances of the domains this engine acts for, by domain, "
                     "site, instance type and state", ["domain", "site", "type", "state"], s.instances)
        yield _gauge("epu_instances_booting_oldest_seconds", "Seconds since the oldest instance not yet "
                     "joined to the batch system was launched, by domain and site (absent: none booting)",
                     ["domain", "site"], s.booting_oldest)
        yield _gauge("epu_batch_nodes", "Batch nodes in the newest snapshot, by domain and state",
                     ["domain", "state"], s.nodes)
        yield _gauge("epu_decision_domain_paused", "1 while an operator has paused the domain (no launch, "
                     "no scale-down)", ["domain"], {(d,): v for d, v in s.paused.items()})
        yield _gauge("epu_decision_offering_cooldown_seconds", "Seconds an offering (site, instance type) is "
                     "still left out after a capacity error (0: not)", ["site", "type"], s.cooldown)
        yield _gauge("epu_decision_site_failures", "Launch failures of a site in a row (its backoff grows "
                     "with them)", ["site"], {(k,): v for k, v in s.site_failures.items()})
        yield _gauge("epu_spend_rate_per_hour", "What the live instances cost per hour now, by domain and site "
                     "(catalogue price, its currency)", ["domain", "site"], s.spend_rate)
        yield _gauge("epu_spend_budget_per_hour", "The domain's spend cap per hour, as configured (absent: "
                     "no cap)", ["domain"], {(d,): v for d, v in s.budget.items()})
        spend = CounterMetricFamily("epu_spend", "Cost of the instances while this engine acted for the domain, "
                                    "by domain and site (catalogue price; restarts at 0 with the process)",
                                    labels=["domain", "site"])
        for key, v in sorted(o.spend_total.items()):
            spend.add_metric(list(key), v)
        yield spend
        launches = CounterMetricFamily("epu_decision_launches", "Instances launched by the engine's "
                                       "iterations, by domain, site and instance type",
                                       labels=["domain", "site", "type"])
        for key3, n in sorted(o.launches.items()):
            launches.add_metric(list(key3), n)
        yield launches
        retired = CounterMetricFamily("epu_instances_retired", "Instances seen being taken out, by domain and "
                                      "reason (stalled, lost, interrupted: replaced; scale-down, gang, operator)",
                                      labels=["domain", "reason"])
        for key2, n in sorted(o.retired.items()):
            retired.add_metric(list(key2), n)
        yield retired


def _gauge(name: str, doc: str, labels: list[str], values: dict[Any, float]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels)
    for key, v in sorted(values.items()):
        g.add_metric(list(key), v)
    return g


def install(registry: CollectorRegistry, engine: Any, now: Callable[[], float]) -> FleetObserver:
    """Register the fleet metrics on ``registry``; the caller runs ``observe()`` after each iteration."""
    observer = FleetObserver(engine, now)
    registry.register(FleetCollector(observer))
    return observer
