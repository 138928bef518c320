"""How many new nodes the queue needs, counting multi-node jobs right. Pure.

A job asking N nodes × M cores needs N *distinct* nodes with M free cores each — not N×M
cores anywhere — so an MPI job gets its whole allocation. Supply is a histogram of free
cores per bin (free workers, pending instances).

The answer is the smallest number T of new ``node_cores`` bins for which the queue fits
into supply + T, placed by *worst fit*: jobs in a fixed order (widest per-node chunk
first), each job's chunks on the N bins with the most free cores. Worst fit is chosen over
tighter heuristics because it is monotone: if bins A dominate bins B (sorted, each A bin
≥ the B bin of the same rank), every job that fits B fits A and leaves A still dominating.
So adding supply — a free worker, a pending instance, one more new node — never makes a
queue stop fitting, which gives the two properties an autoscaler must have: more free
nodes never launch *more*, and T can be found by binary search. (A greedy that packed
tighter was measured launching 3 nodes with an extra free node where it launched 2
without; the property test in tests/decision/test_demand.py guards this.)

Jobs wider per node than ``node_cores`` can only run on an existing bigger node: no new
node is launched for them; they are placed on what the rest leaves, and reported as
unsatisfiable if nothing left holds them.

With 1-core jobs and 1-core nodes this is exactly the paper's
``launch = queued − (free workers + pending instances)``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

Job = tuple[int, int, int]
"""(cores per node, nodes, how many such jobs)."""


@dataclass
class DemandResult:
    new_nodes: int
    unsatisfiable: dict[tuple[int, int], int] = field(default_factory=dict)
    """Shapes (cores, nodes) → jobs that no new node can hold (cores per node > node_cores)
    and no free node left over holds either."""


_Key = tuple[tuple[Job, ...], tuple[int, ...], int]
_ANSWERS: dict[_Key, DemandResult] = {}
"""(jobs sorted, positive supply sorted, node cores) → the answer: the whole input of the search
(jobs with no count and empty bins take no part in it), so an equal key is an equal answer. An
autoscaler asks the same question iteration after iteration while the queue and its supply stand
still; the search itself is the costly part."""
_ANSWERS_MAX = 4096
"""Kept answers at most (all dropped at once past it: a plain bound, no order kept)."""


def nodes_needed(shapes: dict[tuple[int, int], int], supply: list[int], node_cores: int) -> DemandResult:
    """Smallest number of new ``node_cores`` bins the queue ``shapes`` ((cores, nodes) → jobs)
    needs on top of ``supply`` (free cores per existing bin). A fresh result each call (the
    kept one is never handed out: its dict could be changed by the caller)."""
    order = sorted(((m, n, k) for (m, n), k in shapes.items() if k > 0), reverse=True)
    key = (tuple(order), tuple(sorted(c for c in supply if c > 0)), node_cores)
    hit = _ANSWERS.get(key)
    if hit is None:
        if len(_ANSWERS) >= _ANSWERS_MAX:
            _ANSWERS.clear()
        hit = _ANSWERS[key] = _search(order, key[1], node_cores)
    return DemandResult(hit.new_nodes, dict(hit.unsatisfiable))


def _search(order: list[Job], supply: tuple[int, ...], node_cores: int) -> DemandResult:
    """``nodes_needed`` computed: ``order`` the jobs widest first, ``supply`` the positive bins."""
    fitting = [j for j in order if j[0] <= node_cores]
    oversize = [j for j in order if j[0] > node_cores]
    bins: Counter[int] = Counter(supply)

    # Lower bound: the cores supply does not cover. Upper bound: one new node per chunk
    # always fits (each chunk leaves at least as many untouched new nodes as chunks remain).
    cores = sum(m * n * k for m, n, k in fitting)
    lo = max(0, -(-(cores - sum(c * cnt for c, cnt in bins.items())) // node_cores))
    hi = max(lo, sum(n * k for _m, n, k in fitting))
    # Probe upwards from the lower bound (the answer is usually close to it), then bisect.
    step = 1
    probe = lo
    while probe < hi and _place(fitting, bins, node_cores, probe) is None:
        lo = probe + 1
        probe = min(hi, probe + step)
        step *= 2
    hi = probe
    while lo < hi:
        mid = (lo + hi) // 2
        if _place(fitting, bins, node_cores, mid) is None:
            lo = mid + 1
        else:
            hi = mid
    left = _place(fitting, bins, node_cores, lo)
    assert left is not None  # the upper bound always fits

    unsat: dict[tuple[int, int], int] = {}
    for m, n, k in oversize:
        placed = _place_shape(left, m, n, k)
        if placed < k:
            unsat[(m, n)] = k - placed
    return DemandResult(lo, unsat)


def _place(jobs: list[Job], supply: Counter[int], node_cores: int, new_nodes: int) -> Counter[int] | None:
    """Free cores per bin left after placing every job on supply + ``new_nodes`` fresh
    bins, or ``None`` if some job does not fit."""
    bins = Counter(supply)
    if new_nodes:
        bins[node_cores] += new_nodes
    for m, n, k in jobs:
        if _place_shape(bins, m, n, k) < k:
            return None
    return bins


def _place_shape(bins: Counter[int], m: int, n: int, k: int) -> int:
    """Place up to ``k`` jobs of ``n`` chunks × ``m`` cores, each on the ``n`` bins with the
    most free cores (worst fit); update ``bins``; return how many were placed.

    Bins with equal free cores are interchangeable, so identical jobs are placed in
    batches: while the fullest level holds ``n`` bins or more, ``count // n`` jobs take
    their chunks from it at once (what is left of those bins sits below that level)."""
    placed = 0
    while placed < k:
        levels = sorted((c for c, cnt in bins.items() if cnt > 0), reverse=True)
        if not levels or levels[0] < m:
            break
        top = levels[0]
        batch = min(k - placed, bins[top] // n)
        if batch:
            _move(bins, top, top - m, batch * n)
            placed += batch
            continue
        # the fullest level has fewer than n bins: one job, across the top levels
        picks: list[tuple[int, int]] = []
        need = n
        for level in levels:
            if level < m or need == 0:
                break
            take = min(bins[level], need)
            picks.append((level, take))
            need -= take
        if need:
            break
        for level, take in picks:
            _move(bins, level, level - m, take)
        placed += 1
    return placed


def _move(bins: Counter[int], src: int, dst: int, count: int) -> None:
    bins[src] -= count
    if bins[src] == 0:
        del bins[src]
    if dst > 0:
        bins[dst] += count
