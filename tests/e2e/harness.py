"""The end-to-end harness: a private Slurm with a CLOUD pool, the four services as separate
``epu run`` processes, the recorder, and a census of real worker processes.

Why a module: the scenario and the fault tests share every piece; each test only says what
happens and what must hold. Built on tests/support/slurm.py (SlurmTestCluster) and on the
example config deploy/examples/e2e-slurm.toml, which is rendered, not copied, so the
example stays the truth about what runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epu.common.broker import Broker
from epu.common.messages import InstanceEvent, SensorSnapshot
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import wait_for

from tests.support.slurm import SlurmNodeSpec, SlurmPartitionSpec, SlurmTestCluster, find_exe, free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "e2e-slurm.toml"
EPU = [sys.executable, "-m", "epu.cli"]
POOL = [f"elastic{i:02d}" for i in range(1, 7)]
SERVICES = ("ctxbroker", "provisioner", "decision", "sensor")


def render_config(workdir: Path, broker_url: str, prefix: str, ctx_port: int, example: Path = EXAMPLE,
                  **replace: str) -> Path:
    """The example config with this run's directory, interpreter, broker and ports."""
    text = example.read_text()
    for old, new in replace.items():
        text = text.replace(old, new)
    text = text.replace("/tmp/epu-e2e/ctx-scripts", str(ROOT / "deploy" / "ctx-scripts"))
    text = text.replace("/tmp/epu-e2e", str(workdir))
    text = text.replace('"python3"', json.dumps(sys.executable))
    text = text.replace('"/usr/sbin/slurmd"', json.dumps(find_exe("slurmd")))
    text = text.replace('url = "amqp://guest:guest@127.0.0.1:5672//"', f"url = {json.dumps(broker_url)}")
    text = text.replace('prefix = "e2e"', f"prefix = {json.dumps(prefix)}")
    text = text.replace("18443", str(ctx_port))
    path = workdir / "epu.toml"
    path.write_text(text)
    return path


def slurmd_pids(conf: Path) -> dict[str, set[int]]:
    """Live slurmd processes of this cluster by node name (``-N NAME``), read from /proc.

    A slurmd forks before exec'ing slurmstepd, and the fork shows the same command line for
    a moment: a process whose parent is a matching slurmd is that fork, not a second daemon.
    (Its own fork may outlive the intermediate parent for a moment too; ``Census`` only
    counts processes seen in two consecutive samples, which such a fork never is.)"""
    found: dict[int, tuple[int, str]] = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
            fields = (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] in ("Z", "X") or not argv or not argv[0].endswith(b"slurmd"):
            continue
        args = [a.decode(errors="replace") for a in argv]
        if str(conf) in args and "-N" in args:
            found[int(pid_dir.name)] = (int(fields[1]), args[args.index("-N") + 1])
    out: dict[str, set[int]] = {}
    for pid, (ppid, name) in found.items():
        if ppid not in found:
            out.setdefault(name, set()).add(pid)
    return out


def slurmd_census(conf: Path) -> Counter[str]:
    """How many slurmd run per node name now (see ``slurmd_pids``)."""
    return Counter({name: len(pids) for name, pids in slurmd_pids(conf).items()})


