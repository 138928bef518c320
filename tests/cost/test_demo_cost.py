"""The demo under a spend cap: the live instances never cost more per hour than the cap, every
job still runs, and its cost is attributed to the accounts whose jobs ran — in the summary and
through ``epu cost`` on the ledger the demo kept — summing to the total."""

from __future__ import annotations

import json

import pytest

from epu.demo import DemoSettings, run_demo


def test_demo_holds_the_cap_and_accounts_for_its_cost(tmp_path, capsys) -> None:
    from epu.cli import main

    ledger = tmp_path / "ledger.jsonl"
    s = DemoSettings(jobs=8, job_seconds=1.5, cores_per_node=1, max_nodes=4, boot_seconds=0.5, idle_seconds=0.5,
                     stall_seconds=20, timeout=120, seed=3, with_ctxbroker=False, budget_per_hour=0.1,
                     cost_ledger=str(ledger))
    summary = run_demo(s, live_display=False, out=None)
    assert not summary["timed_out"] and summary["jobs_completed"] == 8
    # cloud-a costs 0.05/h, cloud-b 0.12/h: the cap admits two cloud-a workers at a time, never more
    assert 0 < summary["peak_spend_per_hour"] <= 0.1 + 1e-9 and summary["peak_instances"] <= 2
    by = summary["cost_by_account"]
    assert {"physics", "chemistry", "(idle)"} <= set(by) and by["physics"] > by["chemistry"] > 0
    assert sum(by.values()) == pytest.approx(summary["cost_total"], abs=1e-6)
    cfg = tmp_path / "epu.toml"
    cfg.write_text('[sites.cloud-a]\ndriver = "epu-sim"\nprice_per_hour = 0.05\n'
                   '[sites.cloud-b]\ndriver = "epu-sim"\nprice_per_hour = 0.12\n')
    assert main(["cost", "--ledger", str(ledger), "--by", "account,user", "--json", "-c", str(cfg)]) == 0
    doc = json.loads(capsys.readouterr().out)
    users = {(r["account"], r["user"]) for r in doc["rows"]}
    assert {("physics", "alice"), ("physics", "bob"), ("chemistry", "carol")} <= users
    assert sum(r["cost"] for r in doc["rows"]) == pytest.approx(doc["total"]["cost"], abs=1e-3)
    assert doc["total"]["cost"] >= summary["cost_total"] - 1e-3
