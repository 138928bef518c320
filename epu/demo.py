"""``epu demo``: the whole elastic loop in one process, on the in-memory transport.

A simulated batch cluster (jobs really run on nodes for their duration), the decision engine
with the paper's queue-demand policy, the provisioner on two simulated clouds (a cheap one
with a small quota, overflowing into a second), and the context broker to which every
booted node "joins" — all four services, wired exactly as in production except that
``memory://`` replaces RabbitMQ. A burst of jobs arrives; the cluster scales up, runs every
job and scales back to zero; the demo ends by itself with a summary.

What the terminal shows comes from the bus: the demo taps ``epu.events`` with ``#`` like any
operator would (``epu tap``), so the display is also a check that the events are complete.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epu.common.messages import (
    TERMINAL_INSTANCE_STATES,
    ContextMembership,
    DecisionRecord,
    Envelope,
    InstanceEvent,
    Message,
    SensorSnapshot,
)

RAW = argparse.RawDescriptionHelpFormatter
#: A syntactically valid OpenSSH host key line for the simulated nodes' context joins.
DEMO_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq3mQm1xq5cS0n2yP1vJ4m0x8JYVbq0mYb2p6kq3N1c demo"


@dataclass
class DemoSettings:
    jobs: int = 40
    job_seconds: float = 12.0
    cores_per_node: int = 4
    max_nodes: int = 8
    boot_seconds: float = 4.0
    fail_rate: float = 0.0
    api_error_rate: float = 0.0
    stall_seconds: float = 20.0
    idle_seconds: float = 3.0
    quota_a: int = 5
    timeout: float = 150.0
    seed: int | None = None
    with_ctxbroker: bool = True
    broker_url: str | list[str] = "memory://"
    """The demo runs on the in-memory transport; tests point it at RabbitMQ (one URL, or the
    nodes of a cluster)."""
    prefix: str | None = None
    workload: str = "simple"
    """``simple`` (1-core jobs, one instance size) or ``mixed`` (shapes on a typed catalogue,
    ``demo_mixed``)."""
    budget_per_hour: float | None = None
    """The domain's spend cap (``budget_per_hour``; None: none)."""


#: (account, user) of the simple workload's jobs, in turn: the demo's cost has owners.
DEMO_OWNERS = (("physics", "alice"), ("physics", "bob"), ("chemistry", "carol"))


@dataclass
class Observed:
    """What the tap saw, and the figures for the summary."""

    started: float = field(default_factory=time.monotonic)
    instance_state: dict[str, str] = field(default_factory=dict)
    instance_site: dict[str, str] = field(default_factory=dict)
    instance_seq: dict[str, int] = field(default_factory=dict)
    instance_node: dict[str, str] = field(default_factory=dict)
    instance_type: dict[str, str] = field(default_factory=dict)
    unsatisfiable: list[str] = field(default_factory=list)
    """What the newest decision record says no type can serve."""
    failed: int = 0
    peak: int = 0
    seconds_to_peak: float = 0.0
    decisions: deque[str] = field(default_factory=lambda: deque(maxlen=8))
    decision_count: int = 0
    last_snapshot: SensorSnapshot | None = None
    events: int = 0
    first_job_running: float | None = None
    context_members: set[str] = field(default_factory=set)
    context_last_entry: dict[str, int] = field(default_factory=dict)
    context_joins: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    prices: dict[tuple[str, str], float | None] = field(default_factory=dict)
    peak_spend: float = 0.0
    """The most the live instances cost per hour at once."""

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def live(self) -> dict[str, str]:
        return {i: s for i, s in self.instance_state.items() if s not in TERMINAL_INSTANCE_STATES}

    def display_states(self) -> dict[str, str]:
        """Live instances with the batch system's view folded in: a started instance whose node
        is in the snapshot has joined; one whose node is offline is draining (the engine's view)."""
        nodes = {n.name: n.state for n in self.last_snapshot.nodes} if self.last_snapshot else {}
        out = {}
        for i, state in self.live().items():
            node_state = nodes.get(self.instance_node.get(i, ""))
            if state == "started" and node_state is not None:
                state = "draining" if node_state == "offline" else "joined"
            out[i] = state
        return out

    def on_event(self, msg: Message, env: Envelope) -> None:
        with self.lock:
            self.events += 1
            if isinstance(msg, InstanceEvent):
                if msg.seq and msg.seq <= self.instance_seq.get(msg.instance_id, -1):
                    return  # stale or duplicate
                self.instance_seq[msg.instance_id] = msg.seq
                self.instance_state[msg.instance_id] = msg.state
                self.instance_site[msg.instance_id] = msg.site
                if msg.node_name:
                    self.instance_node[msg.instance_id] = msg.node_name
                if msg.instance_type:
                    self.instance_type[msg.instance_id] = msg.instance_type
                if msg.state == "failed":
                    self.failed += 1
                spend = sum(self.prices.get((self.instance_site[i], self.instance_type.get(i, "")),
                                            self.prices.get((self.instance_site[i], ""))) or 0.0
                            for i in self.live())  # the demo's sites are all priced
                self.peak_spend = max(self.peak_spend, spend)
                live = len(self.live())
                if live > self.peak:
                    self.peak, self.seconds_to_peak = live, round(self.elapsed(), 1)
            elif isinstance(msg, DecisionRecord):
                self.decision_count += 1
                self.unsatisfiable = [f"{u.count} x {u.shape} ({u.constraint})" for u in msg.saw.unsatisfiable]
                for a in msg.actions:
                    where = f"@{a.site}" if a.site else ""
                    self.decisions.append(f"{self.elapsed():5.1f}s {a.kind:<9} {a.target}{where}  {a.reason}")
            elif isinstance(msg, ContextMembership):
                # events of one host may arrive out of order (joins are announced from the HTTP
                # side, leaves from the consumer): the entry id says which came last
                key = f"{msg.context_id}/{msg.hostname}"
                if msg.entry_id <= self.context_last_entry.get(key, 0):
                    return
                self.context_last_entry[key] = msg.entry_id
                if msg.kind == "join":
                    self.context_joins += 1
                    self.context_members.add(msg.hostname)
                else:
                    self.context_members.discard(msg.hostname)
            elif isinstance(msg, SensorSnapshot):
                self.last_snapshot = msg
                if self.first_job_running is None and msg.running_jobs:
                    self.first_job_running = round(self.elapsed(), 1)


