"""The running EPU the monitoring tests scrape: the demo's four services on the real RabbitMQ,
each with its /metrics on every interface (``metrics_host = "0.0.0.0"``), as a site configures
them for a Prometheus on another host."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from epu.common.testing import wait_for

from epu import demo as demo_module
from tests.conftest import RABBIT_ADMIN, RABBIT_HOST
from tests.deploy.scrape import SERVICES, Scrape, outside_address, port_of, scrape, with_metrics


class Running:
    def __init__(self, demo: Any) -> None:
        self.demo = demo
        self.host = outside_address()
        by_name = {(getattr(s, "name", None) or s.service.name).split("-")[0]: s for s in demo.services}
        self.ports = {name: port_of(by_name[name]) for name in SERVICES}
        self.engine = by_name["decision"].engine
        self.fleet = by_name["decision"].fleet

    def scrape(self, service: str) -> Scrape:
        out = Scrape()
        out.add(scrape(self.host, self.ports[service]))
        return out

    def scrape_all(self) -> Scrape:
        out = Scrape()
        for name in SERVICES:
            out.add(scrape(self.host, self.ports[name]))
        return out


@pytest.fixture(scope="module")
def running(rabbit_vhost: str) -> Iterator[Running]:
    build = demo_module.build_config
    mp = pytest.MonkeyPatch()
    mp.setattr(demo_module, "build_config", lambda *a, **k: with_metrics(build(*a, **k), "0.0.0.0"))
    settings = demo_module.DemoSettings(
        jobs=12, job_seconds=30.0, cores_per_node=2, max_nodes=4, boot_seconds=1.0, idle_seconds=30.0,
        stall_seconds=60.0, quota_a=2, timeout=120, seed=3, with_ctxbroker=True,
        broker_url=f"amqp://{RABBIT_ADMIN}@{RABBIT_HOST}/{rabbit_vhost}", prefix=f"mon{uuid.uuid4().hex[:8]}.")
    demo = demo_module.Demo(settings)
    try:
        demo.start()
        run = Running(demo)
        demo.submit_burst()
        wait_for(lambda: run.scrape("decision").value("epu_instances", state="joined") >= 2, 60, interval=0.2,
                 message="two instances joined, as the decision engine's /metrics shows")
        yield run
    finally:
        mp.undo()
        demo.close()
