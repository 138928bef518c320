"""Determinism and the ``epu sim`` interface: one seed, one run, bit for bit; a violation prints
the command that replays it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine as SqlEngine

from epu.cli import main
from epu.sim import scenarios
from epu.sim.scenario import Scenario
from epu.sim.simulation import Simulation

ROOT = Path(__file__).resolve().parents[2]


def short_chaos() -> Scenario:
    """``chaos`` (every kind of fault at once) over a shorter fault phase."""
    sc = scenarios.get_scenario("chaos")
    sc.hours = 1.5
    return sc


def test_the_same_seed_replays_the_same_run() -> None:
    a, b = Simulation(short_chaos(), 3).run(), Simulation(short_chaos(), 3).run()
    assert a.digest == b.digest and a.events == b.events and a.stats == b.stats
    assert [str(v) for v in a.violations] == [str(v) for v in b.violations]
    assert Simulation(short_chaos(), 4).run().digest != a.digest


def test_the_in_memory_provisioner_store_replays_the_sqlite_run() -> None:
    """The simulator keeps provisioner stores in memory for speed; with every fault of ``chaos``
    (crashes before store writes, writes refused, duplicate deliveries) the run must be the one
    the SQLite store gives, event for event."""
    mem = Simulation(short_chaos(), 6)
    assert mem.databases is not None
    sql = Simulation(short_chaos(), 6, sqlite_provisioner_stores=True)
    assert sql.databases is None
    a, b = mem.run(), sql.run()
    assert a.digest == b.digest and a.events == b.events and a.stats == b.stats


def test_the_in_memory_decision_store_replays_the_sqlite_run() -> None:
    """The simulator keeps the engines' store and leases in memory for speed
    (``epu.sim.decision_memstore``); with every fault of ``chaos`` (engine crashes at commits,
    store writes refused) and with two engines failing over, the run must be the one the SQLite
    store gives, event for event."""
    failover = scenarios.get_scenario("engine-failover")
    failover.hours = 1.5
    for sc, seed in ((short_chaos(), 6), (failover, 2)):
        mem = Simulation(sc, seed)
        assert not isinstance(mem.decision_db, SqlEngine)
        sql = Simulation(sc, seed, sqlite_decision_store=True)
        assert isinstance(sql.decision_db, SqlEngine)
        a, b = mem.run(), sql.run()
        assert a.ok, a.violations[:1]
        assert a.digest == b.digest and a.events == b.events and a.stats == b.stats


@pytest.mark.parametrize(("name", "seed"), [("baseline", 2), ("store-failures", 1), ("new-store", 1),
                                           ("crashes", 2), ("batch-faults", 3), ("operator-restart", 1)])
def test_skipping_idle_engine_iterations_replays_the_full_run(name: str, seed: int) -> None:
    """A single engine skips the iterations that cannot decide (``epu.sim.lazy``): with store
    faults, crashes, a replaced store, batch outages and operators, the run must be the one that
    runs every iteration, event for event, invariant verdicts included."""
    runs = []
    for skip in (True, False):
        sc = scenarios.get_scenario(name)
        sc.hours = min(sc.hours, 2.0)
        sim = Simulation(sc, seed, skip_idle=skip)
        runs.append((sim.run(), getattr(sim.engines[0], "skip_stats", None)))
    (a, stats), (b, none) = runs
    assert stats is not None and stats.skipped > stats.iterations and none is None  # it did skip
    assert a.digest == b.digest and a.events == b.events and a.stats == b.stats
    assert [str(v) for v in a.violations] == [str(v) for v in b.violations]


def test_a_run_does_not_depend_on_the_process_or_its_hash_seed() -> None:
    code = ("from tests.sim.test_replay import short_chaos; from epu.sim.simulation import Simulation; "
            "print(Simulation(short_chaos(), 5).run().digest)")
    digests = set()
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed}, timeout=600, cwd=ROOT)
        digests.add(out.stdout.strip())
    assert len(digests) == 1 and digests == {Simulation(short_chaos(), 5).run().digest}


def _rogue(sim: Simulation) -> None:
    """A planted bug for the interface test: at 90 minutes the provisioner's credentials destroy a
    busy VM behind everyone's back."""

    def strike() -> None:
        for cloud in sim.clouds.values():
            for vm in cloud.live_vms():
                if sim.batch.jobs_on_vm(vm):
                    cloud.destroy(sim.provisioners[0].name, vm.cloud_id)
                    return

    sim.world.at(sim.world.start + 5400, strike, "rogue destroy")


@pytest.fixture
def planted() -> str:
    name = "planted-bug"
    scenarios._CATALOGUE[name] = lambda: Scenario(name, "a planted bug (tests only)", hours=2.0, setup=_rogue)
    yield name
    del scenarios._CATALOGUE[name]


def test_json_summary_and_exit_status(capsys) -> None:
    assert main(["sim", "--scenario", "baseline", "--seeds", "2", "--seed-start", "7", "--json",
                 "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"] == 2 and doc["violations"] == 0 and doc["simulated_hours"] > 4
    s = doc["scenarios"]["baseline"]
    assert s["runs"] == 2 and s["violations"] == 0 and s["simulated_hours"] == doc["simulated_hours"]


def test_a_violation_prints_the_invariant_the_seed_and_the_replay_command(planted, capsys) -> None:
    assert main(["sim", "--scenario", planted, "--seeds", "1", "--seed-start", "11", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "invariant 1 (no running job killed)" in out and "seed 11" in out
    assert f"epu sim --seed 11 --scenario {planted}" in out
    assert main(["sim", "--seed", "11", "--scenario", planted, "--json", "--no-progress"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["violations"] >= 1 and doc["by_invariant"]["1"] >= 1
    assert doc["scenarios"][planted]["replay"] == [f"epu sim --seed 11 --scenario {planted}"]


def test_list_and_bad_usage(capsys) -> None:
    assert main(["sim", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("baseline", "partial-listing", "htcondor-fqdn", "engine-failover"):
        assert name in out
    assert main(["sim", "--scenario", "no-such-thing"]) == 2
    assert "unknown scenario" in capsys.readouterr().err


def test_help_reads_like_a_man_page(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "exit status" in text and "--seed-start" in text


def test_simulating_your_own_domain_from_a_config_file(tmp_path, capsys, planted) -> None:
    cfg = tmp_path / "epu.toml"
    cfg.write_text('[domains.beta]\npolicy = "spare"\nparams = { spare_nodes = 1, billing_period_seconds = 0 }\n'
                   "max_nodes = 12\ncores_per_node = 2\n")
    assert main(["sim", "-c", str(cfg), "--domain", "beta", "--scenario", planted, "--seeds", "1",
                 "--seed-start", "11", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert f"replay: epu sim --seed 11 --scenario {planted} -c {cfg} --domain beta" in out
    assert main(["sim", "-c", str(cfg), "--domain", "gamma", "--scenario", planted]) == 2
    assert "has no domain 'gamma'" in capsys.readouterr().err
