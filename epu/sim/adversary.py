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
)
from epu.sim.processes import Proc

if TYPE_CHECKING:
    from epu.sim.bus import Bus
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
