"""The pure decisions of the poll loop and reconciliation, table by table (services/provisioner/reconcile.py).

Each row is one situation: what the listing showed, what the store holds, what the memory of
misses and sightings says, and the actions expected — no cloud, no database, no threads."""

from __future__ import annotations

from dataclasses import replace

import pytest
from epu.common.retire import Proof
from epu.services.provisioner import reconcile as core
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_DOMAIN, TAG_LAUNCH, TAG_STORE, CloudNode
from epu.services.provisioner.records import InstanceRecord, Miss, Sighting

T = 10_000.0
RULES = core.Rules(deployment="dep", store_id="st", vanish_misses=3, vanish_min_seconds=60,
                   orphan_grace_seconds=600, max_destroys=2, resume_after_seconds=30)


def node(cid: str, lid: str | None = None, state: str | None = "started", *, dep: str = "dep", store: str | None = "st",
         ip: str | None = "10.0.0.1") -> CloudNode:
    tags = {TAG_DEPLOYMENT: dep}
    if store is not None:
        tags[TAG_STORE] = store
    if lid is not None:
        tags[TAG_LAUNCH] = lid
    native = {"started": "running", "pending": "pending", "terminated": "terminated", "failed": "error"}.get(
        state or "", "stopped")
    return CloudNode(cloud_id=cid, name=cid, state=state, native_state=native, ip=ip, tags=tags, created_at=0.0)


def in_domain(n: CloudNode, domain: str = "d") -> CloudNode:
    return replace(n, tags={**n.tags, TAG_DOMAIN: domain})


def rec(iid: str, state: str = "started", cloud_id: str | None = None, *, updated: float = T - 100,
        presumed: float | None = None, site: str = "s", ip: str | None = "10.0.0.1") -> InstanceRecord:
    return InstanceRecord(instance_id=iid, domain="d", site=site, node_name=iid, cores=1, state=state, seq=3,
                          cloud_id=cloud_id, ip=ip, reason="", error_kind=None, created_at=T - 1000,
                          updated_at=updated, presumed_gone_at=presumed)


def world(nodes=(), records=(), misses=(), sightings=(), busy=(), listed_at: float = T, now: float = T) -> core.World:
    return core.World(site="s", nodes=tuple(nodes), listed_at=listed_at, now=now,
                      records={r.instance_id: r for r in records}, misses={m.instance_id: m for m in misses},
                      sightings={s.cloud_id: s for s in sightings}, busy=frozenset(busy))


def miss(iid: str, count: int, first: float, last: float | None = None) -> Miss:
    return Miss(iid, "s", count, first, first if last is None else last)


def kinds(plan: core.Plan) -> list[str]:
    return [type(a).__name__ for a in plan.actions]


# --------------------------------------------------------------------------- observe: absence

ABSENCE = [
    # (id, record, prior miss, listed_at, expected action names, why)
    ("first miss is only counted", rec("a", cloud_id="c1"), None, T, ["CountMiss"]),
    ("second miss, still only counted", rec("a", cloud_id="c1"), miss("a", 1, T - 15), T, ["CountMiss"]),
    ("enough misses but too little time", rec("a", cloud_id="c1"), miss("a", 2, T - 30), T, ["CountMiss"]),
    ("enough time but too few misses", rec("a", cloud_id="c1"), miss("a", 1, T - 300), T, ["CountMiss"]),
    ("3 misses over 60 s: presumed gone", rec("a", cloud_id="c1"), miss("a", 2, T - 60), T,
     ["CountMiss", "PresumeGone"]),
    ("already presumed: counted, nothing announced twice", rec("a", cloud_id="c1", presumed=T - 50),
     miss("a", 5, T - 300), T, ["CountMiss"]),
    ("a terminate we asked for, node gone long enough: closed", rec("a", "terminating", "c1"),
     miss("a", 2, T - 60), T, ["CloseGone", "ClearMiss"]),
    ("a terminate we asked for, one miss: wait", rec("a", "terminating", "c1"), None, T, ["CountMiss"]),
    ("record changed after the listing was taken: not judged", rec("a", cloud_id="c1", updated=T + 1), None, T, []),
    ("a late listing (older than the last counted) is no new miss", rec("a", cloud_id="c1"),
     miss("a", 2, T - 100, T - 5), T - 10, []),
    ("the same listing twice is no new miss", rec("a", cloud_id="c1"), miss("a", 2, T - 100, T), T, []),
    ("a launch in flight (no cloud id yet) is not judged", rec("a", "requested", None), None, T, []),
    ("terminal records are not judged", rec("a", "terminated", "c1"), None, T, []),
]