def build_config(s: DemoSettings, workdir: Path, prefix: str, context: dict[str, Any] | None = None) -> Any:
    """The demo's configuration. With ``context`` (created on the demo's broker), the domain's
    workers are told about it as a site's would be: ``[workers.demo]`` with the context URI
    and a file holding its secret, from which the provisioner renders each instance's own
    credential into its userdata."""
    from epu.common.config import parse_config

    site_base = {"driver": "epu-sim", "image": "sim-base",
                 "driver_args": {"api_latency": 0.05, "boot_time_min": s.boot_seconds * 0.75,
                                 "boot_time_max": s.boot_seconds * 1.25, "boot_failure_rate": s.fail_rate,
                                 "api_error_rate": s.api_error_rate}}
    data = {
        "broker": {"url": s.broker_url, "prefix": prefix,
                   "quorum": not (s.broker_url if isinstance(s.broker_url, str) else s.broker_url[0]).startswith("memory")},
        "logging": {"level": "warning"},
        "sensor": {"domain": "demo", "backend": "simulated", "poll_seconds": 1.0,
                   "options": {"tick_seconds": 0.25}},
        "decision": {"iteration_seconds": 1.0, "store_url": f"sqlite:///{workdir / 'decision.db'}",
                     "resend_seconds": 5.0},
        "provisioner": {"store_url": f"sqlite:///{workdir / 'provisioner.db'}", "poll_seconds": 0.5,
                        "reconcile_seconds": 30.0, "orphan_grace_seconds": 30.0, "deployment": "demo"},
        "ctxbroker": {"store_url": f"sqlite:///{workdir / 'ctx.db'}", "port": 0,
                      "admin_token_file": str(workdir / "admin-token")},
        "domains": {"demo": {
            "policy": "queue-demand", "min_nodes": 0, "max_nodes": s.max_nodes,
            "sites": ["cloud-a", "cloud-b"], "placement": "rank", "cores_per_node": s.cores_per_node,
            "params": {"idle_seconds": s.idle_seconds, "stall_seconds": s.stall_seconds},
            **({"budget_per_hour": s.budget_per_hour} if s.budget_per_hour else {}),
        }},
        "sites": {
            name: {**site_base, "quota": quota, "cores": s.cores_per_node, "price_per_hour": price,
                   "size": f"sim.{s.cores_per_node}core"}
            for name, quota, price in (("cloud-a", s.quota_a, 0.05), ("cloud-b", s.max_nodes, 0.12))
        },
    }
    if s.workload == "mixed":
        from epu import demo_mixed

        data["sites"] = demo_mixed.sites(site_base)
        data["domains"]["demo"].update(demo_mixed.domain_keys())
    if context is not None:
        data["workers"] = {"demo": {"head_node": "demo-head", "context_uri": context["uri"],
                                    "context_secret_file": context["secret_file"],
                                    "context_ca_file": context["ca_file"]}}
    return parse_config(data, "<demo>", environ={})


