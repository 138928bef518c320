"""What a domain's iteration publishes about itself: its ``DecisionRecord``. Pure.

Why its own module: the record is the operator's account of an iteration — what the engine saw
(queue, nodes by state, instances by state, site and type, the sensor's availability, the jobs
no type can serve), each action with its reason, the policy's notes — and it is built from
what the iteration already holds; the engine only decides when to publish one (something was
sent, or a note is an event)."""

from __future__ import annotations

import operator
from collections import Counter

from epu.common.messages import ActionRecord, DecisionRecord, UnsatisfiableShape, ViewSummary
from epu.services.decision.planner import Plan
from epu.services.decision.view import DomainView

_STATE = operator.attrgetter("state")
_SITE = operator.attrgetter("site")
_TYPE = operator.attrgetter("instance_type")


def summarize(view: DomainView, unsatisfiable: list[UnsatisfiableShape] | None = None) -> ViewSummary:
    """What the iteration saw, for its decision record (counted with ``map`` over attribute
    getters: in C, once per iteration that acts, over every node and instance)."""
    return ViewSummary(
        queued_jobs=view.demand.jobs, queued_cores=view.demand.cores,
        nodes_by_state=dict(Counter(map(_STATE, view.nodes.values()))),
        instances_by_state=dict(Counter(map(_STATE, view.instances))),
        instances_by_site=dict(Counter(map(_SITE, view.instances))),
        sensor_available=view.available,
        instances_by_type=dict(Counter(map(_TYPE, view.instances))) if view.catalogue is not None
        else {},
        unsatisfiable=list(unsatisfiable or []))


def decision_record(domain: str, out: Plan, now: float, iteration: int, notes: list[str], saw: ViewSummary | None,
                    policy: str, version: int) -> DecisionRecord:
    """The record of a plan: its actions (or, in observe mode, the shadow actions it would have
    sent) and at most 50 notes."""
    return DecisionRecord(
        domain=domain, iteration=iteration, policy=policy, policy_version=version,
        saw=saw if saw is not None else ViewSummary(),
        actions=[ActionRecord(kind=p.kind, target=p.instance_id, site=p.site, reason=p.reason,
                              action_id=p.action_id, instance_type=p.instance_type, gang=p.gang)
                 for p in out.actions or out.shadow],
        at=now, notes=notes[:50], shadow=bool(out.shadow) and not out.actions)
