"""Cost accounting (epu/cost.py, epu cost): each paid node-second shared among the jobs on the
node, idle time to "(idle)", the sum over accounts equal to the total; the live ledger kept by
``epu cost record`` from the real event stream (RabbitMQ)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from epu.common.messages import InstanceEvent, NodeInfo, SensorSnapshot

from epu.cost import IDLE, Ledger, group, total

PRICES = {("a", ""): 1.0, ("b", "big"): 4.0}


def ev(iid: str, state: str, seq: int, at: float, site: str = "a", typ: str = "") -> InstanceEvent:
    return InstanceEvent(instance_id=iid, domain="d", site=site, state=state, seq=seq, node_name=f"n-{iid}",
                         at=at, instance_type=typ)


def snap(at: float, nodes: dict[str, list[str]], owners: dict[str, list[str]], *, identity: bool = True) -> SensorSnapshot:
    return SensorSnapshot(domain="d", backend="test", taken_at=at, owners=owners, nodes=[
        NodeInfo(name=f"n-{iid}", state="busy" if jobs else "free", cores=4, jobs=jobs,
                 instance_id=iid if identity else None) for iid, jobs in nodes.items()])


def story() -> list:
    """i1 at site a (1/h) lives 0..3600: idle 0..600, job j1 (alice) 600..1800, j1+j2 (bob) 1800..2400,
    idle after. i2 (type big, 4/h) at site b lives 1200..3000, running j3 (alice) 1800..3000 (no identity)."""
    own = {"j1": ["phys", "alice", "cpu"], "j2": ["chem", "bob", "cpu"], "j3": ["phys", "alice", "gpu"]}
    return [
        ev("i1", "requested", 0, 0.0), ev("i1", "joined", 3, 300.0),
        snap(0.0, {"i1": []}, {}),
        snap(600.0, {"i1": ["j1"]}, own),
        ev("i2", "requested", 0, 1200.0, "b", "big"), ev("i2", "joined", 3, 1500.0, "b", "big"),
        snap(1800.0, {"i1": ["j1", "j2"], "i2": ["j3"]}, own, identity=False),
        snap(2400.0, {"i1": [], "i2": ["j3"]}, own, identity=False),
        ev("i2", "terminated", 6, 3000.0, "b", "big"),
        ev("i1", "terminated", 6, 3600.0),
        ev("i1", "joined", 4, 3500.0),  # stale: seq below the end's, changes nothing
    ]


def test_attribution_follows_the_rule_and_sums_to_the_total() -> None:
    ledger = Ledger()
    for m in story():
        ledger.observe(m)
    usage = ledger.attribute(PRICES, 0.0, 4000.0)
    accounts = {k[0]: round(u.cost, 6) for k, u in group(usage, ["account"])}
    # i1: idle 0..600 and 2400..3600 (1800 s), j1 600..1800 + half of 1800..2400, j2 half of that
    # i2: idle 1200..1800 at 4/h; j3 1800..3000 at 4/h
    assert accounts == {IDLE: round(1800 / 3600 + 600 / 3600 * 4, 6), "phys": round(1500 / 3600 + 1200 / 3600 * 4, 6),
                        "chem": round(300 / 3600, 6)}
    t = total(usage)
    assert abs(sum(accounts.values()) - t.cost) < 1e-6 and t.node_seconds == pytest.approx(3600 + 1800)
    users = dict((k[0], u.node_seconds) for k, u in group(usage, ["user"]))
    assert users["alice"] == pytest.approx(1500 + 1200) and users["bob"] == pytest.approx(300)
    parts = dict((k, u.node_seconds) for k, u in group(usage, ["site", "type", "partition"]))
    assert parts[("b", "big", "gpu")] == pytest.approx(1200)


def test_a_period_clips_lives_and_jobs() -> None:
    ledger = Ledger()
    for m in story():
        ledger.observe(m)
    usage = ledger.attribute(PRICES, 1800.0, 2400.0)
    assert {k[0]: round(u.node_seconds) for k, u in group(usage, ["account"])} == {"phys": 300 + 600, "chem": 300}


def _ledger_file(tmp_path: Path) -> Path:
    ledger, path = Ledger(), tmp_path / "ledger.jsonl"
    with open(path, "w") as f:
        for m in story():
            fact = ledger.observe(m)
            if fact is not None:
                f.write(json.dumps(fact) + "\n")
    return path


def _config(tmp_path: Path, broker_url: str = "amqp://guest:guest@127.0.0.1:5672/", prefix: str = "epu") -> Path:
    cfg = tmp_path / "epu.toml"
    cfg.write_text(f'[broker]\nurl = "{broker_url}"\nprefix = "{prefix}"\n'
                   '[sites.a]\ndriver = "epu-sim"\nprice_per_hour = 1.0\n'
                   '[sites.b]\ndriver = "epu-sim"\n[sites.b.types.big]\nsize = "sim.big"\ncores = 16\n'
                   'price_per_hour = 4.0\n')
    return cfg


def test_epu_cost_prints_json_csv_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from epu.cli import main

    path, cfg = _ledger_file(tmp_path), _config(tmp_path)
    assert main(["cost", "--ledger", str(path), "--since", "1970-01-01", "--until", "1970-01-01T01:10",
                 "--by", "account,user", "--json", "-c", str(cfg)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert abs(sum(r["cost"] for r in doc["rows"]) - doc["total"]["cost"]) < 1e-3
    assert {(r["account"], r["user"]) for r in doc["rows"]} == {("phys", "alice"), ("chem", "bob"), (IDLE, IDLE)}
    assert main(["cost", "--ledger", str(path), "--since", "1970-01-01", "--until", "1970-01-01T01:10",
                 "--csv", "-c", str(cfg)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "account,node_hours,cost" and lines[-1].startswith("TOTAL,")
    assert main(["cost", "--ledger", str(path), "--since", "1970-01-01", "--until", "1970-01-01T01:10",
                 "--by", "site,type", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "TOTAL" in out and "big" in out


def test_epu_cost_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from epu.cli import main

    cfg = _config(tmp_path)
    assert main(["cost", "--ledger", str(tmp_path / "none"), "-c", str(cfg)]) == 2
    assert "no ledger at" in capsys.readouterr().err
    path = _ledger_file(tmp_path)
    assert main(["cost", "--ledger", str(path), "--by", "colour", "-c", str(cfg)]) == 2
    assert "--by: unknown dimension(s) colour" in capsys.readouterr().err
    assert main(["cost", "--ledger", str(path), "--since", "yesterday", "-c", str(cfg)]) == 2
    assert "not a time: 'yesterday'" in capsys.readouterr().err
    path.write_text(path.read_text() + "{broken\n")
    assert main(["cost", "--ledger", str(path), "-c", str(cfg)]) == 2
    assert "ledger.jsonl:" in capsys.readouterr().err


def test_cost_record_keeps_the_ledger_from_the_real_event_stream(tmp_path: Path, broker, capsys) -> None:
    """``epu cost record`` on RabbitMQ: the events published while it taps land in the ledger, and
    ``epu cost`` attributes them as the pure fold does."""
    from epu.common.broker import Publisher

    from epu.cli import main
    from epu.cli_cost import record

    cfg = _config(tmp_path, broker.url, broker.topology.prefix)
    ledger_path, ready = tmp_path / "ledger.jsonl", tmp_path / "ready"
    stop = threading.Event()
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(record(str(cfg), ledger_path, 60.0, ready, stop.is_set)), daemon=True)
    t.start()
    for _ in range(300):
        if ready.exists() or not t.is_alive():
            break
        t.join(0.1)
    assert ready.exists(), "the recorder never bound its tap"
    pub = Publisher(broker, "test")
    try:
        for m in story():
            pub.publish(m)
    finally:
        pub.close()
    want = sum(1 for m in story())
    for _ in range(300):
        if ledger_path.exists() and len(ledger_path.read_text().splitlines()) >= want:
            break
        t.join(0.1)
    stop.set()
    t.join(10)
    assert result and result[0] == want
    assert len(ledger_path.read_text().splitlines()) == want
    assert main(["cost", "--ledger", str(ledger_path), "--since", "1970-01-01", "--until", "1970-01-01T01:10",
                 "--json", "-c", str(cfg)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["account"]: r["cost"] for r in doc["rows"]}["chem"] == pytest.approx(300 / 3600, abs=1e-4)
