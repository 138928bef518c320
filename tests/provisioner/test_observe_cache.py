"""``observe`` with an ``ObserveCache`` (the last listing's ``ours`` taken again while the very
same CloudNode objects are listed for the same deployment; only changed records and those
judged last time judged again, ``observe_again``) plans exactly what ``observe`` without one plans, over random listings, records, misses and deployments — listings that reuse
the last one's node objects most of the time, as ``LibcloudSite.nodes`` does."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from epu.services.provisioner import reconcile as core
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_LAUNCH, CloudNode
from epu.services.provisioner.store import InstanceRecord, Miss

STATES = ("requested", "pending", "started", "joined", "terminating", "terminated", "failed")
NODE_STATES = (None, "pending", "started", "terminated", "failed")


def _node(rng: random.Random, i: int) -> CloudNode:
    return CloudNode(f"c{i}", f"n{i}", rng.choice(NODE_STATES), "x", rng.choice((None, "", "10.0.0.1", "10.0.0.2")),
                     {TAG_DEPLOYMENT: rng.choice(("d", "d", "d", "other")), TAG_LAUNCH: f"i{i}"},
                     interruption_at=rng.choice((None, None, None, 5.0)))


def _record(rng: random.Random, i: int) -> InstanceRecord:
    return InstanceRecord(f"i{i}", "a", rng.choice(("s", "s", "s", "t")), f"w{i}", 4, rng.choice(STATES), 1,
                          rng.choice((f"c{i}", f"c{i}", None)), rng.choice((None, "10.0.0.1")), "", None, 0.0,
                          rng.choice((0.0, 50.0, 200.0)), presumed_gone_at=rng.choice((None, None, 10.0)))


@pytest.mark.parametrize("seed", range(10))
def test_a_kept_ours_plans_what_observe_plans_from_nothing(seed: int) -> None:
    rng = random.Random(seed)
    cache = core.ObserveCache()
    nodes = [_node(rng, i) for i in range(12)]
    records = {f"i{i}": _record(rng, i) for i in range(12)}
    deployment = "d"
    answered: list[bool] = []
    observe_again = cache.observe_again
    cache.observe_again = lambda *args: answered.append(observe_again(*args)) or answered[-1]  # type: ignore[method-assign]
    for step in range(300):
        op = rng.random()
        if op < 0.2:
            k = rng.randrange(len(nodes))
            nodes[k] = _node(rng, int(nodes[k].cloud_id[1:]))  # a changed node: a new object
        elif op < 0.3:
            rng.shuffle(nodes)
        elif op < 0.4 and len(nodes) > 1:
            nodes.pop(rng.randrange(len(nodes)))
        elif op < 0.5:
            nodes.append(_node(rng, rng.randrange(16)))  # a new node, or a duplicate cloud id
        elif op < 0.55:
            deployment = rng.choice(("d", "other"))
        if rng.random() < 0.5:
            i = rng.randrange(16)
            records[f"i{i}"] = _record(rng, i)
        misses = {f"i{i}": Miss(f"i{i}", "s", rng.randint(1, 4), 0.0, 100.0)
                  for i in rng.sample(range(16), rng.choice((0, 0, 1, 3)))}
        world = core.World(site="s", nodes=tuple(nodes), listed_at=float(rng.choice((100.0, 150.0))), now=300.0,
                           records=dict(records), misses=misses, kept=cache)
        rules = core.Rules(deployment=deployment, store_id="st", vanish_misses=3, vanish_min_seconds=60.0)
        kept, fresh = core.observe(world, rules), core.observe(replace(world, kept=None), rules)
        assert kept == fresh, step
        assert cache.last is not None and cache.last[2] == core.ours(world, rules)
    assert sum(answered) > 10  # observe_again answered often


@pytest.mark.parametrize("seed", range(12))
def test_observe_again_over_changing_listings_and_records_plans_what_observe_plans(seed: int) -> None:
    """``observe_again`` across listings that change between observations (nodes changed, gone —
    a partial listing —, back, duplicated, another deployment's, shuffled) and records that come,
    go, change and move in order, with the listing time moving back and forth (a late listing)
    and misses now and then: every plan is the plan of ``observe`` from nothing, and it answers
    most observations (the incremental path is the one being tested)."""
    rng = random.Random(1000 + seed)
    cache = core.ObserveCache()
    pool = {i: _node(rng, i) for i in range(24)}
    nodes = [pool[i] for i in range(16)]
    records = {f"i{i}": _record(rng, i) for i in range(16)}
    answered: list[bool] = []
    observe_again = cache.observe_again
    cache.observe_again = lambda *args: answered.append(observe_again(*args)) or answered[-1]  # type: ignore[method-assign]
    for step in range(600):
        for _ in range(rng.choice((0, 0, 1, 1, 2, 4))):
            op = rng.random()
            if op < 0.25:
                i = rng.randrange(24)
                pool[i] = _node(rng, i)  # the node changed: a new object wherever it is listed
                nodes = [pool[i] if n.cloud_id == f"c{i}" else n for n in nodes]
            elif op < 0.35 and nodes:
                nodes = [n for n in nodes if rng.random() < 0.7]  # a partial listing
            elif op < 0.5:
                nodes = [pool[i] for i in sorted(rng.sample(range(24), rng.randrange(8, 20)))]
            elif op < 0.55 and nodes:
                nodes.insert(rng.randrange(len(nodes) + 1), rng.choice(nodes))  # listed twice
            elif op < 0.6:
                rng.shuffle(nodes)
            elif op < 0.75:
                i = rng.randrange(24)
                records[f"i{i}"] = _record(rng, i)  # new, or changed
            elif op < 0.85 and records:
                del records[rng.choice(list(records))]  # closed: no longer read
            elif op < 0.9:
                items = list(records.items())
                rng.shuffle(items)
                records = dict(items)
        misses = ({} if rng.random() < 0.85 else
                  {f"i{i}": Miss(f"i{i}", "s", rng.randint(1, 4), 0.0, 100.0) for i in rng.sample(range(24), 2)})
        world = core.World(site=rng.choice(("s", "s", "s", "s", "t")), nodes=tuple(nodes),
                           listed_at=float(rng.choice((100.0, 150.0, 150.0, 400.0))), now=500.0,
                           records=dict(records), misses=misses, kept=cache)
        rules = core.Rules(deployment=rng.choice(("d",) * 9 + ("other",)), store_id="st", vanish_misses=3,
                           vanish_min_seconds=60.0)
        kept, fresh = core.observe(world, rules), core.observe(replace(world, kept=None), rules)
        assert kept == fresh, step
    assert sum(answered) > 200


@pytest.mark.parametrize("seed", range(6))
def test_ours_is_the_first_listing_of_each_of_this_deployments_nodes(seed: int) -> None:
    """``ours``' C-built answer for a listing of distinct nodes all this deployment's is the loop's."""
    rng = random.Random(seed)
    for _ in range(200):
        nodes = tuple(_node(rng, rng.randrange(30)) for _ in range(rng.randrange(0, 12)))
        if rng.random() < 0.5:
            nodes = tuple({n.cloud_id: replace(n, tags={**n.tags, TAG_DEPLOYMENT: "d"}) for n in nodes}.values())
        world = core.World(site="s", nodes=nodes, listed_at=0.0, now=0.0, records={})
        expected: dict[str, CloudNode] = {}
        for n in nodes:
            if n.tags.get(TAG_DEPLOYMENT) == "d" and n.cloud_id not in expected:
                expected[n.cloud_id] = n
        got = core.ours(world, core.Rules(deployment="d", store_id="st"))
        assert list(got.items()) == list(expected.items())
        assert all(got[k] is v for k, v in expected.items())
