"""The durable store on SQLite and on the real PostgreSQL server."""

from __future__ import annotations

import threading

import pytest
from epu.common.db import make_engine
from epu.common.messages import LaunchRequest
from epu.services.provisioner.records import DestroyRecord
from epu.services.provisioner.store import IdentityError, Miss, Sighting, Store

from epu.sim.provisioner_memstore import MemoryStore


@pytest.fixture(params=["sqlite", "memory", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> Store:
    """Every store test runs on SQLite, on PostgreSQL and on the simulators' in-memory store
    (``memstore.MemoryStore``, which must behave exactly as the SQL store does)."""
    if request.param == "memory":
        s: Store = MemoryStore()  # type: ignore[assignment]
    else:
        s = Store(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))
    yield s
    s.close()


def reopen(store: Store) -> Store:
    """A second handle on the same database (another provisioner process on one store)."""
    if isinstance(store, MemoryStore):
        return MemoryStore(store.db)  # type: ignore[return-value]
    return Store(store.url)


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
    rec, t = store.record_found("ghost", "alpha", "terminating", 300.0, "unknown")
    assert rec.state == "terminating" and rec.site == "" and t is not None
    assert store.record_found("ghost", "alpha", "started", 301.0, "unknown")[1] is None  # recorded once
    assert store.counts() == {"pending": 1, "terminating": 1}
    store.set_cloud_fields("ghost", cloud_id="c-9", site="cloud-a")
    found = store.get("ghost")
    assert found is not None and (found.site, found.cloud_id) == ("cloud-a", "c-9")


def test_presumed_gone_is_a_flag_with_its_own_seq_and_survives_the_outbox(store: Store) -> None:
    store.record_launch(req(), 100.0)
    store.advance("l1", "started", 101.0, cloud_id="c-1")
    gone = store.note_presence("l1", True, 102.0, "presumed gone: not listed")
    assert gone.record.state == "started" and gone.previous == "started" and gone.record.seq == 3
    assert gone.event().presumed_gone and store.get("l1").presumed_gone_at == 102.0
    assert store.note_presence("l1", True, 103.0, "again") is None  # nothing to change
    back = store.note_presence("l1", False, 104.0, "listed again: re-adopted")
    assert not back.event().presumed_gone and back.record.seq == 4
    store.note_presence("l1", True, 105.0, "presumed gone again")
    # the outbox re-announces each transition as it was, flag included
    flags = [(t.record.seq, t.record.state, t.event().presumed_gone) for t in store.unpublished(1000.0)]
    assert flags == [(1, "requested", False), (2, "started", False), (3, "started", True), (4, "started", False),
                     (5, "started", True)]
    # a terminate supersedes the presumption; terminal records take no flag
    t = store.advance("l1", "terminating", 106.0)
    assert t.record.presumed_gone_at is None and not t.event().presumed_gone
    store.advance("l1", "terminated", 107.0)
    assert store.note_presence("l1", True, 108.0, "x") is None


def test_a_failed_record_is_reopened_once_with_the_next_seq_and_the_outbox_says_so(store: Store) -> None:
    """Issue 26, defect 6: the one move backwards, ``failed`` → the state the cloud shows."""
    store.record_launch(req(), 100.0)
    store.advance("l1", "failed", 101.0, reason="transient: 503", error_kind="transient")
    other = reopen(store)
    t = store.reopen("l1", "started", 102.0, "reopened: listed running", cloud_id="c-1", ip="10.0.0.9")
    assert t is not None and t.previous == "failed" and t.record.seq == 3
    rec = store.get("l1")
    assert (rec.state, rec.cloud_id, rec.ip, rec.error_kind) == ("started", "c-1", "10.0.0.9", None)
    assert other.reopen("l1", "started", 103.0, "again", cloud_id="c-1") is None  # not failed any more
    assert store.active_count("sim") == 1
    evt = [x for x in store.unpublished(1000.0) if x.record.seq == 3][0].event()
    assert (evt.previous, evt.state) == ("failed", "started")
    with pytest.raises(ValueError, match="pending or started"):
        store.reopen("l1", "joined", 104.0, "x", cloud_id="c-1")
    if other is not store:
        other.close()


def test_a_reopened_record_keeps_the_seq_of_its_reopening(store: Store) -> None:
    """Issue 33: every event and report entry from the reopening on says so (``reopened_seq``);
    the outbox's copy of an older transition does not."""
    store.record_launch(req(), 100.0)
    store.advance("l1", "failed", 101.0, reason="transient: 503", error_kind="transient")
    t = store.reopen("l1", "pending", 102.0, "reopened: listed pending", cloud_id="c-1")
    assert t is not None and t.record.reopened_seq == 3 and t.event().reopened_seq == 3
    assert store.get("l1").event().previous == "failed"  # a report entry: the reopening is its latest move
    t = store.advance("l1", "started", 103.0, reason="node running")
    assert t is not None and t.event().reopened_seq == 3 and t.event().previous == "pending"
    rec = store.get("l1")
    assert (rec.reopened_seq, rec.event().reopened_seq, rec.event().previous) == (3, 3, None)
    events = {x.record.seq: x.event() for x in store.unpublished(1000.0)}
    assert events[2].reopened_seq is None and events[3].reopened_seq == 3 and events[4].reopened_seq == 3


def test_the_proof_of_a_terminate_and_the_destroy_ledger(store: Store) -> None:
    """A record keeps the proof of the terminate that moved it to ``terminating``; every destroy
    call is kept in the ledger, oldest first, by instance or node."""
    store.record_launch(req(), 100.0)
    store.advance("l1", "pending", 101.0, cloud_id="c-1")
    store.advance("l1", "terminating", 102.0, reason="idle (proof: removed)", proof="removed")
    assert store.get("l1").end_proof == "removed"
    store.advance("l1", "terminated", 103.0)
    assert store.get("l1").end_proof == "removed"
    rec, _ = store.record_found("x9", "alpha", "terminating", 104.0, "unknown here", proof="forced")
    assert rec.end_proof == "forced" and store.get("x9").end_proof == "forced"
    assert store.destroys() == []
    rows = [DestroyRecord(105.0, "sim", "c-1", "l1", "removed", "idle (proof: removed)"),
            DestroyRecord(106.0, "sim", "c-7", "", "orphan", "orphan: launch id lost unknown"),
            DestroyRecord(107.0, "sim", "c-1", "l1", "removed", "again")]
    for d in rows:
        store.record_destroy(d)
    assert store.destroys() == rows
    assert store.destroys(instance_id="l1") == [rows[0], rows[2]]
    assert store.destroys(cloud_id="c-7") == [rows[1]]
    assert store.destroys(limit=2) == rows[1:]
    other = reopen(store)
    assert other.destroys() == rows  # durable: another process on the store reads it
    if other is not store:
        other.close()


def test_identity_is_made_once_shared_and_checked(store: Store) -> None:
    ids = iter(["aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb"])
    first = store.claim_identity(None, new_id=lambda: next(ids))
    assert first.store_id == "aaaaaaaaaaaaaaaa" and first.deployment == "epu-bbbbbbbbbbbb"
    assert store.claim_identity() == first  # kept: a second provisioner on this store gets the same
    assert store.claim_identity(first.deployment) == first
    with pytest.raises(IdentityError) as exc:
        store.claim_identity("prod")
    assert "provisioner.deployment is 'prod'" in str(exc.value) and first.deployment in str(exc.value)


def test_misses_and_sightings_round_trip(store: Store) -> None:
    store.save_misses([Miss("l1", "sim", 2, 10.0, 25.0), Miss("l2", "sim", 1, 20.0, 20.0)], [])
    store.save_misses([Miss("l1", "sim", 3, 10.0, 40.0)], ["l2"])
    assert store.misses("sim") == {"l1": Miss("l1", "sim", 3, 10.0, 40.0)} and store.misses("other") == {}
    s = Sighting("sim", "c-9", "lost", "orphan", 5.0, 6.0)
    store.save_sightings("sim", [s], [])
    store.save_sightings("sim", [Sighting("sim", "c-9", "lost", "orphan", 5.0, 9.0)], [])
    assert store.sightings("sim")["c-9"].last_seen == 9.0
    store.save_sightings("sim", [], ["c-9"])
    assert store.sightings("sim") == {}


OLD_SCHEMA = [  # prov_instances and prov_transitions as the previous release created them
    """CREATE TABLE prov_instances (instance_id VARCHAR(128) PRIMARY KEY, domain VARCHAR(64) NOT NULL,
       site VARCHAR(64) NOT NULL, node_name VARCHAR(253) NOT NULL, cores INTEGER NOT NULL, state VARCHAR(16) NOT NULL,
       seq INTEGER NOT NULL, cloud_id VARCHAR(256), ip VARCHAR(64), reason TEXT NOT NULL, error_kind VARCHAR(16),
       created_at FLOAT NOT NULL, updated_at FLOAT NOT NULL)""",
    """CREATE TABLE prov_transitions (id INTEGER PRIMARY KEY, instance_id VARCHAR(128) NOT NULL, seq INTEGER NOT NULL,
       from_state VARCHAR(16), to_state VARCHAR(16) NOT NULL, at FLOAT NOT NULL, reason TEXT NOT NULL,
       error_kind VARCHAR(16), published BOOLEAN NOT NULL)""",
    """INSERT INTO prov_instances VALUES ('old-1', 'alpha', 'sim', 'w1', 1, 'terminated', 3, 'c-1', NULL,
       'vanished: node c-1 not found by reconciliation', NULL, 1.0, 2.0)""",
    """INSERT INTO prov_instances VALUES ('old-2', 'alpha', 'sim', 'w2', 1, 'terminated', 4, 'c-2', NULL,
       'terminated', NULL, 1.0, 2.0)""",
    """INSERT INTO prov_instances VALUES ('old-3', 'alpha', 'sim', 'w3', 1, 'started', 3, 'c-3', NULL,
       '', NULL, 1.5, 1.6)""",
    """INSERT INTO prov_transitions VALUES (1, 'old-2', 3, 'started', 'terminated', 1.75, 'done', NULL, true)""",
    """INSERT INTO prov_transitions VALUES (2, 'old-2', 4, 'terminated', 'terminated', 1.9, 'noted', NULL, true)""",
]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_an_older_database_is_brought_up_to_date(backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    engine = make_engine(url)
    with engine.begin() as conn:
        for stmt in OLD_SCHEMA:
            conn.exec_driver_sql(stmt.replace("INTEGER PRIMARY KEY", "SERIAL PRIMARY KEY") if backend != "sqlite"
                                 and "prov_transitions" in stmt else stmt)
    engine.dispose()
    store = Store(url)
    try:
        # records an older release closed on absence alone are marked presumed gone: their nodes are safe
        assert store.get("old-1").presumed_gone and not store.get("old-2").presumed_gone
        # ended records get when they ended (their last move to an end state, else their last
        # change), live ones none; no record claims a price it was never given
        assert [(r.instance_id, r.ended_at, r.price_per_hour) for r in store.lives(0.0, 10.0)] == [
            ("old-1", 2.0, None), ("old-2", 1.9, None), ("old-3", None, None)]
        # the columns of issue 33 arrive empty: never reopened, no proof kept
        assert (store.get("old-2").reopened_seq, store.get("old-2").end_proof) == (None, None)
        # its instances were tagged by configuration: the store will not guess their deployment
        with pytest.raises(IdentityError) as exc:
            store.claim_identity()
        assert "provisioner.deployment" in str(exc.value) and "'epu'" in str(exc.value)
        assert store.claim_identity("epu").deployment == "epu"
        again = Store(url)
        assert again.claim_identity().deployment == "epu"  # and a second open changes nothing
        again.close()
    finally:
        store.close()


def test_two_provisioners_writing_the_same_memory_at_once(store: Store) -> None:
    """Two provisioners on one store count a miss or sight a node at the same moment: neither fails."""
    other = reopen(store)
    errors: list[BaseException] = []

    def writer(s: Store, n: int) -> None:
        try:
            for i in range(40):
                s.save_misses([Miss("l1", "sim", i, 1.0, float(i))], [])
                s.save_sightings("sim", [Sighting("sim", "c-1", "x", "orphan", 1.0, float(i + n))], [])
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s, n)) for n, s in enumerate((store, other))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    other.close()
    assert errors == [] and store.misses("sim")["l1"].count == 39 and len(store.sightings("sim")) == 1


