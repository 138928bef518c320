"""Benchmark: the provisioner's poll and anti-entropy report at production size (SQLite store).

What is measured, for N live instances of one domain on one site (default 1,000 and 10,000):

* ``poll`` — ``Provisioner.poll``: list the site through ``LibcloudSite`` (a driver that builds
  new libcloud ``Node`` objects at every call, as libcloud's real drivers do when they parse an
  API answer), read the store's records, ``reconcile.observe``, write what changed. Quiet (the
  cloud and the records as they were) and with 1 % of the nodes' addresses changed per poll.
* ``report`` — ``app.publish_reports``: list the store's live and recently ended records and
  build one ``instance.report`` per domain. Quiet, and with 1 % of the records changed per report.

Baselines, same run: the listing alone (``LibcloudSite.nodes``) and the store read alone
(``Store.list``), which every poll / report must pay; the rest is the provisioner's own cost.
Wall and CPU (process time) per call, min/median/max over ``--repeat`` calls; the writes that
change records between calls are not timed.

    .venv/bin/python bench/bench_provisioner_scale.py [--nodes 1000 10000] [--repeat 10]
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchjson import Results, json_mode  # noqa: E402
from epu.common.clock import ManualClock  # noqa: E402
from epu.common.config.provisioner import SiteConfig  # noqa: E402
from epu.common.messages import LaunchRequest  # noqa: E402
from epu.services.provisioner import app  # noqa: E402
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_DOMAIN, TAG_LAUNCH, TAG_STORE, LibcloudSite  # noqa: E402
from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings  # noqa: E402
from epu.services.provisioner.store import Store  # noqa: E402
from libcloud.compute.base import Node  # noqa: E402
from libcloud.compute.types import NodeState  # noqa: E402

RESULTS = Results("provisioner_scale")
DEPLOYMENT = "bench"


class ParsingDriver:
    """A cloud whose ``list_nodes`` makes new ``Node`` objects from its table at every call (what
    a real libcloud driver does with each API answer); no latency, no faults."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def list_nodes(self, *args: Any, **kwargs: Any) -> list[Node]:
        return [Node(id=cid, name=r["name"], state=NodeState.RUNNING, public_ips=[r["ip"]], private_ips=[],
                     driver=self, extra={"tags": dict(r["tags"])}) for cid, r in self.rows.items()]

    def create_node(self, name: str, size: Any, image: Any, ex_metadata: dict[str, str] | None = None,
                    ex_clienttoken: str | None = None) -> Node:
        raise NotImplementedError("the bench seeds its nodes; nothing launches")


class Sender:
    """What ``publish_reports`` needs of a service: a clock and a publish that keeps nothing."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sent = 0

    def publish(self, message: object) -> None:
        self.sent += 1


def measure(fn: Callable[[], object], repeat: int, between: Callable[[], object] | None = None
            ) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(repeat):
        if between is not None:
            between()
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def fmt(name: str, wall: list[float], cpu: list[float], n: int, baseline: str | None) -> str:
    """One line of the table; the figure is recorded as ``name (n nodes)`` for ``--json``."""
    RESULTS.add(f"{name} ({n} nodes)", unit="ms", wall=wall, cpu=cpu, scale=1000,
                baseline=f"{baseline} ({n} nodes)" if baseline else None)
    ms = [x * 1000 for x in wall]
    return (f"  {name:<26} wall ms min/med/max {min(ms):8.2f} {statistics.median(ms):8.2f} {max(ms):8.2f}"
            f"   cpu ms median {statistics.median(cpu) * 1000:8.2f}")


def seed(n: int, store: Store, cloud: ParsingDriver, store_id: str, clock: ManualClock) -> None:
    """N started records of domain ``bench`` and their running nodes, as a poll leaves them."""
    for i in range(n):
        lid = f"l{i}"
        store.record_launch(LaunchRequest(launch_id=lid, domain="bench", site="sim", node_name=f"w{i}"), clock.now())
        cid, ip = f"i-{i:08x}", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        store.advance(lid, "pending", clock.now(), cloud_id=cid, reason="created")
        store.advance(lid, "started", clock.now(), ip=ip, reason="node running")
        cloud.rows[cid] = {"name": f"w{i}", "ip": ip, "tags": {TAG_DEPLOYMENT: DEPLOYMENT, TAG_STORE: store_id,
                                                                TAG_LAUNCH: lid, TAG_DOMAIN: "bench"}}


def bench(n: int, repeat: int, work: Path) -> None:
    clock = ManualClock()
    cloud = ParsingDriver()
    cfg = SiteConfig(driver="epu-sim", image="sim-image", size="sim.1core", quota=n + 1,
                     rate_limit_per_second=1e6, max_in_flight=16)
    store = Store(f"sqlite:///{work / f'store-{n}.db'}")
    prov = Provisioner(store, {"sim": LibcloudSite("sim", cfg, cloud)},  # type: ignore[arg-type]
                       lambda e: None, clock=clock, settings=ProvisionerSettings(deployment=DEPLOYMENT))
    seed(n, store, cloud, prov.identity.store_id, clock)
    clock.advance(5)
    assert prov.poll("sim").transitions == 0
    site = prov.sites["sim"]
    rows = list(cloud.rows.values())
    step = max(1, n // 100)
    turn = [0]

    def change_ips() -> None:  # 1 % of the nodes show a new address: the poll notes it
        turn[0] += 1
        for k, r in enumerate(rows[turn[0] % step::step]):
            r["ip"] = f"172.{16 + turn[0] % 16}.{k >> 8 & 255}.{k & 255}"
        clock.advance(1)

    print(f"nodes={n} repeat={repeat}")
    print(fmt("listing alone", *measure(site.nodes, repeat), n, None))
    print(fmt("poll, quiet", *measure(lambda: prov.poll("sim"), repeat), n, "listing alone"))
    print(fmt("poll, 1 % changed", *measure(lambda: prov.poll("sim"), repeat, change_ips), n, "listing alone"))

    horizon = 3600.0
    sender = Sender(clock)
    cache_type = getattr(app, "ReportCache", None)  # the same bench on trees with and without it
    kw = {"cache": cache_type()} if cache_type is not None else {}
    records = [r.instance_id for r in store.list()]

    def report() -> None:
        app.publish_reports(sender, store, horizon, **kw)  # type: ignore[arg-type]

    def change_records() -> None:  # 1 % of the records move (a new seq and updated_at)
        turn[0] += 1
        clock.advance(1)
        for iid in records[turn[0] % step::step]:
            store.touch(iid, clock.now(), f"touched {turn[0]}")

    print(fmt("store read alone", *measure(lambda: store.list(live_or_updated_since=clock.now() - horizon),
                                           repeat), n, None))
    print(fmt("report, quiet", *measure(report, repeat), n, "store read alone"))
    print(fmt("report, 1 % changed", *measure(report, repeat, change_records), n, "store read alone"))
    prov.shutdown()
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (bench/benchjson.py)")
    args = ap.parse_args()
    if any(n < 1 for n in args.nodes) or args.repeat < 1:
        ap.error("--nodes and --repeat must be positive")
    logging.getLogger("epu").setLevel(logging.ERROR)
    with json_mode(args.json), tempfile.TemporaryDirectory(prefix="epu-bench-") as tmp:
        for n in args.nodes:
            bench(n, args.repeat, Path(tmp))
    if args.json:
        RESULTS.emit()


if __name__ == "__main__":
    main()
