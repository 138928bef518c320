"""bench/report.py writes docs tables from the benchmarks' --json output, and nothing else."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
from benchjson import Results  # noqa: E402


def result(tmp: Path, name: str) -> dict:
    r = Results(name)
    r.add("poll, steady (50 nodes)", unit="ms", wall=[0.001, 0.002, 0.004], cpu=[0.001, 0.001, 0.002], scale=1000,
          baseline="listing alone (50 nodes)")
    r.doc["max_rss_mib"] = 61
    (tmp / f"{name}.json").write_text(json.dumps(r.doc))
    return r.doc


def test_block_between_markers_is_replaced_and_prose_kept(tmp_path: Path) -> None:
    doc = tmp_path / "perf.md"
    doc.write_text("# Perf\n\nprose before\n<!-- bench:reconcile -->\nold table\n<!-- /bench:reconcile -->\nprose after\n")
    results = tmp_path / "results"
    results.mkdir()
    result(results, "reconcile")
    assert report.main(["--results", str(results), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "old table" not in text and "prose before" in text and "prose after" in text
    assert "| poll, steady (50 nodes) | 1 / 2 / 4 | 1 / 1 / 2 | ms | listing alone (50 nodes) |" in text
    assert "max_rss_mib 61" in text
    assert report.main(["--results", str(results), "--doc", str(doc), "--check"]) == 0


def test_result_without_markers_is_appended_and_check_sees_drift(tmp_path: Path) -> None:
    doc = tmp_path / "perf.md"
    doc.write_text("# Perf\n")
    results = tmp_path / "results"
    results.mkdir()
    result(results, "sim")
    assert report.main(["--results", str(results), "--doc", str(doc), "--check"]) == 1  # not written yet
    assert report.main(["--results", str(results), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert report.APPENDIX in text and "### sim" in text and "<!-- bench:sim -->" in text
    report.main(["--results", str(results), "--doc", str(doc)])
    assert doc.read_text().count("<!-- bench:sim -->") == 1  # idempotent


def test_no_results_is_an_error(tmp_path: Path) -> None:
    doc = tmp_path / "perf.md"
    doc.write_text("# Perf\n")
    assert report.main(["--results", str(tmp_path), "--doc", str(doc)]) == 2
