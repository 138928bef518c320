"""The shipped Grafana dashboard (deploy/grafana/epu-dashboard.json) reads only metrics the
services export: every query's metric names, compared with a scrape of a running EPU."""

from __future__ import annotations

import json
from pathlib import Path

from tests.deploy.conftest import Running
from tests.deploy.scrape import exprs, metric_names

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "epu-dashboard.json"
PROMETHEUS_OWN = {"up"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_every_query_names_a_metric_the_services_export(running: Running) -> None:
    exported = running.scrape_all().names
    queries = list(exprs(dashboard()))
    assert len(queries) >= 20
    unknown = {}
    for q in queries:
        names = metric_names(q)
        assert names, f"no metric found in {q!r}"
        if names - exported - PROMETHEUS_OWN:
            unknown[q] = sorted(names - exported - PROMETHEUS_OWN)
    assert not unknown, f"queries naming metrics no service exports: {unknown}"


def test_the_comparison_catches_a_metric_nobody_exports(running: Running) -> None:
    exported = running.scrape_all().names
    assert metric_names('sum by (site) (epu_instance{domain=~"$domain"})') - exported == {"epu_instance"}
    assert metric_names("increase(epu_spend_total[$__range])") <= exported


def test_the_dashboard_covers_the_fleet_the_operator_watches() -> None:
    d = dashboard()
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"]), "panel ids are unique"
    read = set().union(*(metric_names(q) for q in exprs(d)))
    for name in ("epu_decision_queued_demand_jobs", "epu_batch_nodes", "epu_instances", "epu_decision_launches_total",
                 "epu_provisioner_failures_total", "epu_instances_retired_total", "epu_spend_rate_per_hour",
                 "epu_spend_total", "epu_decision_circuit_open", "epu_decision_site_backoff_seconds"):
        assert name in read, name
    by = " ".join(t["expr"] for p in panels for t in p["targets"] if "epu_instances{" in t["expr"])
    assert "by (domain, site)" in by and "by (domain, type)" in by
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    variables = {v["name"] for v in d["templating"]["list"]}
    assert variables == {"datasource", "domain"}
