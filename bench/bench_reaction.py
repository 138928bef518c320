"""Benchmark: demand seen → the cloud's ``create_node`` call, over the real RabbitMQ (issue 15, item 3).

What is measured: the decision engine and a provisioner run as services (in this process, each
with its own broker connections and threads, as ``epu run`` runs them) on a vhost of their own;
a sensor publishes a snapshot whose demand grew by one job; the time from that publish to the
simulated cloud's ``create_node`` being called for it. ``--trials`` times, one job more each,
at a random moment (0.25–0.6 s after the last create; the baseline at a random phase of its tick).

Ours: the engine iterates as soon as a snapshot changes demand (``wake_min_seconds`` 0.2 s
apart at most). Baseline, same run: the same services with the wake-up off, acting only at
their ``iteration_seconds`` tick (5 s, the default) — what the engine did before; fewer trials,
each costs half a tick on average.

    .venv/bin/python bench/bench_reaction.py [--trials 200] [--baseline-trials 20] [--json]
"""

from __future__ import annotations

import argparse
import logging
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchjson import Results, json_mode  # noqa: E402
from epu.common.broker import Broker, Publisher  # noqa: E402
from epu.common.config import parse_config  # noqa: E402
from epu.common.messages import QueuedJob, SensorSnapshot  # noqa: E402
from epu.common.runtime import run_in_thread  # noqa: E402
from epu.common.topology import Topology  # noqa: E402
from epu.services.decision.app import build_service as build_decision  # noqa: E402
from epu.services.provisioner.app import build_service as build_provisioner  # noqa: E402


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def run(url: str, tmp: Path, trials: int, wake: bool) -> tuple[list[float], float]:
    """Latencies (s) of ``trials`` demand steps, and the engine process's CPU share meanwhile."""
    prefix = f"r{uuid.uuid4().hex[:6]}."
    cfg = parse_config({
        "broker": {"url": url, "prefix": prefix},
        "decision": {"store_url": f"sqlite:///{tmp / f'{prefix}decision.db'}", "iteration_seconds": 5.0,
                     "active_window_seconds": 60.0, "wake_min_seconds": 0.2 if wake else 5.0},
        "provisioner": {"store_url": f"sqlite:///{tmp / f'{prefix}provisioner.db'}", "poll_seconds": 30.0},
        "domains": {"d": {"max_nodes": trials + 10, "sites": ["s1"],
                          "params": {"stall_seconds": 3600.0}}},
        "sites": {"s1": {"driver": "epu-sim", "quota": trials + 10,
                         "driver_args": {"boot_time_min": 3600.0, "boot_time_max": 3600.0}}},
    }, environ={})
    broker = Broker(url, Topology(prefix=prefix, quorum=True))
    provisioner = build_provisioner(cfg)
    created: list[float] = []
    seen = threading.Condition()
    site = provisioner.provisioner.sites["s1"]  # type: ignore[attr-defined]
    real_create = site.driver.create_node

    def create_node(*args, **kwargs):  # the cloud call, timed where it happens
        with seen:
            created.append(time.monotonic())
            seen.notify_all()
        return real_create(*args, **kwargs)

    site.driver.create_node = create_node
    engine = build_decision(cfg)
    threads = [run_in_thread(provisioner), run_in_thread(engine)]
    pub = Publisher(broker, source="sensor-bench")
    out: list[float] = []
    try:
        assert provisioner.wait_ready(30) and engine.wait_ready(30)
        cpu0, wall0 = time.process_time(), time.monotonic()
        rng = random.Random(7)
        for n in range(1, trials + 1):
            # a sensor's snapshots come at their own pace: not right after the engine's last run
            # (that would measure the rate limit, or a whole tick), at a random phase of it
            time.sleep(rng.uniform(0.25, 0.6) if wake else rng.uniform(0.0, 5.0))
            jobs = [QueuedJob(job_id=f"j{i}", cores=1) for i in range(n)]
            t0 = time.monotonic()
            pub.publish(SensorSnapshot(domain="d", backend="bench", taken_at=time.time(), jobs=jobs))
            with seen:
                if not seen.wait_for(lambda k=n: len(created) >= k, timeout=30):
                    raise RuntimeError(f"trial {n}: no create_node within 30 s")
                out.append(created[n - 1] - t0)
        share = (time.process_time() - cpu0) / max(1e-9, time.monotonic() - wall0)
    finally:
        pub.close()
        for svc in (engine, provisioner):
            svc.stop()
        for t in threads:
            t.join(15)
    return out, share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--baseline-trials", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (bench/benchjson.py)")
    args = ap.parse_args()
    logging.getLogger("epu").setLevel(logging.ERROR)
    results = Results("reaction")
    vhost = f"epu-bench-{uuid.uuid4().hex[:6]}"
    subprocess.run(["rabbitmqctl", "add_vhost", vhost], check=True, capture_output=True)
    subprocess.run(["rabbitmqctl", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"], check=True,
                   capture_output=True)
    url = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    try:
        with json_mode(args.json), tempfile.TemporaryDirectory(prefix="epu-bench-") as tmp:
            woken, share = run(url, Path(tmp), args.trials, wake=True)
            ticked, base_share = run(url, Path(tmp), args.baseline_trials, wake=False)
            for name, xs, cpu, base in (("demand → create_node, wake-up", woken, share, "demand → create_node, tick only"),
                                        ("demand → create_node, tick only", ticked, base_share, None)):
                results.add(name, unit="ms", wall=xs, scale=1000, baseline=base, trials=len(xs),
                            p99_ms=round(percentile(xs, 99) * 1000, 1), p50_ms=round(percentile(xs, 50) * 1000, 1),
                            cpu_share_of_a_core=round(cpu, 3))
                print(f"{name:34s} {len(xs):4d} trials  p50 {percentile(xs, 50) * 1000:7.1f} ms  "
                      f"p99 {percentile(xs, 99) * 1000:7.1f} ms  max {max(xs) * 1000:7.1f} ms  "
                      f"(bench process {cpu:.0%} of a core)")
    finally:
        subprocess.run(["rabbitmqctl", "delete_vhost", vhost], capture_output=True)
    if args.json:
        results.emit()


if __name__ == "__main__":
    main()
