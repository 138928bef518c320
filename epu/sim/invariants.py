"""The invariants, checked against the world's truth at every step of a run.

The checker never asks a core what it believes; it looks at what physically happened in the
world (which VM was destroyed, by whom, with which jobs on its node) and at what the
engines committed and sent. Each check runs where the thing it judges happens:

1. **No running job killed** — at every destroy call: the VM's batch node has no running job,
   unless an operator terminated that instance with ``--force``.
2. **No healthy instance destroyed** — at every destroy call by a provisioner: its store's
   destroy ledger holds the node, with a proof, recorded before the call (the provisioner
   destroys only with a proof, recorded: ``services/provisioner/terminations.py``); and the VM
   was made through that provisioner's own store (not another deployment's or another store's),
   and that store's record for it asked for the end (terminating), failed, is a duplicate of the
   launch, or does not exist. A record that is "terminated" although nobody asked for a
   terminate (presumed gone) does not count as asking.
3. **Never twice, never over** — at every create: one live VM per launch id, live VMs per site
   and deployment within the site's quota; at every engine commit with launches: the
   domain's active instances (world truth: not being retired, not over) within max_nodes.
4. **One brain** — at every commit and command an engine sends: that engine is the one the
   broker currently delivers the domain's input to (the single active consumer).
5. **Convergence** — at the end of the quiet phase: no satisfiable job queued; in native mode no Slurm
   node still powering up (each was served or given back); live VMs down to
   what the policy keeps at rest; every provisioner store equals the cloud (no orphan, no
   ghost) and so does the engine's instance table; no batch node without a live VM; every ended
   instance has left the engine's cleanup (its batch node's removal answered: issue 33 — an
   HTCondor node whose machine was reclaimed without a drain was sent ``remove`` for ever).
6. **No blame for our own outage** — at every commit that backs a site off: at most one new
   failure per site, and an instance counted as stalled had ``stall_seconds`` of healthy
   pipeline (broker, provisioner, engine, sensor and batch controller up) since its launch —
   counting the outages longer than ``pipeline_gap_seconds``, the engine's stated resolution (a
   sensor down between two polls is invisible to anyone downstream).
7. **Operators are obeyed** — while an operator's pause is in force (applied, not resumed), no
   engine commits a new action for the domain, whatever restarts and file edits happen; and at
   the end every change an operator sent has been answered (applied or rejected) by an engine —
   none lost, none dead-lettered as the message's fault while a store failed over.
8. **Spend within the cap** — at every create, while a cap is set: the hourly prices of the
   domain's live VMs (world truth, priced as the scenario's catalogue prices their launch's type)
   within the domain's ``budget_per_hour``, and each site's within its own.
9. **Context views are true** — in scenarios with the context broker (``epu.sim.context``), at
   every join the broker accepts and at the end: every member's cluster view (the broker's list
   folded as an agent folds it) names each host only with the names and the address its own
   instance has (the head node: its own), and no address twice.
10. **No process acts on another's authority** — at every delivery: no handler is handed a
   message whose true sender (the process that published it, not its body or headers) was not
   allowed to send it — a command, state change or result on another's behalf. A letter sent on
   from the dead-letter queue is judged by its true original sender, not by its requeuer: a
   requeued letter never gains authority.
11. **Observe mode never acts** — at every command an engine sends (launch, terminate, node
   command, by any path: a plan, a re-send, a terminate asked again, a stale record closed): the
   domain's mode, as an operator last had it applied (or as configured), is not ``observe``.
12. **Bounded work** — the safety nets end and never stop: at every command an engine sends, no
   instance received more than ``MAX_COMMANDS_PER_HOUR`` distinct commands in the hour before;
   at the end, every instance that ended more than ``CLEANUP_BOUND_SECONDS`` before has left the
   engine's cleanup (its batch node removed or confirmed absent); and while a provisioner holds
   live records and is connected, its anti-entropy report of them comes at least every
   ``REPORT_GAP_PERIODS`` report periods.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epu.common.messages import (
    InstanceReport,
    LaunchRequest,
    Message,
    NodeCommand,
    NodeCommandResult,
    PolicyChange,
    PolicyOutcome,
    TerminateRequest,
)
from epu.sim.bus import snapshot_queue

if TYPE_CHECKING:
    from epu.sim.cloud import VM
    from epu.sim.processes import EngineProc
    from epu.sim.simulation import Simulation

NAMES = {
    1: "no running job killed",
    2: "no healthy instance destroyed",
    3: "never twice, never over",
    4: "one brain",
    5: "convergence",
    6: "no blame for our own outage",
    7: "operators are obeyed",
    8: "spend within the cap",
    9: "context views are true",
    10: "no process acts on another's authority",
    11: "observe mode never acts",
    12: "bounded work",
}
MAX_PER_RUN = 25
MAX_COMMANDS_PER_HOUR = 60
"""Distinct commands (new ids: re-sends of one keep its id) one instance may receive in an hour. A
worker's whole life takes five (launch, add, offline, remove, terminate); a reclaimed drain two
more each time; a command answered with an error is planned anew at the next iteration (the
sensor's answers fail for minutes in some scenarios: a dozen in two minutes is seen). What the
bound catches is a safety net that never ends: a command asked again for ever."""
CLEANUP_BOUND_SECONDS = 3600.0
"""How long an ended instance may stay in the engine's cleanup (its batch node to remove)."""
REPORT_GAP_PERIODS = 3
"""Report periods a connected provisioner with live records may go without a report."""


@dataclass(frozen=True)
class Violation:
    invariant: int
    at: float
    """Seconds since the start of the run."""
    detail: str

    @property
    def name(self) -> str:
        return NAMES[self.invariant]

    def __str__(self) -> str:
        return f"invariant {self.invariant} ({self.name}) at t={self.at:.0f}s: {self.detail}"


class Checker:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.world = sim.world
        self.violations: list[Violation] = []
        self.terminate_requested: set[str] = set()
        """Launch ids some engine or operator asked to terminate."""
        self.launched: dict[str, str] = {}
        """Launch id → domain, for every launch an engine committed."""
        self.retiring: set[str] = set()
        self._retire_asked: dict[str, list[str]] = {}
        """An operator's policy change id → the instances it asks to retire (until applied)."""
        """Launch ids being drained or terminated (an engine committed an offline or a terminate,
        or an operator sent a terminate)."""
        self.max_epoch: dict[str, int] = {}
        self.paused = False
        """The operator's pause as last applied (PolicyOutcome), whatever an engine believes now."""
        self.answered: set[str] = set()
        """Ids of the operator's changes an engine answered (a PolicyOutcome, applied or not)."""
        self.store_of: dict[str, str] = {}
        """VM id → the store (database) of the provisioner that created it, at that time."""
        self.live_per_launch: dict[str, int] = {}
        self.live_per_site: dict[str, int] = {}
        self._ours = {p.name for p in sim.provisioners if p.spec.managed}  # type: ignore[attr-defined]
        self._quotas = {s.name: s.quota for s in sim.scenario.sites}
        self.live_by_domain: dict[str, set[str]] = {}
        self.launch_type: dict[str, str] = {}
        """Launch id → the instance type an engine committed it as (priced by invariant 8)."""
        self._sites = {s.name: s for s in sim.scenario.sites}
        for cloud in sim.clouds.values():
            cloud.before_destroy.append(self.on_destroy)
            cloud.on_create.append(self.on_create)
            cloud.on_gone.append(self._gone)
        for e in sim.engines:
            e.on_commit.append(self.on_commit)
            e.on_send.append(self.on_send)
        sim.bus.taps.append(self.on_message)
        sim.bus.on_foreign.append(self.on_foreign)
        sim.bus.around.append(self.around_result)
        self.command_domain: dict[str, str] = {}
        """Command id → the domain of every node command an engine sent (whose sensor may answer it)."""
        sim.batch.inner.on_kill.append(self.on_kill)
        self.finishers: list[Any] = []
        """Extra end-of-run checks of the world's optional parts (the context broker)."""
        self.mode = sim.scenario.domain.mode
        """The domain's mode as last applied for an operator (invariant 11), whatever an engine believes."""
        self._commands: dict[str, list[float]] = {}
        """Instance → when each distinct command about it was first sent (invariant 12)."""
        self._command_ids: set[str] = set()
        self._last_report: dict[str, float] = {}
        """Provisioner → when it last published a report (invariant 12)."""
        self._holding: dict[str, float] = {}
        """Provisioner → since when the checks have seen it hold live records."""
        self._up_for: dict[str, float] = {}
        """Provisioner → since when it has been connected, as the checks saw it."""
        self._report_period = sim.config.provisioner.report_seconds
        self._next_report_check = self.world.start + self._report_period
        """Reports are checked on the messages the world carries (the checker schedules no event of
        its own: that would move the order of the world's events)."""

    # ------------------------------------------------------------------ recording
    def fail(self, invariant: int, detail: str) -> None:
        if len(self.violations) >= MAX_PER_RUN:
            return
        v = Violation(invariant, self.world.elapsed, detail)
        self.violations.append(v)
        self.world.note(f"VIOLATION {v}")

    def on_message(self, msg: Message, sender: Any) -> None:
        if isinstance(msg, InstanceReport) and sender is not None:
            self._last_report[getattr(sender, "name", "")] = self.world.t
        if self.world.t >= self._next_report_check:
            self._reports_due()
        if isinstance(msg, PolicyOutcome) and msg.applied and msg.domain == self.sim.domain and msg.config \
                and sender is not None and getattr(sender, "kind", "") == "decision":
            self.mode = str(msg.config.get("mode", self.mode))
        if isinstance(msg, TerminateRequest):
            self.terminate_requested.add(msg.instance_id)
            if sender is not None and getattr(sender, "kind", "") == "operator":
                # on its way out of the domain as an engine's committed terminate is: the engine
                # may replace it as soon as it hears "terminating", while the VM still runs for
                # the moment the destroy takes (``epu sim --seed 7069 --scenario operators``)
                self.retiring.add(msg.instance_id)
        elif isinstance(msg, PolicyChange) and msg.retire and sender is not None \
                and getattr(sender, "kind", "") == "operator":
            self._retire_asked[msg.change_id] = list(msg.retire)
        elif isinstance(msg, PolicyOutcome) and sender is not None and getattr(sender, "kind", "") == "decision" \
                and msg.change_id in self.sim.operator.changes:
            self.answered.add(msg.change_id)
            if msg.applied and msg.domain == self.sim.domain and msg.config:
                self.paused = bool(msg.config.get("paused"))
                # an operator's unforced terminate, applied: on its way out from now on (the engine
                # stops counting it at once, while its drain may wait — its node lost from the
                # collector, the breaker open; ``epu sim --seed 5008 --scenario htcondor-two-views``)
                self.retiring.update(self._retire_asked.pop(msg.change_id, ()))

    def on_foreign(self, msg: Message, sent: Any, queue: str) -> None:
        domain = getattr(msg, "domain", "")
        how = " (a requeued dead letter)" if getattr(sent, "requeued", False) else ""
        self.fail(10, f"{queue} handed {msg.TYPE} of {domain} sent by {sent.user} "
                     f"({getattr(sent.sender, 'name', '?')}){how} to its handler")

    def on_kill(self, job_id: str, node: str, why: str) -> None:
        """A batch node removed with ``force`` takes its jobs down, and a drain that evicts them
        (HTCondor's graceful drain once MaxJobRetirementTime is spent) kills their work: nothing in
        EPU may do either (only an operator at the batch system's own console)."""
        if why == "node removed by force" or why.startswith("evicted"):
            self.fail(1, f"job {job_id} killed: node {node} {why}")

    def on_create(self, vm: VM) -> None:
        creator = next((p for p in self.sim.provisioners if p.name == vm.created_by), None)
        self.store_of[vm.cloud_id] = creator.spec.store if creator is not None else vm.created_by  # type: ignore[attr-defined]
        self._created(vm)

    # ------------------------------------------------------------------ 1 and 2: destroys
    def on_destroy(self, vm: VM, caller: str) -> None:
        sim = self.sim
        lid = vm.launch_id or "?"
        jobs = sim.batch.jobs_on_vm(vm)
        if jobs and lid not in sim.operator.log.forced:
            self.fail(1, f"{caller} destroyed {vm.cloud_id} (launch {lid}) while it ran job(s) "
                         f"{', '.join(jobs[:5])}")
        prov = next((p for p in sim.provisioners if p.name == caller), None)
        if prov is not None and prov.store is not None:
            ledger = prov.store.destroys(cloud_id=vm.cloud_id, limit=1)
            if not ledger or not ledger[-1].proof:
                self.fail(2, f"{caller} destroyed {vm.cloud_id} (launch {lid}) without a proof recorded first")
        if prov is None or lid in self.terminate_requested:
            return  # asked for by an engine or an operator: not a sweep (invariant 1 still applies)
        made_in = self.store_of.get(vm.cloud_id, vm.created_by)
        if made_in != prov.spec.store:  # type: ignore[attr-defined]
            self.fail(2, f"{caller} (store {prov.spec.store}) destroyed {vm.cloud_id} (launch {lid}) made "  # type: ignore[attr-defined]
                         f"by {vm.created_by} through store {made_in} (another deployment or store)")
            return
        store = prov.store
        rec = store.get(lid) if store is not None and vm.launch_id else None
        if rec is None:
            return  # unknown to this store (a lost or restored database): an orphan by its lights
        if rec.cloud_id not in (None, vm.cloud_id):
            return  # a duplicate node of a launch: sweeping it is right
        if rec.state in ("failed", "terminating"):
            return
        if rec.state == "terminated":
            self.fail(2, f"{caller} destroyed live {vm.cloud_id} (launch {lid}) whose record was only "
                         f"presumed gone ({rec.reason[:80]})")
            return
        self.fail(2, f"{caller} destroyed {vm.cloud_id} (launch {lid}) whose record is {rec.state} "
                     f"and was never asked to end")

    # ------------------------------------------------------------------ 3: at creates
    def _count(self, vm: VM, delta: int) -> None:
        lid = vm.launch_id
        if lid and vm.domain:
            ids = self.live_by_domain.setdefault(vm.domain, set())
            if delta > 0:
                ids.add(lid)
            else:
                ids.discard(lid)
        if lid:
            n = self.live_per_launch.get(lid, 0) + delta
            if n:
                self.live_per_launch[lid] = n
            else:
                self.live_per_launch.pop(lid, None)
        if vm.created_by in self._ours:
            self.live_per_site[vm.site] = self.live_per_site.get(vm.site, 0) + delta

    def _created(self, vm: VM) -> None:
        self._count(vm, +1)
        lid = vm.launch_id
        if lid and self.live_per_launch.get(lid, 0) > 1:
            self.fail(3, f"{self.live_per_launch[lid]} live VMs for launch {lid}")
        site = vm.site
        quota = self._quotas.get(site)
        if vm.created_by in self._ours and quota is not None and self.live_per_site.get(site, 0) > quota:
            self.fail(3, f"{self.live_per_site[site]} live VMs at {site} over its quota of {quota}")
        self._spend(vm)

    # ------------------------------------------------------------------ 8: at creates
    def _price(self, vm: VM) -> float | None:
        """What one hour of ``vm`` costs as the scenario's catalogue prices its launch's type
        (None: the type is unpriced — a listed size without a price, a type without one)."""
        spec = self._sites.get(vm.site)
        return spec.price_of(self.launch_type.get(vm.launch_id or "", "")) if spec is not None else 0.0

    def _spend(self, vm: VM) -> None:
        """The spend rate of what runs (and is paid) right now, against the caps it must stay under.
        A VM of an unpriced type created under a cap is a violation in itself: the cap cannot
        have counted it (issue 33, defect 4), so it is never summed as 0."""
        d = self.sim.scenario.domain
        caps = {s.name: s.budget_per_hour for s in self.sim.scenario.sites if s.budget_per_hour}
        if not d.budget_per_hour and vm.site not in caps:
            return
        if self._price(vm) is None and (vm.site in caps or (d.budget_per_hour and vm.domain == d.name)):
            self.fail(8, f"{vm.cloud_id} of unpriced type {self.launch_type.get(vm.launch_id or '', '') or vm.size!r} "
                         f"created at {vm.site} under a spend cap")
            return
        live = [v for c in self.sim.clouds.values() for v in c.vms.values()
                if v.terminated_at is None and v.created_by in self._ours and v.launch_id in self.launched
                and self._price(v) is not None]  # an unpriced one failed at its create
        mine = sum(self._price(v) or 0.0 for v in live if v.domain == d.name)
        if d.budget_per_hour and mine > d.budget_per_hour + 1e-9:
            self.fail(8, f"{d.name} spends {mine:.2f}/h over its budget_per_hour {d.budget_per_hour:.2f} "
                         f"(after creating {vm.cloud_id})")
        cap = caps.get(vm.site)
        there = sum(self._price(v) or 0.0 for v in live if v.site == vm.site)
        if cap and there > cap + 1e-9:
            self.fail(8, f"{vm.site} spends {there:.2f}/h over its budget_per_hour {cap:.2f}")

    def _gone(self, vm: VM, _cause: str) -> None:
        self._count(vm, -1)

    # ------------------------------------------------------------------ 3, 4, 6: engine commits
    def on_send(self, proc: EngineProc, msg: Message) -> None:
        if isinstance(msg, LaunchRequest | TerminateRequest | NodeCommand):
            self._one_brain(proc, f"sent {msg.TYPE}")
            if self.mode == "observe":
                self.fail(11, f"{proc.name} sent {_what(msg)} while {self.sim.domain} is in observe mode")
            self._count_command(proc, msg)
        if isinstance(msg, NodeCommand):
            self.command_domain[msg.command_id] = msg.domain

    # ------------------------------------------------------------------ 12: bounded work
    def _count_command(self, proc: EngineProc, msg: Message) -> None:
        cid = getattr(msg, "launch_id", None) or getattr(msg, "command_id", None) or getattr(msg, "request_id", "")
        if cid in self._command_ids:
            return  # a re-send of one already counted (the same id)
        self._command_ids.add(cid)
        iid = getattr(msg, "launch_id", None) or getattr(msg, "instance_id", None) or ""
        if not iid and isinstance(msg, NodeCommand):  # a give-back (native mode) is about a node, not an instance
            iid = f"node:{msg.node}"
        now = self.world.t
        times = [t for t in self._commands.get(iid, ()) if now - t < 3600.0]
        times.append(now)
        self._commands[iid] = times
        if len(times) == MAX_COMMANDS_PER_HOUR + 1:  # once per run of too many
            self.fail(12, f"{proc.name} sent instance {iid[:8]} {len(times)} commands within an hour "
                         f"(bound {MAX_COMMANDS_PER_HOUR}; the last: {_what(msg)})")

    def _reports_due(self) -> None:
        """Every report period: a provisioner connected for ``REPORT_GAP_PERIODS`` periods with live
        records must have reported within them (its safety net never stops)."""
        period = self._report_period
        now = self.world.t
        if now - (self._next_report_check - period) > 2 * period:
            self._up_for.clear()  # no message for a while (the broker down): connections unknown meanwhile
        self._next_report_check = now + period
        gap = REPORT_GAP_PERIODS * period
        for p in self.sim.provisioners:
            if not p.spec.managed or not (p.connected and p.aware) or p.store is None:  # type: ignore[attr-defined]
                self._up_for.pop(p.name, None)
                self._holding.pop(p.name, None)
                continue
            up = now - self._up_for.setdefault(p.name, now)
            if not p.store.list(active_only=True):
                self._holding.pop(p.name, None)
                continue
            # held since this check first saw live records in this life of the process: a mark from
            # before a crash would blame the new life for the old one's silence
            # (``epu sim --seed 88018 --scenario new-store``)
            holding = self._holding.setdefault(p.name, now)
            if up <= gap:
                continue
            last = max(self._last_report.get(p.name, -float("inf")), holding)
            if now - last > gap:
                self.fail(12, f"{p.name} holds live records, connected for {up:.0f}s, but has published no "
                              f"report for {min(now - last, up):.0f}s (its safety net stopped)")
                self._last_report[p.name] = now  # once per stop

    def _cleanup_bounded(self) -> None:
        """At the end: no instance ended long ago still waits in the engine's cleanup."""
        from epu.sim.processes import open_decision_store

        store = open_decision_store(self.sim.decision_db)
        now = self.world.t
        stuck = [i for i in store.cleanup(self.sim.domain) if now - i.state_at > CLEANUP_BOUND_SECONDS]
        if stuck:
            self.fail(12, f"{len(stuck)} instance(s) ended over {CLEANUP_BOUND_SECONDS:.0f}s ago still in the "
                          f"engine's cleanup: {[(i.instance_id[:8], i.state, int(now - i.state_at)) for i in stuck[:3]]}")

    def around_result(self, msg: Message, sent: Any, owner: Any) -> Any:
        """Invariant 10 for a result that is its sender's to send but answers another domain's
        command: the engine must not complete the command on its word."""
        if not isinstance(msg, NodeCommandResult):
            return None
        domain = self.command_domain.get(msg.command_id)
        engine = getattr(owner, "engine", None)
        if domain is None or engine is None or sent.user == f"epu-sensor-{domain}":
            return None
        row = engine.store.action(msg.command_id)
        if row is None or row["done"]:
            return None

        def after() -> None:
            now = engine.store.action(msg.command_id)
            if now is not None and now["done"]:
                self.fail(10, f"{owner.name} completed {domain}'s {row['kind']} {msg.command_id[:8]} on a result "
                             f"sent by {sent.user}")

        return after

    def _one_brain(self, proc: EngineProc, what: str) -> None:
        """Two brains. With fencing (every engine since issue 12): an engine acts only while the
        shared store's lease of the domain names it, and never with an older epoch than one that
        already acted. Without it: an engine acts while the broker hands the domain's snapshots to
        another one. (Acting while nobody holds the queue — the broker is down — is one brain
        acting on old news, which invariants 1 and 2 judge.)"""
        domain = self.sim.domain
        if proc.leases is not None:
            row = proc.leases.row(domain)  # the shared store's lease, as every engine sees it
            # expiry by the engine's own clock, the one its lease was written in (with per-process
            # clocks true time would blame a lease no other engine could have taken: the holder and
            # epoch are the fence, checked here and below)
            if row is None or row[0] != proc.leases.holder or row[2] < proc.clock.now():
                self.fail(4, f"{proc.name} {what} without holding the lease of {domain} "
                             f"(held by {row[0] if row else 'nobody'})")
                return
            epoch = row[1]
            if epoch < self.max_epoch.get(domain, 0):
                self.fail(4, f"{proc.name} {what} with lease epoch {epoch} after epoch "
                             f"{self.max_epoch[domain]} acted")
            self.max_epoch[domain] = max(self.max_epoch.get(domain, 0), epoch)
            return
        holder = self.sim.bus.sac_holder(snapshot_queue(domain))
        if holder is not None and holder is not proc:
            self.fail(4, f"{proc.name} {what} while {holder.name} is the active consumer")

    def on_commit(self, proc: EngineProc, domain: str, plan: Any) -> None:
        if not plan.actions:
            return
        self._one_brain(proc, f"committed {len(plan.actions)} action(s)")
        if self.paused:
            self.fail(7, f"{proc.name} committed {', '.join(sorted({p.kind for p in plan.actions}))} while an "
                         "operator's pause is in force")
        launches = 0
        for p in plan.actions:
            if p.kind == "launch":
                self.launched[p.instance_id] = domain
                self.launch_type[p.instance_id] = p.instance_type
                self.retiring.discard(p.instance_id)
                launches += 1
            elif p.kind in ("terminate", "offline", "remove"):
                self.retiring.add(p.instance_id)
            elif p.kind == "online":
                self.retiring.discard(p.instance_id)
        if launches:
            self._max_nodes(proc, domain)
        self._blame(proc, plan)

    def _max_nodes(self, proc: EngineProc, domain: str) -> None:
        """Active = what the engine counts (its live, not retiring instances — launches still on their
        way included) plus every live VM of the domain no engine is retiring (a VM the engine
        believes gone but which runs counts: that is how "presumed gone" goes over the limit)."""
        assert proc.engine is not None
        current = proc.engine.store.current_config(domain)
        if current is None:
            return
        limit = current[1].max_nodes
        counted = {i.instance_id for i in proc.engine.store.instances(domain) if i.active}
        running = {lid for lid in self.live_by_domain.get(domain, ()) if lid not in self.retiring}
        active = len(counted | running)
        if active > limit:
            self.fail(3, f"{proc.name} launched with {active} active instances in {domain} (max_nodes={limit})")

    def _blame(self, proc: EngineProc, plan: Any) -> None:
        if not plan.sites:
            return
        before = getattr(plan, "_health_before", None)
        stall = self.sim.scenario.timing.stall_seconds
        stall = float(self.sim.scenario.domain.params.get("stall_seconds", stall))
        now = self.world.t
        for site, h in plan.sites.items():
            prev = before.get(site) if before else None
            if prev is not None and h.failures - prev.failures > 1:
                self.fail(6, f"{proc.name} counted {h.failures - prev.failures} failures of {site} in one iteration")
            new_stalls = h.stalls - (prev.stalls if prev is not None else 0)
            if new_stalls <= 0:
                continue
            for p in plan.actions:
                if p.kind != "terminate" or p.site != site or not p.reason.startswith("stalled"):
                    continue
                inst = plan.instances.get(p.instance_id)
                if inst is None:
                    continue
                healthy = (now - inst.launched_at) - self.sim.outages.down_time(
                    inst.launched_at, now, at_least=self.sim.config.decision.pipeline_gap_seconds)
                if healthy < stall - 1e-6:
                    self.fail(6, f"{site} blamed for {p.instance_id[:8]} stalling after only {healthy:.0f}s of "
                                 f"healthy pipeline ({now - inst.launched_at:.0f}s since launch; limit {stall:.0f}s)")

    # ------------------------------------------------------------------ 5: the end
    def finish(self) -> None:
        for fn in self.finishers:
            fn()
        sim = self.sim
        unanswered = sorted(sim.operator.changes - self.answered)
        if unanswered:
            self.fail(7, f"{len(unanswered)} operator change(s) never answered (lost or dead-lettered): "
                         f"{[c[:8] for c in unanswered[:3]]}")
        d = sim.scenario.domain
        inner = sim.batch.inner
        inner.advance()
        waiting = [j for j in inner._queue
                   if not j.held and not j.blocked and j.cores <= max_cores(sim) and j.nodes <= d.max_nodes]
        live = [vm for c in sim.clouds.values() for vm in c.vms.values()
                if vm.terminated_at is None and vm.domain == d.name
                and vm.created_by in {p.name for p in sim.provisioners if p.spec.managed}]  # type: ignore[attr-defined]
        capacity = min(d.max_nodes, sum(s.quota for s in sim.scenario.sites))
        if d.budget_per_hour:  # a job the cap leaves no room for is the cap working, not a failure
            spend = sum(self._price(v) or 0.0 for v in live)
            waiting = [j for j in waiting if spend + self._cheapest_for(j) <= d.budget_per_hour + 1e-9]
        if waiting and len(live) < capacity:  # a backlog the domain runs at full size is not a failure
            self.fail(5, f"{len(waiting)} satisfiable job(s) still queued at the end with {len(live)} of "
                         f"{capacity} nodes (e.g. {waiting[0].job_id}: {waiting[0].nodes}x{waiting[0].cores} cores)")
        busy = [vm for vm in live if sim.batch.jobs_on_vm(vm)]
        rest = rest_nodes(d)
        if len(live) > max(rest, len(busy)):
            self.fail(5, f"{len(live)} live VMs at the end, {len(busy)} busy; the policy keeps {rest} at rest")
        # stores equal the cloud
        by_store: dict[str, Any] = {}
        for p in sim.provisioners:
            spec = p.spec  # type: ignore[attr-defined]
            if spec.managed and p.store is not None:
                by_store.setdefault(spec.store, p.store)
        live_ids = {vm.launch_id: vm for vm in live}
        records: dict[str, Any] = {}
        for store in by_store.values():
            for r in store.list(active_only=True):
                records[r.instance_id] = r
        orphans = [lid for lid in live_ids if lid not in records]
        ghosts = [r.instance_id for r in records.values() if r.instance_id not in live_ids]
        if orphans:
            self.fail(5, f"{len(orphans)} orphan VM(s) unknown to the provisioner store(s): {orphans[:3]}")
        if ghosts:
            self.fail(5, f"{len(ghosts)} ghost record(s) without a live VM: "
                         f"{[(g[:8], records[g].state) for g in ghosts[:3]]}")
        stuck = self._engine_cleanup(d.name)
        if stuck:
            self.fail(5, f"{len(stuck)} ended instance(s) still in the engine's cleanup at the end (their batch "
                         f"node's removal never answered): {stuck[:3]}")
        engine_live = self._engine_live(d.name)
        if engine_live is not None:
            e_ghosts = sorted(set(engine_live) - set(live_ids))
            e_orphans = sorted(set(live_ids) - set(engine_live))
            if e_ghosts:
                self.fail(5, f"{len(e_ghosts)} instance(s) the engine believes live without a VM: "
                             f"{[(g[:8], engine_live[g]) for g in e_ghosts[:3]]}")
            if e_orphans:
                self.fail(5, f"{len(e_orphans)} live VM(s) the engine does not track: {e_orphans[:3]}")
        obs = inner.snapshot()
        power = sim.batch.power  # native mode: a powered-down CLOUD node has no machine, by design
        if power is not None:  # native mode: every node Slurm powered up was served or given back
            stuck_up = sorted(n for n, st in power.state.items() if st == "up_pending")
            if stuck_up:
                self.fail(5, f"{len(stuck_up)} Slurm node(s) still powering up at the end (never served nor "
                             f"given back): {stuck_up[:3]}")
        stale = [n.name for n in obs.nodes if n.name not in sim.batch.serving
                 and not (power is not None and power.powered_down(n.name))]
        if stale:
            self.fail(5, f"{len(stale)} batch node(s) left without a live VM: {stale[:3]}")
        self._cleanup_bounded()

    def _cheapest_for(self, job: Any) -> float:
        """The hourly price of the cheapest instance that could run one node of ``job`` (a type of
        its partition with the cores, memory, GPUs and features it asks; a size a site discovers;
        a site's own single type). An unpriced type is one a cap never launches: not a candidate."""
        d = self.sim.scenario.domain
        allowed = d.partitions.get(job.queue) if d.partitions else None
        prices = []
        for site in self.sim.scenario.sites:
            if not site.types and not site.sizes:
                if job.cores <= site.cores:
                    prices.append(site.price)
                continue
            listed = {sid: {**z, "size": sid} for sid, z in site.sizes.items()
                      if any(fnmatch.fnmatchcase(sid, p) for p in site.discover)}
            for name, t in {**listed, **site.types}.items():
                if allowed is not None and name not in allowed:
                    continue
                price = site.price_of(name)
                if price is None:
                    continue
                if (int(t.get("cores", 0)) >= job.cores and int(t.get("memory_mb", 0) or job.memory_mb) >= job.memory_mb
                        and int(t.get("gpus", 0)) >= job.gpus and set(job.features) <= set(t.get("features", ()))):
                    prices.append(price)
        return min(prices, default=float("inf"))

    def _engine_cleanup(self, domain: str) -> list[tuple[str, str, str]]:
        """(instance, state, node) of each ended instance the engine still means to clean up after."""
        from epu.sim.processes import open_decision_store

        store = open_decision_store(self.sim.decision_db)
        return [(i.instance_id[:8], i.state, i.node_name) for i in store.cleanup(domain)]

    def _engine_live(self, domain: str) -> dict[str, str] | None:
        from epu.sim.processes import open_decision_store

        store = open_decision_store(self.sim.decision_db)
        return {i.instance_id: i.state for i in store.instances(domain)}


def max_cores(sim: Any) -> int:
    """The most cores per node any type of the scenario offers (a bigger job is unsatisfiable)."""
    typed = [int(t.get("cores", 0)) for s in sim.scenario.sites for t in s.types.values()]
    return max(typed) if typed else sim.scenario.domain.cores_per_node


def rest_nodes(d: Any) -> int:
    """How many nodes the domain's policy keeps with an empty queue."""
    p = d.params
    if d.policy == "spare":
        return min(d.max_nodes, max(d.min_nodes, int(p.get("spare_nodes", 1))))
    if d.policy == "fixed":
        return min(d.max_nodes, max(d.min_nodes, int(p.get("nodes", 1))))
    return d.min_nodes


def _what(msg: Message) -> str:
    """A command as an invariant's detail names it."""
    if isinstance(msg, NodeCommand):
        return f"{msg.action} {msg.node}"
    if isinstance(msg, TerminateRequest):
        return f"terminate {msg.instance_id[:8]} ({msg.reason[:60]})"
    return f"{msg.TYPE} {getattr(msg, 'launch_id', '')[:8]}"
