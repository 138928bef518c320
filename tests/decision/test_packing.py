"""Cheapest fit (services/decision/packing.py): tables, then properties against an exhaustive solver."""

from __future__ import annotations

import pytest
from epu.common.messages import JobShape, NodeInfo
from epu.services.decision.packing import (
    MICRO,
    Bin,
    Offer,
    _one_bin,
    _requests,
    _sequence,
    bin_of_offer,
    bins_from_nodes,
    drainable,
    pack,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.support.packing_oracle import cap_of, feasible, job_of, optimum, servable


def offer(type_: str, cores: int, price: float, *, site: str = "s1", memory: int | None = None, gpus: int = 0,
          features: tuple[str, ...] = (), partitions: tuple[str, ...] | None = None, room: int = 100,
          spot: bool = False) -> Offer:
    return Offer(site, type_, cores, memory, gpus, frozenset(features),
                 None if partitions is None else frozenset(partitions), price, spot, room)


def job(count: int = 1, **kw) -> JobShape:
    return JobShape(count=count, **kw)


CPU = offer("c-small", 2, 0.10, memory=4000, partitions=("cpu",))
CPU_BIG = offer("c-large", 16, 0.60, memory=32000, partitions=("cpu",))
BIGMEM = offer("r-large", 8, 1.00, memory=512000, features=("bigmem",), partitions=("bigmem",))
GPU = offer("p-gpu", 8, 3.00, memory=61000, gpus=1, features=("gpu", "v100"), partitions=("gpu",))
CATALOGUE = [CPU, CPU_BIG, BIGMEM, GPU]


# ------------------------------------------------------------------------------------------ tables


def test_each_partition_gets_its_own_type():
    plan = pack([job(1, cores=4, memory_mb=400000, partition="bigmem", features=["bigmem"]),
                 job(2, gpus=1, partition="gpu"),
                 job(3, cores=1, memory_mb=1000, partition="cpu")], [], CATALOGUE)
    assert plan.by_type() == {"r-large": 1, "p-gpu": 2, "c-small": 2}
    assert not plan.unsatisfiable and not plan.unplaced


def test_the_cheapest_mix_not_just_the_cheapest_per_core():
    big = offer("big", 8, 0.5)
    small = offer("small", 1, 0.1)
    # 9 one-core jobs: one 8-core node and one 1-core node ($0.60), not two 8-core nodes ($1.00)
    # nor nine 1-core nodes ($0.90)
    plan = pack([job(9)], [], [big, small])
    assert plan.by_type() == {"big": 1, "small": 1}
    assert round(plan.cost_per_hour, 6) == 0.6
    # 100 jobs: 12 big + 4 small
    assert pack([job(100)], [], [big, small]).by_type() == {"big": 12, "small": 4}


def test_limit_blocked_and_held_jobs_never_launch_anything():
    shapes = [job(5, demand=False, reason="QOSMaxJobsPerUserLimit"), job(2, demand=False, reason="JobHeldUser")]
    plan = pack(shapes, [], CATALOGUE)
    assert plan.new_instances == 0 and not plan.unsatisfiable and plan.shapes == []


@pytest.mark.parametrize(("shape", "constraint", "text"), [
    (job(partition="debug"), "partition", "partition debug has no instance types"),
    (job(partition="cpu", features=["infiniband"]), "feature", "provides feature(s) infiniband"),
    (job(partition="gpu", gpus=4), "gpus", "needs 4 GPU(s) per node; the most any type for partition gpu has is 1"),
    (job(partition="bigmem", features=["bigmem"], memory_mb=2_000_000), "memory",
     "needs 2000000 MB per node; the most any type for partition bigmem has is 512000 MB"),
    (job(partition="cpu", cores=64), "cores", "needs 64 cores per node; the most any type for partition cpu has is 16"),
    (job(partition="cpu", cores=16, memory_mb=30000, nodes=2), None, None),
    (job(partition="cpu", cores=4, memory_mb=32001), "memory", "32000 MB"),
])
def test_unsatisfiable_jobs_are_reported_with_the_constraint_and_never_launched_for(shape, constraint, text):
    plan = pack([shape], [], CATALOGUE)
    if constraint is None:
        assert not plan.unsatisfiable and plan.new_instances == 2
        return
    (u,) = plan.unsatisfiable
    assert (u.constraint, u.jobs) == (constraint, 1) and text in u.reason
    assert plan.new_instances == 0


def test_a_combination_no_single_type_has():
    a = offer("many-cores", 16, 1.0, memory=4000)
    b = offer("much-memory", 2, 1.0, memory=64000)
    (u,) = pack([job(cores=8, memory_mb=32000)], [], [a, b]).unsatisfiable
    assert u.constraint == "combination"


def test_an_unsatisfiable_job_does_not_make_a_free_node_look_used():
    # a static 1 TB node is free; the 2 TB job cannot use any type, so the node stays unused
    node = Bin("fat01", 32, 1_000_000, rank=1)
    plan = pack([job(cores=4, memory_mb=2_000_000, partition="bigmem", features=["bigmem"])], [node], CATALOGUE)
    assert plan.unused_supply == {"fat01"} and plan.unsatisfiable[0].constraint == "memory"


def test_no_catalogue_means_every_job_is_unsatisfiable():
    (u,) = pack([job(3)], [], []).unsatisfiable
    assert u.jobs == 3 and "no instance types" in u.reason


def test_existing_supply_is_used_first_and_what_it_cannot_hold_is_launched():
    free = [Bin("n1", 2, 4000, partitions=frozenset({"cpu"}), rank=1),
            Bin("n2", 2, 4000, partitions=frozenset({"cpu"}), rank=1)]
    plan = pack([job(5, partition="cpu", memory_mb=1000)], free, [CPU])
    assert plan.by_type() == {"c-small": 1} and plan.used_supply == {"n1", "n2"} and plan.jobs_on_supply == 4
    # a free node of another partition or lacking memory does not count
    other = [Bin("g1", 8, 61000, 1, frozenset({"gpu"}), frozenset({"gpu"}), rank=1), Bin("tiny", 2, 500, rank=1)]
    plan = pack([job(4, partition="cpu", memory_mb=1000)], other, [CPU])
    assert plan.by_type() == {"c-small": 2} and plan.unused_supply == {"g1", "tiny"}


def test_pending_instances_count_as_supply_and_launch_nothing_more():
    shapes = [job(3, gpus=1, partition="gpu"), job(7, partition="cpu")]
    first = pack(shapes, [], CATALOGUE)
    pending = [bin_of_offer(f"i{k}", next(o for o in CATALOGUE if o.type == inst.type))
               for k, inst in enumerate(first.instances)]
    again = pack(shapes, pending, CATALOGUE)
    assert first.new_instances > 0 and again.new_instances == 0 and again.unused_supply == frozenset()


def test_multi_node_jobs_launch_gangs_on_distinct_instances():
    # 2 jobs × 4 nodes × 2 cores on 2-core instances: 8 instances, two gangs of 4
    plan = pack([job(2, nodes=4, cores=2, partition="cpu")], [], [CPU])
    assert plan.new_instances == 8
    assert sorted((g.jobs, len(g.instances), g.on_supply) for g in plan.gangs) == [(1, 4, 0), (1, 4, 0)]
    assert not set(plan.gangs[0].instances) & set(plan.gangs[1].instances)
    one_core = offer("one", 1, 0.05)
    four = offer("four", 4, 0.2)
    plan = pack([job(3, nodes=3)], [], [four])
    # 3 jobs × 3 nodes on 4-core nodes: 3 nodes, each with one chunk of each job (distinct per job)
    assert plan.new_instances == 3
    assert [(g.jobs, g.instances) for g in plan.gangs] == [(3, (0, 1, 2))]
    # part of a gang on a free node: the job's other nodes are the gang
    plan = pack([job(1, nodes=3)], [Bin("free1", 1, rank=1)], [one_core])
    assert plan.new_instances == 2 and [(g.jobs, len(g.instances), g.on_supply) for g in plan.gangs] == [(1, 2, 1)]


def test_the_counterexample_of_the_old_greedy_still_holds():
    # demand.py's pinned case: 2 jobs of 3 nodes × 1 core, a free 2-core node, 2-core new nodes → 2
    two = offer("two", 2, 1.0)
    assert pack([job(2, nodes=3)], [Bin("f", 2)], [two]).new_instances == 2
    assert pack([job(2, nodes=3)], [Bin("f", 2), Bin("g", 1)], [two]).new_instances == 2


def test_type_quota_overflows_to_the_next_offer_and_the_rest_is_unplaced():
    cheap = offer("cheap", 4, 0.1, room=2)
    dear = offer("dear", 4, 0.3, site="s2", room=1)
    plan = pack([job(16)], [], [cheap, dear])
    assert plan.by_type() == {"cheap": 2, "dear": 1}
    (u,) = plan.unplaced
    assert u.jobs == 4 and "quota" in u.reason


def test_site_quota_is_shared_by_its_types():
    a = offer("a", 4, 0.1, room=5)
    b = offer("b", 4, 0.2, room=5)
    c = offer("c", 4, 0.3, site="s2", room=5)
    plan = pack([job(24)], [], [a, b, c], site_room={"s1": 3})
    assert sum(n for line in plan.lines for s, _t, n in line.allocation if s == "s1") <= 3
    assert plan.by_type() == {"a": 3, "c": 3}


def test_max_new_caps_the_launches():
    plan = pack([job(10)], [], [offer("one", 1, 0.1)], max_new=4)
    assert plan.new_instances == 4 and plan.unplaced[0].jobs == 6


def test_a_gang_that_does_not_fit_the_room_is_not_launched_in_part():
    plan = pack([job(1, nodes=3)], [], [offer("one", 1, 0.1, room=2)])
    assert plan.new_instances == 0 and plan.unplaced[0].jobs == 1


def test_equal_offers_at_two_sites_are_one_line_for_placement_to_split():
    a = offer("m", 4, 0.2, site="east", room=1)
    b = offer("m", 4, 0.2, site="west", room=5)
    plan = pack([job(12)], [], [a, b])
    (line,) = plan.lines
    assert line.count == 3 and [o.site for o in line.offers] == ["east", "west"]
    assert line.allocation == (("east", "m", 1), ("west", "m", 2))


def test_default_partition_and_partition_lists():
    plan = pack([job(2), job(1, partition="gpu,cpu")], [], [CPU, GPU], default_partition="cpu")
    assert plan.by_type() == {"c-small": 1} or plan.by_type() == {"c-small": 2}
    assert not plan.unsatisfiable


def test_unknown_memory_is_not_a_constraint():
    legacy = offer("legacy", 4, 0.1)  # a single-type site without memory_mb
    plan = pack([job(1, memory_mb=100000)], [], [legacy])
    assert plan.new_instances == 1
    node = bins_from_nodes([NodeInfo(name="n", state="free", cores=4)])[0]
    assert node.memory_mb is None


def test_supply_from_nodes():
    nodes = [NodeInfo(name="idle", state="free", cores=4, memory_mb=8000, partitions=["cpu"], features=["a"]),
             NodeInfo(name="mixed", state="busy", cores=8, cores_used=6, memory_mb=16000, memory_used_mb=4000,
                      gpus=2, gpus_used=1, jobs=["1"]),
             NodeInfo(name="full", state="busy", cores=4, cores_used=4, jobs=["2"]),
             NodeInfo(name="ending", state="busy", cores=4, cores_used=4, memory_mb=8000, memory_used_mb=8000,
                      jobs=["3"]),
             NodeInfo(name="drain", state="offline", cores=4),
             NodeInfo(name="dead", state="down", cores=4)]
    bins = {b.name: b for b in bins_from_nodes(nodes, now=1000.0, boot_seconds=120,
                                               jobs_end_at={"ending": 1100.0, "full": 5000.0})}
    assert set(bins) == {"idle", "mixed", "ending"}
    assert (bins["idle"].cores, bins["idle"].memory_mb, bins["idle"].rank, bins["idle"].partitions) == \
        (4, 8000, 1, frozenset({"cpu"}))
    assert (bins["mixed"].cores, bins["mixed"].memory_mb, bins["mixed"].gpus, bins["mixed"].rank) == (2, 12000, 1, 0)
    # its jobs end within a replacement's boot time: counted as free, so nothing is launched for it
    assert (bins["ending"].cores, bins["ending"].memory_mb) == (4, 8000)
    assert pack([job(1, cores=4)], list(bins.values()), [offer("x", 4, 1.0)]).new_instances == 0


# ------------------------------------------------------------------------------------------ the fill rule


def test_the_cut_off_rule_is_monotone_where_skipping_is_not():
    """Bin of 4 cores; shapes A (3 cores), B (2), C (1). With less demand (no A) the cut-off rule
    never leaves more of any shape; the skip-and-go-on rule leaves one more C."""
    shapes = _requests([job(1, cores=3), job(5, cores=2), job(1, cores=1)], "")
    seq = _sequence(shapes, 4, None, 0, frozenset(), None)

    def left(rule, rho):
        out = list(rho)
        for i, x in rule(seq, shapes, rho):
            out[i] -= x
        return out

    def skip_rule(seq, shapes, rho):
        c, took = seq.cores, []
        for i, cnt in seq.entries:
            x = min(cnt, rho[i], c // shapes[i].cores)
            if x:
                took.append((i, x))
                c -= x * shapes[i].cores
        return took

    less, more = [0, 5, 1], [1, 5, 1]
    assert left(skip_rule, less)[2] > left(skip_rule, more)[2]  # not monotone
    assert all(a <= b for a, b in zip(left(_one_bin, less), left(_one_bin, more), strict=True))


# ------------------------------------------------------------------------------------------ properties

FEATS = st.frozensets(st.sampled_from(["a", "b"]), max_size=2)
PARTS = st.sampled_from(["", "p", "q"])
shapes_st = st.lists(st.builds(
    lambda count, nodes, cores, mem, gpus, feats, part: JobShape(
        count=count, nodes=nodes, cores=cores, memory_mb=mem, gpus=gpus, features=sorted(feats), partition=part),
    st.integers(1, 3), st.integers(1, 2), st.integers(1, 4), st.sampled_from([0, 0, 1000, 3000]),
    st.sampled_from([0, 0, 0, 1]), FEATS, PARTS), min_size=1, max_size=3)
bin_st = st.builds(
    lambda n, cores, mem, gpus, feats, parts, rank: Bin(f"b{n}", cores, mem, gpus, feats, parts, rank),
    st.integers(0, 10**6), st.integers(1, 4), st.sampled_from([None, 1000, 2000, 4000]), st.integers(0, 1), FEATS,
    st.sampled_from([None, frozenset({"p"}), frozenset({"q"}), frozenset({"p", "q"})]), st.integers(0, 2))
offer_one = st.builds(
    lambda t, cores, mem, gpus, feats, parts, price, room, site: Offer(
        site, f"t{t}", cores, mem, gpus, feats, parts, price, False, room),
    st.integers(0, 10**6), st.integers(1, 8), st.sampled_from([None, 2000, 4000, 8000]), st.integers(0, 2), FEATS,
    st.sampled_from([None, frozenset({"p"}), frozenset({"q"})]), st.sampled_from([0.1, 0.2, 0.35, 0.5, 1.0, 2.0]),
    st.integers(0, 4), st.sampled_from(["s1", "s2"]))
offer_st = st.lists(offer_one, min_size=1, max_size=3).map(
    lambda offers: [Offer(o.site, f"t{i}", o.cores, o.memory_mb, o.gpus, o.features, o.partitions, o.price_per_hour,
                          o.spot, o.room) for i, o in enumerate(offers)])


def unique(bins: list[Bin]) -> list[Bin]:
    return [Bin(f"b{i}", b.cores, b.memory_mb, b.gpus, b.features, b.partitions, b.rank) for i, b in enumerate(bins)]


def score(plan) -> tuple[int, int, int]:
    return (sum(u.jobs for u in plan.unplaced),
            sum(line.count * round(line.price_per_hour * MICRO) for line in plan.lines), plan.new_instances)


def servable_jobs(shapes, offers):
    return [job_of(s) for s in shapes for _ in range(s.count) if servable(job_of(s), offers)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes_st, st.lists(bin_st, max_size=3), offer_st, bin_st)
def test_more_supply_never_costs_more(shapes, supply, offers, extra):
    supply = unique(supply)
    extra = Bin("extra", extra.cores, extra.memory_mb, extra.gpus, extra.features, extra.partitions, extra.rank)
    base = pack(shapes, supply, offers)
    more = pack(shapes, [*supply, extra], offers)
    assert score(more) <= score(base)
    if len({o.spec for o in offers}) == 1 and not base.unplaced:  # one type: never more nodes
        assert more.new_instances <= base.new_instances
    # (with jobs left over for lack of room, more supply may let one of them start: that costs)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes_st, st.lists(bin_st, max_size=3), offer_st, st.data())
def test_less_demand_never_costs_more(shapes, supply, offers, data):
    supply = unique(supply)
    i = data.draw(st.integers(0, len(shapes) - 1))
    fewer = [s if k != i else s.model_copy(update={"count": s.count - 1}) for k, s in enumerate(shapes)]
    fewer = [s for s in fewer if s.count > 0]
    assert score(pack(fewer, supply, offers)) <= score(pack(shapes, supply, offers))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes_st, st.lists(bin_st, max_size=3), offer_st,
       st.one_of(st.none(), st.dictionaries(st.sampled_from(["s1", "s2"]), st.integers(0, 4))))
def test_the_plan_really_holds_the_jobs_it_launches_for(shapes, supply, offers, site_room):
    """Checked by brute force: supply + the new instances hold every servable job but those the
    plan reports unplaced; quotas are held; unsatisfiable ones are exactly those no offer serves."""
    supply = unique(supply)
    plan = pack(shapes, supply, offers, site_room=site_room)
    jobs = servable_jobs(shapes, offers)
    unplaced = {}
    for u in plan.unplaced:
        unplaced[job_of(u.shape)] = unplaced.get(job_of(u.shape), 0) + u.jobs
    placed = []
    for j in jobs:
        if unplaced.get(j):
            unplaced[j] -= 1
        else:
            placed.append(j)
    assert not any(unplaced.values())
    bins = [cap_of(b) for b in supply] + [cap_of(next(o for o in offers if o.site == i.site and o.type == i.type))
                                          for i in plan.instances]
    assert feasible(placed, bins)
    for line in plan.lines:
        for site, type_, n in line.allocation:
            assert n <= next(o.room for o in offers if o.site == site and o.type == type_)
    for site, room in (site_room or {}).items():
        assert sum(n for line in plan.lines for s, _t, n in line.allocation if s == site) <= room
    assert sum(u.jobs for u in plan.unsatisfiable) == sum(s.count for s in shapes) - len(jobs)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes_st, st.lists(bin_st, max_size=3), offer_st)