@pytest.mark.parametrize("why,record,prior,listed_at,expected", ABSENCE, ids=[r[0] for r in ABSENCE])
def test_absence(why, record, prior, listed_at, expected) -> None:
    plan = core.observe(world([node("other", "x")], [record], [prior] if prior else [], listed_at=listed_at), RULES)
    assert kinds(plan) == expected, why
    assert not plan.of(core.Destroy)


def test_miss_history_carries_first_time_and_count() -> None:
    plan = core.observe(world([], [rec("a", cloud_id="c1")], [miss("a", 1, T - 15)]), RULES)
    [count] = plan.of(core.CountMiss)
    assert count.miss == Miss("a", "s", 2, T - 15, T)
    plan = core.observe(world([], [rec("a", cloud_id="c1")], [miss("a", 2, T - 75)]), RULES)
    [gone] = plan.of(core.PresumeGone)
    assert gone.cloud_id == "c1" and "3 consecutive listings over 75 s" in gone.reason and "not destroyed" in gone.reason


# --------------------------------------------------------------------------- observe: presence

PRESENCE = [
    ("pending to started", rec("a", "pending", "c1"), node("c1", "a", "started"), None,
     [core.Follow("a", "started", "node running", None, "10.0.0.1")]),
    ("same state, same ip: nothing", rec("a", "started", "c1"), node("c1", "a", "started"), None, []),
    ("same state, new ip: noted", rec("a", "started", "c1", ip=None), node("c1", "a", "started", ip="10.9.9.9"), None,
     [core.NoteIp("a", "10.9.9.9")]),
    ("never backwards: a started record listed pending", rec("a", "started", "c1"), node("c1", "a", "pending"), None,
     []),
    ("stopped tells nothing", rec("a", "started", "c1"), node("c1", "a", None), None, []),
    ("error before any listing showed it running, listed once: a miss, never destroyed on that one "
     "listing (a listing lagging the create may show a booted node so)",
     rec("a", "pending", "c1"), node("c1", "a", "failed"), None, [core.CountMiss(Miss("a", "s", 1, T, T))]),
    ("a failed boot: error again, the run long enough: failed (transient), and the node destroyed "
     "(it holds a quota slot)",
     rec("a", "pending", "c1"), node("c1", "a", "failed"), miss("a", 2, T - 70, T - 30),
     [core.Follow("a", "failed", "node in state error: not listed running in 3 consecutive listings over 70 s, "
                  "boot failed", "transient"),
      core.Destroy("c1", "a", Proof.FAILED_LAUNCH, "record a failed: node error in 3 listings"),
      core.ClearMiss("a")]),
    ("error again, but the run too short: still a miss", rec("a", "pending", "c1"), node("c1", "a", "failed"),
     miss("a", 2, T - 20, T - 10), [core.CountMiss(Miss("a", "s", 3, T - 20, T))]),
    ("error on a node listed running before: one listing's word (a failed migration leaves a running "
     "server in ERROR), counted as a miss; nothing followed, nothing destroyed",
     rec("a", "started", "c1"), node("c1", "a", "failed"), None, [core.CountMiss(Miss("a", "s", 1, T, T))]),
    ("error on a joined node: the same", rec("a", "joined", "c1"), node("c1", "a", "failed"), miss("a", 1, T - 15),
     [core.CountMiss(Miss("a", "s", 2, T - 15, T))]),
    ("error the driver saw itself (a local process that exited): a fact, failed at once",
     rec("a", "started", "c1"), replace(node("c1", "a", "failed"), end_observed=True), None,
     [core.Follow("a", "failed", "node in state error", "transient", "10.0.0.1"),
      core.Destroy("c1", "a", Proof.FAILED_LAUNCH, "record a failed: node error")]),
    ("terminated by the cloud, never asked: one listing's word (a lagging replica), counted as a miss",
     rec("a", "started", "c1"), node("c1", "a", "terminated"), None, [core.CountMiss(Miss("a", "s", 1, T, T))]),
    ("terminated, seen by the driver itself", rec("a", "started", "c1"),
     replace(node("c1", "a", "terminated"), end_observed=True), None,
     [core.Follow("a", "terminated", "terminated by the cloud (node c1)", None, "10.0.0.1")]),
    ("preempted by the cloud (a spot reclaim): told apart from a plain end", rec("a", "started", "c1"),
     replace(node("c1", "a", "terminated"), preempted=True), None,
     [core.Follow("a", "terminated", "preempted by the cloud (node c1)", "preempted", "10.0.0.1")]),
    ("our own terminate of a spot node is no preemption", rec("a", "terminating", "c1"),
     replace(node("c1", "a", "terminated"), preempted=True), None,
     [core.Follow("a", "terminated", "terminated", None, "10.0.0.1")]),
    ("terminated as asked", rec("a", "terminating", "c1"), node("c1", "a", "terminated"), None,
     [core.Follow("a", "terminated", "terminated", None, "10.0.0.1")]),
    ("seen again: misses cleared", rec("a", "started", "c1"), node("c1", "a"), miss("a", 2, T - 30),
     [core.ClearMiss("a")]),
    ("an interruption notice on a running node: the engine is told", rec("a", "started", "c1"),
     replace(node("c1", "a", "started"), interruption_at=T + 120), None, [core.Notice("a", T + 120)]),
    ("a notice on a booting node, with its move to started", rec("a", "pending", "c1"),
     replace(node("c1", "a", "started"), interruption_at=T + 120), None,
     [core.Follow("a", "started", "node running", None, "10.0.0.1"), core.Notice("a", T + 120)]),
    ("no notice for an instance we are terminating ourselves", rec("a", "terminating", "c1"),
     replace(node("c1", "a", "started"), interruption_at=T + 120), None, []),
]


