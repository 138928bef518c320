"""The decision engine's imperative shell: feeds messages into the store, runs iterations.

Per domain and iteration: refresh the instance table from the latest snapshot, build the
view, call the domain's policy, plan (guard rails + placement), store the plan *then* send
it, publish a decision record. Everything that decides is in the pure modules
(``policies/``, ``planner``, ``placement``, ``view``, ``demand``); this class only moves data
between them, the store and the broker.

Failover: snapshots reach only the active consumer of the single-active-consumer input
queue, and the engine acts on a domain only while it holds a snapshot younger than
``active_window_seconds``. A standby therefore never acts; when the active engine dies the
broker hands the queue to the standby, whose first snapshot activates it, and the shared
store tells it every launch already made — so no launch is repeated (re-sends keep their id).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from common.clock import Clock, RealClock
from common.config import EpuConfig
from common.messages import (
    INSTANCE_STATE_ORDER,
    TERMINAL_INSTANCE_STATES,
    ActionRecord,
    DecisionRecord,
    Envelope,
    InstanceEvent,
    Message,
    NodeCommandResult,
    NodeInfo,
    PolicyChange,
    PolicyOutcome,
    SensorSnapshot,
    ViewSummary,
)
from services.decision.actions import Decision
from services.decision.changes import ChangeRejected, apply_change
from services.decision.lifecycle import add_started
from services.decision.placement import SiteHealth, SiteInfo, place, record_failure, record_success
from services.decision.planner import PlacementInput, Plan, launch_action, node_name_for, plan
from services.decision.policies import PolicyError, get_policy, validate_params
from services.decision.store import Store
from services.decision.view import DomainView, Instance, JobDigest, build_view, refresh_parts

log = logging.getLogger("epu.decision")


@dataclass
class _Latest:
    """The newest snapshot of a domain, digested once on arrival (not at every iteration)."""

    snapshot: SensorSnapshot
    digest: JobDigest
    nodes: dict[str, NodeInfo]
    received_at: float


class Engine:
    def __init__(self, config: EpuConfig, store: Store, publish: Callable[[Message], Any],
                 clock: Clock | None = None, publish_many: Callable[[list[Message]], Any] | None = None) -> None:
        self.config = config
        self.settings = config.decision
        self.store = store
        self.publish = publish
        self.publish_many = publish_many
        """Sends a burst of actions with one confirm wait (the service's); without it, one by one."""
        self.clock = clock or RealClock()
        self.domains = list(config.domains)
        self.site_infos = {n: SiteInfo(n, s.quota, s.price_per_hour, s.cores) for n, s in config.sites.items()}
        self._latest: dict[str, _Latest] = {}
        self.iterations = 0
        for name, cfg in config.domains.items():
            try:
                validate_params(cfg.policy, cfg.params)
            except PolicyError as exc:
                raise ValueError(f"domains.{name}: {exc}") from None
            store.seed_config(name, cfg, self.clock.now())

    # ------------------------------------------------------------------ input
    def handle_input(self, msg: Message, _envelope: Envelope | None = None) -> None:
        if isinstance(msg, SensorSnapshot):
            self.on_snapshot(msg)
        elif isinstance(msg, InstanceEvent):
            self.on_instance_event(msg)
        elif isinstance(msg, NodeCommandResult):
            self.on_node_result(msg)

    def on_snapshot(self, snap: SensorSnapshot) -> None:
        if snap.domain not in self.config.domains:
            return
        prev = self._latest.get(snap.domain)
        if prev is not None and prev.snapshot.taken_at > snap.taken_at:
            return  # an older snapshot arriving late says nothing new
        digest = JobDigest.of(snap.jobs) if snap.available else JobDigest({}, 0, 0, 0.0)
        nodes = {n.name: n for n in snap.nodes} if snap.available else {}
        self._latest[snap.domain] = _Latest(snap, digest, nodes, self.clock.now())

    def is_active(self, domain: str) -> bool:
        latest = self._latest.get(domain)
        return latest is not None and self.clock.now() - latest.received_at <= self.settings.active_window_seconds

    def on_instance_event(self, evt: InstanceEvent) -> None:
        if evt.domain not in self.config.domains:
            return
        now = self.clock.now()
        inst = self.store.instance(evt.instance_id)
        if inst is None:
            if evt.state in TERMINAL_INSTANCE_STATES:
                return
            inst = Instance(evt.instance_id, evt.domain, evt.site, evt.node_name or node_name_for(
                evt.domain, evt.instance_id), evt.cores or 1, "requested", evt.at, evt.at,
                reason="adopted: announced by a provisioner")
        if evt.seq <= inst.seq:
            return  # stale or duplicate (rule 4)
        new = replace(inst, seq=evt.seq, ip=evt.ip or inst.ip)
        if INSTANCE_STATE_ORDER[evt.state] > INSTANCE_STATE_ORDER[inst.state] or (
                evt.state == "failed" and inst.state not in TERMINAL_INSTANCE_STATES):
            new = replace(new, state=evt.state, state_at=now, reason=evt.reason or inst.reason)
        self.store.save_instances([new])
        self.store.complete(target=inst.instance_id, kinds=("launch",), outcome=f"instance {evt.state}")
        if evt.state in ("terminating", "terminated", "failed"):
            self.store.complete(target=inst.instance_id, kinds=("terminate",), outcome=f"instance {evt.state}")
        if evt.state in TERMINAL_INSTANCE_STATES:
            self.store.complete(target=inst.instance_id, kinds=("add", "offline", "online", "remove"),
                                outcome=f"instance {evt.state}")
        if evt.state == "failed" and not inst.terminate_sent:
            self._site_failed(inst, evt, now)

    def _site_failed(self, inst: Instance, evt: InstanceEvent, now: float) -> None:
        health = self.store.site_health()
        h = record_failure(health.get(inst.site, SiteHealth(inst.site)), now,
                           f"{evt.error_kind or 'error'}: {evt.reason}"[:300],
                           initial=self.settings.backoff_initial_seconds, maximum=self.settings.backoff_max_seconds)
        self.store.save_sites([h])
        log.warning("launch failed", extra={"site": inst.site, "instance": inst.instance_id,
                                            "kind": evt.error_kind, "reason": evt.reason})
        if evt.error_kind == "capacity" and inst.joined_at is None:
            self._failover(inst, now, {**health, inst.site: h})

    def _failover(self, inst: Instance, now: float, health: dict[str, SiteHealth]) -> None:
        """A capacity error: re-place the launch on the next eligible site at once."""
        current = self.store.current_config(inst.domain)
        if current is None or current[1].paused:
            return
        cfg = current[1]
        live, unproven = self.store.live_per_site()
        order = cfg.sites or list(self.site_infos)
        placed = place(1, order, cfg.placement, self.site_infos, health, live, unproven, now,
                       exclude=frozenset({inst.site}))
        if not placed.sites:
            log.warning("capacity failover: no other site", extra={"why": placed.why})
            return
        out = Plan()
        pin = self._placement_input(cfg, health, live, unproven)
        out.actions.append(launch_action(inst.domain, placed.sites[0], inst.cores,
                                         f"capacity failover from {inst.site}", now, pin, out,
                                         name=inst.node_name if pin.node_names else None))
        self.store.store_actions(inst.domain, out, now)
        self._send(inst.domain, out, now, iteration=None, notes=[f"capacity error at {inst.site}: failover"])

    def on_node_result(self, res: NodeCommandResult) -> None:
        row = self.store.action(res.command_id)
        if row is None or row["done"]:
            return
        outcome = "ok" if res.ok else f"error: {res.error or res.output}"[:1000]
        self.store.complete(action_id=res.command_id, outcome=outcome)
        inst = self.store.instance(row["target"])
        if inst is None:
            return
        if res.action == "remove" and res.ok:
            self.store.save_instances([replace(inst, removed=True)])
        elif res.action == "add" and not res.ok:
            self.store.save_instances([replace(inst, add_sent_at=None)])  # retried next iteration
        elif res.action == "offline" and not res.ok and inst.state == "draining":
            self.store.save_instances([replace(inst, state="joined", drain_at=None)])

    # ------------------------------------------------------------------ control
    def handle_control(self, msg: Message, _envelope: Envelope | None = None) -> None:
        if isinstance(msg, PolicyChange):
            self.on_policy_change(msg)

    def on_policy_change(self, change: PolicyChange) -> PolicyOutcome:
        now = self.clock.now()
        prior = self.store.change_outcome(change.change_id)
        if prior is not None:  # a re-delivered change: answer again, apply once
            current = self.store.current_config(change.domain)
            out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=prior["applied"],
                                version=prior["version"], reason=prior["reason"],
                                config=current[1].model_dump(mode="json") if current else {})
            self.publish(out)
            return out
        current = self.store.current_config(change.domain)
        if change.domain not in self.config.domains or current is None:
            reason = f"unknown domain {change.domain!r} (managed: {', '.join(self.domains) or 'none'})"
            self.store.record_change(change.change_id, change.domain, False, reason, now)
            out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=False, reason=reason)
        else:
            try:
                new = apply_change(current[1], change, list(self.site_infos))
            except ChangeRejected as exc:
                self.store.record_change(change.change_id, change.domain, False, str(exc), now)
                out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=False,
                                    version=current[0], reason=str(exc),
                                    config=current[1].model_dump(mode="json"))
            else:
                version = self.store.record_change(change.change_id, change.domain, True, "", now, new)
                if change.sites is not None:  # the operator lets listed sites back in
                    health = self.store.site_health()
                    self.store.save_sites([record_success(health[s]) for s in change.sites if s in health])
                out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=True,
                                    version=version, reason=f"applied by {change.operator or 'operator'}",
                                    config=new.model_dump(mode="json"))
        log.info("policy change", extra={"domain": change.domain, "applied": out.applied, "reason": out.reason})
        self.publish(out)
        return out

    # ------------------------------------------------------------------ iterations
    def iterate(self) -> list[DecisionRecord]:
        """One iteration over every domain this engine is active for, then due re-sends."""
        now = self.clock.now()
        self.iterations += 1
        records = []
        active = [d for d in self.domains if self.is_active(d)]
        sites = self._site_context() if active else None  # read once, kept current below
        for domain in active:
            try:
                record = self.iterate_domain(domain, now, sites)
            except Exception:
                log.exception("iteration failed", extra={"domain": domain})
                continue
            if record is not None:
                records.append(record)
        self.resend(active, now)
        return records

    def _placement_input(self, cfg: Any, health: dict[str, SiteHealth], live: dict[str, int],
                         unproven: dict[str, int]) -> PlacementInput:
        return PlacementInput(cfg.sites or list(self.site_infos), cfg.placement, self.site_infos, health,
                              live, unproven, self.settings.backoff_initial_seconds,
                              self.settings.backoff_max_seconds, tuple(cfg.node_names))

    def _site_context(self) -> tuple[dict[str, SiteHealth], dict[str, int], dict[str, int]]:
        """Site health and live/unproven counts over all domains (quota is per site)."""
        live, unproven = self.store.live_per_site()
        return self.store.site_health(), live, unproven

    def iterate_domain(self, domain: str, now: float,
                       sites: tuple[dict[str, SiteHealth], dict[str, int], dict[str, int]] | None = None,
                       ) -> DecisionRecord | None:
        latest = self._latest[domain]
        current = self.store.current_config(domain)
        assert current is not None
        version, cfg = current
        before = self.store.instances(domain)
        memory, iteration = self.store.memory(domain)
        snap = latest.snapshot
        after, parts = refresh_parts(before, latest.nodes, now, snap.available)
        changed = [a for a, b in zip(after, before, strict=True) if a != b]
        view = build_view(domain, snap, latest.digest, after, now, min_nodes=cfg.min_nodes,
                          max_nodes=cfg.max_nodes, cores_per_node=cfg.cores_per_node, memory=memory,
                          nodes=latest.nodes, all_live=True, parts=parts)
        decision = self.decide(view, cfg)
        health, live, unproven = sites if sites is not None else self._site_context()
        joined = [a for a, b in zip(after, before, strict=True) if a.state == "joined" and b.state != "joined"]
        successes = {i.site: record_success(health[i.site]) for i in joined
                     if i.site in health and health[i.site].failures}
        health.update(successes)
        for i in joined:
            unproven[i.site] = max(0, unproven.get(i.site, 0) - 1)
        out = plan(view, decision, self._placement_input(cfg, health, live, unproven),
                   self.store.in_flight(domain))
        out.sites = {**successes, **out.sites}
        if out.actions or changed or out.sites or (decision.memory is not None and decision.memory != memory):
            iteration += 1
            self.store.commit_plan(domain, out, now, decision.memory, iteration, changed)
        health.update(out.sites)
        for p in out.actions:
            if p.kind == "launch":
                live[p.site] = live.get(p.site, 0) + 1
                unproven[p.site] = unproven.get(p.site, 0) + 1
        return self._send(domain, out, now, iteration, out.notes, view, cfg.policy, version)

    def decide(self, view: DomainView, cfg: Any) -> Decision:
        if cfg.paused:
            return Decision(notes=["domain paused by an operator"])
        if not view.available:
            return Decision(add_started(view), None, ["sensor unavailable: no policy run, no scale-down"])
        policy = get_policy(cfg.policy)
        return policy.decide(view, validate_params(cfg.policy, cfg.params), view.now)

    def _send(self, domain: str, out: Plan, now: float, iteration: int | None, notes: list[str],
              view: DomainView | None = None, policy: str = "", version: int = 0) -> DecisionRecord | None:
        sent = []
        try:
            if self.publish_many is not None and len(out.actions) > 1:
                self.publish_many([p.message for p in out.actions])
                sent = [p.action_id for p in out.actions]
            else:
                for p in out.actions:
                    self.publish(p.message)
                    sent.append(p.action_id)
        finally:
            self.store.mark_sent(sent, now)
        if not out.actions:
            return None
        if iteration is None:
            iteration = self.store.memory(domain)[1]
        if not policy:
            current = self.store.current_config(domain)
            policy, version = (current[1].policy, current[0]) if current else ("", 0)
        record = DecisionRecord(
            domain=domain, iteration=iteration, policy=policy, policy_version=version,
            saw=summarize(view) if view is not None else ViewSummary(),
            actions=[ActionRecord(kind=p.kind, target=p.instance_id, site=p.site, reason=p.reason,
                                  action_id=p.action_id) for p in out.actions],
            at=now, notes=notes[:50])
        self.publish(record)
        return record

    def resend(self, domains: list[str], now: float) -> int:
        """Re-send every open action not sent yet or sent ``resend_seconds`` ago (same ids)."""
        if not domains:
            return 0
        msgs = self.store.unsent_or_due(domains, now, self.settings.resend_seconds)
        if self.publish_many is not None and len(msgs) > 1:
            self.publish_many(msgs)
        else:
            for m in msgs:
                self.publish(m)
        ids = [getattr(m, "launch_id", None) or getattr(m, "command_id", None) or m.request_id for m in msgs]
        self.store.mark_sent(ids, now)
        return len(msgs)


def summarize(view: DomainView) -> ViewSummary:
    return ViewSummary(
        queued_jobs=view.demand.jobs, queued_cores=view.demand.cores,
        nodes_by_state=dict(Counter(n.state for n in view.nodes.values())),
        instances_by_state=dict(Counter(i.state for i in view.instances)),
        instances_by_site=dict(Counter(i.site for i in view.instances)),
        sensor_available=view.available)