def test_never_cheaper_than_the_exhaustive_optimum(shapes, supply, offers):
    supply = unique(supply)
    best = optimum(shapes, supply, offers)
    plan = pack(shapes, supply, offers)
    assume(best is not None and not plan.unplaced)
    assert score(plan)[1] >= best[0]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes_st, st.lists(bin_st, max_size=4), offer_st)
def test_removing_the_unused_supply_changes_nothing(shapes, supply, offers):
    """Scale-down by simulation: the bins no pending job could use can all go at once."""
    supply = unique(supply)
    plan = pack(shapes, supply, offers)
    rest = [b for b in supply if b.name not in plan.unused_supply]
    again = pack(shapes, rest, offers)
    assert score(again) == score(plan) and again.used_supply == plan.used_supply


@given(st.integers(0, 200), st.integers(0, 100))
def test_one_core_jobs_on_one_core_nodes_is_the_paper_formula(jobs, free):
    plan = pack([job(jobs)] if jobs else [], [Bin(f"f{i}", 1) for i in range(free)], [offer("one", 1, 0.1, room=10**6)])
    assert plan.new_instances == max(0, jobs - free)


# ------------------------------------------------------------------------------------------ scale-down


def ours(name: str, price: float, cores: int = 4) -> Bin:
    return Bin(name, cores, 8000, partitions=frozenset({"cpu"}), rank=1, price_per_hour=price)


