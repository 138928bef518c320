"""Metric names and labels by Prometheus conventions: ``promtool check metrics`` (the linter
Prometheus ships) on a scrape of every service finds nothing, and no label is per instance."""

from __future__ import annotations

import subprocess

import pytest

from tests.deploy.conftest import Running
from tests.deploy.prometheus_tool import promtool_path
from tests.deploy.scrape import SERVICES, scrape

PER_INSTANCE = {"instance_id", "node", "node_name", "launch_id", "job_id", "vm", "ip"}


@pytest.mark.promtool  # Prometheus's promtool: `make test` installs it
def test_promtool_finds_no_convention_broken_in_any_services_metrics(running: Running) -> None:
    for name in SERVICES:
        text = scrape(running.host, running.ports[name])
        out = subprocess.run([promtool_path(), "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, f"{name}:\n{out.stdout}{out.stderr}"


@pytest.mark.promtool  # Prometheus's promtool: `make test` installs it
def test_the_linter_catches_a_name_against_the_conventions() -> None:
    bad = "# HELP epu_x_count x\n# TYPE epu_x_count counter\nepu_x_count 1\n"
    out = subprocess.run([promtool_path(), "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "_total" in out.stdout + out.stderr


def test_no_label_names_an_instance_or_a_node(running: Running) -> None:
    s = running.scrape_all()
    for metric, samples in s.samples.items():
        for labels, _ in samples:
            assert not PER_INSTANCE & labels.keys(), f"{metric} has a per-instance label: {labels}"
