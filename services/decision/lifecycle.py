"""The instance life cycle every policy shares, in one sequence. Pure.

A policy decides *how many*: how many nodes the queue needs, which idle nodes may go. Everything
else — the order of the steps and what each instance may receive — is here, once, so the five
policies cannot disagree and no node gets two contradictory commands in one iteration:

1. **stall** — find what has made no progress for ``stall_seconds`` *of healthy pipeline*
   (``view.healthy_since``: time while our own broker, provisioner, sensor or engine was down
   does not count): pending instances that never joined, and joined ones whose node has been
   missing or ``down`` that long (not while the circuit breaker is open);
2. **give up** — take them out: an instance the batch system never knew is terminated
   directly; any other goes the safe way (below). Each stalled instance counts one failure
   against its site — at most one per site per iteration;
3. **reclaim** — a node drained for scale-down that demand needs again is put back online;
4. **launch** — what is still needed, within [min_nodes, max_nodes];
5. **add** — tell the batch system about newly running instances;
6. **scale down** — offline the idle nodes the policy chose (never below min_nodes);
7. **finish drains** — move every instance on its way out one step: offline while its node is
   in service, ``remove`` once the node is empty (or absent: the batch system then confirms it
   is gone, or refuses because a job runs there), and terminate only after the sensor
   confirmed the removal. Nodes of instances that ended without a drain (preempted, vanished,
   forced) are removed too, so a pool name can be reused; a preempted one's remove asks the
   batch system to requeue the jobs that died with it (``requeue``).

One instance, at most one action per iteration (``_claim``). While the circuit breaker is open
(``view.breaker``) nothing is offlined or removed and no node is declared lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from epu.common.retire import RetireReason
from epu.services.decision.actions import Action, Decision, Launch, Node, Terminate
from epu.services.decision.view import IN_SERVICE, DomainView, Instance, gang_size, short_name

WHY = {RetireReason.SCALE_DOWN: "drained", RetireReason.STALLED: "stalled", RetireReason.LOST: "lost",
       RetireReason.OPERATOR: "operator's terminate", RetireReason.GANG: "gang released",
       RetireReason.INTERRUPTED: "interruption notice", RetireReason.NATIVE: "powered down by the batch system"}


def add_started(view: DomainView) -> list[Action]:
    return [Node("add", i.instance_id, "instance running, add it to the batch system")
            for i in view.pending if i.state == "started" and i.add_sent_at is None]


def stalled(view: DomainView, stall_seconds: float) -> list[Instance]:
    """Instances making no progress for ``stall_seconds`` of healthy pipeline: pending ones that
    never joined, and joined ones whose node has been missing (or ``down``) that long."""
    now = view.now
    healthy = view.healthy_since
    out = [i for i in view.pending if now - max(i.launched_at, healthy) >= stall_seconds]
    if view.available and not view.breaker:
        out += [i for i in view.joined
                if i.missing_since is not None and now - max(i.missing_since, healthy) >= stall_seconds]
    return out


def incomplete_gangs(view: DomainView, deadline: float) -> list[tuple[list[Instance], str]]:
    """Groups launched together for multi-node jobs that will not complete: a member failed or
    went away before all joined, or not all joined ``deadline`` seconds (of healthy pipeline) after
    the group's launch. Complete groups were dissolved (``view.dissolve_complete_gangs``)."""
    if view.gangs is False:  # the census saw no gang: no pass over every instance
        return []
    groups: dict[str, list[Instance]] = {}
    for inst in view.instances:
        if inst.gang and not inst.terminate_sent and not inst.retire:
            groups.setdefault(inst.gang, []).append(inst)
    out = []
    for gang, members in sorted(groups.items()):
        size = gang_size(gang)
        joined = sum(1 for m in members if m.state == "joined")
        started = min(max(m.launched_at, view.healthy_since) for m in members)
        if len(members) < size:
            why = f"gang {gang}: {size - len(members)} of {size} instance(s) failed or gone before all joined"
        elif view.now - started >= deadline:
            why = f"gang {gang}: {joined} of {size} joined {int(view.now - started)}s after launch (limit {int(deadline)}s)"
        else:
            continue
        out.append((members, why))
    return out


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b > 0 else 0


