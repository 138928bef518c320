"""Slurm node commands against captured ``scontrol``/``squeue`` text (22.05): remove confirmed by
the controller's job list, errors classified from Slurm's error table, a mismatched add refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from epu.services.sensor.slurm.backend import ON_NODE_STATES, SlurmBackend
from epu.services.sensor.slurm.errors import classify

from tests.sensor.torque.replay import ReplayRunner

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
SHOW = ("scontrol", "show", "node", "el1", "--future", "--all")
SQUEUE = ("squeue", "--all", "-h", "-w", "el1", "-t", ON_NODE_STATES, "-o", "%i")


def show_node(state: str, alloc: int = 0, cpus: int = 2) -> tuple[int, str, str]:
    """The captured ``scontrol show node`` text of a 22.05 node, as pool slot ``el1``."""
    text = (FIXTURES / "scontrol_show_node_node2.txt").read_text()
    text = text.replace("NodeName=node2", "NodeName=el1").replace("CPUAlloc=2", f"CPUAlloc={alloc}")
    text = text.replace("CPUTot=2", f"CPUTot={cpus}").replace("State=ALLOCATED+DRAIN", f"State={state}")
    return 0, text, ""


def backend(table: dict) -> tuple[SlurmBackend, ReplayRunner]:
    runner = ReplayRunner(table)
    return SlurmBackend(runner, settle_seconds=0), runner


def test_remove_is_refused_while_squeue_lists_a_job_on_an_idle_looking_node() -> None:
    """Issue 26, defect 1 (Slurm): a suspended job releases its CPUs (CPUAlloc=0, the node reads
    IDLE) but still lives on the node: the controller's job list (squeue -w) refuses the remove."""
    b, runner = backend({SHOW: show_node("IDLE+CLOUD+DRAIN"), SQUEUE: (0, "4242\n", "")})
    out = b.execute("remove", "el1")
    assert not out.ok and not out.transient and "4242" in (out.error or "") and "squeue" in (out.error or "")
    assert not any(c[:2] == ("scontrol", "update") for c in runner.calls)


def test_remove_with_no_job_on_the_node_powers_it_down() -> None:
    b, runner = backend({SHOW: show_node("IDLE+CLOUD+DRAIN"), SQUEUE: (0, "", ""),
                         ("scontrol", "update", "NodeName=el1", "State=POWER_DOWN"): (0, "", ""),
                         ("scontrol", "update", "NodeName=el1", "State=DRAIN", "Reason=epu: removed"): (0, "", "")})
    out = b.execute("remove", "el1")
    assert out.ok and out.changed and runner.calls.index(SQUEUE) < runner.calls.index(
        ("scontrol", "update", "NodeName=el1", "State=POWER_DOWN"))


def test_remove_with_an_unreadable_job_list_is_transient() -> None:
    b, runner = backend({SHOW: show_node("IDLE+CLOUD+DRAIN"),
                         SQUEUE: (1, "", "squeue: error: Unable to contact slurm controller (connect failure)")})
    out = b.execute("remove", "el1")
    assert not out.ok and out.transient
    assert not any(c[:2] == ("scontrol", "update") for c in runner.calls)


def test_a_controller_failure_during_an_update_is_transient() -> None:
    """Issue 26, defect 10: a failed ``scontrol update`` whose text says the controller could not
    be reached was remembered as permanent (only a local time-out counted as transient)."""
    b, _ = backend({SHOW: show_node("IDLE+CLOUD"),
                    ("scontrol", "update", "NodeName=el1", "State=DRAIN", "Reason=epu: offline"):
                        (1, "", "slurm_update error: Unable to contact slurm controller (connect failure)")})
    out = b.execute("offline", "el1")
    assert not out.ok and out.transient
    b, _ = backend({SHOW: show_node("IDLE+CLOUD"),
                    ("scontrol", "update", "NodeName=el1", "State=DRAIN", "Reason=epu: offline"):
                        (1, "", "slurm_update error: Access/permission denied")})
    refused = b.execute("offline", "el1")
    assert not refused.ok and not refused.transient


