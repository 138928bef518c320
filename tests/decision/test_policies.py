"""Table-driven tests pinning each policy's arithmetic (pure: no broker, no store)."""

from __future__ import annotations

import pytest
from epu.services.decision.policies import POLICIES, PolicyError, validate_params

from tests.decision.helpers import T0, counts, inst, jobs, kinds, node, view

QD = POLICIES["queue-demand"]


def qd(v, **params):
    return QD.decide(v, validate_params("queue-demand", params), v.now)


# ---------------------------------------------------------------- queue-demand: the paper's formula
# launch = cores requested by queued jobs − (free workers + pending instances)
PAPER = [
    # (queued 1-core jobs, free workers, pending instances, expected launches)
    (10, 0, 0, 10),
    (10, 2, 3, 5),   # 10 − (2 + 3)
    (3, 3, 0, 0),    # free workers absorb the queue
    (2, 0, 5, 0),    # never negative: pending instances already cover it
    (7, 1, 1, 5),
    (0, 4, 0, 0),
]


@pytest.mark.parametrize(("queued", "free", "pending", "expected"), PAPER)
def test_queue_demand_paper_formula(queued, free, pending, expected):
    pend = [inst(f"p{i}", "pending", launched_at=T0 - 60) for i in range(pending)]
    v = view(queued=jobs(queued), nodes=[node(f"static{i}") for i in range(free)], instances=pend)
    assert counts(qd(v)).get("launch", 0) == expected


@pytest.mark.parametrize(("shape", "node_cores", "free_nodes", "expected"), [
    ((1, 4, 2), 8, [8], 3),     # 1 job of 4 nodes x 2 cores; one free 8-core node holds only one of its 4
    ((1, 4, 2), 8, [], 4),      # N nodes x M cores → N nodes, not ceil(8/8)=1
    ((4, 1, 3), 4, [], 4),      # 3-core jobs on 4-core nodes: one per node
    ((8, 1, 1), 4, [], 2),      # 1-core jobs pack 4 per node
    ((2, 3, 1), 2, [2, 2], 1),  # 2 jobs x 3 nodes x 1 core, 2-core nodes: both share f0, f1 and 1 new
    ((3, 1, 16), 8, [], 0),     # bigger than any node: never satisfiable, no launch
])
def test_queue_demand_multi_node_jobs(shape, node_cores, free_nodes, expected):
    n_jobs, nodes_per_job, cores = shape
    v = view(queued=jobs(n_jobs, cores=cores, nodes=nodes_per_job),
             nodes=[node(f"f{i}", cores=c) for i, c in enumerate(free_nodes)], cores=node_cores)
    d = qd(v)
    assert counts(d).get("launch", 0) == expected
    if expected:
        assert all(a.cores == node_cores for a in d.actions if a.kind == "launch")


def test_queue_demand_stalled_instance_replaced_at_ten_minutes():
    stuck = inst("s", "pending", launched_at=T0 - 600)
    young = inst("y", "pending", launched_at=T0 - 599)
    d = qd(view(queued=jobs(2), instances=[stuck, young]))
    assert ("terminate", "s") in kinds(d)
    assert ("terminate", "y") not in kinds(d)
    assert counts(d)["launch"] == 1  # the stalled one no longer counts as pending: replaced now
    # at 599 s nothing happens yet
    d = qd(view(queued=jobs(2), instances=[inst("s", "pending", launched_at=T0 - 599), young]))
    assert counts(d) == {}


def test_queue_demand_stall_timeout_is_configurable():
    d = qd(view(queued=jobs(1), instances=[inst("s", "started", launched_at=T0 - 301, add_sent_at=T0 - 200)]),
           stall_seconds=300)
    # it was added: remove it first; terminated only once the sensor confirmed the removal
    assert kinds(d)[:1] == [("remove", "s")] and ("terminate", "s") not in kinds(d)
    assert counts(d)["launch"] == 1


def test_queue_demand_iteration_order_launch_add_offline_terminate():
    v = view(queued=[], nodes=[node("n-idle"), node("n-gone", "offline")],
             instances=[inst("new", "started", launched_at=T0 - 10),
                        inst("idle", "joined", idle_since=T0 - 5),
                        inst("gone", "draining", removed=True)],
             min_nodes=3)
    d = qd(v)
    assert [a.kind for a in d.actions] == ["launch", "add", "terminate"]  # idle kept: min_nodes
    v.min_nodes = 0
    d = qd(v)
    assert [a.kind for a in d.actions] == ["add", "offline", "terminate"]


