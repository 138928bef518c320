"""Messaging figures: codec cost and throughput on the real RabbitMQ.

Side by side in one process:
* encode+decode of a sensor snapshot (1,000 nodes, 1,000 queued jobs): our msgpack envelope
  with strict validation vs a JSON baseline (json.dumps/loads + the same validation);
* publishing 2,000 messages: with publisher confirms (what services do: publish() returns
  when the broker has the message) vs fire-and-forget (the baseline, which can lose messages),
  and publish_many (a batch confirmed together: the engine's bursts) in batches of 100 and as
  one batch;
* consuming them through the service runtime (decode, validate, handle, ack);
* broker node loss on a three-node RabbitMQ cluster of our own (quorum queues on all three): a
  consuming service and a publisher on the node list; the node they are connected to is
  killed (``kill -9``) or stopped, several times; measured: from the loss to the service
  serving again, and the longest gap between two confirmed publishes. Baseline in the same
  run: a fresh connection to a live node (connect, declare, consume), the floor of a reconnect.

Run: make bench   (or .venv/bin/python bench/bench_messaging.py [--url amqp://...] [--no-cluster])
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchjson import Results, json_mode  # noqa: E402
from epu.common.broker import Broker, Publisher  # noqa: E402
from epu.common.codec import decode, encode  # noqa: E402
from epu.common.messages import Envelope, NodeInfo, PolicyChange, QueuedJob, SensorSnapshot, open_envelope  # noqa: E402
from epu.common.runtime import Service, run_in_thread  # noqa: E402
from epu.common.testing import wait_for  # noqa: E402
from epu.common.topology import Topology  # noqa: E402


def snapshot(n: int = 1000) -> SensorSnapshot:
    return SensorSnapshot(
        domain="bench", backend="slurm", taken_at=time.time(),
        jobs=[QueuedJob(job_id=str(i), cores=1 + i % 4, queue="batch", submit_time=1e9, wait_seconds=30.0)
              for i in range(n)],
        nodes=[NodeInfo(name=f"node{i:05d}", state="busy" if i % 3 else "free", cores=8, cores_used=8 if i % 3 else 0,
                        jobs=[str(i)] if i % 3 else [], state_since=1e9, native_state="ALLOCATED") for i in range(n)])


RESULTS = Results("messaging")


def _rounds(fn: Callable[[], Any], rounds: int) -> tuple[list[float], list[float], Any]:
    walls, cpus, out = [], [], None
    for _ in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return walls, cpus, out


def bench_codec(rounds: int = 30) -> None:
    env = Envelope.wrap(snapshot(), "bench")

    def ours_once() -> bytes:
        raw = encode(env)
        decode(raw)
        return raw

    def json_once() -> bytes:
        text = json.dumps(env.model_dump(mode="json")).encode()
        open_envelope(Envelope.model_validate(json.loads(text)))
        return text

    walls, cpus, raw = _rounds(ours_once, rounds)
    bwalls, bcpus, text = _rounds(json_once, rounds)
    ours, base = statistics.median(walls), statistics.median(bwalls)
    RESULTS.add("codec round trip, 1,000 nodes + 1,000 jobs, msgpack", unit="ms", wall=walls, cpu=cpus, scale=1000,
                bytes=len(raw), baseline="codec round trip, JSON")
    RESULTS.add("codec round trip, JSON", unit="ms", wall=bwalls, cpu=bcpus, scale=1000, bytes=len(text))
    print(f"codec  snapshot 1000 nodes + 1000 jobs: msgpack {ours * 1000:6.1f} ms/round-trip, {len(raw) / 1024:6.1f} KiB"
          f" | JSON baseline {base * 1000:6.1f} ms, {len(text) / 1024:6.1f} KiB")


def bench_broker(url: str, n: int = 2000) -> None:
    vhost = None
    if url == "auto":
        vhost = f"epu-bench-{uuid.uuid4().hex[:6]}"
        subprocess.run(["rabbitmqctl", "add_vhost", vhost], check=True, capture_output=True)
        subprocess.run(["rabbitmqctl", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"], check=True,
                       capture_output=True)
        url = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    try:
        broker = Broker(url, Topology(prefix="bench.", quorum=True))
        got: list[int] = []
        svc = Service("bench-consumer", broker)
        ready = threading.Event()
        svc.consume(broker.topology.decision_control_spec(), lambda m, e: got.append(1), prefetch=100)
        svc.on_start.append(ready.set)
        t = run_in_thread(svc)
        assert svc.wait_ready(15)
        svc.stop()
        t.join(10)  # queue exists; stop consuming so publishing is measured alone

        msgs = [PolicyChange(change_id=f"c{i}", domain="bench", min_nodes=i % 10) for i in range(n)]
        pub = Publisher(broker, "bench")
        t0 = time.perf_counter()
        for m in msgs:
            pub.publish(m)
        confirmed = n / (time.perf_counter() - t0)
        unconfirmed_broker = Broker(url, broker.topology, transport_options={"confirm_publish": False})
        pub2 = Publisher(unconfirmed_broker, "bench")
        t0 = time.perf_counter()
        for m in msgs:
            pub2.publish(m)
        unconfirmed = n / (time.perf_counter() - t0)
        RESULTS.add(f"publish {n}, one at a time, confirmed", unit="msg/s", rate=round(confirmed),
                    baseline=f"publish {n}, unconfirmed")
        RESULTS.add(f"publish {n}, unconfirmed", unit="msg/s", rate=round(unconfirmed))
        print(f"publish {n} msgs to a quorum queue: with confirms {confirmed:7.0f} msg/s"
              f" | baseline without confirms {unconfirmed:7.0f} msg/s")
        batched = {}
        for size in (100, n):  # an engine burst; everything at once
            t0 = time.perf_counter()
            for i in range(0, n, size):
                pub.publish_many(msgs[i:i + size])
            batched[size] = n / (time.perf_counter() - t0)
        RESULTS.add("publish_many, batches of 100", unit="msg/s", rate=round(batched[100]),
                    baseline=f"publish {n}, one at a time, confirmed")
        RESULTS.add(f"publish_many, one batch of {n}", unit="msg/s", rate=round(batched[n]))
        print(f"publish_many, confirmed per batch: batches of 100 {batched[100]:7.0f} msg/s | one batch of {n} "
              f"{batched[n]:7.0f} msg/s | x{batched[100] / confirmed:.0f} the one-by-one rate")

        svc = Service("bench-consumer", broker)
        svc.consume(broker.topology.decision_control_spec(), lambda m, e: got.append(1), prefetch=100)
        t0 = time.perf_counter()
        t = run_in_thread(svc)
        wait_for(lambda: len(got) >= 4 * n, 120, interval=0.005)
        rate = 4 * n / (time.perf_counter() - t0)
        svc.stop()
        t.join(10)
        pub.close()
        pub2.close()
        RESULTS.add(f"consume {4 * n} through the runtime", unit="msg/s", rate=round(rate))
        print(f"consume {4 * n} msgs through the runtime (decode, validate, handle, ack): {rate:7.0f} msg/s")
    finally:
        if vhost:
            subprocess.run(["rabbitmqctl", "delete_vhost", vhost], capture_output=True)


def bench_failover(rounds: int = 5) -> None:
    import statistics
    import tempfile

    from tests.support.rabbitnodes import RabbitCluster

    base = Path(tempfile.mkdtemp(prefix="epu-bench-cluster-"))
    cluster = RabbitCluster(base, size=3)
    t0 = time.perf_counter()
    cluster.start()
    started = time.perf_counter() - t0
    try:
        topo = Topology(prefix="failover.")
        broker = Broker(cluster.urls(), topo, heartbeat=10)
        # baseline: a fresh connect + declare + consume against a live node
        fresh = []
        for _ in range(rounds):
            svc = Service("bench-fresh", Broker(cluster.urls(), topo))
            svc.consume(topo.decision_control_spec(), lambda m, e: None)
            t1 = time.perf_counter()
            t = run_in_thread(svc)
            assert svc.wait_ready(30)
            fresh.append(time.perf_counter() - t1)
            svc.stop()
            t.join(10)
        svc = Service("bench-consumer", broker)
        got: set[str] = set()
        svc.consume(topo.decision_control_spec(), lambda m, e: got.add(m.change_id))
        t = run_in_thread(svc)
        assert svc.wait_ready(30)
        pub = Publisher(Broker(cluster.urls(), topo, heartbeat=10), "bench")
        confirmed: list[float] = []
        stop = threading.Event()

        errors: list[str] = []

        def publish() -> None:
            i = 0
            while not stop.is_set():
                try:
                    pub.publish(PolicyChange(change_id=f"c{i}", domain="bench"))
                except Exception as exc:  # reported below; the figure is the gap
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                confirmed.append(time.monotonic())
                i += 1
                time.sleep(0.01)

        p = threading.Thread(target=publish, daemon=True)
        p.start()
        results: dict[str, list[float]] = {"kill": [], "stop": []}
        own: dict[str, list[float]] = {"kill": [], "stop": []}  # from detecting the loss
        gaps: list[float] = []
        for r in range(rounds + 1):
            how = "stop" if r == rounds else "kill"
            node = next(n for n in cluster.nodes if f":{n.port}/" in broker.current_url)
            before = svc.reconnect_count
            n_before = len(confirmed)
            time.sleep(6.0)  # serving for a while, as a service in production would be
            lost = time.monotonic()
            node.kill() if how == "kill" else node.stop()
            wait_for(lambda b=before: svc.reconnect_count > b and svc.connected, 60, interval=0.005)
            results[how].append(time.monotonic() - lost)
            own[how].append(svc.metrics.reconnect_seconds._value.get())
            wait_for(lambda n=n_before: len(confirmed) > n + 20, 60)
            window = [x for x in confirmed[n_before:]]
            gaps.append(max(b - a for a, b in zip(window, window[1:], strict=False)))
            node.start()
            cluster.wait_running(3)
        stop.set()
        p.join(30)
        wait_for(lambda: len(got) >= len(confirmed), 60, interval=0.05)
        svc.stop()
        t.join(10)
        pub.close()

        def mmm(xs: list[float]) -> str:
            return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f} s"

        RESULTS.add("3 nodes started and clustered", unit="s", wall=[started])
        RESULTS.add("kill -9 -> serving again", unit="s", wall=results["kill"], baseline="fresh connect+declare+consume")
        RESULTS.add("graceful stop -> serving again", unit="s", wall=results["stop"])
        RESULTS.add("fresh connect+declare+consume", unit="s", wall=fresh)
        RESULTS.add("kill -9, the service's own measure", unit="s", wall=own["kill"])
        RESULTS.add("longest gap between confirmed publishes", unit="s", wall=gaps,
                    confirmed=len(confirmed), consumed=len(got), publish_errors=len(errors))
        print(f"cluster  3 nodes started and clustered in {started:.1f} s")
        print(f"failover kill -9 of the connected node, {rounds}x: serving again after (min/median/max) "
              f"{mmm(results['kill'])} | graceful stop: {mmm(results['stop'])} "
              f"| baseline fresh connect+declare+consume {mmm(fresh)}")
        print(f"failover the service's own measure (loss detected -> serving, epu_broker_last_reconnect_seconds): "
              f"kill -9 {mmm(own['kill'])} | graceful stop {mmm(own['stop'])}")
        print(f"failover longest gap between confirmed publishes across a loss (min/median/max) {mmm(gaps)}; "
              f"every one of the {len(confirmed)} confirmed publishes consumed ({len(got)} distinct ids); "
              f"publish errors: {len(errors)} {errors[:3]}")
    finally:
        cluster.stop()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="auto", help="broker URL (default: a fresh vhost on 127.0.0.1)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the three-node failover figures")
    parser.add_argument("--only-cluster", action="store_true", help="only the three-node failover figures")
    parser.add_argument("--rounds", type=int, default=5, help="node losses in the failover figures (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout (bench/benchjson.py)")
    args = parser.parse_args()
    with json_mode(args.json):
        if not args.only_cluster:
            bench_codec()
            bench_broker(args.url)
        if not args.no_cluster:
            t0 = time.process_time()
            bench_failover(args.rounds)
            RESULTS.doc["failover_cpu_s"] = round(time.process_time() - t0, 1)
            print(f"failover CPU seconds of the benchmark process: {time.process_time() - t0:.1f}")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        RESULTS.doc["max_rss_mib"] = round(rss)
        print(f"peak RSS of the benchmark process: {rss:.0f} MiB")
    if args.json:
        RESULTS.emit()


if __name__ == "__main__":
    main()
