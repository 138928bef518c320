"""The spend cap (``budget_per_hour`` of a domain and of a site): launches past it are held, said
so in a decision record (the event), the engine's status and ``budget_held``; scale-down never is."""

from __future__ import annotations

from epu.services.decision.budget import Budget, admit, spend_rate

from tests.decision.helpers import config, event, jobs, make_engine, node, snapshot


def test_admit_holds_past_the_domain_cap_and_the_site_cap() -> None:
    prices = {("a", ""): 0.1, ("b", ""): 0.5, ("b", "big"): 2.0}
    got = admit([("a", ""), ("a", ""), ("a", "")], Budget(0.25, 0.0, {}, {}, prices))
    assert got.keep == [True, True, False] and got.held == 1 and "budget_per_hour 0.25" in got.why
    got = admit([("b", ""), ("b", "big"), ("a", "")], Budget(None, 0.0, {"b": 1.0}, {"b": 0.4}, prices))
    assert got.keep == [True, False, True] and "site b spend 0.90/h + 2.00/h" in got.why
    assert admit([("a", "")] * 5, Budget(None, 0.0, {}, {}, prices)).keep == [True] * 5


def test_spend_rate_counts_paid_states_only() -> None:
    prices = {("a", ""): 0.1, ("a", "x"): 1.0}
    live = [("a", "", "requested"), ("a", "x", "joined"), ("a", "", "terminating"), ("a", "x", "terminated"),
            ("a", "", "failed")]
    assert abs(spend_rate(live, prices) - 1.2) < 1e-9


def _capped(cap: float, **site_caps: float):
    sites = {"s1": {"driver": "epu-sim", "quota": 10, "price_per_hour": 0.2},
             "s2": {"driver": "epu-sim", "quota": 10, "price_per_hour": 0.1}}
    for name, c in site_caps.items():
        sites[name]["budget_per_hour"] = c
    return config(domains={"d": {"max_nodes": 20, "sites": ["s1", "s2"], "budget_per_hour": cap,
                                 "params": {"idle_seconds": 60}}}, sites=sites)


def test_engine_launches_up_to_the_cap_then_says_so() -> None:
    e, bus, clock = make_engine(cfg=_capped(0.5))
    e.on_snapshot(snapshot(queued=jobs(10)))
    (rec,) = e.iterate()
    launches = bus.of("instance.launch")
    assert [la.site for la in launches] == ["s1", "s1"]  # 2 x 0.2 = 0.4; a third (0.6) is over 0.5
    assert any(n.startswith("spend cap: 8 launch(es) held") for n in rec.notes)
    assert "budget_per_hour 0.50" in e.budget_held["d"]
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snapshot(queued=jobs(10), at=clock.now()))
    assert e.iterate() == [] and bus.of("instance.launch") == []  # still held: no new event, no launch


def test_a_site_cap_moves_nothing_past_it() -> None:
    e, bus, _clock = make_engine(cfg=_capped(5.0, s1=0.45))
    e.on_snapshot(snapshot(queued=jobs(4)))
    e.iterate()
    assert sorted(la.site for la in bus.of("instance.launch")) == ["s1", "s1"]
    assert "site s1" in e.budget_held["d"]


def test_scale_down_is_never_held_by_the_cap() -> None:
    """A cap lowered below what runs: nothing launches, the idle workers still drain and go."""
    e, bus, clock = make_engine(cfg=_capped(1.0))
    e.on_snapshot(snapshot(queued=jobs(3)))
    e.iterate()
    launches = bus.of("instance.launch")
    assert len(launches) == 3
    for la in launches:
        e.on_instance_event(event(la, "started", 1, clock.now()))
    _, cfg = e.store.current_config("d")
    e.store.put_config("d", cfg.model_copy(update={"budget_per_hour": 0.1}), source="file", now=clock.now())
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snapshot(queued=jobs(5), nodes=[node(la.node_name) for la in launches], at=clock.now()))
    e.iterate()
    assert bus.of("instance.launch") == []
    clock.advance(120)
    e.on_snapshot(snapshot(nodes=[node(la.node_name) for la in launches], at=clock.now()))
    e.iterate()
    offs = [c for c in bus.of("node.command") if c.action == "offline"]
    assert len(offs) == 3


def test_status_shows_the_cap_holding() -> None:
    from epu.services.decision.status import Board, render
    from epu.services.decision.statusfeed import build_status
    from rich.console import Console

    e, _bus, clock = make_engine(cfg=_capped(0.5))
    e.on_snapshot(snapshot(queued=jobs(10)))
    e.iterate()
    st = build_status(e, "d", clock.now(), None)
    assert st is not None and st.budget_held.startswith("spend cap: 8 launch(es) held")
    board = Board()
    board.apply(st)
    assert board.as_json()[0]["engine"]["budget_per_hour"] == 0.5
    assert st.spend_per_hour == 0.4  # the two launched (requested) at 0.20/h
    console = Console(record=True, width=200)
    console.print(render(board))
    assert "launches held: spend cap" in console.export_text()
