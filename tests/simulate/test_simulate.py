"""``epu simulate`` end to end: the real cores in virtual time, from the CLI and from plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epu.cli import main
from epu.simulate.cloudmodel import load_cloud_model
from epu.simulate.output import stable
from epu.simulate.plan import Plan, run_plan
from epu.simulate.run import Options, default_config
from epu.workloads.generators import generate

KEYS = {"jobs", "jobs_completed", "wait_p50_s", "wait_p95_s", "node_hours", "cost", "peak_nodes", "launches",
        "wall_seconds", "wait_mean_s", "wait_max_s", "bounded_slowdown", "utilization", "failures",
        "replacements"}


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["simulate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_json_and_results_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _cli(capsys, "--generator", "burst:jobs=12,duration=600", "--json", "--no-progress",
                        "--out", str(tmp_path / "r"))
    assert code == 0
    s = json.loads(out)
    assert set(s) >= KEYS
    assert s["jobs"] == s["jobs_completed"] == 12 and s["peak_nodes"] == 12 and s["launches"] >= 12
    assert s["jobs_killed"] == 0
    assert 0 < s["wait_p50_s"] <= s["wait_p95_s"] < 600  # one boot and a poll or two
    assert s["node_hours"] > 12 * 600 / 3600 and s["cost"] == pytest.approx(s["node_hours"] * 0.1, rel=0.01)
    for f in ("summary.json", "timeline.csv", "timeline.png", "waits.png", "report.html"):
        assert (tmp_path / "r" / f).stat().st_size > 0
    html = (tmp_path / "r" / "report.html").read_text()
    assert "timeline.png" in html and "95th percentile wait" in html
    rows = (tmp_path / "r" / "timeline.csv").read_text().splitlines()
    assert rows[0].startswith("t_seconds,queued_jobs,running_jobs") and len(rows) > 10


def test_cli_trace_window_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.swf"
    trace.write_text("; MaxProcs: 4\n" + "".join(
        f"{i} {i * 4000} -1 {300 + 60 * i} {1 + i % 4} -1 -1 -1 -1 -1 1 1 1 -1 -1 -1 -1 -1\n" for i in range(1, 9)))
    code, out, _ = _cli(capsys, "--trace", str(trace), "--window-days", "0.25", "--policy", "threshold",
                        "--param", "idle_for_time_s=120", "--json", "--no-progress")
    assert code == 0
    s = json.loads(out)
    assert s["policy"] == "threshold" and s["jobs"] == 6 and s["jobs_completed"] == 6  # 6 jobs in the 6 hours from the first
    assert s["peak_nodes"] <= 4  # the trace's machine


def test_cli_list_and_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _cli(capsys, "--list")
    assert code == 0 and "epu-fig6" in out and "nasa-month" in out
    code, _, err = _cli(capsys, "--scenario", "nope")
    assert code == 2 and "unknown scenario 'nope'" in err
    bad = tmp_path / "bad.swf"
    bad.write_text("1 2 3\n")
    code, _, err = _cli(capsys, "--trace", str(bad), "--json")
    assert code == 2 and "bad.swf:1" in err
    code, _, err = _cli(capsys, "--generator", "burst", "--policy", "nope")
    assert code == 2 and "unknown policy 'nope'" in err
    code, _, err = _cli(capsys, "--json")
    assert code == 2 and "exactly one of" in err


def _plan(policy: str, params: dict, spec: str = "waves:waves=2,jobs=10,period=3600,run_min=60,run_max=900",
          billing: str = "second") -> Plan:
    w = generate(spec, seed=5)
    cfg = default_config(w, max_nodes=10)
    cloud = load_cloud_model(None, {"default": {"billing": billing, "boot": {"dist": "lognormal", "median": 90,
                                                                             "sigma": 0.4}}})
    return Plan("t", w, cfg, cloud, Options(seed=11, policy=policy, params=params, estimate="exact"))


def test_same_seed_same_report_bit_for_bit(tmp_path: Path) -> None:
    plan = _plan("queue-demand", {"idle_seconds": 60})
    a = run_plan(plan, tmp_path / "a")
    b = run_plan(plan, tmp_path / "b")
    assert stable(a) == stable(b)
    for f in ("summary.json", "timeline.csv"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    other = run_plan(Plan("t", plan.workload, plan.config, plan.cloud, Options(seed=12, policy="queue-demand")))
    assert other["digest"] != a["digest"]


SKIP_CASES = [
    ("queue-demand", {"idle_seconds": 0}, "second"),
    ("threshold", {"idle_for_time_s": 120, "waiting_jobs_time_s": 40}, "second"),
    ("spare", {"spare_nodes": 1, "idle_seconds": 60, "billing_period_seconds": 3600}, "hour"),
    ("start-time", {}, "second"),
    ("start-time", {"billing_period_seconds": 3600, "billing_margin_seconds": 300}, "hour"),
]


@pytest.mark.parametrize("policy, params, billing", SKIP_CASES)
def test_skipping_idle_iterations_is_exact(policy: str, params: dict, billing: str) -> None:
    """The fast path runs only the iterations that can decide: the same events at the same
    times (the digest covers every one) as running them all."""
    plan = _plan(policy, params, billing=billing)
    fast = run_plan(plan)
    plan.options.skip_idle = False
    slow = run_plan(plan)
    assert fast["engine_iterations_skipped"] > fast["engine_iterations"]  # it did skip
    drop = ("engine_iterations", "engine_iterations_skipped")
    assert {k: v for k, v in stable(fast).items() if k not in drop} == \
        {k: v for k, v in stable(slow).items() if k not in drop}


def test_an_operators_real_config(capsys: pytest.CaptureFixture[str]) -> None:
    """deploy/examples/epu.toml names EC2 and OpenStack sites with credentials files, key pairs and
    security groups: the simulation keeps their quota, price and cores and drops the rest."""
    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "epu.toml"
    code, out, _ = _cli(capsys, "--generator", "burst:jobs=8,duration=300", "--config", str(example), "--json",
                        "--no-progress")
    assert code == 0
    s = json.loads(out)
    assert s["domain"] == "alpha" and s["jobs_completed"] == 8
    assert s["launches"] == 2  # 4-core nodes for 8 one-core jobs, on the first-ranked site
    assert s["sites"]["ec2-east"]["launches"] == 2 and s["sites"]["ec2-east"]["cost"] > 0


def test_cli_compare_with_a_static_baseline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _cli(capsys, "--generator", "waves:waves=2,jobs=6,period=3600,run_min=120,run_max=600",
                        "--compare", "queue-demand", "--compare", "spare:spare_nodes=1,billing_period_seconds=0",
                        "--json", "--no-progress", "--out", str(tmp_path / "c"))
    assert code == 0
    r = json.loads(out)
    base, runs = r["baseline"], r["runs"]
    assert base["policy"] == f"static-{base['peak_nodes']}" and base["launches"] == 0
    assert base["wait_p50_s"] == 0  # sized for the peak: hardly anyone waits
    assert [x["policy"] for x in runs] == ["queue-demand", "spare:spare_nodes=1,billing_period_seconds=0"]
    assert all(x["jobs_completed"] == 12 for x in runs)
    assert runs[0]["cost"] < base["cost"]  # idle for most of two hours: elasticity pays
    assert runs[1]["cost"] > runs[0]["cost"]  # a spare node is paid for, until the run's tail ends
    for f in ("compare.csv", "compare.png", "compare.html", "compare.json", "01-queue-demand/report.html",
              "02-spare_spare_nodes=1_billing_period_seconds=0/timeline.csv"):
        assert (tmp_path / "c" / f).stat().st_size > 0
    assert len((tmp_path / "c" / "compare.csv").read_text().splitlines()) == 4


def test_cloud_model_in_a_run() -> None:
    """Capacity that grows over time, failing boots and API errors, per-hour billing."""
    w = generate("burst:jobs=8,duration=1200", seed=2)
    cloud = load_cloud_model(None, {"sites": {"cloud": {
        "capacity": [[0, 4], [1000, 8]], "boot_failure_rate": 0.3, "api_error_rate": 0.2,
        "boot": {"dist": "constant", "seconds": 60}, "billing": "hour", "price_per_hour": 1.0}}})
    plan = Plan("t", w, default_config(w, max_nodes=8), cloud, Options(seed=3))
    from epu.simulate.run import Simulate

    d = Simulate(plan.config, plan.workload, plan.cloud, plan.options).run()
    from epu.simulate.report import summarize

    s = summarize(d)
    assert s["jobs_completed"] == 8
    early = [r.instances["cloud"][0] for r in d.samples if r.t < 1000]
    assert max(early) <= 4 and s["peak_nodes"] > 4  # the account's limit, then its raise
    assert s["failures"] > 0 and s["api_errors"] > 0  # and still every job ran
    assert s["cost"] == pytest.approx(sum(max(1, -(-(min(v.terminated_at or d.end, d.end) - v.created_at) // 3600))
                                          for v in d.vms["cloud"]))  # whole hours at $1
