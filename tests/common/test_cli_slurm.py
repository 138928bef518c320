"""``epu slurm resume|suspend|resume-fail`` as slurmctld runs it: a separate process, one argument,
the sensor's config. Against the real broker with the generated least-privilege definitions: the
batch reaches the engine's input queue as the domain's sensor user; another domain's sensor is
refused; an unreachable broker fails within the timeout; a bad hostlist sends nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.messages import SlurmPower
from epu.common.testing import drain
from epu.common.topology import DECISION_INPUT_QUEUE, Topology

from tests.support.definitions import loaded_definitions

CONFIG = """
[broker]
url = "{url}"
declare = false
[sensor]
domain = "{domain}"
backend = "slurm"
"""


def _run(tmp: Path, url: str, *args: str, domain: str = "alpha", env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    cfg = tmp / f"{domain}-{abs(hash(url))}.toml"
    cfg.write_text(CONFIG.format(url=url, domain=domain))
    return subprocess.run([sys.executable, "-m", "epu", "slurm", *args, "-c", str(cfg), "--json"],
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", **(env or {})})


@pytest.mark.rabbitmq
def test_resume_reaches_the_engine_as_the_sensor(tmp_path: Path) -> None:
    resume_file = tmp_path / "resume.json"
    resume_file.write_text(json.dumps({"jobs": [{"job_id": 7, "nodes_alloc": "cloud-c5-[001-002]",
                                                 "nodes_resume": "cloud-c5-[001-002]", "features": "c5"}]}))
    with loaded_definitions(["alpha", "beta"], admin_access=True) as d:
        admin = Broker(d.admin_url, Topology())
        res = _run(tmp_path, d.url("epu-sensor-alpha"), "resume", "cloud-c5-[001-002],gpu-7",
                   env={"SLURM_RESUME_FILE": str(resume_file)})
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["ok"] and out["nodes"] == ["cloud-c5-001", "cloud-c5-002", "gpu-7"] and out["jobs"] == 1
        assert out["seconds"] < 10
        got = [m for _env, m in drain(admin, DECISION_INPUT_QUEUE) if isinstance(m, SlurmPower)]
        assert len(got) == 1 and got[0].batch_id == out["batch_id"]
        assert got[0].action == "resume" and got[0].jobs[0].nodes_resume == ["cloud-c5-001", "cloud-c5-002"]

        # another domain's sensor may not ask for alpha's nodes: refused by the broker, exit 1
        res = _run(tmp_path, d.url("epu-sensor-beta"), "suspend", "cloud-c5-001", "--domain", "alpha",
                   domain="beta")
        assert res.returncode == 1, res.stdout + res.stderr
        assert json.loads(res.stdout or "{}").get("ok") is False and "not delivered" in res.stderr, res.stderr
        assert [m for _e, m in drain(admin, DECISION_INPUT_QUEUE) if isinstance(m, SlurmPower)] == []


def test_unreachable_broker_fails_within_the_timeout(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = _run(tmp_path, "amqp://guest:guest@127.0.0.1:1//", "resume-fail", "n[1-2]", "--timeout", "3")
    assert res.returncode == 1, res.stderr
    assert time.monotonic() - t0 < 30  # the interpreter's start counts too; the publish gives up at 3 s
    assert json.loads(res.stdout)["action"] == "resume-fail" and "not delivered" in res.stderr


@pytest.mark.parametrize("hostlist", ["n;reboot", "n[1-2", "$(id)", "", "rack_1"])
def test_bad_hostlist_sends_nothing(tmp_path: Path, hostlist: str) -> None:
    res = _run(tmp_path, "amqp://guest:guest@127.0.0.1:1//", "resume", hostlist)
    assert res.returncode == 2
    assert json.loads(res.stdout)["ok"] is False and "epu slurm resume:" in res.stderr


def test_help_is_a_manual() -> None:
    res = subprocess.run([sys.executable, "-m", "epu", "slurm", "resume", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0
    for needle in ("ResumeProgram", "SLURM_RESUME_FILE", "Exit status", "--json", "scontrol show hostnames"):
        assert needle in res.stdout
