"""The fault simulator's engine process, skipping the iterations that cannot decide anything.

``epu simulate`` skips idle engine iterations (``epu.sim.fastpath``): an iteration after one
that changed nothing can only differ after a new input, a threshold of the stored data
(``fastpath.next_wake``) or one of the engine's own timers (``Engine.next_deadlines``: pipeline
health, unanswered terminates, the circuit breaker, ...), and the skipped ones still tick (their
events are in the digest) without running. The fault simulator adds what only it knows: while
the decision store refuses writes or a crash is armed before the next one (``StoreFaults``),
every iteration runs (each renews the domain's lease, a write that fails or crashes), and so
does the first one after — it could not take the lease, so it did not act on its inputs.

A skipped iteration is reported to the engine (``Engine.skip_iteration``: its pipeline check
counts a gap in iterations as a fault). Only one engine: with two, a lease left unrenewed lets
the other one take over, so a scenario with several engines runs them all
(``Simulation(skip_idle=...)`` picks this class only then). Inputs must reach the engine through
the process (the bus) for a skip to notice them: a test that calls ``proc.engine`` directly should
run with ``skip_idle=False``. Exactness is tested the way ``epu simulate`` tests its own: every
scenario, event for event, with and without skipping (tests/sim/test_skip_exact.py).
"""

from __future__ import annotations

from epu.sim.fastpath import EPSILON, LazyEngineProc, next_wake


class SimLazyEngineProc(LazyEngineProc):
    """``LazyEngineProc`` with the fault simulator's extra reason to run (module docstring)."""

    def _must_run(self) -> bool:
        f = self.store_faults
        return f.crash_next_write or self.world.t < f.failing_until

    def _iterate(self) -> None:
        assert self.engine is not None
        forced = self._must_run()
        now = self.clock.now()
        if not forced and not self._dirty and now < self._wake - EPSILON:
            self.skip_stats.skipped += 1
            self.engine.skip_iteration(now)
            return
        self._dirty = True
        super()._iterate()
        if forced:
            self._dirty = True


__all__ = ["SimLazyEngineProc", "next_wake"]
