"""Generated node names carry enough of the launch id, and an ``add`` whose name another live
instance holds is refused (issue 26, defect 7: Slurm's ``add`` of an existing name rewrites that
node's address and identity)."""

from __future__ import annotations

from dataclasses import replace

from epu.common.messages import is_valid_hostname, new_id
from epu.services.decision.actions import Decision, Node
from epu.services.decision.placement import SiteInfo
from epu.services.decision.planner import PlacementInput, node_name_for, plan

from tests.decision.helpers import event, inst, jobs, make_engine, node, snapshot, view

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



def test_a_launch_never_takes_a_name_a_live_instance_or_a_node_holds() -> None:
    """The name-collisions scenario, seed 83001: a launch took the name of a live instance whose
    add waited; its own slurmd registered under it by itself and ran a job, and the engine, which
    saw that name as the other's, took it for removed and ended it. A generated name now avoids
    every name held (instances not ended, ended ones not removed, nodes in the snapshot)."""
    from epu.services.decision.actions import Launch

    def name(i: str) -> str:
        return node_name_for("d", i)

    held = replace(inst("a", "started", ip="10.0.0.1"), node_name=name("0000000000004001"))
    shown = node(name("0000000000004003"), "free")
    ids = iter(["0000000000004001aa", "0000000000004002bb", "0000000000004002cc", "0000000000004003dd",
                "0000000000004004ee"])
    out = plan(view(instances=[held], nodes=[shown]), Decision([Launch(1, "q"), Launch(1, "q")]), PLACEMENT,
               set(), make_id=lambda: next(ids))
    # 4001 held by a live instance; 4002 taken by the first launch; 4003 shown by the batch system
    assert [p.message.node_name for p in out.actions if p.kind == "launch"] == \
        [name("0000000000004002"), name("0000000000004004")]
    assert [p.instance_id for p in out.actions if p.kind == "launch"] == ["0000000000004002bb", "0000000000004004ee"]


def test_opposite_node_commands_never_travel_together() -> None:
    """observe-switches, seed 83017: an online sent while the offline before it was unanswered was
    carried out first; the node stayed drained in Slurm while the engine held it joined, and it
    was never scaled down. Neither goes while the other is in flight."""
    draining = replace(inst("a", "draining", ip="10.0.0.1"), drain_at=0.0)
    joined = inst("b", "joined", ip="10.0.0.2")
    v = view(instances=[draining, joined], nodes=[node("n-a", "offline"), node("n-b", "free")])
    decision = Decision([Node("online", "a", "needed again"), Node("offline", "b", "idle")])
    held = plan(v, decision, PLACEMENT, {("a", "offline"), ("b", "online")})
    assert [p.kind for p in held.actions] == []
    sent = plan(v, decision, PLACEMENT, set())
    assert sorted((p.kind, p.instance_id) for p in sent.actions) == [("offline", "b"), ("online", "a")]
