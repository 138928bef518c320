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
