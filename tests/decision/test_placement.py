"""Placement across sites: overflow, cheapest-first, spread, quota, backoff, probation, failover."""

from __future__ import annotations

import pytest
from epu.services.decision.placement import SiteHealth, SiteInfo, place, record_failure, record_success

from tests.decision.helpers import T0, config, event, jobs, make_engine, node, snapshot

INFOS = {"a": SiteInfo("a", quota=2, price_per_hour=0.5), "b": SiteInfo("b", quota=3, price_per_hour=0.1),
         "c": SiteInfo("c", quota=10, price_per_hour=0.3)}


@pytest.mark.parametrize(("strategy", "count", "live", "expected"), [
    ("rank", 4, {}, ["a", "a", "b", "b"]),              # overflow: fill a to its quota, then b
    ("rank", 2, {"a": 2}, ["b", "b"]),
    ("rank", 7, {}, ["a", "a", "b", "b", "b", "c", "c"]),
    ("cheapest", 4, {}, ["b", "b", "b", "c"]),          # 0.1 first, then 0.3
    ("spread", 3, {}, ["a", "b", "c"]),
    ("spread", 3, {"a": 1, "b": 1}, ["c", "a", "b"]),
])
def test_strategies(strategy, count, live, expected):
    assert place(count, ["a", "b", "c"], strategy, INFOS, {}, live, {}, T0).sites == expected


def test_quota_exhausted_everywhere_leaves_launches_unplaced():
    p = place(3, ["a"], "rank", INFOS, {}, {"a": 1}, {}, T0)
    assert p.sites == ["a"] and p.unplaced == 2 and "could not be placed" in p.why[-1]


def test_backoff_doubles_from_five_minutes_to_thirty_and_resets():
    h = SiteHealth("a")
    pauses = []
    for _ in range(6):
        h = record_failure(h, T0, "boom")
        pauses.append(h.backoff_until - T0)
    assert pauses == [300, 600, 1200, 1800, 1800, 1800]
    assert record_success(h) == SiteHealth("a", stalls=0)


def test_backing_off_site_is_skipped_then_on_probation():
    h = {"a": record_failure(SiteHealth("a"), T0, "api error")}
    assert place(2, ["a", "b"], "rank", INFOS, h, {}, {}, T0 + 299).sites == ["b", "b"]
    # after the pause: probation — one launch at a time until one joins (no black hole)
    assert place(2, ["a", "b"], "rank", INFOS, h, {}, {}, T0 + 300).sites == ["a", "b"]
    assert place(2, ["a", "b"], "rank", INFOS, h, {"a": 1}, {"a": 1}, T0 + 300).sites == ["b", "b"]


def _launch_and_fail(kind: str):
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1", "s2"]}})
    e, bus, clock = make_engine(cfg=cfg)
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    bus.clear()
    e.on_instance_event(event(launch, "failed", 1, clock.now(), error_kind=kind, reason="InsufficientInstanceCapacity"))
    return e, bus, clock, launch


def test_capacity_error_fails_over_to_next_site_in_the_next_iteration():
    """One launch path: the event handler only notes the failure; the iteration counts it against
    the site (backoff) and places the replacement elsewhere."""
    e, bus, clock, launch = _launch_and_fail("capacity")
    assert launch.site == "s1"
    assert bus.of("instance.launch") == []  # nothing from the event handler
    e.iterate()
    (again,) = bus.of("instance.launch")
    assert again.site == "s2" and again.launch_id != launch.launch_id
    assert e.store.site_health()["s1"].backoff_until == clock.now() + 300
    bus.clear()
    e.iterate()  # the replacement counts as pending: nothing more
    assert bus.of("instance.launch") == []


def test_transient_error_backs_off_and_next_iteration_uses_next_site():
    e, bus, clock, launch = _launch_and_fail("transient")
    assert bus.of("instance.launch") == []
    clock.advance(5)
    e.on_snapshot(snapshot(queued=jobs(1), at=clock.now()))
    e.iterate()
    assert [m.site for m in bus.of("instance.launch")] == ["s2"]


def test_stalled_boots_are_counted_per_site_and_feed_the_backoff():
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(2)))
    e.iterate()
    first = bus.of("instance.launch")
    assert [m.site for m in first] == ["s1", "s1"]
    for launch in first:  # the provisioner answers: the cloud has them, booting
        e.on_instance_event(event(launch, "pending", 1, clock.now()))
    bus.clear()
    for _ in range(5):  # the engine keeps iterating on fresh snapshots: a healthy pipeline
        clock.advance(100)
        e.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
        e.iterate()
        assert bus.of("instance.terminate") == []
    clock.advance(101)
    e.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
    e.iterate()
    assert len(bus.of("instance.terminate")) == 2  # never in the batch system: terminated directly
    health = e.store.site_health()["s1"]
    assert health.stalls == 1 and health.failures == 1  # one failure per site per iteration
    assert health.backoff_until == clock.now() + 300
    assert [m.site for m in bus.of("instance.launch")] == ["s2", "s2"]  # replaced elsewhere, same iteration


def test_success_resets_backoff():
    e, bus, clock, launch = _launch_and_fail("transient")
    e.on_snapshot(snapshot(queued=[], at=clock.now()))
    e.iterate()  # the failure is counted here
    clock.advance(301)
    e.on_snapshot(snapshot(queued=jobs(1), at=clock.now()))
    cfg_sites = e.store.site_health()
    assert cfg_sites["s1"].failures == 1
    e.iterate()
    (retry,) = bus.of("instance.launch")
    assert retry.site == "s1"  # probation: one launch allowed after the pause
    e.on_instance_event(event(retry, "started", 1, clock.now()))
    clock.advance(5)
    e.on_snapshot(snapshot(nodes=[node(retry.node_name, "busy", used=1, jobs_=["1"])], at=clock.now()))
    e.iterate()
    assert e.store.site_health()["s1"] == SiteHealth("s1")