@pytest.mark.parametrize(("queued", "idle_for", "idle_seconds", "min_nodes", "offlined"), [
    (0, 5, 0, 0, 2),      # paper: idle workers offlined at once when the queue is empty
    (1, 5, 0, 0, 0),      # a queued job will use them: keep
    (0, 5, 60, 0, 0),     # not idle long enough
    (0, 61, 60, 0, 2),
    (0, 61, 60, 1, 1),    # min_nodes floor
])
def test_queue_demand_offline_idle(queued, idle_for, idle_seconds, min_nodes, offlined):
    v = view(queued=jobs(queued), nodes=[node("n-a"), node("n-b")],
             instances=[inst("a", idle_since=T0 - idle_for), inst("b", idle_since=T0 - idle_for)],
             min_nodes=min_nodes)
    assert counts(qd(v, idle_seconds=idle_seconds)).get("offline", 0) == offlined


def test_queue_demand_draining_node_needed_again_is_put_back_online():
    v = view(queued=jobs(2), nodes=[node("n-a", "offline")], instances=[inst("a", "draining")])
    d = qd(v)
    assert ("online", "a") in kinds(d)
    assert counts(d)["launch"] == 1


def test_queue_demand_drain_sequence():
    busy = node("n-a", "offline", used=1, jobs_=["42"])
    assert counts(qd(view(nodes=[busy], instances=[inst("a", "draining")]))) == {}
    done = node("n-a", "offline")
    assert kinds(qd(view(nodes=[done], instances=[inst("a", "draining")]))) == [("remove", "a")]
    assert kinds(qd(view(nodes=[], instances=[inst("a", "draining", removed=True)]))) == [("terminate", "a")]


@pytest.mark.parametrize(("queued", "active", "min_nodes", "max_nodes", "expected"), [
    (20, 0, 0, 10, 10),
    (20, 8, 0, 10, 2),
    (20, 10, 0, 10, 0),
    (0, 0, 2, 10, 2),
    (1, 0, 3, 10, 3),
])
def test_queue_demand_min_max(queued, active, min_nodes, max_nodes, expected):
    busy = [inst(f"b{i}") for i in range(active)]
    nodes = [node(f"n-b{i}", "busy", used=1, jobs_=[str(i)]) for i in range(active)]
    v = view(queued=jobs(queued), nodes=nodes, instances=busy, min_nodes=min_nodes, max_nodes=max_nodes)
    assert counts(qd(v)).get("launch", 0) == expected


# ---------------------------------------------------------------- threshold (elastiq)
TH = POLICIES["threshold"]


@pytest.mark.parametrize(("waiting", "above_for", "pending", "expected"), [
    (10, 40, 0, 3),    # ceil(10 / 4)
    (10, 39, 0, 0),    # not long enough above the threshold
    (10, 40, 2, 1),    # minus instances already on their way
    (4, 100, 0, 1),
    (0, 100, 0, 0),
])
def test_threshold_launches(waiting, above_for, pending, expected):
    memory = {"above_since": T0 - above_for}
    pend = [inst(f"p{i}", "pending", launched_at=T0 - 1) for i in range(pending)]
    v = view(queued=jobs(waiting), instances=pend, memory=memory)
    d = TH.decide(v, validate_params("threshold", {}), T0)
    assert counts(d).get("launch", 0) == expected


def test_threshold_timer_starts_and_resets():
    d = TH.decide(view(queued=jobs(3)), validate_params("threshold", {}), T0)
    assert d.memory == {"above_since": T0} and counts(d) == {}
    d = TH.decide(view(queued=[], memory={"above_since": T0}), validate_params("threshold", {}), T0)
    assert "above_since" not in d.memory


@pytest.mark.parametrize(("idle_for", "expected"), [(3599, 0), (3600, 1)])
def test_threshold_idle_drain(idle_for, expected):
    v = view(nodes=[node("n-a")], instances=[inst("a", idle_since=T0 - idle_for)])
    assert counts(TH.decide(v, validate_params("threshold", {}), T0)).get("offline", 0) == expected


# ---------------------------------------------------------------- spare (CLUES)
SP = POLICIES["spare"]


@pytest.mark.parametrize(("age", "period", "expected_offline"), [
    (1800, 3600, 0),    # half-way through its paid hour: kept
    (3360, 3600, 1),    # 4 minutes before the hour ends: released
    (3600 + 1800, 3600, 0),
    (1800, 0, 1),       # per-second billing: released once idle
])
def test_spare_billing_period(age, period, expected_offline):
    spare = {"spare_nodes": 0, "idle_seconds": 300, "billing_period_seconds": period}
    v = view(nodes=[node("n-a")], instances=[inst("a", launched_at=T0 - age, idle_since=T0 - 600)])
    assert counts(SP.decide(v, validate_params("spare", spare), T0)).get("offline", 0) == expected_offline


