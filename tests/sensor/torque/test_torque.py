"""Torque parsers and commands on outputs captured from a real TORQUE 6.1.3 server."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from epu.services.sensor.backend import BackendUnavailable, InvalidNodeName
from epu.services.sensor.runner import CommandRunner
from epu.services.sensor.states import TORQUE_NODE_STATES
from epu.services.sensor.torque.backend import TorqueBackend
from epu.services.sensor.torque.parse import (
    parse_mem_mb,
    parse_node_jobs,
    parse_nodes_spec,
    parse_pbsnodes,
    parse_qstat,
)

from tests.sensor.torque.replay import ReplayRunner, stdout

NOW = 1795323500.0


def backend(table) -> tuple[TorqueBackend, ReplayRunner]:
    runner = ReplayRunner(table)
    return TorqueBackend(runner, use_pbs_python=False), runner


# ------------------------------------------------------------------ jobs
def test_queue_with_every_request_form_held_array_and_completed() -> None:
    jobs = parse_qstat(stdout("70_qstat_-f_-x_-t"), NOW)
    by_id = {j.job_id: j for j in jobs.queued}
    assert (by_id["5.vm"].nodes, by_id["5.vm"].cores) == (2, 1)      # nodes=2:ppn=1
    assert (by_id["6.vm"].nodes, by_id["6.vm"].cores) == (3, 1)      # procs=3
    assert (by_id["12.vm"].nodes, by_id["12.vm"].cores) == (1, 4)    # nodes=1:ppn=4
    assert by_id["8.vm"].state == "held"                              # qsub -h
    assert [by_id[f"9[{i}].vm"].count for i in (1, 2, 3)] == [1, 1, 1]  # -t: one per element
    assert jobs.running == 2 and jobs.finished == 1                   # 3.vm, 4.vm running; 11.vm C
    assert "11.vm" not in by_id
    assert by_id["5.vm"].queue == "batch" and by_id["5.vm"].submit_time == 1795323181.0
    assert by_id["5.vm"].wait_seconds == NOW - 1795323181.0
    demand = [j for j in jobs.queued if j.state == "queued"]
    assert sum(j.count * j.cores * j.nodes for j in demand) == 2 + 3 + 3 + 4


def test_array_parent_without_t_counts_each_element() -> None:
    jobs = parse_qstat(stdout("70_qstat_-f_-x"), NOW)
    parent = next(j for j in jobs.queued if j.job_id == "9[].vm")
    assert parent.count == 3 and parent.state == "queued"


def test_held_and_completed_after_qhold() -> None:
    jobs = parse_qstat(stdout("75_qstat_-f_-x__held_and_completed"), NOW)
    states = {j.job_id: j.state for j in jobs.queued}
    assert {k for k, v in states.items() if v == "held"} == {"5.vm", "6.vm", "8.vm", "12.vm"}
    assert jobs.finished == 3
    # observed quirk: without -t the array parent still says Q after ``qhold 9[]`` — which is
    # why the backend always reads with -t (elements carry their own state)
    assert states["9[].vm"] == "queued"


def test_multi_node_with_memory_and_dependency_blocked() -> None:
    xml = ("<Data><Job><Job_Id>20.vm</Job_Id><job_state>Q</job_state><queue>batch</queue><qtime>100</qtime>"
           "<Resource_List><nodes>3:ppn=2</nodes><mem>4gb</mem></Resource_List></Job>"
           "<Job><Job_Id>21.vm</Job_Id><job_state>H</job_state><Hold_Types>s</Hold_Types>"
           "<depend>afterok:20.vm@vm</depend><Resource_List><ncpus>8</ncpus></Resource_List></Job>"
           "<Job><Job_Id>22.vm</Job_Id><job_state>W</job_state></Job>"
           "<Job><Job_Id>23.vm</Job_Id><job_state>Z</job_state></Job></Data>")
    jobs = parse_qstat(xml, 200.0)
    by_id = {j.job_id: j for j in jobs.queued}
    # Torque's ``mem`` is the whole job's: 4 GB over 3 nodes is 1366 MB per node
    assert (by_id["20.vm"].nodes, by_id["20.vm"].cores, by_id["20.vm"].memory_mb) == (3, 2, 1366)
    assert (by_id["21.vm"].state, by_id["21.vm"].cores) == ("blocked", 8)
    assert by_id["22.vm"].state == "blocked"
    assert jobs.unknown_states == ["Z"]  # unknown job state: reported, not counted, no crash


@pytest.mark.parametrize(("spec", "expected"), [
    ("1", (1, 1)), ("2:ppn=4", (2, 4)), ("1:ppn=2:bigmem", (1, 2)), ("vm:ppn=2+2:ppn=1", (3, 2)),
    ("host1", (1, 1)), ("", (1, 1)), ("3:ppn=x", (3, 1)),
])
def test_nodes_spec(spec: str, expected: tuple[int, int]) -> None:
    assert parse_nodes_spec(spec) == expected


def test_mem_and_node_jobs() -> None:
    assert parse_mem_mb("7040kb") == 6 and parse_mem_mb("2gb") == 2048 and parse_mem_mb("junk") == 0
    assert parse_node_jobs("0-1/2.vm") == (["2.vm"], 2)
    assert parse_node_jobs("0/3.vm,1/4.vm") == (["3.vm", "4.vm"], 2)


# ------------------------------------------------------------------ nodes: every state in the table
CAPTURED_NODE_STATES = {
    "01_pbsnodes_-x__idle_free": {"vm": ("free", "free", 0)},
    "31_pbsnodes_-x__busy_down": {"vm": ("job-exclusive", "busy", 2), "fakenode": ("down", "down", 0),
                                  "elastic01": ("down,offline,MOM-list-not-sent", "down", 0)},
    "42_pbsnodes_-x__offline": {"vm": ("offline,job-exclusive", "offline", 2), "fakenode": ("down,offline", "down", 0)},
    "44_pbsnodes_-x__after_clear": {"vm": ("job-exclusive", "busy", 2)},
}


@pytest.mark.parametrize("capture", sorted(CAPTURED_NODE_STATES))
def test_captured_node_states(capture: str) -> None:
    nodes = {n.name: n for n in parse_pbsnodes(stdout(capture))}
    for name, (native, normalized, used) in CAPTURED_NODE_STATES[capture].items():
        assert (nodes[name].native_state, nodes[name].state, nodes[name].cores_used) == (native, normalized, used)


def test_offline_node_without_jobs_and_np() -> None:
    xml = stdout("80_pbsnodes_-x__after_daemon_restart")
    nodes = parse_pbsnodes(xml)
    assert nodes and all(n.cores > 0 for n in nodes)


@pytest.mark.parametrize("native", sorted(TORQUE_NODE_STATES))
def test_every_table_state_parses(native: str) -> None:
    xml = f"<Data><Node><name>n1</name><state>{native}</state><np>4</np></Node></Data>"
    (node,) = parse_pbsnodes(xml)
    expected = TORQUE_NODE_STATES[native] or "free"
    assert node.state == expected and node.native_state == native


def test_free_node_with_every_slot_used_is_busy() -> None:
    xml = "<Data><Node><name>n1</name><state>free</state><np>2</np><jobs>0/1.vm,1/2.vm</jobs></Node></Data>"
    assert parse_pbsnodes(xml)[0].state == "busy"


def test_unknown_native_state_becomes_unknown_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    xml = "<Data><Node><name>n1</name><state>free,hibernating</state><np>2</np></Node></Data>"
    warnings: list[str] = []
    with caplog.at_level(logging.WARNING):
        (node,) = parse_pbsnodes(xml, warnings)
    assert node.state == "unknown" and "hibernating" in warnings[0]
    assert "hibernating" in caplog.text


# ------------------------------------------------------------------ snapshot through the CLI path
def test_snapshot_uses_qstat_t_and_pbsnodes_x() -> None:
    b, runner = backend({("qstat", "-f", "-x", "-t"): "70_qstat_-f_-x_-t", ("pbsnodes", "-x"): "70_pbsnodes_-x"})
    obs = b.snapshot()
    assert obs.queued_jobs == 6 and obs.held_jobs == 1 and obs.running_jobs == 2
    assert {n.name: n.state for n in obs.nodes} == {"vm": "busy", "fakenode": "down", "elastic01": "down"}


def test_unreadable_server_is_unavailable_not_empty() -> None:
    b, _ = backend({("qstat", "-f", "-x", "-t"): (1, "", "qstat: cannot connect to server vm (errno=111)")})
    with pytest.raises(BackendUnavailable, match="cannot connect"):
        b.snapshot()
    b, _ = backend({("qstat", "-f", "-x", "-t"): (0, stdout("70_qstat_-f_-x_-t")[:500], ""),
                    ("pbsnodes", "-x"): "70_pbsnodes_-x"})
    with pytest.raises(BackendUnavailable, match="cannot parse"):
        b.snapshot()


# ------------------------------------------------------------------ commands
SCHED_LIST = ("qmgr", "-c", "list server scheduling")
SCHED_TRUE = (0, "Server vm\n\tscheduling = True\n", "")


def test_add_creates_node_and_leaves_scheduling_alone() -> None:
    b, runner = backend({("qmgr", "-c", "create node fakenode np=2"): "03_qmgr_create_node_fakenode_np2",
                         SCHED_LIST: SCHED_TRUE})
    out = b.execute("add", "fakenode", cores=2)
    assert out.ok and out.changed
    assert runner.calls == [("qmgr", "-c", "create node fakenode np=2"), SCHED_LIST]  # never "set server"


def test_add_never_undoes_an_administrators_scheduling_false() -> None:
    b, runner = backend({("qmgr", "-c", "create node fakenode np=2"): "03_qmgr_create_node_fakenode_np2",
                         SCHED_LIST: (0, "Server vm\n\tscheduling = False\n", "")})
    out = b.execute("add", "fakenode", cores=2)
    assert out.ok and "scheduling is False" in out.output
    assert not any("set server" in " ".join(c) for c in runner.calls)


def test_add_existing_node_is_idempotent() -> None:
    b, _ = backend({("qmgr", "-c", "create node fakenode np=2"): "04_qmgr_create_node_fakenode_np2__already_exists",
                    ("pbsnodes", "-x", "fakenode"): "75_pbsnodes_-x__vm_free_others_down",
                    SCHED_LIST: SCHED_TRUE})
    out = b.execute("add", "fakenode", cores=2)
    assert out.ok and not out.changed and "already exists" in out.output


def test_add_of_an_existing_node_with_another_core_count_is_an_error_naming_both() -> None:
    """Issue 26, defect 10: ``fakenode`` exists with np=2 (captured); an add asking 4 cores used to
    answer ok and leave 2 — the engine then counted 4 cores that Torque never schedules."""
    b, runner = backend({("qmgr", "-c", "create node fakenode np=4"): "04_qmgr_create_node_fakenode_np2__already_exists",
                         ("pbsnodes", "-x", "fakenode"): "75_pbsnodes_-x__vm_free_others_down",
                         SCHED_LIST: SCHED_TRUE})
    out = b.execute("add", "fakenode", cores=4, instance_id="5f2a9c")
    assert not out.ok and not out.transient
    assert "np=2" in (out.error or "") and "4 asked" in (out.error or "")
    assert not any("properties" in " ".join(c) for c in runner.calls)  # nothing changed on it


def test_add_carries_the_instance_id_as_a_property_read_back_as_identity() -> None:
    b, runner = backend({("qmgr", "-c", "create node elastic02 np=2"): "50_qmgr_create_node_elastic02_np2",
                         ("qmgr", "-c", "set node elastic02 properties += epu-5f2a9c"): (0, "", ""),
                         SCHED_LIST: SCHED_TRUE})
    out = b.execute("add", "elastic02", cores=2, instance_id="5f2a9c")
    assert out.ok and out.changed and ("qmgr", "-c", "set node elastic02 properties += epu-5f2a9c") in runner.calls
    xml = ("<Data><Node><name>elastic02</name><state>free</state><np>2</np><properties>bigmem,epu-5f2a9c"
           "</properties><gpus>2</gpus><status>opsys=linux,physmem=16323460kb,ncpus=2</status></Node></Data>")
    (n,) = parse_pbsnodes(xml)
    assert (n.instance_id, n.features, n.gpus, n.memory_mb) == ("5f2a9c", ["bigmem"], 2, 15940)


def test_add_unresolvable_is_transient_and_says_to_run_the_context_agent_on_the_head_node() -> None:
    """qmgr resolves the name on the head node and takes no address: a worker the head node
    cannot resolve yet is retried (transient), and the error says what makes names resolve."""
    b, runner = backend({("qmgr", "-c", "create node fakenode np=2"):
                         "02_qmgr_create_node_fakenode_np2__unresolvable_name"})
    out = b.execute("add", "fakenode", cores=2, address="10.0.0.7")
    assert not out.ok and out.transient and "Unknown node" in out.output and "context agent" in (out.error or "")
    assert SCHED_LIST not in runner.calls


def node_xml(state: str, note: str = "") -> tuple[int, str, str]:
    n = f"<note>{note}</note>" if note else ""
    return (0, f"<Data><Node><name>vm</name><state>{state}</state><np>2</np>{n}</Node></Data>", "")


def test_offline_keeps_the_administrators_note_and_online_restores_it() -> None:
    b, runner = backend({("pbsnodes", "-x", "vm"): node_xml("free", "rack 4, PDU B"),
                         ("pbsnodes", "-o", "-N", "rack 4, PDU B [epu: idle 10 min]", "vm"): "40_pbsnodes_-o_vm"})
    assert b.execute("offline", "vm", reason="idle\n10 min").ok
    b, runner = backend({("pbsnodes", "-x", "vm"): node_xml("offline", "rack 4, PDU B [epu: idle 10 min]"),
                         ("pbsnodes", "-c", "-N", "rack 4, PDU B", "vm"): "43_pbsnodes_-c_vm"})
    out = b.execute("online", "vm")
    assert out.ok and out.changed and ("pbsnodes", "-c", "-N", "rack 4, PDU B", "vm") in runner.calls


def test_online_never_clears_an_administrators_maintenance_offline() -> None:
    b, runner = backend({("pbsnodes", "-x", "vm"): node_xml("offline", "disk replacement")})
    out = b.execute("online", "vm")
    assert not out.ok and not out.transient and "administrator" in (out.error or "")
    assert all(c[:2] != ("pbsnodes", "-c") for c in runner.calls)
    # and offlining it again changes nothing, its note stays
    out = b.execute("offline", "vm", reason="scale down")
    assert out.ok and not out.changed and all("-o" not in c for c in runner.calls)


def test_offline_of_a_node_just_created_is_transient() -> None:
    b, _ = backend({("pbsnodes", "-x", "elastic02"): "50_pbsnodes_-x_elastic02__immediately_after_create"})
    out = b.execute("offline", "elastic02")
    assert not out.ok and out.transient and "MOM-list-not-sent" in (out.error or "")


def test_transient_offline_failure_is_not_remembered_and_the_resend_runs() -> None:
    from epu.common.clock import ManualClock
    from epu.common.messages import NodeCommand
    from epu.services.sensor.core import SensorCore
    from epu.services.sensor.dedupe import MemoryCommandLog

    runner = ReplayRunner({("pbsnodes", "-x", "elastic02"): "50_pbsnodes_-x_elastic02__immediately_after_create"})
    b = TorqueBackend(runner, use_pbs_python=False)
    published: list = []
    core = SensorCore("alpha", b, ManualClock(0.0), MemoryCommandLog(), lambda m, c: published.append(m))
    cmd = NodeCommand(command_id="off-1", domain="alpha", action="offline", node="elastic02")
    assert not core.handle(cmd).ok
    runner.table[("pbsnodes", "-x", "elastic02")] = "51_pbsnodes_-x_elastic02__15s_after_create"
    runner.table[("pbsnodes", "-o", "-N", "[epu: offline]", "elastic02")] = (0, "", "")
    again = core.handle(cmd)
    assert again.ok and not again.duplicate


@pytest.mark.parametrize(("action", "capture"), [("offline", "41_pbsnodes_-o_nosuchnode__missing"),
                                                 ("online", "41_pbsnodes_-c_nosuchnode__missing")])
def test_pbsnodes_exit_zero_with_stderr_error_is_a_failure(action: str, capture: str) -> None:
    flag = "-o" if action == "offline" else "-c"
    state = "free" if action == "offline" else "offline"
    note = "" if action == "offline" else "[epu: offline]"
    args = ("pbsnodes", flag, "-N", "[epu: offline]" if action == "offline" else "", "nosuchnode")
    b, _ = backend({("pbsnodes", "-x", "nosuchnode"): (0, node_xml(state, note)[1].replace(">vm<", ">nosuchnode<"), ""),
                    args: capture})
    out = b.execute(action, "nosuchnode")
    assert not out.ok and "Unknown node" in out.output and "exit 0" in (out.error or "")


def test_offline_of_an_unknown_node_fails() -> None:
    b, _ = backend({("pbsnodes", "-x", "nosuchnode"): "41_pbsnodes_nosuchnode__query_missing"})
    out = b.execute("offline", "nosuchnode")
    assert not out.ok and "not known" in (out.error or "")


def test_remove_refuses_a_node_running_jobs_even_forced() -> None:
    b, runner = backend({("pbsnodes", "-x", "vm"): (0, stdout("31_pbsnodes_-x__busy_down"), "")})
    for force in (False, True):
        out = b.execute("remove", "vm", force=force)
        assert not out.ok and "2.vm" in (out.error or "") and "120 s" in (out.error or "")
    assert not any(c[0] == "qmgr" for c in runner.calls)


QSTAT_FULL = ("qstat", "-f", "-x", "-t")


def test_remove_idle_node_and_missing_node() -> None:
    b, runner = backend({("pbsnodes", "-x", "elastic02"): "51_pbsnodes_-x_elastic02__15s_after_create",
                         QSTAT_FULL: "70_qstat_-f_-x_-t",
                         ("qmgr", "-c", "delete node elastic02"): "52_qmgr_delete_node_elastic02"})
    out = b.execute("remove", "elastic02")
    assert out.ok and out.changed
    b, runner = backend({("pbsnodes", "-x", "nosuchnode"): "41_pbsnodes_nosuchnode__query_missing"})
    out = b.execute("remove", "nosuchnode")
    assert out.ok and not out.changed and runner.calls == [("pbsnodes", "-x", "nosuchnode")]


def test_remove_race_deleted_meanwhile_is_success() -> None:
    b, _ = backend({("pbsnodes", "-x", "elastic02"): "51_pbsnodes_-x_elastic02__15s_after_create",
                    QSTAT_FULL: "70_qstat_-f_-x_-t",
                    ("qmgr", "-c", "delete node elastic02"): "53_qmgr_delete_node_elastic02__missing"})
    out = b.execute("remove", "elastic02")
    assert out.ok and not out.changed and "Unknown node" in out.output


def test_remove_is_confirmed_by_the_servers_job_list_not_the_nodes_jobs_attribute() -> None:
    """Issue 26, defect 1 (Torque): the node reads ``free`` with no ``jobs`` (its MOM has not
    reported since a restart, captured 75) while qstat lists 3.vm and 4.vm running on
    ``vm/0``, ``vm/1`` (captured 70): the remove is refused and nothing is deleted."""
    b, runner = backend({("pbsnodes", "-x", "vm"): "75_pbsnodes_-x__vm_free_others_down",
                         QSTAT_FULL: "70_qstat_-f_-x_-t"})
    out = b.execute("remove", "vm")
    assert not out.ok and "3.vm" in (out.error or "") and "4.vm" in (out.error or "")
    assert not any(c[0] == "qmgr" for c in runner.calls)
    # completed jobs keep their exec_host (captured 80): they do not hold the node
    b, runner = backend({("pbsnodes", "-x", "vm"): "75_pbsnodes_-x__vm_free_others_down",
                         QSTAT_FULL: "80_qstat_-x__after_daemon_restart",
                         ("qmgr", "-c", "delete node vm"): (0, "", "")})
    assert b.execute("remove", "vm").ok and ("qmgr", "-c", "delete node vm") in runner.calls
    # an unreadable job list is unknown: transient, nothing deleted
    b, runner = backend({("pbsnodes", "-x", "vm"): "75_pbsnodes_-x__vm_free_others_down",
                         QSTAT_FULL: (0, stdout("70_qstat_-f_-x_-t")[:500], "")})
    cut = b.execute("remove", "vm")
    assert not cut.ok and cut.transient and not any(c[0] == "qmgr" for c in runner.calls)


@pytest.mark.parametrize(("text", "kind"), [
    ("PBS_Server System error: Resource temporarily unavailable", "transient"),
    ("pbsnodes: Server busy. Currently no available threads", "transient"),
    ("qmgr obj=vm svr=default: Batch protocol error", "transient"),
    ("Client connection not found. trqauthd unable to authorize user. Possible transient failure. Please try again",
     "transient"),
    ("Error setting note attribute for nosuchnode - Unknown node ", "permanent"),
    ("qmgr obj=vm svr=default: Unauthorized Request ", "permanent"),
    ("qmgr obj=vm svr=default: Illegal value for np", "permanent"),
])
def test_torque_messages_are_classified_from_its_error_database(text: str, kind: str) -> None:
    from epu.services.sensor.torque.errors import classify

    assert classify(text) == kind


def test_a_system_error_on_offline_is_transient_so_the_resend_runs_again() -> None:
    """Issue 26, defect 10, as seen on a real TORQUE: ``pbsnodes -o`` answered "PBS_Server System
    error: Resource temporarily unavailable" and the failure was remembered for the command id:
    the engine's re-send got the stored failure instead of a retry."""
    from epu.common.clock import ManualClock
    from epu.common.messages import NodeCommand
    from epu.services.sensor.core import SensorCore
    from epu.services.sensor.dedupe import MemoryCommandLog

    args = busy_vm_offline_args()
    table = {("pbsnodes", "-x", "vm"): "70_pbsnodes_-x",
             args: (0, "", "PBS_Server System error: Resource temporarily unavailable")}
    b, runner = backend(table)
    published: list = []
    core = SensorCore("alpha", b, ManualClock(), MemoryCommandLog(), lambda m, c: published.append(m))
    cmd = NodeCommand(command_id="c-1", domain="alpha", action="offline", node="vm",
                      reason="preempted by the cloud: requeue")
    first = core.handle(cmd)
    assert not first.ok and "Resource temporarily unavailable" in (first.error or "")
    table[args] = (0, "", "")  # the server has its resources back
    again = core.handle(cmd)  # the engine's re-send of the same command id
    assert again.ok and not again.duplicate and runner.calls.count(args) == 2