def test_scale_down_by_simulation_keeps_only_what_pending_jobs_need():
    idle = [ours("w-cheap", 0.1), ours("w-dear", 0.3), ours("w-mid", 0.2)]
    plan = pack([job(3, partition="cpu", memory_mb=1000)], idle, [CPU])
    check = drainable(plan, ["w-cheap", "w-dear", "w-mid"])
    # the three jobs fit on one node: the cheapest is kept, the others go, nothing is launched
    assert plan.new_instances == 0 and sorted(check.drain) == ["w-dear", "w-mid"]
    assert "3 x 1c 1000MB @cpu" in check.keep["w-cheap"]
    # without the drained nodes the plan is the same
    again = pack([job(3, partition="cpu", memory_mb=1000)], [idle[0]], [CPU])
    assert again.new_instances == 0 and again.used_supply == {"w-cheap"}


def test_nodes_only_blocked_or_unsatisfiable_jobs_could_use_are_idle():
    idle = [ours("w1", 0.1), ours("w2", 0.1)]
    shapes = [job(10, partition="cpu", demand=False, reason="AssocGrpCpuLimit"),
              job(2, partition="cpu", cores=64)]  # no type has 64 cores
    plan = pack(shapes, idle, [CPU, CPU_BIG])
    assert drainable(plan, ["w1", "w2"]).drain == ["w1", "w2"]
    assert plan.unsatisfiable[0].constraint == "cores"


