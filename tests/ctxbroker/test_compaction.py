"""History compaction: a new agent gets the current members as one snapshot, not every join and
leave ever made (issue 14: 3,000 past workers → 6,000 entries → ~143 s of hook runs)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from epu.services.ctxbroker.agent.agent import Agent
from epu.services.ctxbroker.agent.config import AgentConfig
from epu.services.ctxbroker.core import Entry, NodeFields, answer_kind, apply_entry, fold, next_entry
from epu.services.ctxbroker.hub import CtxState
from epu.services.ctxbroker.store import ContextRow, Loaded, Store
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ctxbroker.conftest import Nodes, node, node_credential


def test_answer_kind() -> None:
    assert answer_kind(after=5, last_id=5, horizon=0, members=3) == "none"
    assert answer_kind(after=0, last_id=5, horizon=0, members=3) == "snapshot"  # a new agent
    assert answer_kind(after=3, last_id=5, horizon=0, members=3) == "entries"  # a few behind
    assert answer_kind(after=3, last_id=9, horizon=0, members=3) == "snapshot"  # more steps than members
    assert answer_kind(after=3, last_id=5, horizon=4, members=9) == "snapshot"  # its entries are gone
    assert answer_kind(after=4, last_id=5, horizon=4, members=9) == "entries"


ops = st.lists(st.tuples(st.sampled_from(["join", "leave"]), st.integers(0, 6), st.integers(0, 2)),
               max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=ops, keep=st.integers(1, 8),
       cuts=st.lists(st.lists(st.integers(0, 60), max_size=6), min_size=1, max_size=4))
def test_agents_reading_a_compacted_list_converge(ops: list[tuple[str, int, int]], keep: int,
                                                   cuts: list[list[int]]) -> None:
    """Whatever the history, whatever the compaction, and whenever agents read (the broker
    answering with entries or snapshots as it sees fit), every agent ends with the broker's
    membership. Each agent reads what the broker served at one moment of the history."""
    members: dict[str, NodeFields] = {}
    served: list[tuple[int, CtxState]] = []  # (last id, a frozen copy of the broker's state then)
    st_ = CtxState(row=ContextRow("c", "n", "k", "h", 0.0, 0))
    log_len = 0
    for kind, host, variant in ops:
        fields = NodeFields.model_validate(node(host, ip=f"10.1.{variant}.{host + 1}")) if kind == "join" else None
        if next_entry(members.get(f"wn-{host}"), kind, fields):  # type: ignore[arg-type]
            log_len += 1
            e = Entry(log_len, kind, f"wn-{host}", **({} if fields is None else {  # type: ignore[arg-type]
                "fqdn": fields.fqdn, "ip": fields.ip, "ssh_host_key": fields.ssh_host_key, "data": fields.data}))
            members = apply_entry(members, e)
            st_.extend([e], keep)
            copy = CtxState(row=st_.row, entries=list(st_.entries), joined=dict(st_.joined),
                            horizon=st_.horizon, last_id=st_.last_id)
            served.append((log_len, copy))
    assert len(st_.entries) <= keep + keep // 10 + 1  # the kept history is bounded
    for agent_cuts in cuts:
        seen: dict[str, NodeFields] = {}
        applied = 0
        for cut in sorted(agent_cuts) + [log_len]:
            state = next((s for last, s in served if last >= cut), st_)
            doc = json.loads(state.encode_after(applied))
            batch = [Entry(d["id"], d["kind"], d["hostname"], d["fqdn"], d["ip"], d["ssh_host_key"], d["data"],
                           d["instance_id"]) for d in doc["entries"]]
            if doc["snapshot"]:
                seen = fold(batch)
            else:
                assert [e.entry_id for e in batch] == list(range(applied + 1, applied + 1 + len(batch)))
                seen = fold(batch, seen)
            applied = max(applied, doc["last_id"])
        assert applied == log_len
        assert seen == members


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    s = Store(url, history_entries=20)
    yield s
    s.close()


def test_the_store_keeps_a_bounded_tail_and_the_members(store: Store) -> None:
    store.create_context("c1", "one", "k1", "h1")
    for round_ in range(30):  # 30 generations of 5 workers: 300 entries
        for i in range(5):
            store.join("c1", NodeFields.model_validate(node(100 * round_ + i)))
        for i in range(5):
            store.leave("c1", f"wn-{100 * round_ + i}", "idle")
    store.join("c1", NodeFields.model_validate(node(1)))
    loaded = store.load("c1")
    assert isinstance(loaded, Loaded)
    assert loaded.row.last_id == 301
    assert store.count_entries("c1") <= 20 + 2 + 1
    assert loaded.row.horizon >= 301 - 23
    assert [e.entry_id for e in loaded.entries] == list(range(loaded.row.horizon + 1, 302))
    assert [(e.entry_id, e.hostname) for e in loaded.members] == [(301, "wn-1")]
    st_ = CtxState.of(loaded)
    assert json.loads(st_.encode_after(0))["entries"][0]["hostname"] == "wn-1"
    assert json.loads(st_.encode_after(5))["snapshot"] is True  # its entries were compacted away
    tail = json.loads(st_.encode_after(300))
    assert tail["snapshot"] is False and [e["id"] for e in tail["entries"]] == [301]


def test_a_new_agent_joining_a_long_history_applies_only_the_members(
        context: dict[str, str], node_client: Nodes, tls_files: tuple[str, str], tmp_path: Path) -> None:
    """Many past workers came and went; a new node runs add-node once per current member and
    restart once, whatever the length of the history."""
    for gen in range(20):
        for i in range(3):
            node_client.join(node(10 * gen + i + 100))
        for i in range(3):
            node_client.leave(f"wn-{10 * gen + i + 100}")
    node_client.join(node(1))
    node_client.join(node(2))
    assert node_client.updates(0)["last_id"] == 122
    scripts = tmp_path / "scripts"
    for hook in ("add-node", "delete-node", "restart"):
        d = scripts / f"{hook}.d"
        d.mkdir(parents=True)
        p = d / "10-log"
        p.write_text("#!/usr/bin/env python3\nimport os\nopen(os.environ['EPU_CTX_ROOT'] + '/hooks.log', 'a')"
                     ".write(os.environ['EPU_HOOK'] + ' ' + os.environ.get('EPU_NODE_HOSTNAME', '') + ' '"
                     " + os.environ.get('EPU_SNAPSHOT', '') + '\\n')\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    root = tmp_path / "root"
    root.mkdir()
    cred = node_credential(context, "wn-3")
    cfg = AgentConfig(uri=context["uri"], key=cred.key, secret=cred.secret, ca_file=tls_files[0],
                      scripts_dir=str(scripts), state_dir=str(tmp_path / "state"), root=str(root))
    agent = Agent(cfg, NodeFields.model_validate(node(3)))
    agent.ensure_init()
    agent.poll_once()
    hooks = (root / "hooks.log").read_text().split("\n")
    assert hooks == ["add-node wn-1 1", "add-node wn-2 1", "restart  ", ""]
    assert agent.state.last_id == 122 and sorted(agent.state.members) == ["wn-1", "wn-2"]
    agent.client.close()


def test_an_agent_far_behind_diffs_the_snapshot_against_what_it_had(tmp_path: Path) -> None:
    """delete-node for members gone, add-node for new or changed ones, nothing for the same,
    restart once; the snapshot's id is recorded only at the end."""

    class Stub:
        def updates(self, after: int, wait: float) -> dict[str, object]:
            keep, changed, new = node(1), node(2, ip="10.2.2.2"), node(7)
            return {"last_id": 40, "snapshot": True, "entries": [
                {"id": 12, "kind": "join", **keep}, {"id": 33, "kind": "join", **changed},
                {"id": 39, "kind": "join", **new}]}

    scripts = tmp_path / "scripts"
    for hook in ("add-node", "delete-node", "restart"):
        d = scripts / f"{hook}.d"
        d.mkdir(parents=True)
        p = d / "10-log"
        p.write_text("#!/usr/bin/env python3\nimport os\nopen(os.environ['EPU_CTX_ROOT'] + '/hooks.log', 'a')"
                     ".write(os.environ['EPU_HOOK'] + ' ' + os.environ.get('EPU_NODE_HOSTNAME', '') + '\\n')\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "root").mkdir()
    cfg = AgentConfig(uri="https://x/v1/contexts/c", key="k", secret="s", scripts_dir=str(scripts),
                      state_dir=str(tmp_path / "state"), root=str(tmp_path / "root"))
    a = Agent(cfg, NodeFields.model_validate(node(9)), client=Stub())  # type: ignore[arg-type]
    a.state.last_id = 3
    a.state.members = {f"wn-{i}": NodeFields.model_validate(node(i)).model_dump() for i in (1, 2, 5)}
    assert a.poll_once() == 3
    assert (tmp_path / "root" / "hooks.log").read_text().split("\n") == [
        "delete-node wn-5", "add-node wn-2", "add-node wn-7", "restart ", ""]
    assert a.state.last_id == 40 and sorted(a.state.members) == ["wn-1", "wn-2", "wn-7"]
    assert a.state.members["wn-2"]["ip"] == "10.2.2.2" and not a.state.restart_pending
    assert json.loads((tmp_path / "state" / "members.json").read_text()) == a.state.members
