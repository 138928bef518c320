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

``--scale`` / ``--scale-only`` (issue 15, item 4): the whole ``Engine.iterate`` with its SQLite
store and leases at 10,000 nodes, 50,000 nodes and 1,000 domains — steady, and right after a new
snapshot (with the snapshot's arrival timed apart) —, lease renewals of 1,000 domains in one
transaction against one per domain, and (``--scale-only``, unless ``--no-rss``) the memory of
the real ``epu run decision`` process on RabbitMQ (VmRSS/VmHWM from /proc).

Run: ``.venv/bin/python bench/bench_decision.py [--repeat 20] [--store] [--scale | --scale-only | --rss-only]``
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
from epu.services.decision.census import refresh_parts  # noqa: E402
from epu.services.decision.placement import SiteInfo  # noqa: E402
from epu.services.decision.planner import PlacementInput, plan  # noqa: E402
from epu.services.decision.policies import POLICIES, validate_params  # noqa: E402
from epu.services.decision.view import Instance, JobDigest, NodeIndex, build_view  # noqa: E402

NOW = 1_700_000_000.0
CORES = 8


def make_domain(name: str, n_nodes: int, n_jobs: int, seed: int = 1,
                burst: bool = False, now: float = NOW) -> tuple[SensorSnapshot, list[Instance]]:
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
        insts.append(Instance(f"{name}i{i}", name, f"s{i % 3}", node_name, CORES, inst_state, now - 3600,
                              now - 3600, joined_at=now - 3000, idle_since=now - 100 if state == "free" else None,
                              add_sent_at=now - 3500, missing_since=now - 60 if state == "down" else None,
                              seen_at=now - 3000))  # steady state: the engine stored when it first saw it
    for i in range(n_nodes * 3 // 100):
        insts.append(Instance(f"{name}p{i}", name, "s0", f"{name}-p{i:06x}", CORES, "pending", now - 60, now - 60))
    jobs = []
    for j in range(n_jobs):
        r = rnd.random()
        cores, nn = (1, 1) if r < 0.9 else (4, 1) if r < 0.99 else (8, 4)
        jobs.append(QueuedJob(job_id=str(j), cores=cores, nodes=nn, wait_seconds=rnd.random() * 600))
    snap = SensorSnapshot(domain=name, backend="bench", taken_at=now, jobs=jobs, nodes=nodes)
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


def grouped_domain(name: str, n_nodes: int, n_jobs: int, seed: int = 1,
                   now: float = NOW) -> tuple[SensorSnapshot, list[Instance]]:
    """``make_domain``'s nodes and instances with the queue as the sensor now sends it: pending
    jobs grouped into shapes (90 % 1-core, 9 % 4-core, 1 % 4 nodes x 8 cores), not per-job records."""
    snap, insts = make_domain(name, n_nodes, 0, seed, now=now)
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
    print("## the whole Engine.iterate with its SQLite store and leases (grouped snapshots)")
    for label, doms, max_nodes, goal_ms in (
            ("1 domain, 10k nodes / 100k jobs", lambda: [grouped_domain("big", 10_000, 100_000)], 9_900, 20),
            ("1 domain, 50k nodes / 500k jobs", lambda: [grouped_domain("huge", 50_000, 500_000)], 49_500, 50),
            ("1,000 domains x 100 nodes / 1k jobs",
             lambda: [grouped_domain(f"d{i:04d}", 100, 1_000, seed=i) for i in range(1000)], 103, 1000)):
        gc.collect()
        before = rss_mib()
        built = doms()
        t = time.process_time()
        full_engine(built, max_nodes=max_nodes, label=label, iterations=iterations, goal_ms=goal_ms, fresh=True)
        after = rss_mib()
        RESULTS.doc.setdefault("scale_rss_mib", {})[label] = [round(before), round(after)]
        print(f"   (set-up {time.process_time() - t:.1f} s CPU; RSS {before:.0f} -> {after:.0f} MiB with "
              f"the bench's own copy of the snapshots)")
        del built
    lease_renewals(1000)


def lease_renewals(n: int, repeat: int = 5) -> None:
    """Renewing the leases of ``n`` domains held by this engine, SQLite: one transaction for all
    (``Leases.renew_many``, what ``Engine.iterate`` does now) against one ``hold`` — one
    transaction, one commit — per domain (what it did before)."""
    import tempfile

    from epu.services.decision.lease import Leases
    from epu.services.decision.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        leases = Leases(Store(f"sqlite:///{tmp}/l.db").create().engine, "bench", 15.0).create()
        domains = [f"d{i:04d}" for i in range(n)]
        for d in domains:
            leases.hold(d, NOW)
        at = [NOW]

        def batched() -> None:
            at[0] += 1
            assert len(leases.renew_many(domains, at[0])) == n

        def one_by_one() -> None:
            at[0] += 1
            assert all(leases.hold(d, at[0]) for d in domains)

        med, _ = timed(batched, repeat, f"lease renewals, {n:,} domains, one transaction",
                       f"lease renewals, {n:,} domains, one per domain")
        bmed, _ = timed(one_by_one, repeat, f"lease renewals, {n:,} domains, one per domain")
        print(f"lease renewals   : {n:,} domains in {med:.1f} ms (one transaction); one per domain "
              f"{bmed:.1f} ms (x{bmed / med:.0f})")


def full_engine(doms, max_nodes: int = 103, label: str = "100 domains x 100 nodes", iterations: int = 5,
                goal_ms: float | None = None, fresh: bool = False) -> None:
    """The whole Engine.iterate over ``doms`` — SQLite store and leases as ``epu run decision``
    has them, fake bus — in steady state: the same snapshots (the engine iterates every 5 s, the
    sensor sends one every 60 s by default). With ``fresh``, also iterations each right after a
    new snapshot of every domain (the same content, new objects: what the engine sees at each
    sensor poll), and that snapshot's arrival (``Engine.on_snapshot``: digest, node index).
    The heap is kept as ``epu run decision`` keeps it (``heap.HeapKeeper``: installed, settled
    after each snapshot's arrival and, inside the timed part as in the service, after each
    iteration), so the figures are the service's, not a bare interpreter's collector pauses."""
    import tempfile

    from epu.common.clock import ManualClock
    from epu.common.config import parse_config
    from epu.services.decision.engine import Engine
    from epu.services.decision.heap import HeapKeeper
    from epu.services.decision.lease import Leases
    from epu.services.decision.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        cfg = parse_config({
            "decision": {"store_url": f"sqlite:///{tmp}/b.db"},
            "domains": {s.domain: {"max_nodes": max_nodes, "cores_per_node": CORES, "sites": ["s0", "s1", "s2"]}
                        for s, _ in doms},
            "sites": {f"s{i}": {"driver": "epu-sim", "quota": 100000, "cores": CORES} for i in range(3)},
        }, environ={})
        heap = HeapKeeper()
        thresholds = gc.get_threshold()
        heap.install()  # as build_service does (undone below: later figures of this process are not the service's)
        clock = ManualClock(NOW)
        store = Store(cfg.decision.store_url).create()
        leases = Leases(store.engine, "bench", cfg.decision.lease_ttl()).create()
        sent = []
        engine = Engine(cfg, store, sent.append, clock, leases=leases)
        store.save_instances([i for _, insts in doms for i in insts])
        for s, _ in doms:
            engine.on_snapshot(s)
            heap.settle(iteration=False)
        engine.iterate()  # first: launches everything the queue asks for
        heap.settle()

        def run(name: str, before=None) -> list[float]:
            times, cpus, arrivals, arrival_cpus = [], [], [], []
            for _ in range(iterations):
                clock.advance(5)
                if before is not None:
                    t, c = time.perf_counter(), time.process_time()
                    before()
                    heap.settle(iteration=False)  # as the service's snapshot handler does
                    arrivals.append(time.perf_counter() - t)
                    arrival_cpus.append(time.process_time() - c)
                t, c = time.perf_counter(), time.process_time()
                engine.iterate()
                heap.settle()  # inside the service's iteration
                times.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
            RESULTS.add(name, unit="ms", wall=times, cpu=cpus, scale=1000, **({"goal_ms": goal_ms} if goal_ms else {}))
            med, cmed = statistics.median(times) * 1000, statistics.median(cpus) * 1000
            goal = (f"  goal <= {goal_ms:g} ms: {'MET' if med <= goal_ms else 'MISSED'} (wall), "
                    f"{'MET' if cmed <= goal_ms else 'MISSED'} (CPU)") if goal_ms else ""
            print(f"{name}: median {med:7.1f} ms (CPU {cmed:.1f} ms, max {max(cpus) * 1000:.1f}){goal}")
            if arrivals:
                RESULTS.add(f"snapshot arrival (Engine.on_snapshot), {label}", unit="ms", wall=arrivals,
                            cpu=arrival_cpus, scale=1000)
                print(f"   arrival of the new snapshot(s): median {statistics.median(arrivals) * 1000:.1f} ms "
                      f"(CPU {statistics.median(arrival_cpus) * 1000:.1f} ms), once per snapshot")
            return times

        run(f"full Engine.iterate, {label} (SQLite)")
        if fresh:
            def new_snapshots() -> None:
                for s, _ in doms:
                    engine.on_snapshot(s.model_copy(update={"taken_at": clock.now()}))

            run(f"full Engine.iterate after a new snapshot, {label} (SQLite)", new_snapshots)
            flip = random.Random(7)

            def churned_snapshots() -> None:
                """1 % of the nodes changed since the last snapshot (a busy node freed, a free one
                taken): their instances' idle timers change, the engine stores them."""
                for k, (s, _) in enumerate(doms):
                    s = churned(s, flip, clock.now())
                    doms[k] = (s, doms[k][1])
                    engine.on_snapshot(s)

            run(f"full Engine.iterate after a new snapshot with 1 % of nodes changed, {label} (SQLite)",
                churned_snapshots)
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        if goal_ms is None:
            store_writes(store, [i for _, insts in doms for i in insts])


def churned(snap: SensorSnapshot, flip: random.Random, now: float) -> SensorSnapshot:
    """``snap`` taken again at ``now`` with 1 % of its nodes (``flip``'s pick) changed: a busy node
    freed, a free one taken (their instances' idle timers change: the engine stores them)."""
    nodes = list(snap.nodes)
    for i in flip.sample(range(len(nodes)), max(1, len(nodes) // 100)):
        n = nodes[i]
        if n.state in ("busy", "free"):
            busy = n.state == "free"
            nodes[i] = n.model_copy(update={"state": "busy" if busy else "free", "cores_used": CORES if busy else 0,
                                            "jobs": [f"c{i}"] if busy else []})
    return snap.model_copy(update={"taken_at": now, "nodes": nodes})


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _metrics(port: int) -> dict[str, float]:
    """The service's /metrics, unlabelled series only (name → value)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:  # noqa: S310 - localhost
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def _healthy(port: int) -> bool:
    """/healthz answers 200 only once connected with every consumer consuming."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:  # noqa: S310 - localhost
            return r.status == 200
    except urllib.error.HTTPError:
        return False


def _proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) of ``pid``, in MiB, from /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = cond()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def process_rss(n_nodes: int = 10_000, n_jobs: int = 100_000, settle_iterations: int = 3,
                snapshots: int = 3) -> None:
    """The memory goal on the real service: ``epu run decision`` in a subprocess on the real
    RabbitMQ (a vhost of its own) and an SQLite store seeded with the domain's instance rows;
    ``snapshots`` grouped snapshots of ``n_nodes`` nodes / ``n_jobs`` pending jobs published to
    it one after the other (so the peak includes a new snapshot decoded while the engine holds the
    last), each followed by ``settle_iterations`` iterations; then its VmRSS and VmHWM (peak) from
    /proc/PID/status — the whole process: interpreter, libraries, broker connection, snapshot,
    store working set. Also its own iteration times (``epu_decision_iteration_seconds``)."""
    import subprocess
    import tempfile
    import uuid

    from epu.common.broker import Publisher
    from epu.common.config import load_config
    from epu.services.decision.store import Store

    vhost = f"epu-bench-{uuid.uuid4().hex[:6]}"
    try:
        subprocess.run(["rabbitmqctl", "add_vhost", vhost], check=True, capture_output=True, timeout=60)
        subprocess.run(["rabbitmqctl", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"], check=True,
                       capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"process RSS: skipped, no RabbitMQ to run the service on ({exc})")
        return
    proc = None
    try:
        with tempfile.TemporaryDirectory(prefix="epu-bench-") as tmp:
            now = time.time()
            snap, insts = grouped_domain("big", n_nodes, n_jobs, now=now)
            store = Store(f"sqlite:///{tmp}/decision.db").create()
            store.save_instances(insts)
            store.engine.dispose()
            port = _free_port()
            path = Path(tmp) / "epu.toml"
            path.write_text(f"""
[broker]
url = "amqp://guest:guest@127.0.0.1:5672/{vhost}"
[decision]
store_url = "sqlite:///{tmp}/decision.db"
iteration_seconds = 1.0
metrics_port = {port}
[domains.big]
max_nodes = {n_nodes - n_nodes // 100}
cores_per_node = {CORES}
sites = ["s0", "s1", "s2"]
""" + "".join(f'[sites.s{i}]\ndriver = "epu-sim"\nquota = 100000\ncores = {CORES}\n' for i in range(3)))
            log = open(Path(tmp) / "decision.log", "w")  # noqa: SIM115 - closed with the process
            proc = subprocess.Popen([sys.executable, "-m", "epu", "run", "decision", "-c", str(path)],
                                    stdout=log, stderr=subprocess.STDOUT)
            _wait(lambda: _healthy(port), 120, "the service healthy (connected, consuming)")
            idle = _proc_status(proc.pid)
            pub = Publisher(load_config(path, environ={}).broker_obj(), source="bench")
            first: dict[str, float] = {}
            for k in range(snapshots):  # as the sensor does at each poll: a new snapshot, the old one dropped
                pub.publish(snap.model_copy(update={"taken_at": time.time()}))
                if k == 0:
                    try:
                        _wait(lambda: _metrics(port).get("epu_decision_active_domains") == 1.0, 120,
                              "the domain active")
                    except TimeoutError:
                        print((Path(tmp) / "decision.log").read_text()[-3000:], file=sys.stderr)
                        raise
                    first = _metrics(port)
                n_at = _metrics(port)["epu_decision_iteration_seconds_count"]
                last = _wait(lambda: (m := _metrics(port))["epu_decision_iteration_seconds_count"]  # noqa: B023
                             >= n_at + settle_iterations and m, 120,  # noqa: B023
                             f"{settle_iterations} iterations with the snapshot")
            pub.close()
            n0 = first["epu_decision_iteration_seconds_count"]
            status = _proc_status(proc.pid)
            n = last["epu_decision_iteration_seconds_count"] - n0
            mean_ms = (last["epu_decision_iteration_seconds_sum"] - first["epu_decision_iteration_seconds_sum"]) / n * 1000
            RESULTS.doc["decision_process_mib"] = {
                "what": f"epu run decision (subprocess, real RabbitMQ, SQLite), {n_nodes:,} nodes / {n_jobs:,} "
                        f"pending jobs in a grouped snapshot ({snapshots} sent, one after the other), "
                        f"{len(insts):,} instance rows, after {int(n)} iterations", "VmRSS_idle": round(idle["VmRSS"], 1),
                "VmRSS": round(status["VmRSS"], 1), "VmHWM": round(status["VmHWM"], 1), "goal": 100,
                "iteration_wall_ms_mean": round(mean_ms, 1)}
            print(f"epu run decision : VmRSS {status['VmRSS']:.1f} MiB, peak (VmHWM) {status['VmHWM']:.1f} MiB "
                  f"with {n_nodes:,} nodes / {n_jobs:,} jobs ({idle['VmRSS']:.1f} MiB before the snapshot); "
                  f"its iterations {mean_ms:.1f} ms wall on average over {int(n)}  goal <= 100 MB: "
                  f"{'MET' if status['VmRSS'] * 2**20 <= 100e6 else 'MISSED'} (RSS), "
                  f"{'MET' if status['VmHWM'] * 2**20 <= 100e6 else 'MISSED'} (peak)")
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run(["rabbitmqctl", "delete_vhost", vhost], capture_output=True, timeout=60)


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
    ap.add_argument("--no-rss", action="store_true", help="with --scale-only: skip the memory of the real "
                    "`epu run decision` process (it needs RabbitMQ)")
    ap.add_argument("--rss-only", action="store_true", help="only the memory of the real `epu run decision` "
                    "process (about a minute; it needs RabbitMQ)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (bench/benchjson.py)")
    args = ap.parse_args()
    if args.rss_only:
        with json_mode(args.json):
            process_rss()
        if args.json:
            RESULTS.emit()
        return
    if args.scale_only:
        with json_mode(args.json):
            scenario_scale(5)
            if not args.no_rss:
                process_rss()
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
