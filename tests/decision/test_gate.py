"""The engine's one door (``services/decision/gate.py``): no other module builds or publishes a
command, the rule table holds back what may not leave, and the defects that had their own doors
(issue 33: a report overtaking a reopen event, observe mode acting) stay fixed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from epu.common.messages import InstanceReport, PolicyChange, TerminateRequest
from epu.common.retire import Proof, RetireReason
from epu.services.decision import gate
from epu.services.decision.gate import Authority, Outgoing, proof_of, terminate_request, verdict

from tests.decision.helpers import config, event, inst, jobs, make_engine, node, snapshot

DECISION = Path(gate.__file__).parent
COMMANDS = {"LaunchRequest", "TerminateRequest", "NodeCommand"}
#: Modules that may publish, and what: the engine its decision records, the control module its
#: answers to operators, the status feed the engine's status. None of them a command.
PUBLISHERS = {"engine.py", "control.py", "statusfeed.py", "gate.py"}


def _calls(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            out.append((name, n.lineno))
    return out


def test_no_module_but_the_gate_builds_or_publishes_a_command() -> None:
    offenders = []
    for path in sorted(DECISION.rglob("*.py")):
        rel = path.relative_to(DECISION).as_posix()
        calls = _calls(ast.parse(path.read_text()))
        if rel != "gate.py":
            offenders += [f"{rel}:{line} builds {name}" for name, line in calls if name in COMMANDS]
            offenders += [f"{rel}:{line} calls publish_many" for name, line in calls if name == "publish_many"]
        if rel not in PUBLISHERS:
            offenders += [f"{rel}:{line} publishes" for name, line in calls if name == "publish"]
    assert offenders == []


def test_the_check_finds_a_second_door(tmp_path: Path) -> None:
    """The test above is not hollow: a module building a terminate is found."""
    src = "from epu.common.messages import TerminateRequest\nTerminateRequest(request_id='x')\n"
    assert ("TerminateRequest", 2) in _calls(ast.parse(src))


# ---------------------------------------------------------------------------- the table


def _out(msg, *, mode="act", instance=None, authority=Authority.POLICY) -> Outgoing:
    return Outgoing("d", msg, authority, mode, instance)


def test_each_rule_holds_back_what_it_names() -> None:
    unknown = inst("u", "pending")
    known = inst("k", "joined", joined_at=1.0)
    removed = inst("r", "draining", joined_at=1.0, removed=True)
    ok = terminate_request(removed, RetireReason.SCALE_DOWN, Proof.REMOVED, "drained")
    assert verdict(_out(ok, instance=removed)) is None
    assert verdict(_out(ok, instance=removed, mode="observe"))[0] == "observe"
    forced = terminate_request(known, RetireReason.OPERATOR, Proof.FORCED, "x")
    assert verdict(_out(forced, instance=known))[0] == "engine never forces"
    lost_unstarted = terminate_request(unknown, RetireReason.LOST, Proof.UNSTARTED, "x")
    assert verdict(_out(lost_unstarted, instance=unknown))[0] == "reason allows proof"
    plain = terminate_request(known, RetireReason.SCALE_DOWN, Proof.REMOVED, "x")
    assert verdict(_out(plain, instance=known)) == ("proof holds", "proof 'removed' but the sensor has not "
                                                                   "confirmed the node's removal")
    unstarted = terminate_request(known, RetireReason.STALLED, Proof.UNSTARTED, "x")
    assert verdict(_out(unstarted, instance=known))[0] == "proof holds"
    untyped = TerminateRequest(request_id="a", instance_id="k", domain="d")
    assert verdict(_out(untyped, instance=known))[0] == "reason allows proof"
    ended = terminate_request(known, RetireReason.ENDED, Proof.BOOKKEEPING, "x")
    assert verdict(_out(ended, instance=known)) is None  # bookkeeping never destroys a started VM
    assert proof_of(removed) == Proof.REMOVED and proof_of(unknown) == Proof.UNSTARTED and proof_of(known) is None


# ---------------------------------------------------------------------------- defect 1


def _reopened_fixture():
    """A launch that joined the batch system by itself after its create's answer was lost: closed
    ``failed`` here, reopened by the provisioner (seq 3) because the cloud lists its node alive."""
    e, bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 10, "sites": ["s1"],
                                                          "params": {"idle_seconds": 600}}}))
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    e.on_instance_event(event(launch, "pending", 1, clock.now()))
    e.on_instance_event(event(launch, "failed", 2, clock.now(), error_kind="transient", reason="503"))
    bus.clear()
    return e, bus, clock, launch


def _report(clock, *entries):
    return InstanceReport(domain="d", as_of=clock.now(), horizon_seconds=3600, instances=list(entries))


def test_a_report_that_overtakes_the_reopen_event_takes_the_instance_back_and_never_terminates() -> None:
    """Issue 33, defect 1: the report's entry (live, seq 3, no ``previous``) reached the engine
    before the reopen event; the engine raised its failed row's seq, dropped the reopen as stale,
    and on the next report sent a plain terminate for a node running a job — on every report."""
    e, bus, clock, launch = _reopened_fixture()
    busy = node(launch.node_name, "busy", used=1, jobs_=["j0"])
    entry = event(launch, "started", 3, clock.now(), ip="10.0.0.9")
    for _ in range(3):  # the periodic reports, then the delayed reopen event itself
        e.handle_input(_report(clock, entry))
        clock.advance(30)
        e.on_snapshot(snapshot(nodes=[busy], at=clock.now()))
        e.iterate()
    e.on_instance_event(entry.model_copy(update={"previous": "failed"}))
    for _ in range(20):
        e.handle_input(_report(clock, entry))
        clock.advance(30)
        e.on_snapshot(snapshot(nodes=[busy], at=clock.now()))
        e.iterate()
    assert bus.of("instance.terminate") == []
    i = e.store.instance(launch.launch_id)
    assert i.state in ("started", "joined") and i.ip == "10.0.0.9"


def test_a_record_older_than_the_end_here_is_closed_by_bookkeeping_terminates_bounded_in_number() -> None:
    e, bus, clock, launch = _reopened_fixture()
    old = event(launch, "pending", 1, clock.now())  # a restored store's record: before the failure
    terms = []
    for _ in range(120):  # an hour of reports every 30 s
        e.handle_input(_report(clock, old))
        clock.advance(30)
        e.on_snapshot(snapshot(at=clock.now()))
        e.iterate()
        terms += bus.of("instance.terminate")
        bus.clear()
    assert terms and all(t.proof == Proof.BOOKKEEPING and t.retire == RetireReason.ENDED and t.unless_started
                         and not t.force for t in terms)
    # asked every 10 x resend_seconds (spread ±50 %), the n-th ask as min(n, 3) copies
    assert len({t.request_id for t in terms}) == len(terms) <= 3 * (3600 // (5 * e.settings.resend_seconds) + 1)
    assert len(terms) <= 40
    assert e.store.instance(launch.launch_id).state == "failed"


# ---------------------------------------------------------------------------- defect 3


def _set_mode(e, mode: str, n: int) -> None:
    out = e.control.on_policy_change(PolicyChange(change_id=f"m{n}", domain="d", mode=mode, operator="ops"))
    assert out.applied, out.reason


def test_observe_mode_sends_nothing_by_any_path() -> None:
    """Issue 33, defect 3: only the planner's output was shadowed — launches stored before the
    switch were re-sent, terminates asked again, and a report's stale record answered."""
    e, bus, clock = make_engine(cfg=config(resend_seconds=10))
    bus_fail = True

    def publish_many(msgs):  # the first burst is lost: its intents stay open
        if bus_fail:
            raise ConnectionError("broker gone")
        for m in msgs:
            bus(m)

    e.publish_many = publish_many
    e.on_snapshot(snapshot(queued=jobs(3)))
    e.iterate()
    (first, second, third) = [e.store.instance(a["action_id"]) for a in e.store.actions("d", "launch")]
    e.on_instance_event(event(_launch(first), "terminating", 3, clock.now()))  # answered, never finished
    e.on_instance_event(event(_launch(second), "failed", 4, clock.now()))
    _set_mode(e, "observe", 1)
    bus_fail = False
    bus.clear()
    for _ in range(30):  # 300 s: the terminate is due again (100 s), the launches re-sent (10 s)
        e.handle_input(_report(clock, event(_launch(second), "pending", 1, clock.now())))  # a stale record
        clock.advance(10)
        e.on_snapshot(snapshot(queued=jobs(5), at=clock.now()))
        e.iterate()
    commands = [m for m in bus.sent if m.TYPE in ("instance.launch", "instance.terminate", "node.command")]
    assert commands == []
    assert e.gate.held[("d", "launch", "observe")] > 0
    # back to act: what was held leaves (same ids), nothing was lost
    _set_mode(e, "act", 2)
    clock.advance(10)
    e.on_snapshot(snapshot(queued=jobs(3), at=clock.now()))
    e.iterate()
    assert third.instance_id in {m.launch_id for m in bus.of("instance.launch")}


