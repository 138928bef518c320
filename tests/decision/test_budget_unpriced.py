"""Issue 33, defect 4: a spend cap over a type nobody priced. Unknown was counted as 0 (a 1.0/h cap
let 40 launches through); now such a launch is held with a reason naming the type, a live
unpriced instance makes the spend unknown, a libcloud size with ``price=None`` is unpriced, and
the packer of a capped domain ranks an unpriced type after the priced ones."""

from __future__ import annotations

from types import SimpleNamespace

from epu.common.config.catalogue import site_types, type_from_size
from epu.common.messages import OfferedType
from epu.services.decision.budget import Budget, admit, budget_for, price, price_table, spend_rate

from tests.decision.helpers import config, event, jobs, make_engine, snapshot


def _unpriced_site(cap: float = 1.0, **site: object):
    return config(domains={"d": {"max_nodes": 40, "sites": ["s1"], "budget_per_hour": cap,
                                 "params": {"idle_seconds": 60}}},
                  sites={"s1": {"driver": "epu-sim", "quota": 40, **site}})


def test_a_cap_over_an_unpriced_site_holds_every_launch_and_names_it() -> None:
    """The issue's numbers: a 1.0/h cap, 40 jobs, a site without price_per_hour. Before: 40
    launches, no warning. Now: none, and the reason names the site."""
    e, bus, _clock = make_engine(cfg=_unpriced_site())
    e.on_snapshot(snapshot(queued=jobs(40)))
    (rec,) = e.iterate()
    assert bus.of("instance.launch") == []
    assert "s1 has no price" in e.budget_held["d"] and "budget_per_hour 1.00" in e.budget_held["d"]
    assert any(n.startswith("spend cap: 40 launch(es) held") for n in rec.notes)


def test_an_explicit_price_of_0_is_a_price() -> None:
    """A site that costs nothing (the process site) says so: price_per_hour = 0 is priced."""
    e, bus, _clock = make_engine(cfg=_unpriced_site(price_per_hour=0.0))
    e.on_snapshot(snapshot(queued=jobs(5)))
    e.iterate()
    assert len(bus.of("instance.launch")) == 5 and "d" not in e.budget_held


def test_admit_names_each_unpriced_type_and_never_counts_it() -> None:
    prices = {("a", ""): 0.1, ("a", "dark"): None, ("b", "x"): None}
    assert price(prices, "a", "dark") is None and price(prices, "a", "other") == 0.1
    got = admit([("a", ""), ("a", "dark"), ("b", "x"), ("a", "")], Budget(1.0, 0.0, {}, {}, prices))
    assert got.keep == [True, False, False, True]
    assert "a/dark has no price" in got.why and "b/x has no price" in got.why
    got = admit([("b", "x"), ("a", "")], Budget(None, 0.0, {"b": 5.0}, {}, prices))
    assert got.keep == [False, True] and "site b's budget_per_hour 5.00 cannot count it" in got.why
    assert admit([("a", "dark")] * 3, Budget(None, 0.0, {"b": 5.0}, {}, prices)).keep == [True] * 3  # no cap on a


def test_a_live_unpriced_instance_makes_the_spend_unknown() -> None:
    prices = {("a", ""): 0.1, ("a", "dark"): None}
    live = [SimpleNamespace(site="a", instance_type="dark", state="joined"),
            SimpleNamespace(site="a", instance_type="", state="joined")]
    assert spend_rate([(i.site, i.instance_type, i.state) for i in live], prices) == 0.1
    b = budget_for(1.0, {}, live, {("a", "dark"): 1, ("a", ""): 1}, prices)
    assert b is not None and b.domain_unpriced == ("a/dark",)
    got = admit([("a", "")], b)
    assert got.keep == [False] and "domain spend unknown: live instance(s) of unpriced a/dark" in got.why
    b = budget_for(None, {"a": 9.0}, [], {("a", "dark"): 2}, prices)
    assert b is not None and admit([("a", "")], b).keep == [False]


def test_a_libcloud_size_without_a_price_is_unpriced() -> None:
    size = SimpleNamespace(id="m5.large", vcpus=2, ram=8192, price=None, extra={})
    t = type_from_size("ec2", size)
    assert t is not None and not t.priced and t.price is None
    t = type_from_size("ec2", SimpleNamespace(id="m5.large", vcpus=2, ram=8192, price="0.096", extra={}))
    assert t is not None and t.priced and t.price == 0.096
    site = SimpleNamespace(types={}, discover=["m5.*"], quota=5, image="ami", size="", price_per_hour=None)
    (found,) = site_types("ec2", site, [size])
    assert price_table({"ec2": None}, {"ec2": [found]})[("ec2", "m5.large")] is None


def test_a_discovered_unpriced_type_is_held_and_a_priced_one_launched_instead() -> None:
    """At run time (the provisioner's report offers a type with no price while a cap is set) the
    cap holds: the engine does not launch the unpriced type, and it launches the priced one that
    serves the same jobs even though the unpriced one looks cheaper (0)."""
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1"], "budget_per_hour": 1.0,
                                "partitions": {"cpu": ["c4", "dark"], "fast": ["fast8"]},
                                "default_partition": "cpu", "params": {"idle_seconds": 60}}},
                 sites={"s1": {"driver": "epu-sim", "quota": 10, "discover": ["sim.*"],
                               "types": {"c4": {"size": "sim.c4", "cores": 4, "price_per_hour": 0.2}}}})
    e, bus, _clock = make_engine(cfg=cfg)
    offered = [OfferedType(name="c4", size="sim.c4", cores=4, price_per_hour=0.2, quota=10),
               OfferedType(name="dark", size="sim.dark", cores=4, price_per_hour=0.0, priced=False, quota=10),
               OfferedType(name="fast8", size="sim.fast8", cores=8, price_per_hour=0.0, priced=False, quota=10)]
    assert e.apply_offered({"s1": offered}) == ["s1"]
    e.on_snapshot(snapshot(queued=[*jobs(2, cores=4), *[j.model_copy(update={"queue": "fast"})
                                                          for j in jobs(1, cores=8, prefix="f")]]))
    e.iterate()
    launched = [la.instance_type for la in bus.of("instance.launch")]
    assert launched == ["c4", "c4"]
    assert "s1/fast8 has no price" in e.budget_held["d"]


def test_the_status_and_the_fleet_metrics_do_not_count_an_unpriced_instance_as_0() -> None:
    from epu.services.decision.fleet_metrics import FleetObserver
    from epu.services.decision.statusfeed import build_status

    e, bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 10, "sites": ["s1", "s2"]}},
                                           sites={"s1": {"driver": "epu-sim", "quota": 5},
                                                  "s2": {"driver": "epu-sim", "quota": 5, "price_per_hour": 0.5}}))
    e.on_snapshot(snapshot(queued=jobs(6)))
    e.iterate()
    launches = bus.of("instance.launch")
    for la in launches:
        e.on_instance_event(event(la, "started", 1, clock.now()))
    st = build_status(e, "d", clock.now(), None)
    assert st is not None
    on_s2 = sum(1 for la in launches if la.site == "s2")
    assert st.spend_per_hour == round(0.5 * on_s2, 6)
    sample = FleetObserver(e, clock.now).observe(force=True)
    assert sample.unpriced[("d", "s1")] == sum(1 for la in launches if la.site == "s1") > 0
    assert sample.spend_rate[("d", "s1")] == 0.0 and sample.unpriced[("d", "s2")] == 0
