"""Every destroy path against a listing or a store that is partial, late, duplicated or wrong
(issue 11): the real Provisioner, the simulated libcloud driver, SQLite and PostgreSQL stores.

Each test failed on the code before the fix it names (see the docstrings)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from epu.common.clock import ManualClock
from epu.common.config import parse_config
from epu.common.messages import LaunchRequest, ProvisionerAlert, TerminateRequest
from epu.services.provisioner.app import build_provisioner
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_LAUNCH, TAG_STORE
from epu.services.provisioner.provisioner import Provisioner
from epu.services.provisioner.sim import SimulatedNodeDriver
from epu.services.provisioner.store import IdentityError, Store

from tests.provisioner.conftest import FAST_RETRY, Events

HOUR = 3600.0


@pytest.fixture
def build(clock: ManualClock, made: list[Provisioner]) -> Callable[..., tuple[Provisioner, Events]]:
    """A provisioner built from config as the service builds it (no deployment given unless asked)."""

    def make(cloud: SimulatedNodeDriver, store_url: str, **prov_cfg: object) -> tuple[Provisioner, Events]:
        config = parse_config({
            "provisioner": {"store_url": store_url, **prov_cfg},
            "sites": {"sim": {"driver": "epu-sim", "image": "sim-image", "size": "sim.1core",
                              "rate_limit_per_second": 1000.0}},
        }, environ={})
        events, alerts = Events(), []
        prov = build_provisioner(config, events, clock=clock, drivers={"sim": cloud}, alert=alerts.append)
        prov.settings.retry = FAST_RETRY
        prov.published_alerts = alerts  # type: ignore[attr-defined]
        made.append(prov)
        return prov, events

    return make


def launch(prov: Provisioner, *ids: str) -> None:
    for i in ids:
        prov.handle_launch(LaunchRequest(launch_id=i, domain="alpha", site="sim", node_name=f"w-{i}"))
    assert prov.wait_idle()


def live(cloud: SimulatedNodeDriver) -> set[str]:
    return {n.extra["tags"].get(TAG_LAUNCH, n.name) for n in cloud.list_nodes() if n.state.value != "terminated"}


def drop_from_listing(prov: Provisioner, site: str, hidden: set[str], times: int = 1) -> None:
    """The next ``times`` listings of ``site`` omit the nodes of these launches (a partial page)."""
    real = prov.sites[site].nodes
    left = [times]

    def nodes():  # noqa: ANN202
        out = real()
        if left[0] > 0:
            left[0] -= 1
            out = [n for n in out if n.launch_id not in hidden]
        return out

    prov.sites[site].nodes = nodes  # type: ignore[method-assign]


def show_ended(prov: Provisioner, site: str, shown: set[str], native: str, times: int) -> None:
    """The next ``times`` listings of ``site`` show the nodes of these launches in ``native``
    (``error``/``terminated``) while they run on (a failed migration's ERROR, a lagging replica)."""
    real = prov.sites[site].nodes
    ours = {"error": "failed", "terminated": "terminated"}[native]
    left = [times]

    def nodes():  # noqa: ANN202
        out = real()
        if left[0] > 0:
            left[0] -= 1
            out = [replace(n, state=ours, native_state=native) if n.launch_id in shown else n for n in out]
        return out

    prov.sites[site].nodes = nodes  # type: ignore[method-assign]


# --------------------------------------------------------------------------- whose node

def test_two_provisioners_with_their_own_stores_never_sweep_each_other(build, tmp_path, cloud, clock) -> None:
    """Was: both tagged `epu` (the default) and the grace counted from the cloud's created_at, so
    the second provisioner swept the first one's hour-old nodes at its first reconcile."""
    a, _ = build(cloud, f"sqlite:///{tmp_path / 'a.db'}")
    launch(a, "a1", "a2")
    clock.advance(HOUR)
    b, _ = build(cloud, f"sqlite:///{tmp_path / 'b.db'}")
    assert a.identity.deployment != b.identity.deployment  # each store made its own
    launch(b, "b1")
    for _ in range(3):
        b.reconcile("sim")
        a.reconcile("sim")
        clock.advance(HOUR)
    assert live(cloud) == {"a1", "a2", "b1"}
    assert b.alerts == a.alerts == type(a.alerts)()  # neither even sees the other's nodes


def test_a_recreated_store_under_a_named_deployment_never_sweeps_the_old_one(build, tmp_path, cloud, clock) -> None:
    """Was: a new database under the same configured deployment name (a staging copy, a lost
    store) treated every live node of that name as its orphan and swept it."""
    old, _ = build(cloud, f"sqlite:///{tmp_path / 'old.db'}", deployment="prod")
    launch(old, "p1", "p2")
    clock.advance(HOUR)
    new, _ = build(cloud, f"sqlite:///{tmp_path / 'new.db'}", deployment="prod")
    for _ in range(3):
        report = new.reconcile("sim")
        clock.advance(HOUR)
    assert report.swept == [] and live(cloud) == {"p1", "p2"}
    kinds = [a.kind for a in new.published_alerts]
    assert kinds == ["foreign-node", "foreign-node"]  # said once per node, not every round
    assert isinstance(new.published_alerts[0], ProvisionerAlert)
    assert "another store" not in new.published_alerts[0].message or "never touched" in new.published_alerts[0].message


def test_orphan_grace_counts_from_first_sighting_and_survives_a_restart(build, sqlite_url, cloud, clock) -> None:
    """Was: the grace counted from the cloud's created_at (an old orphan was swept at the first
    reconcile) and lived in memory (a restart started it over)."""
    prov, _ = build(cloud, sqlite_url, orphan_grace_seconds=600)
    tags = {TAG_DEPLOYMENT: prov.identity.deployment, TAG_STORE: prov.identity.store_id, TAG_LAUNCH: "lost"}
    cloud.create_node("stray", cloud.list_sizes()[0], cloud.list_images()[0], ex_metadata=tags)
    clock.advance(HOUR)  # made an hour ago, first seen by this store now
    assert prov.reconcile("sim").waiting_orphans and live(cloud) == {"lost"}
    clock.advance(400)
    prov.shutdown()
    prov.store.close()
    again, _ = build(cloud, sqlite_url, orphan_grace_seconds=600)  # restarted: same store, same identity
    assert again.identity == prov.identity
    assert again.reconcile("sim").swept == []  # 400 s after the first sighting: not restarted, not old
    clock.advance(200)
    assert len(again.reconcile("sim").swept) == 1 and live(cloud) == set()


def test_more_orphans_than_the_cap_are_all_refused_with_an_alert(build, sqlite_url, cloud, clock) -> None:
    """Was: no cap — a restored or wrong store destroyed every node it did not know at once."""
    prov, _ = build(cloud, sqlite_url, orphan_grace_seconds=0, max_destroys_per_reconcile=3)
    for i in range(4):
        cloud.create_node(f"stray{i}", cloud.list_sizes()[0], cloud.list_images()[0], ex_metadata={
            TAG_DEPLOYMENT: prov.identity.deployment, TAG_STORE: prov.identity.store_id, TAG_LAUNCH: f"lost{i}"})
    report = prov.reconcile("sim")
    assert report.swept == [] and len(report.withheld) == 4 and len(live(cloud)) == 4
    refused = [a for a in prov.published_alerts if a.kind == "orphan-sweep-refused"]
    assert len(refused) == 1 and refused[0].count == 4 and refused[0].site == "sim"
    assert refused[0].routing_key() == "provisioner.alert.sim.orphan-sweep-refused"
    # an operator deals with one by hand: three left, within the cap, swept
    cloud.destroy_node(cloud.list_nodes()[0])
    assert len(prov.reconcile("sim").swept) == 3


def test_restored_store_adopts_the_nodes_launched_after_its_backup(build, tmp_path, cloud, clock) -> None:
    """A store restored from a backup does not know the launches made after it. Was (the simulator's
    restored-store): those nodes were orphans, swept after the grace while they ran jobs. They carry
    this store's tags and a domain, so they are adopted and announced — the engine, which launched
    them, keeps or retires them (draining first) — and never swept."""
    import shutil

    url = f"sqlite:///{tmp_path / 'prov.db'}"
    prov, _ = build(cloud, url, orphan_grace_seconds=600)
    launch(prov, "before")
    prov.store.flush_marks()
    prov.shutdown()
    prov.store.close()
    shutil.copy(tmp_path / "prov.db", tmp_path / "backup.db")
    prov, _ = build(cloud, url, orphan_grace_seconds=600)
    launch(prov, "after1", "after2")
    prov.shutdown()
    prov.store.close()
    clock.advance(HOUR)
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"prov.db{suffix}").unlink(missing_ok=True)
    shutil.copy(tmp_path / "backup.db", tmp_path / "prov.db")
    restored, events = build(cloud, url, orphan_grace_seconds=600)
    report = restored.reconcile("sim")
    assert report.swept == [] and report.waiting_orphans == [] and sorted(report.adopted) == ["after1", "after2"]
    assert [a.kind for a in restored.published_alerts] == ["orphan-adopted", "orphan-adopted"]
    for lid in ("after1", "after2"):
        rec = restored.store.get(lid)
        assert rec.domain == "alpha" and rec.site == "sim" and rec.cloud_id and not rec.terminal
    clock.advance(HOUR)
    assert restored.reconcile("sim").swept == []
    assert live(cloud) == {"before", "after1", "after2"}


