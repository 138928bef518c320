"""The ``slurm.power`` message and what slurmctld hands its power-saving programs
(common/slurm_power.py): hostlists expanded, SLURM_RESUME_FILE read, bad input refused whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from epu.common.hostlist import HostlistError
from epu.common.messages import Envelope, SlurmPower, open_envelope
from epu.common.senders import SenderPolicy
from epu.common.slurm_power import ResumeFileError, parse_resume_file, power_message, read_resume_file
from epu.common.topology import DEFAULT_TOPOLOGY, MANDATORY_TYPES
from pydantic import ValidationError

# the example of Slurm's power_save guide (SLURM_RESUME_FILE), with our names
RESUME_FILE = {
    "all_nodes_resume": "cloud[1-3,7-8]",
    "jobs": [
        {"extra": "An arbitrary string from --extra", "features": "c1,c2", "job_id": 140814,
         "nodes_alloc": "cloud[1-4]", "nodes_resume": "cloud[1-3]", "oversubscribe": "OK", "partition": "cloud",
         "reservation": "resv_1234"},
        {"extra": None, "features": "c1,c2", "job_id": 140815, "nodes_alloc": "cloud[1-2]",
         "nodes_resume": "cloud[1-2]", "oversubscribe": "OK", "partition": "cloud", "reservation": None},
        {"job_id": 140816, "nodes_alloc": "cloud[7-8]", "nodes_resume": "cloud[7-8]", "partition": "cloud_exclusive"},
    ],
}


def test_resume_file_as_slurm_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "resume.json"
    path.write_text(json.dumps(RESUME_FILE))
    jobs = read_resume_file(path)
    assert [j.job_id for j in jobs] == [140814, 140815, 140816]
    assert jobs[0].nodes_alloc == ["cloud1", "cloud2", "cloud3", "cloud4"]
    assert jobs[0].nodes_resume == ["cloud1", "cloud2", "cloud3"]
    assert (jobs[0].features, jobs[0].reservation, jobs[0].extra) == ("c1,c2", "resv_1234",
                                                                       "An arbitrary string from --extra")
    assert jobs[1].extra == "" and jobs[1].reservation == ""
    assert jobs[2].features == ""


@pytest.mark.parametrize("data, why", [
    ([], "JSON object"),
    ({"jobs": {}}, "not a list"),
    ({"jobs": [1]}, "not an object"),
    ({"jobs": [{"job_id": "x"}]}, "not a job id"),
    ({"jobs": [{"job_id": True}]}, "not a job id"),
    ({"jobs": [{"job_id": 1, "nodes_alloc": "n;rm -rf"}]}, "invalid node name"),
    ({"jobs": [{"job_id": 1, "nodes_resume": "n[1-"}]}, "without"),
])
def test_bad_resume_file_refused(data: object, why: str) -> None:
    with pytest.raises(ResumeFileError, match=why):
        parse_resume_file(data)


def test_unreadable_resume_file(tmp_path: Path) -> None:
    with pytest.raises(ResumeFileError, match="No such file"):
        read_resume_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ResumeFileError, match="not JSON"):
        read_resume_file(tmp_path / "bad.json")


def test_one_call_one_batch_on_its_domain_key() -> None:
    msg = power_message("alpha", "resume", "cloud-c5-[001-003]", now=5.0)
    assert msg.nodes == ["cloud-c5-001", "cloud-c5-002", "cloud-c5-003"]
    assert msg.routing_key() == "slurm.power.alpha"
    assert len(msg.batch_id) == 32 and msg.called_at == 5.0
    assert power_message("alpha", "resume", "n1").batch_id != msg.batch_id
    # published mandatory (no engine queue: an error, never dropped) on the events exchange
    assert "slurm.power" in MANDATORY_TYPES
    assert DEFAULT_TOPOLOGY.exchange_for(msg).name == "epu.events"
    assert "slurm.power.*" in DEFAULT_TOPOLOGY.decision_input_spec().routing_keys


def test_jobs_only_with_a_resume() -> None:
    jobs = parse_resume_file(RESUME_FILE)
    assert power_message("alpha", "resume", "cloud[1-3,7-8]", jobs=jobs).jobs == jobs
    assert power_message("alpha", "suspend", "cloud1", jobs=jobs).jobs == []


def test_round_trip_on_the_wire() -> None:
    msg = power_message("alpha", "resume_fail", "n[1-2]")
    assert open_envelope(Envelope.wrap(msg, "test")) == msg


@pytest.mark.parametrize("hostlist", ["", "n[1-2", "n;rm", "a b;c"])
def test_bad_hostlist_refused(hostlist: str) -> None:
    with pytest.raises(HostlistError):
        power_message("alpha", "resume", hostlist)


def test_contract_refuses_what_is_not_a_host_name() -> None:
    with pytest.raises(ValidationError):  # '_' is a Slurm name but not a host name: refused, not mangled
        power_message("alpha", "resume", "rack_1")
    with pytest.raises(ValidationError):
        SlurmPower(batch_id="b", domain="alpha", action="resume", nodes=[])
    with pytest.raises(ValidationError):
        SlurmPower(batch_id="b", domain="alpha", action="reboot", nodes=["n1"])  # type: ignore[arg-type]


def test_only_the_domains_sensor_may_send_it() -> None:
    policy = SenderPolicy(require_sender_user=True)
    msg = power_message("alpha", "resume", "n1")
    assert policy.check_user("epu-sensor-alpha", "slurm.power", msg) is None
    assert "only epu-sensor-alpha" in (policy.check_user("epu-sensor-beta", "slurm.power", msg) or "")
    assert policy.check_user("epu-decision", "slurm.power", msg) is not None
    assert SenderPolicy.check_key(DEFAULT_TOPOLOGY, "epu.events", "slurm.power.beta", "slurm.power", msg) is not None
    assert SenderPolicy.check_key(DEFAULT_TOPOLOGY, "epu.events", "slurm.power.alpha", "slurm.power", msg) is None