@pytest.mark.parametrize("why,record,listed,prior,expected", PRESENCE, ids=[r[0] for r in PRESENCE])
def test_presence(why, record, listed, prior, expected) -> None:
    plan = core.observe(world([listed], [record], [prior] if prior else []), RULES)
    assert plan.actions == expected, why


@pytest.mark.parametrize("native", ["failed", "terminated"])
def test_an_end_never_asked_for_is_at_most_a_presumption_however_long_it_is_listed(native: str) -> None:
    """ERROR or TERMINATED listed again and again for a node we did not end: counted with absence,
    presumed gone once the run is long enough — the engine drains and terminates it if the batch
    system agrees — and never closed or destroyed on the listing's word (a closed record's live
    node is destroyed by the next reconciliation, with the jobs on it)."""
    r = rec("a", "joined", "c1")
    listed = node("c1", "a", native)
    for prior in (miss("a", 2, T - 75, T - 15), miss("a", 9, T - 900, T - 15)):
        for plan in (core.observe(world([listed], [r], [prior]), RULES),
                     core.reconcile(world([listed], [r], [prior]), RULES)):
            assert not plan.of(core.Follow) and not plan.of(core.Destroy) and not plan.of(core.CloseGone)
            [gone] = plan.of(core.PresumeGone)
            assert f"not listed alive (last: {listed.native_state}, never asked to end)" in gone.reason
    presumed = rec("a", "joined", "c1", presumed=T - 600)
    plan = core.reconcile(world([listed], [presumed], [miss("a", 40, T - 900, T - 15)]), RULES)
    assert kinds(plan) == ["CountMiss"]  # still no readoption: not listed alive
    plan = core.observe(world([node("c1", "a")], [presumed], [miss("a", 40, T - 900, T - 15)]), RULES)
    assert kinds(plan) == ["ClearMiss", "Readopt"]  # listed running again: the presumption lifted


def test_presumed_gone_node_listed_again_is_readopted_and_followed() -> None:
    plan = core.observe(world([node("c1", "a", "started")], [rec("a", "pending", "c1", presumed=T - 10)],
                              [miss("a", 4, T - 200)]), RULES)
    assert kinds(plan) == ["ClearMiss", "Readopt", "Follow"]
    assert plan.actions[1].reason.endswith("re-adopted") and plan.actions[2].state == "started"


