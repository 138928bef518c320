"""Issue 34, part 5: the rough edges a site admin met on day one, each as they saw it.

* ``epu policy history`` / ``epu instances terminate`` for an unknown domain answered with a
  RabbitMQ 403: now "unknown domain", from the configuration's [domains] or the engine's store,
  and where neither can tell, the broker's refusal said in words;
* ``epu policy show`` and ``epu policy set --help`` said nothing of the mode and the spend cap;
* the AGE column of ``epu instances list`` counted from the launch on the store's rows and from
  the last state change on the engine's;
* a forced terminate was missing from ``epu policy history``.
(A cap below one instance's price and ``budget_per_hour = 0``: tests/decision/test_cap_one_rule.py
and test_policy_history.py.)"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from epu.common.messages import EngineStatus, InstanceStatus, PolicyChange

from epu.cli import main
from tests.decision.helpers import config, event, jobs, make_engine, snapshot


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / f"epu-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(text)
    return str(path)


def test_an_unknown_domain_is_named_from_the_configuration_before_the_broker(tmp_path, capsys) -> None:
    """The broker is not even reachable: the answer comes from the configuration's [domains]."""
    cfg = _write(tmp_path, '[broker]\nurl = "amqp://guest:guest@127.0.0.1:1/"\n'
                           '[domains.alpha]\nmax_nodes = 2\n'
                           f'[provisioner]\nstore_url = "sqlite:///{tmp_path / "p.db"}"\n')
    assert main(["policy", "history", "beta", "-c", cfg]) == 2
    assert "unknown domain 'beta' (the configuration's [domains]: alpha)" in capsys.readouterr().err
    assert main(["instances", "terminate", "i1", "--domain", "beta", "-c", cfg, "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert "unknown domain 'beta'" in err and "nothing sent" in err


def test_an_operator_file_without_domains_asks_the_engines_store(tmp_path, capsys) -> None:
    store = tmp_path / "decision.db"
    e, _bus, clock = make_engine(f"sqlite:///{store}", config(domains={"alpha": {"max_nodes": 2}}))
    e.store.engine.dispose()
    cfg = _write(tmp_path, f'[broker]\nurl = "amqp://guest:guest@127.0.0.1:1/"\n'
                           f'[decision]\nstore_url = "sqlite:///{store}"\n')
    assert main(["policy", "history", "beta", "-c", cfg]) == 2
    assert "unknown domain 'beta' (the decision engine's store knows: alpha)" in capsys.readouterr().err


@pytest.mark.rabbitmq
def test_where_nothing_here_can_tell_the_brokers_403_is_said_in_words(tmp_path, rabbit_vhost, broker, capsys) -> None:
    """An operator's workstation: no [domains], no engine store; the user may read alpha's status
    queue only (deploy/rabbitmq's operator). Before: a RabbitMQ 403 traceback for beta."""
    from tests.conftest import RABBIT_HOST, rabbitmqctl

    topo = broker.topology
    with broker.connection() as conn:
        topo.declare(conn.channel(), [topo.status_spec("alpha"), topo.status_spec("beta")])
    name, password = f"ops-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rabbitmqctl("add_user", name, password)
    try:
        alpha = topo.n(topo.status_spec("alpha").name).replace(".", r"\.")
        rabbitmqctl("set_permissions", "-p", rabbit_vhost, name, "^$", "^$", f"^{alpha}$")
        cfg = _write(tmp_path, f'[broker]\nurl = "amqp://{name}:{password}@{RABBIT_HOST}/{rabbit_vhost}"\n'
                               f'prefix = "{topo.prefix}"\n'
                               f'[decision]\nstore_url = "sqlite:///{tmp_path / "none.db"}"\n')
        assert main(["policy", "history", "beta", "-c", cfg]) == 1
        err = capsys.readouterr().err
        assert "does not let this user read" in err and "(403)" in err and "'beta'" in err
        assert "Traceback" not in err
    finally:
        rabbitmqctl("delete_user", name, check=False)


def test_policy_show_and_set_help_say_the_mode_and_the_cap(tmp_path, capsys) -> None:
    store = tmp_path / "decision.db"
    e, _bus, clock = make_engine(f"sqlite:///{store}", config(domains={"alpha": {"max_nodes": 2}}))
    e.store.seed_config("alpha", e.config.domains["alpha"], clock.now())
    e.on_policy_change(PolicyChange(change_id="c1", domain="alpha", budget_per_hour=2.5, mode="observe"))
    e.store.engine.dispose()
    cfg = _write(tmp_path, f'[decision]\nstore_url = "sqlite:///{store}"\n[domains.alpha]\nmax_nodes = 2\n')
    assert main(["policy", "show", "alpha", "-c", cfg]) == 0
    out = capsys.readouterr().out
    assert "mode       observe" in out and "budget     2.5 per hour" in out
    with pytest.raises(SystemExit):
        main(["policy", "set", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "mode (act|observe" in text and "budget_per_hour" in text and "budget_per_hour=none" in text


def test_age_counts_from_the_launch_on_the_engines_rows_too() -> None:
    """A host without the provisioner's store lists the engine's instances: AGE (``created_at``)
    is when the launch was asked for, as on the store's rows — not when the state last changed."""
    from epu.services.decision.statusfeed import build_status
    from epu.services.provisioner.cli import EngineView, engine_only

    e, bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 4, "sites": ["s1"]}}))
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (la,) = bus.of("instance.launch")
    launched = clock.now()
    clock.advance(600)
    e.on_instance_event(event(la, "started", 1, clock.now()))
    status = build_status(e, "d", clock.now(), None)
    assert status is not None
    (entry,) = status.instances
    assert entry.launched_at == launched and entry.since == clock.now()
    (row,) = engine_only(EngineView({entry.instance_id: entry}, {entry.instance_id: "d"}), None)
    assert row.created_at == launched
    older = InstanceStatus(instance_id="x", site="s1", state="joined", since=5.0)  # an engine before the field
    (row,) = engine_only(EngineView({"x": older}, {"x": "d"}), None)
    assert row.created_at is None  # shown as "-", never as the time in the state
    assert EngineStatus.model_fields["instances"]


def test_a_forced_terminate_is_in_the_policy_history(store_url) -> None:
    e, bus, clock = make_engine(store_url, config(domains={"d": {"max_nodes": 4, "sites": ["s1"]}}))
    e.store.seed_config("d", e.config.domains["d"], clock.now())
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (la,) = bus.of("instance.launch")
    out = e.on_policy_change(PolicyChange(change_id="f1", domain="d", forced_terminate=[la.launch_id, "ghost"],
                                          operator="alice (stuck)"))
    assert out.applied and f"forced terminate of {la.launch_id}, ghost recorded" in out.reason
    assert "not in the engine's table: ghost" in out.reason
    (entry,) = e.store.change_history("d")
    assert entry["operator"] == "alice (stuck)" and entry["request"] == {"forced_terminate": [la.launch_id, "ghost"]}
    assert e.store.instance(la.launch_id).retire == "" and e.store.current_config("d")[0] == 1  # nothing acted on
