"""The context broker in the world: members join and leave through the real broker as VMs come and go.

What runs here is the broker's own code, not a model of it: ``core.authorize_join`` (who may
join, with which names), the SQL ``Store`` on an SQLite file (the address check, ``check_address``,
in the append's transaction), and the AMQP side's ``InstanceFeed`` fed
with the provisioner's real ``InstanceEvent``/``InstanceReport`` messages (seen on the bus, then
delivered after a drawn delay, some lost: ``ContextFaults``). Only the HTTP layer is left out
(its mapping of exceptions to 403/503 is tested in ``tests/ctxbroker``).

Who joins:

* the batch head node, at the start, with an operator-issued credential (no instance id) and
  its own address ``HEAD_IP``;
* every VM of the domain once it runs: its agent joins with its own credential (its host name
  and launch id), its fqdn under the context's domain and the address the cloud gave it; a join
  held for the address (``AddressUnknown``) is retried after ``Retry-After``, and a refused one
  (its instance reported failed or terminated) with the agent's backoff (0.5 s doubling to 30 s,
  jittered), as the agent does (``agent.Agent._retrying``), until its VM is gone;
* an **adversary**: a job on a running worker, which holds that worker's credential (userdata
  is readable by any job), tries now and then to join with the head's names or address, another
  member's address, or another live VM's address.

Invariant 9 (``invariants.py``) is checked at every accepted join and at the end: the broker's
list, folded as an agent folds it (``core.fold``: every member's cluster view), names each host
only with the names and address its own instance has; and every live VM of the domain that no
engine or operator is retiring is listed within ``listed_within`` of its boot (and at the end) —
a node whose launch was closed failed and then reopened (its create took effect, the answer was
lost) joins again, and its peers list it (issue 33, defect 5).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epu.common.messages import InstanceEvent, InstanceReport, Message
from epu.common.nodecred import NodeIdentity, short_hostname
from epu.services.ctxbroker.app import InstanceFeed
from epu.services.ctxbroker.core import (
    AddressUnknown,
    Caller,
    Forbidden,
    NodeFields,
    authorize_join,
    fold,
)
from epu.services.ctxbroker.store import Revoked, Store

if TYPE_CHECKING:
    from epu.sim.cloud import VM
    from epu.sim.simulation import Simulation

CONTEXT_ID = "simctx"
DOMAIN = "cluster.sim"
HEAD = "head"
HEAD_IP = "10.255.255.254"
"""Outside the range the simulated clouds give VMs (``VM.ip``)."""
RETRY_AFTER = 5.0
BACKOFF = (0.5, 30.0)
"""The agent's backoff after a refused join: ``backoff_initial``, doubling to ``backoff_max``."""
SSH_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")


@dataclass
class ContextFaults:
    adversary_per_hour: float = 20.0
    """Forged joins tried by jobs on running workers, per hour of the fault phase."""
    event_loss_rate: float = 0.0
    """Share of instance events the broker's consumer never gets (reports still catch up)."""
    event_delay: tuple[float, float] = (0.05, 5.0)
    """Seconds from the provisioner's publish to the broker's handling."""
    agent_start: tuple[float, float] = (1.0, 30.0)
    """Seconds from a VM running to its agent's first join."""


@dataclass
class ContextStats:
    joins: int = 0
    held: int = 0
    honest_refused: int = 0
    forged_tried: int = 0
    forged_refused: int = 0
    leaves: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    unlisted: int = 0
    """Live VMs missing from the context at the end (invariant 9)."""


