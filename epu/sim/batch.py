"""The batch system of a simulated domain: a ``BatchBackend`` whose nodes live and die with VMs.

The queue and the scheduler are ``services.sensor.simulated.SimulatedBatch`` (jobs run on
nodes for their duration, EASY backfill). This module adds what ties the batch system to the
cloud, so that the world — not a script — decides what a snapshot shows:

* a node's daemon runs on a VM: the node is up only while a running VM of that name serves it,
  and a VM that dies takes the node's running jobs with it (they are requeued and counted);
* how a node joins depends on the batch system (``flavor``):

  - ``slurm`` / ``torque``: the engine's ``add`` creates the node; its daemon registers a few
    seconds later if its VM runs; ``remove`` deletes it. With ``node_names`` (a Slurm CLOUD
    pool) the same: a slot that is not added is powered down and not in the snapshot.
  - ``htcondor``: a booted VM's startd joins by itself, named by its FQDN
    (``NAME.<domain suffix>``); ``add`` is a no-op; ``remove`` turns the startd off.

  Every flavor reports the node's identity (``NodeInfo.instance_id``) unless
  ``report_identity`` is off (a backend that cannot say: the engine falls back to names);
* drains as each batch system does them: Slurm's ``DRAIN`` and Torque's ``offline`` never touch
  running jobs; HTCondor's ``offline`` is what the real backend sends (``condor_drain``), and a
  graceful drain (``condor_drain = "graceful"``) *evicts* the node's jobs once
  ``retirement_seconds`` (the pool's ``MaxJobRetirementTime``, HTCondor's default 0) are spent —
  while a peaceful startd shutdown (``"peaceful"``, EPU's default) waits for them whatever the
  retirement time. An evicted job is a killed job (invariant 1), so a backend that drains the
  evicting way is caught by a seed;
* HTCondor as two views: the collector (what snapshots and the backend's command checks see)
  can lose a live worker's ads for long stretches (``collector_lost``, fault
  ``faults.collector_losses``) while the schedd — the true jobs, ``RemoteHost`` — still lists
  what runs there. ``remove`` is answered through the real backend's decision
  (``services/sensor/htcondor/removal.py``) from those two views, not from the world's truth; the
  peaceful shutdown it sends ends only when the node's jobs have ended (then the master exits
  and the node's ads go);
* faults (``BatchFaults``): the controller down (``available=False``, commands fail
  transiently), nodes missing from snapshots while they run jobs (a collector or slurmctld
  restart), stale snapshots, commands failing transiently a few times.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epu.common.messages import NodeInfo
from epu.services.sensor.backend import (
    BackendUnavailable,
    CommandOutcome,
    Observation,
    check_action,
    check_node_name,
)
from epu.services.sensor.htcondor.removal import (
    ABSENT_CONFIRM_SECONDS,
    Absences,
    RemovalFacts,
    RemovalStep,
    removal_step,
)
from epu.services.sensor.simulated import SimulatedBatch, mismatched_add
from epu.sim.cloud import VM
from epu.sim.world import World, WorldClock


@dataclass
class BatchFaults:
    down: bool = False
    """The batch controller is down: snapshots unavailable, commands fail transiently."""
    missing_share: float = 0.0
    """Share of nodes missing from snapshots (1.0 = all: a collector rejecting every ad)."""
    stale_seconds: float = 0.0
    """Snapshots show the cluster as it was this long ago (a controller answering from old state)."""
    failing_commands: int = 0
    """The next N node commands fail transiently (then succeed)."""
    answers_lost: int = 0
    """The next N node commands take effect, then answer with a timeout: the controller applied the
    change, the client gave up waiting for it (an answer that is wrong, not absent)."""


@dataclass
class Kill:
    at: float
    job_id: str
    node: str
    why: str


@dataclass
class BatchStats:
    commands: int = 0
    failed_commands: int = 0
    snapshots: int = 0
    unavailable: int = 0
    rewritten: int = 0
    """``add`` of a name another live instance held (its node's identity and address rewritten)."""
    kills: list[Kill] = field(default_factory=list)


class SimBatchSystem:
    """The head node of one domain (see the module docstring)."""

    name = "simulated"

    def __init__(self, world: World, clock: WorldClock, *, flavor: str = "slurm", fqdn_suffix: str = "cluster.internal",
                 report_identity: bool = True, register_seconds: tuple[float, float] = (2.0, 15.0),
                 condor_drain: str = "peaceful", retirement_seconds: float = 0.0) -> None:
        if flavor not in ("slurm", "torque", "htcondor"):
            raise ValueError(f"unknown batch flavor {flavor!r}")
        self.world = world
        self.flavor = flavor
        self.fqdn_suffix = fqdn_suffix
        self.report_identity = report_identity
        self.register_seconds = register_seconds
        if condor_drain not in ("peaceful", "graceful"):
            raise ValueError(f"unknown condor_drain {condor_drain!r} (peaceful or graceful)")
        self.condor_drain = condor_drain
        """How an HTCondor ``offline`` drains (the real backend's ``drain_type``)."""
        self.retirement_seconds = retirement_seconds
        """HTCondor's MaxJobRetirementTime: a graceful drain evicts once it is spent."""
        self._drains: dict[str, int] = {}
        """Node → the number of its current graceful drain (an ``online`` ends it)."""
        self.collector_lost: dict[str, float] = {}
        """HTCondor node → until when the collector has lost its ads (the worker runs on)."""
        self.remove_decision: Callable[[RemovalFacts], RemovalStep] = removal_step
        """How an HTCondor ``remove`` is decided from the two views: the real backend's function."""
        self.shutdowns: dict[str, str] = {}
        """HTCondor node → the VM whose master was sent a peaceful shutdown (still running)."""
        self.exited: set[str] = set()
        """VM ids whose HTCondor master exited after its peaceful shutdown."""
        self.absences = Absences()
        """HTCondor node → since when a remove found it with no ad and no job (the backend's memory)."""
        self.absent_confirm_seconds = ABSENT_CONFIRM_SECONDS
        self.clock = clock
        self.inner = SimulatedBatch(clock)
        self.inner.group_at_source = True  # shapes, not a record per pending job (see SimulatedBatch)
        self.inner.sample_jobs = 0
        """No per-job sample either: nothing in the simulators reads it (the sensor core publishes
        the shapes only, ``SensorSnapshot.jobs`` stays empty), and twenty ``QueuedJob`` records
        built at every read cost more than the rest of a kept snapshot."""
        self.inner.on_kill.append(self._killed)
        self.lost_node_seconds = 0.0
        """How long the batch system takes to notice that a preempted VM's daemon is gone
        (Slurm's ``SlurmdTimeout``); 0: at once, its jobs requeued by the batch system itself.
        Until then the node's jobs stay counted there and make no progress: only EPU's requeue
        (``requeue_jobs``) gives them back sooner."""
        self.preempted_jobs: dict[str, str] = {}
        """Job id → the node it was running on when the cloud preempted that node's VM."""
        self.faults = BatchFaults()
        self.stats = BatchStats()
        self.serving: dict[str, VM] = {}
        """Batch node name → the running VM whose daemon serves it."""
        self.running_by_launch: dict[str, VM] = {}
        """Launch id → its running VM (an ``add`` names the instance it is for)."""
        self.retired: set[str] = set()
        """VM ids whose startd was turned off (htcondor ``remove``): they do not come back."""
        self._history: deque[tuple[float, Observation]] = deque()
        self._rng = world.rng("batch")
        self.command_context: str | None = None
        """The instance id of the node command being executed (set by the sensor process)."""
        self.power: Any = None
        """Slurm's power saving (``epu.sim.power.SlurmPowerSaving``) in native mode; None: off."""
        self.node_types: dict[str, dict] = {}
        """Provider size → what a node of that size offers beyond cores (memory_mb, gpus, features,
        partitions): a Slurm CLOUD slot declared per type."""

    # ------------------------------------------------------------------ names
    def batch_name(self, vm_name: str) -> str:
        return f"{vm_name}.{self.fqdn_suffix}" if self.flavor == "htcondor" else vm_name

    # ------------------------------------------------------------------ the cloud's side
    def vm_running(self, vm: VM) -> None:
        name = self.batch_name(vm.name)
        self.running_by_launch[vm.launch_id or vm.cloud_id] = vm
        if self.power is not None and self.power.is_slot(name):
            if name in self.serving and self.serving[name].terminated_at is None:
                return  # the slot's machine is another live VM (one being retired)
            self.serving[name] = vm
            delay = self._rng.uniform(*self.register_seconds)
            self.world.call_after(delay, lambda: self.power.registered(name, vm), f"batch register {name}")
            return
        if self.flavor != "htcondor" and name in self.serving and self.serving[name].terminated_at is None:
            # two live machines of one name (a name collision): the first keeps the name until an
            # ``add`` for the second rewrites it (``_apply``)
            return
        self.serving[name] = vm
        delay = self._rng.uniform(*self.register_seconds)
        self.world.call_after(delay, lambda: self._register(name, vm), f"batch register {name}")

    def _register(self, name: str, vm: VM) -> None:
        if self.serving.get(name) is not vm or vm.terminated_at is not None:
            return
        if self.flavor == "htcondor":
            if vm.cloud_id in self.retired:
                return
            self.inner.add_node(name, self.default_cores, instance_id=vm.launch_id, up=False)
            self._resources(name, vm)
        node = self.inner.node(name)
        if node is not None:
            if node.instance_id is None:
                node.instance_id = vm.launch_id
            self.inner.set_node_up(name, True)

    default_cores = 1

    def _resources(self, name: str, vm: VM) -> None:
        kind = self.node_types.get(vm.size)
        if kind:
            self.inner.set_resources(name, **kind)

    def vm_gone(self, vm: VM, cause: str) -> None:
        name = self.batch_name(vm.name)
        if self.serving.get(name) is not vm:
            return
        del self.serving[name]
        if self.power is not None and self.power.is_slot(name):
            if cause == "preempt" and self.lost_node_seconds > 0:
                for job in self.inner.freeze_node(name):
                    self.preempted_jobs[job] = name
                self.world.call_after(self.lost_node_seconds, lambda: self.power.machine_gone(
                    name, f"VM {vm.cloud_id} {cause}: daemon timeout"), f"batch notices {name} lost")
            else:
                self.power.machine_gone(name, f"VM {vm.cloud_id} {cause}")
            return
        if cause == "preempt" and self.lost_node_seconds > 0 and self.flavor != "htcondor":
            for job in self.inner.freeze_node(name):
                self.preempted_jobs[job] = name
            self.world.call_after(self.lost_node_seconds, lambda: self._notice_lost(name, vm, cause),
                                  f"batch notices {name} lost")
            return
        self.inner.set_node_up(name, False, f"VM {vm.cloud_id} {cause}")
        if self.flavor == "htcondor":
            # the collector forgets a dead startd's ad after a while
            self.world.call_after(self._rng.uniform(60.0, 900.0), lambda: self._expire(name),
                                  f"batch expire {name}")

    def _notice_lost(self, name: str, vm: VM, cause: str) -> None:
        """The daemon timeout: the node goes down and the batch system requeues what is left
        there — unless a new VM serves the name by now (a pool slot reused)."""
        if name not in self.serving:
            self.inner.set_node_up(name, False, f"VM {vm.cloud_id} {cause}: daemon timeout")

    def _expire(self, name: str) -> None:
        node = self.inner.node(name)
        if node is not None and node.down and name not in self.serving:
            self.inner.execute("remove", name, force=True)

    def withdraw_ads(self, vm: VM) -> None:
        """HTCondor: the daemons of a machine that shuts down withdraw their ads (an invalidation to
        the collector) — a gone node's ads go at once, not after ``CLASSAD_LIFETIME``."""
        if self.flavor == "htcondor":
            self._expire(self.batch_name(vm.name))

    def _killed(self, job_id: str, node: str, why: str) -> None:
        self.stats.kills.append(Kill(self.world.t, job_id, node, why))
        self.world.note(f"job {job_id} killed on {node}: {why}")

    # ------------------------------------------------------------------ world queries
    def node_of_vm(self, vm: VM) -> NodeInfo | None:
        """The batch node a VM's daemon serves, if any (for the invariant checks)."""
        name = self.batch_name(vm.name)
        if self.serving.get(name) is not vm:
            return None
        n = self.inner.node(name)
        if n is None:
            return None
        return NodeInfo(name=n.name, state=n.state(), cores=n.cores, cores_used=n.used,  # type: ignore[arg-type]
                        jobs=sorted(n.jobs), instance_id=n.instance_id)

    def jobs_on_vm(self, vm: VM) -> list[str]:
        name = self.batch_name(vm.name)
        if self.serving.get(name) is not vm:
            return []
        n = self.inner.node(name)
        return sorted(n.jobs) if n is not None else []

    # ------------------------------------------------------------------ BatchBackend
    def snapshot(self) -> Observation:
        f = self.faults
        if f.down:
            self.stats.unavailable += 1
            raise BackendUnavailable("simulated: batch controller not responding")
        if self.flavor == "htcondor":
            self._progress_shutdowns()
        obs = self.inner.snapshot()
        if self.flavor == "htcondor" and self.collector_lost:
            obs = Observation(jobs=obs.jobs, nodes=[n for n in obs.nodes if not self.lost(n.name)],
                              running_jobs=obs.running_jobs, shapes=obs.shapes, finished_jobs=obs.finished_jobs)
        now = self.world.t
        self._history.append((now, obs))
        while len(self._history) > 2 and self._history[1][0] <= now - 3600:
            self._history.popleft()
        if f.stale_seconds > 0:
            old = [o for t, o in self._history if t <= now - f.stale_seconds]
            if old:
                obs = old[-1]
        if f.missing_share > 0:
            nodes = [n for n in obs.nodes if self._rng.random() >= f.missing_share]
            obs = Observation(jobs=obs.jobs, nodes=nodes, running_jobs=obs.running_jobs, shapes=obs.shapes,
                              finished_jobs=obs.finished_jobs)
        if self.power is not None:
            obs = self.power.decorate(obs)
        if not self.report_identity:
            obs = Observation(jobs=obs.jobs, nodes=[n.model_copy(update={"instance_id": None}) for n in obs.nodes],
                              running_jobs=obs.running_jobs, shapes=obs.shapes, finished_jobs=obs.finished_jobs)
        self.stats.snapshots += 1
        return obs

    def execute(self, action: str, node: str, *, cores: int | None = None, address: str | None = None,
                reason: str = "", force: bool = False, instance_id: str | None = None) -> CommandOutcome:
        check_action(action)
        check_node_name(node)
        self.stats.commands += 1
        f = self.faults
        if f.down:
            self.stats.failed_commands += 1
            return CommandOutcome(False, error="simulated: batch controller not responding", transient=True)
        if f.failing_commands > 0:
            f.failing_commands -= 1
            self.stats.failed_commands += 1
            return CommandOutcome(False, error="simulated: command timed out", transient=True)
        outcome = self._apply(action, node, cores, address, reason, force, instance_id or self.command_context)
        if f.answers_lost > 0:
            f.answers_lost -= 1
            self.stats.failed_commands += 1
            return CommandOutcome(False, error="simulated: command timed out (it took effect)", transient=True)
        return outcome

    def _apply(self, action: str, node: str, cores: int | None, address: str | None, reason: str, force: bool,
               instance_id: str | None) -> CommandOutcome:
        if self.flavor == "htcondor":
            return self._execute_condor(action, node, reason, force)
        if self.power is not None and self.power.is_slot(node):
            return self.power.execute(action, node, instance_id, reason)
        if action in ("give_back", "release"):
            return CommandOutcome(False, error=f"{action}: no power saving in this batch system")
        if action == "add":
            # the node exists at once; it is up when its daemon (on a running VM) registers
            if not self.inner.add_node(node, cores or 1, instance_id=instance_id, up=False):
                n = self.inner.node(node)
                if n is not None and cores and n.cores != cores:
                    return mismatched_add(node, n.cores, cores)
                if n is not None and instance_id and n.instance_id is None:
                    n.instance_id = instance_id
                elif n is not None and instance_id and n.instance_id != instance_id:
                    # Slurm's ``scontrol create``/``update`` of a name that exists takes the new
                    # address and identity: the name (and the jobs it runs) now points at the other
                    # instance's machine — what a name collision did before EPU refused such adds
                    n.instance_id = instance_id
                    vm = self.running_by_launch.get(instance_id)
                    if vm is not None and vm.terminated_at is None:
                        self.serving[node] = vm
                    self.stats.rewritten += 1
                    return CommandOutcome(True, changed=True, output=f"node {node} rewritten for {instance_id}")
                return CommandOutcome(True, output=f"node {node} already exists")
            vm = self.serving.get(node)
            if vm is not None:
                self._resources(node, vm)
                self.world.call_after(self._rng.uniform(*self.register_seconds),
                                      lambda: self._register(node, vm), f"batch register {node}")
            return CommandOutcome(True, changed=True, output=f"node {node} added with {cores or 1} cores")
        return self.inner.execute(action, node, cores=cores, address=address, reason=reason, force=force)

    def requeue_jobs(self, node: str, reason: str = "") -> CommandOutcome:
        """Slurm's ``scontrol requeue`` of a preempted node's jobs (HTCondor reschedules by itself:
        nothing to do)."""
        check_node_name(node)
        if self.faults.down:
            self.stats.failed_commands += 1
            return CommandOutcome(False, error="simulated: batch controller not responding", transient=True)
        if self.flavor == "htcondor":
            return CommandOutcome(True, output="htcondor: the schedd reschedules a lost startd's jobs")
        return self.inner.requeue_jobs(node, reason)

    # ------------------------------------------------------------------ HTCondor's two views
    def lost(self, name: str) -> bool:
        """The collector has lost ``name``'s ads (its daemons run on)."""
        until = self.collector_lost.get(name)
        if until is None:
            return False
        if self.world.t >= until:
            del self.collector_lost[name]
            return False
        return True

    def _master_alive(self, name: str) -> bool:
        vm = self.serving.get(name)
        return vm is not None and vm.terminated_at is None and vm.cloud_id not in self.exited

    def _progress_shutdowns(self) -> None:
        """A master told to shut down peacefully exits once its node's jobs have ended: its
        startd's and its own ads go, and it does not come back."""
        for name, cloud_id in list(self.shutdowns.items()):
            node = self.inner.node(name)
            if node is not None and node.jobs:
                continue
            self.exited.add(cloud_id)
            self.retired.add(cloud_id)
            if node is not None:
                self.inner.execute("remove", name, force=False)
            del self.shutdowns[name]

    def _remove_condor(self, name: str, force: bool) -> CommandOutcome:
        """``remove`` decided as the real backend decides it, from what each view shows: the
        schedd's jobs on the node (true), the collector's ads (maybe lost), the master's answer at
        its last address (alive or exited)."""
        self._progress_shutdowns()
        node = self.inner.node(name)
        vm = self.serving.get(name)
        jobs = sorted(node.jobs) if node is not None else []
        seen = not self.lost(name)
        master_seen = seen and self._master_alive(name)
        busy = len(node.jobs) if node is not None and seen else 0
        sent = name in self.shutdowns or (vm is not None and vm.cloud_id in self.exited)
        answers = None
        if not master_seen and sent and (force or not jobs):
            answers = self._master_alive(name)
        absent = 0.0
        if (node is not None and seen) or master_seen or sent or jobs:  # an ad, a job, a shutdown of ours
            self.absences.present(name)
        else:
            absent = self.absences.absent(name, self.clock.monotonic())
        step = self.remove_decision(RemovalFacts(node=name, force=force, schedd_jobs=jobs, busy_slots=busy,
                                                 master_seen=master_seen, shutdown_sent=sent,
                                                 master_answers=answers, absent_seconds=absent,
                                                 absent_confirm_seconds=self.absent_confirm_seconds))
        if step.send_shutdown and vm is not None and vm.cloud_id not in self.exited:
            self.shutdowns[name] = vm.cloud_id
            if node is not None and not node.offline:
                self.inner.execute("offline", name, reason="peaceful shutdown")  # no new job starts
            self._progress_shutdowns()
        if step.outcome.ok:
            self.absences.present(name)
            if vm is not None:
                self.retired.add(vm.cloud_id)
            node = self.inner.node(name)
            if node is not None and (force or not node.jobs):
                self.inner.execute("remove", name, force=force)
        return step.outcome

    def _execute_condor(self, action: str, node: str, reason: str, force: bool) -> CommandOutcome:
        name = node if node.endswith("." + self.fqdn_suffix) else self.batch_name(node)
        if action == "add":
            return CommandOutcome(True, output="htcondor: startds join by themselves")
        if action == "remove":
            return self._remove_condor(name, force)
        if self.lost(name) or (self.inner.node(name) is None and not self._master_alive(name)):
            return CommandOutcome(False, transient=True, error=f"{action} {name}: no ad for it in the collector — "
                                                                "unknown; retried")
        out = self.inner.execute(action, name, reason=reason, force=force)
        if action == "online" and out.ok:
            self._drains.pop(name, None)
        if action == "offline" and out.changed and self.condor_drain == "graceful":
            # condor_drain -graceful: retirement honoured, then the jobs are vacated
            count = self._drains[name] = self._drains.get(name, 0) + 1
            self.world.call_after(self.retirement_seconds, lambda: self._evict(name, count),
                                  f"batch graceful drain of {name} evicts")
        return out

    def _evict(self, name: str, drain: int) -> None:
        """The graceful drain's retirement is spent: the node's jobs are vacated (requeued — and
        killed as far as their work is concerned)."""
        node = self.inner.node(name)
        if self._drains.get(name) != drain or node is None or not node.offline or not node.jobs:
            return
        self.inner.evict_jobs(name, f"evicted: graceful drain, MaxJobRetirementTime {self.retirement_seconds:.0f}s "
                                    "spent")