def test_only_this_deployments_nodes_count_and_duplicates_count_once() -> None:
    # a node with our cloud id but another deployment's tag is not our node: a miss
    plan = core.observe(world([node("c1", "a", dep="staging")], [rec("a", "started", "c1")]), RULES)
    assert kinds(plan) == ["CountMiss"]
    twice = [node("c1", "a", "started"), node("c1", "a", "started")]
    plan = core.observe(world(twice, [rec("a", "pending", "c1")]), RULES)
    assert kinds(plan) == ["Follow"]


# --------------------------------------------------------------------------- reconcile: whose node, and the sweep

SWEEP = [
    # (why, listed nodes, records, sightings, expected destroyed cloud ids, expected alert kinds, waiting)
    ("orphan first seen now: waits, announced", [node("o1", "x")], [], [], [], ["orphan-seen"], ["o1"]),
    ("orphan created long ago but first seen now: still waits (grace is ours, not the cloud's)",
     [replace(node("o1", "x"), created_at=T - 10 ** 6)], [], [], [], ["orphan-seen"], ["o1"]),
    ("orphan seen 599 s ago: waits, not announced again", [node("o1", "x")], [],
     [Sighting("s", "o1", "x", "orphan", T - 599, T - 300)], [], [], ["o1"]),
    ("orphan seen 600 s ago: destroyed", [node("o1", "x")], [],
     [Sighting("s", "o1", "x", "orphan", T - 600, T - 300)], ["o1"], [], []),
    ("our store, launch unknown, a domain (a restored store): adopted, never destroyed",
     [in_domain(node("o1", "x"))], [], [Sighting("s", "o1", "x", "orphan", T - 10 ** 5, T - 300)], [],
     ["orphan-adopted"], []),
    ("our deployment and a domain but another store: never", [in_domain(node("f1", "x", store="other"))], [],
     [Sighting("s", "f1", "x", "foreign", T - 10 ** 5, T - 300)], [], [], []),
    ("our deployment, another store: never", [node("f1", "x", store="other")], [],
     [Sighting("s", "f1", "x", "foreign", T - 10 ** 5, T - 300)], [], [], []),
    ("our deployment, no store tag (older release): never, announced once", [node("f1", "x", store=None)], [], [],
     [], ["foreign-node"], []),
    ("another deployment: never looked at", [node("f1", "x", dep="staging")], [], [], [], [], []),
    ("untagged by launch: never", [node("u1", None)], [], [], [], [], []),
    ("unknown but not live: nothing", [node("o1", "x", "terminated")], [], [], [], [], []),
    ("live node of a failed record: never destroyed, reopened and announced", [node("c1", "a")],
     [rec("a", "failed", "c1")], [], [], ["failed-launch-alive"], []),
    ("live node of a launch that failed before it saw a node (a lost create answer): reopened",
     [node("c1", "a")], [rec("a", "failed")], [], [], ["failed-launch-alive"], []),
    ("ERROR node of a launch that failed before it saw a node: reopened too (the poll judges ERROR)",
     [node("c1", "a", "failed")], [rec("a", "failed")], [], [], ["failed-launch-alive"], []),
    ("ERROR node of a record closed failed on its own ERROR listings: destroyed", [node("c1", "a", "failed")],
     [rec("a", "failed", "c1")], [], ["c1"], [], []),
    ("node of a terminated record: destroyed", [node("c1", "a")], [rec("a", "terminated", "c1")], [], ["c1"], [], []),
    ("terminated node of a terminated record: nothing", [node("c1", "a", "terminated")],
     [rec("a", "terminated", "c1")], [], [], [], []),
    ("node of a record closed on absence (older release): never, announced", [node("c1", "a")],
     [rec("a", "terminated", "c1", presumed=T - 5000)], [], [], ["node-reappeared"], []),
    ("duplicate while the tracked node is listed live: destroyed", [node("c1", "a"), node("c2", "a")],
     [rec("a", "started", "c1")], [], ["c2"], [], []),
    ("'duplicate' while the tracked node is missing from the listing: never", [node("c2", "a")],
     [rec("a", "started", "c1")], [], [], [], []),
    ("a launch of another site: not this site's to judge", [node("c9", "z")], [rec("z", "failed", "c9", site="t")],
     [], [], [], []),
]


