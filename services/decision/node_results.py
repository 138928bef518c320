"""A batch-node command's answer (``node.result``) applied to the action it answers and, when
the answer changes it, to the instance.

Why its own module: an answer is the only proof that a node was removed from the batch system
(the step before its instance may be terminated), and a command sent again while the sensor was
down can be answered twice — a failure (a timeout) and then a success. Which answer counts, and
what it does to a draining node, is this module's one question."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from epu.common.clock import Clock
from epu.common.messages import NodeCommandResult
from epu.common.retire import RetireReason
from epu.services.decision.ports import DecisionStore
from epu.services.decision.view import Instance, evolve

log = logging.getLogger("epu.decision")


def on_node_result(store: DecisionStore, clock: Clock, res: NodeCommandResult) -> None:
    """A command's answer: the action done and, when the answer changes it, the instance — in
    one compare-and-set write (``Store.record_node_result``): two transactions let a retry
    after a conflict find the action done and drop the change (a removal lost)."""
    row = store.action(res.command_id)
    if row is None:
        return
    if row["domain"] != res.domain or row["kind"] != res.action:
        # bound to its sender (common.senders): a sensor answers only its own domain's commands
        log.warning("node result does not answer its command: ignored", extra={
            "command_id": res.command_id, "result": f"{res.domain}/{res.action}",
            "command": f"{row['domain']}/{row['kind']}"})
        return
    if row["done"]:
        _late_offline(store, clock, res, row)
        return
    outcome = "ok" if res.ok else f"error: {res.error or res.output}"[:1000]
    inst = store.instance(row["target"])
    new: Instance | None = None
    if inst is None:
        pass
    elif res.action == "remove" and res.ok:
        new = evolve(inst, removed=True)  # the only proof of removal
    elif res.action == "add" and not res.ok:
        new = replace(inst, add_sent_at=None)  # retried next iteration
    elif (res.action == "offline" and not res.ok and inst.state == "draining" and inst.retire == RetireReason.SCALE_DOWN
          and row["created_at"] <= inst.state_at):
        # Only a failure of the offline that began the drain undoes it: a re-sent one may fail
        # after an earlier attempt took (``epu sim --seed 7046 --scenario batch-faults``), and
        # the next snapshot decides. ``drain_at`` stays: an error may be a timeout of an offline
        # that took effect, which ``lifecycle`` (step 6b) drains once a snapshot shows it.
        new = replace(inst, state="joined", retire="")
    elif res.action == "online" and not res.ok and inst.state == "joined":
        # still drained in the batch system: back on the way out (drain, remove, terminate)
        new = replace(inst, state="draining", drain_at=clock.now(), retire=inst.retire or RetireReason.SCALE_DOWN)
    store.record_node_result(res.command_id, outcome, new)


def _late_offline(store: DecisionStore, clock: Clock, res: NodeCommandResult, row: dict[str, Any]) -> None:
    """A command is sent again while no answer came (the sensor was down), so one command can
    be answered twice: a first attempt that failed (a timeout) and a later one that took
    effect. The failure already put a scale-down drain back to ``joined``; a success after it
    means the node *is* offline in the batch system. Believing the failure would leave a
    drained node that the engine counts as in service, never idle and never retired — billed
    forever (``epu sim --seed 1010 --scenario policy-spare``). So the drain is taken up again:
    the node is on its way out (remove when empty, then terminate) or, if demand comes back,
    reclaimed with ``online`` like any draining node."""
    if not (res.ok and res.action == "offline" and str(row.get("outcome") or "").startswith("error")):
        return
    inst = store.instance(row["target"])
    if inst is None or inst.state != "joined" or inst.retire or inst.removed:
        return
    store.save_instances([replace(inst, state="draining", drain_at=clock.now(),
                                  retire=inst.retire or RetireReason.SCALE_DOWN)])
