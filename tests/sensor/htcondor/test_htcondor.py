"""HTCondor normalization on real classad2 ads, and commands through a bindings double."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import classad2
import htcondor2
import pytest
from epu.services.sensor.backend import BackendUnavailable, InvalidNodeName
from epu.services.sensor.htcondor.backend import HTCondorBackend, verified_command
from epu.services.sensor.htcondor.parse import normalize_jobs, normalize_startds
from epu.services.sensor.states import HTCONDOR_JOB_STATUS, HTCONDOR_SLOT_STATES

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "htcondor"
NOW = 1795323000.0


def ads(name: str) -> list[classad2.ClassAd]:
    return list(classad2.parseAds((FIXTURES / name).read_text()))


@pytest.fixture(scope="module")
def nodes() -> dict[str, Any]:
    return {n.name: n for n in normalize_startds(ads("startds.ads"))}


@pytest.mark.parametrize(("machine", "state", "cores", "used", "jobs"), [
    ("exec01", "free", 2, 1, ["102.0"]),            # static slots, one claimed
    ("exec02", "free", 4, 3, ["107.0", "107.1"]),   # partitionable, 1 core left
    ("exec03", "busy", 4, 4, ["109.0"]),            # partitionable, all cores in a dynamic slot
    ("exec04", "offline", 8, 0, []),                # Owner
    ("exec05", "offline", 4, 2, ["110.0"]),         # Drained/Retiring while draining
    ("exec06", "free", 1, 0, []),                   # Backfill
    ("exec07", "busy", 1, 1, []),                   # Matched
    ("exec08", "busy", 1, 1, ["111.0"]),            # Preempting
    ("exec09", "unknown", 1, 0, []),                # a state no table knows
    ("exec10", "free", 2, 0, []),                   # Delete (dynamic slot going away)
])
def test_every_slot_state(nodes: dict[str, Any], machine: str, state: str, cores: int, used: int,
                          jobs: list[str]) -> None:
    n = nodes[machine]
    assert (n.state, n.cores, n.cores_used, n.jobs) == (state, cores, used, jobs)


def test_fixture_covers_every_table_state() -> None:
    seen = {str(ad["State"]) for ad in ads("startds.ads")}
    assert set(HTCONDOR_SLOT_STATES) <= seen
    statuses = {int(ad["JobStatus"]) for ad in ads("jobs.ads")}
    assert set(HTCONDOR_JOB_STATUS) <= statuses


def test_unknown_slot_state_warns(caplog: pytest.LogCaptureFixture) -> None:
    warnings: list[str] = []
    with caplog.at_level(logging.WARNING):
        normalize_startds(ads("startds.ads"), warnings)
    assert len(warnings) == 1 and "Hibernating" in warnings[0] and "Hibernating" in caplog.text


def test_jobs_demand_held_blocked_arrays_parallel_and_expressions() -> None:
    jobs = normalize_jobs(ads("jobs.ads"), NOW)
    by_id = {j.job_id: j for j in jobs.queued}
    shapes = {s.sample_job_ids[0]: s for s in jobs.shapes()}
    assert (shapes["100.0"].count, shapes["100.0"].cores, shapes["100.0"].demand) == (5, 1, True)  # 5 idle procs
    assert by_id["101.0"].state == "held" and (shapes["101.0"].reason, shapes["101.0"].demand) == ("Held", False)
    assert (by_id["103.0"].cores, by_id["103.0"].memory_mb) == (4, 8192)
    assert (by_id["104.0"].nodes, by_id["104.0"].cores) == (3, 2)          # parallel universe
    assert by_id["105.0"].cores == 2                                        # RequestCpus = 1 + 1
    assert by_id["106.0"].state == "blocked" and shapes["106.0"].reason == "Deferred"  # deferred to the future
    assert jobs.running == 3 and jobs.finished == 2                         # 2, 6, 7 / 3, 4
    assert by_id["103.0"].wait_seconds == NOW - 1795321000
    demand = [s for s in jobs.shapes() if s.demand]
    assert sum(s.count * s.cores * s.nodes for s in demand) == 5 + 4 + 6 + 2


TEMPLATE = {"Arch": "X86_64", "OpSys": "LINUX", "Disk": 50_000_000, "Memory": 32768, "Cpus": 8, "GPUs": 1,
            "HasFileTransfer": True}


def test_requirements_against_the_worker_template() -> None:
    warnings: list[str] = []
    jobs = normalize_jobs(ads("jobs_resources.ads"), NOW, warnings, template=TEMPLATE)
    s = {x.sample_job_ids[0]: x for x in jobs.shapes()}
    gpu = s["200.0"]
    assert (gpu.count, gpu.cores, gpu.memory_mb, gpu.gpus, gpu.time_limit_s, gpu.demand, gpu.reason) == \
        (2, 2, 16384, 1, 7200, True, "Idle")
    assert (s["201.0"].demand, s["201.0"].reason, s["201.0"].reason_class) == (False, "RequirementsUnmatched",
                                                                               "invalid")  # 256 GB > template
    assert (s["202.0"].demand, s["202.0"].reason) == (True, "RequirementsUnknown")  # HasSingularity undefined
    no_template = normalize_jobs(ads("jobs_resources.ads"), NOW)
    assert all(x.reason == "Idle" and x.demand for x in no_template.shapes())


def test_machines_by_short_name_with_identity_memory_and_gpus(nodes: dict[str, Any]) -> None:
    exec02 = nodes["exec02"]
    assert exec02.name == "exec02"  # Machine is the FQDN; EPU names workers by short name
    assert (exec02.instance_id, exec02.memory_mb, exec02.gpus) == ("4c1f0e9a2b7d4e61a0c3f5d2b8e9a7c1", 15872, 1)
    assert nodes["exec01"].instance_id is None


# ------------------------------------------------------------------ commands through a bindings double
class FakeStartd:
    def __init__(self, log: list[Any], ad: Any) -> None:
        self.log, self.ad = log, ad

    def drainJobs(self, drain_type: Any, reason: str | None = None, **_: Any) -> str:  # noqa: N802
        self.log.append(("drain", str(self.ad["Machine"]), drain_type, reason))
        return "drain-1"

    def cancelDrainJobs(self, request_id: str | None = None) -> None:  # noqa: N802
        self.log.append(("cancel", str(self.ad["Machine"])))


class FakeCollector:
    def __init__(self, world: FakeCondor) -> None:
        self.world = world

    def query(self, ad_type: Any = None, constraint: str | None = None, projection: Any = None) -> list[Any]:
        if self.world.down:
            raise htcondor2.HTCondorException("Failed to fetch ads from collector")
        pool = self.world.startds if ad_type == htcondor2.AdTypes.Startd else self.world.masters
        if constraint is None:
            return pool
        return [ad for ad in pool if classad2.ExprTree(constraint).eval(ad) is True]

    def locateAll(self, daemon_type: Any) -> list[Any]:  # noqa: N802
        return [classad2.ClassAd({"Name": "schedd@head"})]


class FakeSchedd:
    def __init__(self, world: FakeCondor) -> None:
        self.world = world

    def query(self, constraint: str = "True", projection: Any = ()) -> list[Any]:
        self.world.log.append(("schedd.query", constraint, tuple(projection)))
        if self.world.schedd_down:
            raise htcondor2.HTCondorException("Failed to connect to schedd")
        return [ad for ad in self.world.jobs if classad2.ExprTree(constraint).eval(ad) is True]


class FakeCondor:
    """Stands in for the ``htcondor2`` module: real enums and ClassAds, recorded calls."""

    AdTypes = htcondor2.AdTypes
    DrainTypes = htcondor2.DrainTypes
    DaemonTypes = htcondor2.DaemonTypes

    def __init__(self, daemon_commands: Any = htcondor2.DaemonCommands) -> None:
        self.DaemonCommands = daemon_commands
        self.log: list[Any] = []
        self.down = False
        self.schedd_down = False
        self.exited: set[str] = set()
        """Machines whose master has exited: its address refuses connections."""
        self.send_error: str | None = None
        self.startds = ads("startds.ads")
        self.masters = [classad2.ClassAd({"MyType": "DaemonMaster", "Name": m, "Machine": m,
                                          "MyAddress": f"<10.0.0.{i}:9618?sock=condor_master>"})
                        for i, m in enumerate(sorted({str(a["Machine"]) for a in self.startds}), 1)]
        self.jobs = ads("jobs.ads")

    def Collector(self, pool: str | None = None) -> FakeCollector:  # noqa: N802
        return FakeCollector(self)

    def Schedd(self, ad: Any = None) -> FakeSchedd:  # noqa: N802
        return FakeSchedd(self)

    def Startd(self, ad: Any) -> FakeStartd:  # noqa: N802
        return FakeStartd(self.log, ad)

    def send_command(self, ad: Any, command: Any, target: str | None = None) -> None:
        machine = str(ad["Machine"])
        if ad.get("MyAddress") is None:  # as htcondor2.send_command checks before any I/O
            raise ValueError("Address not available in location ClassAd.")
        if self.send_error:
            raise htcondor2.HTCondorException(self.send_error)
        if machine in self.exited:  # what htcondor2's _send_command raises when nothing listens there
            raise htcondor2.HTCondorException("Unable to connect to the remote daemon.")
        self.log.append(("send_command", machine, int(command), target) if target else
                        ("send_command", machine, int(command)))

    def lose(self, machine: str) -> None:
        """The collector forgets every ad of ``machine`` (a restart, lost updates)."""
        self.startds = [a for a in self.startds if str(a["Machine"]) != machine]
        self.masters = [a for a in self.masters if str(a["Machine"]) != machine]


@pytest.fixture
def condor() -> FakeCondor:
    return FakeCondor()


def test_snapshot_queries_with_projection(condor: FakeCondor) -> None:
    obs = HTCondorBackend(condor).snapshot()
    query = next(e for e in condor.log if e[0] == "schedd.query")
    assert "RequestCpus" in query[2] and "RequestMemory" in query[2]
    assert obs.queued_jobs == 5 + 1 + 1 + 1 and obs.held_jobs == 1 and obs.blocked_jobs == 1
    assert len(obs.nodes) == 10 and obs.warnings


def test_unreachable_collector_is_unavailable(condor: FakeCondor) -> None:
    condor.down = True
    with pytest.raises(BackendUnavailable, match="Failed to fetch ads"):
        HTCondorBackend(condor).snapshot()
    out = HTCondorBackend(condor).execute("offline", "exec01.example.org")
    assert not out.ok and out.transient


def test_add_is_a_no_op(condor: FakeCondor) -> None:
    out = HTCondorBackend(condor).execute("add", "exec11.example.org", cores=4)
    assert out.ok and not out.changed and "by themselves" in out.output and condor.log == []


def test_graceful_drain_type_drains_and_online_cancels(condor: FakeCondor) -> None:
    """``drain_type = "graceful"`` (an operator's choice, it evicts after MaxJobRetirementTime)."""
    b = HTCondorBackend(condor, drain_type="graceful")
    out = b.execute("offline", "exec02.example.org", reason="epu: idle")
    assert out.ok and out.changed
    assert condor.log[-1] == ("drain", "exec02.example.org", htcondor2.DrainTypes.Graceful, "epu: idle")
    # already draining: nothing sent twice
    assert b.execute("offline", "exec05.example.org").changed is False
    assert b.execute("online", "exec05.example.org").changed
    assert condor.log[-1] == ("cancel", "exec05.example.org")
    assert b.execute("online", "exec01.example.org").changed is False


def test_offline_is_a_peaceful_startd_shutdown_never_a_drain_that_evicts(condor: FakeCondor) -> None:
    """Issue 26, defect 2: a graceful drain evicts once MaxJobRetirementTime (default 0) is
    spent. The default offline stops the startd peacefully through its master — DAEMON_OFF_PEACEFUL
    (483) with STARTD, ``condor_off -peaceful -daemon startd`` — which waits for running jobs
    whatever the retirement time. Never a drain, whatever the node runs."""
    b = HTCondorBackend(condor)
    out = b.execute("offline", "exec01.example.org", reason="epu: idle")  # a claimed slot runs 102.0
    assert out.ok and out.changed and "MaxJobRetirementTime" in out.output
    assert condor.log[-1] == ("send_command", "exec01.example.org", 483, "STARTD")
    assert not any(e[0] == "drain" for e in condor.log)
    assert b.execute("offline", "exec01.example.org").ok  # again: the same idempotent command


def test_online_after_a_peaceful_offline(condor: FakeCondor) -> None:
    b = HTCondorBackend(condor)
    refused = b.execute("online", "exec05.example.org")  # Retiring: its jobs still run
    assert not refused.ok and "cannot take that back" in (refused.error or "")
    assert b.execute("online", "exec01.example.org").changed is False  # startd runs normally
    condor.startds = [a for a in condor.startds if str(a["Machine"]) != "exec10.example.org"]  # startd exited
    out = b.execute("online", "exec10.example.org")
    assert out.ok and out.changed and condor.log[-1] == ("send_command", "exec10.example.org", 469, "STARTD")


def test_remove_waits_for_the_master_to_exit_and_answers_ok_only_then(condor: FakeCondor) -> None:
    """Issue 26, defect 1: a peaceful shutdown is answered ok only once the master has exited —
    until then the answer is transient (not remembered, the engine asks again, the VM lives)."""
    b = HTCondorBackend(condor)
    first = b.execute("remove", "exec10.example.org")
    assert not first.ok and first.transient and "in progress" in (first.error or "")
    assert condor.log[-1] == ("send_command", "exec10.example.org", 60015)  # OffPeaceful: children, then itself
    again = b.execute("remove", "exec10.example.org")  # master still advertised
    assert not again.ok and again.transient
    condor.lose("exec10.example.org")  # its ads are gone, but its master still answers
    waiting = b.execute("remove", "exec10.example.org")
    assert not waiting.ok and waiting.transient and "still answers" in (waiting.error or "")
    condor.exited.add("exec10.example.org")  # now nothing listens at its address
    done = b.execute("remove", "exec10.example.org")
    assert done.ok and done.changed and "exited" in done.output


def test_remove_of_a_node_the_collector_lost_is_unknown_never_gone(condor: FakeCondor) -> None:
    """No ads is unknown (a collector restart, an HA switch, lost updates), never "already gone" at
    once (only after ``absent_confirm_seconds`` without an ad or a job: the test below)."""
    out = HTCondorBackend(condor).execute("remove", "exec99.example.org")
    assert not out.ok and out.transient and "unknown" in (out.error or "")
    assert not any(e[0] == "send_command" for e in condor.log)


def test_remove_is_refused_while_the_schedd_lists_a_job_on_a_node_the_collector_lost(condor: FakeCondor) -> None:
    """The draining worker still finishing job 120.0 dropped out of the collector: the schedd's
    ``RemoteHost`` still names it, so the remove is refused (and nothing is sent)."""
    condor.jobs = ads("jobs_on_lost_node.ads")
    b = HTCondorBackend(condor)
    out = b.execute("remove", "exec11")
    assert not out.ok and not out.transient and "120.0" in (out.error or "") and "schedd" in (out.error or "")
    assert "122.0" not in (out.error or "")  # exec110 is another machine
    assert not any(e[0] == "send_command" for e in condor.log)
    forced = b.execute("remove", "exec11", force=True)  # the operator (or a preemption) forces it
    assert forced.ok


def test_remove_with_an_unreadable_schedd_is_transient(condor: FakeCondor) -> None:
    condor.schedd_down = True
    out = HTCondorBackend(condor).execute("remove", "exec10.example.org")
    assert not out.ok and out.transient and "schedd" in (out.error or "")
    assert not any(e[0] == "send_command" for e in condor.log)


@pytest.mark.parametrize("machine", ["exec01.example.org", "exec07.example.org", "exec08.example.org"])
def test_claimed_matched_and_preempting_slots_refuse_remove(condor: FakeCondor, machine: str) -> None:
    condor.jobs = []  # the schedd's answer may lag a match: the slot's state alone refuses
    out = HTCondorBackend(condor).execute("remove", machine)
    assert not out.ok and "claimed/matched/preempting" in (out.error or "")
    assert not any(e[0] == "send_command" for e in condor.log)


def test_condor_connection_errors_are_transient_and_bad_commands_permanent(condor: FakeCondor) -> None:
    """Issue 26, defect 10: an error the daemon may not give next time is transient (not
    remembered under the command id; a re-send runs again)."""
    condor.send_error = "Unable to connect to the remote daemon."
    out = HTCondorBackend(condor).execute("offline", "exec02.example.org")
    assert not out.ok and out.transient
    condor.send_error = "Failed to start command."
    assert HTCondorBackend(condor).execute("offline", "exec02.example.org").transient
    condor.send_error = None
    condor.masters = [classad2.ClassAd({"MyType": "DaemonMaster", "Name": "exec02.example.org",
                                        "Machine": "exec02.example.org"})]  # an ad without an address
    bad = HTCondorBackend(condor).execute("offline", "exec02.example.org")
    assert not bad.ok and not bad.transient and "Address not available" in (bad.error or "")


def test_swapped_command_numbers_are_refused(condor: FakeCondor) -> None:
    swapped = SimpleNamespace(OffPeaceful=htcondor2.DaemonCommands.DaemonsOn,
                              DaemonsOffPeaceful=htcondor2.DaemonCommands.DaemonsOn)
    with pytest.raises(RuntimeError, match="refusing"):
        verified_command(SimpleNamespace(DaemonCommands=swapped), "DaemonsOffPeaceful")
    condor.DaemonCommands = swapped
    out = HTCondorBackend(condor).execute("remove", "exec10.example.org")
    assert not out.ok and "refusing" in (out.error or "")
    assert not any(e[0] == "send_command" for e in condor.log)


def test_installed_bindings_alias_daemon_off_peaceful_to_daemon_on() -> None:
    """The trap the issue warns about, as seen in the installed bindings: never use this member."""
    assert int(htcondor2.DaemonCommands.DaemonsOffPeaceful) == 484
    assert int(htcondor2.DaemonCommands.DaemonOffPeaceful) in (469, 486)


@pytest.mark.parametrize("bad", ['exec01" || true || "', "-f", "a b", "$(id)"])
def test_hostile_names_refused(condor: FakeCondor, bad: str) -> None:
    with pytest.raises(InvalidNodeName):
        HTCondorBackend(condor).execute("offline", bad)
    assert condor.log == []


def test_commands_find_a_machine_by_its_short_name(condor: FakeCondor) -> None:
    """Snapshots name machines ``exec02`` (short); the engine sends commands with that name."""
    b = HTCondorBackend(condor)
    out = b.execute("offline", "exec02", reason="epu: idle")
    assert out.ok and out.changed and condor.log[-1][:2] == ("send_command", "exec02.example.org")
    assert not b.execute("offline", "exec0").ok  # a prefix of another name matches nothing


def test_jobs_grouped_by_text_keep_per_job_ids_waits_and_distinct_requirements() -> None:
    """Jobs are grouped by their ad's text without ClusterId/ProcId/QDate: identical requests
    collapse (count, earliest QDate, first ids in order), but a different Requirements, an
    expression-valued QDate or a plain mapping never merges wrongly."""
    req = '(TARGET.Memory >= RequestMemory) && (TARGET.Arch == "{}")'
    jobs = []
    for i, (arch, qdate) in enumerate([("X86_64", 1795322000), ("X86_64", 1795321000), ("ARM64", 1795322500),
                                       ("X86_64", 1795322900), ("X86_64", 1795322950)]):
        ad = classad2.ClassAd({"ClusterId": 300 + i, "ProcId": 0, "JobStatus": 1, "RequestCpus": 2,
                               "RequestMemory": 1024, "QDate": qdate})
        ad["Requirements"] = classad2.ExprTree(req.format(arch))
        jobs.append(ad)
    jobs[4]["QDate"] = classad2.ExprTree("1795322000 + 950")  # an expression: read from the ad
    jobs.append({"ClusterId": 310, "ProcId": 0, "JobStatus": 1, "RequestCpus": 2, "RequestMemory": 1024,
                 "QDate": 1795320000})  # a plain mapping: its own group, same shape
    out = normalize_jobs(jobs, NOW, template=TEMPLATE)
    by_reason = {s.reason: s for s in out.shapes()}
    idle, unmatched = by_reason["Idle"], by_reason["RequirementsUnmatched"]
    assert (idle.count, idle.sample_job_ids, idle.max_wait_s) == (5, ["300.0", "301.0", "303.0"], NOW - 1795320000)
    assert (unmatched.count, unmatched.sample_job_ids) == (1, ["302.0"])
    assert [j.job_id for j in out.queued] == ["300.0", "301.0", "302.0", "303.0", "304.0", "310.0"]
    assert out.queued[4].submit_time == 1795322950.0 and out.queued[1].wait_seconds == NOW - 1795321000


def test_a_shutdown_sent_before_a_sensor_restart_is_confirmed_after_it(condor: FakeCondor, tmp_path: Path) -> None:
    """The master exits while the sensor is down: its ad is gone, and only the address it had —
    kept in ``shutdown_state_path`` — can confirm it exited. Without it the node would stay unknown."""
    state = tmp_path / "sensor.sqlite3.htcondor-shutdowns.json"
    first = HTCondorBackend(condor, shutdown_state_path=str(state))
    assert first.execute("remove", "exec10.example.org").transient  # shutdown sent, in progress
    condor.lose("exec10.example.org")
    condor.exited.add("exec10.example.org")
    restarted = HTCondorBackend(condor, shutdown_state_path=str(state))
    done = restarted.execute("remove", "exec10.example.org")
    assert done.ok and "exited" in done.output
    assert "exec10" not in HTCondorBackend(condor, shutdown_state_path=str(state)).shutdowns  # forgotten once done
    forgetful = HTCondorBackend(condor)  # memory only: the same node is unknown
    assert forgetful.execute("remove", "exec10.example.org").transient


def test_a_node_with_no_ad_and_no_job_is_gone_after_a_live_startd_would_have_readvertised(condor: FakeCondor) -> None:
    """Issue 33, defect 6: a worker the cloud reclaimed without a drain — its daemons withdrew their
    ads, no shutdown of ours was in flight — was answered "unknown" for every remove, for ever (144
    removes a day for one node; its instance never left the engine's cleanup). No ad is still
    unknown at first (a collector restart looks the same), but a live startd re-advertises every
    UPDATE_INTERVAL: after ``absent_confirm_seconds`` (CLASSAD_LIFETIME, 900 s) with no ad and no job
    in the schedd's list, both of the batch system's views say the node is not there: done."""
    from epu.common.clock import ManualClock

    clock = ManualClock()
    b = HTCondorBackend(condor, clock=clock)
    condor.lose("exec10.example.org")
    first = b.execute("remove", "exec10.example.org")
    assert not first.ok and first.transient and "unknown" in (first.error or "") and "900s" in (first.error or "")
    clock.advance(899.0)
    assert b.execute("remove", "exec10.example.org").transient
    clock.advance(2.0)
    done = b.execute("remove", "exec10.example.org")
    assert done.ok and "no ad" in done.output and "gone" in done.output, done
    assert not any(e[0] == "send_command" for e in condor.log)  # nothing sent to a machine that is gone


def test_any_ad_or_job_starts_the_absence_clock_again(condor: FakeCondor) -> None:
    from epu.common.clock import ManualClock

    clock = ManualClock()
    b = HTCondorBackend(condor, clock=clock, absent_confirm_seconds=600.0)
    condor.jobs = ads("jobs_on_lost_node.ads")  # exec11: no ad, but the schedd runs 120.0 there
    assert not b.execute("remove", "exec11").ok
    clock.advance(700.0)
    assert not b.execute("remove", "exec11").ok  # still its job: refused, never gone
    condor.jobs = []  # the job ended: absent from now on
    assert b.execute("remove", "exec11").transient
    clock.advance(500.0)
    assert b.execute("remove", "exec11").transient
    masters = list(condor.masters)
    condor.masters.append(classad2.ClassAd({"MyType": "DaemonMaster", "Name": "exec11", "Machine": "exec11",
                                            "MyAddress": "<10.0.0.11:9618>"}))  # an ad: it is there after all
    assert b.execute("remove", "exec11").transient  # a peaceful shutdown sent: in progress
    condor.masters = masters
    condor.exited.add("exec11")
    assert b.execute("remove", "exec11").ok  # confirmed the usual way: its master exited


def test_absent_confirm_seconds_comes_from_the_options() -> None:
    b = HTCondorBackend.from_options({"absent_confirm_seconds": 1200, "read_format": "af"})
    assert b.absent_confirm_seconds == 1200.0
    for bad in (0, -5, "soon"):
        with pytest.raises(ValueError, match="absent_confirm_seconds"):
            HTCondorBackend.from_options({"absent_confirm_seconds": bad, "read_format": "af"})