@pytest.mark.parametrize("why,listed,records,seen,destroyed,alerts,waiting", SWEEP, ids=[r[0] for r in SWEEP])
def test_sweep(why, listed, records, seen, destroyed, alerts, waiting) -> None:
    plan = core.reconcile(world(listed, records, sightings=seen), RULES)
    assert [d.cloud_id for d in plan.of(core.Destroy)] == destroyed, why
    assert [a.kind for a in plan.of(core.Alert)] == alerts, why
    assert plan.waiting_orphans == waiting, why


def test_a_node_of_this_store_whose_launch_is_lost_is_adopted_into_its_domain() -> None:
    old = Sighting("s", "o1", "x", "orphan", T - 5000, T - 300)  # seen by an older release as an orphan
    plan = core.reconcile(world([in_domain(node("o1", "x"), "alpha")], sightings=[old]), RULES)
    [adopt] = plan.of(core.AdoptFound)
    assert (adopt.instance_id, adopt.domain, adopt.node.cloud_id) == ("x", "alpha", "o1")
    assert plan.of(core.Forget) == [core.Forget("o1")] and plan.of(core.Sight) == []
    # a node whose launch the store knows is never "found": it is the record's
    plan = core.reconcile(world([in_domain(node("c1", "a"))], [rec("a", "started", "c1")]), RULES)
    assert plan.of(core.AdoptFound) == []


def test_first_sighting_is_remembered_and_kept_on_later_ones() -> None:
    plan = core.reconcile(world([node("o1", "x")], now=T), RULES)
    [sight] = plan.of(core.Sight)
    assert sight.sighting == Sighting("s", "o1", "x", "orphan", T, T)
    earlier = Sighting("s", "o1", "x", "orphan", T - 100, T - 50)
    plan = core.reconcile(world([node("o1", "x")], sightings=[earlier]), RULES)
    assert plan.of(core.Sight)[0].sighting.first_seen == T - 100


def test_sightings_survive_a_short_absence_and_are_forgotten_after_a_long_one() -> None:
    short = Sighting("s", "o1", "x", "orphan", T - 500, T - 100)
    long_gone = Sighting("s", "o2", "y", "orphan", T - 5000, T - 601)
    plan = core.reconcile(world([], sightings=[short, long_gone]), RULES)
    assert plan.of(core.Forget) == [core.Forget("o2")]


def test_sweep_cap_refuses_every_orphan_when_too_many_are_due() -> None:
    due = [Sighting("s", f"o{i}", f"x{i}", "orphan", T - 700, T - 300) for i in range(3)]
    plan = core.reconcile(world([node(f"o{i}", f"x{i}") for i in range(3)], sightings=due), RULES)
    assert plan.of(core.Destroy) == []
    [alert] = plan.of(core.Alert)
    assert alert.kind == "orphan-sweep-refused" and alert.count == 3 and "destroying none" in alert.message
    assert sorted(plan.withheld) == ["o0", "o1", "o2"]


def test_sweep_cap_defers_closed_launches_beyond_it() -> None:
    records = [rec(f"a{i}", "terminated", f"c{i}") for i in range(3)]
    orphan = Sighting("s", "o1", "x", "orphan", T - 700, T - 300)
    plan = core.reconcile(world([node(f"c{i}", f"a{i}") for i in range(3)] + [node("o1", "x")], records,
                                sightings=[orphan]), RULES)
    assert [d.cloud_id for d in plan.of(core.Destroy)] == ["c0", "c1"]  # ours first, within the cap
    [alert] = plan.of(core.Alert)
    assert alert.kind == "destroy-deferred" and alert.count == 2 and plan.withheld == ["c2", "o1"]


def test_cap_zero_destroys_nothing() -> None:
    plan = core.reconcile(world([node("c1", "a")], [rec("a", "terminated", "c1")]), replace(RULES, max_destroys=0))
    assert plan.of(core.Destroy) == [] and plan.of(core.Alert)[0].kind == "destroy-deferred"


