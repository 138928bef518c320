"""A private Slurm cluster WITH accounting: MariaDB + slurmdbd + the test cluster of slurm.py.

Why: QOS and association limits (``QOSMaxJobsPerUserLimit``, ``AssocGrpCpuLimit``...) exist
only when slurmctld talks to a slurmdbd, and slurmdbd needs a MySQL/MariaDB database. Tests must
not use (or disturb) a system database, so everything is private, like the rest of the harness:
a MariaDB with its own datadir, socket and free loopback port (no grant tables: only this
process's children can reach it), a slurmdbd on its own free port that authenticates with the
cluster's private munged, and slurm.conf pointing at it. All of it lives in the cluster's temp
dir and is stopped and removed by ``stop()``.

Accounting objects (accounts, users, QOS, limits) are given as ``sacctmgr`` commands in
``accounting`` and run **before** slurmctld starts, so slurmctld loads them at start-up: no
waiting for slurmdbd to push an update. ``sacctmgr()`` is there for changes afterwards.

Used by the sensor's QOS/association test (tests/sensor/slurm/test_slurm_limits_integration.py)
and by tests/simulate/capture_sacct.py. Requires slurmdbd and mariadb-server besides what
slurm.py needs (``scripts/ensure-slurm.sh`` installs them when root).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.slurm import SlurmTestCluster, find_exe, free_port, wait_until


def find_db_exe(name: str) -> str:
    try:
        return find_exe(name)
    except FileNotFoundError:
        raise FileNotFoundError(f"{name} not found: run scripts/ensure-slurm.sh "
                                "(apt-get install -y slurmdbd mariadb-server)") from None


@dataclass
class AccountingCluster(SlurmTestCluster):
    """``SlurmTestCluster`` plus a private MariaDB and slurmdbd.

    ``accounting``: ``sacctmgr`` argument lists run (with ``-i``) after the cluster is added
    to the database and before slurmctld starts, e.g. ``["add", "qos", "lim1", "MaxJobsPerUser=1"]``.
    ``enforce``: ``AccountingStorageEnforce=`` (e.g. ``"limits,qos"``); empty: not enforced.
    """

    accounting: list[list[str]] = field(default_factory=list)
    enforce: str = ""
    db_port: int = field(init=False, default=0)
    dbd_port: int = field(init=False, default=0)

    @property
    def db_dir(self) -> Path:
        return self.workdir / "db"

    @property
    def db_socket(self) -> Path:
        return self.workdir / "run" / "mysql.sock"

    # ------------------------------------------------------------------ config
    def write_conf(self) -> None:
        super().write_conf()
        self.db_port = free_port()
        self.dbd_port = free_port()
        accounting = [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            f"AccountingStoragePort={self.dbd_port}",
            # For accounting_storage/slurmdbd this names the munge socket to authenticate with.
            f"AccountingStoragePass={self._munge_socket}",
        ]
        if self.enforce:
            accounting.append(f"AccountingStorageEnforce={self.enforce}")
        text = self.conf_path.read_text()
        if "AccountingStorageType=accounting_storage/none" not in text:
            raise RuntimeError("slurm.conf has no AccountingStorageType=accounting_storage/none to replace")
        self.conf_path.write_text(text.replace("AccountingStorageType=accounting_storage/none", "\n".join(accounting)))
        w = self.workdir
        dbd = w / "etc" / "slurmdbd.conf"
        dbd.write_text("\n".join([
            "DbdHost=localhost", f"DbdPort={self.dbd_port}", "SlurmUser=root", "AuthType=auth/munge",
            f"AuthInfo=socket={self._munge_socket}", f"PidFile={w / 'run'}/slurmdbd.pid",
            f"LogFile={self.log_path('slurmdbd')}", "DebugLevel=info",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
            f"StoragePort={self.db_port}", "StorageUser=root", "StorageLoc=slurm_acct_db", ""]))
        dbd.chmod(0o600)  # slurmdbd refuses a readable config

    # ------------------------------------------------------------------ daemons
    def _start_ctld(self) -> None:
        """MariaDB, then slurmdbd, then the accounting objects, then slurmctld itself."""
        self._start_mariadb()
        self._start_slurmdbd()
        for argv in self.accounting:
            self.sacctmgr(*argv)
        super()._start_ctld()

    def _start_mariadb(self) -> None:
        install = subprocess.run(
            [find_db_exe("mariadb-install-db"), "--no-defaults", f"--datadir={self.db_dir}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, text=True, timeout=120)
        if install.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed ({install.returncode}):\n{install.stdout[-2000:]}"
                               f"{install.stderr[-2000:]}")
        proc = subprocess.Popen(
            [find_db_exe("mariadbd"), "--no-defaults", f"--datadir={self.db_dir}", "--user=root",
             f"--port={self.db_port}", "--bind-address=127.0.0.1", f"--socket={self.db_socket}",
             f"--pid-file={self.workdir / 'run'}/mariadb.pid", "--skip-grant-tables",
             "--innodb-buffer-pool-size=32M", "--skip-log-bin", f"--log-error={self.log_path('mariadb')}"],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path("mariadb.stderr"), "wb"))  # noqa: SIM115
        self._procs["mariadb"] = proc
        admin = find_db_exe("mariadb-admin")
        wait_until(lambda: proc.poll() is not None or subprocess.run(
            [admin, "--no-defaults", f"--socket={self.db_socket}", "ping"], capture_output=True, timeout=10
        ).returncode == 0, 60, "mariadb to answer", interval=0.2, on_timeout=self.accounting_logs)
        if proc.poll() is not None:
            raise RuntimeError(f"mariadbd exited with {proc.returncode}:\n{self.accounting_logs()}")

    def _start_slurmdbd(self) -> None:
        # slurmdbd has no -f: it reads slurmdbd.conf beside $SLURM_CONF (self.env).
        proc = subprocess.Popen([find_db_exe("slurmdbd"), "-D"],
                                env=self.env, stdout=subprocess.DEVNULL,
                                stderr=open(self.log_path("slurmdbd.stderr"), "wb"))  # noqa: SIM115
        self._procs["slurmdbd"] = proc

        # slurmdbd answers once it has created its tables; adding the cluster is the first
        # thing that needs it, and is the condition waited on.
        def added() -> bool:
            if proc.poll() is not None:
                return True
            try:
                out = self.sacctmgr("add", "cluster", self.cluster_name, check=False)
            except subprocess.TimeoutExpired:
                return False  # slurmdbd not listening yet, or still creating its tables
            # "already exists": an earlier attempt reached slurmdbd after its client gave up
            return out.returncode == 0 or "already exists" in out.stdout + out.stderr

        wait_until(added, 60, "slurmdbd to answer (sacctmgr add cluster)", interval=0.3, on_timeout=self.accounting_logs)
        if proc.poll() is not None:
            raise RuntimeError(f"slurmdbd exited with {proc.returncode}:\n{self.accounting_logs()}")

    def stop(self) -> None:
        """The Slurm daemons and slurmdbd first (the parent's stop), then MariaDB, so slurmdbd
        never loses its database while it is still writing; the temp dir (with the datadir) is
        removed only after MariaDB has stopped."""
        db = self._procs.pop("mariadb", None)
        try:
            self._stop_slurm()
        finally:
            if db is not None and db.poll() is None:
                db.send_signal(signal.SIGTERM)
                try:
                    db.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    db.kill()
                    db.wait(timeout=5)
            if self._own_dir and hasattr(self, "workdir"):
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_slurm(self) -> None:
        own, self._own_dir = self._own_dir, False  # keep the dir until MariaDB has stopped
        try:
            super().stop()
        finally:
            self._own_dir = own

    # ------------------------------------------------------------------ client commands
    def sacctmgr(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``sacctmgr -i ARGV`` against this cluster's slurmdbd."""
        proc = subprocess.run([find_exe("sacctmgr"), "-i", *argv], env=self.env, capture_output=True, text=True,
                              timeout=30)
        if check and proc.returncode != 0:
            raise RuntimeError(f"sacctmgr {' '.join(argv)} failed ({proc.returncode}): "
                               f"{proc.stdout.strip()} {proc.stderr.strip()}\n{self.accounting_logs()}")
        return proc

    # ------------------------------------------------------------------ diagnostics
    def accounting_logs(self) -> str:
        """The tails of the MariaDB and slurmdbd logs, for failure messages."""
        out = ""
        for name in ("mariadb", "mariadb.stderr", "slurmdbd", "slurmdbd.stderr"):
            with contextlib.suppress(Exception):
                out += self.tail(name, 20)
        return out