@pytest.mark.parametrize("bad", ["vm; reboot", "-o", "vm np=99", "$(id)", "a'b", "vm\nqmgr", "x" * 254])
def test_hostile_names_never_reach_a_command(bad: str) -> None:
    b, runner = backend({})
    with pytest.raises(InvalidNodeName, match="refusing node name"):
        b.execute("add", bad, cores=1)
    assert runner.calls == []


# ------------------------------------------------------------------ real processes (no shell, timeouts)
def fake_bin(tmp_path: Path, name: str, script: str) -> None:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def test_cli_path_with_real_processes(tmp_path: Path) -> None:
    fixtures = Path(__file__).resolve().parent.parent / "fixtures" / "torque" / "raw"
    fake_bin(tmp_path, "qstat", f'cat "{fixtures}/70_qstat_-f_-x_-t.stdout"\n')
    fake_bin(tmp_path, "pbsnodes", f'cat "{fixtures}/70_pbsnodes_-x.stdout"\n')
    b = TorqueBackend(CommandRunner(timeout=10), bin_dir=str(tmp_path), use_pbs_python=False)
    assert b.snapshot().queued_jobs == 6


def test_command_timeout_is_transient(tmp_path: Path) -> None:
    fake_bin(tmp_path, "pbsnodes", "sleep 5\n")
    b = TorqueBackend(CommandRunner(timeout=0.3), bin_dir=str(tmp_path), use_pbs_python=False)
    out = b.execute("offline", "vm")
    assert not out.ok and out.transient and "timed out" in (out.error or "")


