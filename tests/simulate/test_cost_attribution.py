"""``epu simulate``'s report attributes the run's cost to the accounts, users and partitions whose
jobs ran (epu cost's rule), idle time to "(idle)", summing to the report's cost."""

from __future__ import annotations

from dataclasses import replace

import pytest

from epu.simulate.cloudmodel import load_cloud_model
from epu.simulate.plan import Plan
from epu.simulate.report import summarize
from epu.simulate.run import Options, Simulate, default_config
from epu.workloads.generators import generate


@pytest.mark.parametrize("billing", ["second", "hour"])
def test_report_attributes_cost_to_accounts(billing: str) -> None:
    w = generate("burst:jobs=8,duration=1200", seed=2)
    jobs = [replace(j, account="phys" if i % 2 else "chem", user=f"u{i % 3}", queue="cpu" if i < 6 else "gpu")
            for i, j in enumerate(w.jobs)]
    w = replace(w, jobs=jobs)
    cloud = load_cloud_model(None, {"sites": {"cloud": {"boot": {"dist": "constant", "seconds": 60},
                                                        "billing": billing, "price_per_hour": 1.0}}})
    plan = Plan("t", w, default_config(w, max_nodes=8), cloud, Options(seed=3))
    s = summarize(Simulate(plan.config, plan.workload, plan.cloud, plan.options).run())
    a = s["attribution"]
    for dim in ("by_account", "by_user", "by_partition"):
        assert sum(a[dim].values()) == pytest.approx(s["cost"], abs=1e-3), dim
    assert set(a["by_account"]) == {"phys", "chem", "(idle)"} and a["by_account"]["(idle)"] > 0
    run = {acct: sum(j.run for i, j in enumerate(jobs) if (i % 2 == 1) == (acct == "phys")) for acct in ("phys", "chem")}
    # each job had a node of its own: an account pays its jobs' run time at $1/h
    for acct, seconds in run.items():
        assert a["by_account"][acct] == pytest.approx(seconds / 3600, rel=0.02)
    assert set(a["by_partition"]) == {"cpu", "gpu", "(idle)"}


def test_traces_carry_the_account(tmp_path) -> None:
    """sacct traces (text and JSON, captured from a real Slurm) give each job its account."""
    import json
    from pathlib import Path

    from epu.workloads.slurm import parse_sacct_json, read_sacct

    data = Path(__file__).resolve().parent / "data"
    text = (data / "sacct-parsable2.txt").read_text().splitlines()
    path = tmp_path / "sacct.txt"
    path.write_text("\n".join([text[0] + "|Account", *(r + "|physics" for r in text[1:])]) + "\n")
    assert {j.account for j in read_sacct(path).jobs} == {"physics"}
    doc = json.loads((data / "sacct.json").read_text())
    for job in doc["jobs"]:
        job["account"] = "chem"
    assert {j.account for j in parse_sacct_json(doc).jobs} == {"chem"}
