"""Why an instance leaves, and what proves that ending it is safe: the one table both the engine's
gate and the provisioner's destroy read. Pure data.

Why one table: a terminate used to be a free-text reason and two booleans (``force``,
``unless_started``) that each of the engine's send paths set on its own. A bookkeeping path (a
provisioner's record older than the end the engine saw) sent a *plain* terminate — destroy
whatever runs — for an instance that was alive and busy. Now every terminate names its
``RetireReason`` and the ``Proof`` it carries, the engine's gate refuses a pair this table does
not allow, and the provisioner's destroy acts on the proof alone:

* ``unstarted`` — the VM never started: destroyed only while the provisioner's record *and a
  listing taken now* show it booting; a started VM is refused (published ``started``), the engine
  then takes it out the safe way;
* ``removed`` — the sensor confirmed the node drained and removed from the batch system (by the
  batch system's own job list); carried out;
* ``forced`` — an operator forced it (``epu instances terminate --force``): only an operator may
  send it;
* ``bookkeeping`` — the engine's record ended (the provisioner said terminated or failed) while a
  provisioner still holds a live record of it: close that record. It never destroys a started VM
  (judged as ``unstarted``): a live node behind such a record may have come back and run jobs.

The provisioner's own destroys (not asked by a message) carry the proofs of their own rules:
``failed-launch`` (a create that the cloud answered as failed left a node holding a quota slot),
``duplicate`` (a second node of one launch id that never ran), ``orphan`` (the orphan sweep's rule:
our tag, unknown launch id, watched for the grace period), ``closed-record`` (the record of the
node's launch ended before the node was seen).
"""

from __future__ import annotations

from enum import StrEnum


class RetireReason(StrEnum):
    """Why an instance is taken out (``Instance.retire``, ``TerminateRequest.retire``)."""

    SCALE_DOWN = "scale-down"
    """The policy chose an idle node to go."""
    STALLED = "stalled"
    """It made no progress (never joined) for ``stall_seconds`` of healthy pipeline."""
    LOST = "lost"
    """Its node was missing or down for ``stall_seconds`` of healthy pipeline."""
    GANG = "gang"
    """Its group of launches for multi-node jobs cannot complete."""
    INTERRUPTED = "interrupted"
    """The cloud will reclaim it soon (a spot interruption notice)."""
    OPERATOR = "operator"
    """An operator asked (``epu instances terminate``)."""
    NATIVE = "native"
    """The batch system powered the node down (Slurm's SuspendProgram in native mode)."""
    ENDED = "ended"
    """Bookkeeping: it ended here, a provisioner's record of it is live (older than the end)."""


class Proof(StrEnum):
    """What makes a destroy safe (see the module docstring)."""

    UNSTARTED = "unstarted"
    REMOVED = "removed"
    FORCED = "forced"
    BOOKKEEPING = "bookkeeping"
    # the provisioner's own rules
    FAILED_LAUNCH = "failed-launch"
    DUPLICATE = "duplicate"
    ORPHAN = "orphan"
    CLOSED_RECORD = "closed-record"


#: The proofs a terminate sent in a message may carry (the others are the provisioner's own).
REQUESTED_PROOFS = frozenset({Proof.UNSTARTED, Proof.REMOVED, Proof.FORCED, Proof.BOOKKEEPING})

#: Reason → the proofs a terminate of that reason may carry. A reason absent here is never the
#: reason of a terminate. ``forced`` is an operator's only; bookkeeping is never anything else.
#: ``bookkeeping`` is allowed with every reason: it is the most careful proof (it never destroys a
#: started VM), what the engine sends when it asks again for an end whose proof its record no
#: longer shows (a terminate accepted, then lost with a provisioner's store).
PROOFS: dict[RetireReason, frozenset[Proof]] = {
    RetireReason.SCALE_DOWN: frozenset({Proof.REMOVED, Proof.UNSTARTED, Proof.BOOKKEEPING}),
    RetireReason.STALLED: frozenset({Proof.UNSTARTED, Proof.REMOVED, Proof.BOOKKEEPING}),
    RetireReason.LOST: frozenset({Proof.REMOVED, Proof.BOOKKEEPING}),
    RetireReason.GANG: frozenset({Proof.UNSTARTED, Proof.REMOVED, Proof.BOOKKEEPING}),
    RetireReason.INTERRUPTED: frozenset({Proof.REMOVED, Proof.UNSTARTED, Proof.BOOKKEEPING}),
    RetireReason.OPERATOR: frozenset({Proof.REMOVED, Proof.UNSTARTED, Proof.FORCED, Proof.BOOKKEEPING}),
    RetireReason.NATIVE: frozenset({Proof.REMOVED, Proof.UNSTARTED, Proof.BOOKKEEPING}),
    RetireReason.ENDED: frozenset({Proof.BOOKKEEPING}),
}

#: Proofs under which the provisioner destroys only a VM that has not started (judged on its
#: record and a listing taken now).
JUDGED_UNSTARTED = frozenset({Proof.UNSTARTED, Proof.BOOKKEEPING})


def allowed(reason: RetireReason, proof: Proof) -> bool:
    """May a terminate for ``reason`` carry ``proof``?"""
    return proof in PROOFS.get(reason, frozenset())


def legacy_proof(force: bool, unless_started: bool) -> Proof:
    """The proof of a terminate from a sender that names none (the two flags of schema 1.x):
    forced, else unstarted, else removed (the engine sent a plain terminate only after removal)."""
    if force:
        return Proof.FORCED
    return Proof.UNSTARTED if unless_started else Proof.REMOVED


__all__ = ["JUDGED_UNSTARTED", "PROOFS", "REQUESTED_PROOFS", "Proof", "RetireReason", "allowed", "legacy_proof"]
