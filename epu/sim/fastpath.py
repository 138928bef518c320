"""Skip the engine iterations that cannot decide anything, exactly.

A decision engine iterates every ``iteration_seconds`` (5 s). Over a month of a trace that is
half a million iterations, and nearly all of them see the same snapshot and the same instance
table as the one before, and decide nothing. An iteration's result is a function of its inputs
(the latest snapshot, the stored instances, actions, memory and config) and of ``now``; ``now``
enters only through thresholds — ``now - t >= d`` for a timestamp ``t`` the engine stored and a
duration ``d`` of the policy (stall, idle, waiting times), a resend period, a site's backoff, a
billing period. So after an iteration that changed nothing (no action, no write, no message),
the next one that can differ is the first after either a new input or the earliest such
threshold. ``LazyEngineProc`` runs exactly those and skips the rest (they still tick, cheaply).

The thresholds are found generically, not per policy: every timestamp of every live instance,
of the policy's memory and of open actions, plus every duration-like parameter of the policy
(a name ending in ``_seconds`` or ``_s``) and every duration the policy keeps in its memory
(measured boot times), the resend period and billing periods (``next_wake``); the engine names
its own timers itself (``Engine.next_deadlines``: pipeline health, the active window, an
offering's capacity cooldown, the spot fallback, and ``now`` for a policy whose decision moves
with time in ways no scan can list, ``policies.DEMAND_SENSITIVE``). A policy that keeps a timer
under another name would be woken late — which is why the tests run each policy and each
fault scenario with and without skipping and require the same event digest.
Fencing leases: a skipped iteration does not renew the domain's lease, which may run out; the
next iteration renews it under the same holder and epoch (one engine runs in a simulation), so
nothing it decides changes.
"""

from __future__ import annotations

import bisect
import math
import operator
import time
from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import Any

from epu.services.decision.policies import durations, validate_params
from epu.sim.processes import EngineProc

EPSILON = 1e-6


@dataclass
class SkipStats:
    iterations: int = 0
    skipped: int = 0
    cpu_seconds: float = 0.0
    """CPU spent inside ``Engine.iterate`` (the cost of the iterations that ran)."""


def _numbers(obj: Any) -> list[float]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [float(obj)]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v)]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _numbers(v)]
    return []


_POLICY_TIMES: dict[int, tuple[Any, list[float], float, float]] = {}
"""id(parsed domain config) → (that config, its policy's durations, billing period, margin):
validated once per config version, not once per skipped-iteration check."""


def _policy_times(cfg: Any) -> tuple[list[float], float, float]:
    hit = _POLICY_TIMES.get(id(cfg))
    if hit is not None and hit[0] is cfg:
        return hit[1], hit[2], hit[3]
    params = validate_params(cfg.policy, cfg.params)
    period = float(getattr(params, "billing_period_seconds", 0.0) or 0.0)
    margin = float(getattr(params, "billing_margin_seconds", 0.0) or 0.0)
    if len(_POLICY_TIMES) > 64:
        _POLICY_TIMES.clear()
    _POLICY_TIMES[id(cfg)] = (cfg, durations(params), period, margin)
    return _POLICY_TIMES[id(cfg)][1:]  # type: ignore[return-value]


_STAMPS = operator.attrgetter("launched_at", "state_at", "joined_at", "idle_since", "drain_at",
                               "add_sent_at", "missing_since")
_NOT_NONE = partial(operator.is_not, None)


def instance_stamps(instances: list[Any], memo: dict[str, Any] | None = None,
                    domain: str = "") -> list[float]:
    """Every timestamp of ``instances`` (the ``None``s left out), sorted. ``memo`` keeps the last
    answer per domain with the very instance objects it was built from: the store hands out the
    same (immutable) objects while nothing of the domain changed, so a re-check after an input
    that did not touch the instances costs one tuple comparison (identity first, in C)."""
    key = tuple(instances)
    if memo is not None:
        hit = memo.get(domain)
        if hit is not None and hit[0] == key:
            return hit[1]  # type: ignore[no-any-return]
    stamps = sorted(filter(_NOT_NONE, chain.from_iterable(map(_STAMPS, instances))))  # in C: no generator
    if memo is not None:
        memo[domain] = (key, stamps)
    return stamps


