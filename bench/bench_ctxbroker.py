"""Benchmark: how fast the context broker brings nodes up to date.

Two paths (issue 15, item 5), each beside a baseline measured in the same run:

1. **Wake-up.** N agents (asyncio clients, one TLS keep-alive connection each, up to 10,000)
   long-poll one context; one node joins. Timed from just before the join request is sent
   until the last agent has the entry (goal: ≤ 1 s for 10,000). The broker runs in its own
   process. Baseline: the same broker with each answer's head and body written separately
   (``EPU_CTXBROKER_COALESCE=0``: two TLS records and two ``send()`` calls per agent), in a
   second broker process of the same run. Beside it, the paper's plain polling every 120 s,
   *simulated*: each agent polls at a uniformly random phase of the period and sees the entry
   after (its next poll) + (one request's latency, drawn from latencies measured here with N
   agents polling back to back); ``--poll-check-agents`` measures real polling at a short
   period to check that model.

2. **A new agent joins a big context**: 10,000 members and 100,000 history entries. Timed
   from the join request to the agent having applied the answer with the default scripts
   (members file written, restart.d rendering hosts, known hosts and MPI hostfile) (goal:
   ≤ 1 s). Baseline, same run: what the agent did before compaction — replay every entry —
   measured on the first ``--replay-sample`` entries of the same history with the old
   per-entry work (a hook process and a state save per entry) and extrapolated linearly to the
   whole history (labelled as such).

Figures are min / median / max over rounds; CPU seconds of the broker process (and of the
agents' process) are given beside wall time, since the machine may be shared. ``BENCH_GC=off``
runs the broker with Python's cyclic garbage collector off, to see what its full collections
cost (a diagnosis, not a setting).

Run: ``.venv/bin/python bench/bench_ctxbroker.py [--agents 100 1000 10000] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import random
import resource
import shutil
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


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


# --------------------------------------------------------------------------- server process
def serve(directory: str, db: str) -> None:
    raise_fd_limit()
    if os.environ.get("BENCH_GC") == "off":  # diagnosis: what Python's cyclic GC costs the broker
        import gc

        gc.disable()
    from epu.services.ctxbroker.server import BrokerServer, ServerSettings

    d = Path(directory)
    s = BrokerServer(ServerSettings("127.0.0.1", 0, str(d / "cert.pem"), str(d / "key.pem"), TOKEN,
                                    f"sqlite:///{db}", backlog=16384))
    import threading

    def announce() -> None:
        from epu.common.testing import wait_for

        wait_for(lambda: s.server is not None and s.server.started, timeout=120)
        print(f"PORT {s.port}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    s.run()


class Broker:
    """A broker process of this run."""

    def __init__(self, work: Path, db: Path, coalesce: bool = True) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "EPU_CTXBROKER_COALESCE": "1" if coalesce else "0"}
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(work), str(db)],
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline().split()[1])
        self.url = f"https://localhost:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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


def basic(key: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{key}:{secret}".encode()).decode()


# --------------------------------------------------------------------------- a minimal agent
class Conn:
    """One agent's HTTPS keep-alive connection, speaking just enough HTTP/1.1."""

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, auth: str) -> None:
        self.host, self.port, self.ctx, self.auth = host, port, ctx, auth
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, ssl=self.ctx,
                                                                 server_hostname="localhost", limit=1 << 24)

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


async def connect_all(n: int, port: int, sslctx: ssl.SSLContext, auth: str) -> list[Conn]:
    sem = asyncio.Semaphore(100)
    conns = [Conn("127.0.0.1", port, sslctx, auth) for _ in range(n)]

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


