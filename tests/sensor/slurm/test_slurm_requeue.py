"""The Slurm backend's requeue of a preempted node's jobs: which commands it runs, argument lists
only (no shell), and what it refuses."""

from __future__ import annotations

import pytest
from epu.services.sensor.backend import InvalidNodeName
from epu.services.sensor.slurm.backend import SlurmBackend

from tests.sensor.torque.replay import ReplayRunner

SQUEUE = ("squeue", "--all", "-h", "-w", "el1", "-t", "RUNNING,COMPLETING,CONFIGURING,SUSPENDED", "-o", "%i")
DRAIN = ("scontrol", "update", "NodeName=el1", "State=DRAIN", "Reason=preempted")


def backend(table) -> tuple[SlurmBackend, ReplayRunner]:
    runner = ReplayRunner(table)
    return SlurmBackend(runner), runner


def test_each_job_on_the_node_is_requeued_with_its_own_call() -> None:
    b, runner = backend({SQUEUE: (0, "101\n102_3\n101\n", ""), DRAIN: (0, "", ""),
                         ("scontrol", "requeue", "101"): (0, "", ""),
                         ("scontrol", "requeue", "102_3"): (0, "", "")})
    out = b.requeue_jobs("el1", "preempted")
    assert out.ok and out.changed
    # drained first, so Slurm does not start them on the dead node again
    assert runner.calls == [SQUEUE, DRAIN, ("scontrol", "requeue", "101"), ("scontrol", "requeue", "102_3")]
    assert "$ scontrol requeue 102_3" in out.output


def test_a_job_that_ended_meanwhile_is_not_an_error() -> None:
    b, _ = backend({SQUEUE: (0, "7\n", ""), DRAIN: (0, "", ""),
                    ("scontrol", "requeue", "7"): (1, "", "scontrol: error: Invalid job id specified for job 7")})
    assert b.requeue_jobs("el1", "preempted").ok


def test_no_job_nothing_to_do() -> None:
    b, runner = backend({SQUEUE: (0, "", "")})
    out = b.requeue_jobs("el1")
    assert out.ok and not out.changed and runner.calls == [SQUEUE]


def test_a_refused_requeue_fails_the_command_with_slurms_words() -> None:
    b, _ = backend({SQUEUE: (0, "7\n8\n", ""), DRAIN: (0, "", ""),
                    ("scontrol", "requeue", "7"): (1, "", "scontrol: error: Access/permission denied for job 7"),
                    ("scontrol", "requeue", "8"): (0, "", "")})
    out = b.requeue_jobs("el1", "preempted")
    assert not out.ok and out.changed and not out.transient
    assert "scontrol requeue 7 failed (exit 1)" in (out.error or "") and "permission denied" in (out.error or "")


def test_a_job_id_that_is_not_a_job_id_never_reaches_a_command_line() -> None:
    b, runner = backend({SQUEUE: (0, "7\n--all\n", "")})
    out = b.requeue_jobs("el1")
    assert not out.ok and "refusing job id '--all'" in (out.error or "")
    assert runner.calls == [SQUEUE]


def test_squeue_failing_is_transient() -> None:
    b, _ = backend({SQUEUE: (1, "", "slurm_load_jobs error: Unable to contact slurm controller")})
    out = b.requeue_jobs("el1")
    assert not out.ok and out.transient and "Unable to contact" in (out.error or "")


def test_a_bad_node_name_is_refused() -> None:
    b, runner = backend({})
    with pytest.raises(InvalidNodeName):
        b.requeue_jobs("el1;reboot")
    assert runner.calls == []