def test_in_memory_store_serves_threads_reading_while_others_write() -> None:
    """``sqlite://`` (the embedded demo's store) is one connection shared by every thread: a read
    starting inside another thread's write transaction failed ("cannot start a transaction
    within a transaction") and a poll was lost."""
    store = Store("sqlite://")
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                store.records_for("sim", ["l1"])
                store.misses("sim")
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    th = threading.Thread(target=reader)
    th.start()
    try:
        for i in range(300):
            store.record_launch(req(i), 100.0)
            store.advance(f"l{i}", "pending", 101.0)
    finally:
        stop.set()
        th.join()
        store.close()
    assert errors == []


def test_list_live_or_recently_updated_leaves_old_ended_records_in_the_database(store: Store) -> None:
    """The anti-entropy report reads only what it sends, not every instance the store ever held."""
    for i in range(4):
        store.record_launch(LaunchRequest(launch_id=f"r{i}", domain="d", site="s", node_name=f"r{i}"), 100.0 + i)
    store.advance("r0", "terminated", 200.0)  # ended long ago
    store.advance("r1", "failed", 900.0)  # ended recently
    store.advance("r2", "pending", 150.0)  # live, untouched for long
    got = [r.instance_id for r in store.list(live_or_updated_since=800.0)]
    assert got == ["r1", "r2", "r3"]
    assert [r.instance_id for r in store.list()] == ["r0", "r1", "r2", "r3"]


