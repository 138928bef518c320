"""The fault simulator's engine process, skipping the iterations that cannot decide anything.

``epu simulate`` skips idle engine iterations (``epu.sim.fastpath``): an iteration after one
that changed nothing can only differ after a new input or a time threshold of the policy, and
the skipped ones still tick (their events are in the digest) without running. In the fault
simulator an idle iteration can do more, so ``SimLazyEngineProc`` runs every iteration while any
of these holds, and wakes at each of these thresholds besides ``fastpath.next_wake``'s:

* the decision store refuses writes or a crash is armed before the next one
  (``StoreFaults``): every iteration renews the domain's lease, a write that fails or crashes;
* the pipeline looks unhealthy to the engine (stale or unavailable snapshot, failed publish,
  provisioner not answering or silent, breaker open): each iteration moves ``healthy_since``;
  and it wakes when one of those checks may turn (``pipeline_gap_seconds`` after the last
  snapshot, the last report, each open action's creation);
* a terminate stays unanswered: ``_unfinished_terminates`` asks again ``10 × resend_seconds``
  after the instance entered ``terminating`` (or was last asked);
* a policy's durations counted from ``healthy_since`` (an instance is stalled after
  ``stall_seconds`` of healthy pipeline), which lives in the engine, not in the store.

A skipped iteration would still have recorded that the engine iterated (the pipeline check's
``last_iteration``), so the skip does that too. Only one engine: with two, a lease left
unrenewed lets the other one take over, so a scenario with several engines runs them all
(``Simulation(skip_idle=...)`` picks this class only then). Inputs must reach the engine through
the process (the bus) for a skip to notice them: a test that calls ``proc.engine`` directly should
run with ``skip_idle=False``. Exactness is tested the way ``epu simulate`` tests its own: the same run,
event for event, with and without skipping (tests/sim/test_replay.py).
"""

from __future__ import annotations

import math
from typing import Any

from epu.services.decision.policies import validate_params
from epu.sim.fastpath import EPSILON, LazyEngineProc, durations, next_wake


class SimLazyEngineProc(LazyEngineProc):
    """``LazyEngineProc`` with the fault simulator's extra reasons to run (module docstring)."""

    def _must_run(self) -> bool:
        f = self.store_faults
        if f.crash_next_write or self.world.t < f.failing_until:
            return True
        engine = self.engine
        assert engine is not None
        for d in engine.domains:
            h = engine._health.get(d)
            if h is None:
                continue
            if h.publish_failed or (h.breaker and not h.released) or h.healthy_since >= h.last_iteration:
                return True  # unhealthy at the last iteration: each one moves healthy_since
        return False

    def _iterate(self) -> None:
        assert self.engine is not None
        forced = self._must_run()
        now = self.clock.now()
        if not forced and not self._dirty and now < self._wake - EPSILON:
            self._skipped_iteration(now)
            return
        self._dirty = True
        super()._iterate()
        if forced:
            # an iteration that could not take the lease (the store refused the write) did not
            # act on its inputs: the first one after the condition ends must run too
            self._dirty = True
        elif not self._dirty:  # it acted: the next one runs anyway
            self._wake = min(self._wake, self._pipeline_wake(now))

    def _skipped_iteration(self, now: float) -> None:
        """What a skipped iteration leaves behind: it ran (``_pipeline``'s ``last_iteration``)."""
        engine = self.engine
        assert engine is not None
        self.skip_stats.skipped += 1
        for d in engine.domains:
            h = engine._health.get(d)
            if h is not None and engine.is_active(d):
                h.last_iteration = now

    def _pipeline_wake(self, now: float) -> float:
        """The earliest time one of the pipeline checks or an unanswered terminate may turn."""
        engine = self.engine
        assert engine is not None
        gap = engine.settings.pipeline_gap_seconds
        after = 10 * engine.settings.resend_seconds
        store: Any = engine.store
        best = math.inf
        for d in engine.domains:
            h = engine._health.get(d)
            current = store.current_config(d)
            if h is not None and current is not None:  # stall limits count healthy pipeline time
                for span in durations(validate_params(current[1].policy, current[1].params)):
                    if h.healthy_since + span > now:
                        best = min(best, h.healthy_since + span)
            latest = engine._latest.get(d)
            if latest is not None:
                best = min(best, latest.received_at + gap)
            if d in engine._reports:
                best = min(best, engine._reports[d] + gap)
            for o in store.db.open.values():
                if o["domain"] == d and o["kind"] in ("launch", "terminate") and o["attempts"] > 0:
                    best = min(best, o["created_at"] + gap)
            for i in store.instances(d):
                if i.state == "terminating":
                    best = min(best, max(i.state_at, engine._asked_again.get(i.instance_id, i.state_at)) + after)
        return best if best > now else now


__all__ = ["SimLazyEngineProc", "next_wake"]
