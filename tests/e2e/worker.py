"""One elastic worker on this machine: a ``slurmd`` plus a context agent, as one instance.

Why: the process site starts one argv per instance, and a real worker VM runs two things —
the batch daemon and the context agent that keeps the node's view of the cluster (its MPI
hostfile, /etc/hosts, known hosts) current. This launcher is that VM's "boot": it starts the
agent (which joins the context) and slurmd, both as children in the process site's process
group, and lives exactly as long as slurmd. On SIGTERM (the process site's destroy) it stops
both; the agent leaves the context on the way out, so every other worker's hostfile shrinks.

Usage (what the site's ``argv`` template says)::

    python -m tests.e2e.worker --name {node_name} --ctx-env FILE --scripts DIR --root DIR/{node_name}
        --state DIR -- /usr/sbin/slurmd -D -N {node_name} -f slurm.conf

Nothing goes through a shell.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path


def agent_config(args: argparse.Namespace) -> Path:
    """The agent's local settings. A real VM registers its own SSH host key; these workers
    share one host, so each gets a stand-in key naming it (what ssh_known_hosts will list)."""
    kind = b"ssh-ed25519"
    blob = struct.pack(">I", len(kind)) + kind + struct.pack(">I", 32) + hashlib.sha256(args.name.encode()).digest()
    fake_key = base64.b64encode(blob).decode()
    path = Path(args.state) / "agent.toml"
    path.write_text(f'ssh_host_key = "ssh-ed25519 {fake_key} root@{args.name}"\n'
                    f'data = "slots={args.slots}"\n')
    return path


def agent_argv(args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "epu.services.ctxbroker.agent.main", "--config", str(agent_config(args)),
            "--userdata", args.ctx_env,
            "--scripts-dir", args.scripts, "--state-dir", args.state, "--root", args.root, "--insecure",
            "--hostname", args.name, "--ip", args.ip, "--log-level", "warning"]


def _powered_up(name: str) -> bool:
    """Slurm has taken the slot out of power saving (EPU's ``add`` did ``POWER_UP``)."""
    try:
        out = subprocess.run(["scontrol", "show", "node", name, "-o"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    state = next((f.split("=", 1)[1] for f in out.split() if f.startswith("State=")), "")
    return bool(state) and "POWERED_DOWN" not in state and "POWERING_DOWN" not in state


def _claim(marker: Path, name: str) -> bool:
    """True for exactly one caller: the one that creates ``marker`` (O_EXCL)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.write(fd, f"{name}\n".encode())
    os.close(fd)
    return True


def fresh_boot(daemon: list[str]) -> list[str]:
    """``daemon`` run by ``unshare`` in a new time namespace whose CLOCK_BOOTTIME starts near 0 (the
    uptime slurmd reports, so its boot time is now); the daemon gets SIGTERM if unshare dies."""
    uptime = int(float(Path("/proc/uptime").read_text().split()[0]))
    return [shutil.which("unshare") or "/usr/bin/unshare", "--time", "--boottime", str(-uptime), "--fork",
            "--kill-child=SIGTERM", *daemon]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="epu-e2e-worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="the node name (EPU's, and Slurm's)")
    p.add_argument("--ctx-env", required=True, help="EPU_CTX_URI/KEY/SECRET lines (the userdata)")
    p.add_argument("--scripts", required=True, help="context scripts (deploy/ctx-scripts)")
    p.add_argument("--root", required=True, help="prefix the scripts write under (etc/epu/mpi_hostfile, ...)")
    p.add_argument("--state", required=True, help="the agent's state directory")
    p.add_argument("--ip", default="127.0.0.1")
    p.add_argument("--slots", type=int, default=2, help="MPI slots this node offers (its cores)")
    p.add_argument("--wait-power-up", action="store_true",
                   help="start the daemons only once Slurm powers the slot up (after EPU's add)")
    p.add_argument("--stall-once", metavar="FILE",
                   help="fault injection: the first worker to create FILE boots but never starts its daemons "
                        "(a VM that never joins), until it is terminated")
    p.add_argument("--fresh-boot", action="store_true",
                   help="start the daemon in a time namespace of its own whose boot time is now, as on a VM that "
                        "just booted: slurmctld accepts a powering-up node's registration only from a node that "
                        "booted after the resume request (node_mgr.c, waiting_for_node_boot)")
    p.add_argument("daemon", nargs=argparse.REMAINDER, help="-- then the batch daemon's argv")
    args = p.parse_args(argv)
    daemon = args.daemon[1:] if args.daemon[:1] == ["--"] else args.daemon
    if not daemon:
        p.error("give the batch daemon's argv after --")
    for d in (args.root, args.state):
        Path(d).mkdir(parents=True, exist_ok=True)

    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if args.stall_once and _claim(Path(args.stall_once), args.name):
        while not stopping:
            time.sleep(0.1)
        return 0
    while args.wait_power_up and not stopping and not _powered_up(args.name):
        time.sleep(0.2)
    if stopping:
        return 0
    if args.fresh_boot:
        # slurmctld counts in whole seconds: a boot a second after the resume call reads as after it
        time.sleep(1.0)
        daemon = fresh_boot(daemon)
    agent = subprocess.Popen(agent_argv(args), stdin=subprocess.DEVNULL)
    slurmd = subprocess.Popen(daemon, stdin=subprocess.DEVNULL)
    try:
        while not stopping and slurmd.poll() is None:
            time.sleep(0.1)
    finally:
        for child in (slurmd, agent):
            if child.poll() is None:
                child.terminate()
        for child in (slurmd, agent):
            try:
                child.wait(timeout=8)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    # slurmd gone by itself (not by our SIGTERM) is a worker failure: say so with the exit code
    return 0 if stopping else (slurmd.returncode or 1)


if __name__ == "__main__":
    sys.exit(main())