def test_add_of_an_existing_node_with_another_cpu_count_is_an_error_naming_both() -> None:
    """Issue 26, defect 10: adding ``el1`` for a 4-core instance to a 2-CPU slot answered ok and
    left 2 CPUs: Slurm then never runs a 4-core job there, while the engine counts 4."""
    b, runner = backend({SHOW: show_node("IDLE+CLOUD+DRAIN+POWERED_DOWN")})
    out = b.execute("add", "el1", cores=4, instance_id="i-1")
    assert not out.ok and "2 CPU(s)" in (out.error or "") and "4 asked" in (out.error or "")
    assert runner.calls == [SHOW]  # nothing changed on the slot


@pytest.mark.parametrize(("text", "command", "kind"), [
    ("slurm_update error: Unable to contact slurm controller (connect failure)", "", "transient"),
    ("squeue: error: Socket timed out on send/recv operation", "", "transient"),
    ("scontrol: error: Slurm backup controller in standby mode", "", "transient"),
    ("scontrol: error: Rate limit exceeded, please retry momentarily", "", "transient"),
    ("slurm_update error: Invalid node state specified", "", "permanent"),
    ("scontrol: error: Invalid job id specified for job 7", "requeue", "already"),
    ("scontrol: error: Invalid node name specified", "delete", "already"),
])
def test_slurm_messages_are_classified_from_its_error_table(text: str, command: str, kind: str) -> None:
    assert classify(text, command) == kind


# ---------------------------------------------------------------- native mode (issue 35)


def native(table: dict) -> tuple[SlurmBackend, ReplayRunner]:
    runner = ReplayRunner(table)
    return SlurmBackend(runner, settle_seconds=0, native=True), runner


GIVE_BACK = ("scontrol", "update", "NodeName=el1", "State=POWER_DOWN_FORCE", "Reason=epu: cannot serve: max_nodes")


def test_give_back_powers_down_a_node_powering_up() -> None:
    b, runner = native({SHOW: show_node("ALLOCATED+CLOUD+POWERING_UP", alloc=2), GIVE_BACK: (0, "", "")})
    out = b.execute("give_back", "el1", reason="epu: cannot serve: max_nodes")
    assert out.ok and runner.calls[-1] == GIVE_BACK


def test_give_back_of_a_node_that_is_up_is_refused() -> None:
    b, runner = native({SHOW: show_node("ALLOCATED+CLOUD", alloc=2)})
    out = b.execute("give_back", "el1", reason="x")
    assert not out.ok and "not powering up" in (out.error or "")
    assert runner.calls == [SHOW], "a node that is up may run the job: never powered down"


def test_give_back_outside_native_mode_is_refused() -> None:
    b, runner = backend({SHOW: show_node("ALLOCATED+CLOUD+POWERING_UP", alloc=2)})
    out = b.execute("give_back", "el1", reason="x")
    assert not out.ok and "native" in (out.error or "") and runner.calls == [SHOW]


HOLD = ("scontrol", "update", "NodeName=el1", "State=DRAIN",
        "Reason=epu: held until its instance ends: stalled: not joined")


def test_native_remove_holds_the_slot_until_its_instance_ends() -> None:
    """Native mode: a removed slot is powered down and held (DRAIN, EPU's reason, the identity
    written): schedulable while its machine still ran, Slurm powered it up for a job, the machine's
    slurmd answered, and the destroy killed the job (``--seed 950014 --scenario native-spot-loss``)."""
    b, runner = native({SHOW: show_node("IDLE+CLOUD"), SQUEUE: (0, "", ""),
                        ("scontrol", "update", "NodeName=el1", "State=POWER_DOWN"): (0, "", ""),
                        HOLD: (0, "", ""),
                        ("scontrol", "update", "NodeName=el1", "Comment=epu:instance=i-1"): (0, "", "")})
    out = b.execute("remove", "el1", reason="stalled: not joined", instance_id="i-1")
    assert out.ok
    assert runner.calls[-3:] == [("scontrol", "update", "NodeName=el1", "State=POWER_DOWN"), HOLD,
                                 ("scontrol", "update", "NodeName=el1", "Comment=epu:instance=i-1")]


