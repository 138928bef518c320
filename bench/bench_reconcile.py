"""Benchmark: what one poll and one reconciliation of a site cost beyond the listing itself.

What is measured: for N live instances on the simulated cloud (no API latency), the time of
``Provisioner.poll`` and ``Provisioner.reconcile`` (list, read the store, decide with
``reconcile.observe``/``reconcile.reconcile``, write what changed) — in steady state, and
with a third of the nodes missing from every listing (misses counted and saved each round).
Also the pure decision alone on the same inputs.

Baseline, same run: the listing alone (``site.nodes()``), which every poll must pay; the rest
is the provisioner's own cost. Wall and CPU (process time) per call, min/median/max over
``--repeat`` calls.

    .venv/bin/python bench/bench_reconcile.py [--nodes 50 500] [--repeat 30]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchjson import Results, json_mode  # noqa: E402
from epu.common.clock import ManualClock  # noqa: E402
from epu.common.config.provisioner import SiteConfig  # noqa: E402
from epu.common.messages import LaunchRequest  # noqa: E402
from epu.services.provisioner import reconcile as core  # noqa: E402
from epu.services.provisioner.cloud import LibcloudSite  # noqa: E402
from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings  # noqa: E402
from epu.services.provisioner.sim import SimulatedNodeDriver  # noqa: E402
from epu.services.provisioner.store import Store  # noqa: E402


def measure(fn: Callable[[], object], repeat: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


RESULTS = Results("reconcile")


def fmt(name: str, wall: list[float], cpu: list[float], n: int = 0, baseline: str | None = "listing alone") -> str:
    """One line of the table; the figure is recorded as ``name (n nodes)`` for ``--json``."""
    RESULTS.add(f"{name} ({n} nodes)", unit="ms", wall=wall, cpu=cpu, scale=1000,
                baseline=f"{baseline} ({n} nodes)" if baseline and not name.startswith(baseline) else None)
    ms = [x * 1000 for x in wall]
    return (f"  {name:<28} wall ms min/med/max {min(ms):7.2f} {statistics.median(ms):7.2f} {max(ms):7.2f}"
            f"   cpu ms median {statistics.median(cpu) * 1000:7.2f}")


def bench(n: int, repeat: int, work: Path) -> None:
    clock = ManualClock()
    cloud = SimulatedNodeDriver(path=str(work / f"cloud-{n}.db"), boot_time_min=1, boot_time_max=1, clock=clock)
    cfg = SiteConfig(driver="epu-sim", image="sim-image", size="sim.1core", quota=n + 1,
                     rate_limit_per_second=1e6, max_in_flight=16)
    prov = Provisioner(Store(f"sqlite:///{work / f'store-{n}.db'}"), {"sim": LibcloudSite("sim", cfg, cloud)},
                       lambda e: None, clock=clock, settings=ProvisionerSettings())
    for i in range(n):
        prov.handle_launch(LaunchRequest(launch_id=f"l{i}", domain="bench", site="sim", node_name=f"w{i}"))
    assert prov.wait_idle(600)
    clock.advance(5)
    prov.poll("sim")
    site = prov.sites["sim"]
    print(f"nodes={n} repeat={repeat}")
    print(fmt("listing alone", *measure(site.nodes, repeat), n))
    print(fmt("poll, steady", *measure(lambda: prov.poll("sim"), repeat), n))
    print(fmt("reconcile, steady", *measure(lambda: prov.reconcile("sim"), repeat), n))
    listed = site.nodes()
    world = prov._world("sim", listed, clock.now(), sightings=True)
    rules = prov.rules()
    print(fmt("reconcile decision alone", *measure(lambda: core.reconcile(world, rules), repeat), n))
    real = site.nodes
    site.nodes = lambda: [x for x in real() if int(x.launch_id[1:]) % 3]  # type: ignore[method-assign]

    def poll_with_gaps() -> None:
        clock.advance(15)
        prov.poll("sim")

    print(fmt("poll, a third missing", *measure(poll_with_gaps, repeat), n))
    presumed = sum(1 for r in prov.store.list(active_only=True) if r.presumed_gone)
    print(f"  presumed gone after {repeat} gappy polls: {presumed} of {n}")
    prov.shutdown()
    prov.store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[50, 500])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (bench/benchjson.py)")
    args = ap.parse_args()
    logging.getLogger("epu").setLevel(logging.ERROR)  # the gappy polls warn once per presumed node
    with json_mode(args.json), tempfile.TemporaryDirectory(prefix="epu-bench-") as tmp:
        for n in args.nodes:
            bench(n, args.repeat, Path(tmp))
    if args.json:
        RESULTS.emit()


if __name__ == "__main__":
    main()