def test_arguments_reach_the_program_verbatim_without_a_shell(tmp_path: Path) -> None:
    log = tmp_path / "argv"
    fake_bin(tmp_path, "pbsnodes", 'if [ "$1" = "-x" ]; then echo "<Data><Node><name>vm</name><state>free</state>'
                                   '</Node></Data>"; exit 0; fi\n'
                                   f'for a in "$@"; do printf "%s|" "$a" >> "{log}"; done\n')
    b = TorqueBackend(CommandRunner(timeout=10), bin_dir=str(tmp_path), use_pbs_python=False)
    assert b.execute("offline", "vm", reason="$(touch pwned) `id` ; rm -rf /").ok
    assert log.read_text() == "-o|-N|[epu: $(touch pwned) `id` ; rm -rf /]|vm|"
    assert not (Path(os.getcwd()) / "pwned").exists()


def test_missing_program_is_unavailable(tmp_path: Path) -> None:
    b = TorqueBackend(CommandRunner(timeout=5), bin_dir=str(tmp_path), use_pbs_python=False)
    with pytest.raises(BackendUnavailable, match="not found"):
        b.snapshot()


# ------------------------------------------------------------------ pbs_python path (module double)
class _Attr:
    def __init__(self, name: str, value: str, resource: str = "", nxt=None) -> None:
        self.name, self.value, self.resource, self.next = name, value, resource, nxt


