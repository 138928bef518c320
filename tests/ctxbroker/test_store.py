"""The SQL store on both engines: dense ordered ids, idempotent joins/leaves, concurrent appends."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from epu.services.ctxbroker.core import NodeFields, fold
from epu.services.ctxbroker.store import ContextNotFound, Store
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ctxbroker.conftest import node


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    s = Store(url)
    yield s
    s.close()


def n(i: int, **kw: object) -> NodeFields:
    return NodeFields.model_validate(node(i, **kw))


def test_ordered_list_and_members(store: Store) -> None:
    store.create_context("c1", "one", "k1", "h1")
    store.create_context("c2", "two", "k2", "h2")
    assert store.join("c1", n(1))[1] == 1
    assert store.join("c1", n(1)) == (None, 1)  # no change, no entry
    assert store.join("c2", n(1))[1] == 1  # ids are per context
    assert store.join("c1", n(2))[1] == 2
    assert store.leave("c1", "wn-1", "bye")[1] == 3
    assert store.leave("c1", "wn-1") == (None, 3)
    es = store.entries("c1")
    assert [(e.entry_id, e.kind, e.hostname) for e in es] == [(1, "join", "wn-1"), (2, "join", "wn-2"),
                                                              (3, "leave", "wn-1")]
    assert es[2].reason == "bye"
    assert [e.entry_id for e in store.entries("c1", after=1)] == [2, 3]
    assert [m.hostname for m in store.members("c1")] == ["wn-2"]
    assert fold(es) == {m.hostname: m for m in store.members("c1")}
    assert store.heads() == {"c1": 3, "c2": 1}
    with pytest.raises(ContextNotFound):
        store.join("nope", n(1))
    assert store.delete_context("c1") and not store.delete_context("c1")
    assert store.entries("c1") == [] and store.get_context("c1") is None


def test_members_by_instance(store: Store) -> None:
    store.create_context("c1", "one", "k1", "h1")
    store.create_context("c2", "two", "k2", "h2")
    store.note_instance("i-1", n(1).ip)
    store.note_instance("i-2", n(2).ip)
    store.join("c1", n(1, instance_id="i-1"))
    store.join("c2", n(1, instance_id="i-1"))
    store.join("c1", n(2, instance_id="i-2"))
    assert sorted(store.contexts_of_instance("i-1")) == [("c1", "wn-1"), ("c2", "wn-1")]


def test_concurrent_appends_get_dense_unique_ids(store: Store) -> None:
    store.create_context("c1", "one", "k1", "h1")
    errors: list[BaseException] = []

    def worker(base: int) -> None:
        try:
            for i in range(base, base + 10):
                store.join("c1", n(i))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(b * 10,)) for b in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [e.entry_id for e in store.entries("c1")] == list(range(1, 41))
    assert len(store.members("c1")) == 40


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["join", "leave"]), st.integers(0, 4), st.integers(0, 2)),
                    max_size=25),
       reads=st.lists(st.integers(0, 30), max_size=5))
def test_store_list_folds_to_its_members_for_any_interleaving(ops: list[tuple[str, int, int]],
                                                               reads: list[int]) -> None:
    """Whatever the interleaving, the stored list is dense and, read in any batches, folds to the
    members table: what every agent ends with equals what the broker says."""
    s = Store("sqlite://")
    try:
        s.create_context("c", "c", "k", "h")
        for kind, host, variant in ops:
            if kind == "join":
                s.join("c", n(host, ip=f"10.2.{variant}.{host + 1}"))
            else:
                s.leave("c", f"wn-{host}")
        full = s.entries("c")
        assert [e.entry_id for e in full] == list(range(1, len(full) + 1))
        members, applied = {}, 0
        for cut in sorted(reads) + [len(full)]:
            batch = [e for e in s.entries("c", after=applied) if e.entry_id <= max(cut, applied)]
            members = fold(batch, members)
            applied = batch[-1].entry_id if batch else applied
        assert members == {m.hostname: m for m in s.members("c")}
    finally:
        s.close()


def test_a_store_of_the_previous_release_gains_domains_and_instance_addresses(tmp_path: Path) -> None:
    """Contexts made before context domains keep working: no domain, so any fqdn whose first
    label is the host name; the instance-address table is created beside them."""
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE ctx_contexts (id VARCHAR(64) PRIMARY KEY, name VARCHAR(63) NOT NULL, "
                   "key VARCHAR(64) NOT NULL UNIQUE, secret_hash VARCHAR(64) NOT NULL, created_at FLOAT NOT NULL, "
                   "last_id INTEGER NOT NULL, signing_key VARCHAR(64) NOT NULL DEFAULT '', "
                   "horizon INTEGER NOT NULL DEFAULT 0)")
        db.execute("INSERT INTO ctx_contexts VALUES ('c1', 'old', 'k', 'h', 1.0, 0, 'sk', 0)")
    s = Store(f"sqlite:///{path}")
    assert s.get_context("c1").domain == ""
    assert s.note_instance("i-1", "10.0.0.2") and s.instance_ip("i-1") == "10.0.0.2"
    s.join("c1", n(1, instance_id="i-1"))
    assert [m.hostname for m in s.members("c1")] == ["wn-1"]
    s.close()


def _event(state: str, seq: int, ip: str | None = None, previous: str | None = None) -> object:
    import time

    from epu.common.messages import InstanceEvent

    return InstanceEvent(instance_id="i-1", domain="alpha", site="s", state=state, seq=seq, ip=ip,
                         previous=previous, at=time.time(), node_name="wn-1")


def _joins(store: Store) -> bool:
    from epu.services.ctxbroker.store import Revoked

    try:
        store.join("c1", n(1, instance_id="i-1"))
    except Revoked:
        return False
    return True


def test_a_failed_launch_reopened_may_join_again_in_any_order(store: Store) -> None:
    """Issue 33, defect 5, on both engines: a failure revokes until a reopening above its seq —
    announced (``previous: failed``) or a report's live entry; the failure's event arriving after
    the reopening (reordered, redelivered) revokes nothing; a termination is for good."""
    from epu.services.ctxbroker.app import InstanceFeed

    ip = str(node(1)["ip"])
    store.create_context("c1", "one", "k1", "h1")
    feed = InstanceFeed(store)
    feed.apply(_event("started", 2, ip))
    assert _joins(store)
    feed.apply(_event("failed", 3))
    assert not _joins(store) and store.instance_ip("i-1") is None and store.members("c1") == []
    feed.apply(_event("started", 2, ip))  # an older report entry: the failure stands
    assert not _joins(store)
    InstanceFeed(store).apply(_event("started", 4, ip))  # a report's entry (no previous), a fresh replica
    assert store.instance_ip("i-1") == ip and _joins(store)
    feed.apply(_event("failed", 3))  # the failure the reopening undid, again: this replica's memory...
    InstanceFeed(store).apply(_event("failed", 3))  # ...and the store's, on another
    assert store.instance_ip("i-1") == ip and [m.hostname for m in store.members("c1")] == ["wn-1"]
    feed.apply(_event("failed", 5))  # a new failure after the reopening
    assert not _joins(store) and store.members("c1") == []
    feed.apply(_event("terminated", 6))
    feed.apply(_event("started", 7, ip, previous="failed"))
    InstanceFeed(store).apply(_event("started", 8, ip, previous="failed"))
    assert not _joins(store) and store.instance_ip("i-1") is None


def test_a_reopening_seen_before_its_failure_keeps_the_node(store: Store) -> None:
    from epu.services.ctxbroker.app import InstanceFeed

    store.create_context("c1", "one", "k1", "h1")
    ip = str(node(1)["ip"])
    InstanceFeed(store).apply(_event("pending", 4, ip, previous="failed"))  # the reopening overtook...
    assert _joins(store)
    assert InstanceFeed(store).apply(_event("failed", 3)) == []  # ...its failure (another replica)
    assert _joins(store) and store.instance_ip("i-1") == ip


def test_a_store_revoked_before_the_reopening_rule_keeps_its_revocations(tmp_path: Path) -> None:
    """Rows of a store made before issue 33 (no seq, final, active) are read as terminations:
    revoked for good, whatever event comes."""
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE ctx_revoked (instance_id VARCHAR(128) PRIMARY KEY, at FLOAT NOT NULL, "
                     "reason TEXT NOT NULL)")
        conn.execute("INSERT INTO ctx_revoked VALUES ('i-1', 0, 'instance failed')")
    store = Store(f"sqlite:///{path}")
    store.create_context("c1", "one", "k1", "h1")
    assert store.reopen("i-1", 99, announced=True) is False
    assert not _joins(store)
    store.close()