@pytest.mark.parametrize(("queued", "idle", "spare", "expected"), [
    (0, 0, 2, 2),   # keep two spare nodes
    (0, 1, 2, 1),
    (3, 0, 1, 4),   # queue demand plus the spare
    (0, 3, 1, 0),
])
def test_spare_launches(queued, idle, spare, expected):
    insts = [inst(f"i{i}", idle_since=T0 - 10) for i in range(idle)]
    v = view(queued=jobs(queued), nodes=[node(f"n-i{i}") for i in range(idle)], instances=insts)
    d = SP.decide(v, validate_params("spare", {"spare_nodes": spare}), T0)
    assert counts(d).get("launch", 0) == expected


# ---------------------------------------------------------------- load (AutoElastic)
LD = POLICIES["load"]


@pytest.mark.parametrize(("samples", "used", "expected"), [
    ([0.95, 0.95], 2, {"launch": 1}),      # average (0.95, 0.95, 1.0) > 0.9
    ([0.1, 0.1], 0, {"offline": 1}),       # average 0.067 < 0.3: one idle node out
    ([0.95, 0.1], 1, {}),                  # (0.95 + 0.1 + 0.5) / 3 = 0.52: between thresholds
])
def test_load_moving_average(samples, used, expected):
    mem = {"samples": [[T0 - 10 * (i + 1), u] for i, u in enumerate(samples)]}
    nodes = [node("n-a", "busy" if used >= 1 else "free", used=min(used, 1), jobs_=["1"] if used >= 1 else []),
             node("n-b", "busy" if used >= 2 else "free", used=1 if used >= 2 else 0, jobs_=["2"] if used >= 2 else [])]
    insts = [inst("a", idle_since=None if used >= 1 else T0 - 5), inst("b", idle_since=None if used >= 2 else T0 - 5)]
    d = LD.decide(view(nodes=nodes, instances=insts, memory=mem), validate_params("load", {}), T0)
    assert counts(d) == expected


def test_load_window_drops_old_samples():
    mem = {"samples": [[T0 - 400, 1.0], [T0 - 10, 0.5]]}
    d = LD.decide(view(nodes=[node("n-a", "busy", used=1, jobs_=["1"])], instances=[inst("a")], memory=mem),
                  validate_params("load", {"window_seconds": 300}), T0)
    assert [t for t, _ in d.memory["samples"]] == [T0 - 10, T0]


def test_load_rejects_inverted_thresholds():
    with pytest.raises(PolicyError, match="lower"):
        validate_params("load", {"upper": 0.3, "lower": 0.5})


# ---------------------------------------------------------------- fixed
FX = POLICIES["fixed"]


@pytest.mark.parametrize(("nodes", "active", "max_nodes", "expected"), [
    (3, 1, 10, {"launch": 2}),
    (3, 3, 10, {}),
    (1, 3, 10, {"offline": 2}),
    (20, 0, 5, {"launch": 5}),
])
def test_fixed(nodes, active, max_nodes, expected):
    insts = [inst(f"i{i}", idle_since=T0 - 1) for i in range(active)]
    v = view(nodes=[node(f"n-i{i}") for i in range(active)], instances=insts, max_nodes=max_nodes)
    assert counts(FX.decide(v, validate_params("fixed", {"nodes": nodes}), T0)) == expected


# ---------------------------------------------------------------- schemas
@pytest.mark.parametrize(("policy", "params", "error"), [
    ("queue-demand", {"idle_secnds": 3}, "unknown parameter"),
    ("threshold", {"jobs_per_vm": 0}, "greater than or equal to 1"),
    ("nope", {}, "unknown policy"),
])
def test_params_schema_rejects(policy, params, error):
    with pytest.raises(PolicyError, match=error):
        validate_params(policy, params)


def test_params_defaults():
    assert validate_params("queue-demand", {}).stall_seconds == 600
    assert validate_params("threshold", {}).jobs_per_vm == 4
    assert validate_params("spare", {}).billing_period_seconds == 3600


@pytest.mark.parametrize(("node_state", "missing_for", "expected"), [
    # lost: removed first (the batch system confirms it is gone, or refuses: a job runs there),
    # terminated only after that; replaced at once
    (None, 600, [("remove", "a"), ("launch", "")]),
    ("down", 600, [("remove", "a"), ("launch", "")]),
    ("down", 599, [("launch", "")]),                           # not yet: only the queue launches
])
def test_lost_joined_instance_is_replaced(node_state, missing_for, expected):
    nodes = [node("n-a", node_state)] if node_state else []
    v = view(queued=jobs(1), nodes=nodes, instances=[inst("a", missing_since=T0 - missing_for)])
    assert kinds(qd(v)) == expected


def test_refresh_sets_missing_since_only_on_available_snapshots():
    from epu.services.decision.census import refresh

    a = inst("a")
    (got,) = refresh([a], {}, T0, True)
    assert got.missing_since == T0
    (got,) = refresh([a], {}, T0, False)
    assert got.missing_since is None
    (got,) = refresh([got], {"n-a": node("n-a", "busy", used=1, jobs_=["1"])}, T0 + 5, True)
    assert got.missing_since is None