def test_a_configured_deployment_that_disagrees_with_the_store_refuses_to_start(build, sqlite_url, cloud) -> None:
    prov, _ = build(cloud, sqlite_url)
    with pytest.raises(IdentityError) as exc:
        build(cloud, sqlite_url, deployment="something-else")
    assert "provisioner.deployment" in str(exc.value) and prov.identity.deployment in str(exc.value)


# --------------------------------------------------------------------------- absence

def test_one_partial_listing_never_kills_a_vm(build, sqlite_url, cloud, clock) -> None:
    """Was: a reconcile whose listing missed the node closed its record as terminated, and the
    next reconcile destroyed the (live) node because its record was terminal."""
    prov, events = build(cloud, sqlite_url)
    launch(prov, "x1", "x2")
    clock.advance(60)
    prov.poll("sim")
    drop_from_listing(prov, "sim", {"x1"})
    prov.reconcile("sim")
    clock.advance(300)
    report = prov.reconcile("sim")
    assert report.swept == [] and live(cloud) == {"x1", "x2"}
    assert prov.store.get("x1").state == "started" and not prov.store.get("x1").presumed_gone
    assert "terminated" not in events.states("x1")


@pytest.mark.parametrize("native", ["error", "terminated"])
def test_a_running_node_listed_as_ended_is_never_closed_or_destroyed(build, sqlite_url, cloud, clock,
                                                                     native: str) -> None:
    """Was: one listing's ERROR closed the record `failed` and destroyed the node at once, and one
    listing's TERMINATED closed it `terminated`, whose live node the next reconciliation destroyed
    — with its jobs (`epu sim --scenario wrong-listing-state`). Now it counts as a miss: presumed
    gone after enough of them, lifted when the node is listed running again."""
    prov, events = build(cloud, sqlite_url)
    launch(prov, "x1", "x2")
    clock.advance(60)
    prov.poll("sim")
    assert prov.store.get("x1").state == "started"
    show_ended(prov, "sim", {"x1"}, native, times=12)  # 8 polls, 4 reconciliations
    swept = []
    for i in range(8):
        clock.advance(30)
        prov.poll("sim")
        if i % 2:
            swept += prov.reconcile("sim").swept
    rec = prov.store.get("x1")
    assert swept == [] and live(cloud) == {"x1", "x2"}
    assert rec.state == "started" and rec.presumed_gone and not set(events.states("x1")) & {"failed", "terminated"}
    assert f"not listed alive (last: {native}, never asked to end)" in rec.reason
    clock.advance(30)
    prov.poll("sim")  # listed running again
    assert not prov.store.get("x1").presumed_gone and live(cloud) == {"x1", "x2"}


