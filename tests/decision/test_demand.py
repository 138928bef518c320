"""Properties of the demand packing (hypothesis)."""

from __future__ import annotations

import itertools

from epu.services.decision.demand import DemandResult, nodes_needed
from hypothesis import given, settings
from hypothesis import strategies as st

shapes = st.dictionaries(st.tuples(st.integers(1, 8), st.integers(1, 6)), st.integers(1, 40), max_size=5)
supply = st.lists(st.integers(0, 8), max_size=30)


@given(st.integers(0, 200), st.integers(0, 100))
def test_one_core_jobs_on_one_core_nodes_is_the_paper_formula(jobs, free):
    assert nodes_needed({(1, 1): jobs} if jobs else {}, [1] * free, 1).new_nodes == max(0, jobs - free)


@settings(max_examples=200)
@given(shapes, supply, st.integers(1, 8))
def test_enough_and_not_absurd(demand, free, node_cores):
    r = nodes_needed(demand, free, node_cores)
    fits = {k: v for k, v in demand.items() if k[0] <= node_cores}
    total = sum(m * n * k for (m, n), k in fits.items())
    # never fewer nodes than the cores not covered by supply require ...
    assert r.new_nodes >= -(-max(0, total - sum(free)) // node_cores)
    # ... nor more than one node per requested chunk
    assert r.new_nodes <= sum(n * k for (_m, n), k in fits.items())
    # only shapes bigger than a new node can be left over, and those are whenever no free node fits them
    assert all(m > node_cores for m, _n in r.unsatisfiable)
    assert {k for k in demand if k[0] > node_cores and not any(c >= k[0] for c in free)} <= set(r.unsatisfiable)


@settings(max_examples=300)
@given(shapes, supply, st.integers(1, 8), st.integers(1, 8))
def test_more_supply_never_needs_more_nodes(demand, free, node_cores, extra):
    # The greedy this replaced failed here: demand={(1, 3): 2}, free=[2], node_cores=2,
    # extra=1 gave 2 new nodes without the extra free node and 3 with it.
    base = nodes_needed(demand, free, node_cores).new_nodes
    assert nodes_needed(demand, [*free, extra], node_cores).new_nodes <= base


def test_the_counterexample_that_broke_the_old_greedy():
    assert nodes_needed({(1, 3): 2}, [2], 2).new_nodes == 2
    assert nodes_needed({(1, 3): 2}, [2, 1], 2).new_nodes == 2


def _fits(jobs: list[tuple[int, int]], bins: list[int]) -> bool:
    """Exhaustive: can every (cores, nodes) job get ``nodes`` distinct bins with ``cores`` free?"""
    if not jobs:
        return True
    (m, n), rest = jobs[0], jobs[1:]
    for chosen in itertools.combinations(range(len(bins)), n):
        if all(bins[i] >= m for i in chosen):
            after = [c - m if i in chosen else c for i, c in enumerate(bins)]
            if _fits(rest, after):
                return True
    return False


tiny_shapes = st.dictionaries(st.tuples(st.integers(1, 4), st.integers(1, 3)), st.integers(1, 2), max_size=2)


@settings(max_examples=150, deadline=None)
@given(tiny_shapes, st.lists(st.integers(0, 4), max_size=3), st.integers(1, 4))
def test_the_count_is_enough_for_an_exhaustive_packer(demand, free, node_cores):
    """Checked against brute force: the launched nodes really hold the queue (a packer that
    reused a bin for two chunks of one job would undercount, as the old greedy did)."""
    r = nodes_needed(demand, free, node_cores)
    jobs = sorted(((m, n) for (m, n), k in demand.items() if m <= node_cores for _ in range(k)), reverse=True)
    assert _fits(jobs, [*free, *[node_cores] * r.new_nodes])


def test_wide_jobs_never_launch_nodes_and_use_a_big_free_node_when_one_is_left():
    # 16-core chunks cannot run on 8-core new nodes: no launch for them
    assert nodes_needed({(16, 1): 2}, [], 8) == DemandResult(0, {(16, 1): 2})
    # one 16-core free node holds one of them
    assert nodes_needed({(16, 1): 2}, [16], 8) == DemandResult(0, {(16, 1): 1})
    # an 8-core job takes the big node first (worst fit); the wide job waits for it
    assert nodes_needed({(16, 1): 1, (8, 1): 1}, [16], 8) == DemandResult(0, {(16, 1): 1})
