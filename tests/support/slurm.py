"""A private, real Slurm cluster for tests: slurmctld + slurmd(s) (+ munged) in a temp dir.

Why a harness and not a system Slurm: tests must not depend on (or disturb) the machine's
configuration, must run in parallel, and must clean up. Everything lives under one temp dir —
slurm.conf, state, spool, logs, pid files and, when possible, a private munged with its own
key and socket — and every daemon listens on a free loopback port. Nothing sleeps and hopes:
each step waits on a condition (``scontrol ping`` answers, a node reports ``IDLE``) with a
timeout, and a failure message includes the daemon's log tail.

Used by the sensor's integration tests, by end-to-end tests, and by the provisioner's process
site, which starts extra slurmd workers as dynamic nodes (``start_slurmd(name, dynamic=True)``,
i.e. ``slurmd -Z``) or for nodes the sensor created (``scontrol create nodename=...``).

Requires slurm-wlm and munge (``scripts/ensure-slurm.sh`` installs them) and root (slurmd
runs jobs as their owner).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SBIN_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")


def find_exe(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN_DIRS:
        p = Path(d) / name
        if p.exists():
            return str(p)
    raise FileNotFoundError(f"{name} not found: run scripts/ensure-slurm.sh "
                            "(apt-get install -y slurm-wlm munge)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1,
               on_timeout: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}\n{extra}")
        time.sleep(interval)


@dataclass
class SlurmNodeSpec:
    name: str
    cpus: int = 2
    port: int = 0
    memory_mb: int = 1000
    state: str = ""  # e.g. "CLOUD" for a pre-declared cloud pool node
    features: tuple[str, ...] = ()  # Features= (what --constraint matches)
    gpus: int = 0  # Gres=gpu:N, with a gres.conf line that needs no device file


@dataclass
class SlurmPartitionSpec:
    """A partition beyond the default one (``SlurmTestCluster.partition`` over every node)."""

    name: str
    nodes: list[str]
    default: bool = False
    extra: str = ""  # e.g. "MaxTime=60"


@dataclass
class SlurmTestCluster:
    """Start with ``start()`` (or use as a context manager), stop with ``stop()``.

    ``nodes``: node specs declared in slurm.conf and started with their own slurmd.
    ``cloud_nodes``: declared with ``State=CLOUD`` and not started (a pre-declared pool).
    ``max_node_count``: room for dynamic nodes (``scontrol create`` / ``slurmd -Z``).
    """

    nodes: list[SlurmNodeSpec] = field(default_factory=lambda: [SlurmNodeSpec("node1")])
    cloud_nodes: list[SlurmNodeSpec] = field(default_factory=list)
    partition: str = "debug"
    partitions: list[SlurmPartitionSpec] = field(default_factory=list)
    """Partitions; when given, the default ``partition`` over all nodes is not written."""
    licenses: str = ""  # e.g. "matlab:1" — local licenses, no accounting database needed
    max_node_count: int = 64
    base_dir: Path | None = None
    startup_timeout: float = 60.0
    workdir: Path = field(init=False)
    ctld_port: int = field(init=False, default=0)
    slurmd_port: int = field(init=False, default=0)
    cluster_name: str = field(init=False, default="")
    _procs: dict[str, subprocess.Popen[bytes]] = field(init=False, default_factory=dict)
    _own_dir: bool = field(init=False, default=False)
    _munge_socket: str | None = field(init=False, default=None)

    # ------------------------------------------------------------------ paths
    @property
    def conf_path(self) -> Path:
        return self.workdir / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands talking to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    @property
    def client_env(self) -> dict[str, str]:
        """Only the variables that differ from the process environment."""
        return {"SLURM_CONF": str(self.conf_path)}

    def sensor_backend(self) -> Any:
        """EPU's Slurm backend reading this cluster (full node lists, no bitstring truncation)."""
        from epu.services.sensor.runner import CommandRunner
        from epu.services.sensor.slurm.backend import SlurmBackend

        return SlurmBackend(CommandRunner(timeout=30, env={**self.client_env, "SLURM_BITSTR_LEN": "0"}))

    def log_path(self, daemon: str) -> Path:
        return self.workdir / "log" / f"{daemon}.log"

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> SlurmTestCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> SlurmTestCluster:
        if os.geteuid() != 0:
            raise PermissionError("SlurmTestCluster needs root (slurmd runs jobs as their owner)")
        if self.base_dir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="epu-slurm-"))
            self._own_dir = True
        else:
            self.workdir = Path(self.base_dir)
            self.workdir.mkdir(parents=True, exist_ok=True)
        for sub in ("etc", "state", "spool", "log", "run", "munge"):
            (self.workdir / sub).mkdir(exist_ok=True)
        os.chmod(self.workdir, 0o755)
        self.cluster_name = f"epu{secrets.token_hex(3)}"
        self.ctld_port = free_port()
        self.slurmd_port = free_port()  # the global SlurmdPort: dynamic nodes listen there
        for node in self.nodes + self.cloud_nodes:
            if not node.port:
                node.port = free_port()
        try:
            self._start_munge()
            self.write_conf()
            self._start_ctld()
            if self.cloud_nodes:
                # Hold unused pool slots out of scheduling, so Slurm's own power saving never
                # powers them up for a pending job: EPU decides when a slot becomes a worker.
                self.run("scontrol", "update", f"NodeName={','.join(n.name for n in self.cloud_nodes)}",
                         "State=DRAIN", "Reason=epu pool slot")
            for node in self.nodes:
                self.start_slurmd(node.name)
            for node in self.nodes:
                self.wait_node_state(node.name, lambda s: "IDLE" in s and not ({"NOT_RESPONDING", "DOWN"} & set(s)),
                                     timeout=self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._cancel_jobs_before_stop()
        for name in sorted(self._procs, key=lambda n: (n == "munged", n == "slurmctld")):
            proc = self._procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in list(self._procs.items()):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            self._procs.pop(name, None)
        self._kill_leftover_steps()
        if self._own_dir and hasattr(self, "workdir"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _kill_leftover_steps(self) -> None:
        """A slurmstepd outlives its slurmd when the daemon dies under it (a test that kills
        slurmd, or a job the cancel above could not finish): find every process started for
        THIS cluster (its environment names our slurm.conf) and kill it, so no test leaves
        job steps running on the machine."""
        mine = f"SLURM_CONF={self.conf_path}".encode()
        for proc_dir in Path("/proc").iterdir():
            if not proc_dir.name.isdigit() or int(proc_dir.name) == os.getpid():
                continue
            try:
                environ = (proc_dir / "environ").read_bytes()
            except OSError:
                continue
            if mine in environ.split(b"\0"):
                with contextlib.suppress(OSError):
                    os.kill(int(proc_dir.name), signal.SIGKILL)

    def _cancel_jobs_before_stop(self) -> None:
        """Jobs still running when slurmd stops leave their slurmstepd behind: cancel them
        all and wait (bounded) until every node is done completing."""
        ctld = self._procs.get("slurmctld")
        if ctld is None or ctld.poll() is not None:
            return
        try:
            ids = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.split()
            if ids:
                self.run("scancel", *ids, check=False, timeout=10)
                wait_until(lambda: not self.run("squeue", "-h", "-t", "PD,CF,R,S,CG", "-o", "%i", check=False,
                                                timeout=10).stdout.strip(), 20, "jobs cancelled", interval=0.2)
        except (TimeoutError, subprocess.TimeoutExpired, FileNotFoundError):
            pass  # stopping anyway

    # ------------------------------------------------------------------ munge
    def _start_munge(self) -> None:
        """A private munged (own key and socket) so tests never depend on /etc/munge."""
        mdir = self.workdir / "munge"
        os.chmod(mdir, 0o700)
        key = mdir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o600)
        sock = str(mdir / "munge.socket")
        proc = subprocess.Popen(
            [find_exe("munged"), "-F", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={mdir / 'munged.pid'}", f"--log-file={self.log_path('munged')}",
             f"--seed-file={mdir / 'munged.seed'}", "--num-threads=2"],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path("munged.stderr"), "wb"))  # noqa: SIM115
        self._procs["munged"] = proc
        wait_until(lambda: Path(sock).exists() or proc.poll() is not None, 20, "munged socket",
                   on_timeout=lambda: self.tail("munged"))
        if proc.poll() is not None:
            raise RuntimeError(f"munged exited with {proc.returncode}:\n{self.tail('munged')}"
                               f"{self.tail('munged.stderr')}")
        self._munge_socket = sock

    # ------------------------------------------------------------------ config
    def node_line(self, node: SlurmNodeSpec) -> str:
        line = (f"NodeName={node.name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={node.port} "
                f"CPUs={node.cpus} RealMemory={node.memory_mb}")
        if node.features:
            line += f" Features={','.join(node.features)}"
        if node.gpus:
            line += f" Gres=gpu:{node.gpus}"
        if node.state:
            line += f" State={node.state}"
        return line

    #: Character devices every Linux machine has; a GPU's ``File=`` may name one of them.
    STAND_IN_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

    def gres_lines(self) -> list[str]:
        """gres.conf for GPU slots on a machine without GPUs. Slurm 22.05 drops a file-less GPU
        (``Name=gpu Count=2`` alone: slurmd logs "Removing file-less GPU gpu:(null) from final
        GRES list", registers 0 GPUs and the node goes INVALID_REG; ``Flags=CountOnly`` does
        not change that), and a ``File=`` that is a plain file is accepted with an error per
        file ("not a valid character or block device"). What works cleanly: ``AutoDetect=off``
        and ``File=`` naming one existing character device per GPU that is not a GPU
        (``/dev/null``, ``/dev/zero``... up to 5); with ``task/none`` nothing opens them. The
        GPUs are counted, and ``--gres=gpu:1`` jobs are allocated and run."""
        lines = ["AutoDetect=off"]
        for n in self.nodes + self.cloud_nodes:
            if n.gpus:
                if n.gpus > len(self.STAND_IN_DEVICES):
                    raise ValueError(f"at most {len(self.STAND_IN_DEVICES)} stand-in GPUs per node")
                files = ",".join(self.STAND_IN_DEVICES[: n.gpus])
                lines.append(f"NodeName={n.name} Name=gpu Count={n.gpus} File={files}")
        return lines

    def write_conf(self) -> None:
        w = self.workdir
        lines = [
            f"ClusterName={self.cluster_name}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self._munge_socket}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={w / 'state'}",
            f"SlurmdSpoolDir={w / 'spool'}/slurmd.%n",
            f"SlurmctldPidFile={w / 'run'}/slurmctld.pid",
            f"SlurmdPidFile={w / 'run'}/slurmd.%n.pid",
            f"SlurmctldLogFile={self.log_path('slurmctld')}",
            f"SlurmdLogFile={w / 'log'}/slurmd.%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "MailProg=/bin/true",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            "ReturnToService=2",
            f"MaxNodeCount={self.max_node_count}",
            "TreeWidth=65533",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "MessageTimeout=10",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=300",
            "ResumeTimeout=60",
            "SuspendTimeout=5",
            "SuspendTime=3600",
            f"SuspendExcNodes={','.join(n.name for n in self.nodes) or 'none'}",
            "ResumeProgram=/bin/true",
            "SuspendProgram=/bin/true",
            "SlurmctldParameters=cloud_reg_addrs",
            "PrivateData=cloud",
        ]
        all_nodes = self.nodes + self.cloud_nodes
        if any(n.gpus for n in all_nodes):
            lines.append("GresTypes=gpu")
            (self.conf_path.parent / "gres.conf").write_text("\n".join(self.gres_lines()) + "\n")
        if self.licenses:
            lines.append(f"Licenses={self.licenses}")
        lines += [self.node_line(n) for n in all_nodes]
        if self.partitions:
            lines += [f"PartitionName={p.name} Nodes={','.join(p.nodes)} Default={'YES' if p.default else 'NO'} "
                      f"MaxTime=INFINITE State=UP {p.extra}".rstrip() for p in self.partitions]
        else:
            lines.append(f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf_path.write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------ daemons
    def _start_ctld(self) -> None:
        proc = subprocess.Popen([find_exe("slurmctld"), "-D", "-i", "-f", str(self.conf_path)],
                                env=self.env, stdout=subprocess.DEVNULL,
                                stderr=open(self.log_path("slurmctld.stderr"), "wb"))  # noqa: SIM115
        self._procs["slurmctld"] = proc
        wait_until(lambda: proc.poll() is not None or self.ping(), self.startup_timeout, "slurmctld to answer",
                   interval=0.2, on_timeout=lambda: self.tail("slurmctld"))
        if proc.poll() is not None:
            raise RuntimeError(f"slurmctld exited with {proc.returncode}:\n{self.tail('slurmctld')}"
                               f"{self.tail('slurmctld.stderr')}")

    def start_slurmd(self, name: str, *, dynamic: bool = False, cpus: int = 2, port: int | None = None,
                     memory_mb: int = 1000) -> subprocess.Popen[bytes]:
        """Start a slurmd for ``name`` (a node of slurm.conf, e.g. a CLOUD pool slot).

        ``dynamic=True`` registers it as a dynamic node (``slurmd -Z --conf ...``) unknown to
        slurm.conf. Slurm 22.05 refuses ``Port=`` in ``--conf``: a dynamic slurmd listens on
        the global SlurmdPort, so only one dynamic node per host (``port`` is ignored)."""
        if f"slurmd.{name}" in self._procs and self._procs[f"slurmd.{name}"].poll() is None:
            return self._procs[f"slurmd.{name}"]
        (self.workdir / "spool" / f"slurmd.{name}").mkdir(parents=True, exist_ok=True)
        argv = [find_exe("slurmd"), "-D", "-N", name, "-f", str(self.conf_path)]
        if dynamic:
            argv += ["-Z", "--conf", f"CPUs={cpus} RealMemory={memory_mb}"]
        proc = subprocess.Popen(argv, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=open(self.log_path(f"slurmd.{name}.stderr"), "wb"))  # noqa: SIM115
        self._procs[f"slurmd.{name}"] = proc
        return proc

    def stop_slurmd(self, name: str, kill: bool = False) -> None:
        proc = self._procs.pop(f"slurmd.{name}", None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        proc.wait(timeout=15)

    def slurmd_running(self, name: str) -> bool:
        proc = self._procs.get(f"slurmd.{name}")
        return proc is not None and proc.poll() is None

    # ------------------------------------------------------------------ client commands
    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        exe = find_exe(argv[0])
        proc = subprocess.run([exe, *argv[1:]], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def ping(self) -> bool:
        try:
            proc = self.run("scontrol", "ping", check=False, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0 and "UP" in proc.stdout

    def sbatch(self, *args: str, wrap: str = "sleep 300") -> str:
        """Submit a batch job; returns its id."""
        out = self.run("sbatch", "--parsable", "-o", "/dev/null", "-e", "/dev/null",
                       f"--chdir={self.workdir}", *args, f"--wrap={wrap}").stdout.strip()
        return out.split(";")[0]

    def cancel_all(self) -> None:
        self.run("scancel", "--user=root", check=False)

    def node_states(self) -> dict[str, list[str]]:
        """Node name → state tokens (base + flags), from ``sinfo --json``."""
        doc = json.loads(self.run("sinfo", "--json").stdout)
        out: dict[str, list[str]] = {}
        for node in doc.get("nodes", []):
            state = node.get("state")
            tokens = [s.upper() for s in state] if isinstance(state, list) else [str(state).upper()]
            tokens += [f.upper() for f in node.get("state_flags", [])]
            out[node["name"]] = tokens
        return out

    def job_state(self, job_id: str) -> str:
        proc = self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
        return proc.stdout.strip() or "GONE"

    def wait_node_state(self, name: str, predicate: Callable[[list[str]], bool], timeout: float = 30) -> list[str]:
        return wait_until(lambda: (lambda s: s if s is not None and predicate(s) else None)(
            self.node_states().get(name)), timeout, f"node {name} state",
            interval=0.2, on_timeout=lambda: f"states: {self.node_states()}\n{self.tail('slurmctld')}"
                                             f"{self.tail_file(self.workdir / 'log' / f'slurmd.{name}.log')}")

    def wait_job_state(self, job_id: str, state: str, timeout: float = 30) -> str:
        return wait_until(lambda: self.job_state(job_id) == state and state, timeout, f"job {job_id} {state}",
                          interval=0.2, on_timeout=lambda: f"job is {self.job_state(job_id)}\n{self.tail('slurmctld')}")

    # ------------------------------------------------------------------ diagnostics
    def tail(self, daemon: str, lines: int = 30) -> str:
        return self.tail_file(self.log_path(daemon), lines)

    @staticmethod
    def tail_file(path: Path, lines: int = 30) -> str:
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"--- {path.name}\n" + "\n".join(text) + "\n"
