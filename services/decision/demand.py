"""How many new nodes the queue needs, counting multi-node jobs right. Pure.

A job asking N nodes × M cores needs N *distinct* nodes with M free cores each — not N×M
cores anywhere — so an MPI job gets its whole allocation. Supply is a histogram of free
cores per bin (free workers, pending instances); demand is packed into it largest shape
first, and what does not fit opens new bins of ``node_cores`` cores.

With 1-core jobs and 1-core nodes this is exactly the paper's
``launch = queued − (free workers + pending instances)``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class DemandResult:
    new_nodes: int
    unsatisfiable: dict[tuple[int, int], int] = field(default_factory=dict)
    """Shapes no node of ``node_cores`` can ever hold (cores per node > node_cores)."""


def nodes_needed(shapes: dict[tuple[int, int], int], supply: list[int], node_cores: int) -> DemandResult:
    """Pack ``shapes`` ((cores, nodes) → jobs) into ``supply`` (free cores per existing bin)."""
    hist: Counter[int] = Counter(c for c in supply if c > 0)
    fresh: Counter[int] = Counter()  # leftover capacity of bins we opened (same packing)
    new_nodes = 0
    unsat: dict[tuple[int, int], int] = {}

    def take(cap_hist: Counter[int], m: int, k: int) -> int:
        """Place ``k`` single-node chunks of ``m`` cores; return how many remain."""
        for cap in sorted((c for c in cap_hist if c >= m), reverse=True):
            if k == 0:
                break
            per_bin = cap // m
            n_bins = cap_hist[cap]
            bins = min(n_bins, -(-k // per_bin))
            placed = min(k, bins * per_bin)
            k -= placed
            cap_hist[cap] -= bins
            if cap_hist[cap] == 0:
                del cap_hist[cap]
            last = placed % per_bin
            rest_full = cap - per_bin * m
            if rest_full:
                cap_hist[rest_full] += bins - (1 if last else 0)
            if last:
                cap_hist[cap - last * m] += 1
        return k

    for (m, n), k in sorted(shapes.items(), key=lambda kv: (kv[0][0], kv[0][1]), reverse=True):
        if m > node_cores and not any(c >= m for c in hist):
            unsat[(m, n)] = k
            continue
        if n == 1:
            k = take(hist, m, k)
            k = take(fresh, m, k)
            if k:
                if m > node_cores:
                    unsat[(m, n)] = k
                    continue
                per_bin = node_cores // m
                opened = -(-k // per_bin)
                new_nodes += opened
                last = k - (opened - 1) * per_bin
                if node_cores - per_bin * m:
                    fresh[node_cores - per_bin * m] += opened - 1
                if node_cores - last * m:
                    fresh[node_cores - last * m] += 1
            continue
        # multi-node: each job needs n distinct bins with >= m free cores
        for done in range(k):
            if not any(c >= m for c in hist) and not any(c >= m for c in fresh):
                # supply exhausted: the remaining jobs open nodes in closed form (n nodes per
                # group of node_cores // m jobs, one chunk of each job per node)
                rest = k - done
                if m > node_cores:
                    unsat[(m, n)] = unsat.get((m, n), 0) + rest
                    break
                per_bin = node_cores // m
                groups = -(-rest // per_bin)
                new_nodes += n * groups
                last = rest - (groups - 1) * per_bin
                if node_cores - per_bin * m:
                    fresh[node_cores - per_bin * m] += n * (groups - 1)
                if node_cores - last * m:
                    fresh[node_cores - last * m] += n
                break
            need = n
            for pool in (hist, fresh):
                for cap in sorted((c for c in pool if c >= m), reverse=True):
                    if need == 0:
                        break
                    bins = min(pool[cap], need)
                    need -= bins
                    pool[cap] -= bins
                    if pool[cap] == 0:
                        del pool[cap]
                    if cap - m:
                        pool[cap - m] += bins
            if need:
                if m > node_cores:
                    unsat[(m, n)] = unsat.get((m, n), 0) + 1
                    continue
                new_nodes += need
                if node_cores - m:
                    fresh[node_cores - m] += need
    return DemandResult(new_nodes, unsat)