def test_poll_and_reconcile_share_one_miss_history(build, sqlite_url, cloud, clock) -> None:
    prov, events = build(cloud, sqlite_url)
    launch(prov, "x1")
    drop_from_listing(prov, "sim", {"x1"}, times=3)
    prov.poll("sim")
    clock.advance(30)
    prov.reconcile("sim")
    assert not prov.store.get("x1").presumed_gone  # two misses
    clock.advance(30)
    prov.poll("sim")  # the third, 60 s after the first
    rec = prov.store.get("x1")
    assert rec.presumed_gone and rec.state == "pending"
    assert events.for_("x1")[-1].presumed_gone
    # and nothing acts on the presumption, however long it lasts
    prov.sites["sim"].nodes = lambda: []  # type: ignore[method-assign]
    for _ in range(5):
        clock.advance(HOUR)
        prov.poll("sim")
        assert prov.reconcile("sim").swept == []
    assert live(cloud) == {"x1"} and prov.store.get("x1").state == "pending"


def test_a_node_that_really_vanished_is_closed_by_a_terminate(build, sqlite_url, cloud, clock) -> None:
    """Presumed gone is ended by whoever decides (the engine, an operator): a terminate."""
    prov, events = build(cloud, sqlite_url)
    launch(prov, "x1")
    cloud.ex_vanish(prov.store.get("x1").cloud_id)
    for _ in range(3):
        prov.poll("sim")
        clock.advance(30)
    assert prov.store.get("x1").presumed_gone
    prov.handle_terminate(TerminateRequest(request_id="t", instance_id="x1", domain="alpha", reason="lost"))
    assert prov.wait_idle()
    for _ in range(3):
        prov.poll("sim")
        clock.advance(30)
    rec = prov.store.get("x1")
    assert rec.state == "terminated" and "gone after terminate" in rec.reason
    assert [e.presumed_gone for e in events.for_("x1")][-2:] == [False, False]  # terminating clears it