class Demo:
    def __init__(self, s: DemoSettings) -> None:
        self.s = s
        self.workdir = Path(tempfile.mkdtemp(prefix="epu-demo-"))
        self._stopped = False
        self.prefix = s.prefix if s.prefix is not None else f"demo{uuid.uuid4().hex[:6]}."
        self.config = build_config(s, self.workdir, self.prefix)
        from epu.cli_cost import catalogue_prices

        self.obs = Observed(prices=catalogue_prices(self.config))
        self.threads: list[threading.Thread] = []
        self.services: list[Any] = []
        from epu.demo_mixed import TypedBatch
        from epu.services.sensor.simulated import SimulatedBatch

        self.batch = TypedBatch() if s.workload == "mixed" else SimulatedBatch()
        self.stuck = 0
        """Jobs submitted to stay pending (limit-blocked, unsatisfiable): never run."""
        self.rng = random.Random(s.seed)
        self.context: dict[str, Any] | None = None
        self._ctx_cert: str | None = None
        self._joined: set[str] = set()
        from concurrent.futures import ThreadPoolExecutor

        self._agents = ThreadPoolExecutor(max_workers=2, thread_name_prefix="demo-agent")

    #: Seconds each service has to connect and register its consumers.
    START_SECONDS = 15.0

    def start(self) -> None:
        """Start the tap, then the services. If one does not start, stop every one started before
        raising: a half-started demo left running keeps its connections to the broker (and its
        threads) for as long as the process lives."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        from epu.common.runtime import Service
        from epu.services.decision.app import build_service as build_decision
        from epu.services.provisioner.app import build_service as build_provisioner
        from epu.services.sensor.app import build_service as build_sensor

        broker = self.config.broker_obj()
        tap = Service("demo-tap", broker)
        tap.consume_queue(broker.topology.tap_queue("#"), self.on_event)
        self._run(tap)
        if self.s.with_ctxbroker:
            # the broker first: the context must exist before the provisioner renders userdata
            from epu.services.ctxbroker.app import build_service as build_ctx

            ctx_service = build_ctx(self.config)
            self._run(ctx_service)
            self._ctx_cert = ctx_service.server.settings.cert_file
            self._start_context(ctx_service)
            self.config = build_config(self.s, self.workdir, self.prefix, self.context)
        for svc in (build_provisioner(self.config), build_sensor(self.config, backend=self.batch),
                    build_decision(self.config)):
            self._run(svc)

    def _run(self, svc: Any) -> None:
        from epu.common.runtime import Service, run_in_thread

        self.services.append(svc)
        if isinstance(svc, Service):
            self.threads.append(run_in_thread(svc))
            if not svc.wait_ready(self.START_SECONDS):
                raise RuntimeError(f"{svc.name} did not start within {self.START_SECONDS:g} s: "
                                   f"{svc.health().get('last_error') or 'no error reported'}")
        else:
            t = threading.Thread(target=svc.run, name="svc-ctxbroker", daemon=True)
            t.start()
            self.threads.append(t)

    def _start_context(self, ctx_service: Any) -> None:
        """Create the cluster's context, as an operator would with ``epu ctx create demo
        --secret-file FILE``."""
        from epu.services.ctxbroker.client import AdminClient

        server = ctx_service.server
        deadline = time.monotonic() + 15
        while True:
            try:
                admin = AdminClient(server.public_url, server.settings.admin_token,
                                    ca_file=server.settings.cert_file)
                ctx = admin.create("demo")
                admin.close()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        secret_file = self.workdir / "demo.context-secret"
        secret_file.write_text(ctx["secret"] + "\n")
        secret_file.chmod(0o600)
        self.context = {**ctx, "secret_file": str(secret_file), "ca_file": server.settings.cert_file}

    def _agent_join(self, msg: InstanceEvent) -> None:
        """What the context agent on a booted node does first: join with its host facts, with
        the node's own credential (what the provisioner rendered into its userdata: derived
        from the context secret for this host name and instance). A terminated instance leaves
        through the provisioner's event, and a join that comes after it is refused."""
        from epu.common import nodecred
        from epu.services.ctxbroker.client import BrokerError, NodeClient

        ctx = self.context
        cred = nodecred.issue(nodecred.signing_key(ctx["secret"]), ctx["id"], msg.node_name, msg.instance_id)
        client = NodeClient(ctx["uri"], cred.key, cred.secret, ca_file=self._ctx_cert)
        doc = {"hostname": msg.node_name, "fqdn": f"{msg.node_name}.demo.cluster", "ip": msg.ip,
               "instance_id": msg.instance_id, "ssh_host_key": DEMO_HOST_KEY,
               "data": f"slots={self.s.cores_per_node}"}
        try:
            # the broker holds the join (503) until its own copy of this event told it the
            # instance's address; a real agent retries the same way (with its backoff)
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.join(doc)
                    break
                except BrokerError as exc:
                    if not exc.retryable or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        except Exception as exc:  # the demo goes on; the display shows fewer members
            import logging

            logging.getLogger("epu.demo").warning("demo agent join failed", extra={"error": str(exc)})
        finally:
            client.close()

    def on_event(self, msg: Message, env: Envelope) -> None:
        self.obs.on_event(msg, env)
        if (self.context and isinstance(msg, InstanceEvent) and msg.state in ("started", "joined") and msg.ip
                and msg.instance_id not in self._joined):
            self._joined.add(msg.instance_id)
            self._agents.submit(self._agent_join, msg)

    def submit_burst(self) -> None:
        if self.s.workload == "mixed":
            from epu import demo_mixed

            self.stuck = demo_mixed.submit(self.batch, self.s.jobs, self.s.job_seconds, self.rng)
            return
        for k in range(self.s.jobs):
            duration = self.s.job_seconds * self.rng.uniform(0.5, 1.5)
            account, user = DEMO_OWNERS[k % len(DEMO_OWNERS)]
            self.batch.submit(cores=1, duration=duration, account=account, user=user)

    def finished(self) -> bool:
        """Every job done, no instance or batch node left, and (with the broker) every node gone
        from the context: a leave follows its instance's termination by a moment."""
        with self.obs.lock:
            left = not self.obs.context_members
        return (self.batch.completed >= self.batch.submitted - self.stuck and not self.obs.live()
                and not self.batch.node_names() and self.obs.instance_state != {} and left)

    def stop(self) -> None:
        """Stop every service (once). The stores stay readable until ``close``."""
        if self._stopped:
            return
        self._stopped = True
        self._agents.shutdown(wait=True)
        for svc in reversed(self.services):
            svc.stop()
        for t in self.threads:
            t.join(10)

    def close(self) -> None:
        """Stop (if running) and remove the demo's working directory (stores, the broker's TLS
        key and admin token, the context secret): a demo leaves nothing behind."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Demo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def summary(self, timed_out: bool) -> dict[str, Any]:
        o = self.obs
        sites = Counter(o.instance_site.values())
        return {
            "jobs_submitted": self.batch.submitted,
            "jobs_completed": self.batch.completed,
            "jobs_stuck": self.stuck,
            "instances_by_type": dict(sorted(Counter(o.instance_type.values()).items())),
            "unsatisfiable": list(o.unsatisfiable),
            "instances_launched": len(o.instance_state),
            "instances_failed": o.failed,
            "instances_by_site": dict(sorted(sites.items())),
            "peak_instances": o.peak,
            "final_instances": len(o.live()),
            "final_batch_nodes": len(self.batch.node_names()),
            "seconds_to_peak": o.seconds_to_peak,
            "seconds_to_first_job_running": o.first_job_running,
            "seconds_total": round(o.elapsed(), 1),
            "decision_records": o.decision_count,
            "context_joins": o.context_joins,
            "context_members_final": len(o.context_members),
            "events_seen": o.events,
            "timed_out": timed_out,
            **self.cost(),
        }

    def cost(self) -> dict[str, Any]:
        """The run's cost by account, as ``epu cost`` reads it from the services' stores (the
        instance records and the engine's job spans), and the most it spent per hour at once."""
        from epu.cli_cost import read_report
        from epu.cost import group, total

        now = time.time()
        usage = read_report(self.config, 0.0, now, now).usage
        with self.obs.lock:
            peak = self.obs.peak_spend
        return {"cost_total": round(total(usage).cost, 9),
                "cost_by_account": {k[0]: round(u.cost, 9) for k, u in group(usage, ["account"])},
                "peak_spend_per_hour": round(peak, 4), "budget_per_hour": self.s.budget_per_hour}


def render(demo: Demo) -> Any:
    from rich.columns import Columns
    from rich.panel import Panel
    from rich.table import Table

    o, b = demo.obs, demo.batch
    with o.lock:
        live = o.display_states()
        states = Counter(live.values())
        by_site = Counter(o.instance_site[i] for i in live)
        by_type = Counter(o.instance_type.get(i, "") for i in live)
        unsatisfiable = list(o.unsatisfiable)
        snap = o.last_snapshot
        decisions = list(o.decisions)
    q = Table.grid(padding=(0, 2))
    q.add_row("submitted", str(b.submitted))
    q.add_row("queued", str(b.queued))
    q.add_row("running", str(b.running))
    q.add_row("completed", f"[green]{b.completed}[/]")
    n = Table.grid(padding=(0, 2))
    node_states = Counter(x.state for x in snap.nodes) if snap else Counter()
    for state in ("free", "busy", "offline", "down", "unknown"):
        n.add_row(state, str(node_states.get(state, 0)))
    i = Table.grid(padding=(0, 2))
    for state in ("requested", "pending", "started", "joined", "draining", "terminating"):
        i.add_row(state, str(states.get(state, 0)))
    i.add_row("[bold]live", f"[bold]{len(live)}[/]  peak {o.peak}")
    s = Table.grid(padding=(0, 2))
    for site in ("cloud-a", "cloud-b"):
        s.add_row(site, str(by_site.get(site, 0)))
    for kind in sorted(k for k in by_type if k):
        s.add_row(f"type {kind}", str(by_type[kind]))
    s.add_row("failed", str(o.failed))
    for line in unsatisfiable[:3]:
        s.add_row("[red]unsatisfiable[/]", line)
    if demo.context is not None:
        s.add_row("context", f"{len(o.context_members)} nodes")
    top = Columns([Panel(q, title="batch queue"), Panel(n, title="nodes (sensor)"),
                   Panel(i, title="instances"), Panel(s, title="by site")])
    dec = Table.grid()
    for line in decisions or ["(waiting for the first decision)"]:
        dec.add_row(line)
    from rich.console import Group

    header = f"[bold]EPU demo[/]  {o.elapsed():5.1f}s   events on the bus: {o.events}   decisions: {o.decision_count}"
    return Group(header, top, Panel(dec, title="decisions (latest last)"))


def run_demo(s: DemoSettings, live_display: bool = True, out: Any = sys.stderr) -> dict[str, Any]:
    demo = Demo(s)
    timed_out = False
    try:
        demo.start()
        demo.submit_burst()
        deadline = time.monotonic() + s.timeout
        if live_display:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=out)
            with Live(render(demo), console=console, refresh_per_second=4, transient=False) as live:
                while not demo.finished():
                    if time.monotonic() > deadline:
                        timed_out = True
                        break
                    time.sleep(0.25)
                    live.update(render(demo))
                live.update(render(demo))
        else:
            last = 0.0
            while not demo.finished():
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.1)
                if out is not None and time.monotonic() - last > 5:
                    last = time.monotonic()
                    print(f"{demo.obs.elapsed():6.1f}s queued={demo.batch.queued} running={demo.batch.running} "
                          f"completed={demo.batch.completed} instances={len(demo.obs.live())}", file=out, flush=True)
    finally:
        summary = demo.summary(timed_out)
        demo.close()
    return summary


