"""The provisioner's own metrics: cloud API latency by call and outcome, boot time, work in flight."""

from __future__ import annotations

from epu.common.messages import LaunchRequest, TerminateRequest
from epu.services.provisioner.metrics import ProvisionerMetrics
from epu.services.provisioner.sim import SimulatedNodeDriver
from prometheus_client import CollectorRegistry


def count(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value(name, labels) or 0.0


def test_every_cloud_attempt_is_timed_with_its_outcome_and_boot_time_is_measured(make_provisioner, cloud: SimulatedNodeDriver,
                                                                                 clock) -> None:
    reg = CollectorRegistry()
    metrics = ProvisionerMetrics(reg)
    prov, events = make_provisioner({"sim": cloud}, on_cloud_call=metrics.cloud_call)
    events.subscribe(metrics.published)
    metrics.watch_runners(prov.runners)

    cloud.inject("transient", 2)  # two attempts fail and are retried, the third succeeds
    prov.handle_launch(LaunchRequest(launch_id="m1", domain="alpha", site="sim", node_name="n1"))
    assert prov.wait_idle()
    labels = {"site": "sim", "call": "create"}
    assert count(reg, "epu_provisioner_cloud_call_seconds_count", **labels, outcome="transient") == 2
    assert count(reg, "epu_provisioner_cloud_call_seconds_count", **labels, outcome="ok") == 1

    cloud.set_knobs(quota=0)  # a full cloud answers with a capacity error, not retried
    prov.handle_launch(LaunchRequest(launch_id="m2", domain="alpha", site="sim", node_name="n2"))
    assert prov.wait_idle()
    assert count(reg, "epu_provisioner_cloud_call_seconds_count", **labels, outcome="capacity") == 1
    assert count(reg, "epu_provisioner_failures_total", site="sim", kind="capacity") == 1

    clock.advance(120)  # the simulated boot is over: the next poll sees it running
    prov.poll("sim")
    assert events.states("m1")[-1] == "started"
    assert count(reg, "epu_provisioner_cloud_call_seconds_count", site="sim", call="list", outcome="ok") >= 1
    assert count(reg, "epu_provisioner_boot_seconds_count", site="sim") == 1
    assert count(reg, "epu_provisioner_boot_seconds_sum", site="sim") == 120

    prov.handle_terminate(TerminateRequest(request_id="t", instance_id="m1", domain="alpha"))
    assert prov.wait_idle()
    assert count(reg, "epu_provisioner_cloud_call_seconds_count", site="sim", call="destroy", outcome="ok") == 1
    assert count(reg, "epu_provisioner_site_in_flight", site="sim") == 0


def test_presence_changes_and_alerts_are_counted_apart_from_transitions(make_provisioner, cloud, clock) -> None:
    reg = CollectorRegistry()
    metrics = ProvisionerMetrics(reg)
    prov, events = make_provisioner({"sim": cloud})
    events.subscribe(metrics.published)
    prov.handle_launch(LaunchRequest(launch_id="m1", domain="alpha", site="sim", node_name="n1"))
    assert prov.wait_idle()
    cloud.inject("partial", 3, call="list")
    for _ in range(3):
        clock.advance(30)
        prov.poll("sim")
    prov.poll("sim")  # listed again
    assert count(reg, "epu_provisioner_presence_changes_total", site="sim", change="presumed_gone") == 1
    assert count(reg, "epu_provisioner_presence_changes_total", site="sim", change="readopted") == 1
    assert count(reg, "epu_provisioner_transitions_total", site="sim", state="pending") == 1
