"""Domains whose workers must take pre-declared batch node names (e.g. a Slurm CLOUD pool with a
port per slot, the only way several slurmd share one host): names come from the pool, a slot
is reused only once free, and a slot that shows up before the engine added it has not joined.
(The Slurm sensor leaves unused, powered-down CLOUD slots out of its snapshots.)"""

from __future__ import annotations

from tests.decision.helpers import config, event, jobs, make_engine, node, snapshot
from tests.decision.test_engine import result, step

POOL = ["elastic01", "elastic02", "elastic03"]


def pool_engine():
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1"], "node_names": POOL}},
                 sites={"s1": {"driver": "epu-sim", "quota": 10}})
    return make_engine(cfg=cfg)


def test_launches_take_free_pool_names_and_wait_when_the_pool_is_used_up() -> None:
    e, bus, clock = pool_engine()
    e.on_snapshot(snapshot(queued=jobs(5)))
    (rec,) = e.iterate()
    launches = bus.of("instance.launch")
    assert [la.node_name for la in launches] == POOL, "3 slots for a demand of 5"
    assert any("wait for a free name" in n for n in rec.notes)
    bus.clear()
    step(e, clock, queued=jobs(5))
    assert bus.of("instance.launch") == [], "no name left, no launch"


def test_a_declared_but_never_added_slot_has_not_joined_and_gets_its_add() -> None:
    e, bus, clock = pool_engine()
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    bus.clear()
    e.on_instance_event(event(launch, "pending", 1, clock.now()))
    e.on_instance_event(event(launch, "started", 2, clock.now()))
    # the worker's slurmd registered before the engine's add: its slot shows up, still drained
    step(e, clock, queued=jobs(1), nodes=[node(launch.node_name, "offline")])
    (add,) = bus.of("node.command")
    assert (add.action, add.node) == ("add", launch.node_name)
    assert e.store.instances("d")[0].state == "started", "not joined while the slot is out of service"
    e.on_node_result(result(add))
    step(e, clock, nodes=[node(launch.node_name, "busy", used=1, jobs_=["1"])])
    assert e.store.instances("d")[0].state == "joined"
