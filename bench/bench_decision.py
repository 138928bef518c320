"""Decision engine benchmark: one policy iteration at scale, against a naive baseline.

Scenarios (issue 5, item 11):

1. one domain with 10,000 nodes and 100,000 queued jobs (goal: ≤ 20 ms per iteration);
2. 100 domains of 100 nodes each (one iteration over all of them).

"Iteration" is the engine's pure core as it runs every ``iteration_seconds``: refresh the
instance table from the snapshot, build the view, run queue-demand, plan (guard rails and
placement). The snapshot digest (queued jobs grouped by shape) is built once when a snapshot
*arrives* (every sensor poll, 60 s by default), so it is reported separately. With ``--store``
the 100-domain case also runs the whole engine iteration (SQLite store, fake bus).

The baseline, in the same process on the same data: what a straightforward implementation
does every iteration — walk every queued job, every node and every instance with plain
loops (next-fit packing, per-instance scans of the node list).

Run: ``.venv/bin/python bench/bench_decision.py [--repeat 20] [--store]``
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchjson import Results, json_mode  # noqa: E402
from epu.common.messages import JobShape, NodeInfo, QueuedJob, SensorSnapshot  # noqa: E402
from epu.services.decision.placement import SiteInfo  # noqa: E402
from epu.services.decision.planner import PlacementInput, plan  # noqa: E402
from epu.services.decision.policies import POLICIES, validate_params  # noqa: E402
from epu.services.decision.view import Instance, JobDigest, NodeIndex, build_view, refresh_parts  # noqa: E402

NOW = 1_700_000_000.0
CORES = 8


def make_domain(name: str, n_nodes: int, n_jobs: int, seed: int = 1,
                burst: bool = False) -> tuple[SensorSnapshot, list[Instance]]:
    """A domain under a long queue. Steady: 90 % busy, 4 % free, 4 % draining with jobs, 2 % down,
    3 % more instances pending. Burst: 70 % busy, 20 % free, 10 % draining of which most are done
    (so ~1,000 removes plus the launches up to max_nodes in one iteration)."""
    rnd = random.Random(seed)
    nodes, insts = [], []
    for i in range(n_nodes):
        r = rnd.random()
        if burst:
            state, used = ("busy", CORES) if r < 0.7 else ("free", 0) if r < 0.9 else ("offline", rnd.randint(0, 1))
        else:
            state, used = (("busy", CORES) if r < 0.90 else ("free", 0) if r < 0.94
                           else ("offline", 2) if r < 0.98 else ("down", 0))
        node_name = f"{name}-{i:08x}"
        nodes.append(NodeInfo(name=node_name, state=state, cores=CORES, cores_used=used,
                              jobs=[f"r{i}"] if used else []))
        inst_state = "draining" if state == "offline" else "joined"
        insts.append(Instance(f"{name}i{i}", name, f"s{i % 3}", node_name, CORES, inst_state, NOW - 3600,
                              NOW - 3600, joined_at=NOW - 3000, idle_since=NOW - 100 if state == "free" else None,
                              add_sent_at=NOW - 3500, missing_since=NOW - 60 if state == "down" else None,
                              seen_at=NOW - 3000))  # steady state: the engine stored when it first saw it
    for i in range(n_nodes * 3 // 100):
        insts.append(Instance(f"{name}p{i}", name, "s0", f"{name}-p{i:06x}", CORES, "pending", NOW - 60, NOW - 60))
    jobs = []
    for j in range(n_jobs):
        r = rnd.random()
        cores, nn = (1, 1) if r < 0.9 else (4, 1) if r < 0.99 else (8, 4)
        jobs.append(QueuedJob(job_id=str(j), cores=cores, nodes=nn, wait_seconds=rnd.random() * 600))
    snap = SensorSnapshot(domain=name, backend="bench", taken_at=NOW, jobs=jobs, nodes=nodes)
    return snap, insts


PLACE = PlacementInput(["s0", "s1", "s2"], "rank",
                       {f"s{i}": SiteInfo(f"s{i}", quota=10**6, cores=CORES) for i in range(3)}, {}, {}, {})
PARAMS = validate_params("queue-demand", {})
POLICY = POLICIES["queue-demand"]


def digest_of(snap: SensorSnapshot) -> tuple[JobDigest, NodeIndex]:
    """What the engine computes once when a snapshot arrives (demand by shape, nodes indexed by
    identity and short name)."""
    return JobDigest.of(snap.jobs), NodeIndex(snap.nodes)


def iteration(snap: SensorSnapshot, digest: tuple[JobDigest, NodeIndex], insts: list[Instance],
              max_nodes: int) -> int:
    jobs, nodes = digest
    fresh, parts = refresh_parts(insts, nodes, NOW, True)
    view = build_view(snap.domain, snap, jobs, fresh, NOW, min_nodes=0, max_nodes=max_nodes,
                      cores_per_node=CORES, nodes=nodes, all_live=True, parts=parts)
    decision = POLICY.decide(view, PARAMS, NOW)
    out = plan(view, decision, PLACE, set(), make_id=_ids())
    return len(out.actions)


def _ids():
    n = iter(range(10**9))
    return lambda: f"{next(n):032x}"


def naive_iteration(snap: SensorSnapshot, insts: list[Instance], max_nodes: int) -> int:
    """The obvious code: per job, per node, per instance, every iteration, from the raw snapshot."""
    free = [n.cores - n.cores_used for n in snap.nodes if n.state == "free"]
    pending = [i for i in insts if i.state in ("requested", "pending", "started")]
    bins = free + [i.cores for i in pending]
    new = 0
    cur = 0
    for job in snap.jobs:
        if job.state != "queued":
            continue
        for _ in range(job.count):
            for _k in range(job.nodes):  # next-fit: one chunk per node per job
                while cur < len(bins) and bins[cur] < job.cores:
                    cur += 1
                if cur < len(bins):
                    bins[cur] -= job.cores
                    if job.nodes > 1:
                        cur += 1
                else:
                    bins.append(CORES - job.cores)
                    new += 1
    actions = 0
    by_name = {n.name: n for n in snap.nodes}
    for inst in insts:
        node = by_name.get(inst.node_name)
        if node is not None and inst.state == "draining" and not node.jobs:
            actions += 1
    active = sum(1 for i in insts if i.state in ("requested", "pending", "started", "joined"))
    return actions + min(new, max(0, max_nodes - active))


RESULTS = Results("decision")


def timed(fn, repeat: int, name: str, baseline: str | None = None) -> tuple[float, float]:
    """(median, best) wall ms over ``repeat`` calls; recorded, with CPU time, as figure ``name``."""
    gc.collect()
    times, cpus = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    RESULTS.add(name, unit="ms", wall=times, cpu=cpus, scale=1000, baseline=baseline)
    return statistics.median(times) * 1000, min(times) * 1000


def peak_mib(fn) -> float:
    gc.collect()
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def scenario_big(repeat: int) -> None:
    print("## 1 domain, 10,000 nodes, 100,000 queued jobs")
    for burst, max_nodes, label in ((False, 9_900, "steady"), (True, 10_600, "burst ")):
        snap, insts = make_domain("big", 10_000, 100_000, burst=burst)
        t = time.perf_counter()
        digest = digest_of(snap)
        digest_ms = (time.perf_counter() - t) * 1000
        n_actions = iteration(snap, digest, insts, max_nodes)
        med, best = timed(lambda: iteration(snap, digest, insts, max_nodes), repeat,  # noqa: B023
                          f"{label.strip()} engine, 10k nodes", f"{label.strip()} naive, 10k nodes")
        mem = peak_mib(lambda: iteration(snap, digest, insts, max_nodes))  # noqa: B023
        naive_actions = naive_iteration(snap, insts, max_nodes)
        nmed, nbest = timed(lambda: naive_iteration(snap, insts, max_nodes), 3,  # noqa: B023
                            f"{label.strip()} naive, 10k nodes")
        nmem = peak_mib(lambda: naive_iteration(snap, insts, max_nodes))  # noqa: B023
        print(f"{label} engine   : median {med:7.2f} ms  best {best:7.2f} ms  peak {mem:6.1f} MiB  "
              f"({n_actions} actions)  goal <= 20 ms: {'MET' if med <= 20 else 'MISSED'}")
        print(f"{label} naive    : median {nmed:7.2f} ms  best {nbest:7.2f} ms  peak {nmem:6.1f} MiB  "
              f"({naive_actions} actions; no placement, no guard rails)  engine x{nmed / med:.1f} faster")
        RESULTS.add(f"{label.strip()} digest, 10k nodes", unit="ms", wall=[digest_ms / 1000], scale=1000)
        print(f"{label} digest   : {digest_ms:7.2f} ms once per snapshot arrival "
              f"({len(digest[0].shapes)} job shapes, {len(digest[1])} nodes indexed)")


def scenario_many(repeat: int, store: bool) -> None:
    doms = [make_domain(f"d{i:03d}", 100, 1_000, seed=i) for i in range(100)]
    digests = [digest_of(s) for s, _ in doms]

    def all_domains() -> int:
        return sum(iteration(s, d, insts, 103) for (s, insts), d in zip(doms, digests, strict=True))

    def all_naive() -> int:
        return sum(naive_iteration(s, insts, 103) for s, insts in doms)

    all_domains()
    med, best = timed(all_domains, repeat, "engine, 100 domains x 100 nodes", "naive, 100 domains x 100 nodes")
    mem = peak_mib(all_domains)
    nmed, nbest = timed(all_naive, repeat, "naive, 100 domains x 100 nodes")
    nmem = peak_mib(all_naive)
    print("## 100 domains x 100 nodes (1,000 queued jobs each)")
    print(f"engine iteration : median {med:7.2f} ms  best {best:7.2f} ms  peak {mem:6.1f} MiB  "
          f"({med / 100:.3f} ms per domain)")
    print(f"naive baseline   : median {nmed:7.2f} ms  best {nbest:7.2f} ms  peak {nmem:6.1f} MiB")
    if store:
        full_engine(doms)


def grouped_domain(name: str, n_nodes: int, n_jobs: int, seed: int = 1) -> tuple[SensorSnapshot, list[Instance]]:
    """``make_domain``'s nodes and instances with the queue as the sensor now sends it: pending
    jobs grouped into shapes (90 % 1-core, 9 % 4-core, 1 % 4 nodes x 8 cores), not per-job records."""
    snap, insts = make_domain(name, n_nodes, 0, seed)
    shapes = [JobShape(count=c, cores=cores, nodes=nn, reason="Resources", reason_class="resources",
                       max_wait_s=600.0)
              for c, cores, nn in ((n_jobs * 90 // 100, 1, 1), (n_jobs * 9 // 100, 4, 1), (n_jobs // 100, 8, 4)) if c]
    return snap.model_copy(update={"shapes": shapes}), insts


def rss_mib() -> float:
    """Resident set size of this process now (not the peak)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def scenario_scale(iterations: int) -> None:
    """The whole ``Engine.iterate`` with its store, at the issue's scales (item 4): one domain of
    10,000 nodes / 100,000 jobs, one of 50,000 / 500,000, and 1,000 domains of 100 nodes."""
    print("## the whole Engine.iterate with its SQLite store (grouped snapshots, steady state)")
    for label, doms, max_nodes, goal_ms in (
            ("1 domain, 10k nodes / 100k jobs", lambda: [grouped_domain("big", 10_000, 100_000)], 9_900, 20),
            ("1 domain, 50k nodes / 500k jobs", lambda: [grouped_domain("huge", 50_000, 500_000)], 49_500, 50),
            ("1,000 domains x 100 nodes / 1k jobs",
             lambda: [grouped_domain(f"d{i:04d}", 100, 1_000, seed=i) for i in range(1000)], 103, 1000)):
        gc.collect()
        before = rss_mib()
        built = doms()
        t = time.process_time()
        full_engine(built, max_nodes=max_nodes, label=label, iterations=iterations, goal_ms=goal_ms)
        after = rss_mib()
        RESULTS.doc.setdefault("scale_rss_mib", {})[label] = [round(before), round(after)]
        print(f"   (set-up {time.process_time() - t:.1f} s CPU; RSS {before:.0f} -> {after:.0f} MiB with "
              f"the bench's own copy of the snapshots)")
        del built