def test_reads_come_in_one_order_on_every_store(store: Store) -> None:
    """The simulators' replay digests depend on the order a poll meets records in: the in-memory
    store returns what SQLite returns — a site's live records in the order they were made, then
    the other listed ones by id; misses in the order first saved; sightings by cloud id.
    (PostgreSQL promises no order without ORDER BY: there only the contents are compared.)"""
    seq = (lambda xs: list(xs)) if not store.url.startswith("postgresql") else (lambda xs: sorted(xs))
    for i in (5, 3, 9, 1):
        store.record_launch(req(i), 100.0 + i)
    store.advance("l3", "terminated", 120.0)
    store.advance("l9", "failed", 121.0)
    store.advance("l5", "pending", 122.0)
    assert seq(store.records_for("sim", ["l9", "l3", "l1"])) == seq(["l5", "l1", "l3", "l9"])
    assert seq(store.records_for("sim", [])) == seq(["l5", "l1"])
    store.save_misses([Miss("m2", "sim", 1, 1.0, 1.0), Miss("m1", "sim", 1, 1.0, 1.0)], [])
    store.save_misses([Miss("m2", "sim", 2, 1.0, 2.0), Miss("m3", "sim", 1, 2.0, 2.0)], [])
    assert seq(store.misses("sim")) == seq(["m2", "m1", "m3"])
    store.save_sightings("sim", [Sighting("sim", c, "", "orphan", 1.0, 1.0) for c in ("c-b", "c-c", "c-a")], [])
    assert seq(store.sightings("sim")) == ["c-a", "c-b", "c-c"]
    assert store.active_count("sim") == 2 and store.counts() == {"failed": 1, "pending": 1, "requested": 1,
                                                                  "terminated": 1}


