"""A hostile process on the bus: another domain's sensor whose credential was stolen.

What it may do is exactly what that broker user may do (``Identities``, from deploy/rabbitmq's
definitions): publish snapshots and command results on its own domain's keys. What it sends is
well-formed and as damaging as it can make it, knowing everything (it sees every command the
engines send, as an attacker reading the victim's logs would):

* for every node command sent to the victim domain's sensor, at once, a result saying the
  command succeeded — on its own key (``node.result.<its domain>``, which the engines' input
  queue is bound to), once with the victim's domain in the body (refused by the consumers'
  check) and once with its own (a message it may send, which the engine must not take for the
  answer to another domain's command). Believed, a ``remove ok`` for a node still running jobs
  gets its VM terminated;
* a snapshot of the victim domain showing every node idle and no job queued, with a clock a day
  ahead and a huge sequence, on its own key — and the same on the victim's key, which the broker
  refuses;
* an instance event saying a live instance terminated, which a sensor's user may not publish at
  all (refused).

Invariant 10 (``Checker.on_foreign``) fails if any handler acts on a message whose true sender was
not allowed to send it; the consumers' check (``common.senders``, run by the bus as the runtime
runs it) is what keeps it from happening.

``dead_letter_injection`` turns it on the dead-letter queue (issue 33): a forced terminate of one of
the victim's live instances, put straight into the dead-letter exchange with headers saying a
provisioner failed on it and an innocent reason (refused: no user may write the exchange), and
sent to the engines' input on its own key with the same headers, where it dies for real and becomes
a letter of its own. An administrator requeues every letter ``epu dead list`` shows
(``RequeuerProc``), through ``common.deadletters`` as the CLI does. A requeued letter that made a
handler act on its true sender's behalf fails invariant 10 (a requeued letter never gains authority).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epu.common.messages import (
    InstanceEvent,
    Message,
    NodeCommand,
    NodeCommandResult,
    NodeInfo,
    SensorSnapshot,
    TerminateRequest,
    new_id,
)
from epu.common.topology import DEFAULT_TOPOLOGY
from epu.sim.processes import Proc
from epu.sim.scenario import Fault

if TYPE_CHECKING:
    from epu.sim.bus import Bus
    from epu.sim.simulation import Simulation
    from epu.sim.world import World


class AdversaryProc(Proc):
    kind = "adversary"

    def __init__(self, world: World, bus: Bus, domain: str, victim: str) -> None:
        super().__init__(world, bus, f"adversary-{domain}")
        self.domain = domain
        self.victim = victim
        self.identity = f"epu-sensor-{domain}"
        self.alive = True  # a process on some worker: always there
        self.active = False
        """Forging now (an episode of the fault)."""
        self.sent = 0
        self.refused = 0
        self._seq = 10**9
        bus.taps.append(self._watch)

    def _try(self, msg: Message, routing_key: str) -> None:
        try:
            self.bus.publish(self, msg, routing_key)
            self.sent += 1
        except PermissionError:
            self.refused += 1
        except ConnectionError:
            pass  # the broker is down: nothing sent

    def _watch(self, msg: Message, sender: object) -> None:
        if not self.active or sender is self or not isinstance(msg, NodeCommand) or msg.domain != self.victim:
            return
        key = f"node.result.{self.domain}"
        for domain in (self.victim, self.domain):  # the victim's word, then its own about the victim's command
            forged = NodeCommandResult(command_id=msg.command_id, domain=domain, action=msg.action, node=msg.node,
                                       ok=True, output="forged")
            self.world.after(0.0, lambda m=forged: self._try(m, key), f"forge result {self.name}")

    def forge_state(self, nodes: list[NodeInfo], live: list[tuple[str, str]]) -> None:
        """One round of forged state: an idle snapshot of the victim (own key, then the victim's)
        and a terminated event for one live instance ``(instance id, site)``."""
        self._seq += 1
        idle = [n.model_copy(update={"state": "free", "cores_used": 0, "jobs": []}) for n in nodes]
        snap = SensorSnapshot(domain=self.victim, backend="simulated", taken_at=self.world.t + 86_400.0, nodes=idle,
                              incarnation=f"forged-{self.domain}", sequence=self._seq)
        self._try(snap, f"sensor.snapshot.{self.domain}")
        self._try(snap, f"sensor.snapshot.{self.victim}")
        if live:
            iid, site = live[0]
            event = InstanceEvent(instance_id=iid, domain=self.victim, site=site, state="terminated", seq=10**6,
                                  at=self.world.t, reason="forged")
            self._try(event, event.routing_key())

    def forge_letters(self, live: list[tuple[str, str]]) -> None:
        """One round against the dead-letter queue: a forced terminate of the victim's first live
        instance ``(instance id, site)`` with headers claiming a provisioner failed on it — into the
        dead-letter exchange (refused by the broker), then on its own key to the engines' input."""
        if not live:
            return
        iid, _site = live[0]
        forged = TerminateRequest(request_id=new_id(), instance_id=iid, domain=self.victim, reason="scale down",
                                  force=True)
        claims = {"x-epu-reason": "handler failed after 3 attempts: OperationalError: database is locked",
                  "x-epu-original-queue": "epu.provisioner", "x-epu-original-exchange": "epu.commands",
                  "x-epu-original-routing-key": "provisioner.terminate", "x-death-queue": "epu.provisioner"}
        try:
            self.bus.inject_dead_letter(self, forged, claims)
            self.sent += 1
        except PermissionError:
            self.refused += 1
        except ConnectionError:
            pass
        try:
            self.bus.publish(self, forged, f"node.result.{self.domain}", exchange=DEFAULT_TOPOLOGY.events_exchange.name)
            self.sent += 1
        except PermissionError:
            self.refused += 1
        except ConnectionError:
            pass


class RequeuerProc(Proc):
    """An administrator at a terminal who requeues every dead letter ``epu dead list`` shows, as a
    broker user with the impersonator tag (the most a requeuer can be: it may send as anyone)."""

    kind = "admin"
    identity = "epu-operator"

    def __init__(self, world: World, bus: Bus) -> None:
        super().__init__(world, bus, "requeuer")
        self.alive = True
        self.refusals: dict[str, int] = {}
        """Why requeues were refused (the first words of the reason) → how many."""

    def sweep(self) -> None:
        for letter in list(self.bus.dead):
            why = self.bus.requeue(self, letter)
            if why is not None:
                k = why.split(":")[0][:60]
                self.refusals[k] = self.refusals.get(k, 0) + 1


def dead_letter_injection(per_hour: float = 3.0, length: tuple[float, float] = (300.0, 1800.0),
                          requeue_every: float = 600.0, domain: str = "intruder") -> Fault:
    """Another domain's sensor (a stolen credential) forges, in episodes, letters for the dead-letter
    queue (``AdversaryProc.forge_letters``) while an administrator requeues every letter each
    ``requeue_every`` seconds (``RequeuerProc``), through the fault phase."""

    def fault(sim: Simulation) -> None:
        from epu.sim.bus import Identities
        from epu.sim.faults import _episodes

        sim.bus.identities = Identities([sim.domain, domain])
        adv = getattr(sim, "adversary", None)
        if adv is None:
            adv = AdversaryProc(sim.world, sim.bus, domain, sim.domain)
            sim.adversary = adv  # type: ignore[attr-defined]
        requeuer = RequeuerProc(sim.world, sim.bus)
        sim.requeuer = requeuer  # type: ignore[attr-defined]
        forging = [False]

        def forge() -> None:
            if not forging[0]:
                return
            live = [(vm.launch_id, cloud.name) for cloud in sim.clouds.values() for vm in cloud.live_vms()
                    if vm.domain == sim.domain and vm.launch_id]
            adv.forge_letters(live)
            sim.world.after(120.0, forge, "adversary forges dead letters")

        def start() -> None:
            forging[0] = True
            forge()

        def stop() -> None:
            forging[0] = False

        def sweep() -> None:
            requeuer.sweep()
            if sim.world.t + requeue_every < sim.fault_end:
                sim.world.after(requeue_every, sweep, "administrator requeues dead letters")

        _episodes(sim, "dead-letters", per_hour, length, start, stop, first_after=300.0)
        sim.world.at(sim.world.start + requeue_every, sweep, "administrator requeues dead letters")

    return fault
