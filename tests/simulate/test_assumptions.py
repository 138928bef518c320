"""What `epu simulate` tells an operator about its own assumptions: each site's cloud model (from
--cloud, from the site's knobs in the config, or the default) shown in full, a stall_seconds
shorter than the boots warned of (and by `epu config check`), the static cluster beside a single
run, churn flagged, --compare runs labelled by what sets them apart, and a missing plots extra
said before the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from epu.cli import main
from epu.simulate.plan import Plan, run_plan
from epu.simulate.run import Options
from epu.simulate.static import static_summary
from epu.workloads.generators import generate

LAB = """
[sensor]
domain = "alpha"
poll_seconds = 10
[domains.alpha]
max_nodes = 4
sites = ["lab"]
params = {{ stall_seconds = {stall} }}
[sites.lab]
driver = "epu-sim"
driver_args = {{ boot_time_min = {lo}, boot_time_max = {hi}, boot_failure_rate = {fail} }}
quota = 4
price_per_hour = 0.1
"""


def lab(tmp_path: Path, *, stall: float = 600, lo: float = 60, hi: float = 180, fail: float = 0.0) -> Path:
    path = tmp_path / "epu.toml"
    path.write_text(LAB.format(stall=stall, lo=lo, hi=hi, fail=fail))
    return path


def simulate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["simulate", "--no-progress", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_sites_own_boot_knobs_in_the_config_are_its_cloud_model(capsys, tmp_path) -> None:
    """Boots of 2–4 s in the site's driver_args: jobs wait seconds, not the default model's minutes."""
    code, out, _ = simulate(capsys, "-c", str(lab(tmp_path, lo=2, hi=4)), "--generator",
                            "burst:jobs=4,duration=600", "--json")
    assert code == 0
    s = json.loads(out)
    assert s["cloud_model"]["lab"]["source"] == "config"
    assert s["cloud_model"]["lab"]["boot"] == {"dist": "uniform", "min": 2.0, "max": 4.0}
    assert s["wait_max_s"] < 60  # a 60–180 s default boot could not start any job this soon


def test_the_report_shows_the_model_used_in_full(capsys, tmp_path) -> None:
    code, out, _ = simulate(capsys, "--generator", "burst:jobs=3,duration=300", "--json",
                            "--out", str(tmp_path / "r"))
    assert code == 0
    model = json.loads(out)["cloud_model"]["cloud"]
    assert model["source"] == "default"
    assert model["boot"] == {"dist": "uniform", "min": 60.0, "max": 180.0}
    assert model["boot_failure_rate"] == 0 and model["billing"] == "second" and model["price_per_hour"] == 0.1
    html = (tmp_path / "r" / "report.html").read_text()
    cloud_section = html.split("<h2>Cloud model</h2>", 1)[1]
    assert "&quot;uniform&quot;" in cloud_section and "&quot;max&quot;: 180.0" in cloud_section


def test_stall_seconds_shorter_than_the_boots_is_warned_by_the_report_and_config_check(capsys, tmp_path) -> None:
    short = lab(tmp_path, stall=120)
    code, out, _ = simulate(capsys, "-c", str(short), "--generator", "burst:jobs=8,duration=600")
    assert code == 0
    assert "warning: domains.alpha.params.stall_seconds=120 is shorter than a slow boot of site lab (180 s" in out
    assert "cloud model of lab (config): boots in 60–180 s (uniform)" in out
    code = main(["config", "check", str(short)])
    err = capsys.readouterr().err
    assert code == 0 and "warning: domains.alpha.params.stall_seconds=120" in err and "above 190" in err
    ok = tmp_path / "ok"
    ok.mkdir()
    code, out, _ = simulate(capsys, "-c", str(lab(ok, stall=600)), "--generator", "burst:jobs=8,duration=600",
                            "--json")
    assert code == 0 and json.loads(out)["warnings"] == []
    assert main(["config", "check", str(ok / "epu.toml")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_single_run_carries_the_static_baseline_and_flags_churn(capsys, tmp_path) -> None:
    w = generate("burst:jobs=6,duration=600", seed=1)
    plan = Plan("t", w, _config(tmp_path, fail=0.0), _cloud(), Options(seed=1))
    s = run_plan(plan)
    static = static_summary(w, 4, 1, 0.1)
    assert s["baseline"]["cost"] == static["cost"] and s["baseline"]["wait_p95_s"] == static["wait_p95_s"]
    assert s["baseline"]["peak_nodes"] == 4
    assert s["launches_per_job"] == pytest.approx(s["launches"] / 6, abs=1e-3)
    assert not any(x.startswith("churn") for x in s["warnings"])
    # most boots fail: more instances than jobs
    churned = run_plan(Plan("t", w, _config(tmp_path, fail=0.9), _cloud(), Options(seed=1)))
    assert churned["launches"] > 6
    (churn,) = [x for x in churned["warnings"] if x.startswith("churn:")]
    assert churn.startswith(f"churn: {churned['launches']} instances launched for 6 jobs")
    assert f"{churned['failures']} of them never ran" in churn


def _config(tmp_path: Path, fail: float):
    from epu.simulate.plan import load_simulation_config

    d = tmp_path / f"f{fail}"
    d.mkdir(exist_ok=True)
    return load_simulation_config(lab(d, lo=2, hi=4, fail=fail))


def _cloud():
    from epu.simulate.cloudmodel import CloudModel

    return CloudModel()


def test_compare_labels_runs_by_what_sets_them_apart(capsys, tmp_path) -> None:
    from epu.simulate.plan import variant_labels

    labels, common = variant_labels([("queue-demand", {"idle_seconds": 60, "stall_seconds": 900}),
                                     ("queue-demand", {"idle_seconds": 600, "stall_seconds": 900}),
                                     ("threshold", {"stall_seconds": 900})])
    assert labels == ["queue-demand:idle_seconds=60", "queue-demand:idle_seconds=600", "threshold"]
    assert common == {"stall_seconds": 900}
    assert variant_labels([("spare", {}), ("spare", {})])[0] == ["spare #1", "spare #2"]
    code, out, _ = simulate(capsys, "--generator", "burst:jobs=4,duration=300", "--json", "--out", str(tmp_path / "c"),
                            "--compare", "queue-demand:idle_seconds=60,stall_seconds=900",
                            "--compare", "queue-demand:idle_seconds=600,stall_seconds=900")
    assert code == 0
    r = json.loads(out)
    assert [x["policy"] for x in r["runs"]] == ["queue-demand:idle_seconds=60", "queue-demand:idle_seconds=600"]
    assert r["common_params"] == {"stall_seconds": 900}
    assert (tmp_path / "c" / "01-queue-demand_idle_seconds=60" / "report.html").is_file()
    assert (tmp_path / "c" / "02-queue-demand_idle_seconds=600" / "report.html").is_file()


def test_out_without_the_plots_extra_says_what_to_install_before_the_run(capsys, tmp_path, monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    code, out, err = simulate(capsys, "--generator", "burst:jobs=3,duration=300", "--out", str(tmp_path / "r"))
    assert code == 2
    assert "pip install 'epu[plots]'" in err
    assert out == "" and not (tmp_path / "r").exists()  # nothing ran, nothing written


def test_compare_runs_in_parallel_with_the_figures_of_one_after_another(capsys, tmp_path) -> None:
    from epu.simulate.output import stable

    argv = ["--generator", "waves:waves=2,jobs=4,period=1800,run_min=120,run_max=600", "--json",
            "--compare", "queue-demand:idle_seconds=60", "--compare", "queue-demand:idle_seconds=600",
            "--compare", "threshold"]
    code, out, _ = simulate(capsys, *argv, "--jobs", "1")
    assert code == 0
    one = json.loads(out)
    code, out, _ = simulate(capsys, *argv, "--jobs", "3", "--out", str(tmp_path / "p"))
    assert code == 0
    par = json.loads(out)
    assert [stable(r) for r in par["runs"]] == [stable(r) for r in one["runs"]]
    assert par["baseline"] == one["baseline"]
    assert (tmp_path / "p" / "03-threshold" / "report.html").is_file()  # written by its worker
    with pytest.raises(SystemExit) as exit_:
        simulate(capsys, *argv, "--jobs", "0")
    assert exit_.value.code == 2 and "--jobs: expected 1 or more, got 0" in capsys.readouterr().err