def test_a_life_is_kept_with_its_price_at_launch_from_launch_to_end(store: Store) -> None:
    """What ``epu cost`` bills: each record's span (launch to end, open while live) and the price
    its type had when the launch was recorded, read back for any period."""
    store.record_launch(req(1), 100.0, price=0.5)
    store.record_launch(req(2), 110.0)  # unpriced: None, never 0
    store.record_launch(req(3), 300.0, price=0.25)
    store.advance("l1", "pending", 101.0, cloud_id="c-1")
    store.advance("l1", "terminating", 190.0)
    assert store.get("l1").ended_at is None
    store.advance("l1", "terminated", 200.0)
    store.advance("l1", "failed", 250.0)  # refused: an end is set once
    store.advance("l2", "failed", 120.0, error_kind="transient")
    rec = store.get("l1")
    assert (rec.ended_at, rec.price_per_hour) == (200.0, 0.5)
    assert store.get("l2").price_per_hour is None and store.get("l2").ended_at == 120.0
    assert [r.instance_id for r in store.lives(0.0, 1000.0)] == ["l1", "l2", "l3"]
    assert [r.instance_id for r in store.lives(150.0, 250.0)] == ["l1"]
    assert [r.instance_id for r in store.lives(200.0, 300.0)] == []  # l1 over at 200, l3 from 300
    assert [r.instance_id for r in store.lives(250.0, 301.0)] == ["l3"]
    # a failed record whose node was running all along is live again: its end is taken back
    store.reopen("l2", "started", 400.0, "listed alive", cloud_id="c-2")
    assert store.get("l2").ended_at is None
    assert [r.instance_id for r in store.lives(500.0, 600.0)] == ["l2", "l3"]
    found, _ = store.record_found("x9", "alpha", "terminating", 700.0, "asked to terminate", site="sim")
    assert found.ended_at is None and found.price_per_hour is None
    assert reopen(store).get("l3").price_per_hour == 0.25
