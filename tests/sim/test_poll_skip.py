"""A poll skipped without listing is exact: over random launches, terminates, creates and
destroys behind the provisioner's back, vanishings, preemptions, reclaim notices, boot failures,
listing lag, partial listings, faults switched on and off and time, a provisioner that skips the
polls its site and store say cannot differ from its last steady one (``Provisioner._still_steady``
over ``LibcloudSite.unchanged``, ``SimNodeDriver.listing_unchanged``, ``SimCloud.relisted`` and
``MemoryStore.records_version``) publishes every event, ends with every record, miss and sighting,
and leaves the cloud (its statistics and random stream) as one that lists and judges at every poll.

The poll is what counts a node's absences (presumed gone, closed after a terminate) and follows
its end: a skip that hid a change would leave a node billed or a record wrong."""

from __future__ import annotations

import itertools
import random

import pytest
from epu.common.messages import LaunchRequest, TerminateRequest
from epu.services.provisioner.cloud import LibcloudSite
from epu.services.provisioner.memstore import MemoryStore
from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings
from epu.services.provisioner.runner import InlineRunner

from epu.sim.cloud import CloudFaults, SimCloud
from epu.sim.world import World, WorldClock
from tests.provisioner.conftest import site_config


def build(seed: int, partial: float) -> tuple[World, SimCloud, Provisioner, list]:
    """A provisioner on a simulated cloud, its site's work run at once, its events collected."""
    world = World(seed)
    cloud = SimCloud(world, "s", boot_seconds=(20.0, 90.0), terminated_linger=60.0,
                     faults=CloudFaults(listing_lag_seconds=30.0, boot_failure_rate=0.1,
                                        partial_listing_rate=partial, partial_listing_polls=(1, 3)))
    ids = itertools.count()
    events: list = []
    prov = Provisioner(MemoryStore(), {"s": LibcloudSite("s", site_config(quota=40), cloud.driver("prov"), "epu")},
                       events.append, clock=WorldClock(world),
                       settings=ProvisionerSettings(deployment="epu", vanish_misses=2, vanish_min_seconds=20.0,
                                                    new_id=lambda: f"{next(ids):032x}"))
    prov.runners = {"s": InlineRunner("s", lambda fn, what: fn())}  # type: ignore[dict-item]
    return world, cloud, prov, events


def run(seed: int, skip: bool) -> tuple[list, list, dict, dict, dict, tuple, int]:
    rng = random.Random(seed)
    world, cloud, prov, events = build(seed, 0.0 if seed % 3 == 0 else 0.2)
    skips = 0
    if not skip:
        prov._still_steady = lambda site, last: False  # type: ignore[method-assign]
    else:
        real = prov._still_steady

        def counted(site, last):  # type: ignore[no-untyped-def]
            nonlocal skips
            hit = real(site, last)
            skips += hit
            return hit

        prov._still_steady = counted  # type: ignore[method-assign]
    for step in range(1500):
        op = rng.random()
        live = [v for v in cloud.vms.values() if v.terminated_at is None]
        records = [r for r in prov.store.list() if not r.terminal]
        if op < 0.06:
            prov.handle_launch(LaunchRequest(launch_id=f"L{step}", domain="d", site="s", node_name=f"n{step}"))
        elif op < 0.09 and records:
            # the engine ends what the cloud no longer shows alive (presumed gone) first
            r = rng.choice([r for r in records if r.presumed_gone] or records)
            prov.handle_terminate(TerminateRequest(request_id=f"t{step}", instance_id=r.instance_id, domain="d"))
        elif op < 0.11 and live:
            cloud._accident(rng.choice(live), rng.choice(("vanish", "preempt")))
        elif op < 0.12 and live:
            cloud._announce(rng.choice(live), world.t + 120.0)
        elif op < 0.13 and live:
            cloud.destroy("someone", rng.choice(live).cloud_id)  # behind the provisioner's back
        elif op < 0.17:
            cloud.enabled = not cloud.enabled
        elif op < 0.19 and records:
            r = rng.choice(records)  # another provisioner on this store presumed its node gone
            prov.store.note_presence(r.instance_id, True, world.t, "presumed gone by another process")
        else:
            world.t += rng.choice((0.0, 5.0, 15.0, 15.0, 15.0, 60.0))
            prov.poll("s")
            if rng.random() < 0.15:
                prov.reconcile("s")
    db = prov.store.db
    return ([e.model_dump() for e in events], sorted(map(repr, db.instances.values())), dict(db.misses),
            dict(db.sightings), vars(cloud.stats), cloud._rng.getstate(), skips)


@pytest.mark.parametrize("seed", range(10))
def test_a_poll_skipped_without_listing_is_a_full_poll(seed: int) -> None:
    *skipped, hits = run(seed, skip=True)
    *full, none = run(seed, skip=False)
    assert none == 0 and hits >= (30 if seed % 3 == 0 else 5)
    assert skipped == full


def test_a_miss_counted_since_the_steady_poll_is_judged() -> None:
    """Another provisioner on the same store reconciles on a partial listing and counts misses
    (the miss history is shared); this one's listing is unchanged since its last steady poll and
    no record was stored: its poll must still run (and clear the misses), not be skipped."""
    world, cloud, prov, _ = build(1, 0.0)
    other = Provisioner(MemoryStore(prov.store.db), {"s": LibcloudSite("s", site_config(quota=40),
                                                                       cloud.driver("other"), "epu")},
                        lambda e: None, clock=WorldClock(world), settings=prov.settings)
    other.runners = {"s": InlineRunner("s", lambda fn, what: fn())}  # type: ignore[dict-item]
    for i in range(3):
        prov.handle_launch(LaunchRequest(launch_id=f"L{i}", domain="d", site="s", node_name=f"n{i}"))
    world.t += 200.0
    prov.poll("s")  # follows the nodes to started
    for _ in range(4):  # a boot that failed takes a few listings of ERROR to close (issue 26)
        world.t += 15.0
        prov.poll("s")  # steady, once every record follows its node
    assert "s" in prov._steady and not prov.store.misses("s")
    cloud.faults.partial_listing_rate, cloud.faults.partial_listing_share = 1.0, 1.0
    other.reconcile("s")
    assert prov.store.misses("s")
    cloud.faults.partial_listing_rate, cloud._partial_left = 0.0, 0
    world.t += 15.0
    prov.poll("s")
    assert prov.store.misses("s") == {}