def full_engine(doms, max_nodes: int = 103, label: str = "100 domains x 100 nodes", iterations: int = 5,
                goal_ms: float | None = None) -> None:
    """The whole Engine.iterate (SQLite store, fake bus) over ``doms``, steady state."""
    import tempfile

    from epu.common.clock import ManualClock
    from epu.common.config import parse_config
    from epu.services.decision.engine import Engine
    from epu.services.decision.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        cfg = parse_config({
            "decision": {"store_url": f"sqlite:///{tmp}/b.db"},
            "domains": {s.domain: {"max_nodes": max_nodes, "cores_per_node": CORES, "sites": ["s0", "s1", "s2"]}
                        for s, _ in doms},
            "sites": {f"s{i}": {"driver": "epu-sim", "quota": 100000, "cores": CORES} for i in range(3)},
        }, environ={})
        clock = ManualClock(NOW)
        store = Store(cfg.decision.store_url).create()
        sent = []
        engine = Engine(cfg, store, sent.append, clock)
        store.save_instances([i for _, insts in doms for i in insts])
        for s, _ in doms:
            engine.on_snapshot(s)
        engine.iterate()  # first: launches everything the queue asks for
        times, cpus = [], []
        for _ in range(iterations):
            clock.advance(5)
            t, c = time.perf_counter(), time.process_time()
            engine.iterate()
            times.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        RESULTS.add(f"full Engine.iterate, {label} (SQLite)", unit="ms", wall=times, cpu=cpus, scale=1000,
                    **({"goal_ms": goal_ms} if goal_ms else {}))
        med = statistics.median(times) * 1000
        goal = f"  goal <= {goal_ms:g} ms: {'MET' if med <= goal_ms else 'MISSED'}" if goal_ms else ""
        print(f"full engine      : median {med:7.1f} ms (CPU {statistics.median(cpus) * 1000:.1f} ms) per iteration, "
              f"{label}, incl. SQLite reads/writes (steady state){goal}")
        if goal_ms is None:
            store_writes(store, [i for _, insts in doms for i in insts])


