"""The demo's cost as ``epu cost`` reads it from the services' stores: under a spend cap the live
instances never cost more per hour than the cap and the cost is attributed to the accounts whose
jobs ran, summing to the total; and (issue 34) with the decision engine restarted mid-run, the
stores' total agrees with what the engines' ``epu_spend_total`` counted."""

from __future__ import annotations

import time

import pytest
from epu.common.testing import wait_for

from epu.cli_cost import read_report
from epu.cost import IDLE, group, total
from epu.demo import Demo, DemoSettings, run_demo


def test_demo_holds_the_cap_and_accounts_for_its_cost() -> None:
    s = DemoSettings(jobs=8, job_seconds=1.5, cores_per_node=1, max_nodes=4, boot_seconds=0.5, idle_seconds=0.5,
                     stall_seconds=20, timeout=120, seed=3, with_ctxbroker=False, budget_per_hour=0.1)
    summary = run_demo(s, live_display=False, out=None)
    assert not summary["timed_out"] and summary["jobs_completed"] == 8
    # cloud-a costs 0.05/h, cloud-b 0.12/h: the cap admits two cloud-a workers at a time, never more
    assert 0 < summary["peak_spend_per_hour"] <= 0.1 + 1e-9 and summary["peak_instances"] <= 2
    by = summary["cost_by_account"]
    assert {"physics", "chemistry", IDLE} <= set(by) and by["physics"] > by["chemistry"] > 0
    assert sum(by.values()) == pytest.approx(summary["cost_total"], abs=1e-6)


def _decision(demo: Demo):
    return next(svc for svc in demo.services if getattr(svc, "name", "") == "decision")


def _spend(svc) -> float:
    return sum(svc.fleet.spend_total.values())


def test_epu_cost_agrees_with_epu_spend_total_across_an_engine_restart() -> None:
    from epu.common.runtime import run_in_thread
    from epu.services.decision.app import build_service as build_decision

    s = DemoSettings(jobs=16, job_seconds=8.0, cores_per_node=1, max_nodes=4, boot_seconds=0.5, idle_seconds=1.0,
                     stall_seconds=30, timeout=180, seed=5, with_ctxbroker=False)
    demo = Demo(s)
    try:
        t0 = time.time()
        demo.start()
        first = _decision(demo)
        first.fleet.min_interval = 0.0  # sample at every iteration (1 s): the counter's own resolution
        demo.submit_burst()
        wait_for(lambda: demo.batch.completed >= 6 and len(demo.obs.live()) >= 2, 90, interval=0.1,
                 message="the run under way: jobs done, instances still paid for")
        first.stop()
        demo.threads[demo.services.index(first)].join(15)
        counted_first = _spend(first)
        second = build_decision(demo.config)  # the same stores: the engine's restart
        second.fleet.min_interval = 0.0
        demo.services.append(second)
        demo.threads.append(run_in_thread(second))
        assert second.wait_ready(15)
        wait_for(demo.finished, 150, interval=0.2, message="every job run and every instance gone")
        wait_for(lambda: second.fleet.sample.spend_rate and not any(second.fleet.sample.spend_rate.values()), 30,
                 interval=0.1, message="the second engine sampling nothing left to pay for")
        counted = counted_first + _spend(second)
        now = time.time()
        report = read_report(demo.config, t0, now, now)
        billed = total(report.usage)
    finally:
        demo.close()
    assert report.warnings == [] and billed.unpriced_seconds == 0
    # the engines count from their own records and miss the restart's seconds; the stores miss nothing
    assert billed.cost == pytest.approx(counted, rel=0.08)
    assert billed.cost >= counted * 0.98
    accounts = {k[0] for k, _u in group(report.usage, ["account"])}
    assert {"physics", "chemistry"} <= accounts
    print(f"epu cost {billed.cost:.6f} against epu_spend_total {counted:.6f} "
          f"({counted_first:.6f} before the restart)")
