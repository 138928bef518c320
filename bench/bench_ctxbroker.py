"""Benchmark: how long until every agent of a context has applied one new join.

N agents (asyncio clients, one TLS keep-alive connection each, up to 10,000) sit in one
context. One node joins. We time from just before the join request is sent until the last
agent has received the entry — with the broker's long-poll, side by side with the paper's
plain polling every 120 s.

* Long-poll: measured, end to end, over HTTPS on this machine, the broker in its own process.
* Polling (120 s): simulated — each agent polls at a uniformly random phase of the 120 s
  period, so it sees the entry at (its next poll) + (one request's latency), the latency being
  the one measured here under the same N. The model is checked by a *measured* run at smaller
  scale and a short period (``--poll-check-agents``, ``--poll-check-period``), whose measured
  convergence is reported next to the model's prediction for the same settings.

Also reported: broker requests/s (the wake-up burst, and sustained plain polling with N
agents), and broker memory (RSS) idle and with N parked long-polls.

Run: ``.venv/bin/python bench/bench_ctxbroker.py --agents 100 1000 10000``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import resource
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKEN = "bench-admin-token-0123456789abcdef"


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --------------------------------------------------------------------------- server process
def serve(directory: str) -> None:
    raise_fd_limit()
    from services.ctxbroker.server import BrokerServer, ServerSettings

    d = Path(directory)
    s = BrokerServer(ServerSettings("127.0.0.1", 0, str(d / "cert.pem"), str(d / "key.pem"), TOKEN,
                                    f"sqlite:///{d / 'ctx.db'}", backlog=16384))
    import threading

    def announce() -> None:
        from common.testing import wait_for

        wait_for(lambda: s.server is not None and s.server.started, timeout=30)
        print(f"PORT {s.port}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    s.run()


def cpu_s(pid: int) -> float:
    """User+system CPU seconds a process has used (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --------------------------------------------------------------------------- a minimal agent
class Conn:
    """One agent's HTTPS keep-alive connection, speaking just enough HTTP/1.1."""

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, auth: str) -> None:
        self.host, self.port, self.ctx, self.auth = host, port, ctx, auth
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, ssl=self.ctx,
                                                                 server_hostname="localhost")

    async def get(self, path: str) -> tuple[int, bytes]:
        assert self.reader and self.writer
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: {self.auth}\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await self.reader.readexactly(length)
        return status, body

    def close(self) -> None:
        if self.writer:
            self.writer.close()


async def connect_all(n: int, host: str, port: int, sslctx: ssl.SSLContext, auth: str) -> list[Conn]:
    sem = asyncio.Semaphore(100)
    conns = [Conn(host, port, sslctx, auth) for _ in range(n)]

    async def one(c: Conn) -> None:
        async with sem:
            for attempt in range(5):
                try:
                    await c.open()
                    return
                except OSError:
                    await asyncio.sleep(0.2 * (attempt + 1))
            await c.open()

    await asyncio.gather(*(one(c) for c in conns))
    return conns