def test_duplicated_and_foreign_nodes_in_a_listing(build, sqlite_url, cloud, clock) -> None:
    """A listing that repeats a node, or carries nodes of other deployments, changes nothing."""
    prov, _ = build(cloud, sqlite_url, orphan_grace_seconds=0)
    launch(prov, "x1")
    cloud.create_node("staging", cloud.list_sizes()[0], cloud.list_images()[0],
                      ex_metadata={TAG_DEPLOYMENT: "staging", TAG_LAUNCH: "s1"})
    real = prov.sites["sim"].nodes
    prov.sites["sim"].nodes = lambda: real() * 2  # type: ignore[method-assign]
    report = prov.reconcile("sim")
    assert report.swept == [] and report.adopted == [] and live(cloud) == {"x1", "s1"}


def test_terminate_records_its_proof(build, sqlite_url, cloud) -> None:
    prov, events = build(cloud, sqlite_url)
    launch(prov, "x1", "x2")
    prov.handle_terminate(TerminateRequest(request_id="t1", instance_id="x1", domain="alpha", reason="idle"))
    prov.handle_terminate(TerminateRequest(request_id="t2", instance_id="x2", domain="alpha", reason="op", force=True))
    assert prov.wait_idle()
    assert events.for_("x1")[-1].reason == "idle (proof: removed)"
    assert events.for_("x2")[-1].reason == "op (proof: forced)"
    assert live(cloud) == set()  # both carried out: the sender decided


# --------------------------------------------------------------------------- the stores

@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_presumption_and_sightings_are_durable_on_both_stores(backend, request, build, cloud, clock) -> None:
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    prov, events = build(cloud, url, orphan_grace_seconds=600)
    tags = {TAG_DEPLOYMENT: prov.identity.deployment, TAG_STORE: prov.identity.store_id, TAG_LAUNCH: "lost"}
    cloud.create_node("stray", cloud.list_sizes()[0], cloud.list_images()[0], ex_metadata=tags)
    launch(prov, "x1")
    cloud.inject("partial", 3, call="list")  # the sim driver lists the first half: the stray, not x1
    for _ in range(3):
        prov.reconcile("sim")
        clock.advance(30)
    assert prov.store.get("x1").presumed_gone
    prov.shutdown()
    prov.store.close()
    again, _ = build(cloud, url, orphan_grace_seconds=600)
    assert again.store.get("x1").presumed_gone  # survives the restart
    report = again.reconcile("sim")
    assert report.readopted == ["x1"] and not again.store.get("x1").presumed_gone
    sighting = again.store.sightings("sim")
    assert [s.kind for s in sighting.values()] == ["orphan"]
    assert list(sighting.values())[0].first_seen < clock.now() - 60  # not started over
    other = Store(url)
    assert other.claim_identity() == again.identity
    other.close()


# --------------------------------------------------------------------------- failed launches with live nodes