def test_native_remove_of_a_slot_already_powered_down_holds_it_too() -> None:
    """The seed's own case: the replacement's slot was powered down already when it was removed."""
    b, runner = native({SHOW: show_node("IDLE+CLOUD+POWERED_DOWN"), SQUEUE: (0, "", ""), HOLD: (0, "", ""),
                        ("scontrol", "update", "NodeName=el1", "Comment=epu:instance=i-1"): (0, "", "")})
    assert b.execute("remove", "el1", reason="stalled: not joined", instance_id="i-1").ok
    assert HOLD in runner.calls
    assert not any("POWER_DOWN" in c for call in runner.calls for c in call)


def held_node(state: str, reason: str = "epu: held until its instance ends: removed") -> tuple[int, str, str]:
    code, text, err = show_node(state)
    text = text.replace("Reason=epu: scale down", f"Reason={reason}")
    return code, text.replace("   Reason=", "   Comment=epu:instance=i-1\n   Reason=", 1), err


def test_release_lifts_epus_hold_and_forgets_the_identity() -> None:
    b, runner = native({SHOW: held_node("IDLE+CLOUD+DRAIN+POWERED_DOWN"),
                        ("scontrol", "update", "NodeName=el1", "State=UNDRAIN"): (0, "", ""),
                        ("scontrol", "update", "NodeName=el1", "Comment="): (0, "", "")})
    out = b.execute("release", "el1", instance_id="i-1")
    assert out.ok and out.changed
    assert runner.calls[1:] == [("scontrol", "update", "NodeName=el1", "State=UNDRAIN"),
                                ("scontrol", "update", "NodeName=el1", "Comment=")]


def test_release_never_lifts_an_administrators_drain() -> None:
    b, runner = native({SHOW: held_node("IDLE+CLOUD+DRAIN+POWERED_DOWN", reason="bad dimm, ticket 12"),
                        ("scontrol", "update", "NodeName=el1", "Comment="): (0, "", "")})
    assert b.execute("release", "el1").ok
    assert not any("UNDRAIN" in c for call in runner.calls for c in call)


def test_native_add_waits_while_the_slot_is_held_for_another_instance() -> None:
    """A replacement under the same name is not added (undrained, powered up) while the slot is
    held for the machine before it: transient, so the engine adds it again after the release."""
    b, runner = native({SHOW: held_node("IDLE+CLOUD+DRAIN+POWERED_DOWN")})
    out = b.execute("add", "el1", cores=2, address="10.0.0.9", instance_id="i-2")
    assert not out.ok and out.transient and "held for instance i-1" in (out.error or "")
    assert runner.calls == [SHOW]


def test_a_late_release_never_lifts_the_hold_of_a_later_instance() -> None:
    """A release re-sent from a stale snapshot names the instance the slot was held for then; the
    slot now held for i-1 stays held when the release names i-0."""
    b, runner = native({SHOW: held_node("IDLE+CLOUD+DRAIN+POWERED_DOWN")})
    out = b.execute("release", "el1", instance_id="i-0")
    assert out.ok and not out.changed and "held for instance i-1" in out.output
    assert runner.calls == [SHOW]


def test_release_outside_native_mode_is_refused() -> None:
    b, runner = backend({SHOW: held_node("IDLE+CLOUD+DRAIN+POWERED_DOWN")})
    out = b.execute("release", "el1")
    assert not out.ok and "native" in (out.error or "") and runner.calls == [SHOW]


def test_native_remove_is_refused_while_a_job_is_on_the_node() -> None:
    b, runner = native({SHOW: show_node("IDLE+CLOUD+POWERING_DOWN"), SQUEUE: (0, "4242\n", "")})
    out = b.execute("remove", "el1")
    assert not out.ok and "4242" in (out.error or "")


def test_native_mode_shows_powered_down_nodes_unless_told_otherwise() -> None:
    """The engine types a resumed node by its features in a snapshot: in native mode every CLOUD
    node is in each snapshot by default (an explicit include_powered_down = false still wins)."""
    assert SlurmBackend.from_options({"native": True}).include_powered_down
    assert not SlurmBackend.from_options({"native": True, "include_powered_down": False}).include_powered_down
    assert not SlurmBackend.from_options({}).include_powered_down
