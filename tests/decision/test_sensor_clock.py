"""A sensor's clock cannot freeze its domain (issue 26, defect 5): snapshots are ordered by the
sensor's own count (incarnation, sequence), aged by when the engine received them, and the clock's
skew is measured and shown — never trusted to order or age anything."""

from __future__ import annotations

import time

import pytest
from epu.common.messages import SensorSnapshot
from epu.services.decision.statusfeed import build_status

from tests.decision.helpers import T0, jobs, make_engine, snapshot


def counted(seq: int, *, at: float, incarnation: str = "run-1", **kw) -> SensorSnapshot:
    return snapshot(at=at, **kw).model_copy(update={"incarnation": incarnation, "sequence": seq})


def test_one_snapshot_from_an_hour_fast_clock_does_not_freeze_the_domain() -> None:
    """The head node's clock ran an hour fast for one read, then NTP stepped it back: every later
    snapshot is newer by the sensor's count, and the 50 queued jobs get launches at once."""
    e, bus, clock = make_engine()
    assert e.on_snapshot(counted(1, at=clock.now() + 3600))
    e.iterate()
    bus.clear()
    clock.advance(30)
    e.on_snapshot(counted(2, at=clock.now(), queued=jobs(50)))
    assert e.latest_snapshot("d").sequence == 2, "the later snapshot is the newest, whatever its taken_at"
    e.iterate()
    assert len(bus.of("instance.launch")) == 10, "launches for the queued jobs (max_nodes 10), not after an hour"


def test_order_is_the_sensors_count_and_a_restart_is_not_older() -> None:
    from epu.services.decision.snaporder import SnapshotOrder

    order = SnapshotOrder()
    assert order.admit(counted(5, at=T0))
    assert not order.admit(counted(4, at=T0 + 99)), "a lower sequence is older whatever its clock"
    assert not order.admit(counted(5, at=T0 + 99)), "the same one again says nothing new"
    assert order.admit(counted(1, at=T0 - 3600, incarnation="run-2")), "a restarted sensor counts from 1"
    assert not order.admit(counted(6, at=T0 + 10)), "the superseded run's snapshot, late in flight"
    assert order.admit(counted(2, at=T0 - 3600, incarnation="run-2"))
    legacy = SnapshotOrder()  # senders older than schema 1.1: no incarnation, ordered by taken_at
    assert legacy.admit(snapshot(at=T0)) and not legacy.admit(snapshot(at=T0 - 1))


def test_a_steady_skew_beyond_the_active_window_does_not_make_snapshots_stale() -> None:
    """A head node whose clock is 10 minutes slow (window 180 s): every snapshot is acted on."""
    from epu.services.decision.snaporder import stale_on_arrival

    assert stale_on_arrival(counted(1, at=T0 - 600), T0, 180.0) is None
    assert stale_on_arrival(snapshot(at=T0 - 600), T0, 180.0) == pytest.approx(600), "a legacy one still is"
    e, bus, clock = make_engine()
    for seq in range(1, 4):
        clock.advance(30)
        e.on_snapshot(counted(seq, at=clock.now() - 600, queued=jobs(3)))
    assert e.is_active("d")
    e.iterate()
    assert len(bus.of("instance.launch")) == 3


def test_skew_is_measured_and_in_the_status() -> None:
    e, _bus, clock = make_engine()
    for seq in range(1, 4):
        clock.advance(30)
        e.on_snapshot(counted(seq, at=clock.now() + 3600.0))
    assert e.skew.skew("d") == pytest.approx(3600.0)
    assert e.snapshot_taken("d") == pytest.approx(clock.now()), "taken_at in the engine's clock"
    e.iterate()
    status = build_status(e, "d", clock.now(), None)
    assert status is not None
    assert status.sensor_skew_seconds == pytest.approx(3600.0)


def test_skew_estimate_takes_the_quickest_transit_and_never_dates_after_arrival() -> None:
    from epu.services.decision.snaporder import ClockSkew

    s = ClockSkew()
    s.observe("d", 1000.0, 1010.0)  # slow transit (10 s) of a clock 0 s off
    s.observe("d", 1020.0, 1020.1)
    assert s.skew("d") == pytest.approx(-0.1)
    assert s.engine_time("d", 1030.0, 1030.05) <= 1030.05


def test_the_status_shows_a_skewed_sensor_clock() -> None:
    from epu.common.messages import EngineStatus
    from epu.services.decision.status import Board, render

    board = Board()
    board.apply(EngineStatus(domain="d", at=time.time(), policy="queue-length", snapshot_at=time.time() + 3600,
                             sensor_skew_seconds=3600.0))
    text = render_text(render(board))
    assert "clock +3600s off" in text and "snapshot 0s ago" in text


def render_text(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()
