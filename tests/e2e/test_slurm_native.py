"""Native mode on real Slurm (issue 35): Slurm's own power saving in front of the four services.

The cluster's CLOUD nodes, partitions and power saving are ``epu slurm conf``'s output for
deploy/examples/e2e-slurm-native.toml (tests/e2e/native.py): node sets ``alpha-c2-[1-4]``
(partition ``cpu``) and ``alpha-m8-[1-4]`` (``bigmem``, RealMemory=8000, Features=bigmem), every
node powered down, ``ResumeProgram`` the written ``epu-slurm-resume`` (``epu slurm resume -c
CONFIG HOSTLIST``). The domain ranks two process sites: ``east`` is full (every launch answers a
capacity error), ``west`` serves.

Two c2 jobs and one bigmem job are submitted. Checked: Slurm powers up nodes of the right sets
and calls ResumeProgram; the engine launches each named node as the type its features name, tries
east, fails over to west under the same name; each job runs on a node of its type and completes;
no node is ever DOWN (nothing waits for ResumeTimeout) and no job is lost; then Slurm suspends the
idle nodes (SuspendTime) and EPU ends them only after removing them: back to zero, every node
powered down, no slurmd left, never two for one node.

The submit→first job start time is written to ``native-figure.json`` in the results (and
``results/e2e-native-<timestamp>/`` with ``E2E_RESULTS=1``): docs/performance.md quotes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.testing import wait_for

from tests.e2e.harness import ROOT, SnapshotWatch, slurmd_census
from tests.e2e.native import NativeE2E, NodeWatch

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.rabbitmq, pytest.mark.timeout(420)]

RUN = "echo start=$(date +%s.%N) node=$SLURMD_NODENAME; sleep 4"


def job_fields(run: NativeE2E, job: str) -> dict[str, str]:
    out = run.cluster.run("scontrol", "-o", "show", "job", job, check=False).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def test_native_two_shapes_fail_over_and_suspend_to_zero(broker: Broker, tmp_path: Path) -> None:
    started = time.monotonic()
    watch = SnapshotWatch(broker)
    out = tmp_path / "results"
    out.mkdir()
    with NativeE2E(tmp_path / "run", broker.url, broker.topology.prefix) as run:
        nodes = NodeWatch(run.cluster).start()
        try:
            run.start_services()
            run.start_tap(out)
            seen = watch.count()
            wait_for(lambda: watch.count() > seen + 1, 30, interval=0.1, message="the sensor reporting")
            assert set(run.cluster.node_states()) == set(run.node_names)
            assert all("POWERED_DOWN" in s for s in run.cluster.node_states().values())

            logs = run.workdir / "job-out"
            logs.mkdir()
            submitted = time.time()
            jobs = {
                "cpu-a": run.submit("-p", "cpu", "-c", "2", "--mem=500", "--time=5", wrap=RUN,
                                    output=str(logs / "cpu-a")),
                "cpu-b": run.submit("-p", "cpu", "-c", "2", "--mem=500", "--time=5", wrap=RUN,
                                    output=str(logs / "cpu-b")),
                "bigmem": run.submit("-p", "bigmem", "--mem=6000", "--constraint=bigmem", "-c", "1", "--time=5",
                                     wrap=RUN, output=str(logs / "bigmem")),
            }
            ids = list(jobs.values())
            wait_for(lambda: set(run.job_states(ids).values()) <= {"COMPLETED"}, 240, interval=0.5,
                     message="every job completed")
            done = time.time()
            records = {name: job_fields(run, i) for name, i in jobs.items()}
            wait_for(lambda: not slurmd_census(run.cluster.conf_path)
                     and all("POWERED_DOWN" in s and "POWERING_DOWN" not in s and "DRAIN" not in s
                             for s in run.cluster.node_states().values()),
                     120, interval=0.5, message="Slurm suspended every node, EPU ended its instance and "
                                                "released the slot it held meanwhile")
            zero = time.time()
            run.stop("tap", signal.SIGINT)
        finally:
            nodes.stop()
            watch.stop()
        duplicates = run.census.duplicates()
        types = run.node_types()
        calls = (run.cluster.log_path("slurmctld").read_text(errors="replace")
                 .count("power_save: program exit status"))

    assert not duplicates, f"two slurmd for one node: {duplicates}"
    assert not nodes.ever("DOWN"), f"a node went DOWN: {nodes.ever('DOWN')}"
    assert calls == 0, "every ResumeProgram/SuspendProgram call exited 0"
    for name, rec in records.items():
        assert rec.get("JobState") == "COMPLETED" and rec.get("Restarts") == "0", \
            (name, {k: rec.get(k) for k in ("JobState", "Restarts", "Reason", "NodeList", "BatchHost")})

    ran = {name: (logs / name).read_text() for name in jobs}
    on = {name: re.search(r"node=(\S+)", text).group(1) for name, text in ran.items()}  # type: ignore[union-attr]
    assert types[on["cpu-a"]] == types[on["cpu-b"]] == "c2" and on["cpu-a"] != on["cpu-b"], on
    assert types[on["bigmem"]] == "m8", on

    events = [json.loads(line) for line in (out / "tap.jsonl").read_text().splitlines() if line.strip()]
    lives: dict[str, dict] = {}
    for e in events:
        if e["routing_key"].startswith("instance.state."):
            b = e["body"]
            life = lives.setdefault(b["instance_id"], {"site": b.get("site", ""), "type": b.get("instance_type", ""),
                                                       "node": "", "states": [], "reasons": []})
            life["node"] = b.get("node_name") or life["node"]
            life["states"].append(b["state"])
            life["reasons"].append(b.get("reason", ""))
    given_back = [e["body"] for e in events if e["routing_key"].startswith("node.result")
                  and e["body"].get("action") == "give_back"]
    assert not given_back, f"every node was servable (west has room): nothing given back: {given_back}"
    released = {e["body"]["node"] for e in events if e["routing_key"].startswith("node.result")
                and e["body"].get("action") == "release" and e["body"].get("ok")}
    assert set(on.values()) <= released, f"each node a job ran on was held after its removal, then released: {released}"
    served = [life for life in lives.values() if life["site"] == "west"]
    tried = [life for life in lives.values() if life["site"] == "east"]
    assert tried and all(life["states"][-1] == "failed" for life in tried), f"east was tried and failed: {tried}"
    assert sorted((life["node"], life["type"]) for life in served) == sorted(
        (node, types[node]) for node in set(on.values())), f"west served exactly the nodes the jobs ran on: {served}"
    for life in served:
        assert life["states"][-1] == "terminated", life
    for life in tried:
        assert life["node"] in on.values(), f"east was tried for a node Slurm resumed: {life}"

    first_start = min(float(re.search(r"start=(\S+)", t).group(1)) for t in ran.values())  # type: ignore[union-attr]
    resumed = min(e["body"]["called_at"] for e in events if e["routing_key"].startswith("slurm.power")
                  and e["body"]["action"] == "resume")
    west_started = min(e["timestamp"] for e in events if e["routing_key"].startswith("instance.state")
                       and e["body"]["site"] == "west" and e["body"]["state"] == "started")
    node_up = min(t for (n, token), t in nodes.first.items() if token == "UP" and n in on.values())
    figure = {"submit_to_first_start_s": round(first_start - submitted, 1),
              "submit_to_resume_call_s": round(resumed - submitted, 1),
              "submit_to_instance_started_s": round(west_started - submitted, 1),
              "submit_to_first_node_up_s": round(node_up - submitted, 1),
              "submit_to_all_done_s": round(done - submitted, 1),
              "submit_to_zero_s": round(zero - submitted, 1),
              "process_site_boot": "a slurmd started in a fresh time namespace 1 s after the launch "
                                   "(tests/e2e/worker.py --fresh-boot); no VM",
              "failover": "east full (capacity error), every node served by west"}
    (out / "native-figure.json").write_text(json.dumps(figure, indent=2) + "\n")
    if os.environ.get("E2E_RESULTS"):
        keep = ROOT / "results" / f"e2e-native-{time.strftime('%Y%m%d-%H%M%S')}"
        shutil.copytree(out, keep)
    print(f"native e2e: {figure}")
    assert time.monotonic() - started < 400
