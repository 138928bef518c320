"""The control queue's message: an operator's ``PolicyChange``, applied once and answered.

Why its own module: a change is an operator's order, and its handling has rules of its own that
the iterations do not share — a change re-delivered (the same ``change_id``) is answered again but
applied once; it is checked whole (``changes.apply_change``, the config's ceilings, a spend cap
against the catalogue it judges) and stored with
who asked and what, or refused with the reason; an operator's terminate retires instances the safe
way (drained first); listed sites are let back in; the circuit breaker can be released. Every
outcome is published (``PolicyOutcome``) for the operator's CLI."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from epu.common.clock import Clock
from epu.common.config import DomainConfig, EpuConfig
from epu.common.config.catalogue import InstanceType, site_types
from epu.common.messages import TERMINAL_INSTANCE_STATES, Message, PolicyChange, PolicyOutcome
from epu.common.retire import RetireReason
from epu.services.decision.budget import domain_cap_problems
from epu.services.decision.changes import ChangeRejected, apply_change, check_ceiling
from epu.services.decision.health import PipelineHealth
from epu.services.decision.placement import SiteInfo, record_success
from epu.services.decision.ports import DecisionStore
from epu.services.decision.view import Instance

log = logging.getLogger("epu.decision")


class PolicyChanges:
    """Applies operators' changes to the configured domains in ``store``."""

    def __init__(self, config: EpuConfig, store: DecisionStore, clock: Clock, publish: Callable[[Message], Any],
                 site_infos: Mapping[str, SiteInfo], health: PipelineHealth,
                 types: Callable[[], Mapping[str, list[InstanceType]]] | None = None) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.publish = publish
        self.site_infos = site_infos
        self.health = health
        self.types = types or (lambda: {n: site_types(n, s) for n, s in config.sites.items()})
        """Each site's instance types now (the engine's catalogue, discovered types included): what
        a new spend cap is checked against."""

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
        who = {"operator": change.operator, "request": change.model_dump_json(
            exclude={"change_id", "domain", "operator"}, exclude_defaults=True)}
        if change.domain not in self.config.domains or current is None:
            reason = f"unknown domain {change.domain!r} (managed: {', '.join(self.config.domains) or 'none'})"
            self.store.record_change(change.change_id, change.domain, False, reason, now, **who)
            out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=False, reason=reason)
        else:
            try:
                new = apply_change(current[1], change, list(self.site_infos))
                retiring = self._retirements(change, new.mode)
                check_ceiling(new, self.config.domains.get(change.domain),
                              {n: s.quota for n, s in self.config.sites.items()})
                self._check_cap(change, new)
            except ChangeRejected as exc:
                self.store.record_change(change.change_id, change.domain, False, str(exc), now, **who)
                out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=False,
                                    version=current[0], reason=str(exc),
                                    config=current[1].model_dump(mode="json"))
            else:
                changed = new != current[1]
                version = self.store.record_change(change.change_id, change.domain, True, "", now,
                                                   new if changed else None, retire=retiring, **who) or current[0]
                if change.sites is not None:  # the operator lets listed sites back in
                    health = self.store.site_health()
                    self.store.save_sites([record_success(health[s]) for s in change.sites if s in health])
                if change.release_breaker:
                    self.health.release(change.domain)
                what = [f"applied by {change.operator or 'operator'}"]
                if retiring:
                    what.append(f"{len(retiring)} instance(s) to drain and terminate")
                if change.forced_terminate:
                    what.append(self._forced(change))
                if change.release_breaker:
                    what.append("circuit breaker released")
                out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=True,
                                    version=version, reason="; ".join(what), config=new.model_dump(mode="json"))
        log.info("policy change", extra={"domain": change.domain, "applied": out.applied, "reason": out.reason})
        self.publish(out)
        return out

    def _check_cap(self, change: PolicyChange, new: DomainConfig) -> None:
        """A change that sets the spend cap or the sites under it: the cap must be able to count
        every type it judges and fit one instance (``budget.domain_cap_problems``, the rule
        ``epu config check`` applies to the file). Other changes leave the cap as it was."""
        if change.budget_per_hour is None and change.sites is None:
            return
        problems = domain_cap_problems(new, self.types())
        if problems:
            raise ChangeRejected("budget_per_hour: " + "; ".join(problems))

    def _forced(self, change: PolicyChange) -> str:
        """An operator's forced terminate, for the record only: the provisioners did it (the
        escape hatch needs no engine); the history says which instances, and which of them this
        engine did not know (an instance only the provisioner's store held)."""
        ids = list(change.forced_terminate or [])
        unknown = [i for i in ids if (inst := self.store.instance(i)) is None or inst.domain != change.domain]
        note = f"forced terminate of {', '.join(ids)} recorded (done by the provisioners, not the engine)"
        return note + (f"; not in the engine's table: {', '.join(unknown)}" if unknown else "")

    def _retirements(self, change: PolicyChange, mode: str) -> list[Instance]:
        """An operator's unforced terminate: the instances, marked to go the safe way out, on the
        operator's authority (``retire = operator``, their name in the instance's reason). Refused
        in observe mode, where nothing leaves the engine: accepted, it would do nothing."""
        if change.retire and mode == "observe":
            raise ChangeRejected(f"domain {change.domain} is in observe mode: nothing leaves the engine, so no "
                                 "instance would be retired; set mode=act first (a forced terminate goes to "
                                 "the provisioners directly)")
        who = change.operator or "an operator"
        out = []
        for iid in change.retire or []:
            inst = self.store.instance(iid)
            if inst is None or inst.domain != change.domain:
                raise ChangeRejected(f"retire: no instance {iid} in domain {change.domain}")
            if inst.state in TERMINAL_INSTANCE_STATES or inst.terminate_sent:
                continue  # already on its way out
            out.append(replace(inst, retire=inst.retire or RetireReason.OPERATOR, idle_since=None,
                               reason=f"retired by {who}" if not inst.retire else inst.reason))
        return out