# --------------------------------------------------------------------------- 1. wake-up
async def longpoll_round(conns: list[Conn], base: str, after: int, join: Any, waiting: Any,
                         server_pid: int) -> dict[str, float]:
    """Park every agent on a long-poll, join one node, time until each has the entry."""
    got: list[float] = []

    async def agent(c: Conn) -> None:
        status, body = await c.get(f"{base}/updates?after={after}&wait=55")
        if status != 200 or b'"entries":[]' in body:
            raise RuntimeError(f"agent got {status} {body[:200]!r}")
        got.append(time.monotonic())

    tasks = [asyncio.create_task(agent(c)) for c in conns]
    t_wait = time.monotonic()
    while await waiting() < len(conns):
        if time.monotonic() - t_wait > 120:
            raise RuntimeError("agents did not all park")
        await asyncio.sleep(0.05)
    cpu0, client0 = cpu_s(server_pid), self_cpu_s()
    t0 = time.monotonic()
    await join()
    await asyncio.gather(*tasks)
    lat = sorted(t - t0 for t in got)
    return {"p50": lat[len(lat) // 2], "p99": lat[max(0, int(len(lat) * 0.99) - 1)], "max": lat[-1],
            "server_cpu_s": cpu_s(server_pid) - cpu0, "agents_cpu_s": self_cpu_s() - client0}


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
    return {"p50": times[n // 2], "p99": times[max(0, int(n * 0.99) - 1)], "max": times[-1]}


async def wakeup(broker: Broker, work: Path, n: int, args: argparse.Namespace, polling: bool) -> dict[str, Any]:
    import httpx

    from tests.ctxbroker.conftest import node, node_credential

    sslctx = ssl.create_default_context(cafile=str(work / "cert.pem"))
    async with httpx.AsyncClient(base_url=broker.url, verify=sslctx, timeout=60) as http:
        admin = {"Authorization": f"Bearer {TOKEN}"}
        ctx = (await http.post("/v1/contexts", json={"name": f"bench-{n}"}, headers=admin)).json()
        base = f"/v1/contexts/{ctx['id']}"
        joins = iter(range(1, 1000))

        async def join() -> None:
            doc = node(next(joins))
            cred = node_credential(ctx, str(doc["hostname"]))
            r = await http.post(f"{base}/nodes", json=doc, headers={"Authorization": basic(cred.key, cred.secret)})
            r.raise_for_status()

        async def waiting() -> int:
            return int((await http.get("/healthz")).json()["waiting"])

        rss_idle = rss_mb(broker.pid)
        t = time.monotonic()
        conns = await connect_all(n, broker.port, sslctx, basic(ctx["key"], ctx["secret"]))
        connect_s = time.monotonic() - t
        rss_connected = rss_mb(broker.pid)
        rounds, after = [], 0
        for _ in range(args.rounds):
            rounds.append(await longpoll_round(conns, base, after, join, waiting, broker.pid))
            after += 1
        res: dict[str, Any] = {
            "agents": n, "connect_s": connect_s, "rounds": rounds,
            "seconds": spread([r["max"] for r in rounds]), "p50_seconds": spread([r["p50"] for r in rounds]),
            "server_cpu_s": spread([r["server_cpu_s"] for r in rounds]),
            "agents_cpu_s": spread([r["agents_cpu_s"] for r in rounds]),
            "rss_mb": {"idle": rss_idle, "connected": rss_connected, "after": rss_mb(broker.pid)}}
        if polling:
            rps, lats = await polling_throughput(conns, base, after, args.throughput_seconds)
            res["plain_poll_rps"] = rps
            res["polling_120s_simulated"] = simulate_polling(n, 120.0, lats)
            if n == args.poll_check_agents:
                res["polling_model_check"] = {
                    "period_s": args.poll_check_period,
                    "measured": await measured_polling(conns, base, after, args.poll_check_period, join),
                    "model": simulate_polling(n, args.poll_check_period, lats)}
        for c in conns:
            c.close()
        await asyncio.sleep(0.5)
        return res


# --------------------------------------------------------------------------- 2. a new agent
def fill_history(db: Path, members: int, history: int) -> dict[str, str]:
    """A context as a broker that ran for a long time left it: ``history`` entries (workers that
    came and went, then the ``members`` that are there now), written in bulk. Every entry is kept
    (as a store from before compaction, or one never compacted, holds it): the broker's first
    append compacts it, and the measured joins come after that."""
    from epu.common import nodecred
    from epu.services.ctxbroker.core import hash_secret, new_key, new_secret
    from epu.services.ctxbroker.store import Store, contexts, entries
    from epu.services.ctxbroker.store import members as members_table
    from sqlalchemy import insert

    from tests.ctxbroker.conftest import node

    store = Store(f"sqlite:///{db}")
    secret, cid = new_secret(), "bigcontext"
    churn = history - members
    assert churn >= 0 and churn % 2 == 0
    rows, mrows = [], []
    now = time.time()
    for i in range(churn // 2):
        d = node(100_000 + i)
        rows.append(dict(context_id=cid, entry_id=2 * i + 1, kind="join", hostname=f"gone-{i}", fqdn=d["fqdn"],
                         ip=d["ip"], ssh_host_key=d["ssh_host_key"], data=d["data"], instance_id=f"i-gone-{i}",
                         reason="", at=now))
        rows.append(dict(context_id=cid, entry_id=2 * i + 2, kind="leave", hostname=f"gone-{i}", fqdn="", ip="",
                         ssh_host_key="", data="", instance_id=None, reason="instance terminated", at=now))
    for j in range(members):
        d = node(j)
        eid = churn + j + 1
        fields = dict(hostname=d["hostname"], fqdn=d["fqdn"], ip=d["ip"], ssh_host_key=d["ssh_host_key"],
                      data=d["data"], instance_id=f"i-{j}")
        rows.append(dict(context_id=cid, entry_id=eid, kind="join", reason="", at=now, **fields))
        mrows.append(dict(context_id=cid, entry_id=eid, **fields))
    with store.engine.begin() as conn:
        conn.execute(insert(contexts).values(id=cid, name="big", key=new_key(), secret_hash=hash_secret(secret),
                                             created_at=now, last_id=history, signing_key=nodecred.signing_key(secret),
                                             horizon=0))
        for k in range(0, len(rows), 5000):
            conn.execute(insert(entries), rows[k:k + 5000])
        conn.execute(insert(members_table), mrows)
    store.close()
    return {"id": cid, "secret": secret}


def default_scripts(tmp: Path) -> Path:
    """The shipped scripts (deploy/ctx-scripts) copied, as a node installs them."""
    dst = tmp / "ctx-scripts"
    shutil.copytree(ROOT / "deploy" / "ctx-scripts", dst)
    return dst


def new_agent_round(url: str, ca: str, ctx: dict[str, str], i: int, tmp: Path, scripts: Path,
                    server_pid: int) -> dict[str, float]:
    """One new node: join, first updates, apply with the default scripts, as the agent does."""
    from epu.common import nodecred
    from epu.services.ctxbroker.agent.agent import Agent
    from epu.services.ctxbroker.agent.config import AgentConfig
    from epu.services.ctxbroker.core import NodeFields

    from tests.ctxbroker.conftest import node

    fields = NodeFields.model_validate(node(i, hostname=f"newnode-{i}", ip=f"10.9.{i // 250}.{i % 250 + 1}"))
    cred = nodecred.issue(nodecred.signing_key(ctx["secret"]), ctx["id"], fields.hostname, f"i-new-{i}")
    root = tmp / f"node-{i}"
    cfg = AgentConfig(uri=f"{url}/v1/contexts/{ctx['id']}", key=cred.key, secret=cred.secret, ca_file=ca,
                      scripts_dir=str(scripts), state_dir=str(root / "state"), root=str(root))
    agent = Agent(cfg, fields)
    agent.ensure_init()  # init.d once (not part of joining)
    cpu0 = cpu_s(server_pid)
    t0 = time.monotonic()
    agent.register()
    t_joined = time.monotonic()
    changed = agent.poll_once()
    t_applied = time.monotonic()
    agent.client.close()
    hosts = (root / "etc" / "hosts").read_text()
    assert hosts.count("\n") > len(agent.state.members), "restart.d did not render the members"
    return {"seconds": t_applied - t0, "join_s": t_joined - t0, "updates_and_apply_s": t_applied - t_joined,
            "members_applied": changed, "server_cpu_s": cpu_s(server_pid) - cpu0}


def replay_baseline(ctx_members: int, history: int, sample: int, tmp: Path) -> dict[str, Any]:
    """The agent before compaction: every entry replayed, one hook process and one state save
    per entry (the old default add-node.d/10-log), restart once. Measured on ``sample`` entries
    of the same kind of history, extrapolated to ``history``."""
    from epu.services.ctxbroker.agent.agent import Agent
    from epu.services.ctxbroker.agent.config import AgentConfig
    from epu.services.ctxbroker.core import Entry, NodeFields

    from tests.ctxbroker.conftest import node

    scripts = tmp / "old-scripts"
    shutil.copytree(ROOT / "deploy" / "ctx-scripts", scripts)
    for hook in ("add-node", "delete-node"):  # the per-entry log hooks the defaults had
        d = scripts / f"{hook}.d"
        d.mkdir(exist_ok=True)
        p = d / "10-log"
        p.write_text("#!/usr/bin/env python3\nimport os, time\nfrom pathlib import Path\n"
                     "log = Path(os.environ.get('EPU_CTX_ROOT', '/')) / 'var/log/epu-ctx.log'\n"
                     "log.parent.mkdir(parents=True, exist_ok=True)\n"
                     "open(log, 'a').write(f\"{time.strftime('%Y-%m-%dT%H:%M:%S')} entry={os.environ['EPU_ENTRY_ID']} "
                     "{os.environ['EPU_ENTRY_KIND']} {os.environ['EPU_NODE_HOSTNAME']}\\n\")\n")
        p.chmod(0o755)
    root = tmp / "old-node"
    cfg = AgentConfig(uri="https://unused/v1/contexts/x", key="k", secret="s", scripts_dir=str(scripts),
                      state_dir=str(root / "state"), root=str(root), change_log="")
    agent = Agent(cfg, NodeFields.model_validate(node(1)))
    agent.ensure_init()
    batch = []
    for i in range(sample // 2):
        d = node(100_000 + i)
        batch.append(Entry(2 * i + 1, "join", f"gone-{i}", d["fqdn"], d["ip"], d["ssh_host_key"], d["data"]))
        batch.append(Entry(2 * i + 2, "leave", f"gone-{i}"))
    t0 = time.monotonic()
    cpu0 = time.process_time()
    agent.apply(batch)
    wall = time.monotonic() - t0
    per_entry = wall / len(batch)
    agent.client.close()
    return {"sample_entries": len(batch), "sample_seconds": wall, "sample_agent_cpu_s": time.process_time() - cpu0,
            "per_entry_s": per_entry, "extrapolated_seconds": per_entry * history,
            "note": f"measured on {len(batch)} entries, extrapolated linearly to {history}"}


async def new_agent(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    # the scripts start with #!/usr/bin/env python3: find the system's, as on a node image (a
    # development machine's first python3 may be a version manager's shim costing 0.25 s a start)
    os.environ["PATH"] = "/usr/bin:/bin:" + os.environ.get("PATH", "")
    db = work / "big.db"
    t = time.monotonic()
    ctx = fill_history(db, args.members, args.history)
    fill_s = time.monotonic() - t
    broker = Broker(work, db)
    try:
        ca = str(work / "cert.pem")
        scripts = default_scripts(work)
        start_rss = rss_mb(broker.pid)
        # the first append compacts the history (not measured), then new agents join one by one
        new_agent_round(broker.url, ca, ctx, 0, work, scripts, broker.pid)
        rounds = [new_agent_round(broker.url, ca, ctx, i, work, scripts, broker.pid)
                  for i in range(1, args.new_agent_rounds + 1)]
        import sqlite3

        with sqlite3.connect(db) as conn:
            kept = conn.execute("SELECT count(*) FROM ctx_entries").fetchone()[0]
        res = {"members": args.members, "history": args.history, "fill_s": fill_s, "rounds": rounds,
               "seconds": spread([r["seconds"] for r in rounds]),
               "join_s": spread([r["join_s"] for r in rounds]),
               "updates_and_apply_s": spread([r["updates_and_apply_s"] for r in rounds]),
               "server_cpu_s": spread([r["server_cpu_s"] for r in rounds]),
               "entries_kept_after_compaction": kept, "broker_rss_mb": {"started": start_rss,
                                                                        "after": rss_mb(broker.pid)}}
    finally:
        broker.stop()
    res["baseline_replay"] = replay_baseline(args.members, args.history, args.replay_sample, work)
    return res


# --------------------------------------------------------------------------- driver
async def run(args: argparse.Namespace) -> dict[str, Any]:
    from epu.services.ctxbroker.tls import self_signed

    raise_fd_limit()
    work = Path(tempfile.mkdtemp(prefix="bench-ctx-"))
    try:
        self_signed(work)
        out: dict[str, Any] = {"machine": machine(), "command": " ".join(["bench/bench_ctxbroker.py", *sys.argv[1:]]),
                               "wakeup": [], "new_agent": None}
        for n in args.agents:
            entry: dict[str, Any] = {"agents": n}
            for label, coalesce in (("ours", True), ("baseline_two_writes", False)):
                broker = Broker(work, work / f"wake-{n}-{label}.db", coalesce=coalesce)
                try:
                    entry[label] = await wakeup(broker, work, n, args, polling=coalesce)
                finally:
                    broker.stop()
                log(args, f"{n} agents, {label}: last agent {fmt(entry[label]['seconds'])}")
            entry["seconds"] = entry["ours"]["seconds"]["median"]
            out["wakeup"].append(entry)
        if args.members:
            out["new_agent"] = await new_agent(args, work)
            log(args, f"new agent, {args.members} members / {args.history} entries: "
                      f"{fmt(out['new_agent']['seconds'])}")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
            "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def fmt(s: dict[str, float]) -> str:
    return f"{s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f} s"


def log(args: argparse.Namespace, text: str) -> None:
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


def print_table(res: dict[str, Any]) -> None:
    print(f"\nmachine: {res['machine']}")
    print("\n| agents | last agent (ours) min / median / max | broker CPU per round | baseline: two writes | "
          "p50 (ours, median) | polling 120 s (sim) p50 / max | plain-poll req/s | broker RSS idle → connected |")
    print("|---|---|---|---|---|---|---|---|")
    for e in res["wakeup"]:
        o, b = e["ours"], e["baseline_two_writes"]
        sim = o.get("polling_120s_simulated", {})
        print(f"| {e['agents']} | {fmt(o['seconds'])} | {fmt(o['server_cpu_s'])} | {fmt(b['seconds'])} | "
              f"{o['p50_seconds']['median'] * 1000:.0f} ms | {sim.get('p50', 0):.1f} / {sim.get('max', 0):.1f} s | "
              f"{o.get('plain_poll_rps', 0):.0f} | {o['rss_mb']['idle']:.0f} → {o['rss_mb']['connected']:.0f} MB |")
        if "polling_model_check" in o:
            c = o["polling_model_check"]
            print(f"\npolling model check, {e['agents']} agents, period {c['period_s']:g} s: measured p50 "
                  f"{c['measured']['p50']:.2f} s / max {c['measured']['max']:.2f} s; model p50 "
                  f"{c['model']['p50']:.2f} s / max {c['model']['max']:.2f} s")
    na = res.get("new_agent")
    if na:
        b = na["baseline_replay"]
        print(f"\nnew agent, {na['members']} members, {na['history']} history entries: {fmt(na['seconds'])} "
              f"(join {fmt(na['join_s'])}; updates + apply {fmt(na['updates_and_apply_s'])}; broker CPU "
              f"{fmt(na['server_cpu_s'])}); entries kept after compaction: {na['entries_kept_after_compaction']}")
        print(f"baseline (replay every entry, old default scripts): {b['per_entry_s'] * 1000:.1f} ms per entry "
              f"({b['note']}) → {b['extrapolated_seconds']:.0f} s")


def markdown(runs: list[dict[str, Any]]) -> str:
    """The docs/performance.md figures of one or more ``--json`` runs (what the docs quote is
    what a command printed)."""
    out = []
    for res in runs:
        m = res["machine"]
        out.append(f"Run at {m['at']} (`{res['command']}`; {m['cpus']} cores shared with other sessions, load "
                   f"average {m['load_avg'][0]:.1f} at the start). Min / median / max over the rounds; broker "
                   "CPU-seconds per round beside the wall time.\n")
        out.append("| agents | last agent has the join | broker CPU per round | agents' process CPU | baseline, "
                   "head and body written apart (same run) | baseline broker CPU | p50 agent (median round) | "
                   "polling 120 s, simulated: p50 / last | broker RSS idle → connected |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for e in res["wakeup"]:
            o, b = e["ours"], e["baseline_two_writes"]
            sim = o.get("polling_120s_simulated", {})
            agents_cpu = fmt(o["agents_cpu_s"]) if "agents_cpu_s" in o else "–"
            out.append(f"| {e['agents']:,} | {fmt(o['seconds'])} | {fmt(o['server_cpu_s'])} | {agents_cpu} | "
                       f"{fmt(b['seconds'])} | "
                       f"{fmt(b['server_cpu_s'])} | {o['p50_seconds']['median'] * 1000:.0f} ms | "
                       f"{sim.get('p50', 0):.1f} / {sim.get('max', 0):.1f} s | "
                       f"{o['rss_mb']['idle']:.0f} → {o['rss_mb']['connected']:.0f} MB |")
        for e in res["wakeup"]:
            c = e["ours"].get("polling_model_check")
            if c:
                out.append(f"\nPolling model check, {e['agents']:,} real agents polling every {c['period_s']:g} s: "
                           f"measured p50 {c['measured']['p50']:.2f} s / last {c['measured']['max']:.2f} s; model "
                           f"p50 {c['model']['p50']:.2f} s / last {c['model']['max']:.2f} s.")
        na = res.get("new_agent")
        if na:
            b = na["baseline_replay"]
            out.append(f"\nA new agent joins a context of {na['members']:,} members and {na['history']:,} history "
                       f"entries (join, first answer, applied with the default scripts): **{fmt(na['seconds'])}** "
                       f"(join {fmt(na['join_s'])}; answer + apply {fmt(na['updates_and_apply_s'])}; broker CPU "
                       f"{fmt(na['server_cpu_s'])}); the broker kept {na['entries_kept_after_compaction']:,} entries "
                       f"after compaction. Baseline, the replay an agent did before (every entry, a hook process and "
                       f"a state save each): {b['per_entry_s'] * 1000:.0f} ms per entry, {b['note']}: "
                       f"**{b['extrapolated_seconds']:,.0f} s**.")
        out.append("")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, nargs="*", default=[100, 1000, 10000])
    p.add_argument("--rounds", type=int, default=3, help="long-poll rounds per size")
    p.add_argument("--throughput-seconds", type=float, default=3.0)
    p.add_argument("--poll-check-agents", type=int, default=1000)
    p.add_argument("--poll-check-period", type=float, default=10.0)
    p.add_argument("--members", type=int, default=10_000, help="members of the big context (0: skip)")
    p.add_argument("--history", type=int, default=100_000, help="history entries of the big context")
    p.add_argument("--new-agent-rounds", type=int, default=5)
    p.add_argument("--replay-sample", type=int, default=200, help="entries the replay baseline is measured on")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress on stderr)")
    p.add_argument("--markdown", nargs="+", metavar="RUN.json",
                   help="print the docs/performance.md figures of earlier --json runs, and exit")
    p.add_argument("--serve", nargs=2, metavar=("DIR", "DB"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.markdown:
        print(markdown([json.loads(Path(f).read_text()) for f in args.markdown]))
        return
    if args.serve:
        serve(*args.serve)
        return
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    res = asyncio.run(run(args))
    if args.json:
        print(json.dumps(res))
    else:
        print_table(res)


if __name__ == "__main__":
    main()
