"""The catalogue: every named scenario ``epu sim`` knows.

Each entry says what it stresses (a fault knob, or the issue-11 defect it reproduces). The
faults themselves are in ``faults.py``; a scenario only says which ones, how often and how
hard. ``docs/simulation.md`` has the table of scenarios and the defects they found.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from epu.common.messages import LaunchRequest, TerminateRequest, new_id
from epu.sim import faults as F
from epu.sim.adversary import dead_letter_injection
from epu.sim.bus import MessageFaults
from epu.sim.cloud import CloudFaults
from epu.sim.power import PowerSpec
from epu.sim.processes import StoreFaults
from epu.sim.scenario import DomainSpec, ProvisionerSpec, Scenario, SiteSpec, Timing, Workload

if TYPE_CHECKING:
    from epu.sim.simulation import Simulation

_CATALOGUE: dict[str, Callable[[], Scenario]] = {}


def scenario(fn: Callable[[], Scenario]) -> Callable[[], Scenario]:
    s = fn()
    if s.name in _CATALOGUE:
        raise ValueError(f"scenario {s.name} defined twice")
    _CATALOGUE[s.name] = fn
    return fn


def names() -> list[str]:
    return list(_CATALOGUE)


def get_scenario(name: str) -> Scenario:
    try:
        return _CATALOGUE[name]()
    except KeyError:
        raise KeyError(f"unknown scenario {name!r} (known: {', '.join(_CATALOGUE)})") from None


TWO_SITES = [SiteSpec("cloud-a", quota=30, price=0.05), SiteSpec("cloud-b", quota=40, price=0.12)]


# ---------------------------------------------------------------------- fault-free


@scenario
def baseline() -> Scenario:
    return Scenario("baseline", "no fault: a 50-node domain under a bursty workload, two sites",
                    hours=3.0, sites=list(TWO_SITES), stresses="the invariants hold when nothing goes wrong")


@scenario
def spend_cap() -> Scenario:
    return Scenario("spend-cap", "a domain under a spend cap and a capped dear site, with crashes and cloud "
                                 "errors: bursts that would take 50 nodes get what 0.60/h buys",
                    hours=3.0, domain=DomainSpec(budget_per_hour=0.6),
                    workload=Workload(arrivals_per_hour=60.0, burst_per_hour=1.5),
                    sites=[SiteSpec("cloud-a", quota=30, price=0.05,
                                    faults=CloudFaults(transient_error_rate=0.05, boot_failure_rate=0.05)),
                           SiteSpec("cloud-b", quota=40, price=0.12, budget_per_hour=0.25)],
                    faults=[F.crashes("decision", 1.0), F.crashes("provisioner", 1.0)],
                    stresses="issue 27 §3: the spend cap (budget_per_hour of a domain and of a site) holds "
                             "(invariant 8)")


@scenario
def policies() -> Scenario:
    return Scenario("policy-threshold", "the threshold policy (elastiq) with crashes and message faults",
                    hours=3.0, domain=DomainSpec(policy="threshold", params={"idle_for_time_s": 600.0},
                                                 min_nodes=1),
                    messages=MessageFaults(delay_rate=0.05, duplicate_rate=0.05),
                    faults=[F.crashes("decision", 1.0), F.crashes("provisioner", 1.0)],
                    stresses="a second policy through the shared lifecycle")


@scenario
def spare() -> Scenario:
    return Scenario("policy-spare", "the spare policy (CLUES) with per-second billing and a floor",
                    hours=3.0, domain=DomainSpec(policy="spare", params={"spare_nodes": 2, "idle_seconds": 300.0,
                                                                         "billing_period_seconds": 0.0},
                                                 min_nodes=1),
                    faults=[F.crashes("sensor", 1.0), F.command_failures(2.0)],
                    stresses="a third policy through the shared lifecycle")


# ---------------------------------------------------------------------- cloud faults


@scenario
def cloud_errors() -> Scenario:
    return Scenario("cloud-errors", "transient API errors, lost create answers, failed and never-finished boots",
                    hours=3.0, sites=[SiteSpec("cloud-a", quota=40, faults=CloudFaults(
                        transient_error_rate=0.15, lost_answer_rate=0.05, boot_failure_rate=0.05,
                        never_boot_rate=0.05, slow_boot_rate=0.05)), SiteSpec("cloud-b", quota=40, price=0.2)],
                    stresses="cloud: API errors, boots that never finish, slow boots past the stall limit")


@scenario
def lost_create_answer() -> Scenario:
    return Scenario("lost-create-answer", "creates succeed but their answers are lost, on a cloud without client "
                    "tokens that lists new nodes late; demand at max_nodes and quota",
                    hours=3.0, domain=DomainSpec(max_nodes=16),
                    sites=[SiteSpec("cloud-a", quota=16, faults=CloudFaults(
                        lost_answer_rate=0.2, transient_error_rate=0.1, listing_lag_seconds=20.0, client_tokens=False))],
                    workload=Workload(arrivals_per_hour=60.0, burst_per_hour=1.0, burst_jobs=(20, 60)),
                    stresses="cloud: a create whose answer is lost (timeout after success) — neither leaked "
                             "nor launched twice; adopted by its launch-id tag")


@scenario
def lost_create_then_errors() -> Scenario:
    return Scenario("lost-create-then-errors", "HTCondor: a create takes effect but its answer is lost, then API "
                    "errors until the provisioner's retries run out; startds join by themselves",
                    hours=3.0, domain=DomainSpec(max_nodes=16, flavor="htcondor"),
                    sites=[SiteSpec("cloud-a", quota=24, faults=CloudFaults(
                        lost_answer_rate=0.15, errors_after_lost_answer=12, listing_lag_seconds=90.0))],
                    workload=Workload(arrivals_per_hour=60.0, burst_per_hour=1.0, burst_jobs=(20, 60)),
                    stresses="issue 26: a launch closed failed whose node lives (and joined by itself) was "
                             "destroyed by the next reconciliation, with the jobs the pool gave it")


@scenario
def report_overtakes_event() -> Scenario:
    return Scenario("report-overtakes-event", "HTCondor: launches closed failed (a create answered 503 that took "
                    "effect, then API errors) are reopened when their nodes are listed, while the provisioner's "
                    "events wait in its outbox (no publish confirm) and its reports go out on time",
                    hours=3.0, domain=DomainSpec(max_nodes=64, flavor="htcondor"),
                    sites=[SiteSpec("cloud-a", quota=80, faults=CloudFaults(
                        lost_answer_rate=0.15, lost_answer_status=503, errors_after_lost_answer=12,
                        listing_lag_seconds=90.0))],
                    # demand well under max_nodes: a failed launch's live node is replaced before it
                    # is reopened (the engine cannot know it lives), which is no fault of this scenario's
                    workload=Workload(arrivals_per_hour=60.0, burst_per_hour=1.0, burst_jobs=(5, 20)),
                    timing=Timing(outbox_seconds=120.0),
                    faults=[F.outbox_delays(3.0, share=(0.6, 1.0), length=(600.0, 1800.0))],
                    stresses="issue 33 (high): a report that overtook the reopen event made the engine raise its "
                             "failed row's seq, drop the reopen as stale and terminate the live node (plain) on "
                             "every report")


@scenario
def name_collisions() -> Scenario:
    return Scenario("name-collisions", "a small launch-id space: generated node names collide (Slurm, whose add of "
                    "an existing name rewrites that node's address and identity)",
                    hours=3.0, domain=DomainSpec(max_nodes=16), id_prefix_bits=5,
                    sites=[SiteSpec("cloud-a", quota=24)],
                    workload=Workload(arrivals_per_hour=60.0, burst_per_hour=1.0, burst_jobs=(20, 60)),
                    stresses="issue 26: node names carried 32 bits of the launch id, unchecked; an add of a "
                             "name another live instance held took that node over")


@scenario
def capacity() -> Scenario:
    return Scenario("capacity-failover", "the cheap site keeps running out of capacity; demand at max_nodes",
                    hours=3.0, domain=DomainSpec(max_nodes=12),
                    sites=[SiteSpec("cloud-a", quota=40, price=0.05,
                                    faults=CloudFaults(capacity_error_rate=0.5)),
                           SiteSpec("cloud-b", quota=40, price=0.2)],
                    workload=Workload(arrivals_per_hour=20.0, burst_per_hour=1.0, burst_jobs=(10, 40),
                                      duration=(120.0, 1200.0)),
                    faults=[F.operator_actions(2.0, terminate_share=0.0, pause_share=0.3)],
                    stresses="issue 11: capacity failover was a second launch path in an event handler "
                             "(it ignored a lowered max_nodes)")


@scenario
def partial_listing() -> Scenario:
    return Scenario("partial-listing", "cloud listings omit live nodes for one or a few polls",
                    hours=4.0, sites=[SiteSpec("cloud-a", quota=50, faults=CloudFaults(
                        partial_listing_rate=0.08, partial_listing_polls=(1, 3), partial_listing_share=0.4))],
                    stresses="issue 11: one partial listing kills a VM (reconcile presumes gone, then sweeps)")


@scenario
def wrong_listing_state() -> Scenario:
    return Scenario("wrong-listing-state", "cloud listings show running nodes in ERROR or TERMINATED for one or a few polls",
                    hours=4.0, sites=[SiteSpec("cloud-a", quota=50, faults=CloudFaults(
                        wrong_state_rate=0.08, wrong_state_polls=(1, 3), wrong_state_share=0.3))],
                    stresses="a listing that is wrong, not partial: one poll's ERROR or TERMINATED destroys a "
                             "running node (and its jobs), or closes its record for good")


@scenario
def vanish() -> Scenario:
    return Scenario("vanish-preempt", "nodes vanish for real or are preempted by the cloud",
                    hours=3.0, sites=[SiteSpec("cloud-a", quota=50, faults=CloudFaults(
                        vanish_rate_per_hour=0.15, preempt_rate_per_hour=0.15))],
                    stresses="cloud: nodes that vanish, preemption; lost-node replacement")


@scenario
def pool_slots() -> Scenario:
    pool = [f"elastic{i:02d}" for i in range(1, 9)]
    return Scenario("pool-slots", "a Slurm CLOUD pool of 8 names; preemption, vanishing nodes, operator terminates",
                    hours=4.0, domain=DomainSpec(max_nodes=8, node_names=pool),
                    sites=[SiteSpec("cloud-a", quota=20, faults=CloudFaults(
                        vanish_rate_per_hour=0.1, preempt_rate_per_hour=0.2))],
                    workload=Workload(arrivals_per_hour=15.0, burst_per_hour=0.5, burst_jobs=(5, 15)),
                    faults=[F.operator_actions(1.0, terminate_share=1.0, pause_share=0.0, force_share=1.0)],
                    stresses="issue 11: pool slots leak when an instance ends without a drain")


# ---------------------------------------------------------------------- provisioner identity and stores


def _staging(sim: Simulation) -> None:
    """A second EPU (staging) in the same cloud account: its own provisioner and store, keeping a
    few nodes of its own domain alive."""
    staging = next(p for p in sim.provisioners if p.spec.name == "staging")  # type: ignore[attr-defined]
    rng = sim.world.rng("staging")
    site = sim.scenario.sites[0].name

    def launch() -> None:
        if staging.prov is None:
            return
        lid = new_id()
        staging.prov.handle_launch(LaunchRequest(launch_id=lid, domain="staging", site=site,
                                                 node_name=f"staging-{lid[:8]}", cores=4))
        life = rng.uniform(1800.0, 7200.0)
        sim.world.after(life, lambda: staging.prov and staging.prov.handle_terminate(  # type: ignore[func-returns-value]
            TerminateRequest(request_id=new_id(), instance_id=lid, domain="staging")), "staging terminate")

    t = sim.world.start + 5.0
    while t < sim.fault_end:
        sim.world.at(t, launch, "staging launch")
        t += rng.expovariate(3.0 / 3600.0)


@scenario
def second_deployment() -> Scenario:
    return Scenario("second-deployment", "a staging EPU shares the cloud account, both with default settings",
                    hours=3.0, provisioners=[ProvisionerSpec("prov-1"),
                                             ProvisionerSpec("staging", store="staging", managed=False)],
                    setup=_staging,
                    stresses="issue 11: the orphan sweep trusts any store (default deployment tag)", seeds_in_ci=4)


@scenario
def two_provisioners() -> Scenario:
    return Scenario("two-provisioners", "two provisioners on one work queue, each with its own default SQLite file",
                    hours=3.0, provisioners=[ProvisionerSpec("prov-1", store="prov-1"),
                                             ProvisionerSpec("prov-2", store="prov-2")],
                    stresses="issue 11: two stores sweep each other's live instances")


def _replace_store(restore: bool) -> Callable[[Simulation], None]:
    def setup(sim: Simulation) -> None:
        prov = sim.provisioners[0]
        rng = sim.world.rng("store/replace")
        backup_at = sim.world.start + rng.uniform(1800.0, 3600.0)
        swap_at = backup_at + rng.uniform(900.0, 3600.0)
        path = f"{sim.workdir}/prov.db"
        backup = f"{sim.workdir}/prov-backup.db"

        def take_backup() -> None:
            src, dst = sqlite3.connect(path), sqlite3.connect(backup)
            src.backup(dst)
            src.close()
            dst.close()

        def swap() -> None:
            prov.crash("operator replaces the store database")
            if restore:
                prov.store_url = f"sqlite:///{path}"
                if prov.store is not None:
                    prov.store.engine.dispose()
                src, dst = sqlite3.connect(backup), sqlite3.connect(path)
                src.backup(dst)
                src.close()
                dst.close()
            else:
                prov.spec = replace(prov.spec, store="prov-new")  # type: ignore[attr-defined]
                faults = sim.provisioner_faults.setdefault("prov-new", StoreFaults())
                prov.switch_store(sim.store_url("prov-new"), faults)
            sim.world.after(30.0, prov.start, "provisioner back on the other store")

        if restore:
            sim.world.at(backup_at, take_backup, "backup provisioner store")
        sim.world.at(swap_at, swap, "replace provisioner store")

    return setup


@scenario
def new_store() -> Scenario:
    return Scenario("new-store", "the provisioner restarts on a new, empty store database",
                    hours=4.0, setup=_replace_store(restore=False),
                    stresses="issue 11: a new store sweeps the live instances it does not know", seeds_in_ci=4)


@scenario
def restored_store() -> Scenario:
    return Scenario("restored-store", "the provisioner's store database is restored from an older backup",
                    hours=4.0, setup=_replace_store(restore=True),
                    stresses="issue 11: a restored store sweeps the instances launched since the backup", seeds_in_ci=4)


# ---------------------------------------------------------------------- batch system and names


@scenario
def htcondor() -> Scenario:
    return Scenario("htcondor-fqdn", "HTCondor: startds join by themselves under their FQDN, identity reported",
                    hours=3.0, domain=DomainSpec(flavor="htcondor"),
                    stresses="issue 11: name matching by hostname (an HTCondor worker is never 'joined')")


@scenario
def htcondor_names() -> Scenario:
    return Scenario("htcondor-names", "HTCondor FQDNs and a backend that cannot report the instance id",
                    hours=3.0, domain=DomainSpec(flavor="htcondor", report_identity=False),
                    stresses="issue 11: the hostname fallback, normalized to the short name in one place")


@scenario
def htcondor_preemption() -> Scenario:
    return Scenario("htcondor-preemption", "HTCondor: the cloud reclaims running workers without a drain or a "
                    "notice, their ads withdrawn at once; half the reclaims named in the listings (spot), half not "
                    "(the node just drops out); an operator force-terminates now and then",
                    hours=4.0, domain=DomainSpec(flavor="htcondor"),
                    faults=[F.condor_preemptions(3.0), F.operator_actions(0.5, terminate_share=1.0, pause_share=0.0,
                                                                          force_share=1.0)],
                    stresses="issue 33 defect 6: a reclaimed worker with no ad and no shutdown of ours was answered "
                             "'unknown' for every remove: sent remove for ever, its instance never leaving cleanup")


@scenario
def htcondor_drains() -> Scenario:
    return Scenario("htcondor-drains", "HTCondor with a retirement time of 0: nodes offlined the moment they "
                    "look idle (a job may start there meanwhile), drains as the real backend sends them",
                    hours=4.0, domain=DomainSpec(flavor="htcondor", params={"idle_seconds": 0.0},
                                                 retirement_seconds=0.0),
                    workload=Workload(arrivals_per_hour=80.0, burst_per_hour=2.0, burst_jobs=(5, 30),
                                      duration=(60.0, 1800.0)),
                    stresses="issue 26: a graceful condor_drain evicts once MaxJobRetirementTime is spent "
                             "(DomainSpec.condor_drain = \"graceful\" shows the kills; EPU's peaceful shutdown none)")


@scenario
def htcondor_booting_terminates() -> Scenario:
    return Scenario("htcondor-booting-terminates", "HTCondor: an operator's unforced terminate of an instance that "
                    "is booting — its startd joins by itself and takes a queued job before the engine hears "
                    "the VM runs",
                    hours=3.0, domain=DomainSpec(flavor="htcondor", max_nodes=30),
                    workload=Workload(arrivals_per_hour=80.0, burst_per_hour=2.0, burst_jobs=(10, 40),
                                      duration=(300.0, 1800.0)),
                    faults=[F.operator_terminates_booting(30.0)],
                    stresses="a terminate the engine sent as \"never in the batch system\" (the instance "
                             "pending in its view) destroyed a VM whose startd had joined and taken a job",
                    seeds_in_ci=4)


@scenario
def htcondor_two_views() -> Scenario:
    return Scenario("htcondor-two-views", "HTCondor as two views: the collector loses live workers' ads for "
                    "15-60 min while the schedd still lists their jobs; peaceful shutdowns last as long as the jobs",
                    hours=5.0, domain=DomainSpec(flavor="htcondor", params={"idle_seconds": 120.0}),
                    workload=Workload(arrivals_per_hour=60.0, burst_per_hour=1.5, burst_jobs=(5, 30),
                                      duration=(300.0, 3600.0)),
                    faults=[F.collector_losses(3.0), F.operator_actions(1.0, terminate_share=0.6, force_share=0.0)],
                    stresses="issue 26: remove trusted a collector that had lost the node (no ads = gone) and "
                             "answered a peaceful shutdown ok at once")


@scenario
def draining_missing() -> Scenario:
    return Scenario("draining-missing", "nodes briefly missing from snapshots while workers drain often",
                    hours=4.0, domain=DomainSpec(params={"idle_seconds": 0.0}),
                    workload=Workload(arrivals_per_hour=80.0, burst_per_hour=2.0, burst_jobs=(5, 30),
                                      duration=(60.0, 1200.0)),
                    faults=[F.nodes_missing(6.0, share=(0.1, 0.5), length=(20.0, 90.0))],
                    stresses="issue 11: a draining node missing from one snapshot is terminated with its jobs")


@scenario
def collector_restart() -> Scenario:
    return Scenario("collector-restart", "every node vanishes from snapshots for longer than the stall limit",
                    hours=4.0, workload=Workload(duration=(1800.0, 5400.0)),
                    faults=[F.nodes_missing(0.6, share=(0.9, 1.0), length=(700.0, 1500.0))],
                    stresses="issue 11: no circuit breaker (all workers 'lost' and terminated with their jobs)")


@scenario
def late_registration() -> Scenario:
    return Scenario("late-registration", "boots that end just before the stall deadline, with work waiting",
                    hours=3.0, sites=[SiteSpec("cloud-a", boot_seconds=(480.0, 640.0))],
                    timing=Timing(sensor_poll_seconds=60.0),
                    workload=Workload(arrivals_per_hour=60.0, burst_per_hour=1.0),
                    stresses="issue 11: stalled/lost paths send remove and terminate in the same iteration")


@scenario
def process_clocks() -> Scenario:
    return Scenario("process-clocks", "every sensor, engine and provisioner on its own clock: skew, drift, "
                    "NTP steps of up to an hour either way",
                    hours=4.0, engines=2, sites=list(TWO_SITES),
                    faults=[F.process_clocks(), F.crashes("decision", 0.5), F.crashes("sensor", 0.5)],
                    stresses="issue 26: snapshots ordered and aged by the head node's clock froze a domain")


@scenario
def untrusted_bus() -> Scenario:
    return Scenario("untrusted-bus", "every process publishes as its own broker user; another domain's sensor "
                    "forges results, snapshots and instance events within its permissions",
                    hours=4.0, sites=list(TWO_SITES),
                    faults=[F.adversary(3.0), F.crashes("decision", 0.5), F.command_failures(1.0)],
                    stresses="issue 26: a message's domain taken from its body (a forged remove ok kills jobs)")


@scenario
def dead_letters() -> Scenario:
    return Scenario("dead-letters", "another domain's sensor forges forced terminates of live instances for the "
                    "dead-letter queue — into the dead-letter exchange with forged origin headers, and on its own "
                    "key so they die for real — and forges results and snapshots; store failures make genuine "
                    "letters; an administrator requeues every letter every 10 minutes",
                    hours=4.0, sites=list(TWO_SITES),
                    faults=[F.adversary(3.0), dead_letter_injection(3.0), F.store_write_failures(2.0, (20.0, 90.0)),
                            F.crashes("decision", 0.5), F.command_failures(1.0)],
                    stresses="issue 33: a letter injected into the dead-letter exchange, requeued as the operator, "
                             "terminated another domain's instance (invariant 10: a requeued letter never gains "
                             "authority)", seeds_in_ci=4)


@scenario
def batch_faults() -> Scenario:
    return Scenario("batch-faults", "available=false snapshots, stale snapshots, a sensor clock stepping back, "
                    "commands failing transiently",
                    hours=4.0, faults=[F.batch_outages(0.5, (30.0, 400.0)), F.stale_snapshots(0.5),
                                       F.sensor_clock_steps(0.3), F.command_failures(2.0)],
                    stresses="batch system: unavailable and stale snapshots, clock steps, failing commands")


def _churn() -> Workload:
    """Demand that comes and goes in bursts: nodes drain and come back all the time."""
    return Workload(arrivals_per_hour=20.0, burst_per_hour=4.0, burst_jobs=(4, 24), duration=(60.0, 600.0))


@scenario
def lost_answers() -> Scenario:
    return Scenario("lost-command-answers", "node commands that take effect but answer with a timeout",
                    hours=4.0, domain=DomainSpec(params={"idle_seconds": 120.0}),
                    workload=_churn(),
                    faults=[F.lost_command_answers(3.0)],
                    stresses="an answer that is wrong: add, offline, online or remove applied but reported failed")


@scenario
def observe_switches() -> Scenario:
    return Scenario("observe-switches", "an operator switches the domain to observe mode and back while "
                    "launches, terminates and node commands are open and their answers lost",
                    hours=4.0, domain=DomainSpec(params={"idle_seconds": 120.0}), workload=_churn(),
                    sites=[SiteSpec("cloud-a", faults=CloudFaults(lost_answer_rate=0.05))],
                    faults=[F.observe_switches(3.0), F.lost_command_answers(2.0)],
                    messages=MessageFaults(delay_rate=0.05, loss_rate=0.02, reorder_jitter=5.0),
                    stresses="issue 33: observe mode acted (re-sends, terminates asked again, stale records)")


@scenario
def reclaim() -> Scenario:
    return Scenario("reclaim-race", "demand that comes and goes while nodes drain; online/remove commands fail",
                    hours=4.0, domain=DomainSpec(params={"idle_seconds": 0.0}),
                    workload=_churn(),
                    faults=[F.command_failures(4.0, (1, 3))],
                    stresses="issue 11: reclaim and finish_drains act on the same node; a failed online")


# ---------------------------------------------------------------------- shapes and catalogues

MIXED_TYPES = {
    "c4": {"size": "sim.c4", "cores": 4, "memory_mb": 16000, "price_per_hour": 0.17},
    "m4": {"size": "sim.m4", "cores": 4, "memory_mb": 16000, "price_per_hour": 0.25},
    "r16": {"size": "sim.r16", "cores": 16, "memory_mb": 512000, "features": ["bigmem"], "price_per_hour": 1.0},
    "g8": {"size": "sim.g8", "cores": 8, "memory_mb": 61000, "gpus": 1, "features": ["gpu"], "price_per_hour": 3.06},
}
MIXED_PARTITIONS = {"cpu": ["c4", "m4"], "bigmem": ["r16"], "gpu": ["g8"]}
BLOCKED = "QOSMaxJobsPerUserLimit"
MIXED_WAVES = [(10, 3, 2, 1), (6, 1, 3, 0), (13, 2, 1, 2)]
"""Per wave: 1-core cpu jobs, 4-core 200 GB bigmem jobs, 2-core 1-GPU jobs, 2-node x 4-core cpu
jobs (launched as gangs), 40 min apart."""


def mixed_jobs(sim: Simulation) -> None:
    """Waves of cpu, bigmem and gpu jobs, a limit-blocked array and an unsatisfiable job (64 cores
    per node: no type has them) that stay pending to the end."""
    inner = sim.batch.inner
    rng = sim.world.rng("mixed-workload")

    def wave(cpu: int, bigmem: int, gpu: int, multi: int) -> None:
        inner.submit(cores=1, count=cpu, duration=rng.uniform(300, 1500), queue="cpu")
        for _ in range(multi):
            inner.submit(cores=4, nodes=2, duration=rng.uniform(300, 1500), queue="cpu")
        inner.submit(cores=4, memory_mb=200_000, features=("bigmem",), count=bigmem,
                     duration=rng.uniform(300, 1500), queue="bigmem")
        inner.submit(cores=2, gpus=1, features=("gpu",), count=gpu, duration=rng.uniform(300, 1500), queue="gpu")

    def stuck() -> None:
        inner.submit(cores=1, count=4, duration=600, queue="cpu", blocked=BLOCKED)
        inner.submit(cores=64, count=1, duration=600, queue="cpu")

    start = sim.world.start
    sim.world.at(start + 60, stuck, "limit-blocked and unsatisfiable jobs")
    for k, counts in enumerate(MIXED_WAVES):
        sim.world.at(start + 120 + k * 2400, lambda c=counts: wave(*c), f"mixed wave {k + 1}")


@scenario
def mixed_shapes() -> Scenario:
    return Scenario("mixed-shapes", "cpu, bigmem and gpu partitions on a typed catalogue; a limit-blocked "
                    "array and an unsatisfiable job pending throughout",
                    hours=2.5,
                    domain=DomainSpec(partitions=MIXED_PARTITIONS, default_partition="cpu", max_nodes=20),
                    sites=[SiteSpec("cloud-a", quota=20, types=MIXED_TYPES)],
                    workload=Workload(arrivals_per_hour=0.0, burst_per_hour=0.0),
                    setup=mixed_jobs,
                    stresses="issue 13: the right type per partition, no node for limit-blocked or "
                             "unsatisfiable jobs, back to zero with them pending", seeds_in_ci=4)


@scenario
def spend_cap_types() -> Scenario:
    base = mixed_shapes()
    return replace(base, name="spend-cap-types",
                   summary="the mixed-shapes catalogue under a 1.50/h cap: cpu and bigmem types fit, "
                           "the 3.06/h gpu type never does (its jobs wait, priced out)",
                   domain=replace(base.domain, budget_per_hour=1.5),
                   stresses="issue 27 §3: the spend cap prices each catalogue type (invariant 8)")


UNPRICED_SIZES = {
    # what the site's driver lists (libcloud list_sizes()): the typed catalogue's sizes with the
    # driver's prices, and two sizes no one priced (price None, no [types] override)
    "sim.c4": {"cores": 4, "memory_mb": 16000, "price": 0.11},
    "sim.m4": {"cores": 4, "memory_mb": 16000, "price": None},
    "sim.r16": {"cores": 16, "memory_mb": 512000, "price": 1.0},
    "sim.g8": {"cores": 8, "memory_mb": 61000, "gpus": 1, "price": 3.06},
    "sim.c2": {"cores": 2, "memory_mb": 8000, "price": None},
    "sim.f8": {"cores": 8, "memory_mb": 32000, "price": None},
}
UNPRICED_PARTITIONS = {**MIXED_PARTITIONS, "cpu": ["c4", "m4", "sim.c2"], "fast": ["sim.f8"]}


def unpriced_jobs(sim: Simulation) -> None:
    """The mixed waves, and 8-core jobs of the ``fast`` partition only an unpriced size can serve."""
    mixed_jobs(sim)
    inner = sim.batch.inner
    rng = sim.world.rng("fast-workload")
    for k in range(3):
        sim.world.at(sim.world.start + 300 + k * 2400,
                     lambda: inner.submit(cores=8, count=2, duration=rng.uniform(300, 900), queue="fast"),
                     f"fast wave {k + 1}")


@scenario
def spend_cap_unpriced() -> Scenario:
    base = spend_cap_types()
    types = {k: dict(v) for k, v in MIXED_TYPES.items()}
    del types["m4"]["price_per_hour"]  # declared without a price: the driver's (None) stands
    site = SiteSpec("cloud-a", quota=20, types=types, discover=["sim.*"], sizes=UNPRICED_SIZES)
    return replace(base, name="spend-cap-unpriced",
                   summary="spend-cap-types on a site that discovers its sizes, three of them with no price "
                           "(the driver's price None): a cheap-looking 2-core size, a declared type left "
                           "unpriced, and the only size of the fast partition; crashes of both services "
                           "(a catalogue forgotten and learnt again), reports delayed and duplicated",
                   domain=replace(base.domain, partitions=UNPRICED_PARTITIONS),
                   sites=[site], setup=unpriced_jobs,
                   messages=MessageFaults(delay_rate=0.05, duplicate_rate=0.05),
                   faults=[F.crashes("decision", 1.0), F.crashes("provisioner", 1.0)],
                   stresses="issue 33 defect 4: a discovered type with no price under a cap is held, never "
                            "counted as 0 (invariant 8 prices what it checks: an unpriced launch under a cap "
                            "is a violation)", seeds_in_ci=4)


@scenario
def mixed_shapes_faults() -> Scenario:
    s = mixed_shapes()
    return replace(s, name="mixed-shapes-faults",
                   summary="mixed shapes with capacity errors, lost answers and slow boots",
                   sites=[SiteSpec("cloud-a", quota=20, types=MIXED_TYPES,
                                   faults=CloudFaults(capacity_error_rate=0.15, lost_answer_rate=0.05,
                                                      slow_boot_rate=0.05))],
                   stresses="issue 13: capacity cooldown and failover between types under faults")


SPOT_TYPES = {
    "c4-spot": {"size": "sim.c4", "cores": 4, "memory_mb": 16000, "price_per_hour": 0.05, "spot": True},
    "c4": {"size": "sim.c4", "cores": 4, "memory_mb": 16000, "price_per_hour": 0.17},
}
LOST_NODE_SECONDS = 900.0
"""The batch system's own detection of a dead node in ``spot-preemption`` (SlurmdTimeout): far
longer than the engine takes to requeue, so a job requeued by the batch system itself means the
engine did not."""


def slow_lost_node_detection(sim: Simulation) -> None:
    sim.batch.lost_node_seconds = LOST_NODE_SECONDS


@scenario
def spot_preemption() -> Scenario:
    return Scenario("spot-preemption", "spot instances the cloud keeps preempting under running jobs; the "
                    "batch system notices a dead node only after 15 minutes",
                    hours=3.0, domain=DomainSpec(allow_spot=True, max_nodes=20),
                    sites=[SiteSpec("cloud-a", quota=30, types=SPOT_TYPES,
                                    faults=CloudFaults(preempt_rate_per_hour=0.5))],
                    workload=Workload(arrivals_per_hour=30.0, burst_per_hour=1.0, burst_jobs=(5, 20),
                                      duration=(600.0, 2400.0)),
                    setup=slow_lost_node_detection,
                    stresses="issue 13: a preempted node's jobs requeued by EPU (scontrol requeue), the node "
                             "removed and its capacity replaced; never counted as our kill", seeds_in_ci=4)


@scenario
def spot_interruption() -> Scenario:
    return Scenario("spot-interruption", "spot-preemption with EC2's two-minute interruption notice before each "
                    "reclaim",
                    hours=3.0, domain=DomainSpec(allow_spot=True, max_nodes=20),
                    sites=[SiteSpec("cloud-a", quota=30, types=SPOT_TYPES,
                                    faults=CloudFaults(preempt_rate_per_hour=0.5, preempt_notice_seconds=120.0))],
                    workload=Workload(arrivals_per_hour=30.0, burst_per_hour=1.0, burst_jobs=(5, 20),
                                      duration=(600.0, 2400.0)),
                    setup=slow_lost_node_detection,
                    stresses="issue 13: an interruption notice drains the node at once — its jobs requeued, the "
                             "node removed and terminated before the cloud takes it, the capacity replaced")


# ---------------------------------------------------------------------- our own outages


@scenario
def our_outage() -> Scenario:
    return Scenario("our-outage", "RabbitMQ, the provisioner and the batch controller go down for long stretches",
                    hours=5.0, sites=list(TWO_SITES),
                    faults=[F.broker_outages(0.4, (120.0, 1500.0)), F.crashes("provisioner", 0.4, (300.0, 1500.0),
                                                                               mid_step=0.0),
                            F.batch_outages(0.3, (300.0, 1500.0))],
                    stresses="issue 11: our outage blamed on every site (stall clock ran while we were down)")


# ---------------------------------------------------------------------- messaging and processes


@scenario
def messages() -> Scenario:
    return Scenario("messages", "events delayed, duplicated, reordered and lost",
                    hours=3.0, messages=MessageFaults(delay_rate=0.1, duplicate_rate=0.1, loss_rate=0.02,
                                                      reorder_jitter=5.0),
                    stresses="messaging: delays, duplicates, reorders, losses")


@scenario
def crashes() -> Scenario:
    return Scenario("crashes", "every process crashes at any step and restarts from its store",
                    hours=4.0, sites=list(TWO_SITES),
                    faults=[F.crashes("decision", 2.0), F.crashes("provisioner", 2.0), F.crashes("sensor", 1.0)],
                    stresses="processes: a crash at any step, restart from the store")


@scenario
def store_failures() -> Scenario:
    return Scenario("store-failures", "the databases refuse writes for a few seconds, often",
                    hours=3.0, faults=[F.store_write_failures(12.0, (1.0, 10.0))],
                    stresses="store: writes failing for a few seconds (database busy, failover)")


@scenario
def store_outage() -> Scenario:
    return Scenario("store-outage", "a database failover: the engine's or the provisioner's store refuses writes "
                    "for 20-90 s at a time, while cloud answers are lost",
                    hours=3.0, sites=[SiteSpec("cloud-a", faults=CloudFaults(lost_answer_rate=0.05))],
                    faults=[F.store_write_failures(3.0, (20.0, 90.0))],
                    stresses="store: a PostgreSQL failover (writes refused for up to a minute and a half)")


@scenario
def store_failover() -> Scenario:
    return Scenario("store-failover", "a PostgreSQL failover: the engines' store answers writes read-only "
                    "(SQLSTATE 25006, 25P02) for 20-120 s at a time while an operator pauses, resumes and "
                    "changes bounds; an engine pair",
                    hours=3.0, engines=2,
                    faults=[F.store_failover(2.0, (20.0, 120.0)), F.operator_actions(2.0, terminate_share=0.2),
                            F.crashes("decision", 0.3)],
                    stresses="issue 33 defect 7: a read-only answer during a failover was blamed on the "
                             "message: the operator's change dead-lettered after 3 tries in 0.6 s (invariant 7)")


@scenario
def engine_failover() -> Scenario:
    return Scenario("engine-failover", "an engine pair; the active one crashes and the standby takes over",
                    hours=3.0, engines=2, faults=[F.crashes("decision", 2.0, (30.0, 600.0))],
                    stresses="one brain: standby takeover after a crash")


@scenario
def engine_partition() -> Scenario:
    return Scenario("engine-partition", "an engine pair; the active engine's broker connection drops",
                    hours=3.0, engines=2, faults=[F.engine_partition(1.0)],
                    stresses="one brain after a reconnect (fencing: issue 12)")


@scenario
def split_consumers() -> Scenario:
    return Scenario("split-consumers", "an engine pair; a consumer cancellation hands one of the engines' "
                    "queues (input, snapshots or control) to the other engine for a stretch",
                    hours=3.0, engines=2,
                    faults=[F.consumer_cancellations(2.0), F.operator_actions(1.0, terminate_share=0.3),
                            F.command_failures(1.0)],
                    stresses="issue 26: node results and instance events written by one engine while the "
                             "other commits plans: every write that changes an instance is a compare-and-set")


# ---------------------------------------------------------------------- operators


@scenario
def operators() -> Scenario:
    return Scenario("operators", "an operator changes bounds, pauses, and terminates instances (forced or not)",
                    hours=4.0, faults=[F.operator_actions(3.0)],
                    stresses="issue 11: an unforced `epu instances terminate` destroys at once")


@scenario
def operator_restart() -> Scenario:
    return Scenario("operator-restart", "an operator pauses the domain; meanwhile the file is edited and "
                    "the engine restarted", hours=3.0,
                    faults=[F.operator_actions(2.0, terminate_share=0.0, pause_share=1.0),
                            F.engine_restarts_with_file_edits(1.5)],
                    stresses="issue 11: an operator's pause is lost on restart (precedence of file and operator)")


@scenario
def chaos() -> Scenario:
    return Scenario("chaos", "a bit of every fault at once",
                    hours=4.0, sites=[SiteSpec("cloud-a", quota=30, price=0.05, faults=CloudFaults(
                        transient_error_rate=0.05, capacity_error_rate=0.1, lost_answer_rate=0.02,
                        never_boot_rate=0.02, partial_listing_rate=0.02, preempt_rate_per_hour=0.05)),
                        SiteSpec("cloud-b", quota=40, price=0.12)],
                    engines=2, messages=MessageFaults(delay_rate=0.03, duplicate_rate=0.03, reorder_jitter=2.0),
                    faults=[F.crashes("decision", 0.5), F.crashes("provisioner", 0.5), F.crashes("sensor", 0.5),
                            F.nodes_missing(0.5, (0.1, 0.5), (30.0, 120.0)), F.command_failures(1.0),
                            F.store_write_failures(2.0), F.operator_actions(1.0)],
                    stresses="everything together")


# ---------------------------------------------------------------------- the context broker


@scenario
def context_broker() -> Scenario:
    from epu.sim.context import ContextFaults

    return Scenario("context-broker", "the context broker in the world: every VM's agent joins through the real "
                    "broker; a job on a worker, holding its credential, forges joins with the head's names and "
                    "address and other members' addresses", hours=3.0, sites=list(TWO_SITES),
                    messages=MessageFaults(delay_rate=0.05, duplicate_rate=0.05, reorder_jitter=3.0),
                    context=ContextFaults(adversary_per_hour=60.0), seeds_in_ci=4,
                    stresses="issue 26 defect 3: a worker's credential publishing the head's names or address")


@scenario
def context_broker_lossy() -> Scenario:
    from epu.sim.context import ContextFaults

    return Scenario("context-broker-lossy", "the context broker loses a fifth of the instance events it should "
                    "consume (reports catch up) while VMs vanish and are preempted; the adversary keeps forging",
                    hours=3.0, sites=[SiteSpec("cloud-a", faults=CloudFaults(vanish_rate_per_hour=0.05,
                                                                              preempt_rate_per_hour=0.05))],
                    context=ContextFaults(adversary_per_hour=60.0, event_loss_rate=0.2, event_delay=(0.05, 60.0)),
                    seeds_in_ci=4,
                    stresses="issue 26 defect 3: joins held until the address is known, addresses released on "
                             "termination, with the broker's input lossy")


@scenario
def context_broker_reopen() -> Scenario:
    from epu.sim.context import ContextFaults

    return Scenario("context-broker-reopen", "the context broker in the world while launches are closed failed "
                    "and reopened: HTCondor, a create takes effect but its answer is lost, then the retry is "
                    "refused for capacity (the launch closes failed while its node boots, joins the pool by itself "
                    "and is reopened by reconciliation); the broker consumes instance events late and some lost",
                    hours=3.0, domain=DomainSpec(max_nodes=100, flavor="htcondor"),
                    sites=[SiteSpec("cloud-a", quota=60, faults=CloudFaults(
                        lost_answer_rate=0.15, errors_after_lost_answer=1, capacity_after_lost_answer=True,
                        listing_lag_seconds=90.0)), SiteSpec("cloud-b", quota=60, price=0.12)],
                    workload=Workload(arrivals_per_hour=30.0, burst_per_hour=1.0, burst_jobs=(10, 30)),
                    context=ContextFaults(adversary_per_hour=20.0, event_loss_rate=0.1, event_delay=(0.05, 60.0)),
                    seeds_in_ci=4,
                    stresses="issue 33 defect 5: the broker revoked a failed launch's credential for ever; the "
                             "reopened node (never destroyed) could never join and its peers never listed it")


# ---------------------------------------------------------------------- Slurm-native mode (issue 35)

NATIVE_SLOTS = [f"cloud{i:02d}" for i in range(1, 17)]
"""slurm.conf's CLOUD nodes of the native scenarios: more than max_nodes (Slurm may resume more
nodes than EPU may run: the rest is given back)."""


def native_domain(max_nodes: int = 12, **kw: object) -> DomainSpec:
    return DomainSpec(max_nodes=max_nodes, power=PowerSpec(slots=list(NATIVE_SLOTS), resume_timeout=900.0,
                                                            suspend_time=300.0, suspend_timeout=60.0), **kw)  # type: ignore[arg-type]


NATIVE_WORK = Workload(arrivals_per_hour=20.0, burst_per_hour=1.0, burst_jobs=(5, 20), nodes=(1, 1, 1, 2),
                       duration=(120.0, 1200.0))


@scenario
def native_stockout() -> Scenario:
    return Scenario("native-stockout", "native mode: Slurm resumes nodes while the cheap site keeps running out "
                    "of capacity; more nodes resumed than max_nodes and the spend cap (1.20/h) allow",
                    hours=3.0, domain=native_domain(budget_per_hour=1.2),
                    sites=[SiteSpec("cloud-a", quota=40, price=0.05, faults=CloudFaults(capacity_error_rate=0.6)),
                           SiteSpec("cloud-b", quota=40, price=0.2)],
                    workload=NATIVE_WORK,
                    stresses="issue 35: a stockout taken as a node fault (nodes stuck POWERING_UP until ResumeTimeout); "
                             "a resume over max_nodes left to time out instead of given back", seeds_in_ci=4)


@scenario
def native_site_down() -> Scenario:
    return Scenario("native-site-down", "native mode: the first site's API is down for long stretches; the second "
                    "fails now and then",
                    hours=3.0, domain=native_domain(),
                    sites=[SiteSpec("cloud-a", quota=40, price=0.05),
                           SiteSpec("cloud-b", quota=40, price=0.2, faults=CloudFaults(transient_error_rate=0.1))],
                    workload=NATIVE_WORK, faults=[F.site_outages("cloud-a", 0.6)],
                    stresses="issue 35: resumes failed over to the next site; what no site serves given back to "
                             "Slurm at once, no node left DOWN by our fault", seeds_in_ci=4)


@scenario
def native_lost_resume() -> Scenario:
    return Scenario("native-lost-resume", "native mode: a third of Slurm's program calls never arrive, a fifth of "
                    "resumes arrive twice; broker outages and slow boots",
                    hours=3.0, domain=native_domain(),
                    sites=[SiteSpec("cloud-a", quota=40, faults=CloudFaults(slow_boot_rate=0.1, never_boot_rate=0.05))],
                    workload=NATIVE_WORK,
                    faults=[F.slurm_program_faults(lost=0.33, duplicated=0.2), F.broker_outages(0.3, (10.0, 120.0))],
                    stresses="issue 35: a lost ResumeProgram call found in Slurm's snapshot (POWERING_UP, no "
                             "instance); a duplicated one is one batch; a node that never boots replaced under "
                             "its name", seeds_in_ci=4)


@scenario
def native_slurmctld_restart() -> Scenario:
    return Scenario("native-slurmctld-restart", "native mode: slurmctld restarts while nodes power up and calls "
                    "them again; engine and sensor crashes",
                    hours=3.0, domain=native_domain(),
                    sites=list(TWO_SITES), workload=NATIVE_WORK,
                    faults=[F.slurmctld_restarts(0.8), F.crashes("decision", 0.3), F.crashes("sensor", 0.3)],
                    stresses="issue 35: a slurmctld restart mid-resume calls ResumeProgram again for nodes already "
                             "launched: never a second instance for one node", seeds_in_ci=4)


@scenario
def native_spot_loss() -> Scenario:
    return Scenario("native-spot-loss", "native mode on spot instances the cloud keeps preempting under running "
                    "jobs",
                    hours=3.0, domain=native_domain(max_nodes=12, allow_spot=True),
                    sites=[SiteSpec("cloud-a", quota=30, types={"c4-spot": dict(SPOT_TYPES["c4-spot"])},
                                    faults=CloudFaults(preempt_rate_per_hour=0.5))],
                    workload=NATIVE_WORK, setup=None,
                    stresses="issue 35: a preempted node's jobs requeued, its slot powered down and resumed again "
                             "by Slurm; never counted as our kill", seeds_in_ci=4)
