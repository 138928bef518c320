"""Capture real ``sacct --parsable2`` and ``sacct --json`` output from a private Slurm 22.05.

Run as root (once, by hand; the captures are committed under tests/simulate/data/):

    .venv/bin/python tests/simulate/capture_sacct.py tests/simulate/data

It starts a private MariaDB (own datadir, socket and loopback port), a private slurmdbd and the
test cluster of tests/support/slurm.py with accounting on, runs a few jobs of different shapes
(1 and 2 nodes, time limits, one cancelled while pending, one failing, one timing out, an
array), waits for them, and writes what sacct prints. Everything is stopped and removed after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.slurm import SlurmNodeSpec, SlurmTestCluster, find_exe, free_port, wait_until  # noqa: E402

FIELDS = "JobID,JobName,User,Partition,Submit,Start,End,Elapsed,Timelimit,NNodes,NCPUS,ReqCPUS,State"


class AccountingCluster(SlurmTestCluster):
    dbd_port: int = 0
    db_port: int = 0
    db_dir: Path | None = None

    def write_conf(self) -> None:
        super().write_conf()
        text = self.conf_path.read_text().replace(
            "AccountingStorageType=accounting_storage/none",
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={self.dbd_port}\nAccountingStoragePass={self._munge_socket}")
        self.conf_path.write_text(text)
        w = self.workdir
        dbd = w / "etc" / "slurmdbd.conf"
        dbd.write_text("\n".join([
            "DbdHost=localhost", f"DbdPort={self.dbd_port}", "SlurmUser=root", "AuthType=auth/munge",
            f"AuthInfo=socket={self._munge_socket}", f"PidFile={w / 'run'}/slurmdbd.pid",
            f"LogFile={w / 'log'}/slurmdbd.log", "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
            f"StoragePort={self.db_port}", "StorageUser=root", "StorageLoc=slurm_acct_db", ""]))
        os.chmod(dbd, 0o600)
        proc = subprocess.Popen([find_exe("slurmdbd"), "-D"], env=self.env,
                                stdout=subprocess.DEVNULL, stderr=open(w / "log" / "slurmdbd.stderr", "wb"))  # noqa: SIM115
        self._procs["slurmdbd"] = proc
        sacctmgr = shutil.which("sacctmgr") or "sacctmgr"
        wait_until(lambda: subprocess.run([sacctmgr, "-i", "add", "cluster", self.cluster_name], env=self.env,
                                          capture_output=True).returncode == 0, 20, "slurmdbd to answer",
                   interval=0.5, on_timeout=lambda: subprocess.run(
                       [sacctmgr, "-i", "add", "cluster", self.cluster_name], env=self.env, capture_output=True,
                       text=True).stderr + "".join(
                       f.read_text()[-2000:] for f in (w / "log").glob("slurmdbd*") if f.exists()))


def start_mariadb(base: Path, port: int) -> subprocess.Popen[bytes]:
    data = base / "db"
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root", "--auth-root-authentication-method=normal",
                    "--skip-test-db"], check=True, capture_output=True)
    proc = subprocess.Popen(["mariadbd", "--no-defaults", f"--datadir={data}", "--user=root", f"--port={port}",
                             "--bind-address=127.0.0.1", f"--socket={base}/mysql.sock", f"--pid-file={base}/my.pid",
                             "--skip-grant-tables", "--innodb-buffer-pool-size=64M"],
                            stdout=subprocess.DEVNULL, stderr=open(base / "mariadb.log", "wb"))  # noqa: SIM115
    wait_until(lambda: subprocess.run(["mariadb-admin", f"--socket={base}/mysql.sock", "ping"],
                                      capture_output=True).returncode == 0, 60, "mariadb to answer", interval=0.3)
    return proc


def main(out: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="epu-sacct-"))
    db = None
    cluster = AccountingCluster(nodes=[SlurmNodeSpec("node1", cpus=2), SlurmNodeSpec("node2", cpus=2)])
    cluster.db_port = free_port()
    cluster.dbd_port = free_port()
    try:
        db = start_mariadb(base, cluster.db_port)
        cluster.start()
        env = cluster.env
        sbatch = find_exe("sbatch")

        def submit(*args: str) -> str:
            r = subprocess.run([sbatch, "--parsable", "-o", "/dev/null", *args], env=env, capture_output=True, text=True, check=True)
            return r.stdout.strip().split(";")[0]

        ids = [submit("-n1", "-t", "2", "--wrap", "sleep 2"),
               submit("-N2", "-n4", "-t", "1", "--wrap", "sleep 3"),
               submit("-n2", "-t", "5", "--wrap", "sleep 1"),
               submit("-n1", "--wrap", "false"),
               submit("-n1", "-t", "1", "--array=1-3", "--wrap", "sleep 1"),
               submit("-n1", "--begin=now+3600", "--wrap", "true")]
        subprocess.run([find_exe("scancel"), ids[-1]], env=env, check=True)
        squeue = find_exe("squeue")
        wait_until(lambda: subprocess.run([squeue, "-h"], env=env, capture_output=True, text=True).stdout.strip() == "",
                   120, "the jobs to finish", interval=0.5)
        sacct = find_exe("sacct")
        time.sleep(2)  # the last records reach slurmdbd asynchronously; there is no condition to wait on
        text = subprocess.run([sacct, "-a", "-X", "-P", "-S", "now-1hour", "-o", FIELDS], env=env,
                              capture_output=True, text=True, check=True).stdout
        js = subprocess.run([sacct, "-a", "-X", "--json", "-S", "now-1hour"], env=env,
                            capture_output=True, text=True, check=True).stdout
        out.mkdir(parents=True, exist_ok=True)
        (out / "sacct-parsable2.txt").write_text(text)
        (out / "sacct.json").write_text(js)
        print(text)
    finally:
        cluster.stop()
        if db is not None:
            db.terminate()
            db.wait(30)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/simulate/data"))
