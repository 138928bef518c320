"""Generated node names carry enough of the launch id, and an ``add`` whose name another live
instance holds is refused (issue 26, defect 7: Slurm's ``add`` of an existing name rewrites that
node's address and identity)."""

from __future__ import annotations

from dataclasses import replace

from epu.common.messages import is_valid_hostname, new_id
from epu.services.decision.actions import Decision, Node
from epu.services.decision.placement import SiteInfo
from epu.services.decision.planner import PlacementInput, node_name_for, plan

from tests.decision.helpers import event, inst, jobs, make_engine, snapshot, view

PLACEMENT = PlacementInput(["s1"], "rank", {"s1": SiteInfo("s1")}, {}, {}, {})


def test_generated_names_carry_60_bits_of_the_launch_id_and_stay_valid_host_names() -> None:
    lid = new_id()
    assert node_name_for("alpha_1", lid) == f"alpha-1-{lid[:16]}"
    long = node_name_for("d" * 63, lid)  # a domain name may have 63 characters
    assert is_valid_hostname(long) and len(long) <= 63 and long.endswith(f"-{lid[:16]}")
    # two launch ids equal in their first 8 characters no longer make one name
    a, b = "0123abcd" + new_id()[8:], "0123abcd" + new_id()[8:]
    assert node_name_for("d", a) != node_name_for("d", b)


def test_an_add_whose_name_another_live_instance_holds_is_refused_with_a_note() -> None:
    holder = inst("a", "joined", ip="10.0.0.1")
    newcomer = replace(inst("b", "started", ip="10.0.0.2"), node_name=holder.node_name)
    out = plan(view(instances=[holder, newcomer]), Decision([Node("add", "b", "running")]), PLACEMENT, set())
    assert [p for p in out.actions if p.kind == "add"] == []
    assert any("refused add of n-a for instance b" in n and "held by live instance a" in n for n in out.notes)
    assert "b" not in out.instances  # add_sent_at not set: nothing claims the add went out
    assert out.refused == [n for n in out.notes if "refused add" in n]
    # the name free again (its holder ended and its node removed): the add goes out
    out = plan(view(instances=[newcomer]), Decision([Node("add", "b", "running")]), PLACEMENT, set())
    assert [p.kind for p in out.actions] == ["add"]


def test_the_engine_sends_no_add_over_a_live_node_of_the_same_name() -> None:
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(2)))
    e.iterate()
    first, second = bus.of("instance.launch")
    bus.clear()
    # the second launch came back with the first's name (a collision of generated names)
    e.on_instance_event(event(first, "started", 2, clock.now(), ip="10.0.0.1"))
    clock.advance(5)
    e.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
    e.iterate()
    assert [c.node for c in bus.of("node.command")] == [first.node_name]
    bus.clear()
    twin = second.model_copy(update={"node_name": first.node_name})
    e.on_instance_event(event(twin, "started", 2, clock.now(), ip="10.0.0.2"))
    stored = e.store.instance(second.launch_id)
    e.store.save_instances([replace(stored, node_name=first.node_name)])
    clock.advance(5)
    e.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
    (rec,) = e.iterate()
    assert [c for c in bus.of("node.command") if c.action == "add"] == []
    assert any("held by live instance" in n for n in rec.notes), "published as an event: the decision record"
    assert bus.of("decision.record") == [rec]


def test_no_node_command_by_a_name_the_batch_system_shows_as_another_instances() -> None:
    """The instance whose add was refused has no node; a ``remove`` by its name would remove the
    holder's node (and ``offline`` drain it). The batch system's own view shows the name as the
    holder's: the removal is confirmed without a command, and the instance goes on its way out."""
    from epu.common.messages import NodeInfo

    holder = inst("a", "joined", ip="10.0.0.1")
    newcomer = replace(inst("b", "started", ip="10.0.0.2", retire="stalled"), node_name=holder.node_name)
    shown = NodeInfo(name=holder.node_name, state="free", cores=1, instance_id="a")
    v = view(instances=[holder, newcomer], nodes=[shown])
    out = plan(v, Decision([Node("remove", "b", "stalled"), Node("offline", "a", "idle")]), PLACEMENT, set())
    assert [(p.kind, p.instance_id) for p in out.actions] == [("offline", "a")]
    assert out.instances["b"].removed and any("shows that name as instance a's" in n for n in out.notes)
    # without a node of that name in the snapshot, the remove goes out as always (the batch system answers)
    out = plan(view(instances=[holder, newcomer]), Decision([Node("remove", "b", "stalled")]), PLACEMENT, set())
    assert [p.kind for p in out.actions] == ["remove"]
