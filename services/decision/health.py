"""Per domain, in memory: since when the decision pipeline has looked healthy, and the circuit
breaker's state.

Why: our own outage is not a site's fault (issue 11). Stall and loss clocks run only from
``healthy_since``, which moves to now whenever a snapshot is unavailable or late, a launch or
terminate goes unanswered, the provisioner's reports stop while launches are under way, a publish
failed, the engine itself was not iterating, or the breaker is open (nothing is lost while we
cannot see). The breaker's questions are ``breaker``'s; this module keeps their answers over time,
opens and closes it with a note (a decision record, the event), and lets an operator release it.
Nothing here is stored: a restarted engine starts healthy from its first iteration."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from epu.common.config import DecisionConfig
from epu.services.decision import breaker
from epu.services.decision.census import Census
from epu.services.decision.ports import DecisionStore
from epu.services.decision.snapshots import Latest
from epu.services.decision.view import Instance

log = logging.getLogger("epu.decision")


@dataclass
class Health:
    """One domain's pipeline health and breaker."""

    healthy_since: float
    last_iteration: float
    breaker: str = ""
    breaker_since: float = 0.0
    released: bool = False
    """An operator released the breaker: ignore it until a healthy snapshot."""
    publish_failed: bool = False

    def deadline(self, now: float, spans: list[float]) -> float:
        """When this health may next change what an iteration does: ``now`` while it looks
        unhealthy (each iteration moves ``healthy_since``: ``PipelineHealth.update``, ``breaker``),
        else the first of ``spans`` (the policy's durations: a stall counts healthy pipeline time)
        counted from ``healthy_since`` that is not past."""
        if self.publish_failed or (self.breaker and not self.released) or self.healthy_since >= self.last_iteration:
            return now
        return min((t for t in (self.healthy_since + d for d in spans) if t >= now), default=math.inf)


class PipelineHealth:
    """Every domain's ``Health``, and when the provisioner's last report of each arrived."""

    def __init__(self, settings: DecisionConfig, store: DecisionStore) -> None:
        self.settings = settings
        self.store = store
        self.domains: dict[str, Health] = {}
        self.reports: dict[str, float] = {}
        """When the provisioner's last anti-entropy report of each domain arrived: its heartbeat."""

    def update(self, domain: str, latest: Latest, now: float, instances: list[Instance]) -> Health:
        """Update since when the pipeline has looked healthy for ``domain`` (see the module docstring)."""
        gap = self.settings.pipeline_gap_seconds
        h = self.domains.get(domain)
        if h is None:
            h = self.domains[domain] = Health(healthy_since=now, last_iteration=now)
        snap = latest.snapshot
        why = ""
        if now - h.last_iteration > gap:
            why = "the engine was not iterating"
        elif not snap.available:
            why = "sensor unavailable"
        elif now - latest.received_at > gap:
            why = "no fresh snapshot"
        elif h.publish_failed:
            why = "publishing failed"
        elif self.store.overdue(domain, now - gap):
            why = "provisioner not answering"
        elif (domain in self.reports and now - self.reports[domain] > gap
              and any(i.pending for i in instances)):
            # a provisioner that sends reports stopped sending them while launches are under way:
            # it is down (its launches may have booted unseen), not the site
            why = "provisioner silent"
        h.publish_failed = False
        h.last_iteration = now
        if why:
            h.healthy_since = now
        return h

    def breaker_check(self, census: Census, latest: Latest) -> str | None:
        """Why the latest snapshot is implausible ("" = it is fine; None = unavailable, not judged):
        ``breaker.check`` on the refresh's counts, its snapshot-only half once per snapshot."""
        snap = latest.snapshot
        if not snap.available:
            return None
        share, ok = self.settings.breaker_missing_share, self.settings.breaker_ok_count
        if latest.jobs_verdict is None:
            latest.jobs_verdict = breaker.jobs_verdict(snap, share=share, ok_count=ok)
        return breaker.missing_verdict(census.known, census.missing, share=share, ok_count=ok) or latest.jobs_verdict

    def breaker(self, domain: str, h: Health, why: str | None, now: float) -> list[str]:
        """Evaluate the circuit breaker on the latest snapshot (``why``: ``breaker_check``'s
        verdict); notes when it opens or closes."""
        if why is None:
            return []
        notes: list[str] = []
        if why and not h.breaker:
            h.breaker, h.breaker_since = why, now
            notes.append(f"circuit breaker open: {why}; no scale-down and no lost-node handling until a "
                         "healthy snapshot (or epu policy release-breaker)")
            log.warning("circuit breaker open", extra={"domain": domain, "why": why})
        elif not why and h.breaker:
            notes.append(f"circuit breaker closed after {now - h.breaker_since:.0f}s: the snapshot is plausible "
                         f"again (was: {h.breaker})")
            log.info("circuit breaker closed", extra={"domain": domain})
            h.breaker, h.released = "", False
        elif why:
            h.breaker = why
        if h.breaker and not h.released:
            h.healthy_since = now  # nothing is lost while we cannot see
        return notes

    def release(self, domain: str) -> None:
        """An operator released the domain's breaker (``epu policy release-breaker``)."""
        h = self.domains.get(domain)
        if h is not None and h.breaker:
            h.released = True

    def breakers(self) -> dict[str, str]:
        """Domain → why its circuit breaker is open (for metrics and health)."""
        return {d: h.breaker for d, h in self.domains.items() if h.breaker and not h.released}

    def report_seen(self, domain: str, now: float) -> None:
        """The provisioner's report of ``domain`` arrived: it is alive (``update``'s check)."""
        self.reports[domain] = now

    def publish_failed(self, domains: list[str]) -> None:
        for d in domains:
            h = self.domains.get(d)
            if h is not None:
                h.publish_failed = True

    def iterated(self, domain: str, now: float) -> None:
        """An iteration stood for (skipped: it would have done nothing) — not a gap in iterating."""
        h = self.domains.get(domain)
        if h is not None:
            h.last_iteration = now

    def deadlines(self, domain: str, now: float, spans: list[float]) -> list[float]:
        """When ``domain``'s health may next change what an iteration does: its ``Health.deadline``
        and the provisioner's reports turning stale."""
        out = []
        h = self.domains.get(domain)
        if h is not None:
            out.append(h.deadline(now, spans))
        if domain in self.reports:
            out.append(self.reports[domain] + self.settings.pipeline_gap_seconds)
        return out

    def forget(self) -> None:
        """Every domain's health (the broker connection was lost: the clocks start again)."""
        self.domains.clear()
