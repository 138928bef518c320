"""The decision engine's iterations that write, alone: ``Engine.iterate`` with its SQLite store and
leases (``bench_decision.full_engine``'s set-up) after each new snapshot in which 1 % of the nodes
flipped busy <-> free (``full_engine``'s ``churned_snapshots``), so instance timers change and
the engine stores them every iteration. Prints the CPU median (wall beside) of N iterations, and
that of the snapshots' arrival before each (``Engine.on_snapshot``: digest, node index, free
workers — work done once per snapshot, outside the iteration).
The heap is kept as ``epu run decision`` keeps it (``heap.HeapKeeper``: settled after each
snapshot and, inside the timed part as in the service's iteration, after each iteration), on
trees that have it.

``EPU_TREE=/path/to/another/checkout`` runs that tree's ``epu`` instead of this one (through the
editable install's mapping), for before/after pairs in one window:
``git archive <commit> | tar -x -C /tmp/before``, then alternate
``EPU_TREE=/tmp/before .venv/bin/python bench/bench_churn.py 50k 7`` and
``.venv/bin/python bench/bench_churn.py 50k 7``.

Run: ``.venv/bin/python bench/bench_churn.py {10k|50k|1000} [iterations]``
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE = os.environ.get("EPU_TREE")
if TREE:
    import __editable___epu_0_1_0_finder as finder  # the editable install's name → path map

    for name, path in list(finder.MAPPING.items()):
        finder.MAPPING[name] = path.replace(str(HERE.parent), TREE)
sys.path.insert(0, str(HERE))

import bench_decision as B  # noqa: E402
from epu.common.clock import ManualClock  # noqa: E402
from epu.common.config import parse_config  # noqa: E402
from epu.services.decision.engine import Engine  # noqa: E402
from epu.services.decision.lease import Leases  # noqa: E402
from epu.services.decision.store import Store  # noqa: E402

try:
    from epu.services.decision.heap import HeapKeeper  # noqa: E402
except ImportError:  # a tree from before it
    HeapKeeper = None  # type: ignore[assignment,misc]

SCALES = {
    "10k": (lambda: [B.grouped_domain("big", 10_000, 100_000)], 9_900),
    "50k": (lambda: [B.grouped_domain("huge", 50_000, 500_000)], 49_500),
    "1000": (lambda: [B.grouped_domain(f"d{i:04d}", 100, 1_000, seed=i) for i in range(1000)], 103),
}


def run(scale: str, iterations: int) -> None:
    make, max_nodes = SCALES[scale]
    doms = make()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = parse_config({
            "decision": {"store_url": f"sqlite:///{tmp}/b.db"},
            "domains": {s.domain: {"max_nodes": max_nodes, "cores_per_node": B.CORES, "sites": ["s0", "s1", "s2"]}
                        for s, _ in doms},
            "sites": {f"s{i}": {"driver": "epu-sim", "quota": 100000, "cores": B.CORES} for i in range(3)},
        }, environ={})
        heap = HeapKeeper() if HeapKeeper is not None else None
        settle = heap.settle if heap is not None else (lambda **_: None)
        if heap is not None:
            heap.install()  # as build_service does
        clock = ManualClock(B.NOW)
        store = Store(cfg.decision.store_url).create()
        leases = Leases(store.engine, "bench", cfg.decision.lease_ttl()).create()
        sent: list = []
        engine = Engine(cfg, store, sent.append, clock, leases=leases)
        store.save_instances([i for _, insts in doms for i in insts])
        for s, _ in doms:
            engine.on_snapshot(s)
            settle(iteration=False)
        engine.iterate()  # launches what the queue asks for
        settle()
        for _ in range(2):  # steady
            clock.advance(5)
            engine.iterate()
            settle()
        flip = random.Random(7)

        def churn() -> float:
            """The new snapshots; returns the CPU their arrival took (``on_snapshot``, settle)."""
            cpu = 0.0
            for k, (s, _) in enumerate(doms):
                s = B.churned(s, flip, clock.now())
                doms[k] = (s, doms[k][1])
                c = time.process_time()
                engine.on_snapshot(s)
                settle(iteration=False)  # as the service's snapshot handler does
                cpu += time.process_time() - c
            return cpu

        cpus, walls, arrivals = [], [], []
        if heap is None:
            gc.collect()
        for _ in range(iterations):
            clock.advance(5)
            arrivals.append(churn())
            t, c = time.perf_counter(), time.process_time()
            engine.iterate()
            settle()  # inside the service's iteration
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
    print(f"{TREE or 'this tree'} {scale} churn: CPU median {statistics.median(cpus) * 1000:.1f} ms "
          f"(wall {statistics.median(walls) * 1000:.1f}); CPU each {[round(x * 1000, 1) for x in cpus]}; "
          f"load {os.getloadavg()[0]:.2f}; arrival (on_snapshot) CPU median "
          f"{statistics.median(arrivals) * 1000:.1f} ms"
          + (f"; full settles {heap.full_settles}" if heap is not None else ""))


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else "10k", int(sys.argv[2]) if len(sys.argv) > 2 else 7)
