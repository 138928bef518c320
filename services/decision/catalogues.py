"""What the engine knows of the sites' offerings between iterations: each site's instance types,
which (site, type) offerings are left out after a capacity error, when a domain falls back from
spot to on-demand, and which pending jobs no type can serve.

Why: a capacity error is about one offering, not the site (its other types may have room), and
it comes as an instance event between iterations; the next iteration's packer must place the
demand on the next cheapest offer, not on the one that just failed. So the engine remembers,
in memory, each offering's cooldown and each domain's run of spot capacity errors, and builds the
domain's ``Catalogue`` (``shaped.build_catalogue``) without them. A site that ``discover``s its
sizes takes the types its provisioner found (``instance.report`` ``offered``) instead of the
config's. Nothing here is stored: after a restart every offering is tried again."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from epu.common.config import EpuConfig
from epu.common.config.catalogue import InstanceType, site_types
from epu.common.messages import UnsatisfiableShape
from epu.services.decision.budget import rank_unpriced_last
from epu.services.decision.offers import from_offered
from epu.services.decision.packing import describe_shape, unservable
from epu.services.decision.placement import SiteInfo
from epu.services.decision.shaped import Catalogue, build_catalogue
from epu.services.decision.view import Instance

log = logging.getLogger("epu.decision")


class Catalogues:
    """The sites' instance types and the offerings' recent failures, for every domain."""

    def __init__(self, config: EpuConfig, site_infos: Mapping[str, SiteInfo]) -> None:
        self.config = config
        self.settings = config.decision
        self.site_infos = site_infos
        self.types: dict[str, list[InstanceType]] = {n: site_types(n, s) for n, s in config.sites.items()}
        """Each site's instance-type catalogue, from config (docs/demand.md); a site that
        ``discover``s sizes takes what the provisioner found (``apply_offered``)."""
        self.site_caps = {n: s.budget_per_hour for n, s in config.sites.items() if s.budget_per_hour is not None}
        """Site → its spend cap: under a cap an unpriced type is ranked last (``budget.rank_unpriced_last``)."""
        self.cooldown: dict[tuple[str, str], float] = {}
        """(site, type) offerings out until then after a capacity error (``capacity_error``)."""
        self.spot_failures: dict[str, tuple[int, float]] = {}
        """Domain → (capacity errors of spot offerings in a row, when the last one came)."""
        self.unsatisfiable: dict[str, list[UnsatisfiableShape]] = {}
        """Domain → pending jobs no type of its catalogue can serve (newest iteration)."""

    def apply_offered(self, offered: dict[str, list[Any]]) -> list[str]:
        """A provisioner's discovered catalogues (``instance.report`` ``offered``) replace the
        config-only catalogue of each site that ``discover``s sizes; other sites keep their
        declared types. Returns the sites whose catalogue changed."""
        changed = []
        for site, items in offered.items():
            cfg = self.config.sites.get(site)
            if cfg is None or not cfg.discover:
                continue
            types = from_offered(site, items)
            if types != self.types.get(site):
                self.types[site] = types
                changed.append(site)
                log.info("instance types of a site discovered by the provisioner",
                         extra={"site": site, "types": len(types)})
        return changed

    def catalogue(self, domain: str, cfg: Any, live: dict[str, int], now: float,
                  live_per_type: dict[tuple[str, str], int]) -> Catalogue:
        """The domain's offers now: its sites' types, their rooms, minus offerings cooling down
        (and spot ones while the domain has fallen back to on-demand); under a spend cap, an
        unpriced type ranked after the priced ones."""
        names = [n for n in (cfg.sites or list(self.site_infos)) if n in self.site_infos]
        types = rank_unpriced_last([t for n in names for t in self.types.get(n, [])], cfg.budget_per_hour,
                                   self.site_caps)
        excluded = {k for k, until in self.cooldown.items() if until > now}
        if self.spot_off(domain, now):
            excluded |= {(t.site, t.name) for t in types if t.spot}
        return build_catalogue(types, cfg,
                               {n: self.site_infos[n].quota for n in names}, live, live_per_type,
                               frozenset(excluded))

    def _offer(self, site: str, instance_type: str) -> Any:
        return next((t for t in self.types.get(site, []) if t.name == instance_type), None)

    def capacity_error(self, inst: Instance, now: float, reason: str) -> None:
        """A typed launch met a capacity error: that offering (site, type) is out for the cooldown —
        the next iteration's packer places the demand on the next cheapest offer — and the site is
        not backed off (its other types may have room). Spot errors count towards the fallback."""
        key = (inst.site, inst.instance_type)
        self.cooldown[key] = now + self.settings.capacity_cooldown_seconds
        t = self._offer(*key)
        spot = bool(t is not None and t.spot)
        if spot:
            n, _at = self.spot_failures.get(inst.domain, (0, 0.0))
            self.spot_failures[inst.domain] = (n + 1, now)
        log.warning("capacity error: offering cooling down, failing over", extra={
            "domain": inst.domain, "site": inst.site, "type": inst.instance_type, "spot": spot,
            "until": self.cooldown[key], "reason": reason})

    def spot_started(self, inst: Instance) -> None:
        """A spot instance came up: spot has capacity again, the run of errors is over."""
        t = self._offer(inst.site, inst.instance_type) if inst.instance_type else None
        if t is not None and t.spot:
            self.spot_failures.pop(inst.domain, None)

    def spot_off(self, domain: str, now: float) -> bool:
        """Spot offers left out for ``domain``: too many capacity errors in a row, recently."""
        n, at = self.spot_failures.get(domain, (0, 0.0))
        if n < self.settings.spot_fallback_failures:
            return False
        if now - at >= self.settings.spot_fallback_seconds:
            self.spot_failures.pop(domain, None)  # time to try spot again
            return False
        return True

    def report_unsatisfiable(self, domain: str, shapes: Any, catalogue: Catalogue) -> list[str]:
        """Pending jobs no type can serve: logged once per shape (again only if it went away and came
        back), kept for the metric and the decision records; notes for the shapes new this time (the
        engine then publishes a record even without actions: the report is an event)."""
        found = [UnsatisfiableShape(count=u.jobs, shape=describe_shape(u.shape), constraint=u.constraint,
                                    reason=u.reason)
                 for u in unservable(shapes, catalogue.offers, catalogue.default_partition)]
        before = {(u.shape, u.constraint) for u in self.unsatisfiable.get(domain, [])}
        self.unsatisfiable[domain] = found
        notes = []
        for u in found:
            if (u.shape, u.constraint) not in before:
                log.warning("unsatisfiable jobs: no instance type can serve them; never launched for",
                            extra={"domain": domain, "jobs": u.count, "shape": u.shape, "constraint": u.constraint,
                                   "reason": u.reason})
                notes.append(f"unsatisfiable ({u.constraint}): {u.count} x {u.shape}: {u.reason}")
        return notes

    def next_cooldown_end(self, now: float) -> float:
        """The first offering's cooldown to end after ``now`` (``inf``: none cooling down)."""
        return min((u for u in self.cooldown.values() if u > now), default=math.inf)

    def spot_retry(self, domain: str, now: float) -> float | None:
        """When ``domain`` may try spot again after a run of capacity errors (None: no run)."""
        spot = self.spot_failures.get(domain)
        return None if spot is None else max(now, spot[1] + self.settings.spot_fallback_seconds)
