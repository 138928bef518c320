"""``epu policy history DOMAIN``: every operator change — who, when, applied or refused and why —
kept by the engine's store (SQLite, PostgreSQL, the simulators' memory store) and read by an
operator over the broker from the engine's retained status (real RabbitMQ)."""

from __future__ import annotations

from epu.common.messages import PolicyChange

from tests.decision.helpers import config, make_engine


def _changes(e, clock) -> None:
    e.on_policy_change(PolicyChange(change_id="c1", domain="d", max_nodes=8, operator="alice"))
    clock.advance(10)
    e.on_policy_change(PolicyChange(change_id="c2", domain="d", max_nodes=1000, operator="bob"))
    clock.advance(10)
    e.on_policy_change(PolicyChange(change_id="c3", domain="d", paused=True, operator="carol",
                                    params={"idle_seconds": 120}))
    clock.advance(10)
    e.on_policy_change(PolicyChange(change_id="c4", domain="d", budget_per_hour=2.5, mode="observe",
                                    operator="alice"))


def test_the_store_keeps_who_what_and_why(store_url) -> None:
    e, _bus, clock = make_engine(store_url, cfg=config())
    e.store.seed_config("d", e.config.domains["d"], clock.now())
    _changes(e, clock)
    h = e.store.change_history("d")
    assert [(x["change_id"], x["operator"], x["applied"]) for x in h] == [
        ("c1", "alice", True), ("c2", "bob", False), ("c3", "carol", True), ("c4", "alice", True)]
    assert "ceiling" in h[1]["reason"] and h[1]["request"] == {"max_nodes": 1000} and h[1]["version"] is None
    assert h[2]["request"] == {"paused": True, "params": {"idle_seconds": 120}}
    assert h[3]["version"] == h[2]["version"] + 1 and h[0]["at"] < h[1]["at"]
    _, cfg = e.store.current_config("d")
    assert cfg.budget_per_hour == 2.5 and cfg.mode == "observe" and cfg.paused


def test_zero_is_refused_as_in_the_file_clear_budget_removes_the_cap_and_a_bad_mode_is_refused() -> None:
    """Issue 34: ``budget_per_hour = 0`` was refused in the file but removed the cap in ``policy
    set``. Now 0 is refused both ways, and removing the cap is said outright."""
    e, _bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 10, "budget_per_hour": 3.0}}))
    e.store.seed_config("d", e.config.domains["d"], clock.now())
    out = e.on_policy_change(PolicyChange(change_id="z", domain="d", budget_per_hour=0))
    assert not out.applied and out.reason.startswith("budget_per_hour: must be greater than 0")
    assert "budget_per_hour=none" in out.reason and e.store.current_config("d")[1].budget_per_hour == 3.0
    assert not e.on_policy_change(PolicyChange(change_id="zc", domain="d", budget_per_hour=2.0,
                                               clear_budget=True)).applied
    assert e.on_policy_change(PolicyChange(change_id="c", domain="d", clear_budget=True)).applied
    assert e.store.current_config("d")[1].budget_per_hour is None
    out = e.on_policy_change(PolicyChange(change_id="m", domain="d", mode="yolo"))
    assert not out.applied and out.reason.startswith("mode:")


def test_epu_policy_history_reads_the_engine_status_over_the_broker(tmp_path, broker, capsys) -> None:
    import json

    from epu.common.broker import Publisher
    from epu.services.decision.statusfeed import build_status

    from epu.cli import main

    e, _bus, clock = make_engine(cfg=config(domains={"alpha": {"max_nodes": 10, "sites": ["s1"]}}))
    e.store.seed_config("alpha", e.config.domains["alpha"], clock.now())
    for cid, kw in (("a1", {"max_nodes": 6}), ("a2", {"sites": ["nowhere"]})):
        clock.advance(60)
        e.on_policy_change(PolicyChange(change_id=cid, domain="alpha", operator="alice", **kw))
    status = build_status(e, "alpha", clock.now(), None)
    assert status is not None and len(status.changes) == 2
    topo = broker.topology
    with broker.connection() as conn:
        topo.declare(conn.channel(), [topo.status_spec("alpha")])
    pub = Publisher(broker, "decision")
    try:
        pub.publish(status)
    finally:
        pub.close()
    cfg = tmp_path / "operator.toml"
    cfg.write_text(f'[broker]\nurl = "{broker.url}"\nprefix = "{topo.prefix}"\n')
    assert main(["policy", "history", "alpha", "-c", str(cfg)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "alice" in lines[0] and "applied v2" in lines[0] and "max_nodes=6" in lines[0]
    assert "REFUSED" in lines[1] and "sites=" in lines[1] and "unknown site(s) nowhere" in lines[1]
    assert main(["policy", "history", "alpha", "--json", "-c", str(cfg)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["applied"] for d in doc] == [True, False] and doc[0]["operator"] == "alice"
    assert main(["policy", "history", "beta", "-c", str(cfg)]) == 1
    assert "beta" in capsys.readouterr().err


def test_policy_set_words_for_the_cap_and_the_mode() -> None:
    from epu.services.decision.cli import parse_assignments

    assert parse_assignments(["budget_per_hour=2.5", "mode=observe", "idle_seconds=60"]) == {
        "budget_per_hour": 2.5, "mode": "observe", "params": {"idle_seconds": 60}}
    assert parse_assignments(["budget_per_hour=none"]) == {"clear_budget": True, "params": {}}
    assert parse_assignments(["budget_per_hour=0"]) == {"budget_per_hour": 0, "params": {}}  # the engine refuses it