def least_sum(stamps: list[float], ds: list[float], now: float) -> float:
    """``min(t + d for d in ds for t in stamps if t + d > now)`` (``inf`` when none), exactly,
    with ``stamps`` sorted: a float sum ``t + d`` never decreases as ``t`` grows (rounding is
    monotone), so for each ``d`` the pairs past ``now`` are a suffix of ``stamps`` and its first
    element gives the least sum. ``bisect`` on ``now - d`` finds that suffix up to rounding; the
    two loops then settle it on the very comparison the pairwise scan makes."""
    best = math.inf
    n = len(stamps)
    for d in set(ds):
        i = bisect.bisect_right(stamps, now - d)
        while i > 0 and stamps[i - 1] + d > now:
            i -= 1
        while i < n and not stamps[i] + d > now:
            i += 1
        if i < n:
            x = stamps[i] + d
            if x < best:
                best = x
    return best


def next_wake(engine: Any, domain: str, now: float, memo: dict[str, Any] | None = None) -> float:
    """The earliest time after ``now`` at which an iteration could decide differently with the
    same inputs (``inf`` when none). ``memo``: a dict the caller keeps between calls (see
    ``instance_stamps``)."""
    store = engine.store
    current = store.current_config(domain)
    if current is None:
        return math.inf
    cfg = current[1]
    policy_ds, period, margin = _policy_times(cfg)
    instances = store.instances(domain)
    memory, _ = store.memory(domain)
    remembered = _numbers(memory)
    ds = policy_ds + [d for d in remembered if 0 < d < 1e8]  # durations the policy measured (boot times)
    # the least t + d past now over every (stamp, duration) pair
    best = least_sum(instance_stamps(instances, memo, domain), ds, now)
    epoch_like = [t for t in remembered if t > 1e8]  # the memory's timestamps
    if epoch_like:
        best = min(best, least_sum(sorted(epoch_like), ds, now))
    if period > 0:
        for inst in instances:
            k = math.floor((now - inst.launched_at + margin) / period) + 1
            best = min(best, inst.launched_at + k * period - margin)
    resend = engine.settings.resend_seconds
    for sent_at in store.open_sent_at(domain):
        best = min(best, now if sent_at is None else sent_at + resend)
    for h in store.site_health().values():
        if h.backoff_until > now:
            best = min(best, h.backoff_until)
    return best


class LazyEngineProc(EngineProc):
    """An ``EngineProc`` that runs only the iterations that can decide something (see above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skip_stats = SkipStats()
        self._dirty = True
        self._wake = -math.inf
        self._acted = False
        self._stamps: dict[str, Any] = {}
        self.on_commit.append(self._saw_commit)
        self.on_send.append(self._saw_send)

    def _saw_commit(self, *_: Any) -> None:
        self._acted = True

    def _saw_send(self, *_: Any) -> None:
        self._acted = True

    def boot(self) -> None:
        self._dirty = True
        super().boot()

    def _input(self, msg: Any) -> None:
        self._dirty = True
        super()._input(msg)

    def _control(self, msg: Any) -> None:
        self._dirty = True
        super()._control(msg)

    def _snapshot(self, msg: Any) -> None:
        self._dirty = True
        super()._snapshot(msg)

    def _iterate(self) -> None:
        assert self.engine is not None
        now = self.clock.now()
        if not self._dirty and now < self._wake - EPSILON:
            self.skip_stats.skipped += 1
            return
        self.skip_stats.iterations += 1
        self._acted = False
        self._dirty = False
        t = time.process_time()
        self.engine.iterate()
        self.skip_stats.cpu_seconds += time.process_time() - t
        if self._acted:
            self._dirty = True
            return
        wake = min(self.engine.next_deadlines(now).values(), default=math.inf)
        for d in self.engine.domains:
            if self.engine.is_active(d):
                wake = min(wake, next_wake(self.engine, d, now, self._stamps))
        self._wake = wake