def test_a_failed_launchs_live_node_is_reopened_in_the_state_the_cloud_shows_never_destroyed() -> None:
    """Issue 26, defect 6: a create that took effect but whose answer was lost, then API errors
    until the retries ran out, leaves a ``failed`` record and a live node that may have joined
    the batch system by itself (an HTCondor startd does). The engine decides, not the listing."""
    for listed, state in ((node("c1", "a"), "started"), (node("c1", "a", "pending"), "pending"),
                          (node("c1", "a", "failed"), "pending")):
        plan = core.reconcile(world([listed], [rec("a", "failed")]), RULES)
        assert plan.of(core.Destroy) == []
        assert plan.of(core.Reopen) == [core.Reopen("a", listed, state)]
    # nor is it destroyed when its record had seen it (closed failed, listed alive again)
    plan = core.reconcile(world([node("c1", "a")], [rec("a", "failed", "c1")]), RULES)
    assert plan.of(core.Destroy) == [] and [r.state for r in plan.of(core.Reopen)] == ["started"]


# --------------------------------------------------------------------------- reconcile: adopt and re-drive

REDRIVE = [
    ("known launch, untracked node: adopted", [node("c1", "a")], [rec("a", "requested", None)], (), ["Adopt"]),
    ("... unless its launch is in flight here", [node("c1", "a")], [rec("a", "requested", None)], ("launch:a",), []),
    ("terminating, untracked node: adopted (then terminated)", [node("c1", "a")], [rec("a", "terminating", None)],
     (), ["Adopt", "ResumeTerminate"]),
    ("requested and stalled: re-driven", [], [rec("a", "requested", None, updated=T - 30)], (), ["ResumeLaunch"]),
    ("requested, recent: left alone", [], [rec("a", "requested", None, updated=T - 29)], (), []),
    ("terminating, node live: destroy re-driven", [node("c1", "a")], [rec("a", "terminating", "c1")], (),
     ["ResumeTerminate"]),
    ("terminating, destroy in flight: left alone", [node("c1", "a")], [rec("a", "terminating", "c1")],
     ("terminate:a",), []),
    ("terminating, node already terminated: followed, not re-driven", [node("c1", "a", "terminated")],
     [rec("a", "terminating", "c1")], (), ["Follow"]),
]


@pytest.mark.parametrize("why,listed,records,busy,expected", REDRIVE, ids=[r[0] for r in REDRIVE])
def test_adopt_and_redrive(why, listed, records, busy, expected) -> None:
    assert kinds(core.reconcile(world(listed, records, busy=busy), RULES)) == expected, why


def test_a_record_closed_in_this_round_is_not_redriven() -> None:
    plan = core.reconcile(world([], [rec("a", "terminating", "c1")], [miss("a", 2, T - 60)]), RULES)
    assert kinds(plan) == ["CloseGone", "ClearMiss"]


# --------------------------------------------------------------------------- the defect, as a sequence

def test_one_partial_listing_never_leads_to_a_destroy() -> None:
    """Issue 11: reconcile closed a record at the first listing that missed its node, and the next
    reconcile destroyed the live node because its record was terminal. Replay that sequence through
    the pure core, carrying the memory from round to round the way the shell does."""
    record = rec("a", "started", "c1")
    misses: dict[str, Miss] = {}
    for i, listed in enumerate([[], [node("c1", "a")], [], [], [node("c1", "a")]]):
        t = T + 300 * i
        plan = core.reconcile(world(listed, [record], misses.values(), listed_at=t, now=t), RULES)
        assert plan.of(core.Destroy) == [] and plan.of(core.CloseGone) == []
        for a in plan.actions:
            if isinstance(a, core.CountMiss):
                misses[a.miss.instance_id] = a.miss
            elif isinstance(a, core.ClearMiss):
                misses.pop(a.instance_id, None)
    assert misses == {}


def test_misses_of_records_no_longer_watched_are_forgotten() -> None:
    plan = core.observe(world([], [rec("a", "terminated", "c1")], [miss("a", 2, T - 30), miss("gone", 1, T)]), RULES)
    assert plan.actions == [core.ClearMiss("a"), core.ClearMiss("gone")]