class _Batch:
    def __init__(self, name: str, attrs: list[tuple[str, str, str]], nxt=None) -> None:
        self.name, self.next = name, nxt
        head = None
        for n, r, v in reversed(attrs):
            head = _Attr(n, v, r, head)
        self.attribs = head


class _FakePbs:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pbs_default(self) -> str:
        return "head"

    def pbs_connect(self, server: str) -> int:
        self.calls.append(f"connect {server}")
        return 3

    def pbs_disconnect(self, conn: int) -> None:
        self.calls.append("disconnect")

    def pbs_statjob(self, conn: int, ids: str, attrs, extend: str):
        self.calls.append(f"statjob extend={extend}")
        return _Batch("1.head", [("job_state", "", "Q"), ("queue", "", "batch"), ("qtime", "", "100"),
                                 ("Resource_List", "nodes", "2:ppn=4")],
                      _Batch("2.head", [("job_state", "", "R")]))

    def pbs_statnode(self, conn: int, ids: str, attrs, extend):
        return _Batch("n1", [("state", "", "job-exclusive"), ("np", "", "4"), ("jobs", "", "0-3/2.head")])


def test_pbs_python_path_gives_the_same_model() -> None:
    from epu.services.sensor.torque.backend import PbsPythonReader

    b, runner = backend({})
    fake = _FakePbs()
    b.pbs_reader = PbsPythonReader(fake)
    obs = b.snapshot()
    assert [(j.job_id, j.nodes, j.cores) for j in obs.jobs] == [("1.head", 2, 4)]
    assert obs.running_jobs == 1 and obs.nodes[0].state == "busy" and obs.nodes[0].jobs == ["2.head"]
    assert runner.calls == [] and fake.calls[-1] == "disconnect" and "statjob extend=t" in fake.calls


