"""A simulated process's runtime notices the broker going and coming back with a delay; the two
notices of a short outage may land in either order, and the runtime must end connected with the
broker up, as a real one does (its reconnect loop): ``epu sim --seed 960026 --scenario
native-lost-resume`` left a provisioner unaware for ever — it stopped polling its cloud and 7
records stayed terminating."""

from __future__ import annotations

from epu.sim.bus import Bus
from epu.sim.processes import Proc
from epu.sim.world import World


def proc() -> tuple[World, Bus, Proc]:
    w = World(1)
    bus = Bus(w)
    p = Proc(w, bus, "p")
    p.alive = True
    p.registered = True
    return w, bus, p


def test_a_down_notice_that_lands_after_the_up_notice_ends_reconnected() -> None:
    w, bus, p = proc()
    bus.broker_up = False
    p.broker_changed(False, 5.0)  # noticed late
    bus.broker_up = True
    p.broker_changed(True, 1.0)  # noticed first
    w.run_until(w.t + 1.5)
    assert p.aware, "nothing lost yet as far as it knows"
    w.run_until(w.t + 4.0)
    assert not p.aware, "the loss noticed: the connection died in the outage"
    w.run_until(w.t + 6.0)
    assert p.aware and p.registered and p.running_timers, "reconnected: the broker is up"


def test_a_down_notice_while_the_broker_stays_down_stays_down() -> None:
    w, bus, p = proc()
    bus.broker_up = False
    p.broker_changed(False, 1.0)
    w.run_until(w.t + 20.0)
    assert not p.aware and not p.running_timers
