"""Which domains' launches the spend cap held at their last iteration, and why.

Why kept: an operator sees it (``epu status``, the ``epu_decision_budget_blocked`` metric), the
engine's next deadline is now while launches are held (they are planned again each time), and
the cap's starting or stopping to hold launches is an event — a note, hence a decision record —
while holding them iteration after iteration is not. Which launches fit is ``budget``'s rule."""

from __future__ import annotations

import logging

log = logging.getLogger("epu.decision")


class SpendHolds:
    """Per domain, why the spend cap held launches at its last iteration (absent: it held none)."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}

    def note(self, domain: str, why: str) -> list[str]:
        """Remember why the spend cap holds launches (``why``, "" for none); a note when the cap
        starts or stops holding them."""
        before = self.held.get(domain, "")
        if why:
            self.held[domain] = why
        else:
            self.held.pop(domain, None)
        if why and not before:
            log.warning("spend cap holds launches", extra={"domain": domain, "why": why})
            return [why]
        if before and not why:
            return ["spend cap: no launch held any more"]
        return []