def test_pbs_python_failure_falls_back_to_the_cli() -> None:
    from epu.services.sensor.torque.backend import PbsPythonReader

    class Broken(_FakePbs):
        def pbs_connect(self, server: str) -> int:
            return -1

        def error(self) -> str:
            return "15010 Access from host not allowed"

    b, runner = backend({("qstat", "-f", "-x", "-t"): "70_qstat_-f_-x_-t", ("pbsnodes", "-x"): "70_pbsnodes_-x"})
    b.pbs_reader = PbsPythonReader(Broken())
    assert b.snapshot().queued_jobs == 6 and runner.calls


def test_pbs_python_does_not_import_here_and_is_optional() -> None:
    from epu.services.sensor.torque.backend import load_pbs_python

    assert TorqueBackend(ReplayRunner({})).pbs_reader is None or load_pbs_python() is not None


def test_snapshot_cli_for_torque(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from epu.cli import main

    fixtures = Path(__file__).resolve().parent.parent / "fixtures" / "torque" / "raw"
    fake_bin(tmp_path, "qstat", f'cat "{fixtures}/70_qstat_-f_-x_-t.stdout"\n')
    fake_bin(tmp_path, "pbsnodes", f'cat "{fixtures}/70_pbsnodes_-x.stdout"\n')
    assert main(["sensor", "snapshot", "--backend", "torque", "--json", "--option", f"bin_dir={tmp_path}",
                 "--option", "use_pbs_python=false"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["queued_jobs"], doc["queued_cores"], doc["held_jobs"]) == (6, 12, 1)
    assert {n["name"]: (n["state"], n["cores"], n["cores_used"]) for n in doc["nodes"]} == {
        "vm": ("busy", 2, 2), "fakenode": ("down", 2, 0), "elastic01": ("down", 4, 0)}
    assert main(["sensor", "snapshot", "--backend", "torque", "--option", f"bin_dir={tmp_path}"]) == 0
    table = capsys.readouterr().out
    assert "6 queued job(s) needing 12 core(s)" in table and "job-exclusive" in table
    (tmp_path / "qstat").write_text("#!/bin/sh\necho 'cannot connect to server head' >&2\nexit 111\n")
    assert main(["sensor", "snapshot", "--backend", "torque", "--option", f"bin_dir={tmp_path}"]) == 1
    assert "cannot connect" in capsys.readouterr().err


def test_scan_groups_identical_jobs_but_not_different_holds_or_requests() -> None:
    """The scan counts pending jobs under their raw text: identical ones collapse (count,
    earliest qtime, first ids in document order), a dependency, a hold type, an array request
    or an entity-escaped queue name each stay their own."""
    def job(jid: str, state: str, qtime: int, extra: str = "", res: str = "<nodes>1:ppn=2</nodes>") -> str:
        return (f"<Job><Job_Id>{jid}</Job_Id><job_state>{state}</job_state><queue>q&amp;a</queue>{extra}"
                f"<qtime>{qtime}</qtime><Resource_List>{res}</Resource_List></Job>")
    xml = "<Data>" + "".join([
        job("1.vm", "Q", 150), job("2.vm", "Q", 120), job("3.vm", "R", 100), job("4.vm", "Q", 190),
        job("5.vm", "Q", 110),
        job("6.vm", "H", 100, "<Hold_Types>u</Hold_Types>"),
        job("7.vm", "H", 100, "<Hold_Types>s</Hold_Types><depend>afterok:1.vm</depend>"),
        job("8[].vm", "Q", 100, "<job_array_request>1-4</job_array_request>", "<nodes>1:ppn=4</nodes>"),
        job("9.vm", "Q", 100, res="<nodes>2:ppn=2</nodes>")]) + "</Data>"
    out = parse_qstat(xml, 200.0)
    shapes = {s.sample_job_ids[0]: s for s in out.shapes()}
    assert (shapes["1.vm"].count, shapes["1.vm"].sample_job_ids, shapes["1.vm"].max_wait_s) == \
        (4, ["1.vm", "2.vm", "4.vm"], 90.0)
    assert shapes["1.vm"].partition == "q&a"
    assert (shapes["6.vm"].demand, shapes["6.vm"].reason_class) == (False, "held")
    assert shapes["7.vm"].reason != shapes["6.vm"].reason and not shapes["7.vm"].demand
    assert shapes["8[].vm"].count == 4 and shapes["9.vm"].nodes == 2
    assert [j.job_id for j in out.queued] == ["1.vm", "2.vm", "4.vm", "5.vm", "6.vm", "7.vm", "8[].vm", "9.vm"]
    assert out.running == 1


# ------------------------------------------------------------------ requeue (preempted or interrupted nodes)
# pbsnodes outputs are real TORQUE 6.1.3 captures; qrerun's (no capture: no server here) are
# what its client prints: nothing on success, "qrerun: Unknown Job Id 2.vm" (exit 153) for an
# ended job.
def busy_vm_offline_args() -> tuple[str, ...]:
    from epu.services.sensor.torque.backend import epu_note

    return ("pbsnodes", "-o", "-N", epu_note("", "preempted by the cloud: requeue"), "vm")


def test_requeue_offlines_the_node_then_qreruns_each_job_by_argv() -> None:
    b, runner = backend({("pbsnodes", "-x", "vm"): (0, stdout("31_pbsnodes_-x__busy_down"), ""),
                         busy_vm_offline_args(): "40_pbsnodes_-o_vm",
                         ("qrerun", "-f", "2.vm"): (0, "", "")})
    out = b.requeue_jobs("vm", "preempted by the cloud: requeue")
    assert out.ok and out.changed and "requeued 2.vm" in out.output
    assert runner.calls == [("pbsnodes", "-x", "vm"), ("pbsnodes", "-x", "vm"), busy_vm_offline_args(),
                            ("qrerun", "-f", "2.vm")]


def test_requeue_of_a_job_that_ended_meanwhile_is_no_error() -> None:
    b, _ = backend({("pbsnodes", "-x", "vm"): (0, stdout("31_pbsnodes_-x__busy_down"), ""),
                    busy_vm_offline_args(): "40_pbsnodes_-o_vm",
                    ("qrerun", "-f", "2.vm"): (153, "", "qrerun: Unknown Job Id 2.vm\n")})
    out = b.requeue_jobs("vm", "preempted by the cloud: requeue")
    assert out.ok and "not running any more" in out.output


def test_requeue_failure_says_why_and_an_idle_or_unknown_node_needs_none() -> None:
    b, _ = backend({("pbsnodes", "-x", "vm"): (0, stdout("31_pbsnodes_-x__busy_down"), ""),
                    busy_vm_offline_args(): "40_pbsnodes_-o_vm",
                    ("qrerun", "-f", "2.vm"): (159, "", "qrerun: Unauthorized Request  2.vm\n")})
    out = b.requeue_jobs("vm", "preempted by the cloud: requeue")
    assert not out.ok and "qrerun -f 2.vm failed" in (out.error or "") and "Unauthorized" in (out.error or "")
    b, runner = backend({("pbsnodes", "-x", "elastic02"): "51_pbsnodes_-x_elastic02__15s_after_create"})
    assert b.requeue_jobs("elastic02").ok and runner.calls == [("pbsnodes", "-x", "elastic02")]
    b, _ = backend({("pbsnodes", "-x", "nosuchnode"): "41_pbsnodes_nosuchnode__query_missing"})
    assert b.requeue_jobs("nosuchnode").ok


def test_requeue_refuses_a_job_id_that_is_not_one() -> None:
    evil = stdout("31_pbsnodes_-x__busy_down").replace("0-1/2.vm", "0-1/-f;rm")
    b, runner = backend({("pbsnodes", "-x", "vm"): (0, evil, "")})
    out = b.requeue_jobs("vm")
    assert not out.ok and "refusing job id" in (out.error or "")
    assert all(c[0] != "qrerun" for c in runner.calls)


def test_a_preempted_torque_nodes_remove_requeues_first() -> None:
    """The sensor's command path: remove with ``requeue`` calls requeue_jobs, then the remove."""
    from epu.services.sensor.backend import JobRequeuer

    assert isinstance(TorqueBackend(ReplayRunner({}), use_pbs_python=False), JobRequeuer)
