"""bench/side_by_side.py and bench/compare_figures.py: which numbers are figures, the verdict
against the threshold, and bad input named — on hand-made JSON and two toy trees, no real bench."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import side_by_side  # noqa: E402
from benchjson import Results  # noqa: E402
from compare_figures import Sample, compare, extract, failed, markdown, verdict  # noqa: E402


def test_cpu_is_preferred_over_wall_and_context_is_not_a_figure() -> None:
    r = Results("decision")
    r.add("iterate, 10k nodes", unit="ms", wall=[0.004, 0.005, 0.009], cpu=[0.002, 0.003, 0.004], scale=1000,
          goal_ms=20)
    r.add("store writes", unit="ms", wall=[0.07], scale=1000)
    r.doc["decision_process_mib"] = {"what": "epu run decision", "VmRSS": 88.9, "VmHWM": 93.3, "goal": 100,
                                     "iteration_wall_ms_mean": 6.6}
    r.doc["scale_rss_mib"] = {"1 domain": [41, 107]}
    r.doc["nodes"] = 10_000
    figs = extract(r.doc)
    assert figs["iterate, 10k nodes (cpu)"] == Sample(2.0, 3.0, "ms", "cpu")
    assert "iterate, 10k nodes (wall)" not in figs
    assert figs["store writes (wall)"] == Sample(70.0, 70.0, "ms", "wall")
    assert figs["decision_process_mib › VmRSS"] == Sample(88.9, 88.9, "MiB", "mem")
    assert figs["decision_process_mib › iteration_wall_ms_mean"].kind == "wall"
    assert figs["scale_rss_mib › 1 domain › [1]"].median == 107
    assert not any("goal" in k or k == "nodes" or "what" in k for k in figs)


def test_sensor_shape_backend_read_and_floor_by_cpu() -> None:
    stats = {"min": 0.2, "median": 0.21, "max": 0.3}
    doc = {"machine": {"cpus": 2, "load_average": [1.0]}, "nodes": 10_000,
           "slurm": {"seconds": 0.21, "wall": stats, "cpu": stats, "floor_wall": stats,
                     "floor_cpu": {"min": 0.06, "median": 0.063, "max": 0.07}, "ratio_to_floor": 3.3},
           "snapshot": {"mib": 0.789, "encode_seconds": stats, "encode_cpu": stats}}
    assert set(extract(doc)) == {"slurm (cpu)", "slurm › floor_cpu", "snapshot › mib", "snapshot › encode_cpu"}
    assert extract(doc)["slurm › floor_cpu"] == Sample(0.06, 0.063, "s", "cpu")


def test_verdict_against_the_threshold() -> None:
    assert verdict(1.10, 1.2, 0.10) == "ok"
    assert verdict(0.85, 0.9, 0.10) == "faster"
    assert verdict(1.15, 1.05, 0.10) == "over (min ok)"
    assert verdict(1.15, 1.11, 0.10) == "OVER"
    assert verdict(1.15, 1.11, 0.20) == "ok"
    assert verdict(None, None, 0.10) == "n/a"
    with pytest.raises(ValueError, match="threshold"):
        verdict(1.0, 1.0, -0.1)


def test_compare_aggregates_runs_and_names_a_figure_one_tree_lacks() -> None:
    base = [{"f": Sample(10, 12, "ms", "cpu"), "old": Sample(1, 1, "ms", "cpu")},
            {"f": Sample(9, 11, "ms", "cpu"), "old": Sample(1, 1, "ms", "cpu")},
            {"f": Sample(11, 30, "ms", "cpu"), "old": Sample(1, 1, "ms", "cpu")}]
    head = [{"f": Sample(10, 13, "ms", "cpu"), "new": Sample(2, 2, "MiB", "mem")},
            {"f": Sample(12, 14, "ms", "cpu")},
            {"f": Sample(11, 13.5, "ms", "cpu")}]
    rows = {r.figure: r for r in compare(base, head, 0.10)}
    f = rows["f"]
    assert (f.base_min, f.base_median, f.head_min, f.head_median) == (9, 12, 10, 13.5)
    assert f.ratio_median == pytest.approx(13.5 / 12) and f.ratio_min == pytest.approx(10 / 9)
    assert f.verdict == "OVER"
    assert rows["old"].verdict == "only in base" and rows["new"].verdict == "only in head"
    table = markdown(list(rows.values()))
    assert "| f | ms CPU | 9 / 12 | 10 / 13.5 | 1.125 / 1.111 | OVER |" in table
    with pytest.raises(ValueError, match="at least one run"):
        compare([], head)


def test_a_floor_is_a_control_that_never_fails_the_comparison() -> None:
    base = [{"slurm (cpu)": Sample(1, 1, "s", "cpu"), "slurm › floor_cpu": Sample(1, 1, "s", "cpu")}]
    head = [{"slurm (cpu)": Sample(1, 1, "s", "cpu"), "slurm › floor_cpu": Sample(2, 2, "s", "cpu")}]
    rows = compare(base, head)
    assert [r.verdict for r in rows] == ["ok", "OVER (control)"] and failed(rows) == []
    head[0]["slurm (cpu)"] = Sample(2, 2, "s", "cpu")
    assert [r.figure for r in failed(compare(base, head))] == ["slurm (cpu)"]


def test_a_zero_base_is_not_a_division_error() -> None:
    rows = compare([{"z": Sample(0, 0, "MiB", "mem")}], [{"z": Sample(0, 0, "MiB", "mem")}])
    assert rows[0].ratio_median == 1.0 and rows[0].verdict == "ok"
    rows = compare([{"z": Sample(0, 0, "MiB", "mem")}], [{"z": Sample(1, 1, "MiB", "mem")}])
    assert rows[0].verdict == "n/a"


def toy_tree(root: Path, cpu_ms: float, *, fail: bool = False) -> Path:
    """A tree with a venv whose python is this interpreter and a bench printing one figure."""
    (root / ".venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, root / ".venv" / "bin" / "python")
    (root / "bench").mkdir()
    doc = {"bench": "toy", "figures": {"iterate": {"unit": "ms", "cpu": dict.fromkeys(("min", "median", "max"),
                                                                                     cpu_ms)}}}
    body = ("import sys; sys.stderr.write('boom: no broker\\n'); sys.exit(3)" if fail else
            f"print({json.dumps(json.dumps(doc))})")
    (root / "bench" / "bench_toy.py").write_text(body + "\n")
    return root


def test_main_runs_both_trees_alternately_and_fails_on_over(tmp_path: Path, capsys) -> None:
    base, head = toy_tree(tmp_path / "base", 10.0), toy_tree(tmp_path / "head", 10.5)
    assert side_by_side.main(["--base", str(base), "--head", str(head), "--pairs", "2", "toy"]) == 0
    out = capsys.readouterr()
    assert "| iterate (cpu) | ms CPU | 10 / 10 | 10.5 / 10.5 | 1.050 / 1.050 | ok |" in out.out
    assert out.err.index("base run 1/2") < out.err.index("head run 1/2") < out.err.index("head run 2/2") \
        < out.err.index("base run 2/2")
    slow = toy_tree(tmp_path / "slow", 12.0)
    assert side_by_side.main(["--base", str(base), "--head", str(slow), "--pairs", "1", "--json", "toy"]) == 1
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["verdict"] == "OVER"


def test_bad_input_is_named(tmp_path: Path, capsys) -> None:
    head = toy_tree(tmp_path / "head", 1.0)

    def err(*argv: str) -> str:
        assert side_by_side.main(list(argv)) == 2
        return capsys.readouterr().err

    assert "no such directory" in err("--base", str(tmp_path / "nope"), "--head", str(head), "toy")
    (tmp_path / "novenv" / "bench").mkdir(parents=True)
    assert "no .venv/bin/python" in err("--base", str(tmp_path / "novenv"), "--head", str(head), "toy")
    other = toy_tree(tmp_path / "other", 1.0)
    assert "no bench/bench_missing.py" in err("--base", str(other), "--head", str(head), "missing")
    assert "not a benchmark name" in err("--base", str(other), "--head", str(head), "../etc")
    assert "same tree" in err("--base", str(head), "--head", str(head), "toy")
    assert "--pairs" in err("--base", str(other), "--head", str(head), "--pairs", "0", "toy")
    failing = toy_tree(tmp_path / "failing", 1.0, fail=True)
    msg = err("--base", str(failing), "--head", str(head), "--pairs", "1", "toy")
    assert "base: `" in msg and "exited 3" in msg and "boom: no broker" in msg


def test_script_from_head_runs_the_heads_bench_on_the_base_code(tmp_path: Path, capsys) -> None:
    base = toy_tree(tmp_path / "base", 1.0)
    (base / "bench" / "bench_toy.py").unlink()  # the base tree lacks the bench
    (base / "marker.py").write_text("CPU = 4.0\n")
    head = toy_tree(tmp_path / "head", 1.0)
    (head / "marker.py").write_text("CPU = 2.0\n")
    (head / "bench" / "bench_toy.py").write_text(
        "import json, sys; from pathlib import Path\n"
        "sys.path.insert(0, str(Path(__file__).resolve().parents[1])); from marker import CPU\n"
        "print(json.dumps({'figures': {'t': {'unit': 'ms', 'cpu': {'min': CPU, 'median': CPU, 'max': CPU}}}}))\n")
    assert side_by_side.main(["--base", str(base), "--head", str(head), "--pairs", "1", "toy"]) == 2
    assert "no bench/bench_toy.py" in capsys.readouterr().err
    argv = ["--base", str(base), "--head", str(head), "--pairs", "1", "--script-from", "head", "toy"]
    assert side_by_side.main(argv) == 0
    assert "| t (cpu) | ms CPU | 4 / 4 | 2 / 2 | 0.500 / 0.500 | faster |" in capsys.readouterr().out
