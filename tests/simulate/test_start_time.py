"""The start-time policy on hand-made views (docs/policies.md's example and its edges)."""

from __future__ import annotations

import pytest
from epu.common.messages import JobShape, NodeInfo, SensorSnapshot
from epu.services.decision.policies import PolicyError, validate_params
from epu.services.decision.policies.start_time import Supply, decide
from epu.services.decision.view import Instance, build_view

NOW = 1_000_000.0


def _view(job_end_in: float | None, queued: int = 2, limit: int = 0, memory: dict | None = None,
          instances: list[Instance] | None = None, nodes: list[NodeInfo] | None = None):  # type: ignore[no-untyped-def]
    nodes = nodes if nodes is not None else [
        NodeInfo(name="a", state="free", cores=1),
        NodeInfo(name="b", state="busy", cores=1, cores_used=1, jobs=["7"],
                 job_ends=[NOW + job_end_in] if job_end_in is not None else [0.0])]
    shapes = [JobShape(count=queued, nodes=1, cores=1, time_limit_s=limit, max_wait_s=30.0)] if queued else []
    snap = SensorSnapshot(domain="d", backend="simulated", taken_at=NOW, available=True, nodes=nodes, shapes=shapes)
    return build_view("d", snap, None, instances or [], NOW, min_nodes=0, max_nodes=10, cores_per_node=1,
                      memory=memory or {"boot": {"cloud": [180.0, 3]}})


def _launches(view) -> int:  # type: ignore[no-untyped-def]
    d = decide(view, validate_params("start-time", {"experimental": True}), NOW)
    return sum(1 for a in d.actions if a.kind == "launch")


def test_waits_for_a_node_that_frees_up_before_a_boot() -> None:
    assert _launches(_view(60.0)) == 0  # queue-demand would launch 1
    assert _launches(_view(600.0)) == 1  # a boot (180 s) is sooner
    assert _launches(_view(None)) == 1  # no time limit: never free, as queue-demand


def test_booked_jobs_hold_the_supply() -> None:
    # three queued jobs of 100 s limits: the free node takes the first, then the busy node frees at +60
    # and takes the second; the third could start at +100 on the first node (< +180): no launch
    assert _launches(_view(60.0, queued=3, limit=100)) == 0
    # with 1000 s limits the third one would wait until +1000: one launch
    assert _launches(_view(60.0, queued=3, limit=1000)) == 1


def test_booting_instances_count_at_their_measured_boot() -> None:
    booting = Instance("i-1", "d", "cloud", "d-i1", 1, "pending", NOW - 170.0, NOW - 170.0)
    # the free node and the instance (ready in 10 s) take one job each; a third needs a launch
    assert _launches(_view(None, queued=2, instances=[booting])) == 0
    assert _launches(_view(None, queued=3, instances=[booting])) == 1


def test_measured_boot_time_is_the_threshold() -> None:
    slow = {"boot": {"cloud": [900.0, 5]}}
    assert _launches(_view(600.0, memory=slow)) == 0  # waiting 600 s beats a 900 s boot


def test_no_demand_no_launch_and_idle_nodes_kept_one_boot_time() -> None:
    joined = Instance("i-2", "d", "cloud", "a", 1, "joined", NOW - 900, NOW - 900, joined_at=NOW - 800,
                      idle_since=NOW - 100)
    view = _view(None, queued=0, instances=[joined], nodes=[NodeInfo(name="a", state="free", cores=1,
                                                                     instance_id="i-2")],
                 memory={"boot": {"cloud": [180.0, 3]}, "demand_at": NOW - 60})
    d = decide(view, validate_params("start-time", {"experimental": True}), NOW)
    assert not [a for a in d.actions if a.kind in ("launch", "offline")]  # idle 100 s < one boot (180 s)
    later = _view(None, queued=0, instances=[joined], nodes=[NodeInfo(name="a", state="free", cores=1,
                                                                      instance_id="i-2")],
                  memory={"boot": {"cloud": [60.0, 3]}, "demand_at": NOW - 60})  # boots take 60 s now
    d = decide(later, validate_params("start-time", {"experimental": True}), NOW)
    assert [a.kind for a in d.actions] == ["offline"]


def test_supply_books_cores_until_the_limit() -> None:
    s = Supply()
    s.add(2, [0.0, 50.0])
    s.add(1, [10.0])
    assert s.earliest(2, 1) == (50.0, [0])
    assert s.earliest(1, 2) == (10.0, [0, 1])
    s.book([0], 1, 0.0, 100.0)
    assert s.earliest(1, 1) == (10.0, [1]) and s.earliest(2, 1) == (100.0, [0])


def test_margin_hedges_towards_launching() -> None:
    view = _view(150.0, queued=2)  # the busy node frees 30 s before a 180 s boot would be ready
    hedged = decide(view, validate_params("start-time", {"experimental": True}), NOW)  # default margin 60 s
    assert sum(1 for a in hedged.actions if a.kind == "launch") == 1
    trusting = decide(view, validate_params("start-time", {"margin_seconds": 0, "experimental": True}), NOW)
    assert sum(1 for a in trusting.actions if a.kind == "launch") == 0


def test_refused_on_a_real_domain_unless_marked_experimental() -> None:
    """It did not clear the issue's bar (docs/experiments.md): a domain must opt in knowingly."""
    with pytest.raises(PolicyError, match="start-time is experimental.*experimental=true"):
        validate_params("start-time", {})
