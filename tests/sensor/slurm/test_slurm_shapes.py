"""Slurm jobs as shapes, on outputs captured from a real Slurm 22.05 (tests/sensor/fixtures/slurm/
mixed_22.05: partitions cpu, bigmem (Features=bigmem) and gpu (Gres=gpu:2), a license, and
jobs with --mem, --mem-per-cpu, --constraint, --gres=gpu:1, --gpus-per-node, -N, --time, a
hold, a dependency, --begin and an array), and on the 23.02+ JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from epu.services.sensor.reasons import SLURM_REASONS, classify
from epu.services.sensor.shapes import ShapeGrouper, coarse_time_limit
from epu.services.sensor.slurm.parse import (
    comment_with_instance,
    gres_gpus,
    instance_from_comment,
    license_blocked,
    normalize_nodes,
    parse_licenses,
    parse_squeue,
    parse_time_limit,
    split_features,
)
from epu.services.sensor.slurm.text import SEP, parse_sinfo_text, parse_squeue_text, reason_of

MIXED = Path(__file__).resolve().parent.parent / "fixtures" / "slurm" / "mixed_22.05"


def text_read():
    return parse_squeue_text((MIXED / "squeue_O.txt").read_text())


def json_read():
    doc = json.loads((MIXED / "squeue.json").read_text())
    return parse_squeue(doc, max(j["submit_time"] for j in doc["jobs"]) + 5)


def by_sample(shapes):
    return {s.sample_job_ids[0]: s for s in shapes}


def test_real_22_05_shapes_and_reasons() -> None:
    read = text_read()
    assert read.unexplained == []
    shapes = by_sample(read.jobs.shapes())
    ids = json.loads((MIXED / "ids.json").read_text())

    def shape(name: str):
        return shapes.get(ids[name]) or next(v for k, v in shapes.items() if k.startswith(f"{ids[name]}_["))

    mem = shape("mem")  # -p bigmem --mem=12000 -c 4 --constraint=bigmem --time=2:00:00
    assert (mem.partition, mem.cores, mem.memory_mb, mem.features, mem.time_limit_s) == ("bigmem", 4, 12000,
                                                                                         ["bigmem"], 7200)
    # the description "Nodes required for job are DOWN, DRAINED..." is reason Resources: demand
    assert (mem.reason, mem.demand, mem.reason_class) == ("Resources", True, "resources")
    wide = shape("wide")  # -N 2 --ntasks-per-node=2 --mem-per-cpu=1000: 2000 MB per node
    assert (wide.nodes, wide.cores, wide.memory_mb, wide.demand, wide.reason) == (2, 2, 2000, True, "ReqNodeNotAvail")
    gpu = shape("gpu")  # --gres=gpu:1 --time=30
    assert (gpu.partition, gpu.gpus, gpu.time_limit_s, gpu.demand) == ("gpu", 1, 1800, True)
    assert (shape("gpus_pn").gpus, shape("gpus_pn").cores) == (2, 2)  # --gpus-per-node=2 -c 2
    arr = shape("arr")  # --array=1-10%2: each element counts
    assert (arr.count, arr.demand) == (10, True)
    assert (shape("held").demand, shape("held").reason, shape("held").reason_class) == (False, "JobHeldUser", "held")
    assert (shape("dep").demand, shape("dep").reason_class) == (False, "dependency")
    assert (shape("begin").demand, shape("begin").reason_class) == (False, "begin_time")
    assert (shape("lic").demand, shape("lic").reason_class) == (False, "limit")  # a new node brings no license
    assert read.jobs.running == 2 and read.jobs.jobs_by_node == {"node1": [ids["run"], ids["lic_run"]]}


def test_text_and_json_reads_agree_on_the_same_moment() -> None:
    def strip(shapes):
        return [s.model_dump(exclude={"max_wait_s"}) for s in shapes]

    assert strip(text_read().jobs.shapes()) == strip(json_read().shapes())


def test_real_22_05_nodes_from_sinfo_text() -> None:
    records = {r.name: r for r in parse_sinfo_text((MIXED / "sinfo_N_O.txt").read_text())}
    assert records["gpu1"].gpus == 2 and records["gpu1"].features == ("a100",)
    assert records["big1"].memory_mb == 16000 and records["big1"].partitions == ("bigmem",)
    assert records["node1"].partitions == ("cpu",)  # "cpu*" (the default) without its star
    nodes = normalize_nodes(records.values(), {"node1": ["1", "2"]}, include_powered_down=True)
    node1 = next(n for n in nodes if n.name == "node1")
    assert (node1.state, node1.cores, node1.cores_used, node1.memory_mb, node1.jobs) == ("busy", 2, 2, 1000, ["1", "2"])


def line(*fields: str) -> str:
    return SEP.join(fields)


def test_sinfo_text_merges_partitions_and_reads_identity() -> None:
    text = "\n".join([
        line("w1", "mixed+cloud", "1/3/0/4", "8000", "2000", "gpu:a100:2(S:0)", "gpu:a100:1(IDX:0)", "fast,ib",
             "cpu*", "admin says hi epu:instance=L-42", "Unknown", "none"),
        line("w1", "mixed+cloud", "1/3/0/4", "8000", "2000", "gpu:a100:2(S:0)", "gpu:a100:1(IDX:0)", "fast,ib",
             "gpu", "admin says hi epu:instance=L-42", "Unknown", "none"),
        line("w2", "idle+drain", "0/4/0/4", "8000", "0", "(null)", "gpu:0", "(null)", "cpu*", "(null)",
             "2026-11-22T23:05:06", "epu: offline"),
    ])
    recs = {r.name: r for r in parse_sinfo_text(text)}
    w1 = recs["w1"]
    assert (w1.partitions, w1.gpus, w1.gpus_used, w1.features, w1.instance_id) == (("cpu", "gpu"), 2, 1,
                                                                                    ("fast", "ib"), "L-42")
    assert (w1.cpus, w1.alloc_cpus, w1.alloc_memory_mb) == (4, 1, 2000)
    assert recs["w2"].instance_id is None and recs["w2"].state_since is not None and recs["w2"].reason


def test_node_comment_keeps_the_administrators_text() -> None:
    assert comment_with_instance("", "abc") == "epu:instance=abc"
    assert comment_with_instance("rack 7", "abc") == "rack 7 epu:instance=abc"
    assert comment_with_instance("rack 7 epu:instance=old", "new") == "rack 7 epu:instance=new"
    assert comment_with_instance("rack 7 epu:instance=old", None) == "rack 7"
    assert instance_from_comment("rack 7 epu:instance=i-0abc:x.1") == "i-0abc:x.1"
    assert instance_from_comment("(null)") is None


# ------------------------------------------------------------------ 23.02+ JSON (data_parser v0.0.39-41)
def n(value: int, set_: bool = True) -> dict:
    return {"set": set_, "infinite": False, "number": value}


NEW = {"jobs": [
    {"job_id": 20, "job_state": ["PENDING"], "state_reason": "Resources", "node_count": n(1), "cpus": n(8),
     "minimum_cpus_per_node": n(8), "memory_per_node": n(64000), "memory_per_cpu": n(0, False),
     "tres_per_node": "gres/gpu:a100:4", "features": "bigmem&ib", "time_limit": n(240), "partition": "gpu",
     "submit_time": n(1000), "priority": n(100), "array_job_id": n(0), "array_task_id": n(0, False)},
    {"job_id": 21, "job_state": ["PENDING"], "state_reason": "QOSMaxJobsPerUserLimit", "node_count": n(2),
     "cpus": n(4), "memory_per_node": n(0, False), "memory_per_cpu": n(1000), "time_limit": {"set": True,
     "infinite": True, "number": 0}, "partition": "cpu", "submit_time": n(1000), "priority": n(100)},
    {"job_id": 22, "job_state": ["PENDING"], "state_reason": "AssocGrpCpuLimit", "node_count": n(1), "cpus": n(1),
     "partition": "cpu", "submit_time": n(1000), "priority": n(100)},
    {"job_id": 23, "job_state": ["PENDING"], "state_reason": "SomethingNew", "node_count": n(1), "cpus": n(1),
     "partition": "cpu", "submit_time": n(1000), "priority": n(100)},
    {"job_id": 24, "job_state": ["PENDING"], "state_reason": "Priority", "node_count": n(1), "cpus": n(2),
     "tres_per_job": "gres/gpu:3", "partition": "gpu", "submit_time": n(1000), "priority": n(100)},
]}


def test_newer_json_schema_shapes() -> None:
    warnings: list[str] = []
    jobs = parse_squeue(NEW, 1600.0, warnings)
    s = by_sample(jobs.shapes())
    assert (s["20"].gpus, s["20"].memory_mb, s["20"].features, s["20"].time_limit_s, s["20"].demand) == \
        (4, 64000, ["bigmem", "ib"], 14400, True)
    assert (s["21"].memory_mb, s["21"].cores, s["21"].nodes, s["21"].time_limit_s) == (2000, 2, 2, 0)
    assert (s["21"].demand, s["21"].reason_class) == (False, "limit")
    assert (s["22"].demand, s["22"].reason_class) == (False, "limit")
    assert (s["23"].demand, s["23"].reason_class) == (False, "unmapped")
    assert any("SomethingNew" in w for w in warnings)
    assert s["24"].gpus == 3 and s["24"].demand  # --gpus=3 on one node


def test_every_table_reason_is_classified_and_known_by_the_text_reader() -> None:
    assert len(SLURM_REASONS) >= 220
    for reason in SLURM_REASONS:
        assert reason_of(reason) == reason
        assert classify("slurm", reason).reason_class != "unmapped"
    assert reason_of("ReqNodeNotAvail, UnavailableNodes:el[1-2]") == "ReqNodeNotAvail"
    assert reason_of("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority "
                     "partitions") == "Resources"
    assert reason_of("Job is at or exceeds QOS normal's group wall limit of 10 with 12") == "QOSResourceLimit"
    assert reason_of("burst_buffer/lua: setup: failed") is None  # read again as JSON by the backend


@pytest.mark.parametrize(("text", "seconds"), [("30:00", 1800), ("2:00:00", 7200), ("1-12:00:00", 129600),
                                               ("UNLIMITED", 0), ("NOT_SET", 0), ("0:05", 5), ("", 0)])
def test_time_limits(text: str, seconds: int) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize(("spec", "gpus"), [("gres:gpu:1", 1), ("gres/gpu:a100:4", 4), ("gpu:2(S:0)", 2),
                                            ("gres:gpu", 1), ("gres/gpu=3", 3), ("gres:nic:1,gres:gpu:2", 2),
                                            ("N/A", 0), ("", 0), ("gres:gpu:a100", 1)])
def test_gpu_requests(spec: str, gpus: int) -> None:
    assert gres_gpus(spec) == gpus


def test_constraints() -> None:
    assert split_features("ib&bigmem") == ("bigmem", "ib")
    assert split_features("(null)") == ()
    assert split_features("a|b") == ("a|b",)  # an OR cannot be one list: kept whole


def test_too_many_shapes_are_coarsened_by_time_limit_only() -> None:
    g = ShapeGrouper(max_shapes=10)
    for i in range(100):
        g.add(nodes=1, cores=2, memory_mb=1000, gpus=0, features=(), partition="cpu", time_limit_s=600 + i * 7,
              demand=True, reason="Resources", reason_class="resources", wait_s=float(i), job_id=str(i))
    shapes = g.shapes()
    assert g.coarsened and len(shapes) <= 10 and sum(s.count for s in shapes) == 100
    assert all(s.memory_mb == 1000 and s.cores == 2 for s in shapes)
    assert all(s.time_limit_s in (900, 1800) for s in shapes) and coarse_time_limit(601) == 900
    assert max(s.max_wait_s for s in shapes) == 99.0


# ------------------------------------------------------------------ licenses
#: ``scontrol show licenses`` of 22.05 as printed (two lines per license, and ``-o``).
LICENSES_22_05 = """LicenseName=matlab
    Total=1 Used=0 Free=1 Reserved=1 Remote=no
