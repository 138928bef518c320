"""The one door to destroy: every call of a site's destroy is made here, under a proof, recorded.

Why (design rule 12, issue 33): the provisioner used to reach a site's destroy from eight call
sites through two functions, and whether a destroy was safe was each caller's own judgement —
which is how a bookkeeping terminate (the engine's record ended, a provisioner's record of it is
live) could destroy a started VM running a job. Now ``Terminations.destroy`` is the only code
that calls ``Site.terminate`` (``tests/provisioner/test_layers.py`` checks it), each call names
its ``common.retire.Proof``, and before the call is made it is recorded: a row in the store's
destroy ledger (``DestroyRecord``: when, site, node, instance, proof, why), the ``proof`` in the
reason of the record's ``terminating`` transition, a structured log line ``destroy`` and the
metric ``epu_provisioner_destroys_total{site, proof, outcome}``.

One table, by proof, decides what a terminate may do:

==================== ==========================================================================
proof                carried out
==================== ==========================================================================
``removed``          destroyed (the sensor confirmed the node drained and removed)
``forced``           destroyed — only when the operator sent it (see "Who may force")
``unstarted``        judged on a listing taken now (``unstarted.judge``): destroyed only while
                     the VM boots; a started one is refused — recorded and published
                     ``started`` — and the engine takes it out the safe way (drain, remove, then
                     a ``removed`` terminate)
``bookkeeping``      judged by its node on a listing taken now (``unstarted.judge_bookkeeping``):
                     an unstarted record as ``unstarted``; a started record whose node the polls
                     presume gone is closed *without* a destroy (the presumption kept); one whose
                     node is listed alive is refused. Bookkeeping never destroys a started VM.
``failed-launch``,   the provisioner's own rules (``reconcile``, ``Provisioner._land``), never
``duplicate``,       sent in a message: destroyed
``orphan``,
``closed-record``
==================== ==========================================================================

A terminate accepted (its record ``terminating``) keeps its proof with the record
(``InstanceRecord.end_proof``): the destroy carried out later — after a create in flight, re-driven
by reconciliation or after a restart — is made under the proof that was accepted.

Who may force: the runtime hands the handler the validated sender of the message (RabbitMQ's
``user_id``, which a client cannot forge; ``Service.sender``). A ``forced`` terminate from any of
EPU's service users but the operator's is refused — the engine never forces (it drains and
removes first), so a forced terminate under its user is a bug or a stolen credential, and a
refusal costs nothing but a re-send by an operator. A message without a validated user (the
in-memory transport of the one-process demo; a development broker with
``require_sender_user = false`` and a user that is none of EPU's) carries no identity to check:
it is accepted, as the runtime accepts such a message at all — a production deployment sets
``require_sender_user``, and then every terminate reaching this module comes from the engine or
the operator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from epu.common.clock import Clock
from epu.common.messages import InstanceEvent, TerminateRequest
from epu.common.retire import JUDGED_UNSTARTED, Proof
from epu.common.senders import SenderPolicy
from epu.services.provisioner import unstarted
from epu.services.provisioner.cloud import TAG_DOMAIN, CloudNode, Site, is_not_found, launch_node
from epu.services.provisioner.errors import describe
from epu.services.provisioner.inflight import InFlight
from epu.services.provisioner.ports import ProvisionerStore
from epu.services.provisioner.records import DestroyRecord, InstanceRecord, Transition

log = logging.getLogger("epu.provisioner")

Outcome = Literal["destroyed", "gone", "failed"]
"""What a destroy call came to: the cloud took it, the node was already gone, or it failed
(logged; reconciliation retries a terminate, the next round a sweep)."""

DestroyObserver = Callable[[str, str, str], None]
"""(site, proof, outcome) after every destroy call: the service counts them by proof."""

#: The operator's broker user (without the deployment's ``user_prefix``): the only sender of a
#: ``forced`` terminate.
OPERATOR_USER = "epu-operator"


class _Unanswered:
    """A site could not be asked where a launch's node is: the answer is unknown, never "gone"."""


_UNANSWERED = _Unanswered()