def cmd_demo(args: argparse.Namespace) -> int:
    from epu.common.logs import setup_logging

    setup_logging("error" if not args.verbose else "info")
    broker_url = "memory://"
    path = args.config or os.environ.get("EPU_CONFIG")  # never /etc/epu/epu.toml implicitly
    if path:
        from epu.common.cliargs import load_or_exit

        broker_url = load_or_exit(path).broker.url
    s = DemoSettings(broker_url=broker_url, jobs=args.jobs, job_seconds=args.job_seconds, cores_per_node=args.cores_per_node,
                     max_nodes=args.max_nodes, boot_seconds=args.boot_seconds, fail_rate=args.fail_rate,
                     api_error_rate=args.api_error_rate, stall_seconds=args.stall_seconds,
                     idle_seconds=args.idle_seconds, timeout=args.timeout, seed=args.seed,
                     with_ctxbroker=not args.no_ctxbroker, workload=args.workload,
                     budget_per_hour=args.budget_per_hour)
    live = not args.json and not args.no_live and sys.stderr.isatty()
    summary = run_demo(s, live_display=live, out=None if args.json else sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print("\nSummary")
        for k, v in summary.items():
            print(f"  {k:<30} {v}")
    ok = (not summary["timed_out"] and summary["jobs_completed"] == summary["jobs_submitted"] - summary["jobs_stuck"]
          and summary["final_instances"] == 0)
    return 0 if ok else 1


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _rate(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="the embedded demo: all services in one process, simulated cluster and clouds",
        formatter_class=RAW,
        description=(
            "Run the whole elastic loop in one process on the in-memory transport: a simulated batch\n"
            "cluster whose jobs really run for their duration, the decision engine (queue-demand\n"
            "policy), the provisioner on two simulated clouds (cloud-a: cheap, small quota; cloud-b:\n"
            "overflow) and the context broker. A burst of jobs arrives; the terminal shows the queue,\n"
            "nodes, instances by state and site, and each decision, live. The cluster scales up, runs\n"
            "every job, scales back to zero, and the demo prints a summary and exits by itself."),
        epilog=(
            "Exit status: 0 when every job completed and no instance is left; 1 otherwise.\n\n"
            "Examples:\n"
            "  epu demo                               # the default burst, live display\n"
            "  epu demo --jobs 100 --max-nodes 12     # a bigger burst\n"
            "  epu demo --fail-rate 0.3               # 30% of boots fail: watch replacements\n"
            "  epu demo --workload mixed              # shapes: the right type per partition\n"
            "  epu demo --json | jq .peak_instances   # one JSON summary object for scripts\n\n"
            "JSON keys: jobs_submitted, jobs_completed, jobs_stuck, instances_by_type, unsatisfiable,\n"
            "instances_launched, instances_failed,\n"
            "instances_by_site, peak_instances, final_instances, final_batch_nodes, seconds_to_peak,\n"
            "seconds_to_first_job_running, seconds_total, decision_records, context_joins,\n"
            "context_members_final, events_seen, timed_out."))
    d = DemoSettings()
    p.add_argument("--jobs", type=_positive(int), default=d.jobs, help=f"jobs in the burst (default {d.jobs})")
    p.add_argument("--job-seconds", type=_positive(float), default=d.job_seconds,
                   help=f"mean job run time; each job draws 0.5x-1.5x (default {d.job_seconds})")
    p.add_argument("--cores-per-node", type=_positive(int), default=d.cores_per_node,
                   help=f"cores of each instance (default {d.cores_per_node})")
    p.add_argument("--max-nodes", type=_positive(int), default=d.max_nodes,
                   help=f"most instances at once (default {d.max_nodes})")
    p.add_argument("--boot-seconds", type=_positive(float), default=d.boot_seconds,
                   help=f"mean instance boot time (default {d.boot_seconds})")
    p.add_argument("--fail-rate", type=_rate, default=d.fail_rate,
                   help="probability an instance fails to boot (default 0)")
    p.add_argument("--api-error-rate", type=_rate, default=d.api_error_rate,
                   help="probability a cloud API call fails transiently (default 0)")
    p.add_argument("--stall-seconds", type=_positive(float), default=d.stall_seconds,
                   help=f"replace an instance not joined after this long (default {d.stall_seconds})")
    p.add_argument("--idle-seconds", type=float, default=d.idle_seconds,
                   help=f"idle time before a worker is drained (default {d.idle_seconds})")
    p.add_argument("--timeout", type=_positive(float), default=d.timeout,
                   help=f"give up after this many seconds (default {d.timeout})")
    p.add_argument("--seed", type=int, default=None, help="random seed for job lengths")
    p.add_argument("--workload", choices=("simple", "mixed"), default=d.workload,
                   help="simple: 1-core jobs on one instance size; mixed: cpu, bigmem and GPU jobs on a typed "
                        "catalogue, plus limit-blocked and unsatisfiable jobs that stay pending (default simple)")
    p.add_argument("--no-ctxbroker", action="store_true", help="leave the context broker out")
    p.add_argument("--budget-per-hour", type=_positive(float), default=None, metavar="USD",
                   help="the domain's spend cap (the summary shows the peak spend rate under it)")
    p.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live display")
    p.add_argument("--json", action="store_true", help="print only the summary, as one JSON object")
    p.add_argument("-v", "--verbose", action="store_true", help="show service logs")
    p.add_argument("-c", "--config", metavar="FILE",
                   help="run the demo's services over this config's [broker] (RabbitMQ; names get a unique "
                        "prefix) instead of the in-memory transport; $EPU_CONFIG likewise. Nothing else of "
                        "the file is used")
    p.set_defaults(func=cmd_demo)