@pytest.mark.parametrize("extra, preempted", [
    ({"reason": "Server.SpotInstanceTermination: Spot instance termination"}, True),
    ({"state_reason": {"code": "Server.SpotInstanceTermination"}}, True),
    ({"scheduling": {"preemptible": True}}, True),
    ({"preempted": True}, True),
    ({"reason": "User initiated (2026-11-23 03:00:00 GMT)"}, False),
    ({"scheduling": {"preemptible": False}}, False),
    (None, False),
])
def test_a_listing_says_when_the_cloud_preempted_the_node(extra, preempted) -> None:
    from epu.services.provisioner.cloud import preempted_by_cloud, to_cloud_node
    from libcloud.compute.base import Node
    from libcloud.compute.types import NodeState

    assert preempted_by_cloud(extra) is preempted
    ended = to_cloud_node(Node("c1", "n", NodeState.TERMINATED, [], [], None, extra=extra))
    running = to_cloud_node(Node("c1", "n", NodeState.RUNNING, [], [], None, extra=extra))
    assert ended.preempted is preempted and running.preempted is False


@pytest.mark.parametrize("extra, at", [
    ({"interruption_at": 1_800_000_120.0}, 1_800_000_120.0),
    ({"interruption_at": "1800000120"}, 1_800_000_120.0),
    ({"interruption_at": None}, None),
    ({"interruption_at": True}, None),
    ({"interruption_at": "soon"}, None),
    ({}, None),
    (None, None),
])
def test_a_listing_says_when_the_cloud_will_reclaim_a_live_node(extra, at) -> None:
    from epu.services.provisioner.cloud import interruption_notice, to_cloud_node
    from libcloud.compute.base import Node
    from libcloud.compute.types import NodeState

    assert interruption_notice(extra) == at
    running = to_cloud_node(Node("c1", "n", NodeState.RUNNING, [], [], None, extra=extra))
    ended = to_cloud_node(Node("c1", "n", NodeState.TERMINATED, [], [], None, extra=extra))
    assert running.interruption_at == at and ended.interruption_at is None


def test_the_provisioner_tells_the_engine_of_a_notice_once(make_provisioner) -> None:
    """A poll that lists a tracked node with an interruption notice publishes one event with
    ``interruption_at``, the record's state and seq unchanged; later polls do not repeat it."""
    from epu.common.messages import LaunchRequest
    from epu.services.provisioner.sim import SimulatedNodeDriver

    driver = SimulatedNodeDriver()
    prov, events = make_provisioner({"s": driver})
    prov.handle_launch(LaunchRequest(launch_id="L1", domain="d", site="s", node_name="w1"))
    assert prov.wait_idle(10)
    prov.poll("s")
    rec = prov.store.get("L1")
    site = prov.sites["s"]
    real_nodes = site.nodes

    def with_notice() -> list[CloudNode]:
        return [replace(n, interruption_at=T + 120) if n.launch_id == "L1" else n for n in real_nodes()]

    site.nodes = with_notice
    before = len(events.items)
    prov.poll("s")
    prov.poll("s")
    told = [e for e in events.items[before:] if e.interruption_at is not None]
    assert len(told) == 1
    (evt,) = told
    assert (evt.instance_id, evt.state, evt.seq, evt.interruption_at) == ("L1", rec.state, rec.seq, T + 120)
    assert evt.reason.startswith("interruption notice from the cloud")
    assert prov.store.get("L1").seq == rec.seq  # nothing stored


# --------------------------------------------------------------------------- the quiet poll


def test_a_quiet_pair_is_exactly_one_present_plans_nothing_for() -> None:
    """``observe`` answers the common pair (a listed node that moves its record nowhere) without
    ``_present``: over every record state, node state, address, presumption, miss and notice,
    ``_quiet`` never holds when ``_present`` would plan something — so skipping it is exact — and
    holds whenever it would plan nothing, but for a node with a notice (rare; always judged)."""
    from itertools import product

    from epu.services.provisioner.reconcile import _present, _quiet

    states = ["requested", "pending", "started", "joined", "draining", "terminating"]
    for (rstate, nstate, rip, nip, presumed, missed, notice) in product(
            states, [*states, "terminated", "failed", None], ["10.0.0.1", None], ["10.0.0.1", "10.0.0.2", None],
            [None, T - 50], [False, True], [None, T + 120]):
        r = rec("a", rstate, "c1", presumed=presumed, ip=rip)
        n = replace(node("c1", "a", nstate, ip=nip), interruption_at=notice)
        misses = {"a": miss("a", 1, T - 15)} if missed else {}
        w = world([n], [r], misses.values())
        plan = core.Plan()
        _present(plan, w, RULES, r, n)
        case = (rstate, nstate, rip, nip, presumed, missed, notice)
        if _quiet(r, n, w.misses):
            assert plan.actions == [], case  # never skips a thing to do
        elif notice is None:
            assert plan.actions != [], case  # and without a notice (rare: always judged) skips all else


