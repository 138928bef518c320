"""The end-to-end harness in native mode (issue 35): Slurm's own power saving in front of EPU.

What differs from ``harness.E2E``: slurm.conf's CLOUD nodes, partitions and power-saving
parameters are not the harness's: they are what ``epu slurm conf`` writes from the example
config (deploy/examples/e2e-slurm-native.toml), ``Include``d by a slurm.conf that keeps only the
cluster's own lines (name, ports, auth, paths). No slot is drained: Slurm powers nodes up for its
pending jobs and runs the written ``ResumeProgram`` (``epu slurm resume -c CONFIG HOSTLIST``),
and EPU's process site starts each resumed node's slurmd under that node's name. Every node gets
its own slurmd port (``epu slurm conf --ports FIRST``: several slurmd on one host).

``NodeWatch`` samples Slurm's node states through the run, so a test can say that no node was
ever DOWN (a node Slurm gave up on), not only that none is at the end.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from epu.common.config import load_config

from epu.slurm_conf import node_sets
from tests.e2e.harness import E2E, EPU, ROOT, Census, ElasticSlurm, render_config
from tests.support.slurm import SlurmTestCluster, free_port

NATIVE_EXAMPLE = ROOT / "deploy" / "examples" / "e2e-slurm-native.toml"
FRAGMENT_KEYS = ("ResumeTimeout", "SuspendTimeout", "SuspendTime", "ResumeProgram", "SuspendProgram",
                 "SlurmctldParameters", "PrivateData", "TreeWidth", "PartitionName", "SuspendExcNodes", "GresTypes",
                 "ResumeRate", "SuspendRate")
"""slurm.conf keys the fragment sets: the harness's own lines for them are left out."""


def free_port_block(n: int, tries: int = 200) -> int:
    """The first of ``n`` consecutive loopback ports free now (each bound once to check)."""
    for _ in range(tries):
        first = random.randint(20000, 60000 - n)
        socks = []
        try:
            for p in range(first, first + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


class NativeSlurm(ElasticSlurm):
    """The harness's cluster (short timeouts, private munge) whose nodes, partitions and power
    saving come from ``fragment``; ``cloud_nodes`` stays empty, so nothing is drained."""

    fragment: Path

    def write_conf(self) -> None:
        super().write_conf()
        kept = [line for line in self.conf_path.read_text().splitlines() if not line.startswith(FRAGMENT_KEYS)]
        self.conf_path.write_text("\n".join([*kept, f"Include {self.fragment}"]) + "\n")


@dataclass
class NativeE2E(E2E):
    """One native-mode run (``E2E`` with the cluster from ``epu slurm conf``)."""

    example: Path = NATIVE_EXAMPLE
    suspend_timeout: int = 15
    """SuspendTimeout: how long Slurm shows a suspended node POWERING_DOWN before it may be resumed
    again (the default 120 s would only slow the test)."""
    boot_seconds: float = 10.0
    node_names: list[str] = field(default_factory=list)
    fragment_text: str = ""

    def __enter__(self) -> NativeE2E:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        # the cluster's own short temp dir (slurmstepd's socket paths must stay under 108 bytes),
        # known before it starts: the rendered config names its slurm.conf
        self._slurm_dir = Path(tempfile.mkdtemp(prefix="epu-native-"))
        conf_path = self._slurm_dir / "etc" / "slurm.conf"
        self.config = render_config(self.workdir, self.broker_url, self.prefix, free_port(), self.example,
                                    **{"/tmp/epu-e2e/slurm/etc/slurm.conf": str(conf_path), **self.replace})
        cfg = load_config(self.config)
        domain = next(iter(cfg.domains))
        self.node_names = [n for s in node_sets(cfg, domain) for n in s.names]
        (self._slurm_dir / "etc").mkdir(parents=True)
        fragment = self._slurm_dir / "etc" / "epu-native.conf"
        proc = subprocess.run([*EPU, "slurm", "conf", "-c", str(self.config), "-o", str(fragment), "--programs-dir",
                               str(self.workdir / "bin"), "--no-measure", "--boot-seconds", str(self.boot_seconds),
                               "--suspend-timeout", str(self.suspend_timeout), "--node-addr", "127.0.0.1", "--ports",
                               str(free_port_block(len(self.node_names)))],
                              env=self.env_without_slurm, cwd=self.workdir, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"epu slurm conf failed: {proc.stderr}")
        self.fragment_text = fragment.read_text()
        self.cluster = NativeSlurm(nodes=[], cloud_nodes=[], base_dir=self._slurm_dir)
        self.cluster.fragment = fragment
        try:
            self.cluster.start()
        except BaseException:
            shutil.rmtree(self._slurm_dir, ignore_errors=True)
            raise
        for name in self.node_names:  # what the slurmd of a declared node expects to find
            (self.cluster.workdir / "spool" / f"slurmd.{name}").mkdir(parents=True, exist_ok=True)
        self.census = Census(self.cluster.conf_path).start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            super().__exit__(exc_type, *exc)
        finally:
            shutil.rmtree(self._slurm_dir, ignore_errors=True)

    @property
    def env_without_slurm(self) -> dict[str, str]:
        import os

        return {**os.environ, "PYTHONPATH": str(ROOT), **self.extra_env}

    def node_types(self) -> dict[str, str]:
        """Node name → the instance type of its node set (what ``epu slurm conf`` declared)."""
        cfg = load_config(self.config)
        return {n: s.type for s in node_sets(cfg, next(iter(cfg.domains))) for n in s.names}


class NodeWatch:
    """Samples ``sinfo --json`` node states in a thread: every state each node was ever seen in."""

    def __init__(self, cluster: SlurmTestCluster, interval: float = 0.3) -> None:
        self.cluster = cluster
        self.interval = interval
        self.seen: dict[str, set[str]] = {}
        self.first: dict[tuple[str, str], float] = {}
        """(node, state token) → when it was first seen in that state (wall clock)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-watch", daemon=True)

    def start(self) -> NodeWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                now = time.time()
                for name, tokens in self.cluster.node_states().items():
                    self.seen.setdefault(name, set()).update(tokens)
                    for token in tokens:
                        self.first.setdefault((name, token), now)
                    if not {"POWERING_UP", "POWERED_DOWN", "POWERING_DOWN"} & set(tokens):
                        self.first.setdefault((name, "UP"), now)
            except Exception:  # a sample lost to a busy slurmctld is only a sample
                pass
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def ever(self, token: str) -> list[str]:
        return sorted(n for n, s in self.seen.items() if token in s)