def test_a_queued_job_that_fits_elsewhere_does_not_pin_idle_nodes():
    # the old rule kept every idle node while any queued job fit anywhere; here the job fits
    # the spare room of a busy node, so both idle workers can go
    busy = Bin("busy1", 2, 4000, partitions=frozenset({"cpu"}), rank=0)
    plan = pack([job(1, partition="cpu")], [busy, ours("w1", 0.1), ours("w2", 0.1)], [CPU])
    assert drainable(plan, ["w1", "w2"]).drain == ["w1", "w2"]
    # a bigmem job never pins cpu workers (and gets its own type)
    plan = pack([job(1, partition="bigmem", features=["bigmem"], memory_mb=100000)],
                [ours("w1", 0.1)], CATALOGUE)
    assert drainable(plan, ["w1"]).drain == ["w1"] and plan.by_type() == {"r-large": 1}


def test_a_candidate_not_in_the_supply_is_kept():
    check = drainable(pack([], [], [CPU]), ["ghost"])
    assert check.drain == [] and "not in the supply" in check.keep["ghost"]


# ------------------------------------------------------------------------------------------ offers


def test_domain_offers_follow_the_partition_map_spot_and_rooms():
    from epu.common.config import parse_config
    from epu.common.config.catalogue import site_types
    from epu.services.decision.offers import domain_offers

    cfg = parse_config({
        "sites": {"ec2": {"driver": "ec2", "quota": 10, "types": {
            "small": {"cores": 2, "memory_mb": 4000, "price_per_hour": 0.1},
            "fat": {"cores": 16, "memory_mb": 512000, "features": ["bigmem"], "price_per_hour": 2.0, "quota": 3},
            "spot": {"cores": 2, "memory_mb": 4000, "price_per_hour": 0.03, "spot": True},
            "unused": {"cores": 1, "price_per_hour": 0.01}}},
            "old": {"driver": "epu-sim", "size": "sim", "cores": 1, "quota": 5}},
        "domains": {"d": {"sites": ["ec2", "old"], "cores_per_node": 4,
                          "partitions": {"cpu": ["small", "spot", "old/sim"], "bigmem": ["ec2/fat"]}}}}, environ={})
    types = [t for s in ("ec2", "old") for t in site_types(s, cfg.sites[s])]
    offers = {o.type: o for o in domain_offers(types, cfg.domains["d"], {("ec2", "fat"): 2}, legacy_cores=4)}
    assert set(offers) == {"small", "fat", "sim"}  # no spot (not allowed), "unused" serves no partition
    assert offers["fat"].room == 1 and offers["fat"].partitions == {"bigmem"}
    assert offers["small"].memory_mb == 4000 and offers["sim"].memory_mb is None
    assert offers["sim"].cores == 4  # a legacy site has always launched cores_per_node
    spot_ok = cfg.domains["d"].model_copy(update={"allow_spot": True})
    assert "spot" in {o.type for o in domain_offers(types, spot_ok, excluded=frozenset({("ec2", "small")}))}
    assert next(o for o in domain_offers(types, spot_ok, excluded=frozenset({("ec2", "small")}))
                if o.type == "small").room == 0
    # no partition map: every type serves every partition
    free = cfg.domains["d"].model_copy(update={"partitions": {}})
    assert all(o.partitions is None for o in domain_offers(types, free))


def test_placement_breaks_ties_between_equal_offers():
    from epu.services.decision.offers import place_line
    from epu.services.decision.placement import SiteHealth, SiteInfo

    east = offer("m", 4, 0.2, site="east", room=2)
    west = offer("m", 4, 0.2, site="west", room=10)
    (line,) = pack([job(16)], [], [east, west]).lines
    assert line.count == 4
    infos = {"east": SiteInfo("east", quota=20), "west": SiteInfo("west", quota=20)}
    sites, _ = place_line(line, "rank", infos, {}, {}, {}, 0.0)
    assert sites == [("east", "m")] * 2 + [("west", "m")] * 2  # east's type room is 2
    sites, _ = place_line(line, "spread", infos, {}, {"east": 0, "west": 3}, {}, 0.0)
    assert sorted(sites) == [("east", "m")] * 2 + [("west", "m")] * 2
    # east backing off: all to west; the site quota caps too
    sick = {"east": SiteHealth("east", failures=1, backoff_until=100.0)}
    sites, placed = place_line(line, "rank", {"east": SiteInfo("east"), "west": SiteInfo("west", quota=3)}, sick,
                               {}, {}, 0.0)
    assert sites == [("west", "m")] * 3 and placed.unplaced == 1