def may_force(policy: SenderPolicy, sender: str | None) -> bool:
    """May ``sender`` (the validated broker user, ``None``: none) send a ``forced`` terminate?
    Not if it is one of EPU's service users other than the operator (see the module docstring)."""
    if sender is None:
        return True
    return sender == policy.user_prefix + OPERATOR_USER or not policy.is_service_user(sender)


def proof_of(rec: InstanceRecord) -> Proof:
    """The proof a ``terminating`` record was accepted under. A record a release before proofs
    were kept moved to ``terminating`` has none: that release carried out every terminate it
    stored, which the engine sent only after removal (``legacy_proof``'s reading of a plain one)."""
    return Proof(rec.end_proof) if rec.end_proof else Proof.REMOVED


def node_in(nodes: list[CloudNode], rec: InstanceRecord) -> CloudNode | None:
    """A record's node in a listing: by its cloud id, or (none recorded yet) the live node
    carrying its launch id."""
    if rec.cloud_id is not None:
        return next((n for n in nodes if n.cloud_id == rec.cloud_id), None)
    return launch_node(nodes, rec.instance_id)


class Terminations:
    """The terminate path (``handle``) and the one destroy (``destroy``) of a provisioner.

    Holds what it needs and nothing else: the store, the sites and their runners (the
    ``Provisioner`` hands in its own and keeps them in step), the clock, ``emit`` (publish a
    stored transition, or leave it to the outbox), ``publish`` (an event that is no transition:
    a refusal told again) and the work in flight it shares with the launch path."""

    def __init__(self, store: ProvisionerStore, sites: dict[str, Site], runners: dict[str, Any], clock: Clock,
                 emit: Callable[[Transition | None], None], publish: Callable[[InstanceEvent], Any],
                 inflight: InFlight, *, senders: SenderPolicy | None = None,
                 on_destroy: DestroyObserver | None = None) -> None:
        self.store = store
        self.sites = sites
        self.runners = runners
        """By site name (the ``Provisioner`` sets it again when its own are replaced)."""
        self.clock = clock
        self.emit = emit
        self._publish = publish
        self.inflight = inflight
        self.senders = senders or SenderPolicy()
        self.on_destroy = on_destroy

    # ------------------------------------------------------------------ the door
    def destroy(self, site_name: str, cloud_id: str, proof: Proof, why: str, *, instance_id: str = "") -> Outcome:
        """Destroy node ``cloud_id`` at ``site_name`` — the only call of a site's destroy. Recorded
        before it is made (the ledger; a store that cannot record it refuses the destroy with its
        error), logged and counted with its ``proof``. ``gone``: the cloud says it no longer
        exists (a destroy that is done all the same)."""
        self.store.record_destroy(DestroyRecord(self.clock.now(), site_name, cloud_id, instance_id, proof.value, why))
        extra = {"site": site_name, "cloud_id": cloud_id, "instance": instance_id, "proof": proof.value, "why": why}
        outcome: Outcome = "destroyed"
        try:
            self.runners[site_name].call(lambda: self.sites[site_name].terminate(cloud_id), "destroy")
        except Exception as exc:
            if is_not_found(exc):
                outcome = "gone"
            else:
                outcome = "failed"
                log.warning("destroy failed; it is tried again", extra={**extra, "error": describe(exc)})
        if outcome != "failed":
            log.info("destroy", extra={**extra, "outcome": outcome})
        if self.on_destroy is not None:
            self.on_destroy(site_name, proof.value, outcome)
        return outcome

    # ------------------------------------------------------------------ the gate
    def handle(self, req: TerminateRequest, sender: str | None = None) -> InstanceRecord | None:
        """A terminate, by its proof (the module's table). Returns once what it decided is stored
        (the caller acks then); the cloud work runs on the site's threads. ``sender``: the
        message's validated broker user (``None``: none)."""
        proof = req.effective_proof
        rec = self.store.get(req.instance_id)
        if proof is Proof.FORCED and not may_force(self.senders, sender):
            why = (f"forced terminate refused: sent by {sender!r}; only the operator "
                   f"({self.senders.user_prefix + OPERATOR_USER}) may force one")
            log.warning(why, extra={"instance": req.instance_id, "domain": req.domain})
            if rec is not None and not rec.terminal:
                self.refuse(rec, why)
            return rec
        if proof in JUDGED_UNSTARTED and (rec is None or (rec.state != "terminating" and not rec.terminal)):
            self._judge(req, rec, proof)
            return rec
        return self._accept(req, rec, proof)

    def _accept(self, req: TerminateRequest, rec: InstanceRecord | None, proof: Proof) -> InstanceRecord:
        """Store the terminate (``terminating``, with its proof) and schedule the destroy."""
        now = self.clock.now()
        reason = f"{req.reason or 'terminate requested'} (proof: {proof.value})"
        if rec is None:
            # launched through another store (this one replaced or restored): the engine asks by
            # launch id, so the node carrying it is the one to end, wherever it is
            rec, t = self.store.record_found(req.instance_id, req.domain, "terminating", now,
                                             f"{reason}: unknown to this store, looking for its node by launch id",
                                             proof=proof.value)
            self.emit(t)
        if rec.terminal:
            return rec
        if not rec.site:
            self.schedule_locate(rec.instance_id, rec.domain)
            return rec
        self.emit(self.store.advance(rec.instance_id, "terminating", now, reason=reason, proof=proof.value))
        if rec.site in self.sites:
            self.schedule(rec.instance_id, rec.site)
        return self.store.get(rec.instance_id) or rec

    def _judge(self, req: TerminateRequest, rec: InstanceRecord | None, proof: Proof) -> None:
        """A terminate judged on a listing (``unstarted``, ``bookkeeping``) of a live record not yet
        ``terminating``, or of an instance this store has no record of: refuse at once when the
        record says it started, else look at the cloud on the site's thread."""
        reason = f"{req.reason or 'terminate requested'} (proof: {proof.value})"
        if rec is None:
            if self.sites:
                self.inflight.run(f"terminate:{req.instance_id}", self.runners[next(iter(self.sites))],
                                  lambda: self._judge_unknown(req.instance_id, req.domain, reason, proof))
            return
        if proof == Proof.BOOKKEEPING and rec.site in self.sites:  # judged by its node (judge_bookkeeping)
            self.inflight.run(f"terminate:{rec.instance_id}", self.runners[rec.site],
                              lambda: self._judge_record(rec.instance_id, rec.site, reason, proof))
        elif rec.state not in unstarted.UNSTARTED:
            self.refuse(rec, f"terminate refused: the instance is {rec.state}; remove its node from the batch "
                             "system first")
        elif rec.site in self.sites:
            self.inflight.run(f"terminate:{rec.instance_id}", self.runners[rec.site],
                              lambda: self._judge_record(rec.instance_id, rec.site, reason, proof))
        else:  # another provisioner on this queue holds the site's credentials (and looks at it)
            log.info("judged terminate of an instance at a site this provisioner cannot list: left to its "
                     "sender's re-send", extra={"instance": rec.instance_id, "site": rec.site})

    def _judge_record(self, instance_id: str, site_name: str, reason: str, proof: Proof) -> None:
        """List the site now and act on ``unstarted.judge``: destroy a node still booting, refuse a
        started one (recorded ``started``, published), leave an unknown answer to the re-send."""
        rec, launch = self.store.get_with_launch(instance_id)
        if rec is None:
            return
        node: CloudNode | None = None
        bookkeeping = proof == Proof.BOOKKEEPING
        listing = self._list(site_name) if rec.state in unstarted.UNSTARTED or bookkeeping else None
        if listing is not None:
            node = node_in(listing, rec)
        in_flight = f"launch:{instance_id}" in self.inflight
        may_exist = in_flight or rec.cloud_id is not None or (launch is not None and launch.cloud_attempts > 0)
        j = (unstarted.judge_bookkeeping if bookkeeping else unstarted.judge)(
            rec.state, node, listed=listing is not None, create_may_exist=may_exist, presumed_gone=rec.presumed_gone)
        log.info("judged terminate", extra={"instance": instance_id, "proof": proof.value, "verdict": j.verdict,
                                            "why": j.why})
        if j.verdict == "close" and bookkeeping and rec.state not in unstarted.UNSTARTED:
            # a started record whose node the polls presume gone: closed without a destroy call
            # (the presumption kept: a node listed again is reported, never destroyed)
            self.emit(self.store.advance(instance_id, "terminated", self.clock.now(), reason=f"{reason}: {j.why}",
                                         expect=rec, proof=proof.value))
        elif j.verdict in ("destroy", "close"):
            cloud_id = node.cloud_id if node is not None else None
            t = self.store.advance(instance_id, "terminating", self.clock.now(), reason=f"{reason}: {j.why}",
                                   cloud_id=cloud_id, expect=rec, proof=proof.value)
            self.emit(t)
            if t is not None:
                self._carry_out(instance_id, site_name)
        elif j.verdict == "refuse":
            why = f"terminate refused: {j.why}; remove its node from the batch system first"
            if node is not None and rec.state in unstarted.UNSTARTED:
                t = self.store.advance(instance_id, "started", self.clock.now(), reason=why, cloud_id=node.cloud_id,
                                       ip=node.ip, expect=rec)
                self.emit(t)
                if t is not None:  # None: moved meanwhile (a poll): the sender's re-send judges again
                    log.warning(why, extra={"instance": instance_id, "site": site_name})
            else:
                self.refuse(rec, why)
        elif j.verdict == "accepted":
            self._carry_out(instance_id, site_name)

    def _judge_unknown(self, instance_id: str, domain: str, reason: str, proof: Proof) -> None:
        """``_judge_record`` for an instance this store has no record of (its store was replaced or
        restored, or another provisioner's on the same queue): its node looked for by launch id at
        every site. A booting node is recorded and destroyed; none anywhere closes the record; a
        started one is recorded ``started`` here and announced — the store that launched it may be
        gone, and an engine that never hears ``started`` re-sends for ever while the VM runs
        (``new-store``, issue 33) — so the engine takes it out the safe way and its ``removed``
        terminate finds the record. An unknown answer does nothing (the sender re-sends)."""
        if self.store.get(instance_id) is not None:
            return  # recorded since (a launch arrived): the sender's re-send judges it
        found = self._find_launch(instance_id, domain, "its sender re-sends")
        if isinstance(found, _Unanswered):
            return
        j = unstarted.judge(None, found[1] if found else None, listed=True, create_may_exist=False)
        log.info("judged terminate of an unknown instance",
                 extra={"instance": instance_id, "proof": proof.value, "verdict": j.verdict, "why": j.why})
        now = self.clock.now()
        if j.verdict == "close":
            _, t = self.store.record_found(instance_id, domain, "terminated", now,
                                           f"{reason}: unknown to this store; no node carries its launch id at any site")
            self.emit(t)
        elif j.verdict == "destroy" and found is not None:
            name, node = found
            _, t = self.store.record_found(instance_id, domain, "terminating", now,
                                           f"{reason}: unknown to this store ({j.why})", site=name,
                                           node_name=node.name, cloud_id=node.cloud_id, ip=node.ip, proof=proof.value)
            if t is not None:
                self.emit(t)
                self._carry_out(instance_id, name)
        elif j.verdict == "refuse" and found is not None:
            name, node = found
            why = f"terminate refused: {j.why}; remove its node from the batch system first (found by launch id)"
            _, t = self.store.record_found(instance_id, domain, "started", now, why, site=name, node_name=node.name,
                                           cloud_id=node.cloud_id, ip=node.ip)
            if t is not None:
                self.emit(t)
                log.warning(why, extra={"instance": instance_id, "site": name, "cloud_id": node.cloud_id})

    def refuse(self, rec: InstanceRecord, why: str) -> None:
        """Refuse a terminate of a live record: publish the record again with ``why`` (same
        ``seq``: a consumer that has it drops it; the engine, whose view may hold it unstarted or
        ended, learns its live state and takes it out the safe way)."""
        log.warning(why, extra={"instance": rec.instance_id, "state": rec.state})
        try:
            self._publish(Transition(0, replace(rec, reason=why), None, self.clock.now()).event())
        except Exception as exc:  # the sender re-sends the terminate: refused again
            log.warning("publish failed (terminate refused)", extra={"instance": rec.instance_id,
                                                                     "error": describe(exc)})

    # ------------------------------------------------------------------ scheduling
    def schedule(self, instance_id: str, site: str) -> None:
        """Carry out the destroy of a ``terminating`` record on the site's threads."""
        self.inflight.run(f"terminate:{instance_id}", self.runners[site], lambda: self._carry_out(instance_id, site))

    def schedule_locate(self, instance_id: str, domain: str) -> None:
        if self.sites:
            self.inflight.run(f"terminate:{instance_id}", self.runners[next(iter(self.sites))],
                              lambda: self._locate(instance_id, domain))

    def redrive_unplaced(self) -> int:
        """Terminates of instances unknown here whose node was never looked for (a crash, a listing
        that failed): look again. Called on start and with every reconciliation."""
        todo = [r for r in self.store.list(states=("terminating",)) if not r.site]
        for r in todo:
            self.schedule_locate(r.instance_id, r.domain)
        return len(todo)

    # ------------------------------------------------------------------ carrying out
    def _carry_out(self, instance_id: str, site_name: str) -> None:
        """Destroy the node of a ``terminating`` record under the proof it was accepted with."""
        rec = self.store.get(instance_id)
        if rec is None or rec.terminal:
            return
        cloud_id = rec.cloud_id
        if cloud_id is None:
            if f"launch:{instance_id}" in self.inflight:
                return  # the launch task will see "terminating" and finish the job
            try:
                found = launch_node(self.runners[site_name].call(self.sites[site_name].nodes, "list"), instance_id)
            except Exception as exc:
                log.warning("terminate: cannot list the site; reconciliation will retry",
                            extra={"site": site_name, "instance": instance_id, "error": describe(exc)})
                return
            if found is None:
                self.emit(self.store.advance(instance_id, "terminated", self.clock.now(),
                                             reason="terminated before a node existed"))
                return
            cloud_id = found.cloud_id
            self.store.set_cloud_fields(instance_id, cloud_id=cloud_id)
        outcome = self.destroy(site_name, cloud_id, proof_of(rec), rec.reason, instance_id=instance_id)
        if outcome == "gone":
            self.emit(self.store.advance(instance_id, "terminated", self.clock.now(),
                                         reason=f"node {cloud_id} already gone"))
        # "destroyed": the poll confirms "terminated" when the cloud lists the node so (or no longer
        # lists it); "failed": reconciliation re-drives it

    def _locate(self, instance_id: str, domain: str) -> None:
        """Find the node of a terminate this store had no record of, at any site, by its launch id
        (and domain): record where it is and destroy it; no node anywhere: terminated."""
        rec = self.store.get(instance_id)
        if rec is None or rec.terminal or rec.site:
            return
        found = self._find_launch(instance_id, domain, "reconciliation retries")
        if isinstance(found, _Unanswered):
            return
        if found is not None:
            name, node = found
            self.store.set_cloud_fields(instance_id, cloud_id=node.cloud_id, ip=node.ip, site=name)
            log.info("node of an unknown instance found by launch id", extra={
                "site": name, "instance": instance_id, "cloud_id": node.cloud_id})
            self._carry_out(instance_id, name)
            return
        self.emit(self.store.advance(instance_id, "terminated", self.clock.now(),
                                     reason="no node carries its launch id at any site"))

    def _find_launch(self, instance_id: str, domain: str, then: str) -> tuple[str, CloudNode] | None | _Unanswered:
        """The site and node carrying ``instance_id``'s launch id (and no other domain's tag), by
        asking every site; ``None``: no site lists one; ``_UNANSWERED``: a site could not be
        asked (logged with ``then``, what happens instead) — unknown, never "gone"."""
        for name, site in self.sites.items():
            try:
                node = self.runners[name].call(lambda site=site: site.find_launch(instance_id), "list")
            except Exception as exc:
                log.warning(f"cannot look for the node of a terminate; {then}",
                            extra={"site": name, "instance": instance_id, "error": describe(exc)})
                return _UNANSWERED
            if node is not None and node.tags.get(TAG_DOMAIN) in (None, domain):
                return name, node
        return None

    def _list(self, site_name: str) -> list[CloudNode] | None:
        try:
            return self.runners[site_name].call(self.sites[site_name].nodes, "list")
        except Exception as exc:
            log.warning("judged terminate: cannot list the site", extra={"site": site_name, "error": describe(exc)})
            return None


__all__ = ["OPERATOR_USER", "DestroyObserver", "Outcome", "Terminations", "may_force", "node_in", "proof_of"]