def _launch(i):
    from epu.common.messages import LaunchRequest

    return LaunchRequest(launch_id=i.instance_id, domain=i.domain, site=i.site, node_name=i.node_name, cores=i.cores)


def test_an_observe_shadow_record_is_published_when_the_plan_changes_not_every_iteration() -> None:
    e, bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 10, "sites": ["s1"], "mode": "observe"}}))
    for n in range(20):
        clock.advance(5)
        e.on_snapshot(snapshot(queued=jobs(2 if n < 10 else 4), at=clock.now()))
        e.iterate()
    records = bus.of("decision.record")
    assert [len(r.actions) for r in records] == [2, 4] and all(r.shadow for r in records)
    assert bus.of("instance.launch") == []


def test_an_operators_retire_in_observe_mode_is_refused_with_the_reason(caplog) -> None:
    e, bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 10, "sites": ["s1"]}}))
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    _set_mode(e, "observe", 1)
    out = e.control.on_policy_change(PolicyChange(change_id="r", domain="d", retire=[launch.launch_id],
                                                  operator="alice"))
    assert not out.applied and "observe mode" in out.reason
    both = e.control.on_policy_change(PolicyChange(change_id="r2", domain="d", retire=[launch.launch_id],
                                                   mode="act", operator="alice"))
    assert both.applied
    i = e.store.instance(launch.launch_id)
    assert i.retire == RetireReason.OPERATOR and i.reason == "retired by alice"
    # the terminate that follows leaves on the operator's authority, naming the operator
    bus.clear()
    with caplog.at_level("INFO", logger="epu.decision"):
        clock.advance(5)
        e.on_snapshot(snapshot(at=clock.now()))
        e.iterate()
    (term,) = bus.of("instance.terminate")
    assert (term.retire, term.proof) == (RetireReason.OPERATOR, Proof.UNSTARTED)
    sent = [r for r in caplog.records if r.getMessage() == "command sent"]
    assert [(r.authority, r.operator) for r in sent] == [("operator", "retired by alice")]
    assert e.gate.counts[("d", "terminate", "operator")] == 1


@pytest.mark.parametrize("authority", list(Authority))
def test_authority_values_are_stable(authority: Authority) -> None:
    assert Authority(authority.value) is authority