def test_a_poll_is_steady_only_when_every_node_is_listed_and_nothing_is_to_do() -> None:
    quiet = [rec("a", "joined", "c1"), rec("b", "started", "c2")]
    listed = [node("c1", "a"), node("c2", "b")]
    assert core.observe(world(listed, quiet), RULES).steady
    assert not core.observe(world(listed[:1], quiet), RULES).steady  # b not listed: a miss
    assert not core.observe(world(listed, [rec("a", "pending", "c1"), quiet[1]]), RULES).steady  # a moves on
    assert not core.observe(world(listed, quiet, [miss("a", 1, T - 15)]), RULES).steady  # a miss to clear


class _SameNodes:
    """A driver that hands back the same ``Node`` object while a node is unchanged (as the
    simulators' clouds do), and can hide nodes from its listings."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.hidden: set[str] = set()
        self._last: dict[str, object] = {}

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def list_nodes(self, *args, **kwargs):
        out = []
        for n in self.inner.list_nodes():
            key = (n.state, tuple(n.public_ips), tuple(n.private_ips))
            last = self._last.get(n.id)
            if last is not None and last[0] == key:
                n = last[1]
            self._last[n.id] = (key, n)
            if n.id not in self.hidden:
                out.append(n)
        return out


def test_every_poll_observes_and_every_miss_is_counted(tmp_path, monkeypatch) -> None:
    """Every poll runs ``observe``, steady or not (the service skips none: its store and real
    drivers hand out new objects, so nothing cheap could tell it that nothing changed); a node
    gone from the listing is a miss on every poll and presumed gone at the 5th. A driver that
    hands back the very same Nodes changes nothing of that."""
    from epu.common.clock import ManualClock
    from epu.common.messages import LaunchRequest
    from epu.services.provisioner import provisioner as pmod
    from epu.services.provisioner.cloud import LibcloudSite
    from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings
    from epu.services.provisioner.sim import SimulatedNodeDriver

    from epu.sim.provisioner_memstore import MemoryStore
    from tests.provisioner.conftest import FAST_RETRY, Events, site_config

    observed = []
    real_observe = core.observe
    monkeypatch.setattr(pmod.core, "observe", lambda w, r: observed.append(w.listed_at) or real_observe(w, r))
    clock = ManualClock()
    driver = _SameNodes(SimulatedNodeDriver(path=str(tmp_path / "c.db"), boot_time_min=10, boot_time_max=10,
                                            clock=clock, seed=1))
    prov = Provisioner(MemoryStore(), {"s": LibcloudSite("s", site_config(), driver, "epu")}, Events(), clock=clock,
                       settings=ProvisionerSettings(deployment="epu", retry=FAST_RETRY, vanish_misses=3,
                                                    vanish_min_seconds=60))
    try:
        for lid in ("L1", "L2"):
            prov.handle_launch(LaunchRequest(launch_id=lid, domain="d", site="s", node_name=lid))
        assert prov.wait_idle(10)
        trace = []
        for i in range(12):
            clock.advance(15)
            if i == 4:
                driver.hidden.add(prov.store.get("L2").cloud_id)
            prov.poll("s")
            misses = prov.store.misses("s")
            trace.append((i, prov.store.get("L1").state, prov.store.get("L2").presumed_gone,
                          misses["L2"].count if "L2" in misses else 0))
    finally:
        prov.shutdown(wait=True)
    assert [t[3] for t in trace] == [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]  # a miss on every poll it is absent
    assert [t[2] for t in trace] == [False] * 8 + [True] * 4  # 3 misses and 60 s: at the 5th miss
    assert all(t[1] == "started" for t in trace)
    assert len(observed) == 12