# --------------------------------------------------------------------------- scenarios
async def longpoll_round(conns: list[Conn], base: str, after: int, join: Any, waiting: Any,
                         server_pid: int, health: Any) -> dict[str, float]:
    """Park every agent on a long-poll, join one node, time until each has the entry."""
    got: list[float] = []

    async def agent(c: Conn) -> None:
        status, body = await c.get(f"{base}/updates?after={after}&wait=55")
        if status != 200 or b'"entries":[]' in body:  # lean check: agents here only need to see it
            raise RuntimeError(f"agent got {status} {body[:200]!r}")
        got.append(time.monotonic())

    tasks = [asyncio.create_task(agent(c)) for c in conns]
    t_wait = time.monotonic()
    while await waiting() < len(conns):
        if time.monotonic() - t_wait > 120:
            raise RuntimeError("agents did not all park")
        await asyncio.sleep(0.05)
    cpu_server, cpu_client = cpu_s(server_pid), self_cpu_s()
    t0 = time.monotonic()
    await join()
    await asyncio.gather(*tasks)
    lat = sorted(t - t0 for t in got)
    return {"p50": lat[len(lat) // 2], "p99": lat[int(len(lat) * 0.99) - 1 if len(lat) > 1 else 0],
            "max": lat[-1], "burst_rps": len(lat) / max(lat[-1], 1e-9),
            "server_cpu_s": cpu_s(server_pid) - cpu_server, "client_cpu_s": self_cpu_s() - cpu_client,
            "server_write_loop_s": (await health())["last_wake"].get("seconds", 0.0)}


async def polling_throughput(conns: list[Conn], base: str, after: int, seconds: float) -> tuple[float, list[float]]:
    """Every agent polls (wait=0) back to back for ``seconds``: sustained requests/s and latencies."""
    count = 0
    lats: list[float] = []
    stop = time.monotonic() + seconds

    async def agent(c: Conn) -> None:
        nonlocal count
        while time.monotonic() < stop:
            t = time.monotonic()
            status, _ = await c.get(f"{base}/updates?after={after}&wait=0")
            lats.append(time.monotonic() - t)
            count += status == 200

    t0 = time.monotonic()
    await asyncio.gather(*(agent(c) for c in conns))
    return count / (time.monotonic() - t0), lats


async def measured_polling(conns: list[Conn], base: str, after: int, period: float, join: Any) -> dict[str, float]:
    """Agents poll every ``period`` s at random phases (real requests); time until all saw the join."""
    got: list[float] = []
    t0_holder: dict[str, float] = {}
    done = asyncio.Event()

    async def agent(c: Conn) -> None:
        await asyncio.sleep(random.uniform(0, period))
        while True:
            status, body = await c.get(f"{base}/updates?after={after}&wait=0")
            if "t0" in t0_holder and json.loads(body)["entries"]:
                got.append(time.monotonic())
                if len(got) == len(conns):
                    done.set()
                return
            await asyncio.sleep(period)

    tasks = [asyncio.create_task(agent(c)) for c in conns]
    await asyncio.sleep(period * 1.5)  # phases spread over a whole period before the join
    t0_holder["t0"] = time.monotonic()
    await join()
    await done.wait()
    await asyncio.gather(*tasks)
    lat = sorted(t - t0_holder["t0"] for t in got)
    return {"p50": lat[len(lat) // 2], "max": lat[-1]}


def simulate_polling(n: int, period: float, latencies: list[float], seed: int = 1) -> dict[str, float]:
    """Convergence with plain polling: uniform random phase over ``period`` + a measured request latency."""
    rng = random.Random(seed)
    times = sorted(rng.uniform(0, period) + rng.choice(latencies) for _ in range(n))
    return {"p50": times[n // 2], "p99": times[int(n * 0.99) - 1 if n > 1 else 0], "max": times[-1]}


# --------------------------------------------------------------------------- driver
async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import httpx

    from services.ctxbroker.tls import self_signed
    from tests.ctxbroker.conftest import node

    raise_fd_limit()
    work = Path(tempfile.mkdtemp(prefix="bench-ctx-"))
    self_signed(work)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(work)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.split()[1])
        url = f"https://localhost:{port}"
        sslctx = ssl.create_default_context(cafile=str(work / "cert.pem"))
        http = httpx.AsyncClient(base_url=url, verify=sslctx, timeout=60)
        admin = {"Authorization": f"Bearer {TOKEN}"}
        rss_idle = rss_mb(proc.pid)
        results = []

        async def health() -> dict[str, Any]:
            return (await http.get("/healthz")).json()

        async def waiting() -> int:
            return int((await health())["waiting"])

        for n in args.agents:
            ctx = (await http.post("/v1/contexts", json={"name": f"bench-{n}"}, headers=admin)).json()
            auth = "Basic " + base64.b64encode(f"{ctx['key']}:{ctx['secret']}".encode()).decode()
            base = f"/v1/contexts/{ctx['id']}"
            joins = iter(range(1, 1000))

            async def join(auth: str = auth, base: str = base, joins: Any = joins) -> None:
                r = await http.post(f"{base}/nodes", json=node(next(joins)), headers={"Authorization": auth})
                r.raise_for_status()

            t = time.monotonic()
            conns = await connect_all(n, "127.0.0.1", port, sslctx, auth)
            connect_s = time.monotonic() - t
            rss_before = rss_mb(proc.pid)
            rounds = []
            after = 0
            for _ in range(args.rounds):
                rounds.append(await longpoll_round(conns, base, after, join, waiting, proc.pid, health))
                after += 1
            rss_parked = rss_mb(proc.pid)  # peak-ish: after N parked polls were answered
            rps, lats = await polling_throughput(conns, base, after, args.throughput_seconds)
            sim = simulate_polling(n, 120.0, lats)
            best = min(rounds, key=lambda r: r["max"])
            res = {"agents": n, "connect_s": connect_s, "rounds": rounds,
                   "longpoll_max_median": statistics.median(r["max"] for r in rounds),
                   "longpoll_p50_median": statistics.median(r["p50"] for r in rounds),
                   "best": best, "poll_rps": rps, "poll_latency_p50": sorted(lats)[len(lats) // 2],
                   "sim120": sim, "rss_idle": rss_idle, "rss_connected": rss_before, "rss_after": rss_parked}
            if n == args.poll_check_agents:
                check = await measured_polling(conns, base, after, args.poll_check_period, join)
                res["poll_check"] = {"measured": check,
                                     "model": simulate_polling(n, args.poll_check_period, lats)}
            results.append(res)
            print(json.dumps(res), flush=True)
            for c in conns:
                c.close()
            await asyncio.sleep(0.5)
        await http.aclose()
        return results
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, nargs="+", default=[100, 1000, 10000])
    p.add_argument("--rounds", type=int, default=3, help="long-poll rounds per size (median reported)")
    p.add_argument("--throughput-seconds", type=float, default=5.0)
    p.add_argument("--poll-check-agents", type=int, default=1000)
    p.add_argument("--poll-check-period", type=float, default=10.0)
    p.add_argument("--serve", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve)
        return
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    results = asyncio.run(run(args))
    print("\n| agents | long-poll p50 | long-poll max (median of rounds) | polling 120 s p50 (sim) | "
          "polling 120 s max (sim) | wake burst req/s | plain-poll req/s | broker RSS idle → N connected |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['agents']} | {r['longpoll_p50_median'] * 1000:.0f} ms | {r['longpoll_max_median'] * 1000:.0f} ms | "
              f"{r['sim120']['p50']:.1f} s | {r['sim120']['max']:.1f} s | {r['best']['burst_rps']:.0f} | "
              f"{r['poll_rps']:.0f} | {r['rss_idle']:.0f} → {r['rss_connected']:.0f} MB |")
    for r in results:
        if "poll_check" in r:
            c = r["poll_check"]
            print(f"\npolling model check, {r['agents']} agents, period {args.poll_check_period:g} s: measured "
                  f"p50 {c['measured']['p50']:.2f} s / max {c['measured']['max']:.2f} s; model p50 "
                  f"{c['model']['p50']:.2f} s / max {c['model']['max']:.2f} s")


if __name__ == "__main__":
    main()
