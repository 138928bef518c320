"""Take the dead letters out of a test's broker with the reasons their rejecting services gave.

Since issue 33 a dead letter is the message as it was sent, moved to ``epu.dead`` by the broker;
why it died is a death note in ``epu.dead.notes`` (``common.deadletters``). Tests that used to read
``x-epu-reason`` off a letter read ``Letter.reason`` here: the trusted note of its death, joined
by the queue it died in and its body's SHA-256, as ``epu dead`` joins them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epu.common.broker import Broker
from epu.common.deadletters import DeathNote, NoteError, body_sha256, death_queue, note_is_trusted
from epu.common.inbound import Delivery
from epu.common.testing import drain
from epu.common.topology import DEAD_LETTER_QUEUE, DEATH_NOTES_QUEUE


@dataclass
class Letter:
    body: bytes
    properties: dict[str, Any]
    headers: dict[str, Any]
    note: DeathNote | None

    @property
    def reason(self) -> str:
        assert self.note is not None, f"no death note for the letter {self.body[:40]!r}"
        return self.note.reason

    @property
    def queue(self) -> str | None:
        """The queue the broker dead-lettered it from."""
        return death_queue(self.headers)[0]

    @property
    def user_id(self) -> str | None:
        return self.properties.get("user_id")


@dataclass
class DeadLetters:
    """Every letter and note taken so far (tests poll: ``wait_for(lambda: dead.take(n))``)."""

    broker: Broker
    letters: list[Delivery] = field(default_factory=list)
    notes: list[Delivery] = field(default_factory=list)

    def take(self, n: int = 1) -> list[Letter] | None:
        """Drain both queues; the letters so far once there are at least ``n`` and each one a
        consumer rejected has its note (a note may become visible to basic.get a moment after
        its letter), else None."""
        t = self.broker.topology
        self.letters += drain(self.broker, t.n(DEAD_LETTER_QUEUE), raw=True)
        self.notes += drain(self.broker, t.n(DEATH_NOTES_QUEUE), raw=True)
        letters = self.joined()
        if len(letters) < n or any(x.note is None and death_queue(x.headers)[1] == "rejected" for x in letters):
            return None
        return letters

    def trusted_notes(self) -> list[DeathNote]:
        out = []
        for d in self.notes:
            try:
                note = DeathNote.decode(d.body)
            except NoteError:
                continue
            if note_is_trusted(note, d.routing_key, d.properties.get("user_id"), self.broker.senders,
                               self.broker.topology):
                out.append(note)
        return out

    def joined(self) -> list[Letter]:
        index = {(n.queue, n.body_sha256): n for n in sorted(self.trusted_notes(), key=lambda n: n.dead_at)}
        return [Letter(d.body, d.properties, d.headers, index.get((death_queue(d.headers)[0], body_sha256(d.body))))
                for d in self.letters]