def store_writes(store, rows) -> None:
    """Saving a burst of instance rows: the store's batched upsert against the per-row upsert
    it replaced (an UPDATE, then an INSERT when nothing matched, each statement built anew)."""
    from dataclasses import asdict

    from epu.services.decision.store import _upsert, instances

    def per_row() -> None:
        with store.engine.begin() as conn:
            for inst in rows:
                values = asdict(inst)
                iid = values.pop("instance_id")
                _upsert(conn, instances, {"instance_id": iid}, values)

    t = time.perf_counter()
    store.save_instances(rows)
    batched = time.perf_counter() - t
    t = time.perf_counter()
    per_row()
    baseline = time.perf_counter() - t
    RESULTS.add(f"store writes, {len(rows):,} rows batched", unit="ms", wall=[batched], scale=1000,
                baseline=f"store writes, {len(rows):,} rows per-row upsert")
    RESULTS.add(f"store writes, {len(rows):,} rows per-row upsert", unit="ms", wall=[baseline], scale=1000)
    print(f"store writes     : {len(rows):,} instance rows saved in {batched * 1000:7.1f} ms batched; "
          f"per-row upsert baseline {baseline * 1000:7.1f} ms (x{baseline / batched:.1f})")


def snapshot_memory() -> None:
    """What holding the big snapshot and its digest costs (they live between iterations)."""
    gc.collect()
    tracemalloc.start()
    snap, insts = make_domain("big", 10_000, 100_000)
    digest_of(snap)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    RESULTS.doc["state_held_mib"] = round(current / 2**20, 1)
    print(f"state held       : {current / 2**20:6.1f} MiB for the 10,000-node / 100,000-job snapshot, "
          f"its digest and 10,300 instance rows (peak while building {peak / 2**20:.1f} MiB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--store", action="store_true", help="also time the full engine iteration with SQLite")
    ap.add_argument("--scale", action="store_true", help="also the whole Engine.iterate at 10k / 50k nodes "
                    "and 1,000 domains (about a minute more)")
    ap.add_argument("--scale-only", action="store_true", help="only --scale (its RSS figures then start from a "
                    "fresh process)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (bench/benchjson.py)")
    args = ap.parse_args()
    if args.scale_only:
        with json_mode(args.json):
            scenario_scale(5)
        if args.json:
            RESULTS.emit()
        return
    with json_mode(args.json):
        print(f"# python {sys.version.split()[0]}, {os.cpu_count()} cpu, load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        scenario_big(args.repeat)
        snapshot_memory()
        scenario_many(args.repeat, args.store)
        if args.scale:
            scenario_scale(5)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        RESULTS.doc["max_rss_mib"] = round(rss)
        print(f"# process max RSS {rss:.0f} MiB")
    if args.json:
        RESULTS.emit()


if __name__ == "__main__":
    main()
