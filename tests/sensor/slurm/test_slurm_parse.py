"""Slurm parsers on JSON captured from a real Slurm 22.05 and on the 23.02+ schema shape."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from epu.services.sensor.slurm.parse import (
    count_array_tasks,
    expand_hostlist,
    node_records,
    normalize_nodes,
    num,
    parse_scontrol_show_node,
    parse_squeue,
)
from epu.services.sensor.states import (
    SLURM_JOB_STATES,
    SLURM_NODE_STATES,
    slurm_node_state,
    slurm_state_tokens,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"


def load(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_captured_22_05_queue() -> None:
    doc = json.loads(load("squeue_22.05.json"))
    now = max(j["submit_time"] for j in doc["jobs"]) + 100
    jobs = parse_squeue(doc, now)
    by_id = {j.job_id: j for j in jobs.queued}
    assert jobs.running == 2 and jobs.jobs_by_node == {"node1": ["1"], "node2": ["2"]}
    assert by_id["3"].state == "held"                       # JobHeldUser
    assert by_id["4"].state == "blocked"                    # Dependency
    assert by_id["8"].state == "blocked"                    # BeginTime
    arr = by_id["5_[1-5%2]"]
    assert (arr.count, arr.cores, arr.state) == (5, 2, "queued")  # each element counts
    assert (by_id["6"].nodes, by_id["6"].cores, by_id["6"].state) == (2, 2, "queued")
    assert (by_id["7"].cores, by_id["7"].memory_mb) == (2, 512)
    assert all(j.queue == "debug" and j.wait_seconds >= 100 for j in jobs.queued)


def test_captured_22_05_nodes() -> None:
    records = node_records(load("sinfo_22.05.json"))
    nodes = {n.name: n for n in normalize_nodes(records, {"node1": ["1"], "node2": ["2"]})}
    assert {k: (v.state, v.native_state) for k, v in nodes.items()} == {
        "node1": ("free", "MIXED"),
        "node2": ("offline", "ALLOCATED+DRAIN"),
        "node3": ("offline", "IDLE+DRAIN"),
        "node4": ("down", "DOWN"),
    }
    assert (nodes["node1"].cores, nodes["node1"].cores_used) == (2, 1)
    assert nodes["node2"].state_since and nodes["node2"].jobs == ["2"]
    with_pool = normalize_nodes(records, {}, include_powered_down=True)
    assert {n.name: n.state for n in with_pool}["el1"] == "offline"  # IDLE+CLOUD+DRAIN+POWERED_DOWN


def test_scontrol_show_node_text() -> None:
    fields = parse_scontrol_show_node(load("scontrol_show_node_node2.txt"))
    assert fields["NodeName"] == "node2" and "DRAIN" in fields["State"]
    assert fields["Reason"].startswith("epu: scale down")


# ------------------------------------------------------------------ 23.02+ shapes
NEW_SQUEUE = {"jobs": [
    {"job_id": 10, "job_state": ["PENDING"], "state_reason": "Resources", "node_count": {"set": True, "number": 2},
     "cpus": {"set": True, "number": 8}, "minimum_cpus_per_node": {"set": True, "number": 4},
     "memory_per_node": {"set": True, "number": 1024}, "submit_time": {"set": True, "number": 1000},
     "partition": "batch", "array_job_id": {"set": True, "number": 0}, "array_task_id": {"set": False, "number": 0}},
    {"job_id": 11, "job_state": ["PENDING"], "state_reason": "None", "array_job_id": {"set": True, "number": 11},
     "array_task_id": {"set": False, "number": 0}, "array_task_string": "0-9:3",
     "node_count": {"set": True, "number": 1}, "cpus": {"set": True, "number": 1}, "submit_time": {"number": 1000}},
    {"job_id": 12, "job_state": ["RUNNING"], "nodes": "c[01-02]", "array_job_id": {"number": 11},
     "array_task_id": {"set": True, "number": 1}},
    {"job_id": 13, "job_state": ["PENDING", "REQUEUED"], "state_reason": "JobHeldAdmin"},
    {"job_id": 14, "job_state": ["COMPLETED"]},
    {"job_id": 15, "job_state": ["WEIRD_NEW_STATE"]},
]}
NEW_SINFO = {"sinfo": [
    {"node": {"state": ["IDLE", "CLOUD", "POWERED_DOWN"]}, "nodes": {"nodes": ["cloud1", "cloud2"]},
     "cpus": {"allocated": 0, "idle": 8, "total": 8, "minimum": 4, "maximum": 4}},
    {"node": {"state": ["MIXED"]}, "nodes": {"nodes": ["c01"]},
     "cpus": {"allocated": 2, "idle": 2, "total": 4, "minimum": 4, "maximum": 4}},
    {"node": {"state": ["ALLOCATED", "DRAIN"]}, "nodes": {"nodes": ["c02"]},
     "cpus": {"allocated": 4, "idle": 0, "total": 4, "minimum": 4, "maximum": 4}},
]}
NEW_SCONTROL_NODES = {"nodes": [
    {"name": "c03", "state": ["DOWN", "NOT_RESPONDING"], "cpus": 4, "alloc_cpus": 0, "reason": "Not responding",
     "reason_changed_at": {"set": True, "number": 1500}},
]}


def test_newer_schema_queue() -> None:
    jobs = parse_squeue(NEW_SQUEUE, 1600.0)
    by_id = {j.job_id: j for j in jobs.queued}
    assert (by_id["10"].nodes, by_id["10"].cores, by_id["10"].memory_mb, by_id["10"].wait_seconds) == (2, 4, 1024, 600)
    assert by_id["11_[0-9:3]"].count == 4
    assert by_id["13"].state == "held"
    assert jobs.running == 1 and jobs.jobs_by_node == {"c01": ["11_1"], "c02": ["11_1"]}
    assert jobs.finished == 1 and jobs.unknown_states == ["WEIRD_NEW_STATE"]


def test_newer_schema_nodes() -> None:
    nodes = {n.name: n for n in normalize_nodes(node_records(NEW_SINFO), {"c01": ["12"]}, include_powered_down=True)}
    assert {k: v.state for k, v in nodes.items()} == {"cloud1": "offline", "cloud2": "offline",
                                                      "c01": "free", "c02": "offline"}
    assert (nodes["c01"].cores, nodes["c01"].cores_used) == (4, 2)
    (c03,) = normalize_nodes(node_records(NEW_SCONTROL_NODES), {})
    assert (c03.state, c03.state_since, c03.native_state) == ("down", 1500.0, "DOWN+NOT_RESPONDING")


# ------------------------------------------------------------------ the mapping table
@pytest.mark.parametrize(("native", "expected"), [
    ("MIXED", "free"), ("IDLE", "free"), ("ALLOCATED", "busy"), ("IDLE+DRAIN", "offline"),
    ("MIXED+DRAIN", "offline"), ("DOWN*", "down"), ("IDLE*", "down"), ("IDLE+CLOUD+POWERED_DOWN", "offline"),
    ("idle~", "offline"), ("COMPLETING", "busy"), ("IDLE+COMPLETING", "busy"), ("drain", "offline"),
    ("DOWN+DRAIN", "down"), ("mix-", "free"), ("alloc#", "down"), ("idle%", "offline"), ("UNKNOWN", "unknown"),
    ("FUTURE", "down"), ("IDLE+CLOUD", "free"), ("IDLE+DYNAMIC_NORM", "free"), ("MIXED+RESERVED", "free"),
])
def test_examples(native: str, expected: str) -> None:
    assert slurm_node_state(native) == expected


@pytest.mark.parametrize("token", sorted(SLURM_NODE_STATES))
def test_every_table_token(token: str) -> None:
    expected = SLURM_NODE_STATES[token]
    base = slurm_node_state(["IDLE", token] if token not in ("IDLE",) else ["IDLE"])
    if expected is None:
        assert base == "free"
    else:
        assert base == max(expected, "free", key=lambda s: {"down": 5, "offline": 4, "unknown": 3, "busy": 2,
                                                             "free": 1}[s])


@pytest.mark.parametrize("state", sorted(SLURM_JOB_STATES))
def test_every_job_state(state: str) -> None:
    jobs = parse_squeue({"jobs": [{"job_id": 1, "job_state": state, "state_reason": "None"}]}, 0.0)
    kind = SLURM_JOB_STATES[state]
    if kind in ("queued", "held", "blocked"):
        assert jobs.queued[0].state == kind
    elif kind == "running":
        assert jobs.running == 1
    else:
        assert jobs.finished == 1


def test_unmapped_node_state_is_unknown_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    warnings: list[str] = []
    with caplog.at_level(logging.WARNING):
        assert slurm_node_state("IDLE+QUANTUM_ENTANGLED", node="n9", warnings=warnings) == "unknown"
        assert slurm_node_state("HIBERNATE") == "unknown"
    assert "QUANTUM_ENTANGLED" in warnings[0] and "n9" in caplog.text


def test_tokens_and_helpers() -> None:
    assert slurm_state_tokens("DOWN*") == ["DOWN", "NOT_RESPONDING"]
    assert slurm_state_tokens("idle", ["DRAIN", "CLOUD"]) == ["IDLE", "DRAIN", "CLOUD"]
    assert expand_hostlist("el[1-2],node1,gpu[08-10]") == ["el1", "el2", "node1", "gpu08", "gpu09", "gpu10"]
    assert expand_hostlist("") == []
    assert count_array_tasks("1-3") == 3 and count_array_tasks("1,4-9:2%3") == 4 and count_array_tasks("7") == 1
    assert num({"set": False, "number": 5}) is None and num({"infinite": True}) is None
    assert num(4294967294) is None and num(7) == 7 and num("8") == 8 and num(None) is None
