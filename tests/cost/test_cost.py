"""Cost accounting (epu/cost.py, epu cost): each paid node-second shared among the jobs on the
node, idle time to "(idle)", the sum over accounts equal to the total — read from the records
the services keep (the provisioner's instance lives, the engine's job spans), so a late start, a
gap or a restart loses nothing and bills nothing extra, and an unknown price is never 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from epu.common.messages import LaunchRequest
from epu.services.decision.occupancy import JobSpan
from epu.services.decision.store import Store as DecisionStore
from epu.services.provisioner.store import Store as ProvisionerStore

from epu.cli_cost import NO_JOBS, usage_from_records
from epu.cost import IDLE, Life, Occupancy, attribute, group, total

PRICES = {("a", ""): 1.0, ("b", "big"): 4.0}
OWN = {"j1": ("phys", "alice", "cpu"), "j2": ("chem", "bob", "cpu"), "j3": ("phys", "alice", "gpu")}


def story(tmp_path: Path) -> tuple[Path, Path]:
    """i1 at site a (1/h) lives 0..3600: idle 0..600, job j1 (alice) 600..1800, j1+j2 (bob)
    1800..2400, idle after. i2 (type big, 4/h) at site b lives 1200..3000, running j3 (alice)
    1800..3000. i3 at site a, no price anywhere, lives 0..1800. The stores as the services leave
    them: what ``epu cost`` reads."""
    prov, dec = tmp_path / "provisioner.db", tmp_path / "decision.db"
    p = ProvisionerStore(f"sqlite:///{prov}")
    for iid, site, typ, at, price in (("i1", "a", "", 0.0, 1.0), ("i2", "b", "big", 1200.0, 4.0),
                                      ("i3", "c", "", 0.0, None)):
        p.record_launch(LaunchRequest(launch_id=iid, domain="d", site=site, node_name=f"n-{iid}", instance_type=typ),
                        at, price)
        p.advance(iid, "pending", at + 10, cloud_id=f"c-{iid}")
    p.advance("i3", "terminated", 1800.0)
    p.advance("i2", "terminated", 3000.0)
    p.advance("i1", "terminated", 3600.0)
    p.close()
    d = DecisionStore(f"sqlite:///{dec}").create()

    def span(iid: str, job: str, start: float) -> JobSpan:
        return JobSpan("d", iid, job, start, start, None, *OWN[job])

    (r1,) = d.note_jobs("d", 600.0, [span("i1", "j1", 600.0)], [])
    r2, r3 = d.note_jobs("d", 1800.0, [span("i1", "j2", 1800.0), span("i2", "j3", 1800.0)], [])
    d.note_jobs("d", 2400.0, [], [(r1, 2400.0), (r2, 2400.0)])
    d.note_jobs("d", 3000.0, [], [(r3, 3000.0)])
    d.engine.dispose()
    return prov, dec


def _config(tmp_path: Path, prov: Path, dec: Path, sites: str = "") -> Path:
    cfg = tmp_path / "epu.toml"
    cfg.write_text(f'[provisioner]\nstore_url = "sqlite:///{prov}"\n[decision]\nstore_url = "sqlite:///{dec}"\n'
                   '[sites.a]\ndriver = "epu-sim"\nprice_per_hour = 9.0\n'
                   '[sites.b]\ndriver = "epu-sim"\n[sites.b.types.big]\nsize = "sim.big"\ncores = 16\n'
                   'price_per_hour = 9.0\n[sites.c]\ndriver = "epu-sim"\n' + sites)
    return cfg


def test_attribution_follows_the_rule_and_sums_to_the_total() -> None:
    lives = [Life("i1", "d", "a", "", 0.0, 3600.0), Life("i2", "d", "b", "big", 1200.0, 3000.0),
             Life("i3", "d", "c", "", 0.0, 1800.0)]
    occ = [Occupancy("i1", 600, 2400, "j1"), Occupancy("i1", 1800, 2400, "j2"), Occupancy("i2", 1800, 3000, "j3")]
    usage = attribute(lives, occ, OWN, PRICES, 0.0, 4000.0)
    accounts = {k[0]: round(u.cost, 6) for k, u in group(usage, ["account"])}
    # i1: idle 0..600 and 2400..3600 (1800 s), j1 600..1800 + half of 1800..2400, j2 half of that
    # i2: idle 1200..1800 at 4/h; j3 1800..3000 at 4/h; i3: no price, its 1800 s idle unpriced
    assert accounts == {IDLE: round(1800 / 3600 + 600 / 3600 * 4, 6), "phys": round(1500 / 3600 + 1200 / 3600 * 4, 6),
                        "chem": round(300 / 3600, 6)}
    t = total(usage)
    assert abs(sum(accounts.values()) - t.cost) < 1e-6 and t.node_seconds == pytest.approx(3600 + 1800 + 1800)
    assert t.unpriced_seconds == pytest.approx(1800)
    users = dict((k[0], u.node_seconds) for k, u in group(usage, ["user"]))
    assert users["alice"] == pytest.approx(1500 + 1200) and users["bob"] == pytest.approx(300)
    parts = dict((k, u.node_seconds) for k, u in group(usage, ["site", "type", "partition"]))
    assert parts[("b", "big", "gpu")] == pytest.approx(1200)
    clipped = attribute(lives, occ, OWN, PRICES, 1800.0, 2400.0)
    assert {k[0]: round(u.node_seconds) for k, u in group(clipped, ["account"])} == \
        {"phys": 300 + 600, "chem": 300}  # i3 ended at 1800


def test_the_price_at_launch_wins_and_an_unknown_one_is_never_0(tmp_path: Path) -> None:
    prov, dec = story(tmp_path)
    records = ProvisionerStore(f"sqlite:///{prov}").lives(0.0, 4000.0)
    report = usage_from_records(records, None, {("a", ""): 9.0, ("b", "big"): 9.0}, 0.0, 4000.0, 180.0)
    t = total(report.usage)
    assert t.cost == pytest.approx(1.0 + 4.0 * 0.5)  # 1 h at the recorded 1/h, 30 min at 4/h; not 9/h
    assert t.unpriced_seconds == pytest.approx(1800)
    assert {k[3] for k in report.usage} == {NO_JOBS}  # no job record given: the total stays right
    (warning,) = report.warnings
    assert warning.startswith("UNPRICED: 1 instance(s) of c have no price") and "0.50 node-hour(s)" in warning


def test_a_record_without_a_price_at_launch_takes_the_catalogue_with_a_warning(tmp_path: Path) -> None:
    prov, _dec = story(tmp_path)
    records = ProvisionerStore(f"sqlite:///{prov}").lives(0.0, 4000.0)
    report = usage_from_records(records, [], {("c", ""): 2.0}, 0.0, 4000.0, 180.0)
    assert total(report.usage).cost == pytest.approx(1.0 + 2.0 + 1.0)
    assert report.warnings == ["1 instance(s) of c kept no price at launch (recorded before prices were kept, or "
                               "adopted): priced at the configuration's catalogue as it is now"]


def test_epu_cost_reads_the_stores_as_json_csv_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from epu.cli import main

    prov, dec = story(tmp_path)
    cfg = _config(tmp_path, prov, dec)
    period = ["--since", "1970-01-01", "--until", "1970-01-01T01:10"]
    assert main(["cost", *period, "--by", "account,user", "--json", "-c", str(cfg)]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert abs(sum(r["cost"] for r in doc["rows"]) - doc["total"]["cost"]) < 1e-3
    assert doc["total"]["cost"] == pytest.approx(3.0) and not doc["total"]["complete"]
    assert doc["total"]["unpriced_node_hours"] == 0.5 and "UNPRICED" in out.err
    assert {(r["account"], r["user"]) for r in doc["rows"]} == {("phys", "alice"), ("chem", "bob"), (IDLE, IDLE)}
    assert {r["account"]: r["cost"] for r in doc["rows"]}["chem"] == pytest.approx(300 / 3600, abs=1e-4)
    assert main(["cost", *period, "--csv", "-c", str(cfg)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "account,node_hours,cost,unpriced_node_hours" and lines[-1].startswith("TOTAL,")
    assert main(["cost", *period, "--by", "site,type", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "TOTAL" in out and "big" in out and "+ unpriced" in out


def test_without_the_engines_store_the_total_is_still_right(tmp_path: Path, capsys) -> None:
    from epu.cli import main

    prov, _dec = story(tmp_path)
    cfg = _config(tmp_path, prov, tmp_path / "elsewhere.db")
    assert main(["cost", "--since", "1970-01-01", "--until", "1970-01-01T01:10", "--json", "-c", str(cfg)]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["total"]["cost"] == pytest.approx(3.0) and [r["account"] for r in doc["rows"]] == [NO_JOBS]
    assert "no store at" in out.err and "decision.store_url" in out.err


def test_epu_cost_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from epu.cli import main

    prov, dec = story(tmp_path)
    cfg = _config(tmp_path, prov, dec)
    assert main(["cost", "--by", "colour", "-c", str(cfg)]) == 2
    assert "--by: unknown dimension(s) colour" in capsys.readouterr().err
    assert main(["cost", "--since", "yesterday", "-c", str(cfg)]) == 2
    assert "not a time: 'yesterday'" in capsys.readouterr().err
    gone = _config(tmp_path, tmp_path / "no-such.db", dec)
    assert main(["cost", "-c", str(gone)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "provisioner.store_url" in err and "provisioner's store" in err


def test_a_period_in_the_future_bills_live_instances_until_now(tmp_path: Path) -> None:
    """An instance still running is paid until now, not until a --until in the future."""
    import time

    from epu.common.config import load_config

    from epu.cli_cost import read_report

    p = ProvisionerStore(f"sqlite:///{tmp_path / 'p.db'}")
    now = time.time()
    p.record_launch(LaunchRequest(launch_id="l1", domain="d", site="a", node_name="n1"), now - 3600, 2.0)
    p.close()
    cfg = load_config(_config(tmp_path, tmp_path / "p.db", tmp_path / "d.db"), environ={})
    report = read_report(cfg, now - 7200, now + 7200, now)
    assert total(report.usage).cost == pytest.approx(2.0, rel=1e-6)
