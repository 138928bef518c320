"""The durable store on SQLite and on the real PostgreSQL server."""

from __future__ import annotations

import threading

import pytest

from common.messages import LaunchRequest
from services.provisioner.store import Store


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> Store:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    s = Store(url)
    yield s
    s.close()


def req(i: int = 1) -> LaunchRequest:
    return LaunchRequest(launch_id=f"l{i}", domain="alpha", site="sim", node_name=f"w{i}", cores=2,
                         attributes={"context_uri": "https://ctx/1"})


def test_launch_is_stored_once(store: Store) -> None:
    rec, t = store.record_launch(req(), 100.0)
    assert t is not None and rec.state == "requested" and rec.seq == 1
    again, t2 = store.record_launch(req(), 101.0)
    assert t2 is None and again.instance_id == "l1"
    assert store.get_launch("l1").attributes == {"context_uri": "https://ctx/1"}
    assert len(store.list()) == 1


def test_transitions_forward_only_timestamped_with_history(store: Store) -> None:
    store.record_launch(req(), 100.0)
    assert store.advance("l1", "pending", 101.0, cloud_id="c-1").record.seq == 2
    assert store.advance("l1", "requested", 102.0) is None
    t = store.advance("l1", "started", 103.0, ip="10.0.0.9")
    assert t.previous == "pending" and t.record.ip == "10.0.0.9" and t.record.cloud_id == "c-1"
    assert store.advance("l1", "pending", 104.0) is None
    store.advance("l1", "terminated", 105.0, reason="done")
    assert store.advance("l1", "failed", 106.0) is None
    hist = store.history("l1")
    assert [(h["from_state"], h["to_state"], h["at"]) for h in hist] == [
        (None, "requested", 100.0), ("requested", "pending", 101.0), ("pending", "started", 103.0),
        ("started", "terminated", 105.0)]
    assert [h["seq"] for h in hist] == [1, 2, 3, 4]
    ev = t.event()
    assert ev.state == "started" and ev.seq == 3 and ev.node_name == "w1" and ev.ip == "10.0.0.9"


def test_racing_writers_each_transition_wins_once(store: Store) -> None:
    for i in range(5):
        store.record_launch(req(i), 100.0)
    wins: list[object] = []
    lock = threading.Lock()

    def racer() -> None:
        for i in range(5):
            for state in ("pending", "started", "terminating", "terminated"):
                t = store.advance(f"l{i}", state, 101.0)
                if t is not None:
                    with lock:
                        wins.append((f"l{i}", state))

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(wins) == len(set(wins))
    for i in range(5):
        seqs = [h["seq"] for h in store.history(f"l{i}")]
        assert seqs == list(range(1, len(seqs) + 1))
        assert store.get(f"l{i}").state == "terminated"


def test_outbox_and_unknown_terminate(store: Store) -> None:
    store.record_launch(req(), 100.0)
    store.advance("l1", "pending", 101.0)
    pending = store.unpublished(200.0)
    assert [(t.record.state, t.record.seq) for t in pending] == [("requested", 1), ("pending", 2)]
    store.mark_published([pending[0].id])
    assert [t.record.state for t in store.unpublished(200.0)] == ["pending"]
    rec, t = store.record_unknown_terminated("ghost", "alpha", 300.0, "unknown")
    assert rec.state == "terminated" and t is not None
    assert store.record_unknown_terminated("ghost", "alpha", 301.0, "unknown")[1] is None
    assert store.counts() == {"pending": 1, "terminated": 1}
