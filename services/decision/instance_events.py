"""The provisioner's word on instances, applied to the engine's instance table: live events
(``instance.event``), the anti-entropy reports that summarize them (``instance.report``), and
terminates asked again when that word does not come.

Why one module: the three are one reconciliation. An event moves an instance forward (by state
order and ``seq``); a report replays the events the engine missed and tells which records the
provisioner holds live that ended here; a ``terminating`` instance that never becomes
``terminated`` had its answer lost with a provisioner's store, so the terminate is sent again.
What an event means beyond the table goes to its owner: a launch failure is counted against its
site at the next iteration (``take_failures``), a capacity error cools its offering down and a
spot start ends a spot fallback (``catalogues``), a report is the provisioner's heartbeat
(``health``)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import replace

from epu.common.clock import Clock
from epu.common.config import EpuConfig
from epu.common.messages import (
    INSTANCE_STATE_ORDER,
    INTERRUPTION_REASON,
    TERMINAL_INSTANCE_STATES,
    InstanceEvent,
    InstanceReport,
)
from epu.common.retire import Proof, RetireReason
from epu.services.decision.catalogues import Catalogues
from epu.services.decision.gate import Authority, Gate, proof_of, retire_of, terminate_request
from epu.services.decision.health import PipelineHealth
from epu.services.decision.planner import node_name_for
from epu.services.decision.ports import DecisionStore
from epu.services.decision.view import Instance, evolve

log = logging.getLogger("epu.decision")

#: The most copies of one bookkeeping terminate sent at once (``InstanceEvents._end_stale``).
STALE_COPIES = 3


class InstanceEvents:
    """Applies the provisioner's events and reports of the configured domains to ``store``."""

    def __init__(self, config: EpuConfig, store: DecisionStore, clock: Clock, gate: Gate,
                 acting: Callable[[str, float], bool], catalogues: Catalogues, health: PipelineHealth) -> None:
        self.config = config
        self.settings = config.decision
        self.store = store
        self.clock = clock
        self.gate = gate
        """The engine's one door (``gate``): the terminates asked again leave by it."""
        self.acting = acting
        """Whether this engine acts for a domain now (``Engine.acting``): only then does it re-send."""
        self.catalogues = catalogues
        self.health = health
        self._stale_due: dict[str, float] = {}
        """Instance → when its provisioner's stale record may be closed again (``_end_stale``)."""
        self._stale_asks: dict[str, int] = {}
        """Instance → how many times its stale record was asked to close (``_end_stale``)."""
        self._asked_again: dict[str, float] = {}
        """Instance → when a terminate was last re-sent for it (``unfinished_terminates``)."""
        self._failures: dict[str, str] = {}
        """Launch failures seen since the last iteration, per site (counted once there)."""
        self._ending: dict[str, tuple[int, list[Instance]]] = {}
        """Per domain: (instance stamp, its ``terminating`` instances) (``unfinished_terminates``)."""

    def on_instance_report(self, report: InstanceReport) -> int:
        """Anti-entropy: apply the provisioner's full state of a domain, entry by entry, as the
        events it summarizes (forward only, by seq). Returns how many entries were news. A
        repair never counts a failure against a site: those follow live events only."""
        self.health.report_seen(report.domain, self.clock.now())  # the provisioner is alive (our pipeline check)
        self.catalogues.apply_offered(report.offered)
        repaired = 0
        domain = report.domain
        entries = report.instances
        known = self.store.known([e.instance_id for e in entries]) if entries else {}
        stale: list[Instance] = []
        for evt in entries:
            if evt.domain != domain:  # not this report's to tell
                continue
            inst = known.get(evt.instance_id)
            if inst is None:
                repaired += 1  # news: adopted
                self.on_instance_event(evt, repair=True)
            elif inst.domain != domain:
                continue  # another domain's instance: not this report's to tell
            elif inst.state not in TERMINAL_INSTANCE_STATES:
                if evt.seq > inst.seq or INSTANCE_STATE_ORDER[evt.state] > INSTANCE_STATE_ORDER[inst.state]:
                    repaired += 1
                    self.on_instance_event(evt, repair=True)
            elif evt.state not in TERMINAL_INSTANCE_STATES:
                # live there, ended here: reopened after our failure, or a record older than our end
                if _reopens(inst, evt):
                    repaired += 1
                    self.on_instance_event(evt, repair=True)
                else:
                    stale.append(inst)
        if stale:
            self._end_stale(domain, stale)
        if repaired:
            log.info("instance table repaired from a provisioner report",
                     extra={"domain": report.domain, "entries": repaired})
        return repaired

    def _end_stale(self, domain: str, ended: list[Instance]) -> None:
        """A provisioner holds live records of instances that ended here (its store was restored
        from a backup older than their end): tell it they are over, or its store never matches
        the cloud. A bookkeeping terminate (``ended``, proof ``bookkeeping``): it closes the record
        of a node that is gone or never started, and never destroys a started VM — behind a record
        the engine takes for stale may be a node that came back and runs jobs. Asked at most once
        per ``10 × resend_seconds`` per instance on average (the reports come every minute),
        spread between half and one and a half of it: the provisioners share one work queue, and
        a re-ask at a fixed period can meet the round robin in step and reach, every time, the one
        provisioner that does not hold the record. For the same reason the n-th ask goes as n
        copies (at most ``STALE_COPIES``): round robin hands them to as many provisioners, and
        only the one whose store holds the record acts (the others' records are closed)."""
        now = self.clock.now()
        if not self.acting(domain, now):  # else the acting engine does it
            return
        if len(self._stale_due) > 1000:  # forget the closed ones now and then (a stale one comes back)
            self._stale_due = {k: t for k, t in self._stale_due.items() if t > now - 3600}
            self._stale_asks = {k: n for k, n in self._stale_asks.items() if k in self._stale_due}
        due = [i for i in ended if now >= self._stale_due.get(i.instance_id, now)]
        ends = []
        for i in due:
            self._stale_due[i.instance_id] = now + _spread(10 * self.settings.resend_seconds, i.instance_id, now)
            asks = self._stale_asks[i.instance_id] = self._stale_asks.get(i.instance_id, 0) + 1
            ends += [(i, RetireReason.ENDED, Proof.BOOKKEEPING)] * min(asks, STALE_COPIES)
        self._terminate_again(domain, ends, "ended (the provisioner's record of it is older than its end)")

    def _terminate_again(self, domain: str, ends: list[tuple[Instance, RetireReason, Proof]], reason: str) -> None:
        """Ask again (a new request id) on the safety net's authority, through the gate."""
        if not ends:
            return
        for inst, retire, proof in ends:
            log.info("terminate re-sent", extra={"domain": domain, "instance": inst.instance_id, "reason": reason,
                                                 "retire": retire.value, "proof": proof.value})
        self.gate.send(domain, [terminate_request(i, r, p, reason) for i, r, p in ends], Authority.SAFETY_NET)

    def unfinished_terminates(self, domains: list[str], now: float) -> None:
        """A terminate is answered by ``terminating``; if ``terminated`` never follows, the
        provisioner that answered lost it (it died before the destroy and came back on another
        store): ask again, every ``10 × resend_seconds``. The engine decided this end already (the
        node was drained first), so asking again is safe; a closed record ignores it."""
        after = 10 * self.settings.resend_seconds
        for domain in domains:
            ending = self._terminating(domain)
            due = [i for i in ending if now - i.state_at >= after
                   and now - self._asked_again.get(i.instance_id, i.state_at) >= after]
            for i in due:
                self._asked_again[i.instance_id] = now
            # the end was decided with its proof; the record shows it still (removed, never known
            # to the batch system), else only the careful one is sent
            self._terminate_again(domain, [(i, retire_of(i), proof_of(i) or Proof.BOOKKEEPING) for i in due],
                                  "terminate re-sent: terminating for too long")
        if len(self._asked_again) > 1000:  # forget the ended ones now and then
            ending_ids = {i.instance_id for d in domains for i in self.store.instances(d) if i.state == "terminating"}
            self._asked_again = {k: v for k, v in self._asked_again.items() if k in ending_ids}

    def _terminating(self, domain: str) -> list[Instance]:
        """The domain's instances in ``terminating``, listed again only when its instances changed."""
        stamp = self.store.domain_stamp(domain)
        cached = self._ending.get(domain)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        ending = self.store.terminating(domain)
        self._ending[domain] = (stamp, ending)
        return ending

    def deadlines(self, domain: str) -> list[float]:
        """When each of ``domain``'s ``terminating`` instances is next asked again
        (``unfinished_terminates``), given no news."""
        again = 10 * self.settings.resend_seconds
        return [max(i.state_at, self._asked_again.get(i.instance_id, i.state_at)) + again
                for i in self._terminating(domain)]

    def forget(self) -> None:
        """The cached ``terminating`` lists (the store's working set may be another engine's now)."""
        self._ending.clear()

    def take_failures(self, sites: set[str]) -> dict[str, str]:
        """Launch failures since the last iteration, for ``sites`` (each counted once)."""
        out = {s: why for s, why in self._failures.items() if s in sites}
        for s in out:
            del self._failures[s]
        return out

    def on_instance_event(self, evt: InstanceEvent, repair: bool = False) -> None:
        if evt.domain not in self.config.domains:
            return
        now = self.clock.now()
        inst = self.store.instance(evt.instance_id)
        if inst is None:
            if evt.state in TERMINAL_INSTANCE_STATES:
                return
            inst = Instance(evt.instance_id, evt.domain, evt.site, evt.node_name or node_name_for(
                evt.domain, evt.instance_id), evt.cores or 1, "requested", evt.at, evt.at,
                reason="adopted: announced by a provisioner", instance_type=evt.instance_type)
        if evt.interruption_at is not None and not repair:
            self._interrupted(inst, evt)
            return
        if inst.state in TERMINAL_INSTANCE_STATES and evt.state not in TERMINAL_INSTANCE_STATES:
            # a live word about an instance ended here: the provisioner reopened it after our
            # failure, else it is older than our end (its record is closed by ``_end_stale``).
            # Never raise the ended row's seq on it: the reopen event that follows must still
            # read as news (a report that overtook it carries no ``previous``)
            if _reopens(inst, evt):
                self._reopened(inst, evt, now)
            return
        if inst.reopened_seq is not None and evt.seq < inst.reopened_seq:
            return  # older than its reopening (a delayed event, an older report): the failure it undid
        forward = INSTANCE_STATE_ORDER[evt.state] > INSTANCE_STATE_ORDER[inst.state] or (
            evt.state == "failed" and inst.state not in TERMINAL_INSTANCE_STATES)
        if evt.seq <= inst.seq and not forward:
            # stale or duplicate (rule 4). A state further on is news whatever its seq: seqs count
            # one store's record, and a provisioner on a replaced or restored store counts anew
            return
        # one copy (an Instance has twenty-odd fields: each replace costs microseconds per event)
        new = evolve(inst, seq=max(evt.seq, inst.seq), ip=evt.ip or inst.ip, state=evt.state, state_at=now,
                      reason=evt.reason or inst.reason) if forward else \
            evolve(inst, seq=max(evt.seq, inst.seq), ip=evt.ip or inst.ip)
        answered: tuple[str, ...] = ("launch",)
        if evt.state in ("terminating", "terminated", "failed"):
            answered += ("terminate",)
        if evt.state in TERMINAL_INSTANCE_STATES:
            answered += ("add", "offline", "online")
        if forward and evt.state == "started" and inst.terminate_unless_started:  # refused: it may have a job
            new, answered = evolve(new, terminate_sent=False), (*answered, "terminate")
        self.store.record_instance_event(new, answered, f"instance {evt.state}")
        if evt.state == "started" and not repair:
            self.catalogues.spot_started(inst)
        if (evt.state == "failed" and evt.error_kind == "capacity" and inst.instance_type and not repair
                and not inst.terminate_sent and inst.joined_at is None):
            self.catalogues.capacity_error(inst, now, evt.reason)
        elif evt.state == "failed" and not inst.terminate_sent and inst.joined_at is None and not repair:
            # counted against the site at the next iteration (once per site per iteration);
            # the replacement is the iteration's too: the policy sees the supply gone
            self._failures.setdefault(inst.site, f"launch failed: {evt.error_kind or 'error'}: {evt.reason}"[:300])
            log.warning("launch failed", extra={"site": inst.site, "instance": inst.instance_id,
                                                "kind": evt.error_kind, "reason": evt.reason})

    def _reopened(self, inst: Instance, evt: InstanceEvent, now: float) -> None:
        """The provisioner reopened a launch it had closed ``failed``: the cloud lists its node
        alive (the create took effect, its answer was lost, the retries ran out). The node may
        have joined the batch system by itself and run jobs, so the instance is live again —
        joined when a snapshot shows it, kept or retired the safe way (drain, remove, terminate)
        like any other. Its stall clock starts now; an end decided earlier is decided again."""
        new = evolve(inst, seq=evt.seq, ip=evt.ip or inst.ip, state=evt.state, state_at=now, launched_at=now,
                     reason=evt.reason or inst.reason, terminate_sent=False, reopened_seq=evt.seq)
        self.store.save_instances([new])
        log.warning("a failed launch's node is alive: taken back", extra={
            "domain": inst.domain, "instance": inst.instance_id, "state": evt.state, "reason": evt.reason})

    def _interrupted(self, inst: Instance, evt: InstanceEvent) -> None:
        """The cloud will reclaim a live instance soon (a spot interruption notice): it leaves at
        once, ``retire = "interrupted"`` — its node removed with its jobs requeued (the life
        cycle's next step), then terminated — and stops counting as capacity, so the demand it
        served is placed again now, not after the preemption. Idempotent; a notice for an
        instance already ended or being terminated changes nothing."""
        if (inst.state in TERMINAL_INSTANCE_STATES or inst.terminate_sent or inst.removed
                or inst.retire == RetireReason.INTERRUPTED or inst.seq < 0):
            return
        self.store.save_instances([replace(inst, retire=RetireReason.INTERRUPTED, idle_since=None,
                                           reason=evt.reason or INTERRUPTION_REASON)])
        log.warning("interruption notice: draining the node before the cloud takes it",
                    extra={"domain": inst.domain, "instance": inst.instance_id, "node": inst.node_name,
                           "at": evt.interruption_at})


def _reopens(inst: Instance, evt: InstanceEvent) -> bool:
    """Does ``evt``, a live state of an instance ended here, reopen it? Only a ``failed`` row, and
    only by a word later than the failure (``seq``): a provisioner's record moves on from
    ``failed`` only when it reopens the launch (its node is alive). Whether the word is the
    reopen event itself (``previous == "failed"``) or a report entry that overtook it (a report
    carries no ``previous``) does not matter; ``terminated`` is never reopened."""
    return inst.state == "failed" and evt.seq > inst.seq


def _spread(period: float, key: str, now: float) -> float:
    """``period`` times a factor in [0.5, 1.5) drawn from ``key`` and ``now`` (deterministic: the
    same inputs, the same delay — in the simulator too — yet no two re-asks in step)."""
    digest = hashlib.blake2b(f"{key}:{now!r}".encode(), digest_size=4).digest()
    return period * (0.5 + int.from_bytes(digest, "big") / 2**32)
