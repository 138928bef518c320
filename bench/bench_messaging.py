"""Messaging figures: codec cost and throughput on the real RabbitMQ.

Side by side in one process:
* encode+decode of a sensor snapshot (1,000 nodes, 1,000 queued jobs): our msgpack envelope
  with strict validation vs a JSON baseline (json.dumps/loads + the same validation);
* publishing 2,000 messages: with publisher confirms (what services do: publish() returns
  when the broker has the message) vs fire-and-forget (the baseline, which can lose messages),
  and publish_many (a batch confirmed together: the engine's bursts) in batches of 100 and as
  one batch;
* consuming them through the service runtime (decode, validate, handle, ack).

Run: make bench   (or .venv/bin/python bench/bench_messaging.py [--url amqp://...])
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.broker import Broker, Publisher  # noqa: E402
from common.codec import decode, encode  # noqa: E402
from common.messages import Envelope, NodeInfo, PolicyChange, QueuedJob, SensorSnapshot, open_envelope  # noqa: E402
from common.runtime import Service, run_in_thread  # noqa: E402
from common.testing import wait_for  # noqa: E402
from common.topology import Topology  # noqa: E402


def snapshot(n: int = 1000) -> SensorSnapshot:
    return SensorSnapshot(
        domain="bench", backend="slurm", taken_at=time.time(),
        jobs=[QueuedJob(job_id=str(i), cores=1 + i % 4, queue="batch", submit_time=1e9, wait_seconds=30.0)
              for i in range(n)],
        nodes=[NodeInfo(name=f"node{i:05d}", state="busy" if i % 3 else "free", cores=8, cores_used=8 if i % 3 else 0,
                        jobs=[str(i)] if i % 3 else [], state_since=1e9, native_state="ALLOCATED") for i in range(n)])


def bench_codec(rounds: int = 30) -> None:
    env = Envelope.wrap(snapshot(), "bench")
    t0 = time.perf_counter()
    for _ in range(rounds):
        raw = encode(env)
        decode(raw)
    ours = (time.perf_counter() - t0) / rounds
    t0 = time.perf_counter()
    for _ in range(rounds):
        text = json.dumps(env.model_dump(mode="json")).encode()
        open_envelope(Envelope.model_validate(json.loads(text)))
    base = (time.perf_counter() - t0) / rounds
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
        print(f"publish {n} msgs to a quorum queue: with confirms {confirmed:7.0f} msg/s"
              f" | baseline without confirms {unconfirmed:7.0f} msg/s")
        batched = {}
        for size in (100, n):  # an engine burst; everything at once
            t0 = time.perf_counter()
            for i in range(0, n, size):
                pub.publish_many(msgs[i:i + size])
            batched[size] = n / (time.perf_counter() - t0)
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
        print(f"consume {4 * n} msgs through the runtime (decode, validate, handle, ack): {rate:7.0f} msg/s")
    finally:
        if vhost:
            subprocess.run(["rabbitmqctl", "delete_vhost", vhost], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="auto", help="broker URL (default: a fresh vhost on 127.0.0.1)")
    args = parser.parse_args()
    bench_codec()
    bench_broker(args.url)
    print(f"peak RSS of the benchmark process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