class ContextWorld:
    """The broker, its agents and an adversary, attached to a ``Simulation``."""

    def __init__(self, sim: Simulation, faults: ContextFaults | None = None) -> None:
        self.sim = sim
        self.world = sim.world
        self.faults = faults or ContextFaults()
        self.store = Store(f"sqlite:///{sim.workdir}/ctxbroker.db")
        self.store.create_context(CONTEXT_ID, "sim", "key", "digest", now=self.world.t, signing_key="sim",
                                  domain=DOMAIN)
        self.feed = InstanceFeed(self.store)
        self.stats = ContextStats()
        self._rng = self.world.rng("ctxbroker")
        self._adv = self.world.rng("ctx-adversary")
        self._vms: dict[str, VM] = {}
        """Launch id → the VM (world truth), for every VM of the domain seen running."""
        self._joined: set[str] = set()
        sim.bus.taps.append(self._tap)
        for cloud in sim.clouds.values():
            cloud.on_running.append(self._vm_running)
        sim.checker.finishers.append(self.check)
        sim.checker.finishers.append(self.check_listed)
        sim.closers.append(self.store.close)
        self.world.call_after(1.0, self._head_joins, "ctx head joins")
        self._schedule_adversary()

    # ------------------------------------------------------------------ the broker's AMQP side
    def _tap(self, msg: Message, _sender: Any) -> None:
        if not isinstance(msg, InstanceEvent | InstanceReport):
            return
        if self.faults.event_loss_rate and self._rng.random() < self.faults.event_loss_rate:
            return
        lo, hi = self.faults.event_delay
        self.world.call_after(lo + self._rng.random() * (hi - lo), lambda: self._consume(msg), "ctx consume")

    def _consume(self, msg: Message) -> None:
        events = msg.instances if isinstance(msg, InstanceReport) else [msg]
        for e in events:
            assert isinstance(e, InstanceEvent)
            self.stats.leaves += len(self.feed.apply(e))

    # ------------------------------------------------------------------ joins
    def _join(self, ident: NodeIdentity, fields: dict[str, Any]) -> str:
        """One join through the broker's code: "" if accepted, else why not ("held: ..." when the
        address is not known yet)."""
        try:
            node = authorize_join(Caller("node", ident), NodeFields.model_validate(fields), DOMAIN)
            self.store.join(CONTEXT_ID, node, now=self.world.t)
        except AddressUnknown as exc:
            return f"held: {exc}"
        except (Forbidden, Revoked) as exc:
            return str(exc)
        return ""

    def _head_joins(self) -> None:
        why = self._join(NodeIdentity(HEAD, ""), {"hostname": HEAD, "fqdn": f"{HEAD}.{DOMAIN}", "ip": HEAD_IP,
                                                  "ssh_host_key": SSH_KEY})
        if why:
            self.sim.checker.fail(9, f"the head node's own join was refused: {why}")
        self.check()

    def _vm_running(self, vm: VM) -> None:
        lid = vm.launch_id
        if vm.domain != self.sim.domain or lid is None or lid in self._vms:
            return
        self._vms[lid] = vm
        self.world.call_after(self.listed_within, lambda: self._check_listed(vm), "ctx listed check")
        lo, hi = self.faults.agent_start
        self.world.call_after(lo + self._rng.random() * (hi - lo), lambda: self._agent_join(vm, BACKOFF[0]),
                              "ctx agent join")

    def honest_fields(self, vm: VM) -> dict[str, Any]:
        host = short_hostname(vm.name)
        return {"hostname": host, "fqdn": f"{host}.{DOMAIN}", "ip": vm.ip, "ssh_host_key": SSH_KEY,
                "instance_id": vm.launch_id}

    def _agent_join(self, vm: VM, delay: float) -> None:
        if vm.terminated_at is not None:
            return
        fields = self.honest_fields(vm)
        why = self._join(NodeIdentity(fields["hostname"], vm.launch_id or ""), fields)
        if why.startswith("held"):
            self.stats.held += 1
            self.world.call_after(RETRY_AFTER * (0.5 + self._rng.random() / 2), lambda: self._agent_join(vm, delay),
                                  "ctx agent retry")
            return
        if why:
            # its instance reported gone (terminated: rightly, for good; failed: until the launch is
            # reopened): the agent retries with its backoff while the machine lives
            self.stats.honest_refused += 1
            self.world.call_after(delay * (0.5 + self._rng.random() / 2),
                                  lambda: self._agent_join(vm, min(BACKOFF[1], delay * 2)), "ctx agent retry")
            return
        self.stats.joins += 1
        self._joined.add(vm.launch_id or "")
        self.check()

    # ------------------------------------------------------------------ the adversary
    def _schedule_adversary(self) -> None:
        rate = self.faults.adversary_per_hour
        if rate <= 0:
            return
        t = self.world.t
        while True:
            t += self._adv.expovariate(rate / 3600.0)
            if t >= self.sim.fault_end:
                break
            self.world.call_at(t, self._forge, "ctx adversary")

    def _forge(self) -> None:
        running = [vm for lid, vm in sorted(self._vms.items()) if vm.terminated_at is None and lid in self._joined]
        if not running:
            return
        vm = self._adv.choice(running)
        honest = self.honest_fields(vm)
        others = [o for o in self._vms.values() if o is not vm and o.terminated_at is None]
        forgeries: list[dict[str, Any]] = [
            {"fqdn": HEAD}, {"fqdn": f"{HEAD}.{DOMAIN}"}, {"ip": HEAD_IP},
            {"hostname": HEAD, "fqdn": f"{HEAD}.{DOMAIN}", "ip": HEAD_IP},
            {"fqdn": f"{honest['hostname']}.evil.example"},
        ]
        if others:
            other = self._adv.choice(others)
            oh = short_hostname(other.name)
            forgeries += [{"ip": other.ip}, {"fqdn": f"{oh}.{DOMAIN}"}, {"fqdn": oh}]
        forged = {**honest, **self._adv.choice(forgeries)}
        self.stats.forged_tried += 1
        why = self._join(NodeIdentity(honest["hostname"], vm.launch_id or ""), forged)
        if not why:
            self.sim.checker.fail(9, f"a forged join from {honest['hostname']} ({vm.launch_id}) was accepted: "
                                     f"fqdn={forged['fqdn']} ip={forged['ip']}")
            self.check()
            return
        self.stats.forged_refused += 1
        kind = "name" if why.startswith("fqdn") else "address" if why.startswith("ip") else "host"
        self.stats.refusals[kind] = self.stats.refusals.get(kind, 0) + 1

    # ------------------------------------------------------------------ invariant 9
    @property
    def listed_within(self) -> float:
        """How soon a live VM must be listed: its agent's start, a failed launch's reopening (the
        provisioner's reconciliations, three of them), the broker's late consumption and the
        agent's longest backoff."""
        f = self.faults
        return f.agent_start[1] + 3 * self.sim.scenario.timing.reconcile_seconds + f.event_delay[1] + BACKOFF[1]

    def _unlisted(self, vm: VM) -> bool:
        """A live VM no one is retiring that is not a member of every peer's view."""
        lid = vm.launch_id or ""
        if vm.terminated_at is not None or lid in self.sim.checker.retiring:
            return False
        return lid not in {m.instance_id for m in fold(self.store.entries(CONTEXT_ID)).values()}

    def _check_listed(self, vm: VM) -> None:
        if vm.terminated_at is not None:
            return
        if self._unlisted(vm):
            self.stats.unlisted += 1
            self.sim.checker.fail(9, f"live VM {short_hostname(vm.name)} ({vm.launch_id}) is not in the context "
                                     f"{self.listed_within:.0f}s after it booted (no one is retiring it)")
            return
        self.world.call_after(self.listed_within, lambda: self._check_listed(vm), "ctx listed check")

    def check_listed(self) -> None:
        """At the end: every live VM of the domain booted ``listed_within`` ago is listed."""
        missing = [vm for _, vm in sorted(self._vms.items())
                   if self.world.t - vm.boot_at > self.listed_within and self._unlisted(vm)]
        if missing:
            self.stats.unlisted += len(missing)
            self.sim.checker.fail(9, f"{len(missing)} live VM(s) missing from the context at the end: "
                                     f"{[(short_hostname(v.name), v.launch_id) for v in missing[:3]]}")

    def check(self) -> None:
        """Every member's cluster view names each host only with its own names and address."""
        view = fold(self.store.entries(CONTEXT_ID))
        seen: dict[str, str] = {}
        for host, m in sorted(view.items()):
            if m.instance_id:
                vm = self._vms.get(m.instance_id)
                if vm is None:
                    self.sim.checker.fail(9, f"member {host} claims instance {m.instance_id}, which never ran")
                    continue
                want_host, want_ip = short_hostname(vm.name), vm.ip
            else:
                want_host, want_ip = HEAD, HEAD_IP
            if host != want_host or m.hostname != want_host:
                self.sim.checker.fail(9, f"member {host} of instance {m.instance_id} is host {want_host}")
            if m.fqdn not in (want_host, f"{want_host}.{DOMAIN}"):
                self.sim.checker.fail(9, f"member {host} publishes the name {m.fqdn}, not its own")
            if m.ip != want_ip:
                self.sim.checker.fail(9, f"member {host} publishes the address {m.ip}; its instance has {want_ip}")
            if m.ip in seen and not ipaddress.ip_address(m.ip).is_loopback:
                self.sim.checker.fail(9, f"members {seen[m.ip]} and {host} both publish {m.ip}")
            seen[m.ip] = host