class Cycle:
    """One iteration of the life cycle of a domain (see the module docstring).

    A policy builds one, reads ``pending``/``active`` (stalled instances already left out: they
    are being replaced), calls ``launch`` and ``scale_down`` with its numbers, and returns
    ``decision()``."""

    def __init__(self, view: DomainView, stall_seconds: float, gang_deadline: float | None = None) -> None:
        """``gang_deadline``: how long a gang may take to join whole (default ``stall_seconds``)."""
        self.view = view
        self.stall_seconds = stall_seconds
        gone = stalled(view, stall_seconds)
        if view.breaker:  # a node the snapshot lost may be one of these: only what never ran goes
            gone = [i for i in gone if not i.batch_may_know]
        self.gone = gone
        gone_ids = {i.instance_id for i in self.gone}
        self.released: list[tuple[Instance, str]] = []
        """Members of groups that cannot complete: all given up, re-placed with the demand."""
        if not view.breaker:
            for members, why in incomplete_gangs(view, gang_deadline or stall_seconds):
                self.released += [(m, why) for m in members if m.instance_id not in gone_ids]
        gone_ids |= {m.instance_id for m, _ in self.released}
        self.pending: list[Instance] = [i for i in view.pending if i.instance_id not in gone_ids]
        """Pending instances that still count as supply."""
        self.active = len(view.active) - len(self.gone) - len(self.released)
        """Instances counting towards [min_nodes, max_nodes] once the stalled ones are given up."""
        self.notes: list[str] = []
        self._reclaim: list[Instance] = []
        self._launches: list[Launch] | None = None
        self._down: list[tuple[Instance, str]] = []

    # ------------------------------------------------------------------ what a policy asks
    def launch(self, wanted: int, reason: str, cores: int | None = None, *, typed: Sequence[Launch] = (),
               filler: Launch | None = None, reclaim: Sequence[Instance] | None = None) -> int:
        """``wanted`` more nodes: draining nodes back online first, the rest launched, all within
        [min_nodes, max_nodes]. Returns how many are launched (not counting reclaimed ones).

        By shapes (``shaped``): the launches are ``typed`` in order, then ``filler`` for any more
        (the min_nodes floor, a policy's own count), and ``reclaim`` names the drained nodes the
        packer put pending jobs on (instead of any draining node)."""
        view = self.view
        room = view.max_nodes - self.active
        back: list[Instance] = []
        if reclaim is not None:
            if not view.breaker:
                back = list(reclaim)[:max(0, min(wanted, room))]
        elif wanted > 0 and room > 0 and not view.breaker:
            for inst in view.draining:
                if len(back) >= min(wanted, room):
                    break
                node = view.node_of(inst)
                if (inst.retire in ("", RetireReason.SCALE_DOWN) and not inst.removed and inst.state == "draining"
                        and node is not None and node.state == "offline"):
                    back.append(inst)
        self._reclaim = back
        active = self.active + len(back)
        need = max(0, wanted - len(back))
        n = max(need, view.min_nodes - active)
        if n > need:
            self.notes.append(f"min_nodes={view.min_nodes}: launching {n - need} more to reach the floor")
            reason = reason if need else f"below min_nodes={view.min_nodes}"
        allowed = max(0, view.max_nodes - active)
        if n > allowed:
            self.notes.append(f"max_nodes={view.max_nodes}: {n} wanted, {allowed} allowed")
            n = allowed
        plain = filler or Launch(cores or view.cores_per_node, reason)
        more = replace(plain, reason=reason) if n > len(typed) else plain  # frozen: one for every untyped launch
        self._launches = [typed[i] if i < len(typed) else more for i in range(n)]
        return n

    @property
    def active_after_launch(self) -> int:
        return self.active + len(self._reclaim) + len(self._launches or [])

    def scale_down(self, candidates: list[Instance], count: int, reason: str) -> int:
        """Offline up to ``count`` of ``candidates`` (in order), keeping at least ``min_nodes``
        (counted after this iteration's launches). Returns how many."""
        if self.view.breaker:
            self.notes.append(f"circuit breaker open ({self.view.breaker}): no scale-down")
            return 0
        if self._launches is None:
            self.launch(0, "")
        allowed = max(0, min(count, self.active_after_launch - len(self._down) - self.view.min_nodes))
        chosen = [i for i in candidates if i.state == "joined" and not i.retire][:allowed]
        self._down += [(i, reason) for i in chosen]
        return len(chosen)

    # ------------------------------------------------------------------ the sequence
    def decision(self, memory: dict | None = None, notes: list[str] | None = None) -> Decision:
        if self._launches is None:
            self.launch(0, "")
        view = self.view
        out: list[Action] = []
        claimed: set[str] = set()
        failed: dict[str, str] = {}

        def claim(inst: Instance, action: Action) -> None:
            if inst.instance_id not in claimed:
                claimed.add(inst.instance_id)
                out.append(action)

        # 1-2. stall, give up
        for inst in self.gone:
            if inst.state == "joined":
                assert inst.missing_since is not None
                why = (f"lost: node missing or down for {int(view.now - inst.missing_since)}s "
                       f"(limit {int(self.stall_seconds)}s of healthy pipeline)")
                claim(inst, Node("remove", inst.instance_id, why, retire=RetireReason.LOST))
                continue
            why = (f"stalled: not joined {int(view.now - inst.launched_at)}s after launch "
                   f"(limit {int(self.stall_seconds)}s of healthy pipeline)")
            failed.setdefault(inst.site, f"stalled: instance {inst.instance_id}")
            if inst.batch_may_know:
                claim(inst, Node("remove", inst.instance_id, why, retire=RetireReason.STALLED))
            else:
                claim(inst, Terminate(inst.instance_id, why, stalled=True, retire=RetireReason.STALLED))
        # 2b. release incomplete gangs (no failure counted: capacity errors cooled their offering)
        for inst, why in self.released:
            if not inst.batch_may_know:
                claim(inst, Terminate(inst.instance_id, why, retire=RetireReason.GANG))
            elif inst.state == "joined":
                claim(inst, Node("offline", inst.instance_id, why, retire=RetireReason.GANG))
            else:
                claim(inst, Node("remove", inst.instance_id, why, retire=RetireReason.GANG))
        # 3. reclaim
        for inst in self._reclaim:
            claim(inst, Node("online", inst.instance_id, "draining node needed again"))
        # 4. launch
        out += self._launches or []
        # 5. add
        for inst in self.pending:
            if inst.state == "started" and inst.add_sent_at is None:
                claim(inst, Node("add", inst.instance_id, "instance running, add it to the batch system"))
        # 6. scale down
        for inst, why in self._down:
            claim(inst, Node("offline", inst.instance_id, why, retire=RetireReason.SCALE_DOWN))
        # 6b. an offline answered with an error that took effect after all (a timeout): the node is
        # offline in a snapshot taken after it was sent, while the engine put it back to joined
        if view.available and not view.breaker:
            for inst in view.joined:
                if inst.drain_at is not None and inst.drain_at < view.snapshot_at and inst.instance_id not in claimed:
                    node = view.node_of(inst)
                    if node is not None and node.state == "offline":
                        claim(inst, Node("offline", inst.instance_id, "offline in the batch system after an "
                                         "offline answered with an error: drain it", retire=RetireReason.SCALE_DOWN))
        # 7. finish drains, clean up after instances that ended without one
        for inst in view.draining:
            if inst.instance_id not in claimed:
                action = self._next_step(inst)
                if action is not None:
                    claim(inst, action)
        if not view.breaker and view.cleanup:
            live_names = {short_name(i.node_name) for i in view.instances}
            for inst in view.cleanup:
                node = view.node_of(inst)
                if node is not None and node.instance_id != inst.instance_id and \
                        short_name(node.name) in live_names:
                    continue  # the name belongs to a live instance now
                if inst.preempted:
                    claim(inst, Node("remove", inst.instance_id, "preempted by the cloud: requeue its jobs, "
                                     "free its batch node", requeue=True))
                else:
                    claim(inst, Node("remove", inst.instance_id,
                                     f"instance {inst.state} without a drain: free its batch node"))
        return Decision(out, memory, [*(notes or []), *self.notes], failed)

    def _next_step(self, inst: Instance) -> Action | None:
        """The next step out for an instance on its way out (see the module docstring)."""
        view = self.view
        why = WHY.get(inst.retire, "drained")
        if inst.removed:
            return Terminate(inst.instance_id, f"{why}: removed from the batch system")
        if not inst.batch_may_know:
            return Terminate(inst.instance_id, f"{why}: never in the batch system")
        if inst.retire == RetireReason.INTERRUPTED:
            # the cloud takes it within minutes whatever we do: its jobs go back to the queue
            # now (Slurm: drained, requeued, removed), not when they die with the machine
            return Node("remove", inst.instance_id, f"{why}: requeue its jobs and remove it before the cloud "
                                                    "takes it", requeue=True)
        if view.breaker or not view.available:
            return None
        node = view.node_of(inst)
        if node is None:
            return Node("remove", inst.instance_id, f"{why}: node not in the snapshot, remove it (confirmed by "
                                                    "the batch system)")
        if node.state in IN_SERVICE:
            if inst.drain_at is None or inst.drain_at < view.snapshot_at or inst.state != "draining":
                return Node("offline", inst.instance_id, f"{why}: drain it first")
            return None  # offlined after this snapshot was taken: wait for the next one
        if not node.jobs and node.cores_used == 0:
            return Node("remove", inst.instance_id, f"{why}: no job left")
        return None


__all__ = ["Cycle", "add_started", "ceil_div", "stalled"]