@dataclass
class Census:
    """Samples the slurmd census in a thread: the most daemons ever seen per node name (above
    one is a duplicate worker) and in all (above the pool size is one too many)."""

    conf: Path
    interval: float = 0.2
    peak: Counter[str] = field(default_factory=Counter)
    max_total: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _last: dict[str, set[int]] = field(default_factory=dict)

    def start(self) -> Census:
        self._thread = threading.Thread(target=self._run, name="census", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> Counter[str]:
        """Daemons by node name: a daemon is a process seen in two samples in a row (a fork
        caught between fork and exec is gone, or is slurmstepd, by the next one)."""
        pids = slurmd_pids(self.conf)
        stable = Counter({name: len(now & self._last.get(name, set())) for name, now in pids.items()})
        self._last = pids
        for name, n in stable.items():
            self.peak[name] = max(self.peak[name], n)
        self.max_total = max(self.max_total, sum(stable.values()))
        return stable

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def duplicates(self) -> list[str]:
        return sorted(n for n, c in self.peak.items() if c > 1)


class ElasticSlurm(SlurmTestCluster):
    """The harness's cluster with shorter timeouts, so the stalled-worker test fits its budget:
    a slot EPU added whose slurmd never registers (a worker that never starts) is marked down
    and its jobs requeued after ``ResumeTimeout`` 15 s (not 60), and a requeued job may start
    again after ``cred_expire`` 10 s (Slurm holds it back that long; default 120)."""

    resume_timeout: int = 15
    cred_expire: int = 10

    def write_conf(self) -> None:
        super().write_conf()
        text = self.conf_path.read_text().replace("ResumeTimeout=60", f"ResumeTimeout={self.resume_timeout}")
        text = text.replace("AuthInfo=socket=", f"AuthInfo=cred_expire={self.cred_expire},socket=")
        self.conf_path.write_text(text)


class SnapshotWatch:
    """The test's own tap on sensor snapshots, so it waits on what the sensor (and so the
    recorder) has seen rather than on a clock."""

    def __init__(self, broker: Broker) -> None:
        self._lock = threading.Lock()
        self.snapshots: list[SensorSnapshot] = []
        self.instances: dict[str, tuple[int, str]] = {}  # instance id -> (seq, state), the newest
        self._service = Service("e2e-watch", broker)
        self._service.consume_queue(broker.topology.tap_queue(["sensor.snapshot.#", "instance.state.#"]), self._on)
        self._thread = run_in_thread(self._service)
        if not self._service.wait_ready(15):
            raise RuntimeError("snapshot tap did not start")

    def _on(self, msg: object, envelope: object) -> None:
        if isinstance(msg, SensorSnapshot):
            with self._lock:
                self.snapshots.append(msg)
        elif isinstance(msg, InstanceEvent):
            with self._lock:
                if msg.seq >= self.instances.get(msg.instance_id, (-1, ""))[0]:
                    self.instances[msg.instance_id] = (msg.seq, msg.state)

    def live_instances(self) -> list[str]:
        """Instances whose newest event is not an end (the recorder counts them as orphans)."""
        with self._lock:
            return sorted(i for i, (_, state) in self.instances.items() if state not in ("terminated", "failed"))

    def count(self) -> int:
        with self._lock:
            return len(self.snapshots)

    def empty_cluster_seen(self, after: int = 0) -> bool:
        """An available snapshot (the ``after``-th or later) with no node, no queue, no job."""
        with self._lock:
            return any(s.available and not s.nodes and not s.queued_demand() and not s.running_jobs
                       for s in self.snapshots[after:])

    def wait_settled(self, after: int, timeout: float = 60) -> None:
        """Wait for an empty-cluster snapshot (the ``after``-th or later: not the empty cluster
        before the jobs), then for one more: by then every tap, the recorder's too, had it."""
        wait_for(lambda: self.empty_cluster_seen(after), timeout, interval=0.1, message="the sensor reports an empty cluster")
        # the batch system empties before the provisioner's last `terminated` events go out (a
        # busy machine: seconds later); the recorder reads those events too
        wait_for(lambda: not self.live_instances(), timeout, interval=0.1,
                 message="every instance ended (terminated or failed)")
        n = self.count()
        wait_for(lambda: self.count() > n, 30, interval=0.1, message="one more snapshot")

    def stop(self) -> None:
        self._service.stop()
        self._thread.join(10)


@dataclass
class E2E:
    """One run: cluster, config, services, recorder. Use as a context manager."""

    workdir: Path
    broker_url: str
    prefix: str
    replace: dict[str, str] = field(default_factory=dict)
    cluster: ElasticSlurm = field(init=False)
    config: Path = field(init=False)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    census: Census = field(init=False)
    extra_env: dict[str, str] = field(default_factory=dict)
    example: Path = EXAMPLE
    """The example config this run renders (deploy/examples/)."""
    pool: list[SlurmNodeSpec] | None = None
    """The CLOUD slots (default: POOL, two cores each, one partition over all)."""
    partitions: list[SlurmPartitionSpec] = field(default_factory=list)
    licenses: str = ""

    def __enter__(self) -> E2E:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        pool = self.pool or [SlurmNodeSpec(n, cpus=2, state="CLOUD") for n in POOL]
        # the cluster's own short temp dir: slurmstepd's socket paths must stay under 108 bytes
        self.cluster = ElasticSlurm(nodes=[], cloud_nodes=pool, partitions=self.partitions, licenses=self.licenses)
        self.cluster.start()
        for spec in pool:  # what slurmd of a pre-declared slot expects to find
            (self.cluster.workdir / "spool" / f"slurmd.{spec.name}").mkdir(parents=True, exist_ok=True)
        self.config = render_config(self.workdir, self.broker_url, self.prefix, free_port(), self.example,
                                    **{"/tmp/epu-e2e/slurm/etc/slurm.conf": str(self.cluster.conf_path),
                                       **self.replace})
        self.census = Census(self.cluster.conf_path).start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        """Stop everything; on a failure, first print what the services and Slurm said."""
        if exc_type is not None:
            try:
                print(self.diagnostics())
            except Exception as exc:  # never hide the test's own failure
                print(f"(no diagnostics: {exc})")
        try:
            for name in list(self.procs):
                self.stop(name)
        finally:
            self.census.stop()
            self._kill_stray_workers()
            self.cluster.stop()

    # ------------------------------------------------------------------ processes
    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_CONF": str(self.cluster.conf_path), **self.extra_env}

    def start(self, name: str, argv: list[str] | None = None, stdout: Path | None = None) -> subprocess.Popen[bytes]:
        """Start a service (``epu run NAME``) or any argv, logging to logs/NAME.log (stdout to
        ``stdout`` when given: a command whose output is the result)."""
        service = name.split("#")[0]
        argv = argv or [*EPU, "run", service, "-c", str(self.config)]
        log = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        out = open(stdout, "ab") if stdout is not None else log  # noqa: SIM115
        proc = subprocess.Popen(argv, env=self.env, cwd=self.workdir, stdout=out,
                                stderr=log if stdout is not None else subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill9(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(5)

    def start_recorder(self, out: Path) -> None:
        ready = self.workdir / "recorder.ready"
        self.start("recorder", [*EPU, "record", "--out", str(out), "--ready-file", str(ready), "-c", str(self.config)])
        wait_for(ready.exists, 30, interval=0.1, message="recorder bound to the events exchange")

    def stop_recorder(self, out: Path) -> dict[str, Any]:
        self.stop("recorder", signal.SIGINT, timeout=60)
        return json.loads((out / "summary.json").read_text())

    def start_watchers(self, out: Path, domain: str = "alpha") -> None:
        """What an operator watches with: ``epu status DOMAIN --watch --json`` (one JSON line per
        change) into status.jsonl and ``epu tap --json`` (every event) into tap.jsonl, both in
        the results folder. Returns once both are bound to the events exchange."""
        self.start_tap(out)
        self.start("status", [*EPU, "status", domain, "--watch", "--json", "-c", str(self.config)],
                   stdout=out / "status.jsonl")
        # status says nothing until the board changes; a snapshot changes it (the sensor's poll)
        wait_for(lambda: (out / "status.jsonl").stat().st_size > 0, 30, interval=0.1,
                 message="epu status showing the domain")

    def start_tap(self, out: Path) -> None:
        """``epu tap --json`` (every event) into ``out``/tap.jsonl; returns once it is bound to the
        events exchange (an event before that would be missing from the file)."""
        out.mkdir(parents=True, exist_ok=True)
        self.start("tap", [*EPU, "tap", "--json", "-c", str(self.config)], stdout=out / "tap.jsonl")
        tap_log = self.workdir / "logs" / "tap.log"
        wait_for(lambda: tap_log.exists() and "# tapping" in tap_log.read_text(), 30, interval=0.1,
                 message="epu tap bound")

    def stop_watchers(self) -> None:
        for name in ("status", "tap"):
            self.stop(name, signal.SIGINT)

    def start_services(self) -> None:
        self.start("ctxbroker")
        self.create_context()
        for name in SERVICES[1:]:
            self.start(name)

    def create_context(self) -> dict[str, Any]:
        """Create the cluster's context as an operator would (``epu ctx create --secret-file``) and
        point the provisioner's ``[workers.alpha]`` at it (here through the environment, since the
        context id is known only now): every worker's rendered userdata then carries its own
        node credential."""
        secret_file = self.workdir / "context.secret"

        def created() -> dict[str, Any] | None:
            secret_file.unlink(missing_ok=True)
            proc = subprocess.run([*EPU, "ctx", "create", "e2e", "--json", "--insecure", "--secret-file",
                                   str(secret_file), "-c", str(self.config)],
                                  env=self.env, cwd=self.workdir, capture_output=True, text=True, timeout=30)
            return json.loads(proc.stdout) if proc.returncode == 0 else None

        ctx = wait_for(created, 30, interval=0.3, message="context broker answering: context created")
        self.extra_env.update(EPU_WORKERS__ALPHA__CONTEXT_URI=ctx["uri"],
                              EPU_WORKERS__ALPHA__CONTEXT_SECRET_FILE=str(secret_file),
                              EPU_WORKERS__ALPHA__CONTEXT_CA_FILE=str(self.workdir / "epu-ctxbroker-tls" / "cert.pem"))
        return ctx

    def _kill_stray_workers(self) -> None:
        """Test hygiene only (after the assertions): never leave a slurmd behind."""
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                args = (pid_dir / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(str(self.workdir).encode() in a for a in args) and b"tests.e2e.worker" in b" ".join(args):
                try:
                    os.killpg(int(pid_dir.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    # ------------------------------------------------------------------ Slurm
    def submit(self, *args: str, wrap: str | None = None, script: Path | None = None,
               output: str = "/dev/null") -> str:
        argv = ["sbatch", "--parsable", "-o", output, "-e", output, f"--chdir={self.workdir}", *args]
        argv += [f"--wrap={wrap}"] if wrap is not None else [str(script)]
        return self.cluster.run(*argv).stdout.strip().split(";")[0]

    def job_states(self, ids: list[str]) -> dict[str, str]:
        out = self.cluster.run("squeue", "-h", "-t", "all", "-o", "%i %T", check=False).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return {i: states.get(i, "GONE") for i in ids}

    def slurm_nodes_in_service(self) -> list[str]:
        """Pool slots that are not back to powered-down (what the sensor would call a node)."""
        return sorted(n for n, s in self.cluster.node_states().items() if "POWERED_DOWN" not in s)

    def diagnostics(self) -> str:
        parts = [f"census: {dict(slurmd_census(self.cluster.conf_path))}",
                 f"slurm nodes: {self.cluster.node_states()}"]
        for log in sorted((self.workdir / "logs").glob("*.log")):
            parts.append(self.cluster.tail_file(log, 25))
        parts.append(self.cluster.tail("slurmctld", 25))
        return "\n".join(parts)
