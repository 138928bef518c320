"""Benchmark: launches per second against the simulated cloud with 200 ms API latency.

What is measured: the wall time from the first ``handle_launch`` until every launch is
stored as ``pending`` with its cloud id — the full path (intent stored in SQLite, event
emitted, rate limiter, create call on the site's worker threads, transition stored,
event emitted) minus the AMQP hop, which is RabbitMQ's cost, not the provisioner's. Events
are collected in memory.

Baseline, same run: the same code with ``max_in_flight = 1`` (one call at a time, as a
serial provisioner would do) over ``--serial`` launches, extrapolated to ``--launches``.
Peak memory: the process's max RSS; with ``--trace-memory`` also the Python heap peak
(tracemalloc, which slows the run).

    .venv/bin/python bench/bench_provisioner.py [--launches 1000] [--latency 0.2] [--in-flight 64]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchjson import Results, json_mode  # noqa: E402
from epu.common.config.provisioner import SiteConfig  # noqa: E402
from epu.common.messages import LaunchRequest  # noqa: E402
from epu.services.provisioner.cloud import LibcloudSite  # noqa: E402
from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings  # noqa: E402
from epu.services.provisioner.sim import SimulatedNodeDriver  # noqa: E402
from epu.services.provisioner.store import Store  # noqa: E402
from epu.services.provisioner.userdata import UserdataRenderer  # noqa: E402


def run(n: int, latency: float, in_flight: int, rate: float, workdir: Path, tag: str) -> float:
    cloud = SimulatedNodeDriver(path=str(workdir / f"{tag}-cloud.db"), api_latency=latency)
    cfg = SiteConfig(driver="epu-sim", image="sim-image", size="sim.1core", max_in_flight=in_flight,
                     rate_limit_per_second=rate, quota=n + 1)
    events: list[object] = []
    store = Store(f"sqlite:///{workdir / f'{tag}-store.db'}")
    prov = Provisioner(store, {"sim": LibcloudSite("sim", cfg, cloud, "bench")}, events.append,
                       settings=ProvisionerSettings(deployment="bench"),
                       renderers={"sim": UserdataRenderer.from_path()})
    requests = [LaunchRequest(launch_id=f"{tag}-{i}", domain="bench", site="sim", node_name=f"w{i}")
                for i in range(n)]
    t0 = time.perf_counter()
    for req in requests:
        prov.handle_launch(req)
    prov.wait_idle(timeout=3600)
    elapsed = time.perf_counter() - t0
    counts = store.counts()
    assert counts == {"pending": n}, counts
    assert cloud.ex_count() == n
    assert len(events) == 2 * n
    prov.shutdown()
    store.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=1000)
    ap.add_argument("--serial", type=int, default=50, help="launches in the serial baseline (extrapolated)")
    ap.add_argument("--latency", type=float, default=0.2, help="simulated API latency, seconds")
    ap.add_argument("--in-flight", type=int, default=64, help="site max_in_flight")
    ap.add_argument("--rate", type=float, default=1000.0, help="site rate limit, calls/s")
    ap.add_argument("--trace-memory", action="store_true",
                    help="also measure the Python heap peak with tracemalloc (slows the run ~2x)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (bench/benchjson.py)")
    args = ap.parse_args()
    with json_mode(args.json):
        results = report(args)
    if args.json:
        results.emit()


def report(args: argparse.Namespace) -> Results:
    with tempfile.TemporaryDirectory(prefix="epu-bench-") as tmp:
        work = Path(tmp)
        serial = run(args.serial, args.latency, 1, args.rate, work, "serial")
        if args.trace_memory:
            tracemalloc.start()
        concurrent = run(args.launches, args.latency, args.in_flight, args.rate, work, "concurrent")
        peak = tracemalloc.get_traced_memory()[1] if args.trace_memory else None
        tracemalloc.stop()
    serial_rate = args.serial / serial
    rate = args.launches / concurrent
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"launches={args.launches} api_latency={args.latency * 1000:.0f}ms in_flight={args.in_flight} "
          f"rate_limit={args.rate:g}/s")
    print(f"concurrent: {concurrent:.2f} s wall, {rate:.1f} launches/s")
    print(f"serial baseline: {args.serial} launches in {serial:.2f} s = {serial_rate:.2f} launches/s "
          f"-> {args.launches / serial_rate:.0f} s for {args.launches} (extrapolated)")
    print(f"speed-up: {rate / serial_rate:.1f}x; goal >= 100 launches/s: {'met' if rate >= 100 else 'NOT met'}")
    heap = f"python heap peak {peak / 2**20:.1f} MiB (tracemalloc), " if peak is not None else ""
    print(f"peak memory: {heap}max RSS {rss_mb:.0f} MiB (whole process)")
    results = Results("provisioner")
    results.add(f"{args.launches} launches, {args.in_flight} in flight", unit="launches/s", rate=round(rate, 1),
                wall_s=round(concurrent, 2), baseline="serial")
    results.add("serial", unit="launches/s", rate=round(serial_rate, 2), launches=args.serial,
                wall_s=round(serial, 2))
    results.doc.update(api_latency_ms=args.latency * 1000, max_rss_mib=round(rss_mb))
    return results


if __name__ == "__main__":
    main()
