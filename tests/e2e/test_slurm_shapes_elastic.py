"""Jobs as shapes, end to end on real Slurm (issue 13): the right instance type per partition,
no node for jobs a node cannot start, and back to zero with those jobs still pending.

The cluster (deploy/examples/e2e-slurm-shapes.toml): CLOUD slots cpu[1-4] (partition ``cpu``),
big[1-2] (``bigmem``: RealMemory=8000, Features=bigmem) and gpu1 (``gpu``: Gres=gpu:1 on a
gres.conf without GPU devices), no worker at the start. The process site offers one type per
kind of slot (c2, m8, g1); the domain maps partitions to types and types to slots.

The jobs:

* demand — a whole-node (``-c 2 --mem=500``) job and a ``-N 2 -c 2`` srun job in ``cpu`` (three
  c2 workers, whatever node Slurm puts each on), a ``--mem=6000 --constraint=bigmem`` job in
  ``bigmem`` (one m8), a ``--gres=gpu:1`` job in ``gpu`` (one g1), all with ``--time``;
* not demand — a held job (``JobHeldUser``), and a job blocked by a limit: ``-L matlab:1``
  while a reservation holds the only ``matlab`` license (``Licenses``). QOS and association
  limits (``QOSMaxJobsPerUserLimit``...) need slurmdbd with a MySQL database, which this
  machine does not run; ``Licenses`` is a real limit reason of the same class (no new node
  lifts it) and, unlike ``--array=%1``, it stays blocked for the whole test. Slurm tests a
  job's nodes before its licenses, so while every slot is powered down it shows that job
  waiting for nodes; the sensor reads ``scontrol show licenses`` and reports it ``Licenses``
  (read by its reason alone, it would be demand and get a worker).

Every demand job is submitted held and released in one ``scontrol release``, so the first
snapshot that sees demand sees all of it. Checked: exactly {c2: 3, m8: 1, g1: 1} are launched
(the held and blocked jobs are whole-node ``cpu`` jobs too: counting either would launch cpu4),
each worker takes a slot of its type, each job runs on a node of its partition, all complete, and
the cluster goes back to zero workers with the held and blocked jobs still pending.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.testing import wait_for

from tests.e2e.harness import E2E, ROOT, SnapshotWatch, slurmd_census
from tests.support.slurm import SlurmNodeSpec, SlurmPartitionSpec

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.rabbitmq, pytest.mark.timeout(300)]

EXAMPLE = ROOT / "deploy" / "examples" / "e2e-slurm-shapes.toml"
POOL = [*(SlurmNodeSpec(f"cpu{i}", cpus=2, memory_mb=1000, state="CLOUD") for i in (1, 2, 3, 4)),
        *(SlurmNodeSpec(f"big{i}", cpus=2, memory_mb=8000, features=("bigmem",), state="CLOUD") for i in (1, 2)),
        SlurmNodeSpec("gpu1", cpus=2, memory_mb=2000, gpus=1, state="CLOUD")]
PARTITIONS = [SlurmPartitionSpec("cpu", ["cpu1", "cpu2", "cpu3", "cpu4"], default=True),
              SlurmPartitionSpec("bigmem", ["big1", "big2"]),
              SlurmPartitionSpec("gpu", ["gpu1"])]
SLOT_TYPE = {"cpu": "c2", "big": "m8", "gpu": "g1"}
"""Slot name prefix → the instance type whose workers take those slots."""
RUN = "echo node=$SLURMD_NODENAME; sleep 6"


def reasons(run: E2E, ids: list[str]) -> dict[str, str]:
    out = run.cluster.run("squeue", "-h", "-t", "all", "-o", "%i %T %r", check=False).stdout
    rows = {f[0]: f"{f[1]} {f[2]}" for f in (line.split(None, 2) for line in out.splitlines()) if len(f) == 3}
    return {i: rows.get(i, "GONE") for i in ids}


def test_each_partition_gets_its_type_and_blocked_jobs_hold_no_node(broker: Broker, tmp_path: Path) -> None:
    started = time.monotonic()
    watch = SnapshotWatch(broker)
    with E2E(tmp_path / "run", broker.url, broker.topology.prefix, example=EXAMPLE, pool=POOL,
             partitions=PARTITIONS, licenses="matlab:1") as run:
        try:
            # not demand, and known as such before the engine starts: a held job, and a job
            # whose only license a reservation holds (Reason=Licenses for good)
            run.cluster.run("scontrol", "create", "reservation", "ReservationName=epu-lic", "Licenses=matlab:1",
                            "StartTime=now", "Duration=UNLIMITED", "Users=root", "Flags=LICENSE_ONLY")
            held = run.submit("-p", "cpu", "-c", "2", "--time=5", "--hold", wrap="true")
            blocked = run.submit("-p", "cpu", "-c", "2", "--time=5", "-L", "matlab:1", wrap="true")
            # Slurm tests nodes before licenses: with every slot powered down it shows the blocked
            # job waiting for nodes ("Nodes required for job are DOWN, DRAINED..."); the sensor
            # reads the licenses (none free) and reports it limit-blocked all the same
            wait_for(lambda: reasons(run, [held, blocked])[held] == "PENDING JobHeldUser"
                     and reasons(run, [blocked])[blocked] not in ("PENDING None", "GONE"),
                     30, interval=0.3, message="the held and license-blocked jobs evaluated by the scheduler")

            out = tmp_path / "results"
            out.mkdir()
            run.start_services()
            run.start_tap(out)
            seen = watch.count()
            wait_for(lambda: watch.count() > seen + 2, 30, interval=0.1, message="the sensor reporting")
            snap = watch.snapshots[-1]
            assert {(s.reason, s.demand) for s in snap.shapes} == {("JobHeldUser", False), ("Licenses", False)}
            assert not slurmd_census(run.cluster.conf_path), "nothing launched for the held and blocked jobs"

            logs = run.workdir / "job-out"
            logs.mkdir()
            jobs = {
                "cpu": run.submit("-p", "cpu", "-c", "2", "--mem=500", "--time=5", "--hold", wrap=RUN,
                                  output=str(logs / "cpu")),
                "wide": run.submit("-p", "cpu", "-N", "2", "--ntasks-per-node=1", "-c", "2", "--mem=500", "--time=5",
                                   "--hold", wrap="srun -N 2 --ntasks-per-node=1 printenv SLURMD_NODENAME; sleep 6",
                                   output=str(logs / "wide")),
                "bigmem": run.submit("-p", "bigmem", "--mem=6000", "--constraint=bigmem", "-c", "1", "--time=10",
                                     "--hold", wrap=RUN, output=str(logs / "bigmem")),
                "gpu": run.submit("-p", "gpu", "--gres=gpu:1", "-c", "1", "--time=5", "--hold", wrap=RUN,
                                  output=str(logs / "gpu")),
            }
            ids = list(jobs.values())
            run.cluster.run("scontrol", "release", ",".join(ids))

            wait_for(lambda: set(run.job_states(ids).values()) <= {"COMPLETED"}, 150, interval=0.5,
                     message="every demand job completed")
            wait_for(lambda: not slurmd_census(run.cluster.conf_path) and not run.slurm_nodes_in_service(),
                     90, interval=0.5, message="the workers drained, removed and terminated")
            still = reasons(run, [held, blocked])
            run.stop("tap", signal.SIGINT)
        finally:
            watch.stop()
        duplicates = run.census.duplicates()

    assert still[held] == "PENDING JobHeldUser" and still[blocked].startswith("PENDING "), \
        f"back to zero with the held and blocked jobs still pending: {still}"
    assert not duplicates

    events = [json.loads(line) for line in (out / "tap.jsonl").read_text().splitlines() if line.strip()]
    lives: dict[str, dict] = {}
    for e in events:
        if e["routing_key"].startswith("instance.state."):
            b = e["body"]
            life = lives.setdefault(b["instance_id"], {"type": b.get("instance_type", ""), "node": "", "states": []})
            life["node"] = b.get("node_name") or life["node"]
            life["states"].append(b["state"])
    assert Counter(life["type"] for life in lives.values()) == Counter({"c2": 3, "m8": 1, "g1": 1}), lives
    for life in lives.values():
        assert SLOT_TYPE[life["node"].rstrip("0123456789")] == life["type"], f"a worker took its type's slot: {life}"
        assert life["states"][-1] == "terminated", life

    ran_on = {name: (logs / name).read_text() for name in jobs}
    assert "node=cpu" in ran_on["cpu"], ran_on
    assert "node=big" in ran_on["bigmem"], ran_on
    assert "node=gpu1" in ran_on["gpu"], ran_on
    wide_nodes = {line.strip() for line in ran_on["wide"].splitlines() if line.strip()}
    assert len(wide_nodes) == 2 and all(n.startswith("cpu") for n in wide_nodes), ran_on
    assert time.monotonic() - started < 240
