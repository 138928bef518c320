"""What an operator's Prometheus sees of a running EPU: every service reachable on the configured
host, and the fleet gauges (instances by domain, site, type and state; batch nodes; paused;
spend) agreeing with the engine's own records."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from epu.common.observability import HealthServer, ServiceMetrics
from epu.common.testing import wait_for

from tests.deploy.conftest import Running
from tests.deploy.scrape import SERVICES, outside_address, scrape

PRICES = {"cloud-a": 0.05, "cloud-b": 0.12}  # the demo's sites


def test_every_service_serves_metrics_to_another_host_when_metrics_host_says_so(running: Running) -> None:
    for name in SERVICES:
        text = scrape(running.host, running.ports[name])  # not loopback: what a remote Prometheus uses
        assert "epu_messages_consumed_total" in text, name


def test_the_default_metrics_host_is_loopback_only() -> None:
    server = HealthServer(ServiceMetrics("t"), lambda: {"healthy": True}).start()  # the default host
    try:
        assert "epu_broker_connected" in scrape("127.0.0.1", server.port)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://{outside_address()}:{server.port}/metrics", timeout=5)
    finally:
        server.stop()


def _agrees(running: Running) -> bool:
    """The scrape's fleet gauges equal the engine's records (retried: the fleet moves, and the
    engine samples it every few seconds)."""
    engine = running.engine
    s = running.scrape("decision")
    try:  # read from this thread while the engine's writes it: a change mid-read is retried
        live = [i for i in engine.store.instances() if i.domain == "demo"]
    except RuntimeError:
        return False
    by_state: dict[str, int] = {}
    for i in live:
        by_state[i.state] = by_state.get(i.state, 0) + 1
    for state, n in by_state.items():
        if s.value("epu_instances", domain="demo", state=state) != n:
            return False
    if s.value("epu_instances", domain="demo") != len(live):
        return False
    rate = sum(PRICES[i.site] for i in live)
    if abs(s.value("epu_spend_rate_per_hour", domain="demo") - rate) > 1e-9:
        return False
    snap = engine.latest_snapshot("demo")
    return snap is not None and s.value("epu_batch_nodes", domain="demo") == len(snap.nodes)


def test_fleet_gauges_agree_with_the_engines_records(running: Running) -> None:
    wait_for(lambda: _agrees(running), 30, interval=0.2, message="the scrape agreeing with the engine's records")
    s = running.scrape("decision")
    types = {lab["type"] for lab, _ in s.samples["epu_instances"]}
    assert types == {"sim.2core"}, "an untyped launch is labelled with its site's size"
    sites = {lab["site"] for lab, _ in s.samples["epu_instances"]}
    assert sites <= set(PRICES) and sites
    assert not any("instance" in lab or "node" in lab for lab, _ in s.samples["epu_instances"]), \
        "no per-instance label"
    assert s.value("epu_decision_domain_paused", domain="demo") == 0
    assert s.value("epu_decision_launches_total", domain="demo") >= 2
    assert {lab["site"] for lab, _ in s.samples["epu_spend_rate_per_hour"]} == set(PRICES), \
        "every site of the domain has a rate, 0 when nothing runs there"


def test_spend_so_far_grows_with_the_rate(running: Running) -> None:
    first = running.scrape("decision").value("epu_spend_total", domain="demo")
    rate = running.scrape("decision").value("epu_spend_rate_per_hour", domain="demo")
    assert rate > 0
    wait_for(lambda: running.scrape("decision").value("epu_spend_total", domain="demo") > first, 20,
             interval=0.2, message="epu_spend_total growing while instances run")


def test_the_example_config_opens_every_services_metrics_to_the_sites_prometheus() -> None:
    from pathlib import Path

    from epu.common.config import load_config

    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "epu.toml"
    cfg = load_config(example, environ={})
    for name in SERVICES:
        section = getattr(cfg, name)
        assert section.metrics_port is not None, name
        assert not section.metrics_host.startswith("127."), f"[{name}] metrics_host answers this host only"
