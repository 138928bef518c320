"""Capture real ``sacct --parsable2`` and ``sacct --json`` output from a private Slurm 22.05.

Run as root (once, by hand; the captures are committed under tests/simulate/data/):

    .venv/bin/python tests/simulate/capture_sacct.py tests/simulate/data

It starts the accounting test cluster of tests/support/slurm_accounting.py (a private MariaDB,
slurmdbd and the cluster of tests/support/slurm.py with accounting on), runs a few jobs of
different shapes (1 and 2 nodes, time limits, one failing, an array, and one cancelled before
its begin time, which ``sacct -S`` never lists), waits until slurmdbd has recorded every job in a
final state, and writes what sacct prints. Everything is stopped and removed after.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.slurm import SlurmNodeSpec, find_exe, wait_until  # noqa: E402
from tests.support.slurm_accounting import AccountingCluster  # noqa: E402

FIELDS = "JobID,JobName,User,Partition,Submit,Start,End,Elapsed,Timelimit,NNodes,NCPUS,ReqCPUS,State"
UNFINISHED = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "COMPLETING"}


def main(out: Path) -> None:
    with AccountingCluster(nodes=[SlurmNodeSpec("node1", cpus=2), SlurmNodeSpec("node2", cpus=2)]) as cluster:
        env = cluster.env

        def submit(*args: str) -> str:
            return cluster.sbatch(*args[:-1], wrap=args[-1])

        ids = [submit("-n1", "-t", "2", "sleep 2"),
               submit("-N2", "-n4", "-t", "1", "sleep 3"),
               submit("-n2", "-t", "5", "sleep 1"),
               submit("-n1", "false"),
               submit("-n1", "-t", "1", "--array=1-3", "sleep 1"),
               submit("-n1", "--begin=now+3600", "true")]
        cluster.run("scancel", ids[-1])
        # The array is 3 records; the job cancelled before its begin time is none: sacct -S
        # selects by eligible time, and it was never eligible in the window.
        expected = len(ids) + 2 - 1
        sacct = find_exe("sacct")

        def rows() -> list[str]:
            return subprocess.run([sacct, "-a", "-X", "-n", "-P", "-S", "now-1hour", "-o", "JobID,State"], env=env,
                                  capture_output=True, text=True).stdout.splitlines()

        def recorded() -> bool:
            """Every job (each array task) is in slurmdbd, in a final state: the records reach
            slurmdbd asynchronously after squeue forgets them."""
            states = [row.split("|")[1].split()[0] for row in rows() if "|" in row]
            return len(states) >= expected and not UNFINISHED & set(states)

        wait_until(recorded, 120, "every job finished and recorded by slurmdbd", interval=0.5,
                   on_timeout=lambda: "sacct: " + " ".join(rows()) + "\n" + cluster.accounting_logs())
        text = subprocess.run([sacct, "-a", "-X", "-P", "-S", "now-1hour", "-o", FIELDS], env=env,
                              capture_output=True, text=True, check=True).stdout
        js = subprocess.run([sacct, "-a", "-X", "--json", "-S", "now-1hour"], env=env,
                            capture_output=True, text=True, check=True).stdout
    out.mkdir(parents=True, exist_ok=True)
    (out / "sacct-parsable2.txt").write_text(text)
    (out / "sacct.json").write_text(js)
    print(text)

if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/simulate/data"))
