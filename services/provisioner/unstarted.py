"""May a terminate sent ``unless_started`` destroy its instance now? Pure, no I/O.

Why a module of its own: the decision engine terminates an instance at once (no drain, no
removal from the batch system) when its view says the batch system cannot know it — ``requested``
or ``pending``. That view is built from the provisioner's events, so it lags the cloud by a poll
(30 s) and a message: a VM that booted a moment ago may already run a daemon that joins the batch
system by itself (an HTCondor startd) and has taken a job. The engine therefore sends such a
terminate ``unless_started`` (``TerminateRequest.unless_started``), and the provisioner, which can
look at the cloud, decides here from its record and a listing taken now:

* ``destroy`` — the record is ``requested`` or ``pending`` and the listing shows the node still
  ``pending``: no operating system runs yet, so no daemon and no job;
* ``close`` — a ``requested`` record whose create was never made (none attempted, none in
  flight) and no node listed: there is nothing to destroy;
* ``refuse`` — the record or the listing says the VM got past booting (running, or a state
  such as stopped or rebooting that only a VM that ran reaches): the provisioner records and
  publishes it ``started``, and the engine takes it out the safe way (removed from the batch
  system, then terminated);
* ``wait`` — the answer is unknown: the listing failed, the node is not in it (listings lag
  creates and omit live nodes: one listing without it is never gone), it is listed in another
  state (a listing may show a running node ERROR for a poll), or its create is in flight.
  Nothing is done (the terminate stays unanswered, which the engine counts as an unhealthy
  pipeline while it lasts: no stall or loss is counted meanwhile); the engine sends it again (``resend_seconds``), and the poll moves
  the record meanwhile, so it ends: a VM that never boots stays ``pending`` and is destroyed at a
  later try, one that boots is refused, one that fails is closed by the poll, and one the polls
  keep missing is presumed gone (``reconcile``: ``vanish_misses`` listings over
  ``vanish_min_seconds``) — then the terminate is carried out (``destroy``: the destroy call by
  its cloud id ends it either way), as it is for any terminate of such a record.
* ``accepted`` — the record is ``terminating``: an earlier copy was accepted; carried out as any
  terminate. ``over`` — the record is closed: nothing to do.

Without a record (a store that never launched it: replaced, or another provisioner's on the same
queue), a pending node found by its launch id is destroyed, a started one refused — the store
that launched it tells the engine — and no node anywhere closes it as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from epu.services.provisioner.cloud import CloudNode

Verdict = Literal["destroy", "close", "refuse", "wait", "accepted", "over"]

#: Record states from which a terminate ``unless_started`` may still destroy the instance.
UNSTARTED = frozenset({"requested", "pending"})


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    why: str


def judge_bookkeeping(state: str | None, node: CloudNode | None, *, listed: bool, create_may_exist: bool,
                      presumed_gone: bool = False) -> Judgement:
    """The verdict for a bookkeeping terminate (``Proof.BOOKKEEPING``: the engine's record of the
    instance ended, this store's is live — restored from a backup, or another store ended its
    node). Judged by the node, not the record, and never destroying a started VM:

    * a record that is unstarted: as ``judge``;
    * a started record whose node the polls presume gone (not listed alive in enough listings
      over enough time): ``close`` — recorded terminated *without* a destroy call, and with the
      presumption kept, so a node that is listed again is reported, never destroyed;
    * a started record whose node is listed alive: ``refuse`` — it runs, it may have jobs;
    * otherwise ``wait`` (the polls decide whether the node is gone)."""
    if state is None or state in UNSTARTED or state in ("terminated", "failed", "terminating"):
        return judge(state, node, listed=listed, create_may_exist=create_may_exist, presumed_gone=presumed_gone)
    if not listed:
        return Judgement("wait", "the cloud could not be listed: whether the VM runs is unknown")
    if node is not None and node.state in ("pending", "started", None):
        return Judgement("refuse", f"node {node.cloud_id} is listed {node.native_state}: it runs, it may have jobs")
    if presumed_gone:
        return Judgement("close", "its node is presumed gone (not listed alive by the polls); closed without a "
                                  "destroy")
    return Judgement("wait", "its node is not listed alive: the polls judge whether it is gone")


def judge(state: str | None, node: CloudNode | None, *, listed: bool, create_may_exist: bool,
          presumed_gone: bool = False) -> Judgement:
    """The verdict for a terminate sent ``unless_started`` (see the module docstring).

    ``state``: the record's state (``None``: no record here); ``node``: the instance's node in a
    listing taken now (by cloud id, else by launch id; ``None``: not listed); ``listed``: the
    listing succeeded; ``create_may_exist``: a create of this launch was attempted or is in flight.
    """
    if state in ("terminated", "failed"):
        return Judgement("over", f"already {state}")
    if state == "terminating":
        return Judgement("accepted", "a terminate was accepted earlier")
    if state is not None and state not in UNSTARTED:
        return Judgement("refuse", f"the instance is {state}: the batch system may know it")
    if not listed:
        return Judgement("wait", "the cloud could not be listed: whether the VM started is unknown")
    if node is None:
        if (state is None or state == "requested") and not create_may_exist:
            return Judgement("close", "no node carries its launch id and none is being made")
        if presumed_gone:
            return Judgement("destroy", "its node is presumed gone (missed by the polls' listings)")
        return Judgement("wait", "its node is not in the listing: unknown (listings lag and omit nodes), not gone")
    if node.state == "pending":
        return Judgement("destroy", f"node {node.cloud_id} is still booting ({node.native_state})")
    if node.state == "started":
        return Judgement("refuse", f"node {node.cloud_id} runs ({node.native_state}): its daemon may have joined "
                                   "the batch system and taken a job")
    if node.state is None:
        return Judgement("refuse", f"node {node.cloud_id} is listed {node.native_state}: past booting, it may have "
                                   "run a daemon that joined the batch system")
    return Judgement("wait", f"node {node.cloud_id} is listed {node.native_state}: the polls judge whether it ended")


__all__ = ["UNSTARTED", "Judgement", "Verdict", "judge", "judge_bookkeeping"]