LicenseName=stata
    Total=3 Used=0 Free=3 Reserved=0 Remote=no
"""


def test_free_licenses_leave_out_the_used_and_the_reserved() -> None:
    assert parse_licenses(LICENSES_22_05) == {"matlab": 0, "stata": 3}
    one_line = "LicenseName=matlab Total=4 Used=1 Free=3 Reserved=1 Remote=no\n"
    assert parse_licenses(one_line) == {"matlab": 2}
    # a version whose Free already excludes the reserved ones reads the same
    assert parse_licenses("LicenseName=matlab Total=4 Used=1 Free=2 Reserved=1 Remote=no") == {"matlab": 2}
    assert parse_licenses("") == {}


@pytest.mark.parametrize(("spec", "blocked"), [
    ("matlab:1", True), ("matlab", True), ("stata:3", False), ("stata:4", True), ("matlab:1,stata:1", True),
    ("matlab:1|stata:1", False), ("matlab:1|stata:9", True), ("(null)", False), ("", False),
    ("remote@db:1", False),  # a license Slurm does not list here: not held against the job
])
def test_license_blocked(spec: str, blocked: bool) -> None:
    assert license_blocked(spec, lambda: parse_licenses(LICENSES_22_05)) is blocked


def with_licenses(job_id: str, spec: str) -> str:
    """The captured squeue text with job ``job_id`` asking for licenses ``spec``."""
    out = []
    for row in (MIXED / "squeue_O.txt").read_text().splitlines():
        f = row.split(SEP)
        if f[0] == job_id:
            f[-2] = spec
        out.append(SEP.join(f))
    return "\n".join(out) + "\n"


def test_a_job_waiting_for_taken_licenses_is_no_demand_whatever_node_reason_slurm_shows() -> None:
    """Real 22.05: with every pool slot powered down, a job whose licenses are all taken shows
    "ReqNodeNotAvail"/"Nodes required for job are DOWN..." (Slurm tests nodes before licenses),
    which alone would read as demand (job 12 here: ReqNodeNotAvail in cpu)."""
    ids = json.loads((MIXED / "ids.json").read_text())
    calls = []

    def free(counts):
        def read():
            calls.append(1)
            return counts
        return read

    text = with_licenses(ids["cpu2"], "matlab:1")
    blocked = by_sample(parse_squeue_text(text, licenses=free({"matlab": 0})).jobs.shapes())[ids["cpu2"]]
    assert (blocked.demand, blocked.reason, blocked.reason_class) == (False, "Licenses", "limit")
    assert len(calls) == 1, "read once per snapshot"
    ok = by_sample(parse_squeue_text(text, licenses=free({"matlab": 1})).jobs.shapes())[ids["cpu2"]]
    assert (ok.demand, ok.reason) == (True, "ReqNodeNotAvail")
    calls.clear()
    parse_squeue_text((MIXED / "squeue_O.txt").read_text(), licenses=free({"matlab": 0}))
    assert calls == [], "nothing that looks like demand asks for licenses: no read"

    doc = json.loads((MIXED / "squeue.json").read_text())
    for job in doc["jobs"]:
        if str(job["job_id"]) == ids["cpu2"]:
            job["licenses"] = "matlab:1"
    now = max(j["submit_time"] for j in doc["jobs"]) + 5
    shape = by_sample(parse_squeue(doc, now, licenses=free({"matlab": 0})).shapes())[ids["cpu2"]]
    assert (shape.demand, shape.reason, shape.reason_class) == (False, "Licenses", "limit")