def test_a_lost_create_answer_then_exhausted_retries_never_closes_the_launch_or_destroys_its_node(
        build, sqlite_url, cloud, clock) -> None:
    """Issue 26, defect 6. Was: a create that took effect but whose answer was lost, then API
    errors until the retries ran out, closed the launch ``failed`` while its node booted — on
    HTCondor a startd that joins by itself and takes jobs — and the next reconciliation destroyed
    it (the engine had replaced it meanwhile). Now the outcome is unknown: the launch stays
    ``requested`` (the engine keeps counting it), and reconciliation adopts its node once listed."""
    prov, events = build(cloud, sqlite_url)
    for runner in prov.runners.values():
        runner.retry = FAST_RETRY
    cloud.inject("lost", 1)  # created, the answer lost...
    cloud.inject("transient", 10)  # ...then errors until the retries ran out
    drop_from_listing(prov, "sim", {"x1"})  # and the lookup after them misses it (listings lag creates)
    launch(prov, "x1")
    rec = prov.store.get("x1")
    assert rec.state == "requested" and "create outcome unknown" in rec.reason and live(cloud) == {"x1"}
    assert "failed" not in events.states("x1")
    clock.advance(60)  # booted (and, on HTCondor, joined by itself)
    report = prov.reconcile("sim")
    assert report.swept == [] and report.adopted == ["x1"] and live(cloud) == {"x1"}
    assert prov.store.get("x1").state == "started"


def test_a_failed_launchs_live_node_is_reopened_never_destroyed(build, sqlite_url, cloud, clock) -> None:
    """Issue 26, defect 6: a launch closed ``failed`` whose node the cloud lists alive (a create
    answered 503 that took effect all the same, a record of an older release) is reopened in the
    state the cloud shows and announced (``previous: failed``) — never destroyed on the cloud's
    word. Was: the next reconciliation destroyed it."""
    prov, events = build(cloud, sqlite_url)
    for runner in prov.runners.values():
        runner.retry = FAST_RETRY
    cloud.inject("transient", 10)  # refused, every attempt: closed failed
    launch(prov, "x1")
    assert prov.store.get("x1").state == "failed" and live(cloud) == set()
    cloud._injected["create"].clear()  # the errors not used up by the retries
    # ...but one of those creates took effect: the node carries the launch's tags
    tags = {TAG_DEPLOYMENT: prov.identity.deployment, TAG_STORE: prov.identity.store_id, TAG_LAUNCH: "x1",
            "epu-domain": "alpha"}
    cloud.create_node("w-x1", cloud.list_sizes()[0], cloud.list_images()[0], ex_metadata=tags)
    clock.advance(60)
    report = prov.reconcile("sim")
    assert report.swept == [] and live(cloud) == {"x1"}
    rec = prov.store.get("x1")
    assert rec.state == "started" and rec.cloud_id is not None and "reopened" in rec.reason
    last = [e for e in events.items if e.instance_id == "x1"][-1]
    assert (last.previous, last.state, last.seq) == ("failed", "started", rec.seq)
    assert [a.kind for a in prov.published_alerts] == ["failed-launch-alive"]
    for _ in range(4):  # and it stays: polled and reconciled like any live node
        clock.advance(300)
        prov.poll("sim")
        assert prov.reconcile("sim").swept == []
    assert live(cloud) == {"x1"} and prov.store.get("x1").state == "started"


def test_a_create_whose_retries_ran_out_is_looked_up_before_it_is_closed_failed(build, sqlite_url, cloud,
                                                                               clock) -> None:
    """After timeouts or 5xx the node may exist: one lookup by its launch-id tag before the launch
    is closed ``failed`` (the engine would replace it, and the node it never counted would run)."""
    prov, events = build(cloud, sqlite_url)
    for runner in prov.runners.values():
        runner.retry = FAST_RETRY
    cloud.inject("lost", 1)
    cloud.inject("transient", 10)
    launch(prov, "x1")
    rec = prov.store.get("x1")
    assert rec.state == "pending" and rec.cloud_id is not None and live(cloud) == {"x1"}
    assert "failed" not in events.states("x1")


def test_a_pending_node_listed_once_in_error_is_not_destroyed(build, sqlite_url, cloud, clock) -> None:
    """Issue 26, defect 6. Was: one listing of ERROR for a ``pending`` record closed it ``failed``
    and destroyed the node at once; a listing lagging a create may show a booted node so. Now it
    takes the run of listings a presumption takes; then the boot counts as failed."""
    prov, events = build(cloud, sqlite_url)
    launch(prov, "x1")
    assert prov.store.get("x1").state == "pending"
    show_ended(prov, "sim", {"x1"}, "error", times=1)
    prov.poll("sim")
    assert live(cloud) == {"x1"} and prov.store.get("x1").state == "pending"
    clock.advance(60)
    prov.poll("sim")  # booted: listed running, the miss forgotten
    assert live(cloud) == {"x1"} and prov.store.get("x1").state == "started"
    assert "failed" not in events.states("x1")
