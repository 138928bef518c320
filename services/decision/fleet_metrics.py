"""The decision engine's fleet gauges: what an operator's Prometheus alerts on and a dashboard draws.

Why here: the engine holds the one consistent picture of a domain — its instance records, the
newest batch snapshot, its configuration in force, the sites' health and the offerings cooling
down — so it exports the fleet by domain, site, type and state, the batch nodes by state, paused
domains, and spend (instance records × the catalogue's price). Labels are bounded by the
configuration (domains, sites, types, states, reasons): never an instance or a node name.

Only the domains this engine acts for are exported: a standby shares the store, and two engines
exporting one domain would double every sum. "Acts for": active now, or active before and still
holding the domain's newest snapshot without having been fenced — so a sensor that stops (the
snapshot ages, the engine turns standby) does not hide instances that are still paid for, while
an engine that lost its broker connection (it forgets its snapshots) or its lease stops
exporting. A scrape reads the last sample (``FleetCollector.collect``) while the engine thread
builds the next (``FleetObserver.observe``): a sample is replaced whole, so a scrape never sees
half an update.

Spend: an instance is paid from its launch until it ends (``requested`` to ``terminated`` or
``failed``), at its catalogue type's ``price_per_hour`` (the site's for an untyped launch), in
the catalogue's currency. An instance nobody priced is not counted as 0: it is left out of the
rates and counted in ``epu_spend_unpriced_instances``. ``epu_spend_rate_per_hour`` is what the live instances cost now;
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
from epu.common.retire import RetireReason
from epu.services.decision.budget import price as budget_price
from epu.services.decision.budget import price_table, site_prices
from epu.services.decision.view import PENDING_STATES
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

DEFAULT_TYPE = "default"
"""The ``type`` label of an instance launched without a catalogue type on a site without a size."""

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
    """(domain, site) → $/h of the live instances whose price is known."""
    unpriced: dict[tuple[str, str], int] = field(default_factory=dict)
    """(domain, site) → live instances nobody priced (left out of ``spend_rate``: unknown, not 0)."""
    budget: dict[str, float] = field(default_factory=dict)
    cooldown: dict[tuple[str, str], float] = field(default_factory=dict)
    """(site, type) → seconds an offering is still out after a capacity error."""
    site_failures: dict[str, int] = field(default_factory=dict)


@dataclass
class _DomainFleet:
    """One domain's instances, aggregated; reused while the store's stamp of the domain (and the
    prices) stay the same — a quiet domain of 50,000 instances costs nothing per sample."""

    key: tuple[Any, ...]
    counts: dict[tuple[str, str, str, str], int]
    rate: dict[str, float]
    """site → price per hour of the live instances."""
    booting_since: dict[str, float]
    """site → launch time of the oldest instance not joined yet."""
    retiring: dict[str, str]
    """instance → why it is being taken out."""
    unpriced: dict[str, int] = field(default_factory=dict)
    """site → live instances whose price is unknown (not in ``rate``)."""


class FleetObserver:
    """Builds a ``FleetSample`` from the engine and keeps the counters; runs on the engine thread.

    ``engine`` needs ``domains``, ``leadership(domain)``, ``latest_snapshot(domain)``, ``store``
    (``instances(domain)``, ``domain_stamp(domain)``, ``current_config(domain)``,
    ``site_health()``), ``config.sites``, ``types``, ``site_infos`` and ``cooldown`` — what
    ``Engine`` has.
    """

    def __init__(self, engine: Any, now: Callable[[], float], min_interval: float = 5.0) -> None:
        self.engine = engine
        self.now = now
        self.min_interval = min_interval
        self.sample = FleetSample()
        self.spend_total: dict[tuple[str, str], float] = {}
        self.launches: Counter[tuple[str, str, str]] = Counter()
        """(domain, site, type) → launches the iterations sent."""
        self.retired: Counter[tuple[str, str]] = Counter()
        """(domain, reason) → instances seen being taken out, by why."""
        self._domains: dict[str, _DomainFleet] = {}
        self._owned: set[str] = set()
        """Domains this engine exports (see the module docstring)."""
        self._last: float | None = None

    def _known(self, domain: str) -> None:
        """Start the domain's counters at 0 for every label set known now — its sites and their
        catalogue types, every retire reason — instead of at their first increment: Prometheus's
        ``increase()`` reads a series born at 1 as no increase (issue 34: an alert missed the first
        events)."""
        e = self.engine
        current = e.store.current_config(domain)
        sites = (current[1].sites if current is not None else []) or list(e.config.sites)
        for site in sites:
            types = [t.name for t in e.types.get(site, ())] or [self._site_type(site, "")]
            for typ in types:
                self.launches.setdefault((domain, site, typ), 0)
        for reason in RetireReason:
            self.retired.setdefault((domain, reason.value), 0)

    # ------------------------------------------------------------------ inputs
    def _site_type(self, site_name: str, instance_type: str) -> str:
        if instance_type:
            return instance_type
        site = self.engine.config.sites.get(site_name)
        return (site.size if site is not None else "") or DEFAULT_TYPE

    def prices(self) -> dict[tuple[str, str], float | None]:
        """(site, type) → price per hour: each catalogue type's, and ("site", "") the site's own
        (an untyped launch's); None where nobody priced it (``budget.price_table``)."""
        return price_table(site_prices(self.engine.config.sites), self.engine.types)

    def owned(self) -> list[str]:
        """The domains whose fleet this engine exports now."""
        e = self.engine
        for d in e.domains:
            state = e.leadership(d)
            if state == "active":
                self._owned.add(d)
            elif state == "fenced" or e.latest_snapshot(d) is None:
                self._owned.discard(d)
        return [d for d in e.domains if d in self._owned]

    def recorded(self, records: Iterable[DecisionRecord]) -> None:
        """Count the launches an iteration sent, by site and type."""
        for r in records:
            if r.shadow:  # observe mode: nothing was launched
                continue
            for a in r.actions:
                if a.kind == "launch":
                    self.launches[(r.domain, a.site, self._site_type(a.site, a.instance_type))] += 1

    def _aggregate(self, domain: str, key: tuple[Any, ...], prices: dict[tuple[str, str], float]) -> _DomainFleet:
        counts: Counter[tuple[str, str, str, str]] = Counter()
        rate: dict[str, float] = {}
        unpriced: dict[str, int] = {}
        booting: dict[str, float] = {}
        retiring: dict[str, str] = {}
        types: dict[tuple[str, str], str] = {}
        for inst in self.engine.store.instances(domain):
            site, it = inst.site, inst.instance_type
            label = types.get((site, it))
            if label is None:
                label = types[(site, it)] = self._site_type(site, it)
            counts[(domain, site, label, inst.state)] += 1
            price = budget_price(prices, site, it)
            if price is None:  # unknown: counted apart, never as 0
                unpriced[site] = unpriced.get(site, 0) + 1
                price = 0.0
            rate[site] = rate.get(site, 0.0) + price
            if inst.state in PENDING_STATES and inst.launched_at < booting.get(site, float("inf")):
                booting[site] = inst.launched_at
            if inst.retire:
                retiring[inst.instance_id] = inst.retire
        return _DomainFleet(key, dict(counts), rate, booting, retiring, unpriced)

    def observe(self, force: bool = False) -> FleetSample:
        """Sample the fleet now (at most every ``min_interval`` seconds unless ``force``: an
        engine woken by every snapshot iterates far more often than anyone scrapes); integrate
        the spend rate since the last sample."""
        e = self.engine
        now = self.now()
        if not force and self._last is not None and now - self._last < self.min_interval:
            return self.sample
        active = self.owned()
        prices = self.prices()
        price_key = tuple(sorted(prices.items()))
        s = FleetSample()
        for d in active:
            key = (e.store.domain_stamp(d), price_key)
            before = self._domains.get(d)
            fleet = before if before is not None and before.key == key else self._aggregate(d, key, prices)
            if fleet is not before:
                seen = before.retiring if before is not None else {}
                for iid, why in fleet.retiring.items():
                    if seen.get(iid) != why:
                        self.retired[(d, why)] += 1
                self._domains[d] = fleet
            s.instances.update(fleet.counts)
            for site, r in fleet.rate.items():
                s.spend_rate[(d, site)] = r
            for site, n in fleet.unpriced.items():
                s.unpriced[(d, site)] = n
            for site, since in fleet.booting_since.items():
                s.booting_oldest[(d, site)] = max(0.0, now - since)
        for d in list(self._domains):
            if d not in active:
                del self._domains[d]  # taken up again later: counted afresh from the store
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
            budget = cfg.budget_per_hour  # the spend cap, where one is set
            if budget is not None:
                s.budget[d] = float(budget)
            for site in cfg.sites or list(e.config.sites):  # a site with nothing running costs 0, not absent
                s.spend_rate.setdefault((d, site), 0.0)
                s.unpriced.setdefault((d, site), 0)
        s.cooldown = {k: max(0.0, until - now) for k, until in e.cooldown.items()}
        s.site_failures = {name: h.failures for name, h in e.store.site_health().items()}
        if self._last is not None:
            hours = max(0.0, now - self._last) / 3600.0
            for key2, rate in self.sample.spend_rate.items():  # what ran since the last sample
                if key2[0] in active:
                    self.spend_total[key2] = self.spend_total.get(key2, 0.0) + rate * hours
        for key2 in s.spend_rate:
            self.spend_total.setdefault(key2, 0.0)
        for d in active:  # every known label set from 0: increase() then sees the first launch, retirement
            self._known(d)
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
        yield _gauge("epu_spend_unpriced_instances", "Live instances whose price nobody gave (no price_per_hour, "
                     "a driver size without a price), by domain and site: not in epu_spend_rate_per_hour",
                     ["domain", "site"], s.unpriced)
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
