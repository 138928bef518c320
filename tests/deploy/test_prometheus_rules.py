"""The shipped Prometheus files (deploy/prometheus/): promtool accepts the scrape config and the
alert rules, the rules' unit tests pass, and every metric a rule reads is one the services export.

promtool comes from the Debian package ``prometheus``; ``make test`` installs it
(scripts/ensure-promtool.sh). Missing, these tests fail — they do not skip.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import Running
from tests.deploy.prometheus_tool import promtool_path
from tests.deploy.scrape import metric_names

PROM = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = PROM / "epu-alerts.yml"
ALERTS = {"EpuTargetDown", "EpuDomainWithoutEngine", "EpuDecisionEngineAbsent", "EpuCircuitBreakerOpen",
          "EpuSiteBackedOff", "EpuInstancesStuckBooting", "EpuDeadLettersGrowing", "EpuSpendOverBudget",
          "EpuSensorUnavailable", "EpuUnsatisfiableJobs", "EpuBrokerConnectionStalled", "EpuSpendCapHoldingLaunches",
          "EpuUnpricedInstances"}
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes itself, not a service."""


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool_path(), *args], capture_output=True, text=True, timeout=120, cwd=PROM)


def rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


@pytest.mark.promtool  # Prometheus's promtool: `make test` installs it
def test_promtool_accepts_the_rules_and_the_scrape_config() -> None:
    out = promtool("check", "rules", RULES.name)
    assert out.returncode == 0, out.stdout + out.stderr
    out = promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.promtool  # Prometheus's promtool: `make test` installs it
def test_the_rules_unit_tests_pass_and_cover_every_alert() -> None:
    out = promtool("test", "rules", "tests/epu-alerts.test.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert {r["alert"] for r in rules()} == ALERTS
    tested = yaml.safe_load((PROM / "tests" / "epu-alerts.test.yml").read_text())
    fired = {t["alertname"] for case in tested["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == ALERTS, f"alerts without a test that fires them: {sorted(ALERTS - fired)}"


@pytest.mark.promtool  # Prometheus's promtool: `make test` installs it
def test_a_broken_rule_fails_its_unit_test(tmp_path: Path) -> None:
    """The unit tests can fail: the site-backoff alert without its gap tolerance misses a site
    backed off again and again."""
    (tmp_path / "tests").mkdir()
    shutil.copy(PROM / "tests" / "epu-alerts.test.yml", tmp_path / "tests")
    text = RULES.read_text().replace("max_over_time(epu_decision_site_backoff_seconds[10m])",
                                     "epu_decision_site_backoff_seconds")
    (tmp_path / RULES.name).write_text(text)
    out = subprocess.run([promtool_path(), "test", "rules", "tests/epu-alerts.test.yml"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode != 0 and "EpuSiteBackedOff" in out.stdout + out.stderr


def test_every_metric_a_rule_reads_is_exported(running: Running) -> None:
    exported = running.scrape_all().names
    for rule in rules():
        missing = metric_names(rule["expr"]) - exported - PROMETHEUS_OWN
        assert not missing, f"{rule['alert']} reads {sorted(missing)}, which no service exports"
