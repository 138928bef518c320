"""Sensor benchmark: parse + normalize 10,000 nodes and 100,000 jobs in each native format.

Run: ``.venv/bin/python bench/bench_sensor.py [--nodes 10000] [--jobs 100000]``

For each batch system the native text is generated first (Torque ``qstat -f -x`` and
``pbsnodes -x`` XML, Slurm 22.05 ``squeue --json``/``sinfo --json``, HTCondor job and startd
ads as old-ClassAd text), then two ways of turning it into the normalized model are timed
and their peak Python memory measured (tracemalloc, in a second run so tracing does not skew
the time), side by side in one process:

* torque   — ours: ``iterparse`` streaming, each element cleared after use;
             baseline: ``ElementTree.fromstring`` (whole DOM), then the same normalization.
* slurm    — ours: ``json.loads`` then direct dict access;
             baseline: ``json.loads`` then validating every record into pydantic models first.
* htcondor — ours: ads with the projection the backend asks the schedd/collector for;
             baseline: full ads (no projection); both parsed ad by ad with ``classad2.parseOne``.
             (classad2 allocates in C++: tracemalloc sees only the Python side.)
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import sys
import time
import tracemalloc
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel, ConfigDict  # noqa: E402

from services.sensor.htcondor.parse import normalize_jobs as condor_jobs  # noqa: E402
from services.sensor.htcondor.parse import normalize_startds  # noqa: E402
from services.sensor.slurm.parse import node_records, normalize_nodes, parse_squeue  # noqa: E402
from services.sensor.torque import parse as tparse  # noqa: E402

NOW = 1_800_000_000.0


# ------------------------------------------------------------------ generators
def torque_qstat(n: int) -> bytes:
    rng = random.Random(42)
    parts = ['<?xml version="1.0"?>\n<Data>']
    states = ["Q"] * 6 + ["R"] * 3 + ["H"]
    for i in range(n):
        st = states[i % len(states)]
        spec = rng.choice(["1", "1:ppn=2", "2:ppn=4", "4:ppn=8"])
        parts.append(
            f"<Job><Job_Id>{i}.head</Job_Id><Job_Name>job{i}</Job_Name><Job_Owner>alice@head</Job_Owner>"
            f"<job_state>{st}</job_state><queue>batch</queue><server>head</server><ctime>{int(NOW) - i}</ctime>"
            f"<Hold_Types>{'u' if st == 'H' else 'n'}</Hold_Types><qtime>{int(NOW) - i}</qtime>"
            f"<Resource_List><nodes>{spec}</nodes><nodect>1</nodect><walltime>01:00:00</walltime>"
            f"<mem>2gb</mem></Resource_List><substate>10</substate>"
            f"<Variable_List>PBS_O_QUEUE=batch,PBS_O_HOME=/home/alice,PBS_O_LOGNAME=alice,PBS_O_PATH=/usr/bin:/bin,"
            f"PBS_O_SHELL=/bin/bash,PBS_O_WORKDIR=/home/alice/jobs,PBS_O_HOST=head</Variable_List>"
            f"<euser>alice</euser><egroup>alice</egroup><queue_rank>{i}</queue_rank><queue_type>E</queue_type>"
            f"<submit_args>-l nodes={spec}</submit_args></Job>")
    parts.append("</Data>")
    return "".join(parts).encode()


def torque_pbsnodes(n: int) -> bytes:
    states = ["free", "job-exclusive", "offline", "down", "down,offline", "offline,job-exclusive"]
    parts = ["<Data>"]
    for i in range(n):
        st = states[i % len(states)]
        jobs = f"<jobs>0-3/{i}.head,4-7/{i + n}.head</jobs>" if "job" in st else ""
        parts.append(f"<Node><name>node{i:05d}</name><state>{st}</state><power_state>Running</power_state>"
                     f"<np>8</np><ntype>cluster</ntype>{jobs}<status>opsys=linux,uname=Linux node{i:05d},"
                     f"sessions=0,nsessions=0,nusers=0,idletime=1000,totmem=65000000kb,availmem=60000000kb,"
                     f"physmem=65000000kb,ncpus=8,loadave=0.00,state=free,rectime={int(NOW)}</status>"
                     f"<mom_service_port>15002</mom_service_port><mom_manager_port>15003</mom_manager_port></Node>")
    parts.append("</Data>")
    return "".join(parts).encode()


def slurm_squeue(n: int) -> bytes:
    rng = random.Random(42)
    jobs = []
    for i in range(n):
        state = "PENDING" if i % 10 < 7 else "RUNNING"
        reason = rng.choice(["Resources", "Priority", "Dependency", "JobHeldUser"]) if state == "PENDING" else "None"
        jobs.append({
            "account": "", "job_id": i + 1, "job_state": state, "state_reason": reason, "partition": "batch",
            "node_count": rng.choice([1, 1, 2]), "cpus": rng.choice([1, 2, 8]), "tasks": 1,
            "minimum_cpus_per_node": 1, "memory_per_node": None, "memory_per_cpu": None,
            "submit_time": int(NOW) - i, "start_time": 0, "nodes": f"node{i % 10000:05d}" if state == "RUNNING" else "",
            "array_job_id": 0, "array_task_id": None, "array_task_string": "", "priority": 4294901759 - i,
            "user_name": "alice", "name": f"job{i}", "time_limit": 60, "command": "/home/alice/job.sh",
            "current_working_directory": "/home/alice", "standard_output": "/home/alice/slurm-%j.out",
            "flags": ["JOB_WAS_RUNNING"], "qos": "normal", "cluster": "epu",
        })
    return json.dumps({"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "jobs": jobs}).encode()


def slurm_sinfo(n: int) -> bytes:
    states = [("idle", []), ("mixed", []), ("allocated", []), ("idle", ["DRAIN"]), ("down", ["NOT_RESPONDING"]),
              ("idle", ["CLOUD", "POWERED_DOWN"])]
    nodes = []
    for i in range(n):
        st, flags = states[i % len(states)]
        nodes.append({"name": f"node{i:05d}", "hostname": f"node{i:05d}", "address": f"10.0.{i // 256}.{i % 256}",
                      "state": st, "state_flags": flags, "cpus": 8, "alloc_cpus": {"mixed": 4, "allocated": 8}.get(st, 0),
                      "idle_cpus": 8, "real_memory": 64000, "free_memory": 60000, "partitions": ["batch"],
                      "reason": "", "reason_changed_at": 0, "boot_time": int(NOW) - 86400, "architecture": "x86_64",
                      "operating_system": "Linux 6.1", "features": "", "gres": "", "weight": 1, "port": 6818,
                      "slurmd_version": "22.05.8", "tres": "cpu=8,mem=64000M"})
    return json.dumps({"meta": {}, "errors": [], "nodes": nodes}).encode()


FULL_JOB_EXTRA = {f"Extra{k}": f'"value {k} with some text"' for k in range(40)}


def condor_job_ads(n: int, full: bool) -> str:
    rng = random.Random(42)
    out = []
    for i in range(n):
        status = 1 if i % 10 < 7 else (2 if i % 10 < 9 else 5)
        ad = {"ClusterId": i // 10, "ProcId": i % 10, "JobStatus": status, "RequestCpus": rng.choice([1, 2, 4]),
              "RequestMemory": 2048, "QDate": int(NOW) - i, "JobUniverse": 5, "Owner": '"alice"'}
        if full:
            ad.update({"Cmd": '"/home/alice/job.sh"', "Iwd": '"/home/alice"', "Requirements":
                       '(TARGET.Arch == "X86_64") && (TARGET.OpSys == "LINUX") && (TARGET.Memory >= RequestMemory)',
                       **FULL_JOB_EXTRA})
        out.append("\n".join(f"{k} = {v}" for k, v in ad.items()))
    return "\n\n".join(out) + "\n"


def condor_startd_ads(n: int, full: bool) -> str:
    out = []
    for i in range(n):
        machine = f"exec{i:05d}.example.org"
        ad = {"Name": f'"slot1@{machine}"', "Machine": f'"{machine}"', "SlotType": '"Partitionable"',
              "State": '"Unclaimed"', "Activity": '"Idle"', "Cpus": 8 - (i % 3) * 4, "TotalSlotCpus": 8,
              "TotalCpus": 8, "EnteredCurrentState": int(NOW) - i}
        if full:
            ad.update({"Requirements": "START && (WithinResourceLimits)", "OpSys": '"LINUX"', "Arch": '"X86_64"',
                       **FULL_JOB_EXTRA})
        out.append("\n".join(f"{k} = {v}" for k, v in ad.items()))
        if i % 3:
            dyn = {"Name": f'"slot1_1@{machine}"', "Machine": f'"{machine}"', "SlotType": '"Dynamic"',
                   "State": '"Claimed"', "Activity": '"Busy"', "Cpus": (i % 3) * 4, "TotalCpus": 8,
                   "JobId": f'"{i}.0"'}
            out.append("\n".join(f"{k} = {v}" for k, v in dyn.items()))
    return "\n\n".join(out) + "\n"


# ------------------------------------------------------------------ the two ways per system
def torque_ours(qstat: bytes, nodes: bytes) -> tuple[int, int]:
    jobs = tparse.parse_qstat(qstat, NOW)
    return len(jobs.queued), len(tparse.parse_pbsnodes(nodes))


def torque_dom(qstat: bytes, nodes: bytes) -> tuple[int, int]:
    job_root = ET.fromstring(qstat)
    node_root = ET.fromstring(nodes)
    jobs = tparse.normalize_jobs((tparse._flatten(e) for e in job_root.iter("Job")), NOW)
    return len(jobs.queued), len(tparse.normalize_nodes(tparse._flatten(e) for e in node_root.iter("Node")))


def slurm_ours(squeue: bytes, sinfo: bytes) -> tuple[int, int]:
    jobs = parse_squeue(json.loads(squeue), NOW)
    return len(jobs.queued), len(normalize_nodes(node_records(json.loads(sinfo)), jobs.jobs_by_node))


class _SqueueJob(BaseModel):
    model_config = ConfigDict(extra="allow")
    job_id: int
    job_state: str
    state_reason: str
    partition: str
    node_count: int
    cpus: int
    minimum_cpus_per_node: int
    submit_time: int
    nodes: str
    array_job_id: int
    array_task_id: int | None
    array_task_string: str


class _SinfoNode(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    state: str
    state_flags: list[str]
    cpus: int
    alloc_cpus: int


class _Squeue(BaseModel):
    jobs: list[_SqueueJob]


class _Sinfo(BaseModel):
    nodes: list[_SinfoNode]


def slurm_pydantic(squeue: bytes, sinfo: bytes) -> tuple[int, int]:
    q = _Squeue.model_validate(json.loads(squeue))
    s = _Sinfo.model_validate(json.loads(sinfo))
    jobs = parse_squeue({"jobs": [j.model_dump() for j in q.jobs]}, NOW)
    nodes = normalize_nodes(node_records({"nodes": [n.model_dump() for n in s.nodes]}), jobs.jobs_by_node)
    return len(jobs.queued), len(nodes)


def condor(jobs_text: list[str], startd_text: list[str]) -> tuple[int, int]:
    """Parse each ad (``classad2.parseOne``) and normalize. One ad at a time because
    ``classad2.parseAds`` over one large text is quadratic (6.4 s for 40,000 small ads vs
    2.1 s ad by ad); the backend itself gets ClassAd objects from the bindings, no text."""
    import classad2

    jobs = condor_jobs((classad2.parseOne(t) for t in jobs_text), NOW)
    return len(jobs.queued), len(normalize_startds(classad2.parseOne(t) for t in startd_text))


# ------------------------------------------------------------------ measuring
def measure(fn: Callable[..., Any], *args: Any) -> tuple[float, float, Any]:
    gc.collect()
    t0 = time.perf_counter()
    result = fn(*args)
    elapsed = time.perf_counter() - t0
    gc.collect()
    tracemalloc.start()
    fn(*args)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return elapsed, peak / (1024 * 1024), result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--only", nargs="*", choices=["torque", "slurm", "htcondor"], help="run only these systems")
    args = ap.parse_args(argv)
    n_nodes, n_jobs = args.nodes, args.jobs
    print(f"# sensor parse+normalize: {n_nodes:,} nodes, {n_jobs:,} jobs — Python {platform.python_version()}, "
          f"{platform.machine()}")
    def torque() -> tuple[str, list[Any]]:
        tq, tn = torque_qstat(n_jobs), torque_pbsnodes(n_nodes)
        return (f"{(len(tq) + len(tn)) / 1e6:.1f} MB XML",
                [("iterparse, cleared (ours)", torque_ours, (tq, tn)), ("ElementTree DOM", torque_dom, (tq, tn))])

    def slurm() -> tuple[str, list[Any]]:
        sq, si = slurm_squeue(n_jobs), slurm_sinfo(n_nodes)
        return (f"{(len(sq) + len(si)) / 1e6:.1f} MB JSON",
                [("json + dicts (ours)", slurm_ours, (sq, si)), ("json + pydantic models", slurm_pydantic, (sq, si))])

    def htcondor() -> tuple[str, list[Any]]:
        texts = [condor_job_ads(n_jobs, False), condor_startd_ads(n_nodes, False),
                 condor_job_ads(n_jobs, True), condor_startd_ads(n_nodes, True)]
        size = f"{(len(texts[0]) + len(texts[1])) / 1e6:.1f} MB projected / " \
               f"{(len(texts[2]) + len(texts[3])) / 1e6:.1f} MB full ads"
        jp, sp, jf, sf = (t.split("\n\n") for t in texts)
        del texts
        return (size,
                [("projected ads (ours)", condor, (jp, sp)), ("full ads, no projection", condor, (jf, sf))])

    print(f"{'system':<9} {'approach':<28} {'seconds':>8} {'peak MB':>8}  result (queued entries, nodes)")
    for system, make in (("torque", torque), ("slurm", slurm), ("htcondor", htcondor)):
        if args.only and system not in args.only:
            continue
        size, variants = make()
        for label, fn, fn_args in variants:
            secs, peak, result = measure(fn, *fn_args)
            print(f"{system:<9} {label:<28} {secs:>8.2f} {peak:>8.1f}  {result}  [{size}]", flush=True)
        del variants
    return 0


if __name__ == "__main__":
    sys.exit(main())
