"""Context names are unique: in the store's own transaction (both engines), over REST (409),
under concurrent creates, and across the upgrade of a store that already holds duplicates."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest
from epu.services.ctxbroker.client import AdminClient, BrokerError
from epu.services.ctxbroker.store import NameTaken, Store

from tests.ctxbroker.conftest import ADMIN_TOKEN


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    s = Store(url)
    yield s
    s.close()


def test_a_second_create_of_a_name_is_refused_and_changes_nothing(store: Store) -> None:
    store.create_context("c1", "alpha", "k1", "h1")
    with pytest.raises(NameTaken, match=r"'alpha' exists already \(id c1\)"):
        store.create_context("c2", "alpha", "k2", "h2")
    assert [c.id for c in store.list_contexts()] == ["c1"]
    store.create_context("c3", "beta", "k3", "h3")  # other names are free
    assert store.delete_context("c1")
    store.create_context("c4", "alpha", "k4", "h4")  # a deleted context's name is free again
    assert store.name_holder("alpha") == "c4"


def test_concurrent_creates_of_one_name_one_wins(store: Store) -> None:
    """Eight creates of one name from eight threads (eight connections): exactly one commits."""
    barrier = threading.Barrier(8)
    won: list[str] = []
    refused: list[str] = []
    errors: list[BaseException] = []

    def create(i: int) -> None:
        barrier.wait()
        try:
            store.create_context(f"c{i}", "race", f"k{i}", "h")
            won.append(f"c{i}")
        except NameTaken as exc:
            refused.append(exc.holder)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(won) == 1 and len(refused) == 7 and set(refused) == set(won)
    assert [c.id for c in store.list_contexts()] == won


def test_an_id_collision_is_not_reported_as_a_taken_name(store: Store) -> None:
    store.create_context("c1", "alpha", "k1", "h1")
    with pytest.raises(Exception) as err:
        store.create_context("c1", "beta", "k2", "h2")
    assert not isinstance(err.value, NameTaken)
    assert store.name_holder("beta") is None


def _old_store_with_duplicates(path: Path) -> None:
    """A store of the release before unique names: two contexts named alpha (c-new is younger
    but sorts first by id), one beta, each with a member."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE ctx_contexts (id VARCHAR(64) PRIMARY KEY, name VARCHAR(63) NOT NULL, "
                   "key VARCHAR(64) NOT NULL UNIQUE, secret_hash VARCHAR(64) NOT NULL, created_at FLOAT NOT NULL, "
                   "last_id INTEGER NOT NULL, signing_key VARCHAR(64) NOT NULL DEFAULT '', "
                   "horizon INTEGER NOT NULL DEFAULT 0, domain VARCHAR(253) NOT NULL DEFAULT '')")
        db.execute("CREATE TABLE ctx_members (context_id VARCHAR(64) NOT NULL, hostname VARCHAR(63) NOT NULL, "
                   "fqdn VARCHAR(254) NOT NULL, ip VARCHAR(45) NOT NULL, ssh_host_key TEXT NOT NULL, "
                   "data TEXT NOT NULL, instance_id VARCHAR(128), entry_id INTEGER NOT NULL, "
                   "PRIMARY KEY (context_id, hostname))")
        for cid, name, at in (("c-old", "alpha", 1.0), ("c-new", "alpha", 2.0), ("c-b", "beta", 3.0)):
            db.execute("INSERT INTO ctx_contexts VALUES (?, ?, ?, 'h', ?, 1, 'sk', 0, '')", (cid, name, "k" + cid, at))
            db.execute("INSERT INTO ctx_members VALUES (?, 'wn-1', 'wn-1', '10.0.0.1', 'k', '', NULL, 1)", (cid,))


def test_upgrading_a_store_with_duplicate_names_keeps_every_context(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Nothing is deleted or renamed: the oldest context of a name holds it, the younger keeps
    its members and works; a new create of the name is refused; deleting the holder hands the
    name on, so it is free only once no context has it. The operator is told which ones."""
    path = tmp_path / "old.db"
    _old_store_with_duplicates(path)
    with caplog.at_level(logging.WARNING, logger="epu.ctxbroker.store"):
        s = Store(f"sqlite:///{path}")
    try:
        warned = [r for r in caplog.records if "share a name" in r.getMessage()]
        assert len(warned) == 1 and warned[0].duplicates == {"alpha": ["c-old", "c-new"]}
        assert s.duplicate_names() == {"alpha": ["c-old", "c-new"]}
        assert {c.id for c in s.list_contexts()} == {"c-old", "c-new", "c-b"}
        assert all(len(s.members(c)) == 1 for c in ("c-old", "c-new", "c-b"))
        assert (s.name_holder("alpha"), s.name_holder("beta")) == ("c-old", "c-b")
        with pytest.raises(NameTaken, match="c-old"):
            s.create_context("c-3", "alpha", "k3", "h")
        assert s.delete_context("c-old")
        assert s.name_holder("alpha") == "c-new"  # handed on: alpha is still taken
        with pytest.raises(NameTaken, match="c-new"):
            s.create_context("c-3", "alpha", "k3", "h")
        assert s.duplicate_names() == {}
    finally:
        s.close()
    s = Store(f"sqlite:///{path}")  # a second start changes nothing
    try:
        assert s.name_holder("alpha") == "c-new"
        assert s.delete_context("c-new") and s.name_holder("alpha") is None
        s.create_context("c-3", "alpha", "k3", "h")
    finally:
        s.close()


def test_rest_create_of_a_taken_name_is_409(admin: AdminClient) -> None:
    a = admin.create("alpha")
    with pytest.raises(BrokerError) as err:
        admin.create("alpha")
    assert err.value.status == 409
    assert f"a context named 'alpha' exists already (id {a['id']})" in err.value.message
    assert [c["id"] for c in admin.list()] == [a["id"]]


def test_concurrent_rest_creates_one_wins(admin: AdminClient, broker_server, tls_files: tuple[str, str]) -> None:
    """Six admin clients create one name at once: one 201, five 409 naming the winner."""
    clients = [AdminClient(broker_server.public_url, ADMIN_TOKEN, ca_file=tls_files[0]) for _ in range(6)]
    barrier = threading.Barrier(len(clients))
    won: list[str] = []
    statuses: list[int | None] = []

    def create(c: AdminClient) -> None:
        barrier.wait()
        try:
            won.append(c.create("race")["id"])
        except BrokerError as exc:
            statuses.append(exc.status)

    threads = [threading.Thread(target=create, args=(c,)) for c in clients]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clients:
            c.close()
    assert len(won) == 1 and statuses == [409] * 5
    assert [c["id"] for c in admin.list()] == won
