"""Cheapest-fit packer benchmark (issue 13): cost at scale, and optimality against brute force.

1. **Scale**: 100,000 pending jobs in 1,000 shapes (cores, memory, GPUs, features, partitions
   cpu/bigmem/gpu, 1–8 nodes) on 10,000 nodes (busy, partly free, idle), 16 offers (4 types per
   partition at two sites, plus spot), ``packing.pack`` timed — wall and CPU, min/median/max —
   side by side with today's cores-only ``demand.nodes_needed`` on the cores-only projection of
   the same input (shapes → (cores, nodes), free cores per node, 32-core nodes), and with the
   packer itself on that projection, in the same process.
2. **Optimality** (``--optimality N``): N random small cases (≤ 3 shapes of ≤ 3 jobs, ≤ 3 bins,
   ≤ 3 offers) solved exactly by ``tests/support/packing_oracle.optimum``; the packer's price over
   the optimum's: mean, max, share optimal, and how often it launched where nothing was needed.

Run: ``.venv/bin/python bench/bench_packing.py [--repeat 5] [--optimality 2000] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from epu.common.messages import JobShape, NodeInfo  # noqa: E402
from epu.services.decision.demand import nodes_needed  # noqa: E402
from epu.services.decision.packing import MICRO, Bin, Offer, bins_from_nodes, pack  # noqa: E402

PARTITIONS = {  # partition → (node cores, memory MB, GPUs, features) of the static nodes
    "cpu": (32, 128_000, 0, ("avx512",)),
    "bigmem": (32, 1_000_000, 0, ("bigmem",)),
    "gpu": (32, 256_000, 4, ("gpu",)),
}


def make_input(seed: int = 1, n_jobs: int = 100_000, n_shapes: int = 1_000,
               n_nodes: int = 10_000) -> tuple[list[JobShape], list[NodeInfo], list[Offer]]:
    rnd = random.Random(seed)
    shapes: dict[tuple, JobShape] = {}
    while len(shapes) < n_shapes:
        part = rnd.choices(["cpu", "bigmem", "gpu"], [70, 15, 15])[0]
        cores = rnd.choice([1, 1, 1, 2, 4, 8, 16, 32, 64])  # 64: more than any type (unsatisfiable)
        mem = cores * rnd.choice([500, 1000, 2000]) * (rnd.choice([4, 8, 16]) if part == "bigmem" else 1)
        gpus = rnd.choice([1, 1, 2, 4]) if part == "gpu" else 0
        nodes = rnd.choices([1, 2, 4, 8], [85, 8, 5, 2])[0]
        feats = sorted({f for f in ("avx512", "ib") if rnd.random() < 0.1} | ({"bigmem"} if part == "bigmem" else set()))
        demand = rnd.random() < 0.9
        s = JobShape(count=1, nodes=nodes, cores=cores, memory_mb=mem, gpus=gpus, features=feats, partition=part,
                     time_limit_s=rnd.choice([3600, 86400]), demand=demand,
                     reason="Resources" if demand else "QOSMaxJobsPerUserLimit")
        shapes[s.key()] = s
    # counts: Zipf-like, summing to n_jobs (most jobs small and few shapes big, as on real queues)
    weights = [1 / (i + 1) for i in range(n_shapes)]
    total = sum(weights)
    counts = [max(1, int(n_jobs * w / total)) for w in weights]
    counts[0] += n_jobs - sum(counts)
    out = [s.model_copy(update={"count": c}) for s, c in zip(shapes.values(), counts, strict=True)]
    nodes = []
    for i in range(n_nodes):
        part = rnd.choices(list(PARTITIONS), [70, 15, 15])[0]
        cores, mem, gpus, feats = PARTITIONS[part]
        r = rnd.random()
        used = cores if r < 0.80 else rnd.randint(1, cores - 1) if r < 0.95 else 0
        frac = used / cores
        nodes.append(NodeInfo(name=f"{part}{i:05d}", state="busy" if used else "free", cores=cores, cores_used=used,
                              memory_mb=mem, memory_used_mb=int(mem * frac), gpus=gpus,
                              gpus_used=min(gpus, round(gpus * frac)), features=list(feats), partitions=[part],
                              jobs=[str(i)] if used else []))
    offers = []
    for site, factor in (("east", 1.0), ("west", 1.1)):
        for part, types in {
            "cpu": [("c-2", 2, 4000, 0, 0.085, ()), ("c-8", 8, 16000, 0, 0.34, ()),
                    ("c-32", 32, 128000, 0, 1.2, ("ib",)), ("m-8", 8, 32000, 0, 0.38, ())],
            "bigmem": [("r-8", 8, 256000, 0, 1.0, ()), ("r-32", 32, 1_000_000, 0, 3.6, ("ib",))],
            "gpu": [("p-1", 8, 61000, 1, 3.06, ()), ("p-4", 32, 244000, 4, 12.24, ("ib",))],
        }.items():
            for name, cores, mem, gpus, price, extra in types:
                feats = frozenset(PARTITIONS[part][3]) | {"avx512"} | frozenset(extra)
                offers.append(Offer(site, name, cores, mem, gpus, feats, frozenset({part}), round(price * factor, 4),
                                    False, 50_000))
        offers.append(Offer(site, "c-8-spot", 8, 16000, 0, frozenset({"avx512"}), frozenset({"cpu"}),
                            round(0.11 * factor, 4), True, 2_000))
    return out, nodes, offers


def cores_only(shapes: list[JobShape], nodes: list[NodeInfo]) -> tuple[dict[tuple[int, int], int], list[int]]:
    by: Counter[tuple[int, int]] = Counter()
    for s in shapes:
        if s.demand:
            by[(s.cores, s.nodes)] += s.count
    supply = [n.cores - n.cores_used for n in nodes if n.state in ("free", "busy") and n.cores > n.cores_used]
    return dict(by), supply


def timed(fn, repeat: int) -> dict[str, float]:
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return {"wall_min_ms": min(walls) * 1e3, "wall_median_ms": statistics.median(walls) * 1e3,
            "wall_max_ms": max(walls) * 1e3, "cpu_min_ms": min(cpus) * 1e3,
            "cpu_median_ms": statistics.median(cpus) * 1e3, "cpu_max_ms": max(cpus) * 1e3}


def scale(repeat: int) -> dict:
    shapes, nodes, offers = make_input()
    supply = bins_from_nodes(nodes)
    plan = pack(shapes, supply, offers)
    demand, free = cores_only(shapes, nodes)
    old = nodes_needed(demand, free, 32)
    # the packer on the same cores-only projection: isolates what the richer model costs
    flat = [JobShape(count=k, nodes=n, cores=c) for (c, n), k in demand.items()]
    flat_bins = [Bin(f"n{i}", c) for i, c in enumerate(free)]
    flat_offer = [Offer("site", "32-core", 32, price_per_hour=1.0, room=10**6)]
    flat_plan = pack(flat, flat_bins, flat_offer)
    return {
        "input": {"jobs": sum(s.count for s in shapes), "demand_jobs": sum(s.count for s in shapes if s.demand),
                  "shapes": len(shapes), "nodes": len(nodes), "supply_bins": len(supply), "offers": len(offers)},
        "packer": {**timed(lambda: pack(shapes, supply, offers), repeat), "new_instances": plan.new_instances,
                   "cost_per_hour": round(plan.cost_per_hour, 2), "by_type": plan.by_type(),
                   "unsatisfiable_jobs": sum(u.jobs for u in plan.unsatisfiable),
                   "unplaced_jobs": sum(u.jobs for u in plan.unplaced), "gangs": len(plan.gangs)},
        "packer_incl_supply": timed(lambda: pack(shapes, bins_from_nodes(nodes), offers), repeat),
        "cores_only_baseline": {**timed(lambda: nodes_needed(demand, free, 32), repeat),
                                "new_nodes": old.new_nodes, "cores_only_shapes": len(demand)},
        "packer_cores_only": {**timed(lambda: pack(flat, flat_bins, flat_offer), repeat),
                              "new_nodes": flat_plan.new_instances},
    }


def optimality(n: int, seed: int = 7) -> dict:
    from tests.support.packing_oracle import optimum

    rnd = random.Random(seed)

    def fs() -> frozenset[str]:
        return frozenset(f for f in ("a", "b") if rnd.random() < 0.3)

    ratios: list[float] = []
    launched_for_nothing = optimal = left_over = 0
    while len(ratios) < n:
        shapes = [JobShape(count=rnd.randint(1, 3), nodes=rnd.choice([1, 1, 2]), cores=rnd.randint(1, 4),
                           memory_mb=rnd.choice([0, 0, 1000, 3000]), gpus=rnd.choice([0, 0, 0, 1]),
                           features=sorted(fs()), partition=rnd.choice(["", "p", "q"]))
                  for _ in range(rnd.randint(1, 3))]
        supply = [Bin(f"b{i}", rnd.randint(1, 4), rnd.choice([None, 1000, 2000, 4000]), rnd.randint(0, 1), fs(),
                      rnd.choice([None, frozenset({"p"}), frozenset({"q"})]), rnd.randint(0, 2))
                  for i in range(rnd.randint(0, 3))]
        room = rnd.choice([2, 4, 8])
        offers = [Offer(rnd.choice(["s1", "s2"]), f"t{i}", rnd.randint(1, 8), rnd.choice([None, 2000, 4000, 8000]),
                        rnd.randint(0, 2), fs(), rnd.choice([None, frozenset({"p"}), frozenset({"q"})]),
                        rnd.choice([0.1, 0.2, 0.35, 0.5, 1.0, 2.0]), False, room)
                  for i in range(rnd.randint(1, 3))]
        best = optimum(shapes, supply, offers)
        if best is None:
            continue  # the rooms cannot hold every job: no optimum to compare with
        plan = pack(shapes, supply, offers)
        if plan.unplaced:
            left_over += 1  # the optimum fits them all within the rooms; the packer left some
            continue
        price = sum(line.count * round(line.price_per_hour * MICRO) for line in plan.lines)
        if best[0] == 0:
            launched_for_nothing += bool(price)
            ratios.append(1.0 if not price else float("inf"))
        else:
            ratios.append(price / best[0])
        optimal += price == best[0]
    finite = [r for r in ratios if r != float("inf")]
    return {"cases": n, "mean_ratio": statistics.mean(finite), "max_ratio": max(finite),
            "p99_ratio": sorted(finite)[int(0.99 * (len(finite) - 1))], "optimal_share": optimal / n,
            "launched_where_nothing_was_needed": launched_for_nothing,
            "left_jobs_the_optimum_fits": left_over}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="timed runs of the scale case (default 5)")
    p.add_argument("--optimality", type=int, default=500, metavar="N",
                   help="random small cases compared with the exhaustive optimum (default 500; 0 = skip)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args(argv)
    out = {"python": platform.python_version(), "cpus": os.cpu_count(),
           "load_average": [round(x, 2) for x in os.getloadavg()], "scale": scale(args.repeat)}
    if args.optimality:
        t = time.perf_counter()
        out["optimality"] = optimality(args.optimality)
        out["optimality"]["seconds"] = round(time.perf_counter() - t, 1)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    s = out["scale"]
    print(f"# python {out['python']}, {out['cpus']} cpu, load average {' '.join(map(str, out['load_average']))}")
    i = s["input"]
    print(f"## {i['jobs']:,} pending jobs ({i['demand_jobs']:,} demand) in {i['shapes']:,} shapes, "
          f"{i['nodes']:,} nodes ({i['supply_bins']:,} with room), {i['offers']} offers")
    for name, key in (("packer (shapes)   ", "packer"), ("packer + supply   ", "packer_incl_supply"),
                      ("cores-only today  ", "cores_only_baseline"), ("packer cores-only ", "packer_cores_only")):
        r = s[key]
        print(f"{name}: wall min {r['wall_min_ms']:8.1f}  median {r['wall_median_ms']:8.1f}  max "
              f"{r['wall_max_ms']:8.1f} ms | cpu min {r['cpu_min_ms']:8.1f}  median {r['cpu_median_ms']:8.1f}  "
              f"max {r['cpu_max_ms']:8.1f} ms")
    pk, old = s["packer"], s["cores_only_baseline"]
    print(f"packer plan       : {pk['new_instances']} new instances, ${pk['cost_per_hour']}/h, {pk['by_type']}, "
          f"{pk['gangs']} gangs, {pk['unsatisfiable_jobs']} unsatisfiable and {pk['unplaced_jobs']} unplaced jobs")
    print(f"cores-only answer : {old['new_nodes']} new 32-core nodes ({old['cores_only_shapes']} (cores, nodes) shapes; "
          f"blind to memory, GPUs, features, partitions); the packer on that projection: "
          f"{s['packer_cores_only']['new_nodes']}")
    if "optimality" in out:
        o = out["optimality"]
        print(f"## optimality over {o['cases']} random small cases vs the exhaustive optimum ({o['seconds']} s)")
        print(f"price ratio       : mean {o['mean_ratio']:.4f}  p99 {o['p99_ratio']:.3f}  max {o['max_ratio']:.3f}  "
              f"optimal in {o['optimal_share']:.1%}; launched where nothing was needed: "
              f"{o['launched_where_nothing_was_needed']}; left jobs the optimum fits: {o['left_jobs_the_optimum_fits']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
